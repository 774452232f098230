// UpProjectOp on CUDA: gather latent rows by slot (+ k_pe broadcast into k), then two
// strided-batched cuBLAS GEMMs over the heads writing k_nope straight into k[:, h, 0:128] and
// v[:, h, :] (no [N, H*256] intermediate and no split pass).
#include <cmath>
#include <memory>

#include "kernels/cuda/common.h"
#include "kernels/cuda/head_gemm_cublas.h"
#include "kernels/cuda/mha/view_checks.h"
#include "kernels/cuda/ops_factory.h"
#include "kernels/cuda/up_project_kernel.h"
#include "mla/model.h"

namespace mla::cuda {
namespace {

constexpr std::size_t kAlign = 256;

class CudaUpProjectOp final : public UpProjectOp {
 public:
  std::size_t workspace_bytes(int64_t max_tokens, int) const override {
    const auto bytes = static_cast<std::size_t>(std::max<int64_t>(max_tokens, 0)) * kKvLoraRank * 2;
    return (bytes + kAlign - 1) / kAlign * kAlign;
  }

  Status run(const UpProjectArgs& a, const ExecContext& ctx) const override {
    MLA_CHECK_ARG(ctx.device.is_cuda(), "cuda up_project: context device is {}",
                  ctx.device.to_string());
    const Device dev = ctx.device;
    const int64_t n = a.slots.ndim == 1 ? a.slots.shape[0] : -1;
    const int64_t h = a.k.ndim == 3 ? a.k.shape[1] : -1;
    MLA_RETURN_IF_ERROR(expect_tensor(a.slots, "slots", DType::kI32, {n}, dev));
    const bool fp8 = a.kv_cache.dtype == DType::kFP8E4M3;
    MLA_RETURN_IF_ERROR(expect_tensor(a.kv_cache, "kv_cache", fp8 ? DType::kFP8E4M3 : DType::kBF16,
                                      {-1, kLatentDim}, dev));
    MLA_RETURN_IF_ERROR(expect_tensor(a.kv_b_proj, "kv_b_proj", DType::kBF16,
                                      {h * kKvBProjRowsPerHead, kKvLoraRank}, dev));
    MLA_RETURN_IF_ERROR(expect_strided(a.k, "k", DType::kBF16, {n, h, kQkHeadDim}, dev, 16));
    MLA_RETURN_IF_ERROR(expect_strided(a.v, "v", DType::kBF16, {n, h, kVHeadDim}, dev, 2));
    if (fp8) {
      MLA_CHECK_ARG(std::isfinite(a.k_scale) && a.k_scale > 0.f,
                    "cuda up_project: k_scale = {} must be positive for an fp8 cache", a.k_scale);
    }
    if (n == 0 || h == 0) return Status::Ok();
    const std::size_t need = workspace_bytes(n, static_cast<int>(h));
    MLA_CHECK_CODE(StatusCode::kOutOfWorkspace, a.workspace != nullptr && a.workspace_bytes >= need,
                   "cuda up_project: workspace of {} bytes is below the {} bytes {} rows need",
                   a.workspace_bytes, need, n);

    GatherParams g{};
    g.cache = a.kv_cache.data;
    g.slots = a.slots.ptr<const int32_t>();
    g.c_kv = static_cast<uint16_t*>(a.workspace);
    g.k = a.k.ptr<uint16_t>();
    g.k_row_stride = a.k.stride[0];
    g.k_head_stride = a.k.stride[1];
    g.num_tokens = n;
    g.num_slots = a.kv_cache.shape[0];
    g.num_heads = static_cast<int>(h);
    g.fp8 = fp8;
    g.k_scale = fp8 ? a.k_scale : 1.f;  // a bf16 cache never sees the scale
    const auto stream = static_cast<cudaStream_t>(ctx.stream);
    MLA_CUDA_RETURN_IF_ERROR(launch_gather_latent(g, stream));
    MLA_CUDA_CHECK_LAUNCH("gather_latent_kernel", stream);

    MLA_ASSIGN_OR_RETURN(CublasLease lease, cublas_lease(dev, stream));
    const float alpha = 1.f;
    const float beta = 0.f;
    const auto* w = a.kv_b_proj.ptr<const uint16_t>();
    // Column-major per head: out (128 x N, ld = token stride) = W^T (128 x 512) * c_kv^T
    // (512 x N); W row-major [128, 512] is column-major 512 x 128 -> op T. c_kv is shared by all
    // heads (stride 0).
    static_assert(kQkNopeDim == kVHeadDim, "one GEMM shape serves W_UK and W_UV");
    const auto gemm = [&](const uint16_t* w0, void* out, int64_t ld, int64_t head_stride) {
      return cublasGemmStridedBatchedEx(
          lease.handle(), CUBLAS_OP_T, CUBLAS_OP_N, kQkNopeDim, static_cast<int>(n), kKvLoraRank,
          &alpha, w0, CUDA_R_16BF, kKvLoraRank, kKvBProjRowsPerHead * kKvLoraRank, g.c_kv,
          CUDA_R_16BF, kKvLoraRank, 0, &beta, out, CUDA_R_16BF, static_cast<int>(ld), head_stride,
          static_cast<int>(h), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    MLA_CUBLAS_RETURN_IF_ERROR(gemm(w, a.k.data, a.k.stride[0], a.k.stride[1]));
    MLA_CUBLAS_RETURN_IF_ERROR(
        gemm(w + kQkNopeDim * kKvLoraRank, a.v.data, a.v.stride[0], a.v.stride[1]));
    MLA_CUDA_CHECK_LAUNCH("cublasGemmStridedBatchedEx(up_project)", stream);
    return Status::Ok();
  }
};

}  // namespace

std::shared_ptr<const UpProjectOp> make_cuda_up_project_op() {
  return std::make_shared<CudaUpProjectOp>();
}

}  // namespace mla::cuda
