#include "run_driver.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <set>

#include "mla/kv_pool.h"
#include "mla/model.h"
#include "run_layer.h"
#include "sim_trace.h"

namespace mla::cli {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Graph batch sizes captured, as a serving engine does: 1, 2, 4, 8, then multiples of 8.
int graph_bucket(int bs, int max_bs) {
  int b = 1;
  while (b < bs && b < 8) b *= 2;
  if (bs > 8) b = (bs + 7) / 8 * 8;
  return std::min(b, max_bs);
}

// A padded batch of graph size: request row 0, the fill seq_len, the dummy page's slot 0.
ForwardBatch padded_graph_batch(ForwardMode mode, int padded_bs, int num_draft_tokens,
                                int32_t fill) {
  ForwardBatch b;
  b.mode = mode;
  b.batch_size = padded_bs;
  b.num_draft_tokens = num_draft_tokens;
  b.req_pool_indices.assign(static_cast<std::size_t>(padded_bs), 0);
  b.seq_lens.assign(static_cast<std::size_t>(padded_bs), fill);
  const int q = mode == ForwardMode::kTargetVerify ? num_draft_tokens : 1;
  b.out_cache_loc.assign(static_cast<std::size_t>(padded_bs) * q, 0);
  finalize_batch(b);
  return b;
}

// Each (mode, with or without a cached prefix) kind present is checked at least once.
std::string check_kind(const ForwardBatch& b) {
  return fmt::format("{}{}", forward_mode_name(b.mode), b.has_prefix() ? "+prefix" : "");
}

// The largest cached prefix of the step's prefill entries (EXTEND, and MIXED's first
// num_prefill entries); 0 for other modes.
int32_t prefill_prefix(const sim::Step& step) {
  const ForwardBatch& b = step.batch;
  int n = 0;
  if (b.mode == ForwardMode::kExtend) n = b.batch_size;
  if (b.mode == ForwardMode::kMixed) n = step.num_prefill;
  int32_t out = 0;
  for (int i = 0; i < n && i < static_cast<int>(b.extend_prefix_lens.size()); ++i) {
    out = std::max(out, b.extend_prefix_lens[static_cast<std::size_t>(i)]);
  }
  return out;
}

void add_stats(PlanningStats& into, const PlanningStats& s) {
  into.init_forward_metadata_calls += s.init_forward_metadata_calls;
  into.absorbed_plans += s.absorbed_plans;
  into.mha_plans += s.mha_plans;
  into.mha_chunk_plans += s.mha_chunk_plans;
  into.fallbacks += s.fallbacks;
  into.graph_replays += s.graph_replays;
  into.graph_captures += s.graph_captures;
  into.plan_ns_total += s.plan_ns_total;
  into.mha_chunk_metadata_calls += s.mha_chunk_metadata_calls;
  into.mha_chunk_metadata_skipped += s.mha_chunk_metadata_skipped;
  into.chunks_planned += s.chunks_planned;
}

// Nearest rank: the smallest value with at least p % of the values at or below it.
double nearest_rank(const std::vector<double>& sorted, double p) {
  const auto n = static_cast<double>(sorted.size());
  const auto k = static_cast<std::size_t>(std::max(1.0, std::ceil(p / 100.0 * n)));
  return sorted[std::min(k, sorted.size()) - 1];
}

class Simulation {
 public:
  explicit Simulation(const RunConfig& c) : c_(c) {}
  ~Simulation() {
    // The backends and layers go first (members), then the stream they ran on.
    layer_.reset();
    draft_.reset();
    target_.reset();
    if (stream_ != nullptr) device_runtime(c_.device.type)->destroy_stream(stream_);
  }
  Simulation(const Simulation&) = delete;
  Simulation& operator=(const Simulation&) = delete;
  StatusOr<RunReport> run();

 private:
  Status setup();
  // Runs the step; *seconds: its measured time (planning + layers, the check excluded).
  Status run_step(const sim::Step& step, double* seconds);
  void compute_serving_metrics();
  // True when a decode entry of the step belongs to a request preempted before.
  bool decodes_preempted(const sim::Step& step) const;
  // Plans the batch on `backend` (graph path for decode/verify on the target when asked) and
  // returns the number of token rows the layers run.
  StatusOr<int64_t> plan(AttentionBackend& backend, const ForwardBatch& batch, bool target);

  const RunConfig& c_;
  RunReport report_;
  ModelDims model_;
  std::unique_ptr<LatentKvPool> pool_;
  std::unique_ptr<AttentionBackend> target_, draft_;
  std::unique_ptr<SimLayer> layer_;
  std::unique_ptr<sim::Scheduler> scheduler_;
  std::set<int> captured_;
  std::vector<double> plan_ns_;
  std::map<std::string, std::vector<double>> plan_ns_by_mode_;
  std::vector<double> step_start_, step_end_;  // the timeline, per step index
  double sim_time_ = 0.0;
  int64_t prefill_tokens_ = 0;
  bool recompute_checked_ = false, preempted_decode_checked_ = false;
  std::set<std::string> checked_kinds_, present_kinds_;
  void record_peaks();
  int sampled_checks_ = 0;
  int graph_max_bs_ = 0;
  void* stream_ = nullptr;  // RunConfig::own_stream's, else the legacy default stream
};

Status Simulation::setup() {
  MLA_CHECK_ARG(c_.layers >= 1, "--layers = {} must be >= 1", c_.layers);
  MLA_CHECK_ARG(c_.pool_tokens >= c_.page_size,
                "--pool-tokens = {} is below one page of --page-size = {} tokens", c_.pool_tokens,
                c_.page_size);
  MLA_CHECK_ARG(c_.scheduler.max_batch_tokens <= c_.pool_tokens,
                "--max-batch-tokens = {} exceeds --pool-tokens = {}: a batch's new tokens need "
                "KV slots",
                c_.scheduler.max_batch_tokens, c_.pool_tokens);
  MLA_ASSIGN_OR_RETURN(model_, model_preset(c_.model));
  MLA_CHECK_ARG(device_available(c_.device), "--device {} is not available{}",
                c_.device.to_string(),
                c_.device.is_cuda() && !built_with_cuda() ? " (built without CUDA)" : "");

  std::vector<sim::RequestSpec> requests;
  if (c_.trace.empty()) {
    MLA_ASSIGN_OR_RETURN(requests, sim::generate_workload(c_.workload));
  } else {
    auto loaded = sim::load_trace(c_.trace);
    if (!loaded.ok()) {
      return Status(loaded.status().code(), "--trace: " + loaded.status().message());
    }
    requests = std::move(*loaded);
  }
  report_.workload =
      (c_.trace.empty() ? "embedded: " : c_.trace + ": ") + sim::describe_workload(requests);
  if (!c_.dump_trace.empty()) {
    std::ofstream out(c_.dump_trace);
    MLA_CHECK_ARG(out.good(), "--dump-trace \"{}\" cannot be written", c_.dump_trace);
    for (const sim::RequestSpec& r : requests) out << sim::trace_line(r) << '\n';
  }

  const bool speculative = c_.scheduler.speculative_tokens > 0;
  KvPoolConfig pc;
  pc.num_layers = c_.layers + (speculative ? 1 : 0);  // the draft model's layer is the last one
  pc.page_size = c_.page_size;
  pc.num_pages = c_.pool_tokens / c_.page_size;
  pc.max_requests = c_.scheduler.pool_rows();
  pc.max_context_len = c_.max_context_len;
  pc.latent_dim = model_.latent_dim();
  pc.device = c_.device;
  auto pool = LatentKvPool::create(pc);
  if (!pool.ok()) {
    return Status(pool.status().code(),
                  fmt::format("the KV pool of --pool-tokens = {}, --layers = {}, --max-running = "
                              "{}, --max-context-len = {} cannot be created: {}",
                              c_.pool_tokens, c_.layers, c_.scheduler.max_running_requests,
                              c_.max_context_len, pool.status().message()));
  }
  pool_ = std::move(*pool);
  report_.pool_bytes = static_cast<std::size_t>(pool_->num_slots()) * 576 * 2 * pc.num_layers;
  auto scheduler = sim::Scheduler::create(pool_.get(), c_.scheduler, std::move(requests));
  if (!scheduler.ok()) {
    if (c_.trace.empty()) return scheduler.status();
    return Status(scheduler.status().code(), c_.trace + ": " + scheduler.status().message());
  }
  scheduler_ = std::move(*scheduler);

  BackendContext ctx;
  ctx.pool = pool_.get();
  ctx.options.model = model_;
  ctx.options.device = c_.device;
  ctx.options.disable_chunked_prefix_cache = c_.disable_chunked_prefix_cache;
  ctx.options.piecewise_cuda_graph = c_.piecewise_graph;
  ctx.options.max_batch = c_.scheduler.max_running_requests;
  ctx.options.max_q_len = std::max(c_.scheduler.speculative_tokens, 1);
  ctx.options.mha_chunk_kv_budget_bytes = static_cast<std::size_t>(c_.chunk_kv_budget_mib) << 20;
  MLA_ASSIGN_OR_RETURN(target_, BackendRegistry::global().create(c_.backend, ctx));
  if (speculative) {
    MLA_ASSIGN_OR_RETURN(draft_, BackendRegistry::global().create(c_.backend, ctx));
  }

  const int q = std::max(c_.scheduler.speculative_tokens, 1);
  graph_max_bs_ = c_.scheduler.max_running_requests;
  if (c_.cuda_graph) {
    MLA_RETURN_IF_ERROR(
        target_->init_cuda_graph_state(graph_max_bs_, static_cast<int64_t>(graph_max_bs_) * q));
  }
  const int64_t max_tokens =
      std::max<int64_t>(c_.scheduler.max_batch_tokens, static_cast<int64_t>(graph_max_bs_) * q);
  MLA_ASSIGN_OR_RETURN(
      layer_, SimLayer::create(model_, c_.device, pc.num_layers, pool_->num_slots(), max_tokens,
                               c_.workload.seed ^ 0x5eed));
  if (c_.own_stream) {
    MLA_ASSIGN_OR_RETURN(stream_, device_runtime(c_.device.type)->create_stream());
    target_->set_stream(stream_);  // and the pool's
    if (draft_) draft_->set_stream(stream_);
    layer_->set_stream(stream_);
  }
  return Status::Ok();
}

StatusOr<int64_t> Simulation::plan(AttentionBackend& backend, const ForwardBatch& batch,
                                   bool target) {
  const bool graph =
      target && c_.cuda_graph &&
      (batch.mode == ForwardMode::kDecode || batch.mode == ForwardMode::kTargetVerify);
  const auto t0 = Clock::now();
  int64_t rows = batch.num_tokens();
  if (graph) {
    const int padded = graph_bucket(batch.batch_size, graph_max_bs_);
    // Graphs are captured per (bucket, mode); verify and decode differ in q_len.
    const int key = padded * 2 + (batch.mode == ForwardMode::kTargetVerify ? 1 : 0);
    if (!captured_.count(key)) {
      const ForwardBatch pb = padded_graph_batch(batch.mode, padded, batch.num_draft_tokens,
                                                 backend.cuda_graph_seq_len_fill_value());
      MLA_RETURN_IF_ERROR(backend.init_forward_metadata_capture_cuda_graph(pb));
      captured_.insert(key);
      ++report_.graph_captures;
    }
    const auto t1 = Clock::now();
    MLA_RETURN_IF_ERROR(backend.init_forward_metadata_replay_cuda_graph(batch, padded));
    plan_ns_.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t1).count());
    plan_ns_by_mode_[std::string(forward_mode_name(batch.mode))].push_back(plan_ns_.back());
    rows = static_cast<int64_t>(padded) *
           (batch.mode == ForwardMode::kTargetVerify ? batch.num_draft_tokens : 1);
    return rows;
  }
  MLA_RETURN_IF_ERROR(plan_batch(backend, batch));
  plan_ns_.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
  plan_ns_by_mode_[std::string(forward_mode_name(batch.mode))].push_back(plan_ns_.back());
  return rows;
}

Status Simulation::run_step(const sim::Step& step, double* seconds) {
  const ForwardBatch& batch = step.batch;
  const auto t0 = Clock::now();
  const bool on_draft = batch.mode == ForwardMode::kDraftExtend;
  AttentionBackend& be = on_draft ? *draft_ : *target_;
  double check_seconds = 0.0;
  std::string reason;
  const std::string kind = check_kind(batch);
  if (c_.check) {
    present_kinds_.insert(kind);
    if (!checked_kinds_.count(kind)) {
      reason = "first " + kind;
    } else if (step.num_recompute > 0 && !recompute_checked_) {
      reason = "re-prefill after a preemption";
    } else if (!preempted_decode_checked_ && decodes_preempted(step)) {
      reason = "decode of a request preempted before";
    } else if (prefill_prefix(step) > 0) {
      reason = "extend with a prefix";
    } else if (step.index % 5 == 0 && sampled_checks_ < c_.check_steps) {
      reason = "sampled";
      ++sampled_checks_;
    }
    CheckSummary& cs = report_.check_summary;
    ++cs.steps;
    if (reason.empty()) {
      ++cs.steps_skipped[sampled_checks_ >= c_.check_steps
                             ? "kind already checked, no prefix extend, --check-steps used up"
                             : "kind already checked, no prefix extend, not every 5th step"];
    }
  }
  const bool want_check = !reason.empty();

  auto run_layers = [&](AttentionBackend& backend, int first, int count, bool target) -> Status {
    MLA_ASSIGN_OR_RETURN(const int64_t rows, plan(backend, batch, target));
    for (int l = first; l < first + count; ++l) {
      MLA_RETURN_IF_ERROR(layer_->forward(backend, batch, l, rows));
      if (l == first && want_check) {
        const auto c0 = Clock::now();
        MLA_ASSIGN_OR_RETURN(const SimLayer::CheckResult r,
                             layer_->check(backend, batch, l, c_.check_budget));
        check_seconds += seconds_since(c0);
        CheckedStep cs;
        cs.step = step.index;
        cs.mode = std::string(forward_mode_name(batch.mode));
        cs.reason = reason;
        cs.batch_size = batch.batch_size;
        cs.tokens = batch.num_tokens();
        for (int32_t p : batch.extend_prefix_lens) cs.max_prefix = std::max(cs.max_prefix, p);
        cs.layer = l;
        cs.requests_checked = r.entries_checked;
        cs.rows_checked = r.rows_checked;
        cs.heads_checked = r.heads_checked;
        cs.kv_slots_checked = r.kv_slots_checked;
        cs.kv_mismatches = r.kv_mismatches;
        cs.kv_error = r.kv_error;
        cs.rel_err = r.max_rel_err;
        if (r.worst_entry >= 0) {
          cs.worst_request = step.request_ids[static_cast<std::size_t>(r.worst_entry)];
          cs.worst_row = r.worst_row;
        }
        cs.passed = r.max_rel_err <= c_.check_tolerance && r.kv_mismatches == 0;
        CheckSummary& sum = report_.check_summary;
        if (report_.checks.empty() || report_.checks.back().step != step.index) {
          ++sum.steps_checked;
          if (step.num_recompute > 0) {
            recompute_checked_ = true;
            ++sum.recompute_steps_checked;
          }
          if (decodes_preempted(step)) {
            preempted_decode_checked_ = true;
            ++sum.preempted_decode_steps_checked;
          }
        }
        sum.requests_checked += r.entries_checked;
        sum.rows += r.rows;
        sum.rows_checked += r.rows_checked;
        sum.rows_sampled_out += r.rows - r.rows_checked;
        if (r.heads_checked < model_.num_heads) ++sum.steps_with_sampled_heads;
        sum.kv_slots_checked += r.kv_slots_checked;
        sum.kv_mismatches += r.kv_mismatches;
        report_.max_rel_err = std::max(report_.max_rel_err, r.max_rel_err);
        if (!cs.passed) report_.check_passed = false;
        report_.checks.push_back(std::move(cs));
        checked_kinds_.insert(kind);
      }
    }
    return Status::Ok();
  };
  if (on_draft) {
    MLA_RETURN_IF_ERROR(run_layers(*draft_, c_.layers, 1, false));
  } else {
    MLA_RETURN_IF_ERROR(run_layers(be, 0, c_.layers, true));
    // The draft model prefills what the target prefilled (its own KV layer).
    if (draft_ && batch.mode == ForwardMode::kExtend) {
      MLA_RETURN_IF_ERROR(run_layers(*draft_, c_.layers, 1, false));
    }
  }
  MLA_RETURN_IF_ERROR(device_runtime(c_.device.type)->synchronize(stream_));
  ModeTotals& m = report_.modes[std::string(forward_mode_name(batch.mode))];
  ++m.batches;
  m.tokens += batch.num_tokens();
  *seconds = seconds_since(t0) - check_seconds;
  m.seconds += *seconds;
  return Status::Ok();
}

// Backend buffers and workspaces on the run's device, outside the KV pool (not the simulation's
// activations and weights): their largest size so far, per buffer.
void Simulation::record_peaks() {
  for (const AllocationRecord& r : MemoryLedger::global().snapshot()) {
    if (r.device != c_.device || r.owner.rfind("sim", 0) == 0 || r.owner == "activations" ||
        r.owner.rfind("kv_pool", 0) == 0) {
      continue;
    }
    std::size_t& peak = report_.peak_bytes[r.name];
    peak = std::max(peak, r.bytes);
  }
}

StatusOr<RunReport> Simulation::run() {
  const auto t0 = Clock::now();
  MLA_RETURN_IF_ERROR(setup());
  report_.backend = c_.backend;
  report_.device = c_.device.to_string();
  report_.model = c_.model;
  report_.layers = c_.layers;
  report_.checked = c_.check;
  // Progress in tokens (prompt + output of every request), so one long request moves the bar.
  int64_t total_tokens = 0;
  for (const sim::RequestSpec& r : scheduler_->requests()) {
    total_tokens += static_cast<int64_t>(r.prompt_len) + r.output_len;
  }
  Progress progress("mla run", total_tokens, c_.progress);
  int64_t& prefill_tokens = prefill_tokens_;
  while (!scheduler_->done()) {
    MLA_ASSIGN_OR_RETURN(sim::Step step, scheduler_->next_step());
    double seconds = 0.0;
    MLA_RETURN_IF_ERROR(run_step(step, &seconds));
    step_start_.push_back(sim_time_);
    sim_time_ += seconds;
    step_end_.push_back(sim_time_);
    record_peaks();
    MLA_RETURN_IF_ERROR(scheduler_->complete_step(step));
    const ForwardBatch& b = step.batch;
    if (b.mode == ForwardMode::kExtend || b.mode == ForwardMode::kMixed) {
      const int n = b.mode == ForwardMode::kExtend ? b.batch_size : step.num_prefill;
      for (int i = 0; i < n; ++i) prefill_tokens += b.extend_seq_lens[static_cast<std::size_t>(i)];
    }
    int64_t generated = 0;
    for (int32_t g : scheduler_->generated()) generated += g;
    // Prompt tokens prefilled once plus output tokens: a re-prefill after a preemption does
    // not move the bar twice.
    progress.update(
        scheduler_->progress_tokens(),
        fmt::format("step {}, {} prefill + {} output tokens, {}/{} requests done, {} "
                    "bs {}{}",
                    step.index, prefill_tokens, generated, scheduler_->stats().finished,
                    scheduler_->requests().size(), forward_mode_name(b.mode), b.batch_size,
                    scheduler_->stats().preemptions
                        ? fmt::format(", {} preemptions", scheduler_->stats().preemptions)
                        : ""));
  }
  progress.finish();
  report_.steps = scheduler_->stats().steps;
  report_.scheduler = scheduler_->stats();
  compute_serving_metrics();
  add_stats(report_.planning, target_->planning_stats());
  if (draft_) add_stats(report_.planning, draft_->planning_stats());
  if (!plan_ns_.empty()) {
    std::vector<double> v = plan_ns_;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    report_.median_plan_ns = v[v.size() / 2];
  }
  std::vector<AllocationRecord> live;
  for (const AllocationRecord& r : MemoryLedger::global().snapshot()) {
    // Backend workspaces and buffers only: not the simulation's activations and weights.
    if (r.device == c_.device && r.owner.rfind("sim", 0) != 0 && r.owner != "activations") {
      live.push_back(r);
    }
  }
  report_.workspaces = ledger_json(live, /*skip_kv_pool=*/true);
  MLA_RETURN_IF_ERROR(scheduler_->release_all());
  report_.wall_seconds = seconds_since(t0);
  if (c_.check) {
    CheckSummary& sum = report_.check_summary;
    sum.kinds_present.assign(present_kinds_.begin(), present_kinds_.end());
    sum.kinds_checked.assign(checked_kinds_.begin(), checked_kinds_.end());
    // Every kind present must have been checked; a run that checked nothing fails.
    if (report_.checks.empty() || sum.kinds_checked != sum.kinds_present) {
      report_.check_passed = false;
    }
  }
  return report_;
}

bool Simulation::decodes_preempted(const sim::Step& step) const {
  const ForwardMode mode = step.batch.mode;
  if (mode != ForwardMode::kDecode && mode != ForwardMode::kMixed &&
      mode != ForwardMode::kTargetVerify) {
    return false;
  }
  const std::size_t first =
      mode == ForwardMode::kMixed ? static_cast<std::size_t>(step.num_prefill) : 0;
  for (std::size_t i = first; i < step.request_ids.size(); ++i) {
    if (scheduler_->events()[static_cast<std::size_t>(step.request_ids[i])].preemptions > 0) {
      return true;
    }
  }
  return false;
}

void Simulation::compute_serving_metrics() {
  ServingMetrics& m = report_.serving;
  const sim::SchedulerStats& s = scheduler_->stats();
  m.seconds = sim_time_;
  std::vector<double> queue, ttft, tpot, e2e;
  const auto& events = scheduler_->events();
  for (const sim::RequestSpec& r : scheduler_->requests()) {
    const sim::RequestEvents& e = events[static_cast<std::size_t>(r.id)];
    m.output_tokens += scheduler_->generated()[static_cast<std::size_t>(r.id)];
    if (e.arrived < 0 || e.scheduled < 0 || e.first_token < 0 || e.finished < 0) continue;
    const double arrival = step_start_[static_cast<std::size_t>(e.arrived)];
    const double first = step_end_[static_cast<std::size_t>(e.first_token)];
    const double last = step_end_[static_cast<std::size_t>(e.finished)];
    queue.push_back(step_start_[static_cast<std::size_t>(e.scheduled)] - arrival);
    ttft.push_back(first - arrival);
    e2e.push_back(last - arrival);
    if (r.output_len > 1) tpot.push_back((last - first) / (r.output_len - 1));
  }
  m.queue = percentiles(std::move(queue));
  m.ttft = percentiles(std::move(ttft));
  m.tpot = percentiles(std::move(tpot));
  m.e2e = percentiles(std::move(e2e));
  m.prefill_tokens = prefill_tokens_;
  m.recompute_tokens = s.recompute_tokens;
  if (m.seconds > 0) {
    m.output_tokens_per_s = static_cast<double>(m.output_tokens) / m.seconds;
    m.prefill_tokens_per_s = static_cast<double>(m.prefill_tokens) / m.seconds;
  }
  for (const auto& [mode, ns] : plan_ns_by_mode_) {
    std::vector<double> us;
    double total = 0.0;
    for (double v : ns) {
      us.push_back(v / 1e3);
      total += v / 1e9;
    }
    m.plan_us[mode] = percentiles(std::move(us));
    m.plan_seconds[mode] = total;
  }
  m.pool_pages = pool_->config().num_pages;
  m.page_size = pool_->config().page_size;
  m.peak_used_pages = s.peak_used_pages;
  m.peak_utilisation =
      m.pool_pages > 0 ? static_cast<double>(s.peak_used_pages) / static_cast<double>(m.pool_pages)
                       : 0.0;
  m.preemptions = s.preemptions;
  m.preempted_requests = s.preempted_requests;
  m.preempted_tokens = s.preempted_tokens;
}

}  // namespace

Percentiles percentiles(std::vector<double> values) {
  Percentiles p;
  if (values.empty()) return p;
  std::sort(values.begin(), values.end());
  p.count = static_cast<int64_t>(values.size());
  p.p50 = nearest_rank(values, 50);
  p.p90 = nearest_rank(values, 90);
  p.p99 = nearest_rank(values, 99);
  double sum = 0.0;
  for (double v : values) sum += v;
  p.mean = sum / static_cast<double>(values.size());
  p.max = values.back();
  return p;
}

StatusOr<RunReport> run_simulation(const RunConfig& config) {
  Simulation sim(config);
  return sim.run();
}

}  // namespace mla::cli
