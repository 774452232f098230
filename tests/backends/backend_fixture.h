// Helpers for the backend tests: a pool with random cached prefixes, batches built through the
// pool's allocator, random layer inputs and a double-precision reference of one MLA layer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "conformance/case_gen.h"
#include "conformance/conformance.h"
#include "mla/backend.h"
#include "mla/kv_pool.h"
#include "mla/layer.h"
#include "mla/workspace.h"

namespace mla::testing {

// Options for small cpu tests: 16 heads, small workspaces (the cpu ops need far less than the
// GPU defaults).
BackendOptions small_options(int num_heads = 16);

struct PoolSetup {
  int page_size = 16;
  int max_requests = 8;
  int max_context_len = 512;
  int64_t num_pages = 0;  // 0 = enough for max_requests full contexts
  DType dtype = DType::kBF16;
};
std::unique_ptr<LatentKvPool> make_pool(const PoolSetup& setup);

// A batch over the pool: every request gets a fresh row whose first prefix_lens[b] tokens hold
// random latent rows (written straight into the cpu cache), and slots for the new tokens.
struct BatchSpec {
  ForwardMode mode = ForwardMode::kExtend;
  std::vector<int32_t>
      prefix_lens;  // cached tokens per request (decode/verify: seq_len - 1 / seq_len)
  std::vector<int32_t> new_lens;  // extend lengths (decode: 1; verify: num_draft_tokens)
  int num_draft_tokens = 0;
};
ForwardBatch make_batch(LatentKvPool& pool, const BatchSpec& spec, Rng& rng);

// One batch of every mode: decode, verify, draft-extend, extend without and with prefixes (a
// zero-length prefix among them), mixed (the backend tests' common set).
std::vector<BatchSpec> every_mode_specs();
// Frees the batch's request rows (so the pool can be reused).
void free_batch(LatentKvPool& pool, const ForwardBatch& batch);

// Inputs of one layer call, bf16 on the cpu.
struct LayerInputs {
  int64_t tokens = 0;
  int heads = 0;
  std::vector<bf16> q_nope;  // [T, H, 128]
  std::vector<bf16> q_pe;    // [T, H, 64]
  std::vector<bf16> c_kv;    // [T, 512]
  std::vector<bf16> k_pe;    // [T, 64]
  TensorView q_nope_view(), q_pe_view(), c_kv_view(), k_pe_view();
};
LayerInputs random_layer_inputs(int64_t tokens, int heads, Rng& rng);

// Double reference of one layer for a batch whose cache holds the prefixes (the new tokens'
// rows come from `in`): o [T, H, 128], lse [T, H]. Cache values are dequantised like the ops
// (k_scale only for fp8).
struct LayerReference {
  std::vector<double> o;
  std::vector<double> lse;
};
LayerReference reference_layer(const LatentKvPool& pool, int layer, const ForwardBatch& batch,
                               const LayerInputs& in, const TensorView& kv_b_proj, double scale);

// Runs plan_batch + layer forward; returns o as float [T, H, 128] (and lse when asked).
struct LayerRun {
  Status status;
  std::vector<float> o;
  std::vector<float> lse;
};
LayerRun run_layer(AttentionBackend& backend, MlaLayer& layer, const ForwardBatch& batch,
                   LayerInputs& in, bool plan = true);

// ||a - b|| / ||b||.
double rel_error(const std::vector<float>& a, const std::vector<double>& b);
double rel_error(const std::vector<float>& a, const std::vector<float>& b);

// Bytes the ledger holds for a name on the cpu (0 when absent) and how many such records.
std::size_t ledger_bytes(std::string_view name);
int ledger_count_prefix(std::string_view prefix);

}  // namespace mla::testing
