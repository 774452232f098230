// Fuzz target `mha_plan`: the CUDA MHA op's host planner (src/kernels/cuda/mha/plan.cc) on
// indptr arrays and capacities from the bytes. Invariants: no crash or sanitizer report; a
// rejection is kInvalidArgument / kOutOfWorkspace naming the field and leaves the plan bytes
// untouched; an accepted plan's tiles partition every request's query rows, each with its
// request's key range and causal diagonal.
#include "fuzz/fuzz_target.h"
#include "fuzz/plan_checks.h"

MLA_FUZZ_TARGET(mha_plan) {
  using namespace mla;
  fuzz::ByteReader in(data, size);
  MhaProblem p;
  p.num_heads = in.u8() % 32 == 0 ? in.mostly(-1, 8, 2) : 16 << (in.u8() % 4);
  p.causal = in.u8() % 4 != 0;
  const int bs = static_cast<int>(in.range(0, 24));
  std::vector<int32_t> qo{in.u8() % 16 == 0 ? in.mostly(0, 4, 2) : 0};
  std::vector<int32_t> kv{in.u8() % 16 == 0 ? in.mostly(0, 4, 2) : 0};
  for (int b = 0; b < bs; ++b) {
    const int64_t ql = in.mostly(0, in.boolean() ? 300 : 4, 64);
    int64_t kl = in.mostly(0, 2000, 64);
    if (p.causal && kl < ql && in.u8() % 8 != 0) kl += ql;
    qo.push_back(static_cast<int32_t>(qo.back() + ql));  // wraps on purpose now and then
    kv.push_back(static_cast<int32_t>(kv.back() + kl));
  }
  if (in.u8() % 16 == 0) kv.pop_back();
  int64_t q_tokens = qo.back() - int64_t{qo.front()};
  if (q_tokens < 0 || q_tokens > (1 << 20)) q_tokens = 1 << 20;  // bound the plan size
  AttnCapacity cap{bs + static_cast<int>(in.range(0, 3)) - (in.u8() % 16 == 0 ? 2 : 0),
                   q_tokens - (in.u8() % 16 == 0 ? 3 : 0), in.boolean() ? 0 : int64_t{1} << 30, 1,
                   p.num_heads};
  const std::size_t need = cuda::mha::plan_bytes(cap);
  if (need > (std::size_t{64} << 20)) return "";
  std::vector<std::byte> plan(need - (in.u8() % 32 == 0 ? std::min<std::size_t>(need, 40) : 0),
                              std::byte{0x5A});
  const std::vector<std::byte> before = plan;
  auto used = cuda::mha::build_plan(p, cap, plan);
  if (!used.ok()) {
    const Status& s = used.status();
    FUZZ_CHECK(s.code() == StatusCode::kInvalidArgument || s.code() == StatusCode::kOutOfWorkspace,
               "code of {}", s.to_string());
    FUZZ_CHECK(fuzz::names_a_field(
                   s.message(), {"num_heads", "qo_indptr", "kv_indptr", "max_batch", "max_q_tokens",
                                 "max_kv_tokens", "host_plan", "tiles", "q_len", "kv_len"}),
               "no field named: {}", s.message());
    FUZZ_CHECK(plan == before, "rejected plan wrote the plan bytes: {}", s.message());
    return "";
  }
  for (int b = 0; b < bs && qo.size() == kv.size(); ++b) {
    FUZZ_CHECK(qo[b + 1] >= qo[b] && kv[b + 1] >= kv[b], "request {}: decreasing indptr", b);
  }
  return fuzz::check_mha_plan(p, plan, *used);
}
