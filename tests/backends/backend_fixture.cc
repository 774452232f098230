#include "backends/backend_fixture.h"

#include <cmath>
#include <limits>

namespace mla::testing {

BackendOptions small_options(int num_heads) {
  BackendOptions o;
  auto preset = model_preset("deepseek-v3");
  o.model = *preset;
  o.model.num_heads = num_heads;
  o.device = Device::cpu();
  o.paged_workspace_bytes = 8u << 20;
  o.chunked_workspace_bytes = 8u << 20;
  o.max_batch = 64;
  return o;
}

std::unique_ptr<LatentKvPool> make_pool(const PoolSetup& s) {
  KvPoolConfig c;
  c.num_layers = 2;
  c.page_size = s.page_size;
  c.max_requests = s.max_requests;
  c.max_context_len = s.max_context_len;
  c.num_pages = s.num_pages > 0 ? s.num_pages
                                : static_cast<int64_t>(s.max_requests) *
                                      ((s.max_context_len + s.page_size - 1) / s.page_size);
  c.dtype = s.dtype;
  c.device = Device::cpu();
  auto pool = LatentKvPool::create(c);
  if (!pool.ok()) return nullptr;
  return std::move(pool).value();
}

namespace {

void write_random_rows(LatentKvPool& pool, const std::vector<int32_t>& slots, Rng& rng) {
  const KvPoolConfig& c = pool.config();
  for (int l = 0; l < c.num_layers; ++l) {
    const TensorView cache = pool.layer_cache(l);
    for (int32_t s : slots) {
      for (int d = 0; d < c.latent_dim; ++d) {
        const float v = static_cast<float>(rng.normal() * 0.25);
        const std::size_t i = static_cast<std::size_t>(s) * c.latent_dim + d;
        if (c.dtype == DType::kBF16) {
          cache.ptr<bf16>()[i] = bf16::from_float(v);
        } else {
          cache.ptr<fp8_e4m3>()[i] = fp8_e4m3::from_float(v / pool.k_scale(l));
        }
      }
    }
  }
}

double cache_value(const LatentKvPool& pool, int layer, int64_t slot, int d) {
  const KvPoolConfig& c = pool.config();
  const TensorView cache = pool.layer_cache(layer);
  const std::size_t i = static_cast<std::size_t>(slot) * c.latent_dim + d;
  if (c.dtype == DType::kBF16) return cache.ptr<bf16>()[i].to_float();
  return static_cast<double>(cache.ptr<fp8_e4m3>()[i].to_float()) * pool.k_scale(layer);
}

}  // namespace

ForwardBatch make_batch(LatentKvPool& pool, const BatchSpec& spec, Rng& rng) {
  ForwardBatch batch;
  batch.mode = spec.mode;
  const int bs = static_cast<int>(spec.prefix_lens.size());
  batch.batch_size = bs;
  batch.num_draft_tokens = spec.num_draft_tokens;
  const bool explicit_extend = spec.mode == ForwardMode::kExtend ||
                               spec.mode == ForwardMode::kMixed ||
                               spec.mode == ForwardMode::kDraftExtend;
  for (int b = 0; b < bs; ++b) {
    const int row = *pool.alloc_request();
    const int32_t prefix = spec.prefix_lens[b];
    const int32_t fresh = spec.mode == ForwardMode::kDecode         ? 1
                          : spec.mode == ForwardMode::kTargetVerify ? spec.num_draft_tokens
                                                                    : spec.new_lens[b];
    std::vector<int32_t> slots;
    if (prefix > 0) {
      Status s = pool.extend_request(row, prefix, &slots);
      (void)s;
      write_random_rows(pool, slots, rng);
    }
    Status s = pool.extend_request(row, prefix + fresh, &slots);
    (void)s;
    batch.req_pool_indices.push_back(row);
    batch.out_cache_loc.insert(batch.out_cache_loc.end(), slots.begin(), slots.end());
    batch.seq_lens.push_back(spec.mode == ForwardMode::kTargetVerify ? prefix : prefix + fresh);
    if (explicit_extend) {
      batch.extend_prefix_lens.push_back(prefix);
      batch.extend_seq_lens.push_back(fresh);
    }
  }
  finalize_batch(batch);
  return batch;
}

void free_batch(LatentKvPool& pool, const ForwardBatch& batch) {
  for (int32_t row : batch.req_pool_indices) pool.free_request(row).ignore();
}

TensorView LayerInputs::q_nope_view() {
  return TensorView(q_nope.data(), DType::kBF16, Device::cpu(), {tokens, heads, 128});
}
TensorView LayerInputs::q_pe_view() {
  return TensorView(q_pe.data(), DType::kBF16, Device::cpu(), {tokens, heads, 64});
}
TensorView LayerInputs::c_kv_view() {
  return TensorView(c_kv.data(), DType::kBF16, Device::cpu(), {tokens, 512});
}
TensorView LayerInputs::k_pe_view() {
  return TensorView(k_pe.data(), DType::kBF16, Device::cpu(), {tokens, 64});
}

LayerInputs random_layer_inputs(int64_t tokens, int heads, Rng& rng) {
  LayerInputs in;
  in.tokens = tokens;
  in.heads = heads;
  in.q_nope = random_bf16(tokens * heads * 128, rng, 0.5f);
  in.q_pe = random_bf16(tokens * heads * 64, rng, 0.5f);
  in.c_kv = random_bf16(tokens * 512, rng, 0.25f);
  in.k_pe = random_bf16(tokens * 64, rng, 0.25f);
  return in;
}

LayerReference reference_layer(const LatentKvPool& pool, int layer, const ForwardBatch& batch,
                               const LayerInputs& in, const TensorView& kv_b_proj, double scale) {
  const int H = in.heads;
  const int64_t T = in.tokens;
  LayerReference ref;
  ref.o.assign(static_cast<std::size_t>(T * H * 128), 0.0);
  ref.lse.assign(static_cast<std::size_t>(T * H), -std::numeric_limits<double>::infinity());
  const bf16* w = kv_b_proj.ptr<bf16>();
  auto W = [&](int h, int r, int k) {
    return static_cast<double>(w[(static_cast<std::size_t>(h) * 256 + r) * 512 + k].to_float());
  };
  const bool fp8 = pool.config().dtype == DType::kFP8E4M3;
  const float k_scale = pool.k_scale(layer);
  int64_t t0 = 0;
  for (int b = 0; b < batch.batch_size; ++b) {
    const int q = batch.q_len(b);
    const int kv = batch.kv_len(b);
    const int prefix = kv - q;
    const int row = batch.req_pool_indices[b];
    std::vector<double> rows(static_cast<std::size_t>(kv) * 576);
    for (int i = 0; i < kv; ++i) {
      for (int d = 0; d < 576; ++d) {
        double v;
        if (i < prefix) {
          v = cache_value(pool, layer, pool.slot(row, i), d);
        } else {
          const int64_t t = t0 + (i - prefix);
          v = d < 512 ? in.c_kv[t * 512 + d].to_float() : in.k_pe[t * 64 + d - 512].to_float();
          if (fp8) {  // what the layer's kv write stores: fp8(value / k_scale), read * k_scale
            v = static_cast<double>(
                    fp8_e4m3::from_float(static_cast<float>(v) / k_scale).to_float()) *
                k_scale;
          }
        }
        rows[static_cast<std::size_t>(i) * 576 + d] = v;
      }
    }
    for (int j = 0; j < q; ++j) {
      const int64_t t = t0 + j;
      const int visible = prefix + j + 1;
      for (int h = 0; h < H; ++h) {
        std::vector<double> qa(576, 0.0);
        for (int d = 0; d < 128; ++d) {
          const double x = in.q_nope[(t * H + h) * 128 + d].to_float();
          for (int k = 0; k < 512; ++k) qa[k] += x * W(h, d, k);
        }
        for (int d = 0; d < 64; ++d) qa[512 + d] = in.q_pe[(t * H + h) * 64 + d].to_float();
        std::vector<double> logit(static_cast<std::size_t>(visible));
        double m = -std::numeric_limits<double>::infinity();
        for (int i = 0; i < visible; ++i) {
          double s = 0;
          for (int d = 0; d < 576; ++d) s += qa[d] * rows[static_cast<std::size_t>(i) * 576 + d];
          logit[i] = s * scale;
          m = std::max(m, logit[i]);
        }
        double sum = 0;
        std::vector<double> lat(512, 0.0);
        for (int i = 0; i < visible; ++i) {
          const double p = std::exp(logit[i] - m);
          sum += p;
          for (int k = 0; k < 512; ++k) lat[k] += p * rows[static_cast<std::size_t>(i) * 576 + k];
        }
        ref.lse[t * H + h] = m + std::log(sum);
        for (int e = 0; e < 128; ++e) {
          double acc = 0;
          for (int k = 0; k < 512; ++k) acc += lat[k] / sum * W(h, 128 + e, k);
          ref.o[(t * H + h) * 128 + e] = acc;
        }
      }
    }
    t0 += q;
  }
  return ref;
}

LayerRun run_layer(AttentionBackend& backend, MlaLayer& layer, const ForwardBatch& batch,
                   LayerInputs& in, bool plan) {
  LayerRun r;
  if (plan) {
    r.status = plan_batch(backend, batch);
    if (!r.status.ok()) return r;
  }
  const int64_t T = in.tokens;
  const int H = in.heads;
  std::vector<bf16> o(static_cast<std::size_t>(T * H * 128), bf16{0xFFFF});
  r.lse.assign(static_cast<std::size_t>(T * H), std::numeric_limits<float>::quiet_NaN());
  const TensorView o_view(o.data(), DType::kBF16, Device::cpu(), {T, H, 128});
  const TensorView lse_view(r.lse.data(), DType::kF32, Device::cpu(), {T, H});
  r.status = layer.forward(backend, in.q_nope_view(), in.q_pe_view(), in.c_kv_view(),
                           in.k_pe_view(), o_view, ExecContext{}, lse_view);
  r.o = to_float(o);
  return r;
}

double rel_error(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    const double d = (i < a.size() ? a[i] : 0.0) - b[i];
    num += d * d;
    den += b[i] * b[i];
  }
  return std::isfinite(num) ? std::sqrt(num / std::max(den, 1e-30)) : 1e30;
}

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<double> bd(b.begin(), b.end());
  return rel_error(a, bd);
}

std::size_t ledger_bytes(std::string_view name) {
  std::size_t n = 0;
  for (const auto& r : MemoryLedger::global().snapshot()) {
    if (r.name == name) n += r.bytes;
  }
  return n;
}

int ledger_count_prefix(std::string_view prefix) {
  int n = 0;
  for (const auto& r : MemoryLedger::global().snapshot()) {
    if (r.name.rfind(prefix, 0) == 0) ++n;
  }
  return n;
}

std::vector<BatchSpec> every_mode_specs() {
  return {
      {ForwardMode::kDecode, {0, 17, 40}, {}},        {ForwardMode::kTargetVerify, {5, 33}, {}, 3},
      {ForwardMode::kDraftExtend, {12, 20}, {2, 1}},  {ForwardMode::kExtend, {0, 0}, {9, 5}},
      {ForwardMode::kExtend, {40, 0, 21}, {6, 4, 3}}, {ForwardMode::kMixed, {30, 14}, {5, 1}},
  };
}

}  // namespace mla::testing
