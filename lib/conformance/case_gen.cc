#include "conformance/case_gen.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace mla::testing {

uint64_t mix_seed(uint64_t seed, uint64_t salt) {
  uint64_t z = seed ^ (salt + 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::vector<bf16> random_bf16(int64_t n, Rng& rng, float stddev) {
  std::vector<bf16> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = bf16::from_float(static_cast<float>(rng.normal() * stddev));
  return v;
}

std::vector<float> to_float(std::span<const bf16> v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = v[i].to_float();
  return out;
}

std::vector<float> to_float(std::span<const fp8_e4m3> v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = v[i].to_float();
  return out;
}

std::vector<float> decode_to_float(std::span<const std::byte> bytes, DType dtype) {
  const std::size_t n = bytes.size() / dtype_size(dtype);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::byte* p = bytes.data() + i * dtype_size(dtype);
    switch (dtype) {
      case DType::kBF16: {
        bf16 b;
        std::memcpy(&b.bits, p, 2);
        out[i] = b.to_float();
        break;
      }
      case DType::kFP8E4M3: {
        fp8_e4m3 f;
        std::memcpy(&f.bits, p, 1);
        out[i] = f.to_float();
        break;
      }
      case DType::kF32:
        std::memcpy(&out[i], p, 4);
        break;
      case DType::kI32: {
        int32_t x;
        std::memcpy(&x, p, 4);
        out[i] = static_cast<float>(x);
        break;
      }
      case DType::kU8:
        out[i] = static_cast<float>(static_cast<uint8_t>(*p));
        break;
    }
  }
  return out;
}

int64_t PagedLayout::slot(int b, int64_t token) const {
  const int64_t row = req_rows[b];
  if (page_size == 1) return req_to_token[row * max_context_len + token];
  return req_to_token[row * max_context_len + (token / page_size) * page_size] + token % page_size;
}

PagedLayout make_paged_layout(std::span<const int32_t> kv_lens, int page_size, bool shuffle,
                              Rng& rng) {
  PagedLayout l;
  l.page_size = page_size;
  const int bs = static_cast<int>(kv_lens.size());
  l.kv_lens.assign(kv_lens.begin(), kv_lens.end());
  int32_t max_len = 1;
  int64_t pages_needed = 0;
  for (int32_t len : kv_lens) {
    max_len = std::max(max_len, len);
    pages_needed += (len + page_size - 1) / page_size;
  }
  // Columns rounded up to whole pages plus one spare page; a few spare pages and rows so ids
  // and rows are not simply dense.
  l.max_context_len = (max_len + page_size - 1) / page_size * page_size + page_size;
  const int64_t num_pages = pages_needed + 3;
  l.num_slots = (num_pages + 1) * page_size;
  l.num_rows = bs + 3;
  l.req_to_token.assign(static_cast<std::size_t>(l.num_rows) * l.max_context_len, 0);
  l.max_blocks = l.max_context_len / page_size;
  l.block_table.assign(static_cast<std::size_t>(l.num_rows) * l.max_blocks, 0);

  // Page ids 1..num_pages (slot ids 1.. for page_size 1: same thing).
  std::vector<int32_t> pages(static_cast<std::size_t>(num_pages));
  std::iota(pages.begin(), pages.end(), 1);
  if (shuffle) std::shuffle(pages.begin(), pages.end(), rng.engine());
  std::vector<int32_t> rows(static_cast<std::size_t>(l.num_rows - 1));
  std::iota(rows.begin(), rows.end(), 1);
  if (shuffle) std::shuffle(rows.begin(), rows.end(), rng.engine());

  std::size_t next_page = 0;
  for (int b = 0; b < bs; ++b) {
    const int32_t row = rows[b];
    l.req_rows.push_back(row);
    int32_t* r = l.req_to_token.data() + static_cast<int64_t>(row) * l.max_context_len;
    int32_t* blocks = l.block_table.data() + static_cast<int64_t>(row) * l.max_blocks;
    for (int32_t i = 0; i < kv_lens[b]; i += page_size) {
      blocks[i / page_size] = pages[next_page];
      const int32_t first = pages[next_page++] * page_size;
      for (int32_t j = 0; j < page_size; ++j) r[i + j] = first + j;  // whole page, like a pool
    }
  }
  return l;
}

LatentCache make_latent_cache(const PagedLayout& layout, DType dtype, float k_scale, Rng& rng,
                              int latent_dim) {
  LatentCache c;
  c.dtype = dtype;
  c.k_scale = k_scale;
  c.num_slots = layout.num_slots;
  c.latent_dim = latent_dim;
  const int64_t n = c.num_slots * latent_dim;
  c.stored.assign(static_cast<std::size_t>(n), kUnusedSlotValue);
  for (std::size_t b = 0; b < layout.kv_lens.size(); ++b) {
    for (int64_t i = 0; i < layout.kv_lens[b]; ++i) {
      float* row = c.stored.data() + layout.slot(static_cast<int>(b), i) * latent_dim;
      for (int d = 0; d < latent_dim; ++d) {
        const float real = static_cast<float>(rng.normal() * 0.25);
        row[d] = dtype == DType::kFP8E4M3 ? fp8_e4m3::from_float(real / k_scale).to_float()
                                          : round_to_bf16(real);
      }
    }
  }
  c.bytes.resize(static_cast<std::size_t>(n) * dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) {
    if (dtype == DType::kFP8E4M3) {
      const uint8_t bits = fp8_e4m3::from_float(c.stored[i]).bits;
      std::memcpy(c.bytes.data() + i, &bits, 1);
    } else {
      const uint16_t bits = bf16::from_float(c.stored[i]).bits;
      std::memcpy(c.bytes.data() + 2 * i, &bits, 2);
    }
  }
  // fp8 filler: 100 is not representable exactly; keep `stored` equal to what is stored.
  if (dtype == DType::kFP8E4M3) c.stored = decode_to_float(c.bytes, dtype);
  return c;
}

LatentCache quantize_to_fp8(const LatentCache& bf16_cache, const PagedLayout& layout) {
  const int dim = bf16_cache.latent_dim;
  float amax = 0.f;
  for (std::size_t b = 0; b < layout.kv_lens.size(); ++b) {
    for (int64_t i = 0; i < layout.kv_lens[b]; ++i) {
      const float* row = bf16_cache.stored.data() + layout.slot(static_cast<int>(b), i) * dim;
      for (int d = 0; d < dim; ++d) amax = std::max(amax, std::fabs(row[d]));
    }
  }
  LatentCache c = bf16_cache;
  c.dtype = DType::kFP8E4M3;
  c.k_scale = amax > 0.f ? amax / 448.f : 1.f;
  c.bytes.resize(c.stored.size());
  for (std::size_t i = 0; i < c.stored.size(); ++i) {
    const fp8_e4m3 v = fp8_e4m3::from_float(bf16_cache.stored[i] / c.k_scale);
    std::memcpy(c.bytes.data() + i, &v.bits, 1);
    c.stored[i] = v.to_float();
  }
  return c;
}

}  // namespace mla::testing
