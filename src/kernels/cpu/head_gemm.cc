// Per-head GEMM on the cpu (the absorbed projections), fp32 accumulation, no scratch memory:
// work items are (head, block of 8 tokens); weight tiles are converted to fp32 on the stack and
// reused by every token of the block.
//   transpose_w = false: y[t, h, :] = x[t, h, :] @ W_h  (W_h [K, N])
//   transpose_w = true:  y[t, h, :] = x[t, h, :] @ W_h^T (W_h [N, K])
#include "core/parallel.h"
#include "kernels/cpu/cpu_common.h"

namespace mla::cpu {
namespace {

constexpr int kTokenBlock = 8;
constexpr int kColChunk = 256;  // output columns accumulated at once
constexpr int kKChunk = 256;    // reduction slice converted at once (transpose_w)

class CpuHeadGemmOp final : public HeadGemmOp {
 public:
  Status run(const HeadGemmArgs& a, const ExecContext& ctx) const override {
    MLA_CHECK_ARG(ctx.device.is_cpu(), "cpu head_gemm: exec context is {}", ctx.device.to_string());
    const Device dev = Device::cpu();
    MLA_RETURN_IF_ERROR(expect_tensor(a.x, "x", DType::kBF16, {-1, -1, -1}, dev, false));
    const int64_t t = a.x.shape[0], hc = a.x.shape[1], kk = a.x.shape[2];
    MLA_RETURN_IF_ERROR(expect_tensor(a.y, "y", DType::kBF16, {t, hc, -1}, dev, false));
    const int64_t nn = a.y.shape[2];
    MLA_RETURN_IF_ERROR(expect_inner_dense(a.x, "x"));
    MLA_RETURN_IF_ERROR(expect_inner_dense(a.y, "y"));
    MLA_CHECK_ARG(a.w.dtype == DType::kBF16 && a.w.device == dev && a.w.data != nullptr,
                  "w: expected bf16 weights on cpu, got {}", a.w.describe());
    const int64_t rows = a.transpose_w ? nn : kk, cols = a.transpose_w ? kk : nn;
    MLA_CHECK_ARG(a.w_row_stride >= cols, "w_row_stride = {} is below the {} columns of W_h",
                  a.w_row_stride, cols);
    MLA_CHECK_ARG(hc <= 1 || a.w_head_stride > 0, "w_head_stride = {} must be positive",
                  a.w_head_stride);
    if (t == 0 || hc == 0 || nn == 0) return Status::Ok();
    const int64_t last = (hc - 1) * a.w_head_stride + (rows - 1) * a.w_row_stride + cols;
    MLA_CHECK_ARG(a.w.numel() >= last,
                  "w: view has {} elements, heads {} x strides ({}, {}) reach {}", a.w.numel(), hc,
                  a.w_head_stride, a.w_row_stride, last);
    const int64_t blocks = (t + kTokenBlock - 1) / kTokenBlock;
    parallel_for(0, hc * blocks, [&](int64_t item) {
      const int64_t h = item / blocks;
      const int64_t t0 = (item % blocks) * kTokenBlock;
      const int nt = static_cast<int>(std::min<int64_t>(kTokenBlock, t - t0));
      const uint16_t* wh = a.w.ptr<uint16_t>() + h * a.w_head_stride;
      auto x_row = [&](int j) {
        return a.x.ptr<uint16_t>() + (t0 + j) * a.x.stride[0] + h * a.x.stride[1];
      };
      auto y_row = [&](int j) {
        return a.y.ptr<uint16_t>() + (t0 + j) * a.y.stride[0] + h * a.y.stride[1];
      };
      float acc[kTokenBlock][kColChunk];
      float wtile[kKChunk];
      float xs[kTokenBlock][kKChunk];
      for (int64_t n0 = 0; n0 < nn; n0 += kColChunk) {
        const int nc = static_cast<int>(std::min<int64_t>(kColChunk, nn - n0));
        for (int j = 0; j < nt; ++j) std::fill(acc[j], acc[j] + nc, 0.f);
        if (!a.transpose_w) {
          for (int64_t i = 0; i < kk; ++i) {  // acc[j, :] += x[j, i] * W[i, n0:n0+nc]
            bf16_row_to_float(wh + i * a.w_row_stride + n0, nc, wtile);
            for (int j = 0; j < nt; ++j) axpy(bf16_to_float(x_row(j)[i]), wtile, acc[j], nc);
          }
        } else {
          for (int64_t k0 = 0; k0 < kk; k0 += kKChunk) {  // acc[j, c] += x[j, k] . W[c, k]
            const int kc = static_cast<int>(std::min<int64_t>(kKChunk, kk - k0));
            for (int j = 0; j < nt; ++j) bf16_row_to_float(x_row(j) + k0, kc, xs[j]);
            for (int c = 0; c < nc; ++c) {
              bf16_row_to_float(wh + (n0 + c) * a.w_row_stride + k0, kc, wtile);
              for (int j = 0; j < nt; ++j) acc[j][c] += dot(xs[j], wtile, kc);
            }
          }
        }
        for (int j = 0; j < nt; ++j) {
          uint16_t* y = y_row(j) + n0;
          for (int c = 0; c < nc; ++c) y[c] = float_to_bf16_bits(acc[j][c]);
        }
      }
    });
    return Status::Ok();
  }
};

}  // namespace

std::shared_ptr<const HeadGemmOp> make_head_gemm_op() { return std::make_shared<CpuHeadGemmOp>(); }

}  // namespace mla::cpu
