// `mla plan`: builds one synthetic batch over a fresh pool, plans it with a backend and prints
// what the backend decided, in its own words (AttentionBackend::describe_plan): forward method,
// fallback, the chunked-prefix chunk plan it built (SYSTEM.md 6), planning counters. Runs no
// attention and recomputes nothing.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_util.h"
#include "commands.h"
#include "mla/backend.h"
#include "mla/kv_pool.h"
#include "mla/model.h"
#include "mla/ops.h"

namespace mla::cli {
namespace {

using nlohmann::json;

struct PlanOptions {
  std::string backend = "paged_mla";
  std::string device = "cpu";
  std::string model = "deepseek-v3";
  std::string mode = "extend";
  int batch_size = 4;
  int seq_len = 1024;            // decode/verify: committed length; extend: prefix + new tokens
  int prefix_len = 0;            // extend-like: cached prefix per request
  std::vector<int> prefix_lens;  // per request, overrides --prefix-len
  int draft_tokens = 2;
  int page_size = 64;
  int64_t chunk_capacity = 131072;
  int64_t chunk_kv_budget_mib = 512;
  bool disable_chunked_prefix_cache = false;
  bool piecewise_graph = false;
  bool json_out = false;
};

Status build_batch(const PlanOptions& o, LatentKvPool& pool, ForwardBatch* b) {
  MLA_CHECK_ARG(parse_forward_mode(o.mode, &b->mode) && b->mode != ForwardMode::kIdle,
                "--mode = \"{}\" is not a mode (decode, extend, mixed, verify, draft_extend)",
                o.mode);
  b->batch_size = o.batch_size;
  b->num_draft_tokens = b->mode == ForwardMode::kTargetVerify ? o.draft_tokens : 0;
  for (int i = 0; i < o.batch_size; ++i) {
    MLA_ASSIGN_OR_RETURN(const int row, pool.alloc_request());
    int32_t before = 0, after = 0;  // request length before / after the batch's new tokens
    int32_t prefix =
        o.prefix_lens.empty() ? o.prefix_len : o.prefix_lens[static_cast<std::size_t>(i)];
    switch (b->mode) {
      case ForwardMode::kDecode:
        before = o.seq_len - 1;
        after = o.seq_len;
        break;
      case ForwardMode::kTargetVerify:
        before = o.seq_len;
        after = o.seq_len + o.draft_tokens;
        break;
      case ForwardMode::kMixed:  // odd requests decode, even ones extend
        if (i % 2 == 1) prefix = o.seq_len - 1;
        [[fallthrough]];
      default:
        MLA_CHECK_ARG(prefix >= 0 && prefix < o.seq_len,
                      "prefix length {} of request {} must be in 0..--seq-len - 1 = {}", prefix, i,
                      o.seq_len - 1);
        before = prefix;
        after = o.seq_len;
    }
    std::vector<int32_t> slots;
    MLA_RETURN_IF_ERROR(pool.extend_request(row, before, nullptr));
    MLA_RETURN_IF_ERROR(pool.extend_request(row, after, &slots));
    b->req_pool_indices.push_back(row);
    b->seq_lens.push_back(b->mode == ForwardMode::kTargetVerify ? before : after);
    if (b->mode != ForwardMode::kDecode && b->mode != ForwardMode::kTargetVerify) {
      b->extend_prefix_lens.push_back(before);
      b->extend_seq_lens.push_back(after - before);
    }
    b->out_cache_loc.insert(b->out_cache_loc.end(), slots.begin(), slots.end());
  }
  finalize_batch(*b);
  return validate_batch(*b, pool.batch_limits());
}

int run_plan(const PlanOptions& o) {
  auto device = parse_device(o.device);
  if (!device.ok()) return fail(device.status());
  auto model = model_preset(o.model);
  if (!model.ok()) return fail(model.status());
  if (o.batch_size < 1 || o.seq_len < 1 || o.draft_tokens < 1) {
    return fail(
        invalid_argument("--batch-size = {}, --seq-len = {}, --draft-tokens = {} must be >= 1",
                         o.batch_size, o.seq_len, o.draft_tokens));
  }
  if (!o.prefix_lens.empty() && static_cast<int>(o.prefix_lens.size()) != o.batch_size) {
    return fail(invalid_argument("--prefix-lens {} has {} entries, --batch-size is {}",
                                 fmt::join(o.prefix_lens, ","), o.prefix_lens.size(),
                                 o.batch_size));
  }
  KvPoolConfig pc;
  pc.num_layers = 1;
  pc.page_size = o.page_size;
  pc.max_requests = o.batch_size;
  pc.max_context_len = o.seq_len + o.draft_tokens;
  pc.num_pages =
      static_cast<int64_t>(o.batch_size) * ((pc.max_context_len + o.page_size - 1) / o.page_size);
  pc.latent_dim = model->latent_dim();
  pc.device = *device;
  auto pool = LatentKvPool::create(pc);
  if (!pool.ok()) {
    return fail(Status(pool.status().code(),
                       fmt::format("the KV pool for --batch-size = {} requests of --seq-len = {} "
                                   "tokens cannot be created: {}",
                                   o.batch_size, o.seq_len, pool.status().message())));
  }
  ForwardBatch batch;
  if (Status s = build_batch(o, **pool, &batch); !s.ok()) return fail(s);

  BackendContext ctx;
  ctx.pool = pool->get();
  ctx.options.model = *model;
  ctx.options.device = *device;
  ctx.options.disable_chunked_prefix_cache = o.disable_chunked_prefix_cache;
  ctx.options.piecewise_cuda_graph = o.piecewise_graph;
  ctx.options.chunked_prefix_capacity = o.chunk_capacity;
  ctx.options.mha_chunk_kv_budget_bytes = static_cast<std::size_t>(o.chunk_kv_budget_mib) << 20;
  ctx.options.max_batch = std::max(o.batch_size, 1);
  ctx.options.max_q_len = std::max(o.draft_tokens, 1);
  auto backend = BackendRegistry::global().create(o.backend, ctx);
  if (!backend.ok()) return fail(backend.status());
  AttentionBackend& be = **backend;
  if (Status s = plan_batch(be, batch); !s.ok()) return fail(s);
  const PlanningStats& st = be.planning_stats();
  // What the backend built, as it describes it (nothing recomputed here).
  const PlanDescription plan = be.describe_plan();

  json j{{"backend", o.backend},
         {"device", device->to_string()},
         {"model", o.model},
         {"mode", forward_mode_name(batch.mode)},
         {"batch_size", batch.batch_size},
         {"seq_lens", batch.seq_lens},
         {"extend_prefix_lens", batch.extend_prefix_lens},
         {"extend_seq_lens", batch.extend_seq_lens},
         {"num_tokens", batch.num_tokens()},
         {"planning",
          {{"init_forward_metadata_calls", st.init_forward_metadata_calls},
           {"absorbed_plans", st.absorbed_plans},
           {"mha_plans", st.mha_plans},
           {"mha_chunk_plans", st.mha_chunk_plans},
           {"mha_chunk_metadata_calls", st.mha_chunk_metadata_calls},
           {"mha_chunk_metadata_skipped", st.mha_chunk_metadata_skipped},
           {"fallbacks", st.fallbacks},
           {"plan_ns", st.plan_ns_total}}}};
  j["forward_method"] = forward_method_name(plan.method);
  j["fallback"] = plan.fell_back;
  if (!plan.chunks.empty()) {
    json chunks = json::array();
    for (const PlanDescription::Chunk& c : plan.chunks) {
      chunks.push_back({{"start", c.start},
                        {"lens", c.lens},
                        {"num_tokens", c.num_tokens},
                        {"has_zero_kv", c.has_zero_kv}});
    }
    j["chunk_plan"] = {{"capacity", plan.chunk_capacity},
                       {"chunk_len", plan.chunk_len},
                       {"num_chunks", plan.chunks.size()},
                       {"chunks", chunks}};
  }
  json details = json::object();
  for (const auto& [name, value] : plan.details) details[name] = value;
  j["plan"] = details;
  if (o.json_out) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  fmt::print("{} on {}, {}: {} batch of {} requests, {} new tokens\n", o.backend,
             device->to_string(), o.model, forward_mode_name(batch.mode), batch.batch_size,
             batch.num_tokens());
  fmt::print("  seq_lens           {}\n", batch.seq_lens);
  if (!batch.extend_prefix_lens.empty()) {
    fmt::print("  extend_prefix_lens {}\n  extend_seq_lens    {}\n", batch.extend_prefix_lens,
               batch.extend_seq_lens);
  }
  fmt::print("  forward method     {}{}\n", forward_method_name(plan.method),
             plan.fell_back ? " (fallback to the parent's absorbed path)" : "");
  for (const auto& [name, value] : plan.details) fmt::print("  {:<18} {}\n", name, value);
  fmt::print(
      "  planning           {} absorbed, {} mha, {} chunk plans; chunk metadata calls {} "
      "({} skipped); {} ns\n",
      st.absorbed_plans, st.mha_plans, st.mha_chunk_plans, st.mha_chunk_metadata_calls,
      st.mha_chunk_metadata_skipped, st.plan_ns_total);
  if (j.contains("chunk_plan")) {
    const json& cp = j["chunk_plan"];
    fmt::print("  chunk plan         capacity {}, L = {}, {} chunks\n",
               cp["capacity"].get<int64_t>(), cp["chunk_len"].get<int64_t>(),
               cp["num_chunks"].get<int>());
    for (const auto& c : cp["chunks"]) {
      fmt::print("    start {:>7}  lens {}  tokens {}{}\n", c["start"].get<int64_t>(),
                 c["lens"].get<std::vector<int32_t>>(), c["num_tokens"].get<int64_t>(),
                 c["has_zero_kv"].get<bool>() ? "  (zero-length rows)" : "");
    }
  }
  return 0;
}

}  // namespace

CLI::App* add_plan_command(CLI::App& app, CommandRunner* runner) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* sub = app.add_subcommand(
      "plan", "Plan one synthetic batch with a backend and print its decisions (no attention)");
  constexpr int64_t kMaxLen = int64_t{1} << 20;
  sub->add_option("--backend", o->backend, "paged_mla, chunked_mla or ondemand_mla")
      ->capture_default_str()
      ->check(word_in(BackendRegistry::global().names()));
  sub->add_option("--device", o->device, "cpu, cuda, cuda:N")
      ->capture_default_str()
      ->check(device_name());
  sub->add_option("--model", o->model, "Model preset")
      ->capture_default_str()
      ->check(word_in(model_preset_names()));
  sub->add_option("--mode", o->mode, "decode, extend, mixed, verify, draft_extend")
      ->capture_default_str()
      ->check(word_in({"decode", "extend", "prefill", "mixed", "verify", "target_verify",
                       "target-verify", "draft_extend", "draft-extend"}));
  sub->add_option("--batch-size", o->batch_size, "Requests")
      ->capture_default_str()
      ->transform(integer_in(1, 4096));
  sub->add_option("--seq-len", o->seq_len,
                  "Tokens per request after the batch (verify: before the drafts)")
      ->capture_default_str()
      ->transform(integer_in(1, kMaxLen));
  sub->add_option("--prefix-len", o->prefix_len, "Cached prefix per request (extend-like modes)")
      ->capture_default_str()
      ->transform(integer_in(0, kMaxLen - 1));
  sub->add_option("--prefix-lens", o->prefix_lens, "Per-request cached prefixes (e.g. 16,32,48)")
      ->delimiter(',')
      ->transform(integer_in(0, kMaxLen - 1));
  sub->add_option("--draft-tokens", o->draft_tokens, "Verify: draft tokens per request")
      ->capture_default_str()
      ->transform(integer_in(1, 8));
  sub->add_option("--page-size", o->page_size, "1, 16, 32, 64 or 128")
      ->capture_default_str()
      ->transform(integer_one_of({1, 16, 32, 64, 128}));
  sub->add_option("--chunk-capacity", o->chunk_capacity,
                  "Chunked prefix cache: tokens per chunk across the batch")
      ->capture_default_str()
      ->transform(integer_in(1, kMaxLen * 4096));
  sub->add_option("--chunk-kv-budget-mib", o->chunk_kv_budget_mib,
                  "Budget of the up-projected prefix rows one MHA pass holds (caps the capacity)")
      ->capture_default_str()
      ->transform(integer_in(1, int64_t{1} << 20));
  sub->add_flag("--disable-chunked-prefix-cache", o->disable_chunked_prefix_cache,
                "Disable the chunked prefix cache (chunked_mla falls back with a prefix)");
  sub->add_flag("--piecewise-graph", o->piecewise_graph, "Piecewise-graph mode");
  sub->add_flag("--json", o->json_out, "Print one JSON object");
  sub->callback([runner, o] { *runner = [o] { return run_plan(*o); }; });
  return sub;
}

}  // namespace mla::cli
