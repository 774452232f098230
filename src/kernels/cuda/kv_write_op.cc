// KvWriteOp on CUDA: kv_cache[out_cache_loc[t]] = [c_kv[t] | k_pe[t]] (fp8: value / k_scale).
#include <cmath>
#include <memory>

#include "kernels/cuda/common.h"
#include "kernels/cuda/kv_write_kernel.h"
#include "kernels/cuda/mha/view_checks.h"
#include "kernels/cuda/ops_factory.h"
#include "mla/model.h"

namespace mla::cuda {
namespace {

class CudaKvWriteOp final : public KvWriteOp {
 public:
  Status run(const KvWriteArgs& a, const ExecContext& ctx) const override {
    MLA_CHECK_ARG(ctx.device.is_cuda(), "cuda kv_write: context device is {}",
                  ctx.device.to_string());
    const Device dev = ctx.device;
    const int64_t t = a.out_cache_loc.ndim == 1 ? a.out_cache_loc.shape[0] : -1;
    MLA_RETURN_IF_ERROR(expect_tensor(a.out_cache_loc, "out_cache_loc", DType::kI32, {t}, dev));
    MLA_RETURN_IF_ERROR(expect_strided(a.c_kv, "c_kv", DType::kBF16, {t, kKvLoraRank}, dev, 16));
    MLA_RETURN_IF_ERROR(expect_strided(a.k_pe, "k_pe", DType::kBF16, {t, kQkRopeDim}, dev, 16));
    const bool fp8 = a.kv_cache.dtype == DType::kFP8E4M3;
    MLA_RETURN_IF_ERROR(expect_tensor(a.kv_cache, "kv_cache", fp8 ? DType::kFP8E4M3 : DType::kBF16,
                                      {-1, kLatentDim}, dev));
    if (fp8) {
      MLA_CHECK_ARG(std::isfinite(a.k_scale) && a.k_scale > 0.f,
                    "cuda kv_write: k_scale = {} must be positive for an fp8 cache", a.k_scale);
    }
    if (t == 0) return Status::Ok();
    KvWriteParams p{};
    p.c_kv = a.c_kv.ptr<const uint16_t>();
    p.k_pe = a.k_pe.ptr<const uint16_t>();
    p.loc = a.out_cache_loc.ptr<const int32_t>();
    p.cache = a.kv_cache.data;
    p.c_kv_row_stride = a.c_kv.stride[0];
    p.k_pe_row_stride = a.k_pe.stride[0];
    p.num_tokens = t;
    p.num_slots = a.kv_cache.shape[0];
    p.fp8 = fp8;
    p.k_scale = fp8 ? a.k_scale : 1.f;  // a bf16 cache never sees the scale
    const auto stream = static_cast<cudaStream_t>(ctx.stream);
    MLA_CUDA_RETURN_IF_ERROR(launch_kv_write(p, stream));
    MLA_CUDA_CHECK_LAUNCH("kv_write_kernel", stream);
    return Status::Ok();
  }
};

}  // namespace

std::shared_ptr<const KvWriteOp> make_cuda_kv_write_op() {
  return std::make_shared<CudaKvWriteOp>();
}

}  // namespace mla::cuda
