// Absorbed (MQA) paged attention on the cpu. One KV head is shared by all H heads, so each work
// item (request, q-row tile, head block) converts a block of cached rows to fp32 once and runs
// every (query row, head) of the item against it with an online softmax (fp32 throughout).
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/parallel.h"
#include "kernels/cpu/cpu_common.h"
#include "mla/kv_pool.h"
#include "mla/model.h"

namespace mla::cpu {
namespace {

constexpr int kLatent = kLatentDim;
constexpr int kRank = kKvLoraRank;
constexpr int kMaxRows = 64;   // (query row, head) pairs per work item
constexpr int kKeyBlock = 64;  // cached rows converted per step: 64 x 576 x 4 = 144 KiB

struct PlanView {
  const PlanHeader* header;
  const int32_t* req_rows;   // [bs]
  const int32_t* q_lens;     // [bs]
  const int32_t* kv_lens;    // [bs]
  const int32_t* qo_indptr;  // [bs + 1]
};

std::size_t plan_size(int max_batch) {
  Carver c("cpu absorbed workspace");
  (void)c.take<PlanHeader>("header", 1);
  (void)c.take<int32_t>("arrays", 4 * static_cast<std::size_t>(max_batch) + 1);
  return c.aligned_bytes();
}

PlanView view_plan(const void* plan) {
  const auto* base = static_cast<const std::byte*>(plan);
  PlanView v;
  v.header = reinterpret_cast<const PlanHeader*>(base);
  const auto* arr = reinterpret_cast<const int32_t*>(base + 256);
  const int bs = v.header->batch_size;
  v.req_rows = arr;
  v.q_lens = arr + bs;
  v.kv_lens = arr + 2 * bs;
  v.qo_indptr = arr + 3 * bs;
  return v;
}

// Per-thread scratch of one work item.
struct Scratch {
  float* q;       // [kMaxRows, 576]
  float* kv;      // [kKeyBlock, 576]
  float* logits;  // [kMaxRows, kKeyBlock]
  float* acc;     // [kMaxRows, 512]
  float* m;       // [kMaxRows]
  float* l;       // [kMaxRows]
  int* visible;   // [kMaxRows]
};

StatusOr<Scratch> carve_scratch(Carver& c) {
  Scratch s;
  MLA_ASSIGN_OR_RETURN(s.q, c.take<float>("absorbed.q", kMaxRows * kLatent));
  MLA_ASSIGN_OR_RETURN(s.kv, c.take<float>("absorbed.kv", kKeyBlock * kLatent));
  MLA_ASSIGN_OR_RETURN(s.logits, c.take<float>("absorbed.logits", kMaxRows * kKeyBlock));
  MLA_ASSIGN_OR_RETURN(s.acc, c.take<float>("absorbed.acc", kMaxRows * kRank));
  MLA_ASSIGN_OR_RETURN(s.m, c.take<float>("absorbed.m", kMaxRows));
  MLA_ASSIGN_OR_RETURN(s.l, c.take<float>("absorbed.l", kMaxRows));
  MLA_ASSIGN_OR_RETURN(s.visible, c.take<int>("absorbed.visible", kMaxRows));
  return s;
}

// Work-item geometry: rows of one item are (q row j in [j0, j0 + q_tile), head in block).
struct Tiling {
  int head_block = 16;
  int q_tile = 4;
  int head_blocks(int h) const { return (h + head_block - 1) / head_block; }
};

class CpuAbsorbedOp final : public AbsorbedAttentionOp {
 public:
  Status supports(int num_heads, int page_size, DType cache_dtype) const override {
    if (num_heads < 1) return unsupported("cpu absorbed: num_heads {} < 1", num_heads);
    if (!is_supported_page_size(page_size)) {
      return unsupported("cpu absorbed: page_size {} not in {{{}}}", page_size, page_sizes_text());
    }
    if (!is_supported_cache_dtype(cache_dtype)) {
      return unsupported("cpu absorbed: cache dtype {} (bf16 or fp8e4m3)", dtype_name(cache_dtype));
    }
    return Status::Ok();
  }

  std::size_t plan_bytes(const AttnCapacity& cap) const override {
    return plan_size(std::max(cap.max_batch, 0));
  }

  std::size_t workspace_bytes(const AttnCapacity& cap) const override {
    Carver c("cpu absorbed workspace");
    (void)c.take<int64_t>("absorbed.item_start", static_cast<std::size_t>(cap.max_batch) + 1);
    for (int t = 0; t < parallel_num_threads(); ++t) (void)carve_scratch(c);
    return c.aligned_bytes();
  }

  StatusOr<std::size_t> plan(const AbsorbedProblem& p, const AttnCapacity& cap,
                             std::span<std::byte> host_plan) const override {
    MLA_RETURN_IF_ERROR(check_absorbed_problem(p, cap));  // the shared rule (ops.h)
    const int bs = static_cast<int>(p.req_rows.size());
    const std::size_t need = plan_size(bs);
    MLA_CHECK_ARG(host_plan.size() >= need, "absorbed plan: host_plan has {} bytes, need {}",
                  host_plan.size(), need);
    int64_t total_q = 0, total_kv = 0;
    int32_t max_q = 0, max_kv = 0;
    for (int b = 0; b < bs; ++b) {
      const int32_t q = p.q_lens[b], kv = p.kv_lens[b];
      total_q += q;
      total_kv += kv;
      max_q = std::max(max_q, q);
      max_kv = std::max(max_kv, kv);
    }
    auto* base = host_plan.data();
    PlanHeader h;
    h.magic = kAbsorbedPlanMagic;
    h.batch_size = bs;
    h.num_heads = p.num_heads;
    h.page_size = p.page_size;
    h.causal = p.causal ? 1 : 0;
    h.total_q = total_q;
    h.total_kv = total_kv;
    h.max_q_len = max_q;
    h.max_kv_len = max_kv;
    std::memcpy(base, &h, sizeof(h));
    auto* arr = reinterpret_cast<int32_t*>(base + 256);
    int32_t acc = 0;
    for (int b = 0; b < bs; ++b) {
      arr[b] = p.req_rows[b];
      arr[bs + b] = p.q_lens[b];
      arr[2 * bs + b] = p.kv_lens[b];
      arr[3 * bs + b] = acc;
      acc += p.q_lens[b];
    }
    arr[4 * bs] = acc;
    return need;
  }

  Status run(const AbsorbedArgs& a, const ExecContext& ctx) const override {
    MLA_CHECK_ARG(ctx.device.is_cpu(), "cpu absorbed: exec context is {}", ctx.device.to_string());
    MLA_CHECK_ARG(a.plan != nullptr, "cpu absorbed: plan is null");
    const PlanView pv = view_plan(a.plan);
    const PlanHeader& h = *pv.header;
    MLA_CHECK_ARG(h.magic == kAbsorbedPlanMagic,
                  "cpu absorbed: plan magic {:#x} is not an absorbed plan", h.magic);
    const int hc = h.num_heads, bs = h.batch_size;
    const Device dev = Device::cpu();
    const int64_t t = h.total_q;
    // Row counts may exceed the plan's tokens (capacity-sized buffers); the plan's rows are used.
    MLA_RETURN_IF_ERROR(expect_tensor(a.q, "q", DType::kBF16, {-1, hc, kLatent}, dev, false));
    MLA_CHECK_ARG(a.q.shape[0] >= t, "q: {} rows, plan has {} query tokens", a.q.shape[0], t);
    MLA_RETURN_IF_ERROR(expect_inner_dense(a.q, "q"));
    MLA_CHECK_ARG(a.kv_cache.dtype == DType::kBF16 || a.kv_cache.dtype == DType::kFP8E4M3,
                  "kv_cache: dtype {} is neither bf16 nor fp8e4m3", dtype_name(a.kv_cache.dtype));
    MLA_RETURN_IF_ERROR(
        expect_tensor(a.kv_cache, "kv_cache", a.kv_cache.dtype, {-1, kLatent}, dev, false));
    MLA_RETURN_IF_ERROR(expect_inner_dense(a.kv_cache, "kv_cache"));
    MLA_ASSIGN_OR_RETURN(const PageTable table, absorbed_page_table(a, dev));
    MLA_RETURN_IF_ERROR(expect_tensor(a.o, "o", DType::kBF16, {-1, hc, kRank}, dev, false));
    MLA_CHECK_ARG(a.o.shape[0] >= t, "o: {} rows, plan has {} query tokens", a.o.shape[0], t);
    MLA_RETURN_IF_ERROR(expect_inner_dense(a.o, "o"));
    const bool want_lse = a.lse.data != nullptr;
    if (want_lse) {
      MLA_RETURN_IF_ERROR(expect_tensor(a.lse, "lse", DType::kF32, {-1, hc}, dev, false));
      MLA_CHECK_ARG(a.lse.shape[0] >= t, "lse: {} rows, plan has {} query tokens", a.lse.shape[0],
                    t);
    }
    if (a.kv_cache.dtype == DType::kFP8E4M3) {
      MLA_CHECK_ARG(std::isfinite(a.k_scale) && a.k_scale > 0.f,
                    "k_scale = {} must be positive for an fp8 cache", a.k_scale);
    }

    // Every slot the plan reads must be inside the cache.
    const int64_t num_slots = a.kv_cache.shape[0];
    const int page_size = h.page_size;
    // The table's shape first (the rule every op set shares: check_table_extents), then every
    // entry read, which only a host table lets us see.
    MLA_RETURN_IF_ERROR(check_table_extents(
        table,
        absorbed_table_extents({pv.req_rows, static_cast<std::size_t>(bs)},
                               {pv.kv_lens, static_cast<std::size_t>(bs)}, page_size),
        page_size));
    for (int b = 0; b < bs; ++b) {
      const int32_t row = pv.req_rows[b];
      for (int64_t i = 0; i < pv.kv_lens[b]; ++i) {
        const int64_t slot = table.slot(row, i, page_size);
        MLA_CHECK_ARG(slot >= 0 && slot < num_slots,
                      "{}: slot {} of token {} of request {} (row {}) outside kv_cache slots "
                      "[0, {})",
                      table.name, slot, i, b, row, num_slots);
      }
    }

    Carver carver("cpu absorbed workspace", a.workspace, a.workspace_bytes);
    MLA_ASSIGN_OR_RETURN(int64_t * item_start, carver.take<int64_t>("absorbed.item_start", bs + 1));
    const int threads = parallel_num_threads();
    // Per-thread scratch follows item_start, one block per worker id; check it fits once here.
    Carver probe = carver;
    for (int i = 0; i < threads; ++i) MLA_RETURN_IF_ERROR(carve_scratch(probe).status());

    // Tiling: 16-head blocks, q tiles filling kMaxRows; smaller head blocks when there would be
    // fewer than two items per thread (decode of a single request).
    Tiling tl;
    tl.head_block = std::min(hc, 16);
    auto count_items = [&](const Tiling& x) {
      int64_t n = 0;
      for (int b = 0; b < bs; ++b) {
        n += static_cast<int64_t>((pv.q_lens[b] + x.q_tile - 1) / x.q_tile) * x.head_blocks(hc);
      }
      return n;
    };
    tl.q_tile = std::max(1, kMaxRows / tl.head_block);
    while (tl.head_block > 4 && count_items(tl) < 2 * threads) {
      tl.head_block /= 2;
      tl.q_tile = std::max(1, kMaxRows / tl.head_block);
      if (count_items(tl) >= 2 * threads) break;
    }
    item_start[0] = 0;
    for (int b = 0; b < bs; ++b) {
      item_start[b + 1] =
          item_start[b] +
          static_cast<int64_t>((pv.q_lens[b] + tl.q_tile - 1) / tl.q_tile) * tl.head_blocks(hc);
    }
    const int64_t items = item_start[bs];
    const std::array<float, 256> lut = fp8_table(a.k_scale);
    const DType cdt = a.kv_cache.dtype;
    const int64_t cache_stride = a.kv_cache.stride[0];
    const float scale = a.sm_scale;

    parallel_for_chunks(0, items, 1, [&](int64_t i0, int64_t i1, int worker) {
      Carver mine = carver;
      Scratch s{};
      for (int w = 0; w <= worker; ++w) s = *carve_scratch(mine);  // fits: checked above
      for (int64_t item = i0; item < i1; ++item) {
        const int b =
            static_cast<int>(std::upper_bound(item_start, item_start + bs + 1, item) - item_start) -
            1;
        const int64_t local = item - item_start[b];
        const int hb_count = tl.head_blocks(hc);
        const int j0 = static_cast<int>(local / hb_count) * tl.q_tile;
        const int h0 = static_cast<int>(local % hb_count) * tl.head_block;
        const int q_len = pv.q_lens[b], kv_len = pv.kv_lens[b];
        const int nj = std::min(tl.q_tile, q_len - j0), nh = std::min(tl.head_block, hc - h0);
        const int rows = nj * nh;
        // Keys each row may see, and the furthest any row sees.
        int kv_end = 0;
        for (int j = 0; j < nj; ++j) {
          const int lim = h.causal ? std::clamp(kv_len - q_len + j0 + j + 1, 0, kv_len) : kv_len;
          kv_end = std::max(kv_end, lim);
        }
        for (int j = 0; j < nj; ++j) {
          const int64_t tok = pv.qo_indptr[b] + j0 + j;
          for (int hh = 0; hh < nh; ++hh) {
            const int r = j * nh + hh;
            const uint16_t* src =
                a.q.ptr<uint16_t>() + tok * a.q.stride[0] + (h0 + hh) * a.q.stride[1];
            bf16_row_to_float(src, kLatent, s.q + static_cast<int64_t>(r) * kLatent);
            s.m[r] = -std::numeric_limits<float>::infinity();
            s.l[r] = 0.f;
            std::fill(s.acc + static_cast<int64_t>(r) * kRank,
                      s.acc + static_cast<int64_t>(r + 1) * kRank, 0.f);
          }
        }
        for (int k0 = 0; k0 < kv_end; k0 += kKeyBlock) {
          const int nk = std::min(kKeyBlock, kv_end - k0);
          for (int i = 0; i < nk; ++i) {
            const int64_t slot = table.slot(pv.req_rows[b], k0 + i, page_size);
            cache_row_to_float(a.kv_cache.data, cdt, slot, cache_stride, kLatent, lut.data(),
                               s.kv + static_cast<int64_t>(i) * kLatent);
          }
          for (int j = 0; j < nj; ++j) {
            const int lim = h.causal ? std::clamp(kv_len - q_len + j0 + j + 1, 0, kv_len) : kv_len;
            for (int hh = 0; hh < nh; ++hh) s.visible[j * nh + hh] = std::clamp(lim - k0, 0, nk);
          }
          attend_block(s.q, kLatent, rows, kLatent, s.kv, kLatent, s.kv, kLatent, kRank, nk,
                       s.visible, scale, s.logits, s.acc, s.m, s.l);
        }
        for (int j = 0; j < nj; ++j) {
          const int64_t tok = pv.qo_indptr[b] + j0 + j;
          for (int hh = 0; hh < nh; ++hh) {
            const int r = j * nh + hh;
            uint16_t* o = a.o.ptr<uint16_t>() + tok * a.o.stride[0] + (h0 + hh) * a.o.stride[1];
            float* lse =
                want_lse ? a.lse.ptr<float>() + tok * a.lse.stride[0] + (h0 + hh) * a.lse.stride[1]
                         : nullptr;
            finish_row(s.acc + static_cast<int64_t>(r) * kRank, s.m[r], s.l[r], kRank, o, lse);
          }
        }
      }
    });
    return Status::Ok();
  }
};

}  // namespace

std::shared_ptr<const AbsorbedAttentionOp> make_absorbed_op() {
  return std::make_shared<CpuAbsorbedOp>();
}

}  // namespace mla::cpu
