// MhaAttentionOp on CUDA: host planning (plan.cc) + the Hopper wgmma kernel (sm90_kernel.cuh).
// (It replaced a FlashAttention-2 style mma.sync kernel, now removed; docs/CHANGELOG.md.)

#include <cmath>
#include <memory>

#include "kernels/cuda/common.h"
#include "kernels/cuda/mha/launcher.h"
#include "kernels/cuda/mha/params.h"
#include "kernels/cuda/mha/plan.h"
#include "kernels/cuda/mha/traits.h"
#include "kernels/cuda/mha/view_checks.h"
#include "kernels/cuda/ops_factory.h"
#include "kernels/cuda/sm90/tensor_map.h"
#include "mla/model.h"

namespace mla::cuda {
namespace {

// A [tokens, heads, dim] bf16 view as the 3-D tensor map {dim, head, token} the kernel reads in
// boxes of 64 columns x 1 head x 128 tokens (128-byte swizzle).
bool encode_tmap(const TensorView& t, int dim, unsigned char* out) {
  sm90::TensorMap3d m;
  m.base = t.data;
  m.elem_bytes = 2;
  m.dims[0] = dim;
  m.dims[1] = t.shape[1];
  m.dims[2] = t.shape[0];
  // A single head's stride is never used: any legal value.
  m.stride1 = t.shape[1] > 1 ? t.stride[1] : dim;
  m.stride2 = t.shape[0] > 1 ? t.stride[0] : m.stride1 * t.shape[1];
  m.box[0] = 64;
  m.box[1] = 1;
  m.box[2] = mha::MhaTraits::kBlockN;
  return sm90::encode_tensor_map_3d(m, out);
}

class CudaMhaOp final : public MhaAttentionOp {
 public:
  Status supports(int num_heads) const override {
    if (num_heads < 1) return unsupported("cuda mha: num_heads = {} must be positive", num_heads);
    return Status::Ok();
  }
  std::size_t plan_bytes(const AttnCapacity& cap) const override { return mha::plan_bytes(cap); }
  std::size_t workspace_bytes(const AttnCapacity&) const override { return 0; }
  StatusOr<std::size_t> plan(const MhaProblem& problem, const AttnCapacity& cap,
                             std::span<std::byte> host_plan) const override {
    return mha::build_plan(problem, cap, host_plan);
  }

  Status run(const MhaArgs& a, const ExecContext& ctx) const override {
    MLA_CHECK_ARG(ctx.device.is_cuda(), "cuda mha: context device is {}", ctx.device.to_string());
    const Device dev = ctx.device;
    const int64_t tq = a.q.ndim == 3 ? a.q.shape[0] : -1;
    const int64_t h = a.q.ndim == 3 ? a.q.shape[1] : -1;
    const int64_t tk = a.k.ndim == 3 ? a.k.shape[0] : -1;
    MLA_RETURN_IF_ERROR(expect_strided(a.q, "q", DType::kBF16, {tq, h, kQkHeadDim}, dev, 16));
    MLA_RETURN_IF_ERROR(expect_strided(a.k, "k", DType::kBF16, {tk, h, kQkHeadDim}, dev, 16));
    MLA_RETURN_IF_ERROR(expect_strided(a.v, "v", DType::kBF16, {tk, h, kVHeadDim}, dev, 16));
    MLA_RETURN_IF_ERROR(expect_strided(a.o, "o", DType::kBF16, {tq, h, kVHeadDim}, dev, 4));
    if (!a.lse.empty()) {
      MLA_RETURN_IF_ERROR(expect_tensor(a.lse, "lse", DType::kF32, {tq, h}, dev, false));
      MLA_CHECK_ARG(a.lse.stride[1] == 1, "lse: heads must be contiguous, got {}",
                    a.lse.describe());
    }
    MLA_CHECK_ARG(!a.merge_into_output || !a.lse.empty(),
                  "cuda mha: merge_into_output needs lse (the state merged into), lse is empty");
    MLA_CHECK_ARG(a.plan != nullptr, "cuda mha: plan is null (upload plan() output first)");
    MLA_CHECK_ARG(std::isfinite(a.sm_scale) && a.sm_scale > 0.f, "cuda mha: sm_scale = {}",
                  a.sm_scale);
    if (tq == 0 || h == 0) return Status::Ok();

    mha::MhaParams p{};
    p.q = a.q.ptr<const uint16_t>();
    p.k = a.k.ptr<const uint16_t>();
    p.v = a.v.ptr<const uint16_t>();
    p.o = a.o.ptr<uint16_t>();
    p.lse = a.lse.empty() ? nullptr : a.lse.ptr<float>();
    p.plan = a.plan;
    p.q_row_stride = a.q.stride[0];
    p.q_head_stride = a.q.stride[1];
    p.k_row_stride = a.k.stride[0];
    p.k_head_stride = a.k.stride[1];
    p.v_row_stride = a.v.stride[0];
    p.v_head_stride = a.v.stride[1];
    p.o_row_stride = a.o.stride[0];
    p.o_head_stride = a.o.stride[1];
    p.lse_row_stride = a.lse.empty() ? 0 : a.lse.stride[0];
    p.num_heads = static_cast<int>(h);
    p.scale_log2 = a.sm_scale * 1.4426950408889634f;
    p.merge_into_output = a.merge_into_output ? 1 : 0;
    MLA_CHECK_CODE(StatusCode::kCudaError, encode_tmap(a.q, kQkHeadDim, p.q_tmap),
                   "cuda mha: the driver rejected a TMA tensor map of q ({})", a.q.describe());
    if (tk > 0) {
      MLA_CHECK_CODE(StatusCode::kCudaError, encode_tmap(a.k, kQkHeadDim, p.k_tmap),
                     "cuda mha: the driver rejected a TMA tensor map of k ({})", a.k.describe());
      MLA_CHECK_CODE(StatusCode::kCudaError, encode_tmap(a.v, kVHeadDim, p.v_tmap),
                     "cuda mha: the driver rejected a TMA tensor map of v ({})", a.v.describe());
    }
    const int grid = sm_count(dev.index);
    MLA_CHECK_CODE(StatusCode::kCudaError, grid > 0, "cuda mha: no multiprocessors on {}",
                   dev.to_string());
    const auto stream = static_cast<cudaStream_t>(ctx.stream);
    MLA_CUDA_RETURN_IF_ERROR(mha::launch_mha_forward(p, grid, stream));
    MLA_CUDA_CHECK_LAUNCH("mha_fwd_kernel", stream);
    return Status::Ok();
  }
};

}  // namespace

std::shared_ptr<const MhaAttentionOp> make_cuda_mha_op() { return std::make_shared<CudaMhaOp>(); }

}  // namespace mla::cuda
