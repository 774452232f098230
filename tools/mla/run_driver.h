// The serving simulation behind `mla run`: a workload (generated or a trace) goes through the
// scheduler (sim_scheduler.h); every batch is planned by a backend and run through the MLA layer
// for each layer with random inputs; optionally sampled steps are checked against the
// double-precision reference. Returns what happened, for the table or the JSON of `mla run`.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cli_util.h"
#include "mla/backend.h"
#include "mla/status.h"
#include "mla/types.h"
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
  sim::WorkloadConfig workload;      // num_requests and seed set from the command line
  sim::SchedulerConfig scheduler;    // speculative_tokens etc.
  std::string trace;                 // "" = the embedded workload
  std::string dump_trace;            // write the workload as JSONL here ("" = no)
  bool disable_chunked_prefix_cache = false;
  bool piecewise_graph = false;
  bool cuda_graph = false;           // capture/replay metadata path for decode and verify
  bool check = false;
  int check_steps = 6;               // steps compared with the reference (--check)
  double check_tolerance = 1e-2;     // max relative error ||o - ref|| / ||ref|| allowed
  bool progress = true;
};

struct ModeTotals {
  int64_t batches = 0;
  int64_t tokens = 0;    // new (query) tokens
  double seconds = 0.0;  // planning + layers
};

struct CheckedStep {
  int64_t step = 0;
  std::string mode;
  int batch_size = 0;
  int64_t tokens = 0;
  double rel_err = 0.0;
};

struct RunReport {
  std::string backend, device, model, workload;
  int layers = 0;
  int64_t steps = 0;
  double wall_seconds = 0.0;
  std::map<std::string, ModeTotals> modes;  // by forward_mode_name
  nlohmann::json workspaces;                // ledger records outside the KV pool, at the end
  std::size_t pool_bytes = 0;
  PlanningStats planning;                   // target backend (plus the draft backend's counts)
  double median_plan_ns = 0.0;              // over every planned batch (our own timing)
  uint64_t graph_captures = 0;
  sim::SchedulerStats scheduler;
  bool checked = false;
  std::vector<CheckedStep> checks;
  double max_rel_err = 0.0;
  bool check_passed = true;
};

// Runs the whole simulation. Any library error comes back as its Status.
StatusOr<RunReport> run_simulation(const RunConfig& config);

}  // namespace mla::cli
