// Merge of two partial attention states on the cpu, in place into (o_acc, lse_acc).
#include <cmath>
#include <limits>

#include "core/parallel.h"
#include "kernels/cpu/cpu_common.h"

namespace mla::cpu {
namespace {

class CpuMergeOp final : public MergeOp {
 public:
  Status run(const MergeArgs& a, const ExecContext& ctx) const override {
    MLA_CHECK_ARG(ctx.device.is_cpu(), "cpu merge: exec context is {}", ctx.device.to_string());
    const Device dev = Device::cpu();
    MLA_RETURN_IF_ERROR(expect_tensor(a.o_acc, "o_acc", DType::kBF16, {-1, -1, -1}, dev, false));
    const int64_t t = a.o_acc.shape[0], hc = a.o_acc.shape[1], dim = a.o_acc.shape[2];
    MLA_RETURN_IF_ERROR(expect_tensor(a.o_b, "o_b", DType::kBF16, {t, hc, dim}, dev, false));
    MLA_RETURN_IF_ERROR(expect_tensor(a.lse_acc, "lse_acc", DType::kF32, {t, hc}, dev, false));
    MLA_RETURN_IF_ERROR(expect_tensor(a.lse_b, "lse_b", DType::kF32, {t, hc}, dev, false));
    for (const auto* x : {&a.o_acc, &a.o_b, &a.lse_acc, &a.lse_b}) {
      MLA_RETURN_IF_ERROR(expect_inner_dense(*x, "merge operand"));
    }
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    parallel_for_chunks(0, t * hc, 64, [&](int64_t r0, int64_t r1, int) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t ti = r / hc, hi = r % hc;
        float* la_p = a.lse_acc.ptr<float>() + ti * a.lse_acc.stride[0] + hi * a.lse_acc.stride[1];
        const float lb = a.lse_b.ptr<float>()[ti * a.lse_b.stride[0] + hi * a.lse_b.stride[1]];
        uint16_t* oa = a.o_acc.ptr<uint16_t>() + ti * a.o_acc.stride[0] + hi * a.o_acc.stride[1];
        const uint16_t* ob = a.o_b.ptr<uint16_t>() + ti * a.o_b.stride[0] + hi * a.o_b.stride[1];
        const MergeWeights w = merge_weights(*la_p, lb);
        if (w.empty) {  // neither part saw a key
          std::fill(oa, oa + dim, uint16_t{0});
          *la_p = kNegInf;
          continue;
        }
        for (int64_t d = 0; d < dim; ++d) {
          oa[d] = float_to_bf16_bits(w.ca * bf16_to_float(oa[d]) + w.cb * bf16_to_float(ob[d]));
        }
        *la_p = w.lse;
      }
    });
    return Status::Ok();
  }
};

}  // namespace

std::shared_ptr<const MergeOp> make_merge_op() { return std::make_shared<CpuMergeOp>(); }

}  // namespace mla::cpu
