// One MLA attention layer on top of a backend (SYSTEM.md 1): holds kv_b_proj and its absorbed
// views W_UK / W_UV, writes the latent cache, and runs the form the backend chose for the batch.
//   absorbed: q_abs = q_nope @ W_UK into q [T, H, 576] = [q_abs | q_pe]; backend -> o_latent
//             [T, H, 512]; o = o_latent @ W_UV^T.
//   MHA:      q [T, H, 192] = [q_nope | q_pe]; backend -> o [T, H, 128] (the backend writes the
//             cache and up-projects every latent row it reads, the new tokens' included).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "mla/backend.h"
#include "mla/model.h"
#include "mla/ops.h"
#include "mla/status.h"
#include "mla/tensor.h"
#include "mla/workspace.h"

namespace mla {

class MlaLayer {
 public:
  // kv_b_proj: bf16 [H * 256, 512] on `device`, owned by the caller and outliving the layer.
  // Rows h*256 .. h*256+127 are W_UK[h] [128, 512], the next 128 rows W_UV[h] [128, 512].
  static StatusOr<std::unique_ptr<MlaLayer>> create(const ModelDims& dims, int layer_index,
                                                    const TensorView& kv_b_proj, Device device,
                                                    std::string_view op_set = {});
  // The same with weights drawn from normal(0, stddev) (rounded to bf16), owned by the layer and
  // recorded in the ledger as "mla_layer<i>.kv_b_proj".
  static StatusOr<std::unique_ptr<MlaLayer>> create_random(const ModelDims& dims, int layer_index,
                                                           Device device, uint64_t seed,
                                                           float stddev = 0.05f,
                                                           std::string_view op_set = {});

  // One layer's attention for the batch the backend planned last.
  //   q_nope bf16 [T, H, 128], q_pe bf16 [T, H, 64], c_kv bf16 [T, 512], k_pe bf16 [T, 64]
  //   o bf16 [T, H, 128] (out); lse f32 [T, H] (optional out)
  Status forward(AttentionBackend& backend, const TensorView& q_nope, const TensorView& q_pe,
                 const TensorView& c_kv, const TensorView& k_pe, const TensorView& o,
                 const ExecContext& ctx, const TensorView& lse = {});

  const TensorView& kv_b_proj() const { return kv_b_proj_; }
  const ModelDims& dims() const { return dims_; }
  int layer_index() const { return layer_index_; }
  // Layer scratch (q, o_latent), grown on demand, owner "activations".
  const GrowableBuffer& scratch() const { return scratch_; }

 private:
  MlaLayer(const ModelDims& dims, int layer_index, Device device, const OpSet* ops);
  Status forward_absorbed(AttentionBackend& backend, const TensorView& q_nope,
                          const TensorView& q_pe, const TensorView& c_kv, const TensorView& k_pe,
                          const TensorView& o, const TensorView& lse, const ExecContext& ctx);
  Status forward_mha(AttentionBackend& backend, const TensorView& q_nope, const TensorView& q_pe,
                     const TensorView& c_kv, const TensorView& k_pe, const TensorView& o,
                     const TensorView& lse, const ExecContext& ctx);

  ModelDims dims_;
  int layer_index_ = 0;
  Device device_;
  const OpSet* ops_ = nullptr;
  TensorView kv_b_proj_;
  DeviceBuffer owned_weights_;
  GrowableBuffer scratch_;
};

}  // namespace mla
