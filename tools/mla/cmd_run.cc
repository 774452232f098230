// `mla run`: the serving simulation (run_driver.h). Prints a table of tokens/s and time per
// mode, planning and workspace figures, or one JSON object with --json.
#include <fmt/ranges.h>
#include <unistd.h>

#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_util.h"
#include "commands.h"
#include "mla/model.h"
#include "sim/run_driver.h"

namespace mla::cli {
namespace {

using nlohmann::json;

// Flag limits: beyond them a run cannot be meaningful on any machine (the KV pool's int32 slots,
// a request table of rows x max-context-len entries, days of simulation).
constexpr int64_t kMaxLayers = 128;
constexpr int64_t kMaxRequests = 1'000'000;
constexpr int64_t kMaxRunning = 4096;
constexpr int64_t kMaxPoolTokens = int64_t{1} << 26;
constexpr int64_t kMaxContextLen = int64_t{1} << 20;

struct RunFlags {
  RunConfig config;
  std::string device = "cpu";
  int requests = 24;
  uint64_t seed = 1;
  bool no_mixed = false;
  bool json_out = false;
  bool no_progress = false;
};

json check_json(const RunReport& r, const RunConfig& c) {
  json steps = json::array();
  for (const CheckedStep& cs : r.checks) {
    json s{{"step", cs.step},
           {"mode", cs.mode},
           {"reason", cs.reason},
           {"layer", cs.layer},
           {"batch_size", cs.batch_size},
           {"tokens", cs.tokens},
           {"max_prefix", cs.max_prefix},
           {"requests_checked", cs.requests_checked},
           {"rows_checked", cs.rows_checked},
           {"heads_checked", cs.heads_checked},
           {"kv_slots_checked", cs.kv_slots_checked},
           {"kv_mismatches", cs.kv_mismatches},
           {"rel_err", cs.rel_err},
           {"worst_request", cs.worst_request},
           {"worst_row", cs.worst_row},
           {"passed", cs.passed}};
    if (!cs.kv_error.empty()) s["kv_error"] = cs.kv_error;
    steps.push_back(std::move(s));
  }
  const CheckSummary& s = r.check_summary;
  return {{"passed", r.check_passed},
          {"tolerance", c.check_tolerance},
          {"max_rel_err", r.max_rel_err},
          {"budget_macs_per_step", c.check_budget},
          {"steps", s.steps},
          {"steps_checked", s.steps_checked},
          {"steps_skipped", s.steps_skipped},
          {"requests_checked", s.requests_checked},
          {"rows", s.rows},
          {"rows_checked", s.rows_checked},
          {"rows_sampled_out", s.rows_sampled_out},
          {"steps_with_sampled_heads", s.steps_with_sampled_heads},
          {"kv_slots_checked", s.kv_slots_checked},
          {"kv_mismatches", s.kv_mismatches},
          {"recompute_steps_checked", s.recompute_steps_checked},
          {"preempted_decode_steps_checked", s.preempted_decode_steps_checked},
          {"kinds_present", s.kinds_present},
          {"kinds_checked", s.kinds_checked},
          {"checks", steps}};
}

json percentiles_json(const Percentiles& p) {
  return {{"count", p.count}, {"p50", p.p50},   {"p90", p.p90},
          {"p99", p.p99},     {"mean", p.mean}, {"max", p.max}};
}

// The serving metrics (run_driver.h's ServingMetrics documents the clock).
json serving_json(const ServingMetrics& m) {
  json plan = json::object();
  for (const auto& [mode, p] : m.plan_us) {
    plan[mode] = percentiles_json(p);
    plan[mode]["total_seconds"] = m.plan_seconds.at(mode);
  }
  return {{"clock",
           "simulated timeline: each batch advances it by its measured planning + layer time "
           "(check excluded); a request arrives at the start of the first step whose scheduler "
           "clock reaches its arrival_step; idle time before a later arrival is not counted"},
          {"seconds", m.seconds},
          {"latency_seconds",
           {{"queue", percentiles_json(m.queue)},
            {"ttft", percentiles_json(m.ttft)},
            {"tpot", percentiles_json(m.tpot)},
            {"e2e", percentiles_json(m.e2e)}}},
          {"throughput",
           {{"output_tokens", m.output_tokens},
            {"output_tokens_per_second", m.output_tokens_per_s},
            {"prefill_tokens", m.prefill_tokens},
            {"recompute_tokens", m.recompute_tokens},
            {"prefill_tokens_per_second", m.prefill_tokens_per_s}}},
          {"planning_us_by_mode", plan},
          {"kv_pool",
           {{"pages", m.pool_pages},
            {"page_size", m.page_size},
            {"capacity_tokens", m.pool_pages * m.page_size},
            {"peak_used_pages", m.peak_used_pages},
            {"peak_utilisation", m.peak_utilisation},
            {"preemptions", m.preemptions},
            {"preempted_requests", m.preempted_requests},
            {"preempted_tokens", m.preempted_tokens}}}};
}

json peak_json(const RunReport& r) {
  std::size_t total = 0;
  for (const auto& [name, bytes] : r.peak_bytes) total += bytes;
  return {{"total", total}, {"by_buffer", r.peak_bytes}};
}

json report_json(const RunReport& r, const RunConfig& c) {
  json tokens = json::object(), seconds = json::object(), batches = json::object(),
       tok_s = json::object();
  for (const auto& [mode, m] : r.modes) {
    tokens[mode] = m.tokens;
    seconds[mode] = m.seconds;
    batches[mode] = m.batches;
    tok_s[mode] = m.seconds > 0 ? static_cast<double>(m.tokens) / m.seconds : 0.0;
  }
  const auto& s = r.scheduler;
  const sim::WorkloadConfig& w = c.workload;
  // Everything needed to reproduce the run: version, commit, seed, workload and limits.
  json reproduce{{"version", kVersion},
                 {"commit", git_commit()},
                 {"seed", w.seed},
                 {"trace", c.trace},
                 {"flags",
                  {{"backend", c.backend},
                   {"device", c.device.to_string()},
                   {"model", c.model},
                   {"layers", c.layers},
                   {"requests", w.num_requests},
                   {"speculative", c.scheduler.speculative_tokens},
                   {"cuda_graph", c.cuda_graph},
                   {"piecewise_graph", c.piecewise_graph},
                   {"disable_chunked_prefix_cache", c.disable_chunked_prefix_cache},
                   {"check", c.check},
                   {"check_steps", c.check_steps},
                   {"check_tolerance", c.check_tolerance}}},
                 {"limits",
                  {{"max_running", c.scheduler.max_running_requests},
                   {"max_batch_tokens", c.scheduler.max_batch_tokens},
                   {"pool_tokens", c.pool_tokens},
                   {"max_context_len", c.max_context_len},
                   {"page_size", c.page_size},
                   {"mixed", c.scheduler.enable_mixed},
                   {"max_prefix_entries", c.scheduler.max_prefix_entries},
                   {"chunk_kv_budget_mib", c.chunk_kv_budget_mib}}}};
  if (c.trace.empty()) {
    reproduce["workload_parameters"] = {
        {"num_requests", w.num_requests},     {"arrival_rate", w.arrival_rate},
        {"initial_burst", w.initial_burst},   {"prompt_median", w.prompt_median},
        {"prompt_sigma", w.prompt_sigma},     {"prompt_min", w.prompt_min},
        {"prompt_max", w.prompt_max},         {"prefix_hit_prob", w.prefix_hit_prob},
        {"prefix_groups", w.prefix_groups},   {"prefix_len_min", w.prefix_len_min},
        {"prefix_len_max", w.prefix_len_max}, {"output_median", w.output_median},
        {"output_sigma", w.output_sigma},     {"output_min", w.output_min},
        {"output_max", w.output_max}};
  }
  json j{{"reproduce", reproduce},
         {"backend", r.backend},
         {"device", r.device},
         {"model", r.model},
         {"layers", r.layers},
         {"page_size", c.page_size},
         {"speculative", c.scheduler.speculative_tokens},
         {"cuda_graph", c.cuda_graph},
         {"piecewise_graph", c.piecewise_graph},
         {"disable_chunked_prefix_cache", c.disable_chunked_prefix_cache},
         {"workload", r.workload},
         {"steps", r.steps},
         {"wall_seconds", r.wall_seconds},
         {"tokens", tokens},
         {"seconds", seconds},
         {"batches", batches},
         {"tokens_per_second", tok_s},
         {"serving", serving_json(r.serving)},
         {"workspaces", r.workspaces},
         {"peak_bytes_outside_pool", peak_json(r)},
         {"chunk_kv_budget_bytes", static_cast<std::size_t>(c.chunk_kv_budget_mib) << 20},
         {"kv_pool_bytes", r.pool_bytes},
         {"planning",
          {{"init_forward_metadata_calls", r.planning.init_forward_metadata_calls},
           {"absorbed_plans", r.planning.absorbed_plans},
           {"mha_plans", r.planning.mha_plans},
           {"mha_chunk_plans", r.planning.mha_chunk_plans},
           {"mha_chunk_metadata_calls", r.planning.mha_chunk_metadata_calls},
           {"mha_chunk_metadata_skipped", r.planning.mha_chunk_metadata_skipped},
           {"chunks_planned", r.planning.chunks_planned},
           {"fallbacks", r.planning.fallbacks},
           {"graph_captures", r.graph_captures},
           {"graph_replays", r.planning.graph_replays},
           {"median_plan_ns", r.median_plan_ns}}},
         {"scheduler",
          {{"finished", s.finished},
           {"max_batch_size", s.max_batch_size},
           {"prefix_hits", s.prefix_hits},
           {"prefix_hit_tokens", s.prefix_hit_tokens},
           {"prefix_evictions", s.prefix_evictions},
           {"prefill_chunks", s.prefill_chunks},
           {"drafts_proposed", s.drafts_proposed},
           {"drafts_accepted", s.drafts_accepted},
           {"peak_used_pages", s.peak_used_pages},
           {"preemptions", s.preemptions},
           {"preempted_requests", s.preempted_requests},
           {"preempted_tokens", s.preempted_tokens},
           {"recompute_tokens", s.recompute_tokens}}}};
  if (r.checked) j["check"] = check_json(r, c);
  return j;
}

void print_report(const RunReport& r, const RunConfig& c) {
  fmt::print("{} on {}, {} ({} layer{}), page size {}{}{}{}\n", r.backend, r.device, r.model,
             r.layers, r.layers == 1 ? "" : "s", c.page_size,
             c.scheduler.speculative_tokens
                 ? fmt::format(", speculative {}", c.scheduler.speculative_tokens)
                 : "",
             c.cuda_graph ? ", graph replay for decode/verify" : "",
             c.disable_chunked_prefix_cache ? ", chunked prefix cache off" : "");
  fmt::print("workload: {}\n\n", r.workload);
  fmt::print("{:<14} {:>8} {:>9} {:>10} {:>12}\n", "mode", "batches", "tokens", "seconds",
             "tokens/s");
  int64_t tokens = 0;
  double secs = 0.0;
  for (const auto& [mode, m] : r.modes) {
    fmt::print("{:<14} {:>8} {:>9} {:>10.3f} {:>12.1f}\n", mode, m.batches, m.tokens, m.seconds,
               m.seconds > 0 ? m.tokens / m.seconds : 0.0);
    tokens += m.tokens;
    secs += m.seconds;
  }
  fmt::print("{:<14} {:>8} {:>9} {:>10.3f} {:>12.1f}\n", "total", r.steps, tokens, secs,
             secs > 0 ? tokens / secs : 0.0);
  const ServingMetrics& m = r.serving;
  fmt::print(
      "\nserving metrics on the simulated timeline ({:.3f} s: measured batch times back to back; "
      "see `mla run --help`), milliseconds:\n",
      m.seconds);
  fmt::print("  {:<22} {:>10} {:>10} {:>10} {:>10}\n", "", "p50", "p90", "p99", "mean");
  for (const auto& [name, p] : {std::pair<const char*, const Percentiles&>{"queueing", m.queue},
                                {"time to first token", m.ttft},
                                {"time per output token", m.tpot},
                                {"end-to-end", m.e2e}}) {
    fmt::print("  {:<22} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f}\n", name, p.p50 * 1e3, p.p90 * 1e3,
               p.p99 * 1e3, p.mean * 1e3);
  }
  fmt::print(
      "  output {} tokens, {:.1f} tokens/s; prefill {} tokens ({} recomputed after "
      "preemption), {:.1f} tokens/s\n",
      m.output_tokens, m.output_tokens_per_s, m.prefill_tokens, m.recompute_tokens,
      m.prefill_tokens_per_s);
  fmt::print("  planning per batch, us (p50 / p90 / p99, total ms):");
  for (const auto& [mode, p] : m.plan_us) {
    fmt::print(" {} {:.1f} / {:.1f} / {:.1f}, {:.2f};", mode, p.p50, p.p90, p.p99,
               m.plan_seconds.at(mode) * 1e3);
  }
  fmt::print(
      "\n  KV pool: {} pages of {} ({} tokens), peak {} pages ({:.1f} %), {} preemptions "
      "({} requests, {} KV tokens discarded)\n",
      m.pool_pages, m.page_size, m.pool_pages * m.page_size, m.peak_used_pages,
      m.peak_utilisation * 100.0, m.preemptions, m.preempted_requests, m.preempted_tokens);
  const auto& s = r.scheduler;
  fmt::print(
      "\nscheduler: {} requests finished, max batch {}, {} prefix hits ({} tokens shared), "
      "{} prefill chunks, peak {} pages",
      s.finished, s.max_batch_size, s.prefix_hits, s.prefix_hit_tokens, s.prefill_chunks,
      s.peak_used_pages);
  if (s.drafts_proposed) {
    fmt::print(", drafts accepted {}/{}", s.drafts_accepted, s.drafts_proposed);
  }
  const auto& p = r.planning;
  fmt::print(
      "\nplanning: median {:.1f} us per batch; {} init_forward_metadata, {} absorbed / {} "
      "mha / {} chunk plans, chunk metadata calls {} ({} skipped), {} fallbacks",
      r.median_plan_ns / 1e3, p.init_forward_metadata_calls, p.absorbed_plans, p.mha_plans,
      p.mha_chunk_plans, p.mha_chunk_metadata_calls, p.mha_chunk_metadata_skipped, p.fallbacks);
  if (c.cuda_graph)
    fmt::print(", {} graph captures, {} replays", r.graph_captures, p.graph_replays);
  fmt::print("\n\nworkspace bytes outside the KV pool ({} in the pool):\n",
             human_bytes(r.pool_bytes));
  print_ledger_table(r.workspaces, "  ");
  std::size_t peak = 0;
  for (const auto& [name, bytes] : r.peak_bytes) peak += bytes;
  fmt::print("peak outside the pool: {} (mha_chunk_kv budget {} MiB)\n", human_bytes(peak),
             c.chunk_kv_budget_mib);
  if (r.checked) {
    const CheckSummary& cs = r.check_summary;
    fmt::print(
        "\ncheck: {} of {} steps against the double-precision reference: {} request "
        "entries, {} of {} token rows ({} sampled out by the reference budget), {} KV "
        "slots against the simulation's KV model ({} wrong); worst per-row rel err {:.3g} "
        "(tolerance {:.3g}): {}\n",
        cs.steps_checked, cs.steps, cs.requests_checked, cs.rows_checked, cs.rows,
        cs.rows_sampled_out, cs.kv_slots_checked, cs.kv_mismatches, r.max_rel_err,
        c.check_tolerance, r.check_passed ? "PASSED" : "FAILED");
    fmt::print("  kinds present: {}; checked: {}\n", fmt::join(cs.kinds_present, ", "),
               fmt::join(cs.kinds_checked, ", "));
    if (cs.recompute_steps_checked || cs.preempted_decode_steps_checked) {
      fmt::print("  preempted requests: {} re-prefill steps and {} decode steps checked\n",
                 cs.recompute_steps_checked, cs.preempted_decode_steps_checked);
    }
    if (cs.steps_with_sampled_heads) {
      fmt::print("  {} steps checked a sample of the heads (reference budget)\n",
                 cs.steps_with_sampled_heads);
    }
    for (const auto& [why, n] : cs.steps_skipped) fmt::print("  {} steps skipped: {}\n", n, why);
    for (const CheckedStep& s : r.checks) {
      fmt::print(
          "  step {:>4} {:<13} bs {:>3} tokens {:>5} prefix {:>6}  rows {:>5} heads {:>3} "
          "kv {:>7}{}  rel err {:.3g} (request {} row {})  {}\n",
          s.step, s.mode, s.batch_size, s.tokens, s.max_prefix, s.rows_checked, s.heads_checked,
          s.kv_slots_checked, s.kv_mismatches ? fmt::format(" ({} WRONG)", s.kv_mismatches) : "",
          s.rel_err, s.worst_request, s.worst_row, s.reason);
      if (!s.kv_error.empty()) fmt::print("    {}\n", s.kv_error);
    }
  }
  fmt::print("\nwall time {:.2f} s\n", r.wall_seconds);
}

int run_run(RunFlags& f) {
  RunConfig& c = f.config;
  auto dev = parse_device(f.device);
  if (!dev.ok()) return fail(dev.status());
  c.device = *dev;
  c.workload.num_requests = f.requests;
  c.workload.seed = f.seed;
  c.scheduler.seed = f.seed;
  c.scheduler.enable_mixed = !f.no_mixed;
  c.progress = !f.json_out && !f.no_progress;
  auto report = run_simulation(c);
  if (!report.ok()) return fail(report.status());
  if (f.json_out) {
    std::printf("%s\n", report_json(*report, c).dump(2).c_str());
  } else {
    print_report(*report, c);
  }
  if (c.check && !report->check_passed) {
    const CheckSummary& cs = report->check_summary;
    std::fprintf(stderr,
                 "mla run: --check failed: worst per-row rel err %.3g (tolerance %.3g), %lld "
                 "wrong KV slots, %lld steps checked, kinds checked %zu of %zu\n",
                 report->max_rel_err, c.check_tolerance, static_cast<long long>(cs.kv_mismatches),
                 static_cast<long long>(cs.steps_checked), cs.kinds_checked.size(),
                 cs.kinds_present.size());
    return 1;
  }
  return 0;
}

}  // namespace

CLI::App* add_run_command(CLI::App& app, CommandRunner* runner) {
  auto f = std::make_shared<RunFlags>();
  RunConfig& c = f->config;
  CLI::App* sub = app.add_subcommand(
      "run", "Serving simulation: drive a backend through a realistic stream of batches");
  sub->footer(
      "Scheduling: admission reserves each request's prompt only (its output length is not "
      "known in advance); when decodes need pages the pool lacks, cached prefixes are evicted, "
      "then the most recently admitted requests are preempted (pages freed, requeued at the "
      "front, later re-prefilled with their generated tokens).\n"
      "Metrics clock: a simulated timeline on which each batch takes its measured time "
      "(planning + layers on the device; --check's reference excluded), batches back to back. "
      "A request arrives at the start of the first step whose scheduler clock reaches its "
      "arrival_step; idle time before a later arrival is not counted. Queueing: arrival to its "
      "first prefill chunk's start; TTFT: arrival to the end of the batch giving its first "
      "output token; end-to-end: to the end of the batch giving its last; TPOT: (end-to-end - "
      "TTFT) / (output tokens - 1). p50/p90/p99 are nearest-rank over requests. tokens/s per "
      "mode: new (query) tokens / that mode's measured seconds, as in earlier versions.");
  const auto backends = BackendRegistry::global().names();
  sub->add_option("--backend", c.backend, "paged_mla, chunked_mla or ondemand_mla")
      ->capture_default_str()
      ->check(word_in(backends));
  sub->add_option("--device", f->device, "cpu, cuda, cuda:N")
      ->capture_default_str()
      ->check(device_name());
  sub->add_option("--model", c.model, "Model preset (mla info lists them)")
      ->capture_default_str()
      ->check(word_in(model_preset_names()));
  sub->add_option("--layers", c.layers, "Layers run per batch")
      ->capture_default_str()
      ->transform(integer_in(1, kMaxLayers));
  sub->add_option("--page-size", c.page_size, "1, 16, 32, 64 or 128")
      ->capture_default_str()
      ->transform(integer_one_of({1, 16, 32, 64, 128}));
  sub->add_option("--requests", f->requests, "Requests of the embedded workload")
      ->capture_default_str()
      ->transform(integer_in(1, kMaxRequests));
  sub->add_option("--seed", f->seed, "Seed of the workload, inputs and accepted drafts")
      ->capture_default_str()
      ->transform(unsigned_integer());
  sub->add_option("--speculative", c.scheduler.speculative_tokens,
                  "Draft tokens per TARGET_VERIFY (0 = off); adds DRAFT_EXTEND batches")
      ->capture_default_str()
      ->transform(integer_in(0, 8));
  sub->add_option("--trace", c.trace, "Replay a JSONL request trace (docs/trace-format.md)");
  sub->add_option("--dump-trace", c.dump_trace, "Write the workload as a JSONL trace");
  sub->add_option("--max-running", c.scheduler.max_running_requests, "Running requests at most")
      ->capture_default_str()
      ->transform(integer_in(1, kMaxRunning));
  sub->add_option("--max-batch-tokens", c.scheduler.max_batch_tokens,
                  "New tokens per batch at most (chunked prefill); at most --pool-tokens")
      ->capture_default_str()
      ->transform(integer_in(1, kMaxPoolTokens));
  sub->add_option("--pool-tokens", c.pool_tokens, "KV pool capacity in tokens")
      ->capture_default_str()
      ->transform(integer_in(1, kMaxPoolTokens));
  sub->add_option("--max-context-len", c.max_context_len, "Longest request (tokens)")
      ->capture_default_str()
      ->transform(integer_in(1, kMaxContextLen));
  sub->add_option("--chunk-kv-budget-mib", c.chunk_kv_budget_mib,
                  "Budget of the up-projected prefix rows one MHA pass holds (the backend's "
                  "mha_chunk_kv buffer); longer prefixes take more chunks")
      ->capture_default_str()
      ->transform(integer_in(1, int64_t{1} << 20));
  sub->add_flag("--no-mixed", f->no_mixed, "No MIXED batches (prefill and decode apart)");
  sub->add_flag("--disable-chunked-prefix-cache", c.disable_chunked_prefix_cache,
                "Backend option: no chunked prefix cache (chunked_mla falls back with a prefix)");
  sub->add_flag("--piecewise-graph", c.piecewise_graph,
                "Backend option: piecewise-graph mode (absorbed form for every extend)");
  sub->add_flag("--cuda-graph", c.cuda_graph,
                "Capture/replay metadata path for decode and verify batches");
  sub->add_flag("--check", c.check,
                "Compare sampled steps with the double-precision reference; exit 1 on failure");
  sub->add_option("--check-steps", c.check_steps,
                  "--check: extra steps sampled (every 5th) beyond the first of each batch kind "
                  "and every extend with a prefix")
      ->capture_default_str()
      ->transform(integer_in(1, std::numeric_limits<int>::max()));
  sub->add_option("--check-tolerance", c.check_tolerance,
                  "Largest per-row relative error ||o - ref|| / ||ref|| accepted")
      ->capture_default_str()
      ->check(positive_finite());
  sub->add_flag("--json", f->json_out, "Print one JSON object (no progress bar)");
  sub->add_flag("--no-progress", f->no_progress, "No progress bar on stderr");
  sub->callback([runner, f] { *runner = [f] { return run_run(*f); }; });
  return sub;
}

}  // namespace mla::cli
