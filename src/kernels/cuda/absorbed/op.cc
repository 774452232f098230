#include "kernels/cuda/absorbed/op.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/absorbed/choose.h"
#include "kernels/cuda/absorbed/launcher.h"
#include "kernels/cuda/absorbed/params.h"
#include "kernels/cuda/absorbed/plan.h"
#include "kernels/cuda/absorbed/traits.h"
#include "kernels/cuda/common.h"
#include "kernels/cuda/sm90/tensor_map.h"
#include "mla/kv_pool.h"
#include "mla/model.h"

namespace mla::cuda {
namespace {

// Without a device (host-only planning tests) plans are made for an H200's 132 SMs.
constexpr int kDefaultCtas = 132;
// L2 promotion of the TMA key loads (256-byte fills).
constexpr int kTmaL2PromotionBytes = 256;

int grid_ctas() {
  const int n = sm_count(current_device());
  return n > 0 ? n : kDefaultCtas;
}

class CudaAbsorbedOp final : public AbsorbedAttentionOp {
 public:
  Status supports(int num_heads, int page_size, DType cache_dtype) const override {
    return absorbed::choose_kernel(num_heads, 1, page_size, cache_dtype).status();
  }

  std::size_t plan_bytes(const AttnCapacity& cap) const override {
    return absorbed::plan_layout(cap, grid_ctas()).bytes;
  }

  std::size_t workspace_bytes(const AttnCapacity& cap) const override {
    return absorbed::partial_workspace_bytes(cap, grid_ctas());
  }

  StatusOr<std::size_t> plan(const AbsorbedProblem& problem, const AttnCapacity& cap,
                             std::span<std::byte> host_plan) const override {
    return absorbed::build_plan(problem, cap, grid_ctas(), host_plan);  // chooses once
  }

  Status run(const AbsorbedArgs& a, const ExecContext& ctx) const override {
    MLA_CHECK_ARG(ctx.device.is_cuda(), "cuda absorbed: exec device is {}", ctx.device.to_string());
    const Device dev = ctx.device;
    const bool fp8 = a.kv_cache.dtype == DType::kFP8E4M3;
    if (fp8) {  // the scale applies to fp8 only; a bf16 cache ignores it (SYSTEM.md 7)
      MLA_CHECK_ARG(std::isfinite(a.k_scale) && a.k_scale > 0.f,
                    "k_scale = {} must be positive for an fp8 cache", a.k_scale);
    }
    MLA_CHECK_ARG(a.q.ndim == 3, "q: expected [T, H, {}], got {}", kLatentDim, a.q.describe());
    const int64_t tokens = a.q.shape[0], heads = a.q.shape[1];
    MLA_RETURN_IF_ERROR(expect_tensor(a.q, "q", DType::kBF16, {tokens, heads, kLatentDim}, dev));
    MLA_CHECK_ARG(heads >= 1 && heads <= absorbed::kMaxHeads,
                  "q: num_heads = {} (supported: 1 to {})", heads, absorbed::kMaxHeads);
    // The kernel entry depends on the cache dtype alone (tests/unit/cuda_absorbed_choose_test.cc),
    // so a captured graph replays the same kernel after any re-plan; the tile rows and the key
    // load path are the plan's (build_plan wrote the chooser's into its header). No choice here.
    MLA_CHECK_CODE(StatusCode::kUnsupported,
                   a.kv_cache.dtype == DType::kBF16 || a.kv_cache.dtype == DType::kFP8E4M3,
                   "cuda absorbed: {} latent cache (supported: bf16, fp8e4m3)",
                   dtype_name(a.kv_cache.dtype));
    MLA_RETURN_IF_ERROR(
        expect_tensor(a.kv_cache, "kv_cache", a.kv_cache.dtype, {-1, kLatentDim}, dev));
    MLA_ASSIGN_OR_RETURN(const PageTable table, absorbed_page_table(a, dev));
    MLA_RETURN_IF_ERROR(expect_tensor(a.o, "o", DType::kBF16, {tokens, heads, kKvLoraRank}, dev));
    MLA_RETURN_IF_ERROR(expect_tensor(a.lse, "lse", DType::kF32, {tokens, heads}, dev));
    MLA_CHECK_ARG(a.plan != nullptr, "plan: null (upload plan() output first)");
    const int ctas = grid_ctas();
    const std::size_t need = absorbed::partial_workspace_bytes(ctas);
    if (a.workspace_bytes < need || a.workspace == nullptr) {
      return make_status(StatusCode::kOutOfWorkspace,
                         "cuda absorbed: workspace of {} bytes, needs {}", a.workspace_bytes, need);
    }
    absorbed::AbsorbedParams p{};
    p.q = a.q.ptr<const uint16_t>();
    p.kv_cache = fp8 ? nullptr : a.kv_cache.ptr<const uint16_t>();
    p.kv_cache_fp8 = fp8 ? a.kv_cache.ptr<const unsigned char>() : nullptr;
    p.req_to_token = table.data;
    p.req_to_token_stride = table.row_stride;
    p.page_table_blocks = table.block ? 1 : 0;
    MLA_CHECK_ARG(a.kv_cache.shape[0] <= int64_t{INT32_MAX},
                  "kv_cache: {} slots; slot ids are int32 (at most {})", a.kv_cache.shape[0],
                  INT32_MAX);
    p.num_slots = static_cast<uint32_t>(a.kv_cache.shape[0]);
    p.o = a.o.ptr<uint16_t>();
    p.lse = a.lse.ptr<float>();
    // Partial slots: the grid's (as planned without batch invariance), or as many as the
    // workspace holds when it is larger (a batch-invariant plan's workspace_bytes(cap) is sized
    // for its capacity's slots). Either way the partial lse follows every slot the plan uses.
    const std::size_t n_partials = static_cast<std::size_t>(
        std::max(absorbed::max_partials(ctas), absorbed::partials_in_workspace(a.workspace_bytes)));
    p.partial_o = static_cast<float*>(a.workspace);
    const std::size_t o_bytes = n_partials * absorbed::kMaxRows * absorbed::kDimV * sizeof(float);
    p.partial_lse = reinterpret_cast<float*>(static_cast<unsigned char*>(a.workspace) +
                                             (o_bytes + 255) / 256 * 256);
    p.plan = static_cast<const unsigned char*>(a.plan);
    // fp8: the kernel's bf16 tiles hold the cache's values times 2^-120 (ptx.cuh,
    // fp8x8_to_bf16x8_scaled), so the logits' scale carries 2^120 back.
    p.scale_log2 = fp8 ? a.sm_scale * 1.4426950408889634f * a.k_scale * 0x1p120f
                       : a.sm_scale * 1.4426950408889634f;
    MLA_CHECK_ARG(!fp8 || std::isfinite(p.scale_log2),
                  "sm_scale * k_scale = {} is too large for an fp8 cache on cuda (at most 177: "
                  "the kernel's logit scale sm_scale * k_scale * log2(e) * 2^120 is a float)",
                  a.sm_scale * a.k_scale);
    p.o_scale = fp8 ? a.k_scale : 1.f;
    p.kernel = static_cast<int32_t>(absorbed::kernel_for_cache(a.kv_cache.dtype));
    p.num_heads = static_cast<int32_t>(heads);
    {  // used when the plan says TMA (choose_kernel: pages of 64 and more)
      // bf16: boxes of 64 key rows x 64 columns in the 128-byte swizzle (the wgmma layout);
      // fp8: 64 rows x 64 bytes, unswizzled (converted to bf16 in shared memory by the kernel).
      sm90::TensorMap2d t;
      t.base = a.kv_cache.data;
      t.elem_bytes = fp8 ? 1 : 2;
      t.rows = a.kv_cache.shape[0];
      t.cols = kLatentDim;
      t.row_stride_elems = a.kv_cache.stride[0];
      t.box_rows = absorbed::kTmaBoxRows;
      t.box_cols = 64;
      t.swizzle128 = !fp8;
      t.l2_promotion_bytes = kTmaL2PromotionBytes;
      p.kv_tmap_valid = sm90::cached_tensor_map_2d(t, p.kv_tmap) ? 1 : 0;
    }
    const auto stream = static_cast<cudaStream_t>(ctx.stream);
    const absorbed::LaunchResult r = absorbed::launch_absorbed(p, ctas, stream);
    if (r.error != cudaSuccess) return cuda_status(r.error, r.what, __FILE__, __LINE__);
    return check_launch("absorbed attention + combine", stream, __FILE__, __LINE__);
  }
};

}  // namespace

std::shared_ptr<const AbsorbedAttentionOp> make_cuda_absorbed_op() {
  return std::make_shared<CudaAbsorbedOp>();
}

}  // namespace mla::cuda
