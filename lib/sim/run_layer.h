// The layers `mla run` drives: one mla::MlaLayer (include/mla/layer.h) per layer index over
// shared random weights, fed random bf16 activations (q_nope, q_pe, c_kv, k_pe) cut from one
// noise buffer at random offsets, plus the double-precision reference of a layer's output for
// --check (absorbed form over the cache: o = softmax(q_abs . [c_kv | k_pe]) c_kv @ W_UV^T with
// q_abs = [q_nope @ W_UK | q_pe], equal to the MHA form). Device buffers: ledger owner "sim".
//
// The keys of that reference do not come from the cache the backend wrote: SimLayer keeps its
// own model of every KV slot (which noise rows the simulation fed for the token it wrote there,
// per layer), so the reference uses what each request should hold, and the cache read back is
// compared with that model slot by slot - a write to a wrong slot is a check failure.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "mla/backend.h"
#include "mla/layer.h"
#include "mla/memory.h"
#include "mla/ops.h"

namespace mla::cli {

class SimLayer {
 public:
  // max_tokens: the most tokens (graph padding included) one batch can have; num_layers: layer
  // indices 0 .. num_layers - 1 of the pool.
  // num_slots: the pool's slot count (the KV model's size).
  static StatusOr<std::unique_ptr<SimLayer>> create(const ModelDims& model, Device device,
                                                    int num_layers, int64_t num_slots,
                                                    int64_t max_tokens, uint64_t seed);

  // The stream the layers run on and the check reads back on (nullptr: the legacy default).
  void set_stream(void* stream) { ctx_.stream = stream; }

  // Runs layer `layer` on `batch` (last planned on `backend`) with `num_tokens` rows (the
  // padded count under graph replay) and records in the KV model what its real tokens wrote.
  Status forward(AttentionBackend& backend, const ForwardBatch& batch, int layer,
                 int64_t num_tokens);

  // Writes only the KV cache of `layer` for `batch` (last planned on `backend`; `num_tokens` rows
  // as in forward) and records it in the KV model, without the attention: a caller that runs the
  // layers on some steps only (the soak under ASan) keeps every slot a later check reads written.
  Status write_kv(AttentionBackend& backend, const ForwardBatch& batch, int layer,
                  int64_t num_tokens);

  struct CheckResult {
    double max_rel_err = 0.0;  // worst per-row ||o - ref|| / ||ref|| over the checked rows
    int worst_entry = -1;      // batch entry and row (within the entry) of the worst row
    int worst_row = -1;
    int entries_checked = 0;  // every entry of the batch gets at least its last row checked
    int64_t rows = 0;         // token rows of the batch
    int64_t rows_checked = 0;
    int heads_checked = 0;  // of num_heads (fewer when the reference budget is short)
    int64_t kv_slots_checked = 0;
    int64_t kv_mismatches = 0;  // slots whose cache content differs from the KV model
    std::string kv_error;       // the first mismatch, described
  };
  // Checks the last forward of `layer` on `batch` against the double-precision reference.
  // Rows: each entry's last row (it sees the most keys), then first rows, then random rows, while
  // the reference costs at most `budget` multiply-adds; when even the last rows exceed it, the
  // heads are sampled evenly instead (never a whole step skipped). The KV cache of every slot
  // each entry attends to is compared with the KV model.
  StatusOr<CheckResult> check(const AttentionBackend& backend, const ForwardBatch& batch, int layer,
                              double budget);

 private:
  SimLayer(const ModelDims& model, Device device, int64_t max_tokens);
  struct SlotSource {   // where the simulation took a slot's content from (noise offsets)
    int64_t c_kv = -1;  // -1: never written
    int64_t k_pe = -1;
  };
  TensorView noise_view(int64_t offset, std::initializer_list<int64_t> shape) const;
  int64_t pick_offset();
  Status check_forward_args(const ForwardBatch& batch, int layer, int64_t num_tokens) const;
  // Records in the KV model what the batch's real tokens wrote from these noise offsets.
  Status record_kv(const ForwardBatch& batch, int layer, int64_t off_ckv, int64_t off_kpe);

  ModelDims model_;
  Device device_;
  ExecContext ctx_;
  int64_t max_tokens_;
  int64_t noise_elems_ = 0;
  std::vector<bf16> noise_host_;   // [noise_elems_] the source of every activation
  std::vector<bf16> weight_host_;  // kv_b_proj [H * 256, 512]
  DeviceBuffer noise_, kv_b_proj_, o_;
  std::vector<std::unique_ptr<MlaLayer>> layers_;
  std::mt19937_64 rng_;
  // What the last forward used: offsets into the noise (elements) of q_nope [T, H, 128] and
  // q_pe [T, H, 64].
  int64_t last_tokens_ = 0;
  int64_t off_q_ = 0, off_qpe_ = 0;
  std::vector<std::vector<SlotSource>> kv_model_;  // [layer][slot]
};

}  // namespace mla::cli
