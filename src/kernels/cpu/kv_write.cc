// Latent KV write on the cpu: kv_cache[out_cache_loc[t]] = [c_kv[t] | k_pe[t]]; an fp8 cache
// stores value / k_scale (a bf16 cache ignores k_scale).
#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/cpu_common.h"
#include "mla/model.h"

namespace mla::cpu {
namespace {

constexpr int kRank = kKvLoraRank;
constexpr int kRope = kQkRopeDim;
constexpr int kLatent = kLatentDim;

class CpuKvWriteOp final : public KvWriteOp {
 public:
  Status run(const KvWriteArgs& a, const ExecContext& ctx) const override {
    MLA_CHECK_ARG(ctx.device.is_cpu(), "cpu kv_write: exec context is {}", ctx.device.to_string());
    const Device dev = Device::cpu();
    MLA_RETURN_IF_ERROR(expect_tensor(a.out_cache_loc, "out_cache_loc", DType::kI32, {-1}, dev));
    const int64_t t = a.out_cache_loc.shape[0];
    MLA_RETURN_IF_ERROR(expect_tensor(a.c_kv, "c_kv", DType::kBF16, {t, kRank}, dev, false));
    MLA_RETURN_IF_ERROR(expect_tensor(a.k_pe, "k_pe", DType::kBF16, {t, kRope}, dev, false));
    MLA_CHECK_ARG(a.kv_cache.dtype == DType::kBF16 || a.kv_cache.dtype == DType::kFP8E4M3,
                  "kv_cache: dtype {} is neither bf16 nor fp8e4m3", dtype_name(a.kv_cache.dtype));
    MLA_RETURN_IF_ERROR(
        expect_tensor(a.kv_cache, "kv_cache", a.kv_cache.dtype, {-1, kLatent}, dev, false));
    for (const auto* x : {&a.c_kv, &a.k_pe, &a.kv_cache}) {
      MLA_RETURN_IF_ERROR(expect_inner_dense(*x, "kv_write operand"));
    }
    const bool fp8 = a.kv_cache.dtype == DType::kFP8E4M3;
    if (fp8) {
      MLA_CHECK_ARG(std::isfinite(a.k_scale) && a.k_scale > 0.f,
                    "k_scale = {} must be positive for an fp8 cache", a.k_scale);
    }
    const int32_t* loc = a.out_cache_loc.ptr<int32_t>();
    const int64_t num_slots = a.kv_cache.shape[0];
    for (int64_t i = 0; i < t; ++i) {  // validate everything before writing anything
      MLA_CHECK_ARG(loc[i] >= 0 && loc[i] < num_slots,
                    "out_cache_loc[{}] = {} outside kv_cache slots [0, {})", i, loc[i], num_slots);
    }
    const float scale = a.k_scale;
    parallel_for_chunks(0, t, 32, [&](int64_t t0, int64_t t1, int) {
      for (int64_t i = t0; i < t1; ++i) {
        const uint16_t* ck = a.c_kv.ptr<uint16_t>() + i * a.c_kv.stride[0];
        const uint16_t* kp = a.k_pe.ptr<uint16_t>() + i * a.k_pe.stride[0];
        const int64_t row = static_cast<int64_t>(loc[i]) * a.kv_cache.stride[0];
        if (fp8) {
          uint8_t* dst = a.kv_cache.ptr<uint8_t>() + row;
          for (int d = 0; d < kRank; ++d)
            dst[d] = fp8_e4m3::from_float(bf16_to_float(ck[d]) / scale).bits;
          for (int d = 0; d < kRope; ++d) {
            dst[kRank + d] = fp8_e4m3::from_float(bf16_to_float(kp[d]) / scale).bits;
          }
        } else {
          uint16_t* dst = a.kv_cache.ptr<uint16_t>() + row;
          std::copy(ck, ck + kRank, dst);
          std::copy(kp, kp + kRope, dst + kRank);
        }
      }
    });
    return Status::Ok();
  }
};

}  // namespace

std::shared_ptr<const KvWriteOp> make_kv_write_op() { return std::make_shared<CpuKvWriteOp>(); }

}  // namespace mla::cpu
