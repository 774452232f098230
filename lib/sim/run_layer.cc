#include "run_layer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "conformance/case_gen.h"
#include "conformance/reference.h"
#include "mla/kv_pool.h"
#include "mla/model.h"

namespace mla::cli {
namespace {

constexpr int64_t kNoiseSlack = 1 << 16;  // random offsets into the noise, in elements
constexpr int64_t kOffsetAlign = 64;      // keeps every view 128-byte aligned
constexpr float kActivationStd = 1.0f;    // logits of a few units: softmax is not flat
constexpr float kWeightStd = 0.08f;

}  // namespace

SimLayer::SimLayer(const ModelDims& model, Device device, int64_t max_tokens)
    : model_(model), device_(device), max_tokens_(max_tokens) {
  ctx_.device = device;
}

StatusOr<std::unique_ptr<SimLayer>> SimLayer::create(const ModelDims& model, Device device,
                                                     int num_layers, int64_t num_slots,
                                                     int64_t max_tokens, uint64_t seed) {
  MLA_CHECK_ARG(max_tokens >= 1, "sim layer: max_tokens = {} must be >= 1", max_tokens);
  MLA_CHECK_ARG(num_slots >= 1, "sim layer: num_slots = {} must be >= 1", num_slots);
  std::unique_ptr<SimLayer> l(new SimLayer(model, device, max_tokens));
  l->kv_model_.assign(static_cast<std::size_t>(num_layers),
                      std::vector<SlotSource>(static_cast<std::size_t>(num_slots)));
  l->rng_.seed(seed);
  const int64_t H = model.num_heads;
  l->noise_elems_ = max_tokens * H * kQkNopeDim + kNoiseSlack;
  testing::Rng rng(seed);
  l->noise_host_ = testing::random_bf16(l->noise_elems_, rng, kActivationStd);
  l->weight_host_ = testing::random_bf16(H * kKvBProjRowsPerHead * kKvLoraRank, rng, kWeightStd);
  DeviceRuntime* rt = device_runtime(device.type);
  MLA_CHECK_ARG(rt != nullptr, "sim layer: no runtime for {}", device.to_string());
  auto alloc = [&](int64_t elems, const char* name) {
    return DeviceBuffer::allocate(device, static_cast<std::size_t>(elems) * sizeof(bf16), name,
                                  "sim", false);
  };
  MLA_ASSIGN_OR_RETURN(l->noise_, alloc(l->noise_elems_, "sim.activations"));
  MLA_ASSIGN_OR_RETURN(l->kv_b_proj_,
                       alloc(H * kKvBProjRowsPerHead * kKvLoraRank, "sim.kv_b_proj"));
  MLA_ASSIGN_OR_RETURN(l->o_, alloc(max_tokens * H * kVHeadDim, "sim.o"));
  MLA_RETURN_IF_ERROR(
      rt->copy_to_device(l->noise_.data(), l->noise_host_.data(), l->noise_.bytes(), nullptr));
  MLA_RETURN_IF_ERROR(rt->copy_to_device(l->kv_b_proj_.data(), l->weight_host_.data(),
                                         l->kv_b_proj_.bytes(), nullptr));
  MLA_RETURN_IF_ERROR(rt->synchronize(nullptr));
  const TensorView w(l->kv_b_proj_.data(), DType::kBF16, device,
                     {H * kKvBProjRowsPerHead, kKvLoraRank});
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

Status SimLayer::check_forward_args(const ForwardBatch& batch, int layer, int64_t T) const {
  MLA_CHECK_ARG(T >= 0 && T <= max_tokens_, "sim layer: {} tokens exceed the {} planned for", T,
                max_tokens_);
  MLA_CHECK_ARG(layer >= 0 && layer < static_cast<int>(layers_.size()),
                "sim layer: layer = {} is outside 0..{}", layer, layers_.size() - 1);
  MLA_CHECK_ARG(batch.num_tokens() <= T, "sim layer: batch has {} tokens, {} rows run",
                batch.num_tokens(), T);
  return Status::Ok();
}

Status SimLayer::record_kv(const ForwardBatch& batch, int layer, int64_t off_ckv, int64_t off_kpe) {
  std::vector<SlotSource>& model = kv_model_[static_cast<std::size_t>(layer)];
  for (int64_t t = 0; t < batch.num_tokens(); ++t) {
    const int32_t slot = batch.out_cache_loc[static_cast<std::size_t>(t)];
    MLA_CHECK_ARG(slot >= 0 && slot < static_cast<int64_t>(model.size()),
                  "sim layer: out_cache_loc[{}] = {} is outside the pool's {} slots", t, slot,
                  model.size());
    model[static_cast<std::size_t>(slot)] =
        SlotSource{off_ckv + t * kKvLoraRank, off_kpe + t * kQkRopeDim};
  }
  return Status::Ok();
}

Status SimLayer::forward(AttentionBackend& backend, const ForwardBatch& batch, int layer,
                         int64_t T) {
  MLA_RETURN_IF_ERROR(check_forward_args(batch, layer, T));
  const int64_t H = model_.num_heads;
  last_tokens_ = T;
  off_q_ = pick_offset();
  off_qpe_ = pick_offset();
  const int64_t off_ckv = pick_offset(), off_kpe = pick_offset();
  const TensorView o(o_.data(), DType::kBF16, device_, {T, H, kVHeadDim});
  MLA_RETURN_IF_ERROR(layers_[static_cast<std::size_t>(layer)]->forward(
      backend, noise_view(off_q_, {T, H, kQkNopeDim}), noise_view(off_qpe_, {T, H, kQkRopeDim}),
      noise_view(off_ckv, {T, kKvLoraRank}), noise_view(off_kpe, {T, kQkRopeDim}), o, ctx_));
  // The KV model: what the batch's real tokens should have written, slot by slot.
  return record_kv(batch, layer, off_ckv, off_kpe);
}

Status SimLayer::write_kv(AttentionBackend& backend, const ForwardBatch& batch, int layer,
                          int64_t T) {
  MLA_RETURN_IF_ERROR(check_forward_args(batch, layer, T));
  const int64_t off_ckv = pick_offset(), off_kpe = pick_offset();
  MLA_RETURN_IF_ERROR(backend.save_kv_cache(layer, noise_view(off_ckv, {T, kKvLoraRank}),
                                            noise_view(off_kpe, {T, kQkRopeDim}), ctx_));
  // No output was computed: a check must follow a forward, not this.
  last_tokens_ = 0;
  return record_kv(batch, layer, off_ckv, off_kpe);
}

namespace {

constexpr double kRowMacsFixed =
    2.0 * kQkNopeDim * kKvLoraRank;  // q_nope @ W_UK and o_latent @ W_UV per head
constexpr double kKeyMacs =
    double{kLatentDim + kKvLoraRank};  // q . k (576) and p * v (512) per head and key

}  // namespace

StatusOr<SimLayer::CheckResult> SimLayer::check(const AttentionBackend& backend,
                                                const ForwardBatch& batch, int layer,
                                                double budget) {
  const int64_t T = batch.num_tokens();
  const int H = model_.num_heads;
  MLA_CHECK_ARG(T <= last_tokens_, "sim check: batch has {} tokens, the last forward ran {}", T,
                last_tokens_);
  CheckResult res;
  res.rows = T;
  if (T == 0) return res;
  DeviceRuntime* rt = device_runtime(device_.type);
  const LatentKvPool& pool = *backend.pool();
  const int bs = batch.batch_size;

  // Rows to check: (entry, row within the entry, keys visible to it).
  struct Row {
    int entry;
    int32_t i;
    int32_t visible;
    int64_t token;  // row of the batch
  };
  std::vector<int64_t> first_token(static_cast<std::size_t>(bs) + 1, 0);
  for (int b = 0; b < bs; ++b) first_token[b + 1] = first_token[b] + batch.q_len(b);
  auto row_of = [&](int b, int32_t i) {
    return Row{b, i, batch.kv_len(b) - batch.q_len(b) + i + 1, first_token[b] + i};
  };
  auto row_cost = [](const Row& r) { return r.visible * kKeyMacs + kRowMacsFixed; };
  std::vector<Row> rows;
  std::vector<char> taken(static_cast<std::size_t>(T), 0);
  double cost = 0.0;  // per head
  for (int b = 0; b < bs; ++b) {
    if (batch.q_len(b) == 0) continue;
    rows.push_back(row_of(b, batch.q_len(b) - 1));
    taken[static_cast<std::size_t>(rows.back().token)] = 1;
    cost += row_cost(rows.back());
  }
  int heads = H;
  if (cost * H > budget) heads = std::clamp(static_cast<int>(budget / cost), 1, H);
  auto try_add = [&](const Row& r) {
    if (taken[static_cast<std::size_t>(r.token)] || (cost + row_cost(r)) * heads > budget) return;
    taken[static_cast<std::size_t>(r.token)] = 1;
    rows.push_back(r);
    cost += row_cost(r);
  };
  for (int b = 0; b < bs; ++b) {
    if (batch.q_len(b) > 1) try_add(row_of(b, 0));
  }
  for (int tries = 0; tries < 4 * T && (cost + kRowMacsFixed) * heads <= budget; ++tries) {
    const int64_t t = static_cast<int64_t>(rng_() % static_cast<uint64_t>(T));
    const int b = static_cast<int>(std::upper_bound(first_token.begin(), first_token.end(), t) -
                                   first_token.begin() - 1);
    try_add(row_of(b, static_cast<int32_t>(t - first_token[b])));
  }
  std::vector<int> head_ids(static_cast<std::size_t>(heads));
  const int head_offset = static_cast<int>(rng_() % static_cast<uint64_t>(H));
  for (int k = 0; k < heads; ++k) head_ids[k] = (head_offset + k * H / heads) % H;
  res.rows_checked = static_cast<int64_t>(rows.size());
  res.heads_checked = heads;

  // Keys of every entry from the KV model, and the cache read back compared with it.
  const TensorView cache = pool.layer_cache(layer);
  MLA_CHECK_ARG(cache.dtype == DType::kBF16, "sim check: only a bf16 cache is supported, got {}",
                dtype_name(cache.dtype));
  std::vector<bf16> cache_host(static_cast<std::size_t>(cache.numel()));
  MLA_RETURN_IF_ERROR(rt->copy_to_host(cache_host.data(), cache.data, cache.bytes(), ctx_.stream));
  const std::vector<SlotSource>& model = kv_model_[static_cast<std::size_t>(layer)];
  const int page = pool.config().page_size;
  int32_t max_kv = 1;
  for (int b = 0; b < bs; ++b) max_kv = std::max(max_kv, batch.kv_len(b));
  std::vector<int32_t> table(static_cast<std::size_t>(bs) * max_kv, 0);
  std::vector<float> keys;
  int32_t next = 0;
  for (int b = 0; b < bs; ++b) {
    const int row = batch.req_pool_indices[static_cast<std::size_t>(b)];
    for (int32_t p = 0; p < batch.kv_len(b); ++p) {
      const int32_t slot = pool.slot(row, p);
      MLA_CHECK_ARG(slot >= page && slot < static_cast<int64_t>(model.size()),
                    "sim check: entry {} position {} maps to slot {} (no slot, or the dummy page)",
                    b, p, slot);
      const SlotSource& src = model[static_cast<std::size_t>(slot)];
      if (src.c_kv < 0) {
        return internal_error(
            "sim check: entry {} position {} (slot {}) was never written by the "
            "simulation",
            b, p, slot);
      }
      table[static_cast<std::size_t>(b) * max_kv + p] = next++;
      const bf16* stored = cache_host.data() + static_cast<std::size_t>(slot) * kLatentDim;
      bool same = true;
      for (int d = 0; d < kLatentDim; ++d) {
        const bf16 want = noise_host_[static_cast<std::size_t>(
            d < kKvLoraRank ? src.c_kv + d : src.k_pe + (d - kKvLoraRank))];
        keys.push_back(want.to_float());
        same = same && stored[d].bits == want.bits;
      }
      ++res.kv_slots_checked;
      if (!same && res.kv_mismatches++ == 0) {
        res.kv_error = fmt::format(
            "entry {} position {}: slot {} does not hold the token the "
            "simulation wrote there",
            b, p, slot);
      }
    }
  }
  res.entries_checked = 0;
  for (int b = 0; b < bs; ++b) res.entries_checked += batch.q_len(b) > 0 ? 1 : 0;

  // The reference of the sampled rows and heads: each row a q_len-1 problem over the keys it sees.
  const int64_t R = static_cast<int64_t>(rows.size());
  std::vector<float> q_nope(static_cast<std::size_t>(R * heads * kQkNopeDim));
  std::vector<float> q_pe(static_cast<std::size_t>(R * heads * kQkRopeDim));
  std::vector<float> w(static_cast<std::size_t>(heads) * kKvBProjRowsPerHead * kKvLoraRank);
  for (int k = 0; k < heads; ++k) {
    const std::size_t h = static_cast<std::size_t>(head_ids[k]);
    for (std::size_t e = 0; e < kKvBProjRowsPerHead * kKvLoraRank; ++e) {
      w[k * kKvBProjRowsPerHead * kKvLoraRank + e] =
          weight_host_[h * kKvBProjRowsPerHead * kKvLoraRank + e].to_float();
    }
  }
  std::vector<int32_t> req_rows, q_lens, kv_lens;
  for (int64_t r = 0; r < R; ++r) {
    const Row& row = rows[static_cast<std::size_t>(r)];
    for (int k = 0; k < heads; ++k) {
      const int64_t h = head_ids[k];
      for (int d = 0; d < kQkNopeDim; ++d) {
        q_nope[static_cast<std::size_t>((r * heads + k) * kQkNopeDim + d)] =
            noise_host_[static_cast<std::size_t>(off_q_ + (row.token * H + h) * kQkNopeDim + d)]
                .to_float();
      }
      for (int d = 0; d < kQkRopeDim; ++d) {
        q_pe[static_cast<std::size_t>((r * heads + k) * kQkRopeDim + d)] =
            noise_host_[static_cast<std::size_t>(off_qpe_ + (row.token * H + h) * kQkRopeDim + d)]
                .to_float();
      }
    }
    req_rows.push_back(row.entry);
    q_lens.push_back(1);
    kv_lens.push_back(row.visible);
  }
  const std::vector<double> q_abs_nope =
      testing::reference_head_gemm(q_nope, w, R, heads, kQkNopeDim, kKvLoraRank,
                                   kKvBProjRowsPerHead * kKvLoraRank, kKvLoraRank, false);
  std::vector<float> q_abs(static_cast<std::size_t>(R * heads * kLatentDim));
  for (int64_t r = 0; r < R * heads; ++r) {
    for (int d = 0; d < kKvLoraRank; ++d) {
      q_abs[static_cast<std::size_t>(r * kLatentDim + d)] =
          static_cast<float>(q_abs_nope[static_cast<std::size_t>(r * kKvLoraRank + d)]);
    }
    for (int d = 0; d < kQkRopeDim; ++d) {
      q_abs[static_cast<std::size_t>(r * kLatentDim + kKvLoraRank + d)] =
          q_pe[static_cast<std::size_t>(r * kQkRopeDim + d)];
    }
  }
  testing::AbsorbedRefProblem p;
  p.num_heads = heads;
  p.page_size = 1;
  p.causal = true;
  p.sm_scale = model_.sm_scale;
  p.row_stride = max_kv;
  p.req_to_token = table;
  p.req_rows = req_rows;
  p.q_lens = q_lens;
  p.kv_lens = kv_lens;
  const testing::RefAttention att = testing::reference_absorbed(p, q_abs, keys);
  const std::vector<float> o_lat(att.o.begin(), att.o.end());
  const std::vector<double> ref = testing::reference_head_gemm(
      o_lat, std::span<const float>(w).subspan(kQkNopeDim * kKvLoraRank), R, heads, kKvLoraRank,
      kVHeadDim, kKvBProjRowsPerHead * kKvLoraRank, kKvLoraRank, true);

  std::vector<bf16> o_host(static_cast<std::size_t>(T * H * kVHeadDim));
  MLA_RETURN_IF_ERROR(
      rt->copy_to_host(o_host.data(), o_.data(), o_host.size() * sizeof(bf16), ctx_.stream));
  for (int64_t r = 0; r < R; ++r) {
    const Row& row = rows[static_cast<std::size_t>(r)];
    double num = 0.0, den = 0.0;
    bool finite = true;
    for (int k = 0; k < heads; ++k) {
      for (int d = 0; d < kVHeadDim; ++d) {
        const double got =
            o_host[static_cast<std::size_t>((row.token * H + head_ids[k]) * kVHeadDim + d)]
                .to_float();
        const double want = ref[static_cast<std::size_t>((r * heads + k) * kVHeadDim + d)];
        finite = finite && std::isfinite(got);
        num += (got - want) * (got - want);
        den += want * want;
      }
    }
    const double err = !finite ? std::numeric_limits<double>::infinity()
                               : (den > 0.0 ? std::sqrt(num / den) : std::sqrt(num));
    if (res.worst_entry < 0 || !(err <= res.max_rel_err)) {
      res.max_rel_err = err;
      res.worst_entry = row.entry;
      res.worst_row = row.i;
    }
  }
  return res;
}

}  // namespace mla::cli
