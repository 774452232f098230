// The two page-table forms of the absorbed op (include/mla/ops.h): which one a call carries, and
// its checks, shared by every op set so the errors name the same field everywhere.
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

}  // namespace mla
