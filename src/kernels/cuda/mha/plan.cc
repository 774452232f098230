#include "kernels/cuda/mha/plan.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cuda/mha/params.h"
#include "kernels/cuda/mha/traits.h"

namespace mla::cuda::mha {

int64_t max_tiles(const AttnCapacity& cap) {
  return (cap.max_q_tokens + MhaTraits::kBlockM - 1) / MhaTraits::kBlockM + cap.max_batch;
}

std::size_t plan_bytes(const AttnCapacity& cap) {
  return sizeof(MhaPlanHeader) + static_cast<std::size_t>(max_tiles(cap)) * sizeof(MhaTile);
}

StatusOr<std::size_t> build_plan(const MhaProblem& problem, const AttnCapacity& cap,
                                 std::span<std::byte> host_plan) {
  const auto& qo = problem.qo_indptr;
  const auto& kv = problem.kv_indptr;
  MLA_CHECK_ARG(problem.num_heads >= 1, "mha plan: num_heads = {} must be positive",
                problem.num_heads);
  MLA_CHECK_ARG(!qo.empty() && qo.size() == kv.size(),
                "mha plan: qo_indptr has {} entries and kv_indptr {}; both must be bs + 1 >= 1",
                qo.size(), kv.size());
  const int64_t bs = static_cast<int64_t>(qo.size()) - 1;
  MLA_CHECK_ARG(bs <= cap.max_batch, "mha plan: batch size {} exceeds capacity max_batch {}", bs,
                cap.max_batch);
  MLA_CHECK_ARG(qo[0] >= 0 && kv[0] >= 0, "mha plan: qo_indptr[0] = {} and kv_indptr[0] = {}",
                qo[0], kv[0]);
  for (int64_t b = 0; b < bs; ++b) {
    MLA_CHECK_ARG(qo[b + 1] >= qo[b], "mha plan: qo_indptr[{}] = {} < qo_indptr[{}] = {}", b + 1,
                  qo[b + 1], b, qo[b]);
    MLA_CHECK_ARG(kv[b + 1] >= kv[b], "mha plan: kv_indptr[{}] = {} < kv_indptr[{}] = {}", b + 1,
                  kv[b + 1], b, kv[b]);
  }
  const int64_t q_tokens = qo[bs] - qo[0];
  const int64_t kv_tokens = kv[bs] - kv[0];
  MLA_CHECK_ARG(q_tokens <= cap.max_q_tokens,
                "mha plan: {} query tokens exceed capacity max_q_tokens {}", q_tokens,
                cap.max_q_tokens);
  MLA_CHECK_ARG(cap.max_kv_tokens <= 0 || kv_tokens <= cap.max_kv_tokens,
                "mha plan: {} kv tokens exceed capacity max_kv_tokens {}", kv_tokens,
                cap.max_kv_tokens);

  std::vector<MhaTile> tiles;
  tiles.reserve(static_cast<std::size_t>(q_tokens / MhaTraits::kBlockM + bs));
  for (int64_t b = 0; b < bs; ++b) {
    const int32_t q_len = qo[b + 1] - qo[b];
    const int32_t kv_len = kv[b + 1] - kv[b];
    for (int32_t off = 0; off < q_len; off += MhaTraits::kBlockM) {
      MhaTile t{};
      t.q_start = qo[b] + off;
      t.q_rows = std::min<int32_t>(MhaTraits::kBlockM, q_len - off);
      t.kv_start = kv[b];
      t.kv_len = kv_len;
      t.diag = problem.causal ? kv_len - q_len + off : kNoDiag;
      tiles.push_back(t);
    }
  }
  const auto keys_needed = [](const MhaTile& t) {
    return t.diag == kNoDiag ? t.kv_len : std::clamp(t.diag + t.q_rows, 0, t.kv_len);
  };
  std::stable_sort(tiles.begin(), tiles.end(), [&](const MhaTile& a, const MhaTile& b) {
    return keys_needed(a) > keys_needed(b);
  });

  const std::size_t bytes = sizeof(MhaPlanHeader) + tiles.size() * sizeof(MhaTile);
  MLA_CHECK_ARG(static_cast<int64_t>(tiles.size()) <= max_tiles(cap),
                "mha plan: {} tiles exceed the capacity's {}", tiles.size(), max_tiles(cap));
  MLA_CHECK_CODE(StatusCode::kOutOfWorkspace, bytes <= host_plan.size(),
                 "mha plan: needs {} bytes, host_plan has {}", bytes, host_plan.size());
  MhaPlanHeader header{};
  header.num_tiles = static_cast<int32_t>(tiles.size());
  header.num_heads = problem.num_heads;
  header.batch_size = static_cast<int32_t>(bs);
  // The CTAs running at once cover tiles of every request (heaviest first) and head_group heads:
  // about 64K (causal: a tile reads up to its diagonal, half its request's keys on average) or
  // 32K (non-causal) keys x heads in flight keep them in L2. Measured on the H200, 2026-12-03
  // (bench/results/h200.jsonl, run 2 of branch mha): causal b1 s4096 16 best of 16/8/4/2, b4 s2048
  // 8 best of 16/8/4, b1 s16384 4 best of 4/2/1; the chunked extend's 32K-key chunks 1 or 2
  // better than 4.
  const int64_t budget = problem.causal ? 65536 : 32768;
  header.head_group =
      static_cast<int32_t>(std::clamp<int64_t>(budget / std::max<int64_t>(kv_tokens, 1), 1, 16));
  std::memcpy(host_plan.data(), &header, sizeof(header));
  if (!tiles.empty()) {
    std::memcpy(host_plan.data() + sizeof(header), tiles.data(), tiles.size() * sizeof(MhaTile));
  }
  return bytes;
}

}  // namespace mla::cuda::mha
