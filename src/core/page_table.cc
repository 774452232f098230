// The two page-table forms of the absorbed op (include/mla/ops.h): which one a call carries, and
// its checks, shared by every op set so the errors name the same field everywhere.
#include <algorithm>

#include "mla/ops.h"

namespace mla {

StatusOr<PageTable> absorbed_page_table(const AbsorbedArgs& args, Device device) {
  const bool tokens = args.req_to_token.data != nullptr || args.req_to_token.ndim != 0;
  const bool blocks = args.block_table.data != nullptr || args.block_table.ndim != 0;
  MLA_CHECK_ARG(tokens != blocks,
                "page table: set exactly one of req_to_token ({}) and block_table ({})",
                tokens ? args.req_to_token.describe() : std::string("unset"),
                blocks ? args.block_table.describe() : std::string("unset"));
  PageTable t;
  t.block = blocks;
  t.name = blocks ? "block_table" : "req_to_token";
  const TensorView& v = blocks ? args.block_table : args.req_to_token;
  if (blocks && v.ndim == 1) {  // flat page list, rows starting at any element
    MLA_RETURN_IF_ERROR(expect_tensor(v, t.name, DType::kI32, {-1}, device, false));
    MLA_CHECK_ARG(v.shape[0] <= 1 || v.stride[0] == 1, "{}: stride {} must be 1 ({})", t.name,
                  v.stride[0], v.describe());
    t.flat = true;
    t.data = v.ptr<const int32_t>();
    t.rows = v.shape[0];
    t.cols = v.shape[0];
    t.row_stride = 1;
    return t;
  }
  MLA_RETURN_IF_ERROR(expect_tensor(v, t.name, DType::kI32, {-1, -1}, device, false));
  MLA_CHECK_ARG(v.shape[1] <= 1 || v.stride[1] == 1, "{}: column stride {} must be 1 ({})", t.name,
                v.stride[1], v.describe());
  MLA_CHECK_ARG(v.shape[0] <= 1 || v.stride[0] >= v.shape[1],
                "{}: row stride {} is below its {} columns ({})", t.name, v.stride[0], v.shape[1],
                v.describe());
  t.data = v.ptr<const int32_t>();
  t.rows = v.shape[0];
  t.cols = v.shape[1];
  t.row_stride = v.stride[0];
  return t;
}

TableExtents absorbed_table_extents(std::span<const int32_t> req_rows,
                                    std::span<const int32_t> kv_lens, int page_size) {
  TableExtents e;
  const int64_t page = std::max(page_size, 1);
  const std::size_t bs = std::min(req_rows.size(), kv_lens.size());
  for (std::size_t b = 0; b < bs; ++b) {
    const int64_t row = req_rows[b], kv = kv_lens[b];
    if (kv <= 0) continue;  // reads no entry
    const auto request = static_cast<int64_t>(b);
    const int64_t end = row + (kv + page - 1) / page;
    if (row > e.max_row) {
      e.max_row = row;
      e.row_request = request;
    }
    if (kv > e.max_kv) {
      e.max_kv = kv;
      e.kv_request = request;
    }
    if (end > e.flat_end) {
      e.flat_end = end;
      e.flat_request = request;
    }
  }
  return e;
}

Status check_table_extents(const PageTable& t, const TableExtents& e, int page_size) {
  if (e.max_kv <= 0) return Status::Ok();  // no request reads the table
  const int64_t page = std::max(page_size, 1);
  if (t.flat) {
    MLA_CHECK_ARG(e.flat_end <= t.rows,
                  "{}: a flat page list of {} entries, but request {} reads up to entry {} "
                  "(req_rows[{}] plus its pages of {} keys)",
                  t.name, t.rows, e.flat_request, e.flat_end - 1, e.flat_request, page);
    return Status::Ok();
  }
  MLA_CHECK_ARG(e.max_row < t.rows, "{}: {} rows, but request {} reads row {} (req_rows[{}])",
                t.name, t.rows, e.row_request, e.max_row, e.row_request);
  const int64_t need = t.block ? (e.max_kv + page - 1) / page : (e.max_kv - 1) / page * page + 1;
  MLA_CHECK_ARG(need <= t.cols,
                "{}: {} columns, but request {} reads {} for its {} keys (kv_lens[{}], page_size "
                "{})",
                t.name, t.cols, e.kv_request, need, e.max_kv, e.kv_request, page);
  return Status::Ok();
}

}  // namespace mla
