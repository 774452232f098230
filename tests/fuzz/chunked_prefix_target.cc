// Fuzz target `chunked_prefix`: the chunked-prefix planner (src/planning/chunked_prefix.cc),
// lengths and slot lists, on prefixes, capacities and req_to_token tables from the bytes.
// Invariants: no crash or sanitizer report; a rejection is kInvalidArgument naming the field
// and leaves the plan exactly as it was (nothing written); an accepted plan puts every prefix
// token of every request in exactly one chunk, at the slot req_to_token gives it.
#include "fuzz/fuzz_target.h"
#include "fuzz/plan_checks.h"

namespace {

bool same(const mla::planning::ChunkedPrefixPlan& a, const mla::planning::ChunkedPrefixPlan& b) {
  return a.batch_size == b.batch_size && a.capacity == b.capacity && a.chunk_len == b.chunk_len &&
         a.num_chunks == b.num_chunks && a.lens == b.lens && a.cu_len == b.cu_len &&
         a.max_len == b.max_len && a.num_tokens == b.num_tokens && a.has_zero_kv == b.has_zero_kv &&
         a.kv_offsets == b.kv_offsets && a.kv_indices == b.kv_indices;
}

}  // namespace

MLA_FUZZ_TARGET(chunked_prefix) {
  using namespace mla;
  fuzz::ByteReader in(data, size);
  constexpr int kPages[] = {1, 16, 32, 64, 128};
  const int page = kPages[in.u8() % 5];
  const int bs = static_cast<int>(in.range(0, 16));
  const int64_t stride = in.range(1, 2048);  // max_context_len
  const int64_t num_rows = in.range(1, 17);  // req_to_token rows
  std::vector<int32_t> prefix, rows;
  for (int b = 0; b < bs; ++b) {
    prefix.push_back(in.mostly(0, stride + 2, 32));
    rows.push_back(in.mostly(0, num_rows, 32));
  }
  int64_t capacity =
      in.u8() % 16 == 0 ? int64_t{in.mostly(-4, 64, 2)} : std::max(bs, 1) * in.range(1, 600);
  if (in.u8() % 64 == 0) capacity = int64_t{1} << in.range(31, 40);
  // A table of slots as a pool writes it: the first slot of each page is page-aligned and its
  // page (with its P slots) lies in an int32 slot space of 2^16 pages.
  std::vector<int32_t> table(static_cast<std::size_t>(num_rows * stride));
  for (auto& v : table) v = in.empty() ? 0 : static_cast<int32_t>(in.range(0, 1 << 16) * page);

  // Start from the plan of an earlier batch, as the backends reuse one plan object.
  planning::ChunkedPrefixPlan plan;
  std::vector<int32_t> warm{3, 7};
  (void)planning::plan_chunked_prefix(warm, 4, &plan);
  planning::ChunkedPrefixPlan before = plan;
  Status s = planning::plan_chunked_prefix(prefix, capacity, &plan);
  if (!s.ok()) {
    FUZZ_CHECK(s.code() == StatusCode::kInvalidArgument, "code of {}", s.to_string());
    FUZZ_CHECK(fuzz::names_a_field(s.message(), {"chunked_prefix_capacity", "extend_prefix_lens"}),
               "no field named: {}", s.message());
    FUZZ_CHECK(same(plan, before), "rejected plan_chunked_prefix wrote the plan: {}", s.message());
    return "";
  }
  FUZZ_RETURN_IF_FAILED(fuzz::check_chunked_plan(prefix, capacity, plan, {}, {}, 0, page, false));
  before = plan;
  s = planning::fill_chunk_kv_indices(rows, table, stride, page, &plan);
  if (!s.ok()) {
    FUZZ_CHECK(s.code() == StatusCode::kInvalidArgument, "code of {}", s.to_string());
    FUZZ_CHECK(fuzz::names_a_field(
                   s.message(), {"req_rows", "req_pool_indices", "max_context_len", "page_size"}),
               "no field named: {}", s.message());
    FUZZ_CHECK(same(plan, before), "rejected fill_chunk_kv_indices wrote the plan: {}",
               s.message());
    return "";
  }
  return fuzz::check_chunked_plan(prefix, capacity, plan, rows, table, stride, page, true);
}
