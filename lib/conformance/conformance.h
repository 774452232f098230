// The conformance suite: named, seeded cases for every op, and one runner that executes a case
// on any device through an OpSet and compares with the double-precision reference.
// Device-agnostic: uses only mla public headers and DeviceRuntime. Shared by tests/conformance,
// tests/gpu and `mla check`.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "mla/ops.h"
#include "mla/status.h"
#include "mla/types.h"

namespace mla::testing {

enum class OpKind : uint8_t { kAbsorbed, kMha, kMerge, kKvWrite, kUpProject, kHeadGemm };
std::string_view op_kind_name(OpKind op);  // "absorbed", "mha", "merge", ...

enum class ConformanceScope : uint8_t {
  kQuick,  // a few seconds on 2 cpu cores: `mla check`, CI, ASan
  kFull,   // every mode x page size x head count x edge case (about a minute on 2 cores)
  kSlow,   // kFull plus heavy cases (long contexts, 128 heads x long q_len)
};

// One case. Fields irrelevant to `op` keep their defaults.
struct ConformanceCase {
  std::string name;  // "absorbed/decode/h16/p64/bs4/bf16/seed20261202" (base seed last)
  OpKind op = OpKind::kAbsorbed;
  std::string mode;   // decode, verify, draft, extend, extend_prefix, mixed, chunk, edge, ...
  uint64_t seed = 0;  // derived from the base seed and the name
  int num_heads = 16;
  float sm_scale = 0.135234f;

  // Attention ops (absorbed, mha): per request. kv_len counts every key the request attends to
  // (prefix + new tokens); causal masks are bottom-right aligned.
  std::vector<int32_t> q_lens;
  std::vector<int32_t> kv_lens;
  bool causal = true;

  // Paged cache (absorbed, kv_write, up_project).
  int page_size = 1;
  bool shuffle_pages = true;  // random page order (and random slots for page_size 1)
  bool block_table = false;   // absorbed: the page table as a block table of page ids
  DType cache_dtype = DType::kBF16;
  float k_scale = 1.0f;  // applied only to fp8 caches; set != 1 on bf16 to prove that

  // kv_write / up_project: number of rows written / gathered; merge / head_gemm: tokens.
  int64_t num_tokens = 0;
  int64_t src_row_stride = 0;  // kv_write: c_kv row stride (> 512 for a strided view); 0 = 512

  // merge: head dim D of o (512 or 128).
  int merge_dim = 128;
  // mha: o / lse start as a random state (empty rows included) that the op merges its result
  // into (MhaArgs::merge_into_output); the reference is the merge of that state and attention.
  bool merge_into_output = false;

  // head_gemm: y[t,h] = x[t,h] @ W_h (or W_h^T). The canonical shapes are q_abs
  // (K 128, N 512, transpose false, y written into the first 512 columns of a [T,H,576] buffer)
  // and o (K 512, N 128, transpose true).
  int gemm_k = 128;
  int gemm_n = 512;
  bool transpose_w = false;
  int64_t x_row_stride = 0;  // elements between consecutive heads of x; 0 = gemm_k
  int64_t y_row_stride = 0;  // elements between consecutive heads of y; 0 = gemm_n

  // Capacity handed to plan()/workspace_bytes() is the problem's own size times this factor
  // (>= 1), so plans into a larger graph-sized buffer are covered too.
  int capacity_factor = 1;
};

// GoogleTest prints a parameterised case by this (its name and seed), not as a byte dump.
void PrintTo(const ConformanceCase& c, std::ostream* os);

// Base seed: MLA_TEST_SEED from the environment if set (decimal), else 20261202.
uint64_t base_seed();

// The cases of a scope, names unique, seeds derived from base_seed().
std::vector<ConformanceCase> conformance_cases(ConformanceScope scope);

struct RunOptions {
  // Run the op a second time on the same inputs (outputs poisoned again) and require bitwise
  // identical outputs; result in CaseResult::deterministic.
  bool check_determinism = false;
  // Skip the reference comparison (e.g. a determinism-only or timing use).
  bool compare = true;
};

struct CaseResult {
  std::string name;
  bool passed = false;
  bool skipped = false;
  std::string skip_reason;       // the op's supports() message, or "op not in this set"
  double max_rel_err = 0.0;      // worst global ||out - ref|| / ||ref|| over the case's outputs
  double max_abs_err = 0.0;      // worst per-element |out - ref|
  double lse_max_abs_err = 0.0;  // worst |lse - ref| over finite entries
  bool deterministic = true;     // only meaningful with RunOptions::check_determinism
  std::string message;           // failure description: case, seed, worst index and values
};

// Allocates the case's inputs on `device` (DeviceBuffer), uploads them, poisons the outputs
// (bf16 0xFFFF, f32 0xFFFFFFFF) and guard bytes around them, plans on the host, uploads the plan,
// runs, copies back, checks that every output element was written and no guard byte changed,
// and compares with the reference. A kUnsupported from supports() gives skipped = true with the
// reason. Never throws; infrastructure errors are reported as failures.
CaseResult run_conformance_case(const OpSet& ops, const ConformanceCase& c, Device device,
                                const RunOptions& options = {});

// Convenience for determinism checks: runs the case twice, true when outputs are bitwise equal.
// Errors (including unsupported) come back as a Status.
StatusOr<bool> run_twice_bitwise_equal(const OpSet& ops, const ConformanceCase& c, Device device);

// One-line summary: "PASS absorbed/decode/... rel 1.2e-3 lse 4e-4" / "SKIP ... (reason)" / "FAIL".
std::string describe_result(const CaseResult& r);

}  // namespace mla::testing
