// Gather + up-projection on the cpu: rows of the latent cache by slot list, dequantised to fp32
// once, then per head an fp32 GEMM against kv_b_proj (converted to fp32 one head at a time).
//   k[n, h] = [c_kv[slot_n] @ W_UK[h]^T | k_pe[slot_n]],  v[n, h] = c_kv[slot_n] @ W_UV[h]^T
#include <cmath>

#include "core/parallel.h"
#include "kernels/cpu/cpu_common.h"
#include "mla/model.h"

namespace mla::cpu {
namespace {

constexpr int kRank = kKvLoraRank;
constexpr int kLatent = kLatentDim;
constexpr int kNope = kQkNopeDim;
constexpr int kDv = kVHeadDim;
constexpr int kDqk = kQkHeadDim;
constexpr int kHeadRows = kNope + kDv;  // rows of kv_b_proj per head
constexpr int kTokenBlock = 16;         // gathered rows reused against one W tile

StatusOr<float*> carve_gathered(Carver& c, int64_t tokens) {
  return c.take<float>("up_project.gathered", static_cast<std::size_t>(tokens) * kLatent);
}
StatusOr<float*> carve_weights(Carver& c) {
  return c.take<float>("up_project.w_head", static_cast<std::size_t>(kHeadRows) * kRank);
}

class CpuUpProjectOp final : public UpProjectOp {
 public:
  std::size_t workspace_bytes(int64_t max_tokens, int /*num_heads*/) const override {
    Carver c("cpu up_project workspace");
    (void)carve_gathered(c, std::max<int64_t>(max_tokens, 0));
    for (int t = 0; t < parallel_num_threads(); ++t) (void)carve_weights(c);
    return c.aligned_bytes();
  }

  Status run(const UpProjectArgs& a, const ExecContext& ctx) const override {
    MLA_CHECK_ARG(ctx.device.is_cpu(), "cpu up_project: exec context is {}",
                  ctx.device.to_string());
    const Device dev = Device::cpu();
    MLA_RETURN_IF_ERROR(expect_tensor(a.slots, "slots", DType::kI32, {-1}, dev));
    const int64_t n = a.slots.shape[0];
    MLA_CHECK_ARG(a.kv_cache.dtype == DType::kBF16 || a.kv_cache.dtype == DType::kFP8E4M3,
                  "kv_cache: dtype {} is neither bf16 nor fp8e4m3", dtype_name(a.kv_cache.dtype));
    MLA_RETURN_IF_ERROR(
        expect_tensor(a.kv_cache, "kv_cache", a.kv_cache.dtype, {-1, kLatent}, dev, false));
    MLA_RETURN_IF_ERROR(
        expect_tensor(a.kv_b_proj, "kv_b_proj", DType::kBF16, {-1, kRank}, dev, false));
    MLA_CHECK_ARG(a.kv_b_proj.shape[0] % kHeadRows == 0 && a.kv_b_proj.shape[0] > 0,
                  "kv_b_proj: {} rows is not a positive multiple of {}", a.kv_b_proj.shape[0],
                  kHeadRows);
    const int hc = static_cast<int>(a.kv_b_proj.shape[0] / kHeadRows);
    MLA_RETURN_IF_ERROR(expect_tensor(a.k, "k", DType::kBF16, {n, hc, kDqk}, dev, false));
    MLA_RETURN_IF_ERROR(expect_tensor(a.v, "v", DType::kBF16, {n, hc, kDv}, dev, false));
    for (const auto* x : {&a.kv_cache, &a.kv_b_proj, &a.k, &a.v}) {
      MLA_RETURN_IF_ERROR(expect_inner_dense(*x, "up_project operand"));
    }
    const bool fp8 = a.kv_cache.dtype == DType::kFP8E4M3;
    if (fp8) {
      MLA_CHECK_ARG(std::isfinite(a.k_scale) && a.k_scale > 0.f,
                    "k_scale = {} must be positive for an fp8 cache", a.k_scale);
    }
    const int32_t* slots = a.slots.ptr<int32_t>();
    const int64_t num_slots = a.kv_cache.shape[0];
    for (int64_t i = 0; i < n; ++i) {
      MLA_CHECK_ARG(slots[i] >= 0 && slots[i] < num_slots,
                    "slots[{}] = {} outside kv_cache slots [0, {})", i, slots[i], num_slots);
    }
    Carver carver("cpu up_project workspace", a.workspace, a.workspace_bytes);
    MLA_ASSIGN_OR_RETURN(float* gathered, carve_gathered(carver, n));  // [n, 576]
    Carver probe = carver;
    for (int i = 0; i < parallel_num_threads(); ++i)
      MLA_RETURN_IF_ERROR(carve_weights(probe).status());

    const std::array<float, 256> lut = fp8_table(a.k_scale);
    // Gather and dequantise; k_pe goes straight to every head's k[:, :, 128:192].
    parallel_for_chunks(0, n, 32, [&](int64_t i0, int64_t i1, int) {
      for (int64_t i = i0; i < i1; ++i) {
        float* row = gathered + i * kLatent;
        cache_row_to_float(a.kv_cache.data, a.kv_cache.dtype, slots[i], a.kv_cache.stride[0],
                           kLatent, lut.data(), row);
        for (int h = 0; h < hc; ++h) {
          uint16_t* kr = a.k.ptr<uint16_t>() + i * a.k.stride[0] + h * a.k.stride[1] + kNope;
          for (int d = 0; d < kLatent - kRank; ++d) kr[d] = float_to_bf16_bits(row[kRank + d]);
        }
      }
    });
    parallel_for_chunks(0, hc, 1, [&](int64_t h0, int64_t h1, int worker) {
      Carver mine = carver;
      float* w = nullptr;  // [256, 512] fp32 copy of this head's W_UK and W_UV
      for (int t = 0; t <= worker; ++t) w = *carve_weights(mine);  // fits: checked above
      for (int64_t h = h0; h < h1; ++h) {
        for (int e = 0; e < kHeadRows; ++e) {
          bf16_row_to_float(
              a.kv_b_proj.ptr<uint16_t>() + (h * kHeadRows + e) * a.kv_b_proj.stride[0], kRank,
              w + static_cast<int64_t>(e) * kRank);
        }
        for (int64_t n0 = 0; n0 < n; n0 += kTokenBlock) {
          const int64_t n1 = std::min(n, n0 + kTokenBlock);
          for (int e = 0; e < kHeadRows; ++e) {
            const float* we = w + static_cast<int64_t>(e) * kRank;
            for (int64_t i = n0; i < n1; ++i) {
              const float y = dot(gathered + i * kLatent, we, kRank);
              uint16_t* dst =
                  e < kNope
                      ? a.k.ptr<uint16_t>() + i * a.k.stride[0] + h * a.k.stride[1] + e
                      : a.v.ptr<uint16_t>() + i * a.v.stride[0] + h * a.v.stride[1] + (e - kNope);
              *dst = float_to_bf16_bits(y);
            }
          }
        }
      }
    });
    return Status::Ok();
  }
};

}  // namespace

std::shared_ptr<const UpProjectOp> make_up_project_op() {
  return std::make_shared<CpuUpProjectOp>();
}

}  // namespace mla::cpu
