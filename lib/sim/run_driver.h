// The serving simulation behind `mla run`: a workload (generated or a trace) goes through the
// scheduler (sim_scheduler.h); every batch is planned by a backend and run through the MLA layer
// for each layer with random inputs; optionally sampled steps are checked against the
// double-precision reference. Returns what happened, for the table or the JSON of `mla run`.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "mla/backend.h"
#include "mla/status.h"
#include "mla/types.h"
#include "sim/run_report.h"
#include "sim_scheduler.h"
#include "sim_workload.h"

namespace mla::cli {

struct RunConfig {
  std::string backend = "paged_mla";
  Device device = Device::cpu();
  std::string model = "deepseek-v3-tp8";
  int layers = 2;
  int page_size = 64;
  int64_t pool_tokens = 65536;
  int max_context_len = 4096;
  int64_t chunk_kv_budget_mib = 512;  // BackendOptions::mha_chunk_kv_budget_bytes, in MiB
  sim::WorkloadConfig workload;       // num_requests and seed set from the command line
  sim::SchedulerConfig scheduler;     // speculative_tokens etc.
  std::string trace;                  // "" = the embedded workload
  std::string dump_trace;             // write the workload as JSONL here ("" = no)
  bool disable_chunked_prefix_cache = false;
  bool piecewise_graph = false;
  bool cuda_graph = false;  // capture/replay metadata path for decode and verify
  // --check checks, on the first layer of each step it picks: the first batch of every kind
  // (mode, with or without a cached prefix), every EXTEND / MIXED batch whose prefill part has
  // a cached prefix, and up to check_steps more (every 5th step). A step's reference is sampled
  // by rows (then heads) to stay within check_budget multiply-adds, never skipped.
  bool check = false;
  int check_steps = 6;            // extra sampled steps (--check-steps)
  double check_tolerance = 1e-2;  // worst per-row ||o - ref|| / ||ref|| allowed
  double check_budget = 3e8;      // reference multiply-adds per checked step
  bool progress = true;
  // Runs on a stream of its own (DeviceRuntime::create_stream; cuda: non-blocking) instead of
  // the legacy default stream: the backends (and so the pool, AttentionBackend::set_stream) and
  // the layers all on it. Threads running simulations at once then run on separate streams.
  bool own_stream = false;
};

struct ModeTotals {
  int64_t batches = 0;
  int64_t tokens = 0;    // new (query) tokens
  double seconds = 0.0;  // planning + layers
};

struct CheckedStep {
  int64_t step = 0;
  std::string mode;
  std::string reason;  // "first <kind>", "extend with a prefix", "sampled"
  int batch_size = 0;
  int64_t tokens = 0;
  int32_t max_prefix = 0;  // largest cached prefix among the batch's entries
  int layer = 0;
  int requests_checked = 0;
  int64_t rows_checked = 0;
  int heads_checked = 0;
  int64_t kv_slots_checked = 0;
  int64_t kv_mismatches = 0;
  std::string kv_error;
  double rel_err = 0.0;    // worst row
  int worst_request = -1;  // request id and row of the worst row
  int worst_row = -1;
  bool passed = true;
};

// p50 / p90 / p99 (nearest rank), mean and max of one per-request latency, in seconds.
struct Percentiles {
  int64_t count = 0;
  double p50 = 0.0, p90 = 0.0, p99 = 0.0, mean = 0.0, max = 0.0;
};
Percentiles percentiles(std::vector<double> values);

// The metrics a serving engineer reads, on the simulated timeline: time advances by each
// batch's measured time (planning + layers on the run's device, as in the per-mode table;
// --check's reference excluded), batches back to back. A request arrives at the start of the
// first step whose scheduler clock reaches its arrival_step; time with nothing to run (before a
// later arrival) is not counted. Queueing: arrival to the start of its first prefill chunk.
// TTFT: arrival to the end of the batch that produced its first output token. End-to-end:
// arrival to the end of the batch that produced its last. TPOT: (end-to-end - TTFT) /
// (output_len - 1), requests with more than one output token.
struct ServingMetrics {
  double seconds = 0.0;  // the timeline's length (= the per-mode seconds' sum)
  Percentiles queue, ttft, tpot, e2e;
  int64_t output_tokens = 0;     // generated tokens
  int64_t prefill_tokens = 0;    // tokens of prefill entries, re-prefills included
  int64_t recompute_tokens = 0;  // of those, re-prefills after a preemption
  double output_tokens_per_s = 0.0, prefill_tokens_per_s = 0.0;
  std::map<std::string, Percentiles> plan_us;  // planning time per mode, microseconds
  std::map<std::string, double> plan_seconds;  // planning time per mode, total
  int64_t pool_pages = 0, page_size = 0, peak_used_pages = 0;
  double peak_utilisation = 0.0;  // peak_used_pages / pool_pages
  int64_t preemptions = 0, preempted_requests = 0, preempted_tokens = 0;
};

struct CheckSummary {
  int64_t steps = 0, steps_checked = 0;
  std::map<std::string, int64_t> steps_skipped;  // reason -> steps
  int64_t requests_checked = 0;                  // request entries over the checked steps
  int64_t rows = 0, rows_checked = 0;            // token rows of the checked steps
  int64_t rows_sampled_out = 0;                  // not in the reference budget
  int64_t steps_with_sampled_heads = 0;
  int64_t kv_slots_checked = 0, kv_mismatches = 0;
  int64_t recompute_steps_checked = 0;         // steps re-prefilling a preempted request
  int64_t preempted_decode_steps_checked = 0;  // steps decoding a request preempted before
  std::vector<std::string> kinds_present, kinds_checked;
};

struct RunReport {
  std::string backend, device, model, workload;
  int layers = 0;
  int64_t steps = 0;
  double wall_seconds = 0.0;
  std::map<std::string, ModeTotals> modes;        // by forward_mode_name
  nlohmann::json workspaces;                      // ledger records outside the KV pool, at the end
  std::map<std::string, std::size_t> peak_bytes;  // per buffer outside the pool, max over steps
  std::size_t pool_bytes = 0;
  PlanningStats planning;       // target backend (plus the draft backend's counts)
  double median_plan_ns = 0.0;  // over every planned batch (our own timing)
  uint64_t graph_captures = 0;
  sim::SchedulerStats scheduler;
  ServingMetrics serving;
  bool checked = false;
  std::vector<CheckedStep> checks;
  CheckSummary check_summary;
  double max_rel_err = 0.0;
  bool check_passed = true;
};

// Runs the whole simulation. Any library error comes back as its Status.
StatusOr<RunReport> run_simulation(const RunConfig& config);

}  // namespace mla::cli
