// GPU benchmarks of the prefill side, called by `mla bench` (cmd_bench.cc):
//   prefill: the MHA op alone, 192/128 causal, 128 heads, (b1, 4096), (b4, 2048), (b1, 16384);
//            TFLOP/s count half of the square (2 * b * s^2 / 2 * H * (192 + 128)), as PERF.md.
//   extend:  4096 new tokens on a 32768-token prefix through a backend's forward_extend
//            (chunked_mla: causal + one prefix chunk + merge; paged_mla: one-shot gather +
//            up-project + causal pass), kv write and up-projection included in the time;
//            TFLOP/s count the attention pairs (4096 * 32768 + 4096 * 4097 / 2) * H * 2 * 320.
// Each row goes to `sink` as one JSON object (op, backend, b, s_q, h_q, s_k, us, tflops, ...).
#pragma once

#include <functional>
#include <nlohmann/json.hpp>

#include "mla/status.h"

namespace mla::cli {

using BenchSink = std::function<void(const nlohmann::json&)>;

// Runs the chosen groups on cuda:0. quick: fewer iterations and only (b1, 4096) for prefill.
// Rows carry no ceiling fractions: `mla bench` adds them against the ceilings it measures in the
// same run (ceilings.h).
Status run_prefill_benches(bool prefill, bool extend, bool quick, const BenchSink& sink);

}  // namespace mla::cli
