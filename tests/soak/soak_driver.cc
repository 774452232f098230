// See soak_driver.h.
#include "soak/soak_driver.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "mla/backend.h"
#include "mla/kv_pool.h"
#include "mla/memory.h"
#include "mla/model.h"
#include "mla/workspace.h"
#include "sim/run_layer.h"
#include "sim/sim_scheduler.h"
#include "sim/sim_workload.h"

#ifdef MLA_SOAK_ASAN
// From the sanitizer runtime (sanitizer/allocator_interface.h, which gcc does not install).
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#endif

namespace mla::testing {
namespace {

std::size_t heap_in_use() {
#ifdef MLA_SOAK_ASAN
  return __sanitizer_get_current_allocated_bytes();
#else
  const struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
#endif
}

// RssAnon and RssFile of /proc/self/status, in bytes.
struct Resident {
  std::size_t anon = 0, file = 0;
};
Resident resident_bytes() {
  Resident r;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long kb = 0;
    if (std::sscanf(line.c_str(), "RssAnon: %llu kB", &kb) == 1) r.anon = kb * 1024;
    if (std::sscanf(line.c_str(), "RssFile: %llu kB", &kb) == 1) r.file = kb * 1024;
  }
  return r;
}

// Resident bytes per mapping name of /proc/self/smaps (unnamed mappings summed as "[anon]").
std::map<std::string, std::size_t> resident_by_mapping() {
  std::map<std::string, std::size_t> out;
  std::ifstream in("/proc/self/smaps");
  std::string line, name;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string first;
    fields >> first;
    if (first.empty()) continue;
    if (first.back() == ':') {  // "Rss:   123 kB" and the other fields of the mapping above
      unsigned long long kb = 0;
      if (first == "Rss:" && (fields >> kb)) out[name] += kb * 1024;
      continue;
    }
    // A mapping's header: "start-end perms offset dev inode [path]".
    std::string skip;
    for (int i = 0; i < 4; ++i) fields >> skip;
    std::string path;
    std::getline(fields, path);
    const auto at = path.find_first_not_of(' ');
    name = at == std::string::npos ? "[anon]" : path.substr(at);
  }
  return out;
}

int graph_bucket(int bs, int max_bs) {
  int b = 1;
  while (b < bs && b < 8) b *= 2;
  if (bs > 8) b = (bs + 7) / 8 * 8;
  return std::min(b, max_bs);
}

}  // namespace

LedgerState ledger_state() {
  LedgerState s;
  for (const auto& r : MemoryLedger::global().snapshot()) {
    ++s.records;
    s.bytes += r.bytes;
  }
  return s;
}

// The serving loop of lib/sim/run_driver.cc, with the layers on every config.layer_every-th step.
void soak(const std::string& backend_name, Device device, int num_requests,
          const SoakConfig& config, SoakResult* out) {
  constexpr int kLayers = 1, kSpec = 2, kSampleEvery = 25;
  auto model = model_preset("deepseek-v3-tp8");  // 16 heads
  ASSERT_TRUE(model.ok());
  sim::WorkloadConfig w;
  w.num_requests = num_requests;
  w.seed = 13;
  w.arrival_rate = 4.0;
  w.initial_burst = 32;
  w.prompt_median = 12;
  w.prompt_sigma = 0.6;
  w.prompt_min = 2;
  w.prompt_max = 96;
  w.prefix_hit_prob = 0.4;
  w.prefix_groups = 6;
  w.prefix_len_min = 16;
  w.prefix_len_max = 48;
  w.output_median = 3;
  w.output_sigma = 0.5;
  w.output_min = 1;
  w.output_max = 8;
  auto requests = sim::generate_workload(w);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  sim::SchedulerConfig sc;
  sc.max_running_requests = 48;
  sc.max_batch_tokens = 256;
  sc.speculative_tokens = kSpec;
  sc.max_prefix_entries = 4;
  sc.seed = 5;

  KvPoolConfig pc;
  pc.num_layers = kLayers + 1;  // the draft model's layer is the last one
  pc.page_size = 16;
  pc.num_pages = 640;
  pc.max_requests = sc.pool_rows();
  pc.max_context_len = 512;
  pc.device = device;
  auto pool = LatentKvPool::create(pc);
  ASSERT_TRUE(pool.ok()) << pool.status().to_string();
  auto sched = sim::Scheduler::create(pool->get(), sc, *requests);
  ASSERT_TRUE(sched.ok()) << sched.status().to_string();

  BackendContext ctx;
  ctx.pool = pool->get();
  ctx.options.model = *model;
  ctx.options.device = device;
  ctx.options.max_batch = sc.max_running_requests;
  ctx.options.max_q_len = kSpec;
  if (device.is_cpu()) {  // cuda keeps the defaults: its split-KV partials need more
    ctx.options.paged_workspace_bytes = 16u << 20;
    ctx.options.chunked_workspace_bytes = 16u << 20;
  }
  ctx.options.chunked_prefix_capacity = 64;  // prefixes go through several chunks
  ctx.options.mha_prefix_threshold = 64;
  auto target = BackendRegistry::global().create(backend_name, ctx);
  auto draft = BackendRegistry::global().create(backend_name, ctx);
  ASSERT_TRUE(target.ok() && draft.ok()) << target.status().to_string();
  const int64_t max_graph_tokens = int64_t{sc.max_running_requests} * kSpec;
  const Status graph_state =
      (*target)->init_cuda_graph_state(sc.max_running_requests, max_graph_tokens);
  ASSERT_TRUE(graph_state.ok()) << graph_state.to_string();
  auto layer = cli::SimLayer::create(*model, device, pc.num_layers, (*pool)->num_slots(),
                                     std::max<int64_t>(sc.max_batch_tokens, max_graph_tokens), 99);
  ASSERT_TRUE(layer.ok()) << layer.status().to_string();
  std::set<int> captured;
  std::size_t max_anon = 0;  // the most anonymous resident memory sampled so far

  while (!(*sched)->done()) {
    auto step = (*sched)->next_step();
    ASSERT_TRUE(step.ok()) << step.status().to_string();
    const ForwardBatch& batch = step->batch;
    const bool on_draft = batch.mode == ForwardMode::kDraftExtend;
    const bool run_layers = step->index % config.layer_every == 0;
    // The reference samples rows (then heads) to stay within its budget: a check is never skipped.
    // Steps without the layers still write the KV cache (SimLayer::write_kv): a check reads every
    // slot its batch attends to, prefixes written many steps earlier included.
    const bool check = run_layers && step->index % (config.check_every * config.layer_every) == 0;
    auto plan_and_run = [&](AttentionBackend& be, int layer_index, bool graphs) {
      int64_t rows = batch.num_tokens();
      const bool graph = graphs && (batch.mode == ForwardMode::kDecode ||
                                    batch.mode == ForwardMode::kTargetVerify);
      if (graph) {
        const int padded = graph_bucket(batch.batch_size, sc.max_running_requests);
        const int q = batch.mode == ForwardMode::kTargetVerify ? batch.num_draft_tokens : 1;
        if (captured.insert(padded * 2 + (q > 1)).second) {
          ForwardBatch pb;
          pb.mode = batch.mode;
          pb.batch_size = padded;
          pb.num_draft_tokens = batch.num_draft_tokens;
          pb.req_pool_indices.assign(padded, 0);
          pb.seq_lens.assign(padded, be.cuda_graph_seq_len_fill_value());
          pb.out_cache_loc.assign(static_cast<std::size_t>(padded) * q, 0);
          finalize_batch(pb);
          ASSERT_TRUE(be.init_forward_metadata_capture_cuda_graph(pb).ok());
        }
        const Status s = be.init_forward_metadata_replay_cuda_graph(batch, padded);
        ASSERT_TRUE(s.ok()) << s.to_string();
        rows = int64_t{padded} * q;
        ++out->graph_replays;
      } else {
        const Status s = plan_batch(be, batch);
        ASSERT_TRUE(s.ok()) << s.to_string();
      }
      if (!run_layers) {
        const Status s = (*layer)->write_kv(be, batch, layer_index, rows);
        ASSERT_TRUE(s.ok()) << s.to_string();
        return;
      }
      const Status s = (*layer)->forward(be, batch, layer_index, rows);
      ASSERT_TRUE(s.ok()) << s.to_string();
      if (check) {
        auto err = (*layer)->check(be, batch, layer_index, config.check_budget);
        ASSERT_TRUE(err.ok()) << err.status().to_string();
        EXPECT_LE(err->max_rel_err, 1e-2) << "step " << step->index;
        EXPECT_EQ(err->kv_mismatches, 0) << "step " << step->index << ": " << err->kv_error;
        out->max_rel_err = std::max(out->max_rel_err, err->max_rel_err);
        ++out->checks;
        out->check_modes.insert(std::string(forward_mode_name(batch.mode)));
      }
    };
    if (on_draft) {
      plan_and_run(**draft, kLayers, false);
    } else {
      plan_and_run(**target, 0, true);
      if (batch.mode == ForwardMode::kExtend) plan_and_run(**draft, kLayers, false);
    }
    if (::testing::Test::HasFatalFailure()) return;
    out->layer_steps += run_layers ? 1 : 0;
    ++out->batches[std::string(forward_mode_name(batch.mode))];
    const Status s = (*sched)->complete_step(*step);
    ASSERT_TRUE(s.ok()) << s.to_string();
    if (step->index % kSampleEvery == 0) {
      out->heap.push_back(heap_in_use());
      const Resident res = resident_bytes();
      out->rss.push_back(res.anon);
      out->rss_file.push_back(res.file);
      const std::size_t n = out->rss.size();
      const bool peak = n > 16 && res.anon > max_anon;
      max_anon = std::max(max_anon, res.anon);
      if ((n & (n - 1)) == 0 || peak) out->smaps[n - 1] = resident_by_mapping();
      if (peak) out->peak_sample = n - 1;
    }
  }
  if (!out->rss.empty()) out->smaps[out->rss.size() - 1] = resident_by_mapping();
  out->steps = (*sched)->stats().steps;
  out->requests = (*sched)->stats().finished;
  out->prefix_hits = (*sched)->stats().prefix_hits;
  out->drafts = (*sched)->stats().drafts_proposed;
  ASSERT_TRUE((*sched)->release_all().ok());
  out->leaked_pages = pc.num_pages - (*pool)->free_pages();
  std::vector<int> rows;
  while (true) {
    auto r = (*pool)->alloc_request();
    if (!r.ok()) break;
    rows.push_back(*r);
  }
  out->free_rows = static_cast<int>(rows.size());
  for (int r : rows) ASSERT_TRUE((*pool)->free_request(r).ok());
}

void expect_soak_clean(const std::string& what, const SoakResult& r, int num_requests,
                       bool check_rss, double seconds) {
  EXPECT_EQ(r.requests, num_requests);
  EXPECT_EQ(r.leaked_pages, 0) << "pages still held after every request finished";
  EXPECT_EQ(r.free_rows, 48 + 4) << "request rows still held";
  EXPECT_GT(r.graph_replays, 0);
  EXPECT_GT(r.prefix_hits, 0);
  EXPECT_GT(r.drafts, 0);
  EXPECT_GE(r.checks, 15) << "sampled reference checks";
  EXPECT_GE(r.check_modes.size(), 2u) << "checks ran on one batch mode only";
  // Warm-up: the first fifth of the run (buffers grow to the largest batch, graphs captured).
  ASSERT_GE(r.heap.size(), 10u);
  const std::size_t warm = r.heap.size() / 5;
  const std::size_t warm_heap = *std::max_element(r.heap.begin(), r.heap.begin() + warm);
  const std::size_t late_heap = *std::max_element(r.heap.begin() + warm, r.heap.end());
  // Resident memory: the level of the last fifth of the run (its median) against the most the
  // warm-up reached. A leak grows with the work done and moves the level; a transient peak (a
  // large batch's temporaries, returned since) does not.
  const auto level = [](std::vector<std::size_t> v, std::size_t from) {
    v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(from));
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  const std::size_t last = r.rss.size() - warm;
  const std::size_t warm_rss = *std::max_element(r.rss.begin(), r.rss.begin() + warm);
  const std::size_t late_rss = level(r.rss, last);
  const std::size_t peak_rss = *std::max_element(r.rss.begin(), r.rss.end());
  const std::size_t warm_file = *std::max_element(r.rss_file.begin(), r.rss_file.begin() + warm);
  const std::size_t late_file = level(r.rss_file, last);
  EXPECT_LE(late_heap, warm_heap + (1u << 20))
      << "heap in use grew after warm-up: " << warm_heap << " -> " << late_heap << " bytes";
  if (check_rss) {
    EXPECT_LE(late_rss, warm_rss + (16u << 20))
        << "anonymous resident memory grew after warm-up: " << warm_rss << " -> " << late_rss
        << " bytes (the last fifth's median)";
  }
  if (peak_rss > warm_rss + (4u << 20) || late_file > warm_file + (4u << 20)) {
    std::string line;
    for (std::size_t i = 0; i < r.rss.size(); i += std::max<std::size_t>(1, r.rss.size() / 24)) {
      line += fmt::format(" {}:{:.0f}", i, r.rss[i] / 1048576.0);
    }
    std::printf("soak %s: anonymous resident MiB by sample (one per 25 steps):%s\n", what.c_str(),
                line.c_str());
    // Where it grew: the mappings of the last smaps snapshot taken within the warm-up against
    // the one at the peak (else the last), the five that grew most.
    auto first = r.smaps.upper_bound(warm);
    if (first != r.smaps.begin()) --first;
    const auto second = r.peak_sample > 0 ? r.smaps.find(r.peak_sample) : std::prev(r.smaps.end());
    const auto& before = first->second;
    const auto& after = second->second;
    std::vector<std::pair<int64_t, std::string>> grown;
    for (const auto& [name, bytes] : after) {
      const auto it = before.find(name);
      const int64_t delta =
          static_cast<int64_t>(bytes) - (it == before.end() ? 0 : static_cast<int64_t>(it->second));
      if (delta > 0) grown.emplace_back(delta, name);
    }
    std::sort(grown.rbegin(), grown.rend());
    std::printf("soak %s: resident memory grew between samples %zu and %zu; most grown mappings:\n",
                what.c_str(), first->first, second->first);
    for (std::size_t i = 0; i < grown.size() && i < 5; ++i) {
      std::printf("soak %s:   +%.1f MiB %s\n", what.c_str(), grown[i].first / 1048576.0,
                  grown[i].second.c_str());
    }
  }
  std::string modes;
  for (const auto& [m, n] : r.batches) modes += fmt::format(" {} {}", m, n);
  modes += "; checked:";
  for (const auto& m : r.check_modes) modes += " " + m;
  std::printf(
      "soak %s: %lld requests, %lld steps (layers on %lld), %lld checks (max rel err %.2e), "
      "%lld graph replays, %lld prefix hits;%s; heap in use warm %.1f MiB, after %.1f MiB; "
      "resident anonymous warm %.1f MiB, after %.1f MiB (peak %.1f; file-backed %.1f -> %.1f MiB); "
      "leaked pages %lld; %.1f s\n",
      what.c_str(), static_cast<long long>(r.requests), static_cast<long long>(r.steps),
      static_cast<long long>(r.layer_steps), static_cast<long long>(r.checks), r.max_rel_err,
      static_cast<long long>(r.graph_replays), static_cast<long long>(r.prefix_hits), modes.c_str(),
      warm_heap / 1048576.0, late_heap / 1048576.0, warm_rss / 1048576.0, late_rss / 1048576.0,
      peak_rss / 1048576.0, warm_file / 1048576.0, late_file / 1048576.0,
      static_cast<long long>(r.leaked_pages), seconds);
}

}  // namespace mla::testing
