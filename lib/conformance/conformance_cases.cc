// The conformance case list: every op x mode x page size x head count x edge case.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <functional>

#include "conformance/case_gen.h"
#include "conformance/conformance.h"

namespace mla::testing {
namespace {

constexpr uint64_t kDefaultBaseSeed = 20261202;
constexpr float kFp8Scale = 1.0f / 64;  // normal/4 values stored as ~N(0, 16): well inside 448
constexpr float kIgnoredScale = 2.5f;   // set on bf16 caches to prove the scale is ignored

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (char ch : s) {
    h ^= static_cast<uint8_t>(ch);
    h *= 1099511628211ull;
  }
  return h;
}

class Builder {
 public:
  explicit Builder(uint64_t base) : base_(base) {}
  // `stem` names the case without its seed; `fill` sets lengths from the case's own Rng.
  void add(ConformanceCase c, const std::string& stem,
           const std::function<void(ConformanceCase&, Rng&)>& fill = {}) {
    c.seed = mix_seed(base_, fnv1a(stem));
    c.name = fmt::format("{}/seed{}", stem, base_);
    Rng rng(mix_seed(c.seed, 1));
    if (fill) fill(c, rng);
    cases_.push_back(std::move(c));
  }
  std::vector<ConformanceCase> take() { return std::move(cases_); }

 private:
  uint64_t base_;
  std::vector<ConformanceCase> cases_;
};

std::string dtype_tag(DType t, float k_scale) {
  if (t == DType::kFP8E4M3) return "fp8";
  return k_scale != 1.0f ? "bf16_kscale_ignored" : "bf16";
}

ConformanceCase attn(OpKind op, std::string mode, int heads, int page, DType dt = DType::kBF16) {
  ConformanceCase c;
  c.op = op;
  c.mode = std::move(mode);
  c.num_heads = heads;
  c.page_size = page;
  c.cache_dtype = dt;
  c.k_scale = dt == DType::kFP8E4M3 ? kFp8Scale : 1.0f;
  return c;
}

std::string absorbed_stem(const ConformanceCase& c, std::string_view extra = "") {
  return fmt::format("absorbed/{}/h{}/p{}/bs{}/{}{}{}", c.mode, c.num_heads, c.page_size,
                     c.q_lens.size(), dtype_tag(c.cache_dtype, c.k_scale), extra.empty() ? "" : "/",
                     extra);
}

// Edge kv lengths around a page: 1, P-1, P, P+1, 2P+1 and a prime.
std::vector<int32_t> page_edge_lengths(int page) {
  std::vector<int32_t> v = {1, std::max(1, page - 1), page, page + 1, 2 * page + 1, 37};
  return v;
}

void add_absorbed(Builder& b, ConformanceScope scope) {
  const bool full = scope != ConformanceScope::kQuick;
  const std::vector<int> pages =
      full ? std::vector<int>{1, 16, 32, 64, 128} : std::vector<int>{1, 64};
  const std::vector<int> heads =
      full ? std::vector<int>{16, 32, 64, 128} : std::vector<int>{16, 128};

  // Decode over every page size x head count: kv lengths at the page edges.
  for (int p : pages) {
    for (int h : heads) {
      if (!full && !((p == 1 && h == 16) || (p == 64 && h == 128))) continue;
      ConformanceCase c = attn(OpKind::kAbsorbed, "decode", h, p);
      c.kv_lens = page_edge_lengths(p);
      c.q_lens.assign(c.kv_lens.size(), 1);
      b.add(c, absorbed_stem(c, "page_edges"));
    }
  }
  // Decode, random lengths, bf16 with a k_scale that must be ignored, and fp8.
  for (int p : full ? std::vector<int>{1, 16, 64} : std::vector<int>{16}) {
    for (int h : full ? std::vector<int>{16, 128} : std::vector<int>{16}) {
      for (DType dt : {DType::kBF16, DType::kFP8E4M3}) {
        ConformanceCase c = attn(OpKind::kAbsorbed, "decode", h, p, dt);
        if (dt == DType::kBF16) c.k_scale = kIgnoredScale;
        c.q_lens.assign(4, 1);
        b.add(c, absorbed_stem(c, "random"), [](ConformanceCase& c, Rng& r) {
          for (std::size_t i = 0; i < c.q_lens.size(); ++i) {
            c.kv_lens.push_back(static_cast<int32_t>(r.uniform_int(1, 160)));
          }
        });
      }
    }
  }
  // Speculative verify / draft: q_len 2..8.
  for (int p : full ? std::vector<int>{1, 32, 64} : std::vector<int>{32}) {
    for (int h : full ? std::vector<int>{16, 128} : std::vector<int>{16}) {
      ConformanceCase c = attn(OpKind::kAbsorbed, "verify", h, p);
      const int n = full ? 2 + (p % 7) : 4;
      c.q_lens.assign(3, n);
      b.add(c, absorbed_stem(c, fmt::format("q{}", n)), [n](ConformanceCase& c, Rng& r) {
        for (int i = 0; i < 3; ++i)
          c.kv_lens.push_back(n + static_cast<int32_t>(r.uniform_int(0, 90)));
      });
    }
  }
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "draft", 16, 16, DType::kBF16);
    c.q_lens = {1, 8, 3, 5, 2};
    b.add(c, absorbed_stem(c, "variable_q"), [](ConformanceCase& c, Rng& r) {
      for (int32_t q : c.q_lens)
        c.kv_lens.push_back(q + static_cast<int32_t>(r.uniform_int(0, 70)));
    });
  }
  // Extend with a prefix, extend without, mixed.
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "extend_prefix", 16, 16);
    c.q_lens = {20, 7};
    c.kv_lens = {53, 7 + 64};
    b.add(c, absorbed_stem(c));
  }
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "extend", full ? 32 : 16, 1);
    c.q_lens = {full ? 96 : 24, 5};
    c.kv_lens = c.q_lens;
    b.add(c, absorbed_stem(c, "no_prefix"));
  }
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "mixed", 16, 32, DType::kFP8E4M3);
    c.q_lens = {1, 12, 1, 5, 1};
    c.kv_lens = {40, 12, 33, 70, 1};
    b.add(c, absorbed_stem(c));
  }
  // Zero-length rows: q_len 0 requests; non-causal rows with kv_len 0 (o = 0, lse = -inf).
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "edge", 16, 16);
    c.q_lens = {1, 0, 2, 0};
    c.kv_lens = {5, 9, 2, 0};
    b.add(c, absorbed_stem(c, "q_len0"));
  }
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "edge", 16, 1);
    c.causal = false;
    c.q_lens = {2, 3, 1};
    c.kv_lens = {0, 17, 0};
    b.add(c, absorbed_stem(c, "noncausal_kv0"));
  }
  // The block-table form of the page table (FlashMLA / vLLM: page ids, read in place) over
  // every page size, and verify over an fp8 cache; pages of 64 and more take the cuda kernel's
  // TMA load path, smaller ones its cp.async path.
  for (int p : pages) {
    ConformanceCase c = attn(OpKind::kAbsorbed, "decode", p >= 64 ? 128 : 16, p);
    c.block_table = true;
    c.kv_lens = page_edge_lengths(p);
    c.q_lens.assign(c.kv_lens.size(), 1);
    b.add(c, absorbed_stem(c, "page_edges/block_table"));
  }
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "verify", 64, full ? 64 : 16, DType::kFP8E4M3);
    c.block_table = true;
    c.q_lens = {3, 2, 4};
    c.kv_lens = {70, 2, 200};
    b.add(c, absorbed_stem(c, "block_table"));
  }
  if (!full) return;
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "decode", 16, 16);
    c.shuffle_pages = false;
    c.q_lens.assign(3, 1);
    c.kv_lens = {31, 97, 131};
    b.add(c, absorbed_stem(c, "sequential_pages_primes"));
  }
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "decode", 16, 16);
    c.q_lens.assign(70, 1);
    c.capacity_factor = 2;
    b.add(c, absorbed_stem(c, "large_batch_cap2"), [](ConformanceCase& c, Rng& r) {
      for (std::size_t i = 0; i < c.q_lens.size(); ++i) {
        c.kv_lens.push_back(static_cast<int32_t>(r.uniform_int(1, 200)));
      }
    });
  }
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "decode", 128, 1);
    c.q_lens.assign(65, 1);
    b.add(c, absorbed_stem(c, "large_batch"), [](ConformanceCase& c, Rng& r) {
      for (std::size_t i = 0; i < c.q_lens.size(); ++i) {
        c.kv_lens.push_back(static_cast<int32_t>(r.uniform_int(1, 48)));
      }
    });
  }
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "verify", 64, 64, DType::kFP8E4M3);
    c.q_lens = {2, 2};
    c.kv_lens = {66, 130};
    b.add(c, absorbed_stem(c));
  }
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "extend", 128, 64);
    c.q_lens = {48};
    c.kv_lens = {48 + 80};
    b.add(c, absorbed_stem(c, "prefix_long_q"));
  }
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "decode", 32, 128);
    c.q_lens = {1};
    c.kv_lens = {1};
    b.add(c, absorbed_stem(c, "kv1_batch1"));
  }
  // Any head count 1..128 (8: DeepSeek-V3 at TP16): tiles only partly filled by heads x q_len,
  // the second head group of 65..127 heads shorter than 64 rows; both load paths, both caches.
  for (int h : {1, 8, 63, 127}) {
    for (DType dt : {DType::kBF16, DType::kFP8E4M3}) {
      ConformanceCase c = attn(OpKind::kAbsorbed, "decode", h, h % 2 == 0 ? 64 : 16, dt);
      c.q_lens.assign(5, 1);
      b.add(c, absorbed_stem(c, "any_heads"), [](ConformanceCase& c, Rng& r) {
        for (std::size_t i = 0; i < c.q_lens.size(); ++i) {
          c.kv_lens.push_back(static_cast<int32_t>(r.uniform_int(1, 200)));
        }
      });
    }
  }
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "verify", 8, 64);
    c.q_lens = {3, 3, 3};
    c.kv_lens = {3, 65, 130};
    b.add(c, absorbed_stem(c, "any_heads"));
  }
  // Causal with fewer keys than queries (FlashMLA's bottom-right mask): the first queries of a
  // request see no key (o 0, lse -inf), a request without keys none at all.
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "verify", 9, 16);
    c.q_lens = {4, 3, 2, 5};
    c.kv_lens = {1, 0, 2, 17};
    b.add(c, absorbed_stem(c, "short_causal"));
  }
  if (scope != ConformanceScope::kSlow) return;
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "decode", 128, 64);
    c.q_lens = {1, 1};
    c.kv_lens = {4096, 3001};
    b.add(c, absorbed_stem(c, "long_context"));
  }
  {
    ConformanceCase c = attn(OpKind::kAbsorbed, "extend", 16, 1);
    c.q_lens = {700};
    c.kv_lens = {700};
    b.add(c, absorbed_stem(c, "long_q"));
  }
}

void add_mha(Builder& b, ConformanceScope scope) {
  const bool full = scope != ConformanceScope::kQuick;
  auto stem = [](const ConformanceCase& c, std::string_view extra) {
    return fmt::format("mha/{}/h{}/bs{}/{}", c.mode, c.num_heads, c.q_lens.size(), extra);
  };
  for (int h : full ? std::vector<int>{16, 32, 64, 128} : std::vector<int>{16, 128}) {
    ConformanceCase c = attn(OpKind::kMha, "extend", h, 1);
    c.q_lens = h >= 64 ? std::vector<int32_t>{1, 17, 33} : std::vector<int32_t>{1, 17, 64};
    c.kv_lens = c.q_lens;
    b.add(c, stem(c, "causal_no_prefix"));
  }
  {
    ConformanceCase c = attn(OpKind::kMha, "extend_prefix", full ? 32 : 16, 1);
    c.q_lens = {10, 5, 0};
    c.kv_lens = {40, 5, 12};
    b.add(c, stem(c, "causal_one_shot"));
  }
  {
    ConformanceCase c = attn(OpKind::kMha, "chunk", 16, 1);
    c.causal = false;
    c.q_lens = {7, 3, 5};
    c.kv_lens = {16, 0, 9};
    b.add(c, stem(c, "noncausal_kv0_row"));
    // The chunked prefix path: a chunk's attention merged into the state of earlier passes.
    c.merge_into_output = true;
    b.add(c, stem(c, "noncausal_kv0_row_merge"));
  }
  if (!full) return;
  {
    ConformanceCase c = attn(OpKind::kMha, "chunk", 128, 1);
    c.causal = false;
    c.merge_into_output = true;
    c.q_lens = {130, 1, 64};
    c.kv_lens = {200, 0, 129};
    b.add(c, stem(c, "noncausal_merge_multi_tile"));
  }
  {
    ConformanceCase c = attn(OpKind::kMha, "extend", 32, 1);
    c.merge_into_output = true;
    c.q_lens = {20, 1, 0};
    c.kv_lens = {150, 1, 7};
    b.add(c, stem(c, "causal_merge"));
  }
  {
    ConformanceCase c = attn(OpKind::kMha, "chunk", 128, 1);
    c.causal = false;
    c.q_lens = {4, 6};
    c.kv_lens = {0, 23};
    c.capacity_factor = 3;
    b.add(c, stem(c, "noncausal_kv0_row_cap3"));
  }
  {
    ConformanceCase c = attn(OpKind::kMha, "extend", 16, 1);
    c.q_lens = {160};
    c.kv_lens = {160};
    b.add(c, stem(c, "long_q"));
  }
  {
    ConformanceCase c = attn(OpKind::kMha, "extend", 16, 1);
    c.q_lens.assign(66, 0);
    b.add(c, stem(c, "large_batch"), [](ConformanceCase& c, Rng& r) {
      for (auto& q : c.q_lens) {
        q = static_cast<int32_t>(r.uniform_int(0, 6));
        c.kv_lens.push_back(q + static_cast<int32_t>(r.uniform_int(0, 6)));
      }
    });
  }
  if (scope != ConformanceScope::kSlow) return;
  {
    ConformanceCase c = attn(OpKind::kMha, "extend", 128, 1);
    c.q_lens = {300};
    c.kv_lens = {300};
    b.add(c, stem(c, "long_q"));
  }
}

void add_small_ops(Builder& b, ConformanceScope scope) {
  const bool full = scope != ConformanceScope::kQuick;
  for (auto [h, dim, t] : full ? std::vector<std::tuple<int, int, int>>{{16, 128, 33},
                                                                        {16, 512, 9},
                                                                        {128, 512, 3},
                                                                        {64, 128, 5}}
                               : std::vector<std::tuple<int, int, int>>{{16, 128, 33}}) {
    ConformanceCase c;
    c.op = OpKind::kMerge;
    c.mode = "merge";
    c.num_heads = h;
    c.merge_dim = dim;
    c.num_tokens = t;
    b.add(c, fmt::format("merge/h{}/d{}/t{}/inf_rows", h, dim, t));
  }
  for (DType dt : {DType::kBF16, DType::kFP8E4M3}) {
    for (int p : full ? std::vector<int>{1, 16, 128} : std::vector<int>{16}) {
      ConformanceCase c;
      c.op = OpKind::kKvWrite;
      c.mode = "kv_write";
      c.page_size = p;
      c.cache_dtype = dt;
      c.k_scale = dt == DType::kFP8E4M3 ? kFp8Scale : kIgnoredScale;
      c.num_tokens = full ? 61 : 13;
      c.src_row_stride = p == 16 ? 576 : 512;
      b.add(c, fmt::format("kv_write/p{}/t{}/{}{}", p, c.num_tokens, dtype_tag(dt, c.k_scale),
                           c.src_row_stride != 512 ? "/strided" : ""));
    }
  }
  for (DType dt : {DType::kBF16, DType::kFP8E4M3}) {
    // 128 heads once (bf16); the weights alone are 16 M values, so fp8 uses 64.
    for (int h :
         full ? std::vector<int>{16, dt == DType::kBF16 ? 128 : 64} : std::vector<int>{16}) {
      ConformanceCase c = attn(OpKind::kUpProject, "up_project", h, 16, dt);
      if (dt == DType::kBF16) c.k_scale = kIgnoredScale;
      c.kv_lens = h >= 64 ? std::vector<int32_t>{5, 3} : std::vector<int32_t>{17, 1, 9};
      b.add(c, fmt::format("up_project/h{}/p16/n{}/{}", h,
                           c.kv_lens[0] + c.kv_lens[1] + (c.kv_lens.size() > 2 ? c.kv_lens[2] : 0),
                           dtype_tag(dt, c.k_scale)));
    }
  }
  struct Gemm {
    const char* tag;
    int k, n;
    bool transpose;
    int64_t xs, ys;
  };
  const std::vector<Gemm> gemms = {{"q_abs", 128, 512, false, 192, 576},
                                   {"o_proj", 512, 128, true, 0, 0},
                                   {"dense", 64, 48, false, 0, 0},
                                   {"dense_t", 40, 24, true, 0, 0}};
  for (const Gemm& g : gemms) {
    for (int h : full ? std::vector<int>{16, g.transpose ? 128 : 64} : std::vector<int>{16}) {
      if (!full && g.tag[0] == 'd') continue;
      ConformanceCase c;
      c.op = OpKind::kHeadGemm;
      c.mode = "head_gemm";
      c.num_heads = h;
      c.num_tokens = h >= 64 ? 3 : 9;
      c.gemm_k = g.k;
      c.gemm_n = g.n;
      c.transpose_w = g.transpose;
      c.x_row_stride = g.xs;
      c.y_row_stride = g.ys;
      b.add(c, fmt::format("head_gemm/{}/h{}/t{}", g.tag, h, c.num_tokens));
    }
  }
}

}  // namespace

std::string_view op_kind_name(OpKind op) {
  switch (op) {
    case OpKind::kAbsorbed:
      return "absorbed";
    case OpKind::kMha:
      return "mha";
    case OpKind::kMerge:
      return "merge";
    case OpKind::kKvWrite:
      return "kv_write";
    case OpKind::kUpProject:
      return "up_project";
    case OpKind::kHeadGemm:
      return "head_gemm";
  }
  return "?";
}

uint64_t base_seed() {
  if (const char* s = std::getenv("MLA_TEST_SEED"); s != nullptr && *s != '\0') {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(s, &end, 10);
    if (end != nullptr && *end == '\0') return v;
  }
  return kDefaultBaseSeed;
}

std::vector<ConformanceCase> conformance_cases(ConformanceScope scope) {
  Builder b(base_seed());
  add_absorbed(b, scope);
  add_mha(b, scope);
  add_small_ops(b, scope);
  return b.take();
}

}  // namespace mla::testing
