// HeadGemmOp on CUDA: one cublasGemmStridedBatchedEx over the heads, bf16 in/out, fp32 compute.
// Row-major y_h [T, N] is column-major y_h^T [N, T] with ld = y's token stride, so
//   (x_h W_h)^T = W_h^T x_h^T: A = W_h seen column-major, B = x_h^T (ld = x's token stride).
#include <memory>

#include "kernels/cuda/common.h"
#include "kernels/cuda/head_gemm_cublas.h"
#include "kernels/cuda/mha/view_checks.h"
#include "kernels/cuda/ops_factory.h"

namespace mla::cuda {
namespace {

class CudaHeadGemmOp final : public HeadGemmOp {
 public:
  Status run(const HeadGemmArgs& a, const ExecContext& ctx) const override {
    MLA_CHECK_ARG(ctx.device.is_cuda(), "cuda head_gemm: context device is {}",
                  ctx.device.to_string());
    const Device dev = ctx.device;
    const int64_t t = a.x.ndim == 3 ? a.x.shape[0] : -1;
    const int64_t h = a.x.ndim == 3 ? a.x.shape[1] : -1;
    const int64_t k = a.x.ndim == 3 ? a.x.shape[2] : -1;
    const int64_t n = a.y.ndim == 3 ? a.y.shape[2] : -1;
    MLA_RETURN_IF_ERROR(expect_strided(a.x, "x", DType::kBF16, {t, h, k}, dev, 2));
    MLA_RETURN_IF_ERROR(expect_strided(a.y, "y", DType::kBF16, {t, h, n}, dev, 2));
    MLA_CHECK_ARG(a.w.dtype == DType::kBF16 && a.w.device == dev && a.w.data != nullptr,
                  "w: expected non-null bf16 on {}, got {}", dev.to_string(), a.w.describe());
    // W_h is [K, N] (rows of N) or, transposed, [N, K] (rows of K).
    const int64_t w_rows = a.transpose_w ? n : k;
    const int64_t w_cols = a.transpose_w ? k : n;
    MLA_CHECK_ARG(a.w_row_stride >= w_cols && a.w_head_stride >= 0,
                  "head_gemm: w_row_stride = {} (needs >= {}) and w_head_stride = {}",
                  a.w_row_stride, w_cols, a.w_head_stride);
    if (a.w.numel() > 0 && h > 0 && w_rows > 0) {
      const int64_t last = (h - 1) * a.w_head_stride + (w_rows - 1) * a.w_row_stride + w_cols;
      MLA_CHECK_ARG(last <= a.w.numel(),
                    "head_gemm: weights reach element {} but w has {} ({} heads, head stride {}, "
                    "row stride {})",
                    last, a.w.numel(), h, a.w_head_stride, a.w_row_stride);
    }
    if (t == 0 || h == 0 || n == 0) return Status::Ok();
    MLA_CHECK_ARG(k > 0, "head_gemm: K = {} must be positive", k);

    const auto stream = static_cast<cudaStream_t>(ctx.stream);
    MLA_ASSIGN_OR_RETURN(CublasLease lease, cublas_lease(dev, stream));
    const float alpha = 1.f;
    const float beta = 0.f;
    // Column-major: C (N x T) = op(A) (N x K) * B (K x T).
    // transpose_w = false: W_h row-major [K, N] is column-major N x K  -> op N.
    // transpose_w = true:  W_h row-major [N, K] is column-major K x N  -> op T.
    MLA_CUBLAS_RETURN_IF_ERROR(cublasGemmStridedBatchedEx(
        lease.handle(), a.transpose_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(n),
        static_cast<int>(t), static_cast<int>(k), &alpha, a.w.data, CUDA_R_16BF,
        static_cast<int>(a.w_row_stride), a.w_head_stride, a.x.data, CUDA_R_16BF,
        static_cast<int>(a.x.stride[0]), a.x.stride[1], &beta, a.y.data, CUDA_R_16BF,
        static_cast<int>(a.y.stride[0]), a.y.stride[1], static_cast<int>(h), CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT));
    MLA_CUDA_CHECK_LAUNCH("cublasGemmStridedBatchedEx(head_gemm)", stream);
    return Status::Ok();
  }
};

}  // namespace

std::shared_ptr<const HeadGemmOp> make_cuda_head_gemm_op() {
  return std::make_shared<CudaHeadGemmOp>();
}

}  // namespace mla::cuda
