#include "run_layer.h"

#include <cmath>
#include <limits>

#include "common/case_gen.h"
#include "common/reference.h"

namespace mla::cli {
namespace {

constexpr int64_t kNoiseSlack = 1 << 16;   // random offsets into the noise, in elements
constexpr int64_t kOffsetAlign = 64;        // keeps every view 128-byte aligned
constexpr float kActivationStd = 1.0f;      // logits of a few units: softmax is not flat
constexpr float kWeightStd = 0.08f;

}  // namespace

SimLayer::SimLayer(const ModelDims& model, Device device, int64_t max_tokens)
    : model_(model), device_(device), max_tokens_(max_tokens) {
  ctx_.device = device;
}

StatusOr<std::unique_ptr<SimLayer>> SimLayer::create(const ModelDims& model, Device device,
                                                     int num_layers, int64_t max_tokens,
                                                     uint64_t seed) {
  MLA_CHECK_ARG(max_tokens >= 1, "sim layer: max_tokens = {} must be >= 1", max_tokens);
  std::unique_ptr<SimLayer> l(new SimLayer(model, device, max_tokens));
  l->rng_.seed(seed);
  const int64_t H = model.num_heads;
  l->noise_elems_ = max_tokens * H * 128 + kNoiseSlack;
  testing::Rng rng(seed);
  l->noise_host_ = testing::random_bf16(l->noise_elems_, rng, kActivationStd);
  l->weight_host_ = testing::random_bf16(H * 256 * 512, rng, kWeightStd);
  DeviceRuntime* rt = device_runtime(device.type);
  MLA_CHECK_ARG(rt != nullptr, "sim layer: no runtime for {}", device.to_string());
  auto alloc = [&](int64_t elems, const char* name) {
    return DeviceBuffer::allocate(device, static_cast<std::size_t>(elems) * sizeof(bf16), name,
                                  "sim", false);
  };
  MLA_ASSIGN_OR_RETURN(l->noise_, alloc(l->noise_elems_, "sim.activations"));
  MLA_ASSIGN_OR_RETURN(l->kv_b_proj_, alloc(H * 256 * 512, "sim.kv_b_proj"));
  MLA_ASSIGN_OR_RETURN(l->o_, alloc(max_tokens * H * 128, "sim.o"));
  MLA_RETURN_IF_ERROR(rt->copy_to_device(l->noise_.data(), l->noise_host_.data(),
                                         l->noise_.bytes(), nullptr));
  MLA_RETURN_IF_ERROR(rt->copy_to_device(l->kv_b_proj_.data(), l->weight_host_.data(),
                                         l->kv_b_proj_.bytes(), nullptr));
  MLA_RETURN_IF_ERROR(rt->synchronize(nullptr));
  const TensorView w(l->kv_b_proj_.data(), DType::kBF16, device, {H * 256, 512});
  for (int i = 0; i < num_layers; ++i) {
    MLA_ASSIGN_OR_RETURN(auto layer, MlaLayer::create(model, i, w, device));
    l->layers_.push_back(std::move(layer));
  }
  return l;
}

int64_t SimLayer::pick_offset() {
  return static_cast<int64_t>(rng_() % (kNoiseSlack / kOffsetAlign)) * kOffsetAlign;
}

TensorView SimLayer::noise_view(int64_t offset, std::initializer_list<int64_t> shape) const {
  return TensorView(noise_.as<bf16>() + offset, DType::kBF16, device_, shape);
}

Status SimLayer::forward(AttentionBackend& backend, int layer, int64_t T) {
  MLA_CHECK_ARG(T >= 0 && T <= max_tokens_, "sim layer: {} tokens exceed the {} planned for", T,
                max_tokens_);
  MLA_CHECK_ARG(layer >= 0 && layer < static_cast<int>(layers_.size()),
                "sim layer: layer = {} is outside 0..{}", layer, layers_.size() - 1);
  const int64_t H = model_.num_heads;
  last_tokens_ = T;
  off_q_ = pick_offset();
  off_qpe_ = pick_offset();
  const TensorView o(o_.data(), DType::kBF16, device_, {T, H, 128});
  return layers_[static_cast<std::size_t>(layer)]->forward(
      backend, noise_view(off_q_, {T, H, 128}), noise_view(off_qpe_, {T, H, 64}),
      noise_view(pick_offset(), {T, 512}), noise_view(pick_offset(), {T, 64}), o, ctx_);
}

double SimLayer::check_cost(const ForwardBatch& batch, int num_heads) {
  double pairs = 0.0;
  for (int b = 0; b < batch.batch_size; ++b) {
    pairs += static_cast<double>(batch.q_len(b)) * batch.kv_len(b);
  }
  return num_heads * (pairs * 1088.0 + static_cast<double>(batch.num_tokens()) * 2 * 128 * 512);
}

StatusOr<double> SimLayer::check(const AttentionBackend& backend, const ForwardBatch& batch,
                                 int layer) {
  const int64_t T = batch.num_tokens();
  const int H = model_.num_heads;
  MLA_CHECK_ARG(T <= last_tokens_, "sim check: batch has {} tokens, the last forward ran {}", T,
                last_tokens_);
  if (T == 0) return 0.0;
  DeviceRuntime* rt = device_runtime(device_.type);
  const LatentKvPool& pool = *backend.pool();

  // Inputs exactly as the layer saw them.
  const std::vector<float> q_nope = testing::to_float(
      std::span<const bf16>(noise_host_).subspan(static_cast<std::size_t>(off_q_),
                                                 static_cast<std::size_t>(T * H * 128)));
  const std::vector<float> q_pe = testing::to_float(
      std::span<const bf16>(noise_host_).subspan(static_cast<std::size_t>(off_qpe_),
                                                 static_cast<std::size_t>(T * H * 64)));
  const std::vector<float> w = testing::to_float(weight_host_);
  const std::vector<double> q_abs_nope =
      testing::reference_head_gemm(q_nope, w, T, H, 128, 512, 256 * 512, 512, false);
  std::vector<float> q_abs(static_cast<std::size_t>(T * H * 576));
  for (int64_t r = 0; r < T * H; ++r) {
    for (int d = 0; d < 512; ++d) {
      q_abs[static_cast<std::size_t>(r * 576 + d)] =
          static_cast<float>(q_abs_nope[static_cast<std::size_t>(r * 512 + d)]);
    }
    for (int d = 0; d < 64; ++d) {
      q_abs[static_cast<std::size_t>(r * 576 + 512 + d)] = q_pe[static_cast<std::size_t>(r * 64 + d)];
    }
  }

  // The keys of every request, gathered into a compact page-size-1 cache.
  const TensorView cache = pool.layer_cache(layer);
  MLA_CHECK_ARG(cache.dtype == DType::kBF16, "sim check: only a bf16 cache is supported, got {}",
                dtype_name(cache.dtype));
  std::vector<bf16> cache_host(static_cast<std::size_t>(cache.numel()));
  MLA_RETURN_IF_ERROR(rt->copy_to_host(cache_host.data(), cache.data, cache.bytes(), nullptr));
  std::vector<int32_t> q_lens, kv_lens, rows;
  int32_t max_kv = 1;
  for (int b = 0; b < batch.batch_size; ++b) {
    q_lens.push_back(batch.q_len(b));
    kv_lens.push_back(batch.kv_len(b));
    rows.push_back(b);
    max_kv = std::max(max_kv, batch.kv_len(b));
  }
  std::vector<int32_t> table(static_cast<std::size_t>(batch.batch_size) * max_kv, 0);
  std::vector<float> keys;
  int32_t next = 0;
  for (int b = 0; b < batch.batch_size; ++b) {
    for (int32_t t = 0; t < kv_lens[static_cast<std::size_t>(b)]; ++t) {
      const int32_t slot = pool.slot(batch.req_pool_indices[static_cast<std::size_t>(b)], t);
      MLA_CHECK_ARG(slot >= 0, "sim check: request {} token {} has no slot", b, t);
      table[static_cast<std::size_t>(b) * max_kv + t] = next++;
      for (int d = 0; d < 576; ++d) {
        keys.push_back(cache_host[static_cast<std::size_t>(slot) * 576 + d].to_float());
      }
    }
  }
  testing::AbsorbedRefProblem p;
  p.num_heads = H;
  p.page_size = 1;
  p.causal = true;
  p.sm_scale = model_.sm_scale;
  p.row_stride = max_kv;
  p.req_to_token = table;
  p.req_rows = rows;
  p.q_lens = q_lens;
  p.kv_lens = kv_lens;
  const testing::RefAttention att = testing::reference_absorbed(p, q_abs, keys);
  const std::vector<float> o_lat(att.o.begin(), att.o.end());
  const std::vector<double> ref = testing::reference_head_gemm(
      o_lat, std::span<const float>(w).subspan(128 * 512), T, H, 512, 128, 256 * 512, 512, true);

  std::vector<bf16> o_host(static_cast<std::size_t>(T * H * 128));
  MLA_RETURN_IF_ERROR(rt->copy_to_host(o_host.data(), o_.data(), o_host.size() * sizeof(bf16),
                                       nullptr));
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < o_host.size(); ++i) {
    const double got = o_host[i].to_float();
    if (!std::isfinite(got)) return std::numeric_limits<double>::infinity();
    num += (got - ref[i]) * (got - ref[i]);
    den += ref[i] * ref[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace mla::cli
