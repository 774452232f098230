// TensorView shapes/strides and expect_tensor's checks and messages.
#include "mla/tensor.h"

#include <gtest/gtest.h>

#include <vector>

#include "unit_util.h"

namespace mla {
namespace {

TEST(TensorView, ContiguousShapeAndStrides) {
  std::vector<uint16_t> buf(7 * 4 * 3);
  TensorView t(buf.data(), DType::kBF16, Device::cpu(), {7, 4, 3});
  EXPECT_EQ(t.ndim, 3);
  EXPECT_EQ(t.numel(), 84);
  EXPECT_EQ(t.bytes(), 168u);
  EXPECT_EQ(t.stride[0], 12);
  EXPECT_EQ(t.stride[1], 3);
  EXPECT_EQ(t.stride[2], 1);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_FALSE(t.empty());
  EXPECT_EQ(t.size(1), 4);
  EXPECT_EQ(t.ptr<uint16_t>(), buf.data());
  EXPECT_EQ(t.describe(), "bf16[7, 4, 3] on cpu");
}

TEST(TensorView, StridedViewIsNotContiguous) {
  std::vector<float> buf(5 * 576);
  TensorView t(buf.data(), DType::kF32, Device::cpu(), {5, 512});
  t.stride[0] = 576;  // the c_kv part of [5, 576] rows
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.numel(), 5 * 512);
}

TEST(TensorView, EmptyAndDefault) {
  TensorView d;
  EXPECT_EQ(d.numel(), 0);
  EXPECT_TRUE(d.empty());
  TensorView z(nullptr, DType::kI32, Device::cpu(), {0, 16});
  EXPECT_TRUE(z.empty());
  EXPECT_TRUE(expect_tensor(z, "z", DType::kI32, {0, 16}, Device::cpu()).ok());
}

TEST(ExpectTensor, AcceptsMatchingAndWildcards) {
  std::vector<uint16_t> buf(2 * 16 * 576);
  TensorView q(buf.data(), DType::kBF16, Device::cpu(), {2, 16, 576});
  EXPECT_TRUE(expect_tensor(q, "q", DType::kBF16, {2, 16, 576}, Device::cpu()).ok());
  EXPECT_TRUE(expect_tensor(q, "q", DType::kBF16, {-1, 16, -1}, Device::cpu()).ok());
}

TEST(ExpectTensor, RejectsWrongDtypeRankDevice) {
  std::vector<uint16_t> buf(2 * 16 * 576);
  TensorView q(buf.data(), DType::kBF16, Device::cpu(), {2, 16, 576});
  for (const Status& s : {expect_tensor(q, "q", DType::kF32, {2, 16, 576}, Device::cpu()),
                          expect_tensor(q, "q", DType::kBF16, {2, 16 * 576}, Device::cpu()),
                          expect_tensor(q, "q", DType::kBF16, {2, 16, 576}, Device::cuda(0))}) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    MLA_EXPECT_CONTAINS(s.message(), "q: expected");
    MLA_EXPECT_CONTAINS(s.message(), "bf16[2, 16, 576] on cpu");
  }
}

TEST(ExpectTensor, RejectsWrongExtentNamingDimension) {
  std::vector<uint16_t> buf(2 * 16 * 576);
  TensorView q(buf.data(), DType::kBF16, Device::cpu(), {2, 16, 576});
  const Status s = expect_tensor(q, "q_absorbed", DType::kBF16, {2, 32, 576}, Device::cpu());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  MLA_EXPECT_CONTAINS(s.message(), "q_absorbed");
  MLA_EXPECT_CONTAINS(s.message(), "dimension 1 is 16, expected 32");
}

TEST(ExpectTensor, RejectsNullDataAndNonContiguous) {
  TensorView null_view(nullptr, DType::kF32, Device::cpu(), {4, 4});
  const Status s = expect_tensor(null_view, "lse", DType::kF32, {4, 4}, Device::cpu());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  MLA_EXPECT_CONTAINS(s.message(), "lse: null data");

  std::vector<float> buf(4 * 8);
  TensorView strided(buf.data(), DType::kF32, Device::cpu(), {4, 4});
  strided.stride[0] = 8;
  const Status c = expect_tensor(strided, "o", DType::kF32, {4, 4}, Device::cpu());
  EXPECT_EQ(c.code(), StatusCode::kInvalidArgument);
  MLA_EXPECT_CONTAINS(c.message(), "o: must be contiguous");
  EXPECT_TRUE(expect_tensor(strided, "o", DType::kF32, {4, 4}, Device::cpu(), false).ok());
}

}  // namespace
}  // namespace mla
