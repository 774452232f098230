// `mla bench --device cuda|cpu [--json] [--quick] [--out FILE] [--cache-dtype bf16,fp8]
// [--pages 1,16,32,64,128]`: timings of the ops. --device cpu: the cpu OpSet over a decode and a
// prefill grid against the machine's measured read bandwidth and FMA peak (bench_cpu.{h,cc}).
// Decode (absorbed op) over the grid; prefill and extend rows come from cuda-prefill's
// bench_prefill.{h,cc}. Timing follows docs PERF.md: CUDA events around every run, warm-up
// first, median, q/o sets rotated, random normal/4 data (never zeros).
// Every result is one JSON object (date, commit, gpu, op, backend, b, s_q, h_q, s_k, page_size,
// varlen, cache_dtype, us, tflops, gbps, ...; decode gbps counts the bytes actually moved: 576
// bytes per key for an fp8 cache, 1152 for bf16); --json prints them one per line, --out appends
// them to a file.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench_cpu.h"
#include "cli_util.h"
#include "commands.h"
#include "conformance/case_gen.h"
#include "mla/memory.h"
#include "mla/model.h"
#include "mla/ops.h"

#ifdef MLA_WITH_CUDA
#include <cuda_runtime.h>

#include "bench_cuda.h"
#include "ceilings.h"
#include "fill.h"
#endif

#if __has_include("bench_prefill.h")
#include "bench_prefill.h"
#define MLA_HAVE_BENCH_PREFILL 1
#endif

namespace mla::cli {
namespace {

struct BenchOptions {
  std::string device = "cuda";
  bool json = false;
  bool quick = false;
  std::string out;
  int iters = 20;
  std::string ops = "decode,prefill,extend";
  std::string cache_dtype = "bf16";  // decode: bf16, fp8 or bf16,fp8
  bool batch_invariant = false;      // decode: batch-invariant plans (BackendOptions)
  std::vector<int> pages;            // decode: page sizes of the grid (empty: 1 and 64)
};

std::string utc_date() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

std::string commit_id() {
  const char* c = std::getenv("MLA_COMMIT");
  return c ? c : "unknown";
}

class Emitter {
 public:
  explicit Emitter(const BenchOptions& o) : opt_(o) {
    if (!o.out.empty()) file_.open(o.out, std::ios::app);
    if (!opt_.json && o.device == "cpu") {
      std::printf("%-11s %-4s %5s %4s %6s %5s %10s %8s %8s %7s %7s %6s %s\n", "op", "b", "s_q",
                  "h_q", "s_k", "page", "us", "GFLOP/s", "GB/s", "bw_frac", "fl_frac", "frac",
                  "bound");
    } else if (!opt_.json) {
      std::printf("%-8s %-4s %3s %4s %6s %5s %5s %4s %10s %8s %8s %6s %s\n", "op", "b", "s_q",
                  "h_q", "s_k", "page", "var", "kv", "us", "TFLOP/s", "GB/s", "frac", "bound");
    }
  }
  bool file_ok() const { return opt_.out.empty() || file_.good(); }
  void emit(nlohmann::json row) {
    // MLA_BENCH_VARIANT names an A/B build or switch setting in the recorded rows.
    if (const char* v = std::getenv("MLA_BENCH_VARIANT"); v != nullptr && *v != '\0') {
      row["variant"] = v;
    }
    if (opt_.json) {
      std::cout << row.dump() << "\n" << std::flush;
    } else if (row.value("op", "") == "ceiling") {
      std::printf("ceiling  %-24s %8.1f TFLOP/s %8.0f GB/s (this run)\n",
                  row.value("what", "").c_str(), row.value("tflops", 0.0), row.value("gbps", 0.0));
    } else if (opt_.device == "cpu") {
      std::printf("%-11s %-4d %5d %4d %6d %5d %10.1f %8.1f %8.2f %7.3f %7.3f %6.3f %s\n",
                  row.value("op", "").c_str(), row.value("b", 0), row.value("s_q", 0),
                  row.value("h_q", 0), row.value("s_k", 0), row.value("page_size", 0),
                  row.value("us", 0.0), row.value("gflops", 0.0), row.value("gbps", 0.0),
                  row.value("bw_fraction", 0.0), row.value("flop_fraction", 0.0),
                  row.value("ceiling_fraction", 0.0), row.value("bound", "").c_str());
      std::fflush(stdout);
    } else {
      std::printf("%-8s %-4d %3d %4d %6d %5d %5s %4s %10.1f %8.1f %8.0f %6.3f %s\n",
                  row.value("op", "").c_str(), row.value("b", 0), row.value("s_q", 0),
                  row.value("h_q", 0), row.value("s_k", 0), row.value("page_size", 0),
                  row.value("varlen", false) ? "yes" : "no",
                  row.value("cache_dtype", "") == "fp8e4m3" ? "fp8" : "", row.value("us", 0.0),
                  row.value("tflops", 0.0), row.value("gbps", 0.0),
                  row.value("ceiling_fraction", 0.0), row.value("bound", "").c_str());
      std::fflush(stdout);
    }
    if (file_.is_open()) file_ << row.dump() << "\n" << std::flush;
  }

 private:
  const BenchOptions& opt_;
  std::ofstream file_;
};

#ifdef MLA_WITH_CUDA

struct DecodeConfig {
  int b, s_q, h_q, s_k, page;
  bool varlen;
  DType cache_dtype = DType::kBF16;
};

// A row's fractions of this run's ceilings: decode against the streaming read (it reads the
// cache once) and cuBLAS's bf16 GEMM, the binding one the larger (bound); prefill and extend
// against the GEMM.
void add_fractions(nlohmann::json& row, const Ceilings& c) {
  const double gemm = row.value("tflops", 0.0) / c.gemm_tflops;
  if (row.value("op", "") == "decode") {
    const double read = row.value("gbps", 0.0) / c.stream_read_gbps;
    row["read_fraction"] = read;
    row["gemm_fraction"] = gemm;
    row["ceiling_fraction"] = std::max(read, gemm);
    row["bound"] = gemm >= read ? "compute" : "memory";
  } else {
    row["gemm_fraction"] = gemm;
    row["ceiling_fraction"] = gemm;
    row["bound"] = "compute";
  }
  row["ceiling_stream_read_gbps"] = c.stream_read_gbps;
  row["ceiling_gemm_tflops"] = c.gemm_tflops;
}

// The decode shapes; `pages` replaces the grid's page sizes (1 and 64) when not empty.
std::vector<DecodeConfig> decode_grid(bool quick, const std::vector<int>& pages) {
  std::vector<DecodeConfig> g;
  if (quick) {
    for (int page : pages.empty() ? std::vector<int>{64, 1} : pages) {
      g.push_back({128, 1, 128, 8192, page, false});
      g.push_back({128, 1, 16, 8192, page, false});
    }
    g.push_back({128, 1, 32, 8192, 64, false});
    g.push_back({128, 1, 8, 8192, 64, false});  // 8 heads per GPU: DeepSeek-V3 at TP16
    g.push_back({128, 2, 64, 4096, 64, false});
    g.push_back({128, 1, 128, 8192, 64, true});
    return g;
  }
  for (int s_k : {4096, 8192, 16384})
    for (int h_q : {16, 32, 64, 128})
      for (int s_q : {1, 2})
        for (int page : pages.empty() ? std::vector<int>{1, 64} : pages) {
          g.push_back({128, s_q, h_q, s_k, page, false});
        }
  g.push_back({64, 1, 128, 4096, 64, false});
  g.push_back({32, 1, 128, 32768, 64, false});
  g.push_back({256, 1, 128, 2048, 64, false});
  // 8 heads per GPU (DeepSeek-V3 at TP16, Kimi-K2 at TP8): per token no dearer than 16 heads.
  for (int s_k : {4096, 8192, 16384}) g.push_back({128, 1, 8, s_k, 64, false});
  for (int s_k : {4096, 8192, 16384})
    for (int h_q : {16, 32, 64, 128}) g.push_back({128, 1, h_q, s_k, 64, true});
  return g;
}

// Inputs shared by every decode config: one latent cache big enough for the largest batch (one
// per cache dtype).
struct DecodeBench {
  const AbsorbedAttentionOp* op = nullptr;
  DeviceBuffer cache;      // bf16
  DeviceBuffer cache_fp8;  // fp8 e4m3 (values normal/4 as stored; k_scale 1.5 applied)
  int64_t cache_slots = 0;
  cudaStream_t stream = nullptr;
};

// The inputs' seed (lengths, page layout, q) from the shape alone, not the row's place in the
// grid: a shape gets the same inputs in every grid, round, build and cache dtype, so rows of one
// shape compare. (Seeds by position gave a shape other inputs in the quick grid than in the full
// one: varlen rows of two rounds timed other lengths.)
uint64_t shape_seed(const DecodeConfig& c) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the shape's fields
  for (int64_t v : {int64_t{c.b}, int64_t{c.s_q}, int64_t{c.h_q}, int64_t{c.s_k}, int64_t{c.page},
                    int64_t{c.varlen}}) {
    h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
  }
  return h;
}

int64_t slots_needed(const DecodeConfig& c) {
  const int64_t pages = int64_t{c.b} * ((c.s_k + c.page - 1) / c.page) + 4;
  return (pages + 1) * c.page;
}

StatusOr<nlohmann::json> bench_decode(DecodeBench& db, const DecodeConfig& c, int iters,
                                      uint64_t seed, bool batch_invariant) {
  MLA_RETURN_IF_ERROR(db.op->supports(c.h_q, c.page, c.cache_dtype));
  const bool fp8 = c.cache_dtype == DType::kFP8E4M3;
  testing::Rng rng(seed);
  std::vector<int32_t> kv_lens(c.b, c.s_k), q_lens(c.b, c.s_q);
  if (c.varlen) {
    for (int32_t& k : kv_lens) k = static_cast<int32_t>(rng.uniform_int(c.s_k / 2, c.s_k));
  }
  const testing::PagedLayout layout = testing::make_paged_layout(kv_lens, c.page, true, rng);
  if (layout.num_slots > db.cache_slots) {
    return internal_error("decode bench: layout needs {} slots, cache has {}", layout.num_slots,
                          db.cache_slots);
  }
  const int64_t tokens = int64_t{c.b} * c.s_q;
  AttnCapacity cap{c.b, tokens, 0, c.s_q, c.h_q, batch_invariant};
  AbsorbedProblem prob{c.h_q, c.page, true, layout.req_rows, q_lens, kv_lens};
  std::vector<std::byte> plan(db.op->plan_bytes(cap));
  MLA_ASSIGN_OR_RETURN(std::size_t plan_used, db.op->plan(prob, cap, plan));
  const Device dev = Device::cuda();
  const auto alloc = [&](std::size_t bytes, const char* name) {
    return DeviceBuffer::allocate(dev, std::max<std::size_t>(bytes, 256), name, "bench", false);
  };
  constexpr int kSets = 3;  // rotated q / o / lse sets
  MLA_ASSIGN_OR_RETURN(DeviceBuffer plan_d, alloc(plan.size(), "bench.plan"));
  MLA_ASSIGN_OR_RETURN(DeviceBuffer r2t, alloc(layout.req_to_token.size() * 4, "bench.r2t"));
  MLA_ASSIGN_OR_RETURN(DeviceBuffer ws, alloc(db.op->workspace_bytes(cap), "bench.workspace"));
  std::vector<DeviceBuffer> q(kSets), o(kSets), lse(kSets);
  for (int s = 0; s < kSets; ++s) {
    MLA_ASSIGN_OR_RETURN(q[s], alloc(tokens * c.h_q * kLatentDim * 2, "bench.q"));
    MLA_ASSIGN_OR_RETURN(o[s], alloc(tokens * c.h_q * kKvLoraRank * 2, "bench.o"));
    MLA_ASSIGN_OR_RETURN(lse[s], alloc(tokens * c.h_q * 4, "bench.lse"));
    MLA_BENCH_CUDA_RETURN_IF_ERROR(cuda::fill_random_bf16(q[s].data(), tokens * c.h_q * kLatentDim,
                                                          seed + 17 * s + 1, 0.25f, db.stream));
  }
  MLA_BENCH_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(plan_d.data(), plan.data(), plan_used, cudaMemcpyHostToDevice, db.stream));
  MLA_BENCH_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(r2t.data(), layout.req_to_token.data(),
                                                 layout.req_to_token.size() * 4,
                                                 cudaMemcpyHostToDevice, db.stream));
  const auto args_for = [&](int s) {
    AbsorbedArgs a;
    a.q = TensorView(q[s].data(), DType::kBF16, dev, {tokens, c.h_q, kLatentDim});
    a.kv_cache = TensorView(fp8 ? db.cache_fp8.data() : db.cache.data(), c.cache_dtype, dev,
                            {db.cache_slots, kLatentDim});
    a.k_scale = fp8 ? 1.5f : 1.0f;
    a.req_to_token =
        TensorView(r2t.data(), DType::kI32, dev, {layout.num_rows, layout.max_context_len});
    a.o = TensorView(o[s].data(), DType::kBF16, dev, {tokens, c.h_q, kKvLoraRank});
    a.lse = TensorView(lse[s].data(), DType::kF32, dev, {tokens, c.h_q});
    a.sm_scale = kDeepSeekV3SoftmaxScale;
    a.plan = plan_d.data();
    a.workspace = ws.data();
    a.workspace_bytes = ws.bytes();
    return a;
  };
  const ExecContext ctx{dev, db.stream};
  int call = 0;  // rotates the input sets, warm-up included
  MLA_ASSIGN_OR_RETURN(const auto times, time_runs(db.stream, 3, iters, [&] {
                         return db.op->run(args_for(call++ % kSets), ctx);
                       }));
  const double us = times.first;

  double sum_kv = 0;
  for (int32_t k : kv_lens) sum_kv += k;
  const double flops = 2.0 * c.s_q * sum_kv * c.h_q * (kLatentDim + kKvLoraRank);
  const double kv_bytes_per_key = kLatentDim * (fp8 ? 1.0 : 2.0);
  const double bytes =
      sum_kv * kv_bytes_per_key + double(tokens) * c.h_q * (kLatentDim + kKvLoraRank) * 2;
  const double tflops = flops / (us * 1e-6) / 1e12;
  const double gbps = bytes / (us * 1e-6) / 1e9;
  nlohmann::json row = {{"op", "decode"},
                        {"backend", "cuda"},
                        {"b", c.b},
                        {"s_q", c.s_q},
                        {"h_q", c.h_q},
                        {"s_k", c.s_k},
                        {"page_size", c.page},
                        {"varlen", c.varlen},
                        {"batch_invariant", batch_invariant},
                        {"us", us},
                        {"cache_dtype", std::string(dtype_name(c.cache_dtype))},
                        {"kv_bytes_per_key", kv_bytes_per_key},
                        {"tflops", tflops},
                        {"gbps", gbps},
                        {"us_min", times.second},
                        {"iters", iters},
                        {"seed", seed}};
  return row;
}

Status run_decode_benches(const BenchOptions& opt, const BenchSink& sink,
                          const nlohmann::json& base) {
  const OpSet* set = OpRegistry::global().find("cuda");
  if (set == nullptr || !set->absorbed) return unsupported("no cuda absorbed op registered");
  DecodeBench db;
  db.op = set->absorbed.get();
  std::vector<DType> dtypes;
  if (opt.cache_dtype.find("bf16") != std::string::npos) dtypes.push_back(DType::kBF16);
  if (opt.cache_dtype.find("fp8") != std::string::npos) dtypes.push_back(DType::kFP8E4M3);
  if (dtypes.empty()) {
    return invalid_argument("--cache-dtype {}: expected bf16, fp8 or bf16,fp8", opt.cache_dtype);
  }
  std::vector<DecodeConfig> grid;
  for (DecodeConfig c : decode_grid(opt.quick, opt.pages)) {
    for (DType dt : dtypes) {
      c.cache_dtype = dt;
      grid.push_back(c);
    }
  }
  for (const DecodeConfig& c : grid) db.cache_slots = std::max(db.cache_slots, slots_needed(c));
  MLA_BENCH_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&db.stream, cudaStreamNonBlocking));
  for (DType dt : dtypes) {
    if (dt == DType::kBF16) {
      MLA_ASSIGN_OR_RETURN(db.cache,
                           DeviceBuffer::allocate(Device::cuda(), db.cache_slots * kLatentDim * 2,
                                                  "bench.kv_cache", "kv_pool.bench", false));
      MLA_BENCH_CUDA_RETURN_IF_ERROR(cuda::fill_random_bf16(
          db.cache.data(), db.cache_slots * kLatentDim, 20261202, 0.25f, db.stream));
    } else {
      MLA_ASSIGN_OR_RETURN(db.cache_fp8,
                           DeviceBuffer::allocate(Device::cuda(), db.cache_slots * kLatentDim,
                                                  "bench.kv_cache_fp8", "kv_pool.bench", false));
      MLA_BENCH_CUDA_RETURN_IF_ERROR(cuda::fill_random_fp8(
          db.cache_fp8.data(), db.cache_slots * kLatentDim, 20261203, 0.25f, db.stream));
    }
  }
  int failures = 0;
  for (const DecodeConfig& c : grid) {
    auto row = bench_decode(db, c, opt.iters, shape_seed(c), opt.batch_invariant);
    if (!row.ok()) {
      std::fprintf(stderr, "decode b=%d s_q=%d h_q=%d s_k=%d page=%d %s: %s\n", c.b, c.s_q, c.h_q,
                   c.s_k, c.page, std::string(dtype_name(c.cache_dtype)).c_str(),
                   row.status().to_string().c_str());
      ++failures;
      continue;
    }
    nlohmann::json r = base;
    r.update(*row);
    sink(r);
  }
  cudaStreamDestroy(db.stream);
  if (failures) return internal_error("{} decode configurations failed", failures);
  return Status::Ok();
}

#endif  // MLA_WITH_CUDA

// The host's name and cpu model, for the cpu rows' "machine" field.
std::string cpu_machine() {
  std::string model = "unknown cpu";
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " cpus";
}

int run_cpu_bench(const BenchOptions& opt) {
  if (opt.ops.find("extend") != std::string::npos && opt.ops.find("decode") == std::string::npos &&
      opt.ops.find("prefill") == std::string::npos) {
    std::fprintf(stderr, "mla bench --device cpu: --ops extend is timed on cuda only\n");
    return 2;
  }
  Emitter emit(opt);
  if (!emit.file_ok()) {
    std::fprintf(stderr, "mla bench: cannot open --out %s\n", opt.out.c_str());
    return 2;
  }
  // The 1-minute load average when the run starts: the cpu rows are only as good as the
  // machine is idle.
  double load1 = -1.0;
  std::ifstream("/proc/loadavg") >> load1;
  const nlohmann::json base = {
      {"date", utc_date()}, {"commit", commit_id()}, {"machine", cpu_machine()}, {"load1", load1}};
  const auto wants = [&](const char* op) { return opt.ops.find(op) != std::string::npos; };
  const Status st = run_cpu_benches(wants("decode"), wants("prefill"), opt.quick, opt.iters, base,
                                    [&](const nlohmann::json& row) { emit.emit(row); });
  if (!st.ok()) {
    std::fprintf(stderr, "mla bench --device cpu: %s\n", st.to_string().c_str());
    return 1;
  }
  return 0;
}

int run_bench(const BenchOptions& opt) {
  if (opt.device == "cpu") return run_cpu_bench(opt);
  if (opt.device != "cuda") {
    std::fprintf(stderr, "mla bench: --device %s: expected cuda or cpu\n", opt.device.c_str());
    return 2;
  }
#ifndef MLA_WITH_CUDA
  std::fprintf(stderr,
               "mla bench: --device cuda: this build has no CUDA (configure with "
               "-DMLA_CUDA=ON)\n");
  return 2;
#else
  if (!device_available(Device::cuda())) {
    std::fprintf(stderr, "mla bench: no CUDA device available\n");
    return 2;
  }
  Emitter emit(opt);
  if (!emit.file_ok()) {
    std::fprintf(stderr, "mla bench: cannot open --out %s\n", opt.out.c_str());
    return 2;
  }
  const nlohmann::json base = {{"date", utc_date()},
                               {"commit", commit_id()},
                               {"gpu", device_runtime(DeviceType::kCuda)->describe(0)}};
  // The op rows first, then this machine's ceilings (measured after the ops, so their large
  // allocations and GEMMs never precede an op's timing), one row each; every op row gets its
  // fractions of them before it is printed.
  std::vector<nlohmann::json> rows;
  const BenchSink collect = [&](const nlohmann::json& row) { rows.push_back(row); };
  int rc = 0;
  const auto wants = [&](const char* op) { return opt.ops.find(op) != std::string::npos; };
  if (wants("decode")) {
    const Status st = run_decode_benches(opt, collect, base);
    if (!st.ok()) {
      std::fprintf(stderr, "mla bench decode: %s\n", st.to_string().c_str());
      rc = 1;
    }
  }
#ifdef MLA_HAVE_BENCH_PREFILL
  if (wants("prefill") || wants("extend")) {
    const auto sink = [&](const nlohmann::json& row) {
      nlohmann::json r = base;
      r.update(row);
      rows.push_back(r);
    };
    const Status st = run_prefill_benches(wants("prefill"), wants("extend"), opt.quick, sink);
    if (!st.ok()) {
      std::fprintf(stderr, "mla bench prefill/extend: %s\n", st.to_string().c_str());
      rc = 1;
    }
  }
#else
  if (wants("prefill") || wants("extend")) {
    std::fprintf(stderr, "mla bench: prefill/extend benchmarks not built (bench_prefill.h)\n");
  }
#endif
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    std::fprintf(stderr, "mla bench: cannot create a CUDA stream\n");
    return 1;
  }
  const StatusOr<Ceilings> ceilings = measure_ceilings(stream);
  cudaStreamDestroy(stream);
  if (!ceilings.ok()) {
    std::fprintf(stderr, "mla bench: ceilings: %s\n", ceilings.status().to_string().c_str());
    return 1;
  }
  for (const auto& [what, gbps, tflops] :
       {std::tuple{"stream_read", ceilings->stream_read_gbps, 0.0},
        std::tuple{"copy", ceilings->copy_gbps, 0.0},
        std::tuple{"cublas_gemm_bf16_8192", 0.0, ceilings->gemm_tflops}}) {
    nlohmann::json r = base;
    r.update({{"op", "ceiling"}, {"what", what}, {"gbps", gbps}, {"tflops", tflops}});
    emit.emit(r);
  }
  for (nlohmann::json& row : rows) {
    add_fractions(row, *ceilings);
    emit.emit(row);
  }
  return rc;
#endif
}

}  // namespace

CLI::App* add_bench_command(CLI::App& app, CommandRunner* runner) {
  auto opt = std::make_shared<BenchOptions>();
  CLI::App* sub = app.add_subcommand(
      "bench", "Time the ops (cuda: decode grid, prefill, extend; cpu: decode and prefill grids)");
  sub->add_option("--device", opt->device, "Device to time (cuda or cpu)")
      ->capture_default_str()
      ->check(device_name());
  sub->add_flag("--json", opt->json, "Print one JSON object per result instead of the table");
  sub->add_flag("--quick", opt->quick, "A few anchor shapes only");
  sub->add_option("--out", opt->out, "Append the JSON results to this file (JSON lines)");
  sub->add_option("--iters", opt->iters, "Timed runs per shape (median reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  sub->add_option("--ops", opt->ops, "Which ops: decode,prefill,extend")
      ->capture_default_str()
      ->check(words_in({"decode", "prefill", "extend"}));
  sub->add_option("--cache-dtype", opt->cache_dtype,
                  "Decode latent cache dtype(s): bf16, fp8 or bf16,fp8")
      ->capture_default_str()
      ->check(words_in({"bf16", "fp8"}));
  sub->add_flag("--batch-invariant", opt->batch_invariant,
                "Decode: plan batch-invariant splits (BackendOptions::batch_invariant); compare "
                "with a run without it for the option's cost");
  sub->add_option("--pages", opt->pages,
                  "Decode: page sizes of the grid, e.g. 1,16,32,64,128 (default: 1 and 64)")
      ->delimiter(',')
      ->check(CLI::IsMember({1, 16, 32, 64, 128}));
  sub->callback([runner, opt] { *runner = [opt] { return run_bench(*opt); }; });
  return sub;
}

}  // namespace mla::cli
