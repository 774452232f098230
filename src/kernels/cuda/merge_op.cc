// MergeOp on CUDA (SYSTEM.md 1): in-place LSE merge of two partial attention states.
#include <memory>

#include "kernels/cuda/common.h"
#include "kernels/cuda/merge_kernel.h"
#include "kernels/cuda/mha/view_checks.h"
#include "kernels/cuda/ops_factory.h"

namespace mla::cuda {
namespace {

class CudaMergeOp final : public MergeOp {
 public:
  Status run(const MergeArgs& a, const ExecContext& ctx) const override {
    MLA_CHECK_ARG(ctx.device.is_cuda(), "cuda merge: context device is {}", ctx.device.to_string());
    const Device dev = ctx.device;
    const int64_t t = a.o_acc.ndim == 3 ? a.o_acc.shape[0] : -1;
    const int64_t h = a.o_acc.ndim == 3 ? a.o_acc.shape[1] : -1;
    const int64_t d = a.o_acc.ndim == 3 ? a.o_acc.shape[2] : -1;
    MLA_RETURN_IF_ERROR(expect_strided(a.o_acc, "o_acc", DType::kBF16, {t, h, d}, dev, 16));
    MLA_RETURN_IF_ERROR(expect_strided(a.o_b, "o_b", DType::kBF16, {t, h, d}, dev, 16));
    MLA_RETURN_IF_ERROR(expect_strided(a.lse_acc, "lse_acc", DType::kF32, {t, h}, dev, 4));
    MLA_RETURN_IF_ERROR(expect_strided(a.lse_b, "lse_b", DType::kF32, {t, h}, dev, 4));
    MLA_CHECK_ARG(d > 0 && d % 8 == 0 && (d >= 256 || 256 % d == 0),
                  "cuda merge: head dim D = {} must be a multiple of 8 that divides 256 or is at "
                  "least 256 (a group of lanes per row)",
                  d);
    if (t == 0 || h == 0) return Status::Ok();
    MergeParams p{};
    p.o_acc = a.o_acc.ptr<uint16_t>();
    p.lse_acc = a.lse_acc.ptr<float>();
    p.o_b = a.o_b.ptr<const uint16_t>();
    p.lse_b = a.lse_b.ptr<const float>();
    p.num_tokens = t;
    p.num_heads = static_cast<int>(h);
    p.head_dim = static_cast<int>(d);
    p.oa_row_stride = a.o_acc.stride[0];
    p.oa_head_stride = a.o_acc.stride[1];
    p.ob_row_stride = a.o_b.stride[0];
    p.ob_head_stride = a.o_b.stride[1];
    p.la_row_stride = a.lse_acc.stride[0];
    p.lb_row_stride = a.lse_b.stride[0];
    const auto stream = static_cast<cudaStream_t>(ctx.stream);
    MLA_CUDA_RETURN_IF_ERROR(launch_merge(p, stream));
    MLA_CUDA_CHECK_LAUNCH("merge_kernel", stream);
    return Status::Ok();
  }
};

}  // namespace

std::shared_ptr<const MergeOp> make_cuda_merge_op() { return std::make_shared<CudaMergeOp>(); }

}  // namespace mla::cuda
