// Ragged MHA attention on the cpu (head dims 192 for q/k, 128 for v), fp32 online softmax.
// Work items are (request, 64-row q tile, head): each converts its head's K/V blocks once and
// reuses them for every query row of the tile.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/parallel.h"
#include "kernels/cpu/cpu_common.h"
#include "mla/model.h"

namespace mla::cpu {
namespace {

constexpr int kDqk = kQkHeadDim;
constexpr int kDv = kVHeadDim;
constexpr int kQTile = 64;
constexpr int kKeyBlock = 64;

std::size_t plan_size(int max_batch) {
  Carver c("cpu mha workspace");
  (void)c.take<PlanHeader>("header", 1);
  (void)c.take<int32_t>("indptrs", 2 * (static_cast<std::size_t>(max_batch) + 1));
  return c.aligned_bytes();
}

struct Scratch {
  float* q;       // [kQTile, 192]
  float* k;       // [kKeyBlock, 192]
  float* v;       // [kKeyBlock, 128]
  float* logits;  // [kQTile, kKeyBlock]
  float* acc;     // [kQTile, 128]
  float* m;       // [kQTile]
  float* l;       // [kQTile]
  int* visible;   // [kQTile]
};

StatusOr<Scratch> carve_scratch(Carver& c) {
  Scratch s;
  MLA_ASSIGN_OR_RETURN(s.q, c.take<float>("mha.q", kQTile * kDqk));
  MLA_ASSIGN_OR_RETURN(s.k, c.take<float>("mha.k", kKeyBlock * kDqk));
  MLA_ASSIGN_OR_RETURN(s.v, c.take<float>("mha.v", kKeyBlock * kDv));
  MLA_ASSIGN_OR_RETURN(s.logits, c.take<float>("mha.logits", kQTile * kKeyBlock));
  MLA_ASSIGN_OR_RETURN(s.acc, c.take<float>("mha.acc", kQTile * kDv));
  MLA_ASSIGN_OR_RETURN(s.m, c.take<float>("mha.m", kQTile));
  MLA_ASSIGN_OR_RETURN(s.l, c.take<float>("mha.l", kQTile));
  MLA_ASSIGN_OR_RETURN(s.visible, c.take<int>("mha.visible", kQTile));
  return s;
}

class CpuMhaOp final : public MhaAttentionOp {
 public:
  Status supports(int num_heads) const override {
    if (num_heads < 1) return unsupported("cpu mha: num_heads {} < 1", num_heads);
    return Status::Ok();
  }
  std::size_t plan_bytes(const AttnCapacity& cap) const override {
    return plan_size(std::max(cap.max_batch, 0));
  }
  std::size_t workspace_bytes(const AttnCapacity& cap) const override {
    Carver c("cpu mha workspace");
    (void)c.take<int64_t>("mha.item_start", static_cast<std::size_t>(cap.max_batch) + 1);
    for (int t = 0; t < parallel_num_threads(); ++t) (void)carve_scratch(c);
    return c.aligned_bytes();
  }

  StatusOr<std::size_t> plan(const MhaProblem& p, const AttnCapacity& cap,
                             std::span<std::byte> host_plan) const override {
    MLA_CHECK_ARG(!p.qo_indptr.empty() && p.qo_indptr.size() == p.kv_indptr.size(),
                  "mha plan: qo_indptr has {} entries, kv_indptr {} (both bs + 1)",
                  p.qo_indptr.size(), p.kv_indptr.size());
    const int bs = static_cast<int>(p.qo_indptr.size()) - 1;
    MLA_CHECK_ARG(p.num_heads == cap.num_heads, "mha plan: num_heads {} != capacity {}",
                  p.num_heads, cap.num_heads);
    MLA_RETURN_IF_ERROR(supports(p.num_heads));
    MLA_CHECK_ARG(bs <= cap.max_batch, "mha plan: batch size {} exceeds capacity {}", bs,
                  cap.max_batch);
    MLA_CHECK_ARG(p.qo_indptr[0] == 0 && p.kv_indptr[0] == 0,
                  "mha plan: qo_indptr[0] = {} and kv_indptr[0] = {} must be 0", p.qo_indptr[0],
                  p.kv_indptr[0]);
    int32_t max_q = 0, max_kv = 0;
    for (int b = 0; b < bs; ++b) {
      const int32_t q = p.qo_indptr[b + 1] - p.qo_indptr[b];
      const int32_t kv = p.kv_indptr[b + 1] - p.kv_indptr[b];
      MLA_CHECK_ARG(q >= 0 && kv >= 0, "mha plan: request {} has q_len {} and kv_len {}", b, q, kv);
      MLA_CHECK_ARG(!p.causal || kv >= q, "mha plan: causal request {} has kv_len {} < q_len {}", b,
                    kv, q);
      max_q = std::max(max_q, q);
      max_kv = std::max(max_kv, kv);
    }
    MLA_CHECK_ARG(p.qo_indptr[bs] <= cap.max_q_tokens,
                  "mha plan: {} query tokens exceed capacity max_q_tokens {}", p.qo_indptr[bs],
                  cap.max_q_tokens);
    MLA_CHECK_ARG(p.kv_indptr[bs] <= cap.max_kv_tokens,
                  "mha plan: {} kv tokens exceed capacity max_kv_tokens {}", p.kv_indptr[bs],
                  cap.max_kv_tokens);
    const std::size_t need = plan_size(bs);
    MLA_CHECK_ARG(host_plan.size() >= need, "mha plan: host_plan has {} bytes, need {}",
                  host_plan.size(), need);
    PlanHeader h;
    h.magic = kMhaPlanMagic;
    h.batch_size = bs;
    h.num_heads = p.num_heads;
    h.causal = p.causal ? 1 : 0;
    h.total_q = p.qo_indptr[bs];
    h.total_kv = p.kv_indptr[bs];
    h.max_q_len = max_q;
    h.max_kv_len = max_kv;
    std::memcpy(host_plan.data(), &h, sizeof(h));
    auto* arr = reinterpret_cast<int32_t*>(host_plan.data() + 256);
    std::copy(p.qo_indptr.begin(), p.qo_indptr.end(), arr);
    std::copy(p.kv_indptr.begin(), p.kv_indptr.end(), arr + bs + 1);
    return need;
  }

  Status run(const MhaArgs& a, const ExecContext& ctx) const override {
    MLA_CHECK_ARG(ctx.device.is_cpu(), "cpu mha: exec context is {}", ctx.device.to_string());
    MLA_CHECK_ARG(a.plan != nullptr, "cpu mha: plan is null");
    const auto* base = static_cast<const std::byte*>(a.plan);
    const auto& h = *reinterpret_cast<const PlanHeader*>(base);
    MLA_CHECK_ARG(h.magic == kMhaPlanMagic, "cpu mha: plan magic {:#x} is not an mha plan",
                  h.magic);
    const int32_t* qo = reinterpret_cast<const int32_t*>(base + 256);  // [bs + 1]
    const int32_t* kvp = qo + h.batch_size + 1;                        // [bs + 1]
    const int hc = h.num_heads, bs = h.batch_size;
    const Device dev = Device::cpu();
    MLA_RETURN_IF_ERROR(expect_tensor(a.q, "q", DType::kBF16, {-1, hc, kDqk}, dev, false));
    MLA_RETURN_IF_ERROR(expect_tensor(a.k, "k", DType::kBF16, {-1, hc, kDqk}, dev, false));
    MLA_RETURN_IF_ERROR(expect_tensor(a.v, "v", DType::kBF16, {-1, hc, kDv}, dev, false));
    MLA_RETURN_IF_ERROR(expect_tensor(a.o, "o", DType::kBF16, {-1, hc, kDv}, dev, false));
    for (const auto* t : {&a.q, &a.k, &a.v, &a.o})
      MLA_RETURN_IF_ERROR(expect_inner_dense(*t, "q/k/v/o"));
    MLA_CHECK_ARG(a.q.shape[0] >= h.total_q && a.o.shape[0] >= h.total_q,
                  "q has {} rows and o {}, plan has {} query tokens", a.q.shape[0], a.o.shape[0],
                  h.total_q);
    MLA_CHECK_ARG(a.k.shape[0] >= h.total_kv && a.v.shape[0] >= h.total_kv,
                  "k has {} rows and v {}, plan has {} kv tokens", a.k.shape[0], a.v.shape[0],
                  h.total_kv);
    const bool want_lse = a.lse.data != nullptr;
    MLA_CHECK_ARG(want_lse || !a.merge_into_output,
                  "cpu mha: merge_into_output needs lse (the state merged into), lse is null");
    if (want_lse) {
      MLA_RETURN_IF_ERROR(expect_tensor(a.lse, "lse", DType::kF32, {-1, hc}, dev, false));
      MLA_CHECK_ARG(a.lse.shape[0] >= h.total_q, "lse: {} rows, plan has {} query tokens",
                    a.lse.shape[0], h.total_q);
    }
    Carver carver("cpu mha workspace", a.workspace, a.workspace_bytes);
    MLA_ASSIGN_OR_RETURN(int64_t * item_start, carver.take<int64_t>("mha.item_start", bs + 1));
    Carver probe = carver;
    for (int i = 0; i < parallel_num_threads(); ++i)
      MLA_RETURN_IF_ERROR(carve_scratch(probe).status());
    item_start[0] = 0;
    for (int b = 0; b < bs; ++b) {
      item_start[b + 1] =
          item_start[b] + static_cast<int64_t>((qo[b + 1] - qo[b] + kQTile - 1) / kQTile) * hc;
    }
    const float scale = a.sm_scale;
    parallel_for_chunks(0, item_start[bs], 1, [&](int64_t i0, int64_t i1, int worker) {
      Carver mine = carver;
      Scratch s{};
      for (int w = 0; w <= worker; ++w) s = *carve_scratch(mine);  // fits: checked above
      for (int64_t item = i0; item < i1; ++item) {
        const int b =
            static_cast<int>(std::upper_bound(item_start, item_start + bs + 1, item) - item_start) -
            1;
        const int64_t local = item - item_start[b];
        const int head = static_cast<int>(local % hc);
        const int j0 = static_cast<int>(local / hc) * kQTile;
        const int q_len = qo[b + 1] - qo[b], kv_len = kvp[b + 1] - kvp[b];
        const int nj = std::min(kQTile, q_len - j0);
        auto limit = [&](int j) {
          return h.causal ? std::clamp(kv_len - q_len + j0 + j + 1, 0, kv_len) : kv_len;
        };
        int kv_end = 0;
        for (int j = 0; j < nj; ++j) {
          kv_end = std::max(kv_end, limit(j));
          const uint16_t* src =
              a.q.ptr<uint16_t>() + (qo[b] + j0 + j) * a.q.stride[0] + head * a.q.stride[1];
          bf16_row_to_float(src, kDqk, s.q + static_cast<int64_t>(j) * kDqk);
          s.m[j] = -std::numeric_limits<float>::infinity();
          s.l[j] = 0.f;
          std::fill(s.acc + static_cast<int64_t>(j) * kDv,
                    s.acc + static_cast<int64_t>(j + 1) * kDv, 0.f);
        }
        for (int k0 = 0; k0 < kv_end; k0 += kKeyBlock) {
          const int nk = std::min(kKeyBlock, kv_end - k0);
          for (int i = 0; i < nk; ++i) {
            const int64_t row = kvp[b] + k0 + i;
            bf16_row_to_float(a.k.ptr<uint16_t>() + row * a.k.stride[0] + head * a.k.stride[1],
                              kDqk, s.k + static_cast<int64_t>(i) * kDqk);
            bf16_row_to_float(a.v.ptr<uint16_t>() + row * a.v.stride[0] + head * a.v.stride[1], kDv,
                              s.v + static_cast<int64_t>(i) * kDv);
          }
          for (int j = 0; j < nj; ++j) s.visible[j] = std::clamp(limit(j) - k0, 0, nk);
          attend_block(s.q, kDqk, nj, kDqk, s.k, kDqk, s.v, kDv, kDv, nk, s.visible, scale,
                       s.logits, s.acc, s.m, s.l);
        }
        for (int j = 0; j < nj; ++j) {
          const int64_t tok = qo[b] + j0 + j;
          uint16_t* o = a.o.ptr<uint16_t>() + tok * a.o.stride[0] + head * a.o.stride[1];
          float* lse = want_lse
                           ? a.lse.ptr<float>() + tok * a.lse.stride[0] + head * a.lse.stride[1]
                           : nullptr;
          const float* acc = s.acc + static_cast<int64_t>(j) * kDv;
          if (a.merge_into_output) {
            merge_row(acc, s.m[j], s.l[j], kDv, o, lse);
          } else {
            finish_row(acc, s.m[j], s.l[j], kDv, o, lse);
          }
        }
      }
    });
    return Status::Ok();
  }
};

}  // namespace

std::shared_ptr<const MhaAttentionOp> make_mha_op() { return std::make_shared<CpuMhaOp>(); }

}  // namespace mla::cpu
