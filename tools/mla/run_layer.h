// The layers `mla run` drives: one mla::MlaLayer (include/mla/layer.h) per layer index over
// shared random weights, fed random bf16 activations (q_nope, q_pe, c_kv, k_pe) cut from one
// noise buffer at random offsets, plus the double-precision reference of a layer's output for
// --check (absorbed form over the cache: o = softmax(q_abs . [c_kv | k_pe]) c_kv @ W_UV^T with
// q_abs = [q_nope @ W_UK | q_pe], equal to the MHA form). Device buffers: ledger owner "sim".
#pragma once

#include <cstdint>
#include <memory>
#include <random>
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
  static StatusOr<std::unique_ptr<SimLayer>> create(const ModelDims& model, Device device,
                                                    int num_layers, int64_t max_tokens,
                                                    uint64_t seed);

  // Runs layer `layer` on the batch last planned on `backend` with `num_tokens` rows (the
  // padded count under graph replay).
  Status forward(AttentionBackend& backend, int layer, int64_t num_tokens);

  // Relative error ||o - ref|| / ||ref|| of the last forward's output over the batch's real
  // tokens, against the reference recomputed from the inputs and the cache of `layer`.
  StatusOr<double> check(const AttentionBackend& backend, const ForwardBatch& batch, int layer);

  // Reference cost of checking a batch, in multiply-adds (to pick affordable steps).
  static double check_cost(const ForwardBatch& batch, int num_heads);

 private:
  SimLayer(const ModelDims& model, Device device, int64_t max_tokens);
  TensorView noise_view(int64_t offset, std::initializer_list<int64_t> shape) const;
  int64_t pick_offset();

  ModelDims model_;
  Device device_;
  ExecContext ctx_;
  int64_t max_tokens_;
  int64_t noise_elems_ = 0;
  std::vector<bf16> noise_host_;    // [noise_elems_] the source of every activation
  std::vector<bf16> weight_host_;   // kv_b_proj [H * 256, 512]
  DeviceBuffer noise_, kv_b_proj_, o_;
  std::vector<std::unique_ptr<MlaLayer>> layers_;
  std::mt19937_64 rng_;
  // What the last forward used: offsets into the noise (elements) of q_nope [T, H, 128] and
  // q_pe [T, H, 64].
  int64_t last_tokens_ = 0;
  int64_t off_q_ = 0, off_qpe_ = 0;
};

}  // namespace mla::cli
