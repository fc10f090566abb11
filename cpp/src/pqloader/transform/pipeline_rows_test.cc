// RowSample and MaskedNull, the per-row reads of transforms (tests written against
// hand-made mutants of pipeline.cc that pipeline_test let pass).
#include "pqloader/transform/pipeline.h"

#include <gtest/gtest.h>

#include <cstring>

namespace pqloader {
namespace {

template <typename T>
std::shared_ptr<arrow::Buffer> BufferOf(const std::vector<T>& v) {
  return arrow::Buffer::FromString(
      std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T)));
}

TEST(RowSample, ARaggedRowsLengthCountsElementsNotBytes) {
  ColumnSpec spec;
  spec.name = "tok";
  spec.kind = ColumnKind::kTensor;
  spec.dtype = DType::kInt32;
  spec.row_shape = {-1};
  DecodedUnit unit;
  unit.num_rows = 3;
  ColumnData d;
  d.row_shape = {-1};
  d.row_bytes = 0;
  d.data = BufferOf(std::vector<int32_t>{1, 2, 3, 4, 5, 6});
  d.offsets = BufferOf(std::vector<int64_t>{0, 4, 16, 24});  // bytes: rows of 1, 3, 2 values
  unit.columns = {d};
  const std::vector<int64_t> lengths = {1, 3, 2};
  for (int64_t r = 0; r < 3; ++r) {
    const SampleTensor s = RowSample(spec, unit, 0, r);
    EXPECT_EQ(s.dtype, DType::kInt32);
    ASSERT_EQ(s.shape, (std::vector<int64_t>{lengths[r]})) << r;
    EXPECT_EQ(s.data->size(), lengths[r] * 4);
  }
  int32_t second;
  std::memcpy(&second, RowSample(spec, unit, 0, 1).data->data(), 4);
  EXPECT_EQ(second, 2);
  // Rows of pairs: the first dimension counts pairs.
  spec.row_shape = {-1, 2};
  unit.columns[0].row_shape = {-1, 2};
  unit.columns[0].offsets = BufferOf(std::vector<int64_t>{0, 8, 24, 24});
  EXPECT_EQ(RowSample(spec, unit, 0, 1).shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(RowSample(spec, unit, 0, 2).shape, (std::vector<int64_t>{0, 2}));
}

TEST(MaskedNull, IsTheMaskColumnsFalseRowsOnly) {
  ColumnSpec x, valid;
  x.name = "x";
  x.kind = ColumnKind::kBytes;
  valid.name = "x_valid";
  valid.kind = ColumnKind::kTensor;
  valid.dtype = DType::kBool;
  valid.mask_of = 0;
  const std::vector<ColumnSpec> specs = {x, valid};
  DecodedUnit unit;
  unit.num_rows = 3;
  ColumnData dx, dv;
  dx.data = arrow::Buffer::FromString("ab");
  dx.offsets = BufferOf(std::vector<int64_t>{0, 1, 1, 2});
  dv.row_bytes = 1;
  dv.data = BufferOf(std::vector<uint8_t>{1, 0, 1});
  unit.columns = {dx, dv};
  EXPECT_FALSE(MaskedNull(specs, unit, 0, 0));
  EXPECT_TRUE(MaskedNull(specs, unit, 0, 1));
  EXPECT_FALSE(MaskedNull(specs, unit, 0, 2));
  // Without a mask column beside it, no row is a masked null.
  EXPECT_FALSE(MaskedNull({x}, unit, 0, 1));
}

TEST(TransformPlan, AListsLengthColumnClashingWithAnyColumnIsRefused) {
  ColumnSpec length, tok;
  length.name = "tok_length";
  length.kind = ColumnKind::kTensor;
  length.dtype = DType::kInt64;
  tok.name = "tok";
  tok.kind = ColumnKind::kTensor;
  tok.dtype = DType::kInt32;
  tok.row_shape = {-1};
  ColumnCollate pad;
  pad.mode = ColumnCollate::Mode::kPad;
  pad.length = 4;
  for (const auto& specs : {std::vector<ColumnSpec>{length, tok}, std::vector<ColumnSpec>{tok, length}}) {
    auto plan = TransformPlan::Make(specs, {}, DecodeErrorPolicy::kRaise, true, {{"tok", pad}});
    ASSERT_FALSE(plan.ok()) << specs[0].name;
    EXPECT_NE(plan.status().message().find("tok_length"), std::string::npos);
  }
}

}  // namespace
}  // namespace pqloader
