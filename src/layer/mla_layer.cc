#include <random>
#include <vector>

#include "mla/layer.h"
#include "mla/memory.h"

namespace mla {
namespace {

constexpr int64_t kNope = kQkNopeDim;
constexpr int64_t kRope = kQkRopeDim;
constexpr int64_t kRank = kKvLoraRank;
constexpr int64_t kLatent = kLatentDim;
constexpr int64_t kQkDim = kQkHeadDim;
constexpr int64_t kVDim = kVHeadDim;
constexpr int64_t kHeadRows = kKvBProjRowsPerHead;  // rows of W_UK[h] and W_UV[h] in kv_b_proj

StatusOr<const OpSet*> find_ops(Device device, std::string_view op_set) {
  const OpSet* ops = op_set.empty() ? OpRegistry::global().default_for(device.type)
                                    : OpRegistry::global().find(op_set);
  if (ops == nullptr) {
    return unsupported("mla layer: no op set '{}' for {}", op_set.empty() ? "<default>" : op_set,
                       device.to_string());
  }
  if (const Status st = check_op_set_device(*ops, device); !st.ok()) {
    return Status(st.code(), fmt::format("mla layer: {}", st.message()));
  }
  return ops;
}

Status check_dims(const ModelDims& d) {
  MLA_RETURN_IF_ERROR(d.validate());
  MLA_CHECK_ARG(d.kv_lora_rank == kRank && d.qk_rope_dim == kRope && d.qk_nope_dim == kNope &&
                    d.v_head_dim == kVDim,
                "mla layer: dims ({}, {}, {}, {}) are not the MLA shapes ({}, {}, {}, {})",
                d.kv_lora_rank, d.qk_rope_dim, d.qk_nope_dim, d.v_head_dim, kRank, kRope, kNope,
                kVDim);
  return Status::Ok();
}

// A strided [T, H, n] window starting at column `col` of a contiguous [T, H, width] buffer.
TensorView columns(void* base, Device dev, int64_t T, int64_t H, int64_t width, int64_t col,
                   int64_t n) {
  TensorView v(static_cast<uint16_t*>(base) + col, DType::kBF16, dev, {T, H, n});
  v.stride = {H * width, width, 1, 0};
  return v;
}

}  // namespace

MlaLayer::MlaLayer(const ModelDims& dims, int layer_index, Device device, const OpSet* ops)
    : dims_(dims),
      layer_index_(layer_index),
      device_(device),
      ops_(ops),
      scratch_(fmt::format("mla_layer{}.scratch", layer_index), "activations", device) {}

StatusOr<std::unique_ptr<MlaLayer>> MlaLayer::create(const ModelDims& dims, int layer_index,
                                                     const TensorView& kv_b_proj, Device device,
                                                     std::string_view op_set) {
  MLA_RETURN_IF_ERROR(check_dims(dims));
  MLA_CHECK_ARG(layer_index >= 0, "mla layer: layer_index = {} is negative", layer_index);
  MLA_RETURN_IF_ERROR(expect_tensor(kv_b_proj, "kv_b_proj", DType::kBF16,
                                    {dims.num_heads * kHeadRows, kRank}, device));
  MLA_ASSIGN_OR_RETURN(const OpSet* ops, find_ops(device, op_set));
  std::unique_ptr<MlaLayer> layer(new MlaLayer(dims, layer_index, device, ops));
  layer->kv_b_proj_ = kv_b_proj;
  return layer;
}

StatusOr<std::unique_ptr<MlaLayer>> MlaLayer::create_random(const ModelDims& dims, int layer_index,
                                                            Device device, uint64_t seed,
                                                            float stddev, std::string_view op_set) {
  MLA_RETURN_IF_ERROR(check_dims(dims));
  const int64_t rows = dims.num_heads * kHeadRows;
  std::vector<bf16> host(static_cast<std::size_t>(rows * kRank));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, stddev);
  for (auto& w : host) w = bf16::from_float(normal(rng));
  MLA_ASSIGN_OR_RETURN(
      DeviceBuffer buf,
      DeviceBuffer::allocate(device, host.size() * sizeof(bf16),
                             fmt::format("mla_layer{}.kv_b_proj", layer_index), "weights", false));
  DeviceRuntime* rt = device_runtime(device.type);
  MLA_RETURN_IF_ERROR(rt->copy_to_device(buf.data(), host.data(), buf.bytes(), nullptr));
  MLA_RETURN_IF_ERROR(rt->synchronize(nullptr));
  const TensorView view(buf.data(), DType::kBF16, device, {rows, kRank});
  MLA_ASSIGN_OR_RETURN(auto layer, create(dims, layer_index, view, device, op_set));
  layer->owned_weights_ = std::move(buf);
  return layer;
}

Status MlaLayer::forward(AttentionBackend& backend, const TensorView& q_nope,
                         const TensorView& q_pe, const TensorView& c_kv, const TensorView& k_pe,
                         const TensorView& o, const ExecContext& ctx, const TensorView& lse) {
  const int64_t H = dims_.num_heads;
  MLA_CHECK_ARG(backend.options().model.num_heads == H,
                "mla layer: backend plans for {} heads, the layer has {}",
                backend.options().model.num_heads, H);
  const int64_t T = q_nope.ndim == 3 ? q_nope.shape[0] : -1;
  MLA_RETURN_IF_ERROR(expect_tensor(q_nope, "q_nope", DType::kBF16, {T, H, kNope}, device_));
  MLA_RETURN_IF_ERROR(expect_tensor(q_pe, "q_pe", DType::kBF16, {T, H, kRope}, device_));
  MLA_RETURN_IF_ERROR(expect_tensor(c_kv, "c_kv", DType::kBF16, {T, kRank}, device_, false));
  MLA_RETURN_IF_ERROR(expect_tensor(k_pe, "k_pe", DType::kBF16, {T, kRope}, device_, false));
  MLA_RETURN_IF_ERROR(expect_tensor(o, "o", DType::kBF16, {T, H, kVDim}, device_));
  const TensorView planned = backend.out_cache_loc();
  MLA_CHECK_ARG(planned.numel() == T,
                "mla layer: the backend planned a batch of {} tokens, the inputs have {}",
                planned.numel(), T);
  if (backend.forward_method() == ForwardMethod::kAbsorbed) {
    return forward_absorbed(backend, q_nope, q_pe, c_kv, k_pe, o, lse, ctx);
  }
  return forward_mha(backend, q_nope, q_pe, c_kv, k_pe, o, lse, ctx);
}

// q_abs = q_nope @ W_UK into q[:, :, :512], q_pe into q[:, :, 512:]; attention -> o_latent;
// o = o_latent @ W_UV^T.
Status MlaLayer::forward_absorbed(AttentionBackend& backend, const TensorView& q_nope,
                                  const TensorView& q_pe, const TensorView& c_kv,
                                  const TensorView& k_pe, const TensorView& o,
                                  const TensorView& lse, const ExecContext& ctx) {
  if (!ops_->head_gemm) return unsupported("mla layer: op set '{}' has no head_gemm", ops_->name);
  const int64_t T = q_nope.shape[0], H = dims_.num_heads;
  const std::size_t q_bytes = static_cast<std::size_t>(T * H * kLatent) * 2;
  const std::size_t o_lat_bytes = static_cast<std::size_t>(T * H * kRank) * 2;
  void* q_buf = nullptr;  // bf16 [T, H, 576]
  void* o_lat = nullptr;  // bf16 [T, H, 512]
  MLA_RETURN_IF_ERROR(carve_buffer(scratch_, [&](WorkspaceCarver& c) {
    q_buf = c.carve("q_absorbed", q_bytes);
    o_lat = c.carve("o_latent", o_lat_bytes);
  }));

  HeadGemmArgs up;
  up.x = q_nope;
  up.w = kv_b_proj_;
  up.w_head_stride = kHeadRows * kRank;
  up.w_row_stride = kRank;
  up.transpose_w = false;  // W_UK[h] is [128, 512]: q_abs = q_nope @ W_UK[h]
  up.y = columns(q_buf, device_, T, H, kLatent, 0, kRank);
  if (T > 0) MLA_RETURN_IF_ERROR(ops_->head_gemm->run(up, ctx));
  DeviceRuntime* rt = device_runtime(device_.type);
  if (T > 0) {
    MLA_RETURN_IF_ERROR(rt->copy_device_2d(static_cast<uint16_t*>(q_buf) + kRank, kLatent * 2,
                                           q_pe.data, kRope * 2, kRope * 2,
                                           static_cast<std::size_t>(T * H), ctx.stream));
  }
  AttentionInputs in;
  in.layer = layer_index_;
  in.c_kv = c_kv;
  in.k_pe = k_pe;
  in.save_kv_cache = true;
  in.q_absorbed = TensorView(q_buf, DType::kBF16, device_, {T, H, kLatent});
  AttentionOutputs out;
  out.o_latent = TensorView(o_lat, DType::kBF16, device_, {T, H, kRank});
  out.lse = lse;
  // forward_extend runs the absorbed form for every mode (and follows a chunked_mla fallback).
  MLA_RETURN_IF_ERROR(backend.forward_extend(in, out, ctx));

  HeadGemmArgs down;
  down.x = out.o_latent;
  down.w = TensorView(static_cast<uint16_t*>(kv_b_proj_.data) + kNope * kRank, DType::kBF16,
                      device_, {(H - 1) * kHeadRows * kRank + kVDim * kRank});
  down.w_head_stride = kHeadRows * kRank;
  down.w_row_stride = kRank;
  down.transpose_w = true;  // W_UV[h] is [128, 512]: o = o_latent @ W_UV[h]^T
  down.y = o;
  if (T == 0) return Status::Ok();
  return ops_->head_gemm->run(down, ctx);
}

// q = [q_nope | q_pe]; the backend writes the cache, up-projects the latent rows its passes read
// (the new tokens' and the prefix's: it owns the up-projection) and runs attention -> o.
Status MlaLayer::forward_mha(AttentionBackend& backend, const TensorView& q_nope,
                             const TensorView& q_pe, const TensorView& c_kv, const TensorView& k_pe,
                             const TensorView& o, const TensorView& lse, const ExecContext& ctx) {
  const int64_t T = q_nope.shape[0], H = dims_.num_heads;
  const std::size_t qk_bytes = static_cast<std::size_t>(T * H * kQkDim) * 2;
  void* q_buf = nullptr;  // bf16 [T, H, 192]
  MLA_RETURN_IF_ERROR(
      carve_buffer(scratch_, [&](WorkspaceCarver& c) { q_buf = c.carve("q", qk_bytes); }));

  DeviceRuntime* rt = device_runtime(device_.type);
  if (T > 0) {
    const std::size_t rows = static_cast<std::size_t>(T * H);
    MLA_RETURN_IF_ERROR(
        rt->copy_device_2d(q_buf, kQkDim * 2, q_nope.data, kNope * 2, kNope * 2, rows, ctx.stream));
    MLA_RETURN_IF_ERROR(rt->copy_device_2d(static_cast<uint16_t*>(q_buf) + kNope, kQkDim * 2,
                                           q_pe.data, kRope * 2, kRope * 2, rows, ctx.stream));
  }
  AttentionInputs in;
  in.layer = layer_index_;
  in.c_kv = c_kv;
  in.k_pe = k_pe;
  in.save_kv_cache = true;
  in.q = TensorView(q_buf, DType::kBF16, device_, {T, H, kQkDim});
  in.kv_b_proj = kv_b_proj_;  // no k, v: the backend up-projects the rows it writes
  AttentionOutputs out;
  out.o = o;
  out.lse = lse;
  return backend.forward_extend(in, out, ctx);
}

}  // namespace mla
