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

ColumnSpec ImageSpec() {
  ColumnSpec s;
  s.name = "img";
  s.kind = ColumnKind::kTensor;
  s.dtype = DType::kUInt8;
  s.row_shape = {2, 3, 1};
  return s;
}

TEST(TransformPlan, SplitsAtTheFirstRandomOp) {
  OpParams flip;
  flip.numbers["p"] = 1.0;
  OpParams cast;
  cast.strings["dtype"] = "float32";
  auto plan = TransformPlan::Make(
                  {ImageSpec()},
                  {{"img", {Make("Cast", cast), Make("RandomHorizontalFlip", flip), Make("ToCHW")}}},
                  DecodeErrorPolicy::kRaise)
                  .ValueOrDie();
  EXPECT_TRUE(plan.has_suffix(0));
  // The cache keeps what the prefix made: Cast only; the flip and what follows it run
  // per sample, keyed by the sample.
  EXPECT_NE(plan.PrefixFingerprint().find("Cast"), std::string::npos);
  EXPECT_EQ(plan.PrefixFingerprint().find("Flip"), std::string::npos);
  EXPECT_EQ(plan.PrefixFingerprint().find("ToCHW"), std::string::npos);
  EXPECT_NE(plan.Fingerprint().find("Flip"), std::string::npos);

  DecodedUnit unit;
  unit.num_rows = 1;
  ColumnData c;
  c.row_shape = {2, 3, 1};
  c.row_bytes = 6;
  c.data = arrow::Buffer::FromString(std::string("\x01\x02\x03\x04\x05\x06", 6));
  unit.columns.push_back(c);
  ASSERT_TRUE(plan.ApplyPrefix(&unit, {ImageSpec()}, [](int64_t) { return std::string(); }).ok());
  ASSERT_EQ(unit.columns[0].samples.size(), 1u);
  EXPECT_EQ(unit.columns[0].samples[0].dtype, DType::kFloat32);  // Cast ran
  auto out = plan.ApplySuffix(0, ImageSpec(), unit, 0, SampleContext{1, 0, 0}).ValueOrDie();
  ASSERT_EQ(out.shape, (std::vector<int64_t>{1, 2, 3}));  // flipped (p = 1), then CHW
  float got[6];
  std::memcpy(got, out.data->data(), sizeof(got));
  EXPECT_EQ(std::vector<float>(got, got + 6), (std::vector<float>{3, 2, 1, 6, 5, 4}));
}

TEST(TransformPlan, AFinalPadOrTruncateIsTheColumnsCollateStep) {
  OpParams pad;
  pad.numbers["length"] = 4;
  pad.numbers["pad"] = -1;
  auto plan = TransformPlan::Make({ListSpec()}, {{"tok", {Make("PadOrTruncate", pad)}}},
                                  DecodeErrorPolicy::kRaise)
                  .ValueOrDie();
  ASSERT_EQ(plan.output_specs().size(), 2u);
  EXPECT_EQ(plan.output_specs()[1].name, "tok_length");
  // No op changes the values: dtype known, and the padded row shape.
  EXPECT_FALSE(plan.output_specs()[0].transformed);
  EXPECT_EQ(plan.output_specs()[0].row_shape, (std::vector<int64_t>{4}));
  EXPECT_FALSE(plan.has_suffix(0));
  ASSERT_EQ(plan.collate().size(), 1u);
  EXPECT_EQ(plan.collate()[0].mode, ColumnCollate::Mode::kPad);
  EXPECT_EQ(plan.collate()[0].length, 4);
  EXPECT_EQ(plan.collate()[0].pad_value, -1);
  // It changes batches, not what the cache keeps.
  EXPECT_NE(plan.Fingerprint().find("PadOrTruncate"), std::string::npos);
  EXPECT_EQ(plan.PrefixFingerprint().find("PadOrTruncate"), std::string::npos);

  // A ragged unit of two rows: [1, 2, 3, 4, 5] and [6]; offsets need not start at 0.
  auto unit = std::make_shared<DecodedUnit>();
  unit->num_rows = 2;
  ColumnData c;
  c.row_shape = {-1};
  const int32_t values[] = {0, 1, 2, 3, 4, 5, 6};
  c.data = arrow::Buffer::FromString(std::string(reinterpret_cast<const char*>(values), 28));
  const int64_t offsets[] = {4, 24, 28};
  c.offsets = arrow::Buffer::FromString(std::string(reinterpret_cast<const char*>(offsets), 24));
  unit->columns.push_back(c);
  ASSERT_TRUE(plan.ApplyPrefix(unit.get(), {ListSpec()}, [](int64_t) { return std::string(); }).ok());
  EXPECT_TRUE(unit->columns[0].samples.empty());  // nothing ran before the cache point
  auto batch = AssembleBatch({ListSpec()}, {unit}, 0, {{0, 1}, {0, 0}}, {},
                             arrow::default_memory_pool(), plan.collate())
                   .ValueOrDie();
  const auto* len = reinterpret_cast<const int64_t*>(batch->columns[0].lengths->data());
  const std::vector<int64_t> lengths0(len, len + 2);
  EXPECT_EQ(batch->columns[0].shape, (std::vector<int64_t>{2, 4}));
  int32_t got[8];
  std::memcpy(got, batch->columns[0].data->data(), sizeof(got));
  EXPECT_EQ(std::vector<int32_t>(got, got + 8), (std::vector<int32_t>{6, -1, -1, -1, 1, 2, 3, 4}));
  EXPECT_EQ(lengths0, (std::vector<int64_t>{1, 4}));
}

TEST(TransformPlan, PadOrTruncateMustBeLast) {
  OpParams pad;
  pad.numbers["length"] = 4;
  OpParams cast;
  cast.strings["dtype"] = "float32";
  auto plan = TransformPlan::Make({ListSpec()},
                                  {{"tok", {Make("PadOrTruncate", pad), Make("Cast", cast)}}},
                                  DecodeErrorPolicy::kRaise);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("last op"), std::string::npos);
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
