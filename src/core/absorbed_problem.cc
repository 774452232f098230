// The request checks of an absorbed problem (include/mla/ops.h): one rule for every op set's
// plan(), so the cpu op, the cuda planner and the torch binding refuse the same problems with
// the same messages.
#include "mla/kv_pool.h"
#include "mla/ops.h"

namespace mla {

Status check_absorbed_shape(const AbsorbedProblem& p, const AttnCapacity& cap) {
  MLA_CHECK_ARG(p.q_lens.size() == p.req_rows.size() && p.kv_lens.size() == p.req_rows.size(),
                "req_rows has {} entries, q_lens {}, kv_lens {} (one per request)",
                p.req_rows.size(), p.q_lens.size(), p.kv_lens.size());
  MLA_CHECK_ARG(static_cast<int64_t>(p.req_rows.size()) <= cap.max_batch,
                "batch size {} exceeds capacity max_batch = {}", p.req_rows.size(), cap.max_batch);
  MLA_CHECK_ARG(p.num_heads >= 1, "num_heads = {} must be at least 1", p.num_heads);
  MLA_CHECK_ARG(cap.num_heads == 0 || cap.num_heads == p.num_heads,
                "num_heads = {} differs from the capacity's num_heads = {}", p.num_heads,
                cap.num_heads);
  return check_page_size(p.page_size, "page_size");
}

Status check_absorbed_requests(const AbsorbedProblem& p, const AttnCapacity& cap) {
  const std::size_t bs = p.req_rows.size();
  int64_t q_tokens = 0;
  for (std::size_t b = 0; b < bs; ++b) {
    const int32_t q = p.q_lens[b], kv = p.kv_lens[b], row = p.req_rows[b];
    MLA_CHECK_ARG(q >= 0, "q_lens[{}] = {} is negative", b, q);
    MLA_CHECK_ARG(kv >= 0, "kv_lens[{}] = {} is negative", b, kv);
    MLA_CHECK_ARG(row >= 0, "req_rows[{}] = {} is negative", b, row);
    MLA_CHECK_ARG(q <= cap.max_q_len, "q_lens[{}] = {} exceeds capacity max_q_len = {}", b, q,
                  cap.max_q_len);
    q_tokens += q;
  }
  MLA_CHECK_ARG(q_tokens <= cap.max_q_tokens, "sum(q_lens) = {} exceeds capacity max_q_tokens = {}",
                q_tokens, cap.max_q_tokens);
  return Status::Ok();
}

Status check_absorbed_problem(const AbsorbedProblem& p, const AttnCapacity& cap) {
  MLA_RETURN_IF_ERROR(check_absorbed_shape(p, cap));
  return check_absorbed_requests(p, cap);
}

}  // namespace mla
