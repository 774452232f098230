// CPU benchmarks, called by `mla bench --device cpu` (cmd_bench.cc): the cpu OpSet
// (src/kernels/cpu) over a decode grid (absorbed op, s_q 1, page 64) and a prefill grid (MHA
// op, 192/128 causal), each row set against two ceilings measured in the same process:
//   stream_gbps: a STREAM-like read (sum of a 512 MiB fp32 array, every pool thread, best of 5);
//   fma_gflops:  a register-resident FMA loop (AVX2+FMA when the cpu has it), every pool thread.
// A row carries gbps (bytes the op must move: cache and q read, o written), gflops, their
// fractions of the ceilings, the binding roofline bound and ceiling_fraction = the time the
// binding ceiling allows over the measured time.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>

#include "mla/status.h"

namespace mla::cli {

using CpuBenchSink = std::function<void(const nlohmann::json&)>;

// quick: a few anchor shapes, fewer runs. Rows go to sink; `base` is merged into each.
Status run_cpu_benches(bool decode, bool prefill, bool quick, int iters, const nlohmann::json& base,
                       const CpuBenchSink& sink);

}  // namespace mla::cli
