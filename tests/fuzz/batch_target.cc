// Fuzz target `batch`: validate_batch on a ForwardBatch built from the bytes (a consistent batch
// of a mode, then a few field mutations, so accepted and rejected batches both come up).
// Invariants: no crash or sanitizer report; the batch is unchanged; a rejection is
// kInvalidArgument naming a field; an accepted batch is safe to plan: rows, lengths and slots in
// range, token counts adding up, no request row twice; and the planners (chunked prefix over its
// prefixes, the CUDA absorbed planner over its q/kv lengths) accept it and cover every row and
// key exactly once.
#include <set>

#include "fuzz/fuzz_target.h"
#include "fuzz/plan_checks.h"
#include "mla/batch.h"

namespace {

bool same(const mla::ForwardBatch& a, const mla::ForwardBatch& b) {
  return a.mode == b.mode && a.batch_size == b.batch_size &&
         a.req_pool_indices == b.req_pool_indices && a.seq_lens == b.seq_lens &&
         a.extend_prefix_lens == b.extend_prefix_lens && a.extend_seq_lens == b.extend_seq_lens &&
         a.out_cache_loc == b.out_cache_loc && a.num_draft_tokens == b.num_draft_tokens &&
         a.seq_lens_sum == b.seq_lens_sum;
}

}  // namespace

MLA_FUZZ_TARGET(batch) {
  using namespace mla;
  fuzz::ByteReader in(data, size);
  BatchLimits limits;
  constexpr int kPages[] = {1, 16, 32, 64, 128};
  limits.page_size = in.u8() % 16 == 0 ? in.mostly(-4, 256) : kPages[in.u8() % 5];
  limits.max_requests = static_cast<int>(in.range(0, 64));
  limits.max_context_len = static_cast<int>(in.range(0, 4096));
  limits.num_slots = in.range(0, 1 << 16);
  limits.max_draft_tokens = static_cast<int>(in.range(0, 9));

  ForwardBatch b;
  const uint8_t mode = in.u8();
  b.mode = static_cast<ForwardMode>(mode % 32 == 31 ? mode : mode % 6);
  const int bs = static_cast<int>(in.range(0, 12));
  b.batch_size = bs;
  b.num_draft_tokens = b.mode == ForwardMode::kTargetVerify ? static_cast<int>(in.range(1, 8)) : 0;
  const bool extend_vectors = b.mode == ForwardMode::kExtend || b.mode == ForwardMode::kMixed ||
                              b.mode == ForwardMode::kDraftExtend || in.boolean();
  for (int r = 0; r < bs; ++r) {
    b.req_pool_indices.push_back(static_cast<int32_t>(in.range(0, 64)));
    const int32_t prefix = static_cast<int32_t>(in.range(0, 600));
    const int32_t fresh = b.mode == ForwardMode::kDecode ? 1
                          : b.mode == ForwardMode::kTargetVerify
                              ? b.num_draft_tokens
                              : static_cast<int32_t>(in.range(0, 40));
    b.seq_lens.push_back(b.mode == ForwardMode::kTargetVerify ? prefix : prefix + fresh);
    if (extend_vectors) {
      b.extend_prefix_lens.push_back(prefix);
      b.extend_seq_lens.push_back(fresh);
    }
    for (int t = 0; t < fresh; ++t) {
      b.out_cache_loc.push_back(static_cast<int32_t>(in.range(0, limits.num_slots)));
    }
  }
  finalize_batch(b);
  // Mutations: field, index, value.
  const int mutations = in.u8() % 4;
  for (int m = 0; m < mutations; ++m) {
    const uint8_t field = in.u8() % 10;
    const int32_t v = in.mostly(-2, 700, 4);
    auto poke = [&](std::vector<int32_t>& vec) {
      if (in.u8() % 8 == 0) {
        if (in.boolean() || vec.empty())
          vec.push_back(v);
        else
          vec.pop_back();
      } else if (!vec.empty()) {
        vec[in.range(0, static_cast<int64_t>(vec.size()) - 1)] = v;
      }
    };
    switch (field) {
      case 0:
        b.batch_size = v;
        break;
      case 1:
        poke(b.req_pool_indices);
        break;
      case 2:
        poke(b.seq_lens);
        break;
      case 3:
        poke(b.extend_prefix_lens);
        break;
      case 4:
        poke(b.extend_seq_lens);
        break;
      case 5:
        poke(b.out_cache_loc);
        break;
      case 6:
        b.num_draft_tokens = v;
        break;
      case 7:
        b.seq_lens_sum = v;
        break;
      case 8:
        finalize_batch(b);
        break;
      default:
        b.mode = static_cast<ForwardMode>(in.u8() % 7);
        break;
    }
  }

  const ForwardBatch before = b;
  const Status s = validate_batch(b, limits);
  FUZZ_CHECK(same(b, before), "validate_batch changed the batch");
  if (!s.ok()) {
    FUZZ_CHECK(s.code() == StatusCode::kInvalidArgument, "code of {}", s.to_string());
    FUZZ_CHECK(
        fuzz::names_a_field(s.message(), {"page_size", "mode", "batch_size", "req_pool_indices",
                                          "seq_lens", "extend_prefix_lens", "extend_seq_lens",
                                          "num_draft_tokens", "out_cache_loc", "seq_lens_sum"}),
        "the error names no field: {}", s.message());
    return "";
  }
  // Accepted: what planning and the kernels rely on.
  std::set<int32_t> rows;
  std::vector<int32_t> q_lens, kv_lens, prefix;
  int64_t tokens = 0;
  for (int r = 0; r < b.batch_size; ++r) {
    const int32_t row = b.req_pool_indices[r];
    FUZZ_CHECK(row >= 0 && row <= limits.max_requests, "row {} of request {}", row, r);
    FUZZ_CHECK(row == 0 || rows.insert(row).second, "row {} twice", row);
    const int32_t q = b.q_len(r), kv = b.kv_len(r);
    FUZZ_CHECK(q >= 0 && kv >= q && kv <= limits.max_context_len,
               "request {}: q_len {} kv_len {} (max_context_len {})", r, q, kv,
               limits.max_context_len);
    tokens += q;
    q_lens.push_back(q);
    kv_lens.push_back(kv);
    prefix.push_back(kv - q);
  }
  FUZZ_CHECK(tokens == b.num_tokens() && tokens == static_cast<int64_t>(b.out_cache_loc.size()),
             "tokens {} num_tokens {} out_cache_loc {}", tokens, b.num_tokens(),
             b.out_cache_loc.size());
  for (int32_t slot : b.out_cache_loc) {
    FUZZ_CHECK(slot >= 0 && slot < limits.num_slots, "slot {}", slot);
  }
  // Chunked prefix over the prefixes, with a capacity from the bytes.
  const int64_t capacity = std::max<int64_t>(b.batch_size, 1) * in.range(1, 300);
  planning::ChunkedPrefixPlan chunks;
  const Status cs = planning::plan_chunked_prefix(prefix, capacity, &chunks);
  FUZZ_CHECK(cs.ok(), "chunk planner rejected a valid batch: {}", cs.to_string());
  FUZZ_RETURN_IF_FAILED(fuzz::check_chunked_plan(prefix, capacity, chunks, {}, {}, 0, 1, false));
  // The CUDA absorbed planner (host code) over the batch, 16 heads.
  if (b.batch_size > 0) {
    std::vector<int32_t> prow(b.req_pool_indices.begin(), b.req_pool_indices.end());
    int max_q = 1;
    for (int32_t q : q_lens) max_q = std::max(max_q, q);
    AttnCapacity cap{b.batch_size, std::max<int64_t>(tokens, 1), 0, max_q, 16};
    AbsorbedProblem p{16, limits.page_size, true, prow, q_lens, kv_lens};
    const int ctas = static_cast<int>(in.range(1, 132));
    std::vector<std::byte> plan(cuda::absorbed::plan_layout(cap, ctas).bytes);
    auto used = cuda::absorbed::build_plan(p, cap, ctas, plan);
    FUZZ_CHECK(used.ok(), "absorbed planner rejected a valid batch: {}", used.status().to_string());
    FUZZ_RETURN_IF_FAILED(fuzz::check_absorbed_plan(p, ctas, plan, *used));
  }
  return "";
}
