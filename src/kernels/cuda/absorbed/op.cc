#include "kernels/cuda/absorbed/op.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <string_view>

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

// The sm90 kernel for 64-row tiles of a bf16 cache: version 3 (default), MLA_ABSORBED_WGMMA=v2
// version 2, =0 the mma.sync kernel for every tile (A/B comparisons). MLA_ABSORBED_TMA=0 makes
// version 3 gather by cp.async at every page size. Read once: the choice is fixed for the
// process, so a captured graph never sees it change.
int wgmma_mode() {
  static const int mode = [] {
    const char* v = std::getenv("MLA_ABSORBED_WGMMA");
    if (v == nullptr) return 3;
    const std::string_view s(v);
    return s == "0" ? 0 : s == "v2" ? 2 : 3;
  }();
  return mode;
}

// Version 3 gathers pages of 64 and 128 by TMA in boxes of 64 key rows and smaller pages by
// cp.async (measured on the H200: TMA-64 beat cp.async at page 64, TMA boxes of 16 rows lost to
// it; docs/cuda-notes.md). A/B: MLA_ABSORBED_TMA=0 (cp.async everywhere) or 16 (boxes of 16
// rows, pages >= 16); MLA_ABSORBED_TMA_L2=0/64/128/256 (the copies' L2 promotion, default 256).
int tma_box_rows() {
  static const int rows = [] {
    const char* v = std::getenv("MLA_ABSORBED_TMA");
    const std::string_view s(v == nullptr ? "64" : v);
    return s == "16" ? 16 : s == "0" ? 0 : 64;
  }();
  return rows;
}
int tma_l2_bytes() {
  static const int bytes = [] {
    const char* v = std::getenv("MLA_ABSORBED_TMA_L2");
    return v == nullptr ? 256 : std::atoi(v);
  }();
  return bytes;
}
// Measurement only: MLA_ABSORBED_DIAG=1 skips every key load after a CTA's first two tiles
// (compute alone), =2 skips the tensor-core work (loads alone). Results are wrong by design.
int diag_mode() {
  static const int mode = [] {
    const char* v = std::getenv("MLA_ABSORBED_DIAG");
    return v == nullptr ? 0 : std::atoi(v);
  }();
  return mode;
}

int grid_ctas() {
  const int n = sm_count(current_device());
  return n > 0 ? n : kDefaultCtas;
}

class CudaAbsorbedOp final : public AbsorbedAttentionOp {
 public:
  Status supports(int num_heads, int page_size, DType cache_dtype) const override {
    if (!is_supported_head_count(num_heads)) {
      return unsupported("cuda absorbed: num_heads = {} (supported: 16, 32, 64, 128)", num_heads);
    }
    if (!is_supported_page_size(page_size)) {
      return unsupported("cuda absorbed: page_size = {} (supported: 1, 16, 32, 64, 128)",
                         page_size);
    }
    if (cache_dtype != DType::kBF16 && cache_dtype != DType::kFP8E4M3) {
      return unsupported("cuda absorbed: {} latent cache (supported: bf16, fp8e4m3)",
                         dtype_name(cache_dtype));
    }
    return Status::Ok();
  }

  std::size_t plan_bytes(const AttnCapacity& cap) const override {
    return absorbed::plan_layout(cap, grid_ctas()).bytes;
  }

  std::size_t workspace_bytes(const AttnCapacity&) const override {
    return absorbed::partial_workspace_bytes(grid_ctas());
  }

  StatusOr<std::size_t> plan(const AbsorbedProblem& problem, const AttnCapacity& cap,
                             std::span<std::byte> host_plan) const override {
    MLA_RETURN_IF_ERROR(supports(problem.num_heads, problem.page_size, DType::kBF16));
    return absorbed::build_plan(problem, cap, grid_ctas(), host_plan);
  }

  Status run(const AbsorbedArgs& a, const ExecContext& ctx) const override {
    MLA_CHECK_ARG(ctx.device.is_cuda(), "cuda absorbed: exec device is {}", ctx.device.to_string());
    const Device dev = ctx.device;
    const bool fp8 = a.kv_cache.dtype == DType::kFP8E4M3;
    if (a.kv_cache.dtype != DType::kBF16 && !fp8) {
      return unsupported("cuda absorbed: {} latent cache (supported: bf16, fp8e4m3)",
                         dtype_name(a.kv_cache.dtype));
    }
    if (fp8) {  // the scale applies to fp8 only; a bf16 cache ignores it (SYSTEM.md 7)
      MLA_CHECK_ARG(std::isfinite(a.k_scale) && a.k_scale > 0.f,
                    "k_scale = {} must be positive for an fp8 cache", a.k_scale);
    }
    MLA_CHECK_ARG(a.q.ndim == 3, "q: expected [T, H, 576], got {}", a.q.describe());
    const int64_t tokens = a.q.shape[0], heads = a.q.shape[1];
    MLA_RETURN_IF_ERROR(expect_tensor(a.q, "q", DType::kBF16, {tokens, heads, 576}, dev));
    MLA_CHECK_ARG(is_supported_head_count(static_cast<int>(heads)),
                  "q: num_heads = {} (supported: 16, 32, 64, 128)", heads);
    MLA_RETURN_IF_ERROR(expect_tensor(a.kv_cache, "kv_cache", a.kv_cache.dtype, {-1, 576}, dev));
    MLA_RETURN_IF_ERROR(
        expect_tensor(a.req_to_token, "req_to_token", DType::kI32, {-1, -1}, dev, false));
    MLA_CHECK_ARG(a.req_to_token.stride[1] == 1, "req_to_token: column stride {} must be 1",
                  a.req_to_token.stride[1]);
    MLA_RETURN_IF_ERROR(expect_tensor(a.o, "o", DType::kBF16, {tokens, heads, 512}, dev));
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
    p.req_to_token = a.req_to_token.ptr<const int32_t>();
    p.req_to_token_stride = a.req_to_token.stride[0];
    p.o = a.o.ptr<uint16_t>();
    p.lse = a.lse.ptr<float>();
    const std::size_t n_partials = static_cast<std::size_t>(absorbed::max_partials(ctas));
    p.partial_o = static_cast<float*>(a.workspace);
    const std::size_t o_bytes = n_partials * absorbed::kMaxRows * absorbed::kDimV * sizeof(float);
    p.partial_lse = reinterpret_cast<float*>(static_cast<unsigned char*>(a.workspace) +
                                             (o_bytes + 255) / 256 * 256);
    p.plan = static_cast<const unsigned char*>(a.plan);
    p.scale_log2 = a.sm_scale * 1.4426950408889634f * (fp8 ? a.k_scale : 1.f);
    p.o_scale = fp8 ? a.k_scale : 1.f;
    p.wgmma_tiles = fp8 ? 0 : wgmma_mode();  // the sm90 kernels read bf16 caches only
    p.num_heads = static_cast<int32_t>(heads);
    if (p.wgmma_tiles == 3) {
      p.diag = diag_mode();
      if (const int rows = tma_box_rows(); rows > 0) {
        p.kv_tmap_rows = rows;
        p.kv_tmap_valid = sm90::cached_bf16_tensor_map_sw128(
                              a.kv_cache.data, a.kv_cache.shape[0], 576, a.kv_cache.stride[0],
                              rows, 64, tma_l2_bytes(), p.kv_tmap)
                              ? 1
                              : 0;
      }
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
