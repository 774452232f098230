// Fuzz target `absorbed_plan`: the CUDA absorbed op's host planner
// (src/kernels/cuda/absorbed/plan.cc) on problems, capacities and grids from the bytes.
// Invariants: no crash or sanitizer report; a rejection is kInvalidArgument / kOutOfWorkspace
// naming the field and leaves the caller's plan bytes untouched; an accepted plan covers every
// (query row, key) the bottom-right causal mask allows exactly once (kv_len < q_len included),
// splits are merged by exactly one combine, partial slots stay within their bound.
#include "fuzz/fuzz_target.h"
#include "fuzz/plan_checks.h"

MLA_FUZZ_TARGET(absorbed_plan) {
  using namespace mla;
  fuzz::ByteReader in(data, size);
  constexpr int kHeads[] = {16, 32, 64, 128, 1, 8, 63, 127};  // any of 1..128 is valid
  constexpr int kPages[] = {1, 16, 32, 64, 128};
  AbsorbedProblem p;
  p.num_heads = in.u8() % 32 == 0 ? in.mostly(-1, 256, 2) : kHeads[in.u8() % 8];
  p.page_size = in.u8() % 32 == 0 ? in.mostly(-1, 256, 2) : kPages[in.u8() % 5];
  p.causal = in.u8() % 4 != 0;
  const int bs = static_cast<int>(in.range(0, 24));
  std::vector<int32_t> rows, q, kv;
  int64_t tokens = 0;
  int max_q = 1;
  for (int b = 0; b < bs; ++b) {
    rows.push_back(in.mostly(0, 64, 64));
    const int32_t ql = in.mostly(0, in.boolean() ? 1 : 9, 64);
    int32_t kl = in.mostly(0, 3000, 64);
    // Causal with fewer keys than queries is valid (FlashMLA's bottom-right mask: the first
    // queries see no key); still, most such requests get more keys, the common shape.
    if (p.causal && kl > 0 && kl < ql && in.u8() % 8 != 0) {
      kl = static_cast<int32_t>(std::min<int64_t>(int64_t{ql} + kl, INT32_MAX));
    }
    q.push_back(ql);
    kv.push_back(kl);
    if (ql > 0) tokens += ql;
    max_q = std::max<int>(max_q, ql);
  }
  if (in.u8() % 16 == 0 && bs > 0) q.pop_back();  // sizes that differ
  p.req_rows = rows;
  p.q_lens = q;
  p.kv_lens = kv;
  AttnCapacity cap{bs + static_cast<int>(in.range(0, 4)) - (in.u8() % 16 == 0 ? 2 : 0),
                   tokens + in.range(0, 8) - (in.u8() % 16 == 0 ? 2 : 0), 0,
                   static_cast<int>(std::min<int64_t>(int64_t{max_q} + in.range(0, 4), INT32_MAX)),
                   in.boolean() ? 0 : p.num_heads};
  const int ctas = in.u8() % 32 == 0 ? in.mostly(-2, 2, 2) : static_cast<int>(in.range(1, 264));
  // Batch-invariant plans for a quarter of the inputs, from the bytes already read (no new byte:
  // the saved corpus keeps its meaning).
  cap.batch_invariant = ctas % 4 == 1;
  // Bound the sizes the fuzzer can ask for (a capacity of 2^31 tokens is a 100 GB plan).
  if ((cap.max_batch > 4096 || cap.max_q_tokens > (1 << 20))) return "";
  // The caller sizes the plan from the capacity; an unsupported head count there would ask for
  // an absurd buffer before the planner could reject it, so such capacities get a small one.
  const bool sane_heads = cap.num_heads >= 0 && cap.num_heads <= 128;
  const bool sane_ctas = ctas > 0 && ctas <= (1 << 20);
  const std::size_t need =
      sane_ctas && sane_heads ? cuda::absorbed::plan_layout(cap, ctas).bytes : 64;
  std::vector<std::byte> plan(need - (in.u8() % 32 == 0 ? std::min<std::size_t>(need, 16) : 0),
                              std::byte{0xA5});
  const std::vector<std::byte> before = plan;
  auto used = cuda::absorbed::build_plan(p, cap, ctas, plan);
  if (!used.ok()) {
    const Status& s = used.status();
    FUZZ_CHECK(s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kOutOfWorkspace,
               "code of {}", s.to_string());
    FUZZ_CHECK(fuzz::names_a_field(s.message(), {"num_ctas", "num_heads", "page_size", "req_rows",
                                                 "q_lens", "kv_lens", "max_batch", "max_q_tokens",
                                                 "max_q_len", "host_plan", "units"}),
               "no field named: {}", s.message());
    FUZZ_CHECK(plan == before, "rejected plan wrote the plan bytes: {}", s.message());
    return "";
  }
  // Accepted: the problem was valid.
  FUZZ_CHECK(q.size() == rows.size() && kv.size() == rows.size(), "sizes differ but accepted");
  for (int b = 0; b < bs; ++b) {
    FUZZ_CHECK(q[b] >= 0 && kv[b] >= 0 && rows[b] >= 0, "request {}: q {} kv {} row {}", b, q[b],
               kv[b], rows[b]);
  }
  return fuzz::check_absorbed_plan(p, ctas, plan, *used, &cap);
}
