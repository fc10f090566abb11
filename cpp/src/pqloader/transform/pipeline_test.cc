#include "pqloader/transform/pipeline.h"

#include <gtest/gtest.h>

#include <cstring>

namespace pqloader {

namespace {

std::shared_ptr<const Op> Make(const std::string& name, OpParams p = {}) {
  return MakeOp(name, p).ValueOrDie();
}

ColumnSpec ListSpec() {
  ColumnSpec s;
  s.name = "tok";
  s.kind = ColumnKind::kTensor;
  s.dtype = DType::kInt32;
  s.row_shape = {-1};
  return s;
}

}  // namespace

TEST(TransformPlan, SplitsAtTheFirstRandomOpAndAddsLengthColumns) {
  OpParams pad;
  pad.numbers["length"] = 4;
  OpParams flip;
  flip.numbers["p"] = 0.5;
  auto plan = TransformPlan::Make({ListSpec()},
                                  {{"tok", {Make("PadOrTruncate", pad)}}},
                                  DecodeErrorPolicy::kRaise)
                  .ValueOrDie();
  ASSERT_EQ(plan.output_specs().size(), 2u);
  EXPECT_EQ(plan.output_specs()[1].name, "tok_length");
  EXPECT_TRUE(plan.output_specs()[0].transformed);

  // A ragged unit of two rows: [1, 2, 3, 4, 5] and [6].
  DecodedUnit unit;
  unit.num_rows = 2;
  ColumnData c;
  c.row_shape = {-1};
  const int32_t values[] = {1, 2, 3, 4, 5, 6};
  c.data = arrow::Buffer::FromString(std::string(reinterpret_cast<const char*>(values), 24));
  const int64_t offsets[] = {0, 20, 24};
  c.offsets = arrow::Buffer::FromString(std::string(reinterpret_cast<const char*>(offsets), 24));
  unit.columns.push_back(c);
  ASSERT_TRUE(plan.ApplyPrefix(&unit, {ListSpec()}, [](int64_t) { return std::string(); }).ok());
  ASSERT_EQ(unit.columns[0].samples.size(), 2u);
  EXPECT_EQ(unit.columns[0].lengths, (std::vector<int64_t>{4, 1}));
  const auto& row1 = unit.columns[0].samples[1];
  EXPECT_EQ(row1.shape, (std::vector<int64_t>{4}));
  int32_t got[4];
  std::memcpy(got, row1.data->data(), 16);
  EXPECT_EQ(std::vector<int32_t>(got, got + 4), (std::vector<int32_t>{6, 0, 0, 0}));
}

TEST(TransformPlan, UnknownColumnsAndOpsAreRefused) {
  EXPECT_FALSE(TransformPlan::Make({ListSpec()}, {{"nope", {Make("ToCHW")}}},
                                   DecodeErrorPolicy::kRaise)
                   .ok());
  EXPECT_FALSE(MakeOp("Sharpen", {}).ok());
  EXPECT_FALSE(MakeOp("Resize", {}).ok());
}

TEST(CounterRng, SampleStreamsDependOnEveryKeyPart) {
  auto first = [](uint64_t seed, int64_t epoch, int64_t sample, int op) {
    auto r = CounterRng::ForSample(seed, epoch, sample, op);
    return r.NextU64();
  };
  const uint64_t base = first(1, 2, 3, 4);
  EXPECT_EQ(first(1, 2, 3, 4), base);
  EXPECT_NE(first(2, 2, 3, 4), base);
  EXPECT_NE(first(1, 3, 3, 4), base);
  EXPECT_NE(first(1, 2, 4, 4), base);
  EXPECT_NE(first(1, 2, 3, 5), base);
  EXPECT_NE(first(1, 2, int64_t{3} + (int64_t{1} << 32), 4), base);
}

}  // namespace pqloader
