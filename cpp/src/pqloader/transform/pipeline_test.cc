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

// Ops whose output changed keep a version in their cache key part (the state's text,
// ToString, stays): an .npz of several arrays is refused since the fortieth session, where
// a pqloader before it cached the first array (found by a cross-build cache test).
TEST(TransformPlan, CompressedNdarrayCacheKeyIsVersioned) {
  ColumnSpec s;
  s.name = "z";
  s.kind = ColumnKind::kBytes;
  auto plan = TransformPlan::Make({s}, {{"z", {Make("DecodeCompressedNdarray")}}},
                                  DecodeErrorPolicy::kSkip)
                  .ValueOrDie();
  // (@v3: members failing their CRC-32 and archives without an end record are refused)
  EXPECT_NE(plan.PrefixFingerprint().find("DecodeCompressedNdarray()@v3;"), std::string::npos);
  EXPECT_EQ(plan.Fingerprint().find("@v3"), std::string::npos);  // states' text unchanged
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
  // Fixed rows: int32 [4], and their int64 lengths (a mixture may write them in place).
  ASSERT_EQ(plan.fixed_outputs().size(), 2u);
  ASSERT_TRUE(plan.fixed_outputs()[0].has_value() && plan.fixed_outputs()[1].has_value());
  EXPECT_EQ(plan.fixed_outputs()[0]->dtype, DType::kInt32);
  EXPECT_EQ(plan.fixed_outputs()[0]->shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(plan.fixed_outputs()[0]->bytes(), 16);
  EXPECT_EQ(plan.fixed_outputs()[1]->dtype, DType::kInt64);
  EXPECT_EQ(plan.fixed_outputs()[1]->bytes(), 8);
  // Padded to each batch's longest row, or ragged: not fixed.
  for (const char* how : {"pad", "ragged"}) {
    ColumnCollate c;
    c.mode = std::string(how) == "pad" ? ColumnCollate::Mode::kPad : ColumnCollate::Mode::kRagged;
    auto lists = TransformPlan::Make({ListSpec()}, {}, DecodeErrorPolicy::kRaise, true,
                                     {{"tok", c}}).ValueOrDie();
    ASSERT_EQ(lists.fixed_outputs().size(), 2u);
    EXPECT_FALSE(lists.fixed_outputs()[0].has_value() || lists.fixed_outputs()[1].has_value()) << how;
  }

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

ColumnSpec BytesSpec(const std::string& name) {
  ColumnSpec s;
  s.name = name;
  s.kind = ColumnKind::kBytes;
  return s;
}

TEST(TransformPlan, SignaturesFollowTheOpsWithoutData) {
  OpParams crop;
  crop.lists["size"] = {32, 48};
  OpParams resize;
  resize.numbers["size"] = 24;
  OpParams norm;
  norm.lists["mean"] = {0.5};
  norm.lists["std"] = {0.5};
  OpParams gray;
  gray.strings["mode"] = "gray";
  gray.numbers["keepdims"] = 0;
  OpParams cast;
  cast.strings["dtype"] = "float16";
  OpParams flip;
  ColumnSpec id;
  id.name = "id";
  id.dtype = DType::kInt64;
  auto plan = TransformPlan::Make(
                  {BytesSpec("a"), BytesSpec("b"), BytesSpec("c"), BytesSpec("d"),
                   BytesSpec("e"), BytesSpec("f"), id, BytesSpec("s")},
                  {{"a", {Make("DecodeImage")}},
                   // Normalize + ToCHW are fused; CenterCrop then Resize is computable
                   {"b", {Make("DecodeImage"), Make("CenterCrop", crop), Make("Resize", resize),
                          Make("RandomHorizontalFlip", flip), Make("Normalize", norm),
                          Make("ToCHW")}},
                   {"c", {Make("DecodeImage", gray), Make("Resize", resize)}},
                   {"d", {Make("DecodeNdarray")}},
                   {"e", {Make("DecodeNdarray"), Make("Cast", cast)}},
                   {"f", {Make("DecodeImage"), Make("ToCHW"), Make("CenterCrop", crop)}}},
                  DecodeErrorPolicy::kSkip)
                  .ValueOrDie();
  const auto& sig = plan.signatures();
  ASSERT_EQ(sig.size(), 8u);
  using Shape = std::vector<int64_t>;
  ASSERT_TRUE(sig[0].has_value());
  EXPECT_EQ(sig[0]->dtype, DType::kUInt8);
  EXPECT_EQ(sig[0]->shape, (Shape{-1, -1, 3}));  // the image's size depends on the data
  EXPECT_EQ(sig[1]->dtype, DType::kFloat32);
  EXPECT_EQ(sig[1]->shape, (Shape{3, 24, 36}));  // 32 x 48 resized to a shorter side of 24
  EXPECT_TRUE(sig[1]->channels_first);
  EXPECT_EQ(sig[2]->shape, (Shape{-1, -1}));
  ASSERT_TRUE(sig[3].has_value());
  EXPECT_FALSE(sig[3]->dtype.has_value());  // what a .npy holds is in its header
  EXPECT_FALSE(sig[3]->shape.has_value());
  EXPECT_EQ(sig[4]->dtype, DType::kFloat16);
  EXPECT_FALSE(sig[4]->shape.has_value());
  EXPECT_EQ(sig[5]->shape, (Shape{3, 32, 48}));
  ASSERT_TRUE(sig[6].has_value());  // untransformed tensor column: its spec
  EXPECT_EQ(sig[6]->dtype, DType::kInt64);
  EXPECT_EQ(sig[6]->shape, Shape{});
  EXPECT_FALSE(sig[7].has_value());  // untransformed bytes stay a list
  // Fixed rows where dtype and every dimension are known: b, f and id.
  const auto& fixed = plan.fixed_outputs();
  ASSERT_EQ(fixed.size(), 8u);
  for (size_t c : {0, 2, 3, 4, 7}) EXPECT_FALSE(fixed[c].has_value()) << c;
  ASSERT_TRUE(fixed[1].has_value() && fixed[5].has_value() && fixed[6].has_value());
  EXPECT_EQ(fixed[1]->shape, (Shape{3, 24, 36}));
  EXPECT_EQ(fixed[1]->bytes(), 3 * 24 * 36 * 4);
  EXPECT_EQ(fixed[5]->dtype, DType::kUInt8);
  EXPECT_EQ(fixed[6]->bytes(), 8);

  // What the ops make of real samples has the signature's shape.
  SampleTensor image;
  image.dtype = DType::kUInt8;
  image.shape = {50, 70, 3};
  image.data = arrow::Buffer::FromString(std::string(50 * 70 * 3, '\x7f'));
  SampleTensor out = image;
  for (const auto& op : {Make("CenterCrop", crop), Make("Resize", resize),
                         Make("Normalize", norm), Make("ToCHW")}) {
    out = op->Apply(out, SampleContext{}, 0).ValueOrDie();
  }
  EXPECT_EQ(out.shape, *sig[1]->shape);
  EXPECT_EQ(out.dtype, *sig[1]->dtype);
}

TEST(AssembleBatch, ABatchWithoutRowsHasTheSignaturesDtypeAndShape) {
  OpParams crop;
  crop.lists["size"] = {4, 6};
  OpParams pad;
  pad.numbers["length"] = 5;
  OpParams cast;
  cast.strings["dtype"] = "float32";
  ColumnSpec tok = ListSpec();
  ColumnSpec vec = ListSpec();
  vec.name = "vec";
  vec.row_shape = {-1, 3};
  ColumnCollate ragged;
  ragged.mode = ColumnCollate::Mode::kRagged;
  const std::vector<ColumnSpec> specs = {BytesSpec("img"), tok, vec, BytesSpec("s"),
                                         BytesSpec("npy")};
  auto plan = TransformPlan::Make(specs,
                                  {{"img", {Make("DecodeImage"), Make("CenterCrop", crop)}},
                                   {"tok", {Make("Cast", cast), Make("PadOrTruncate", pad)}},
                                   {"npy", {Make("DecodeNdarray")}}},
                                  DecodeErrorPolicy::kSkip, true, {{"vec", ragged}})
                  .ValueOrDie();
  auto unit = std::make_shared<DecodedUnit>();  // every row skipped: none is gathered
  unit->num_rows = 0;
  unit->columns.resize(specs.size());
  auto batch = AssembleBatch(specs, {unit}, 0, {}, {}, arrow::default_memory_pool(),
                             plan.collate(), plan.signatures())
                   .ValueOrDie();
  const auto& c = batch->columns;
  ASSERT_EQ(c.size(), 5u);
  using Shape = std::vector<int64_t>;
  EXPECT_EQ(c[0].kind, ColumnKind::kTensor);
  EXPECT_EQ(c[0].dtype, DType::kUInt8);
  EXPECT_EQ(c[0].shape, (Shape{0, 4, 6, 3}));
  EXPECT_EQ(c[1].dtype, DType::kFloat32);
  EXPECT_EQ(c[1].shape, (Shape{0, 5}));  // padded to the fixed length
  ASSERT_NE(c[1].lengths, nullptr);
  EXPECT_EQ(c[1].lengths->size(), 0);
  EXPECT_EQ(c[2].dtype, DType::kInt32);
  EXPECT_EQ(c[2].shape, (Shape{0, 3}));  // no values, rows of 3
  ASSERT_NE(c[2].offsets, nullptr);
  ASSERT_EQ(c[2].offsets->size(), 8);  // one offset: 0
  EXPECT_EQ(reinterpret_cast<const int64_t*>(c[2].offsets->data())[0], 0);
  EXPECT_EQ(c[3].kind, ColumnKind::kBytes);  // strings and bytes stay lists
  EXPECT_EQ(c[3].shape, (Shape{0}));
  EXPECT_EQ(c[4].kind, ColumnKind::kTensor);  // dtype and rank unknown: uint8 (0,)
  EXPECT_EQ(c[4].dtype, DType::kUInt8);
  EXPECT_EQ(c[4].shape, (Shape{0}));
}

TEST(TransformPlan, SamplesOfAKnownSizeAreWrittenIntoTheBatchColumn) {
  OpParams norm;
  norm.lists["mean"] = {1};
  norm.lists["std"] = {2};
  const std::vector<ColumnSpec> specs = {ImageSpec()};
  // No cache point: every op runs per sample. Normalize + ToCHW: float32 (1, 2, 3).
  auto plan = TransformPlan::Make(specs, {{"img", {Make("Normalize", norm), Make("ToCHW")}}},
                                  DecodeErrorPolicy::kRaise, false)
                  .ValueOrDie();
  const int64_t bytes = plan.SlotBytes(0);
  ASSERT_EQ(bytes, 6 * 4);
  constexpr int64_t kRows = 4;
  auto unit = std::make_shared<DecodedUnit>();
  unit->num_rows = kRows;
  ColumnData c;
  c.row_shape = {2, 3, 1};
  c.row_bytes = 6;
  std::string raw;
  for (int i = 0; i < kRows * 6; ++i) raw.push_back(static_cast<char>(i * 7));
  c.data = arrow::Buffer::FromString(raw);
  unit->columns.push_back(c);
  std::shared_ptr<arrow::Buffer> block =
      arrow::AllocateBuffer(kRows * bytes, arrow::default_memory_pool()).ValueOrDie();
  std::vector<std::vector<SampleTensor>> placed(1), own(1);
  std::vector<RowRef> rows;
  for (int64_t r = 0; r < kRows; ++r) {
    placed[0].push_back(plan.ApplySuffix(0, specs[0], *unit, r, {}, block, r * bytes).ValueOrDie());
    own[0].push_back(plan.ApplySuffix(0, specs[0], *unit, r, {}).ValueOrDie());
    EXPECT_EQ(placed[0][r].data->data(), block->data() + r * bytes) << r;
    EXPECT_NE(own[0][r].data->parent(), block);
    ASSERT_EQ(std::memcmp(placed[0][r].data->data(), own[0][r].data->data(), bytes), 0) << r;
    rows.push_back(RowRef{0, static_cast<uint32_t>(r)});
  }
  // Samples in their rows of one block are the column as it is; others are copied.
  auto in_place = AssembleBatch(specs, {unit}, 0, rows, placed, arrow::default_memory_pool())
                      .ValueOrDie();
  auto copied =
      AssembleBatch(specs, {unit}, 0, rows, own, arrow::default_memory_pool()).ValueOrDie();
  EXPECT_EQ(in_place->columns[0].data->data(), block->data());
  EXPECT_EQ(in_place->columns[0].shape, (std::vector<int64_t>{kRows, 1, 2, 3}));
  EXPECT_GE(in_place->owned_bytes, kRows * bytes);
  ASSERT_EQ(copied->columns[0].data->size(), kRows * bytes);
  EXPECT_EQ(std::memcmp(in_place->columns[0].data->data(), copied->columns[0].data->data(),
                        kRows * bytes),
            0);
  std::swap(placed[0][0], placed[0][1]);  // rows out of their slots: copied, in order
  auto swapped = AssembleBatch(specs, {unit}, 0, rows, placed, arrow::default_memory_pool())
                     .ValueOrDie();
  EXPECT_NE(swapped->columns[0].data->data(), block->data());
  EXPECT_EQ(std::memcmp(swapped->columns[0].data->data(), own[0][1].data->data(), bytes), 0);
  EXPECT_EQ(std::memcmp(swapped->columns[0].data->data() + bytes, own[0][0].data->data(), bytes),
            0);
}

// A shuffled loader's unit has its small fixed-size columns in one row-major block (no
// data of their own); a column transformed per sample is read from the block. (It was
// read from its null data: a segfault on every shuffled epoch with a Cast on one of two
// number columns.)
TEST(TransformPlan, PerSampleOpsReadAColumnFromTheUnitsRowMajorBlock) {
  ColumnSpec f32, f64;
  f32.name = "a";
  f32.dtype = DType::kFloat32;
  f64.name = "d";
  f64.dtype = DType::kFloat64;
  const std::vector<ColumnSpec> specs = {f32, f64};
  OpParams cast;
  cast.strings["dtype"] = "float32";
  auto plan = TransformPlan::Make(specs, {{"d", {Make("Cast", cast)}}}, DecodeErrorPolicy::kRaise,
                                  /*cache_point=*/false)
                  .ValueOrDie();
  constexpr int64_t kRows = 5;
  auto unit = std::make_shared<DecodedUnit>();
  unit->num_rows = kRows;
  std::vector<float> a(kRows);
  std::vector<double> d(kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    a[r] = static_cast<float>(r);
    d[r] = 0.5 + static_cast<double>(r) * 10;
  }
  ColumnData ca, cd;
  ca.row_bytes = 4;
  ca.data = arrow::Buffer::FromString(std::string(reinterpret_cast<const char*>(a.data()), kRows * 4));
  cd.row_bytes = 8;
  cd.data = arrow::Buffer::FromString(std::string(reinterpret_cast<const char*>(d.data()), kRows * 8));
  unit->columns = {ca, cd};
  auto row_major = WithRowMajor(unit, 64, arrow::default_memory_pool()).ValueOrDie();
  ASSERT_NE(row_major->row_major, nullptr);
  ASSERT_EQ(row_major->columns[1].data, nullptr);
  for (int64_t r = 0; r < kRows; ++r) {
    const SampleTensor s = plan.ApplySuffix(1, specs[1], *row_major, r, {}).ValueOrDie();
    ASSERT_EQ(s.dtype, DType::kFloat32);
    float got;
    std::memcpy(&got, s.data->data(), 4);
    EXPECT_EQ(got, static_cast<float>(d[r])) << r;
  }
}

TEST(SampleSlotScope, TheFirstSampleOfTheSlotsSizeTakesItOnce) {
  std::shared_ptr<arrow::Buffer> block =
      arrow::AllocateBuffer(64, arrow::default_memory_pool()).ValueOrDie();
  SampleSlotScope slot(block, 16, 8);
  auto other = AllocateSample(DType::kUInt8, {4}).ValueOrDie();  // another size
  EXPECT_NE(other.data->parent(), block);
  auto first = AllocateSample(DType::kFloat32, {2}).ValueOrDie();
  EXPECT_EQ(first.data->data(), block->data() + 16);
  EXPECT_TRUE(first.data->is_mutable());
  auto second = AllocateSample(DType::kFloat32, {2}).ValueOrDie();  // the slot is taken
  EXPECT_NE(second.data->parent(), block);
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

// What an op refuses whatever the data is refused when the plan is made (it was at the
// first row, and with on_decode_error="skip" every row was skipped).
TEST(TransformPlan, OpsRefuseColumnsTheyCannotTakeBeforeAnyData) {
  OpParams size;
  size.numbers["size"] = 2;
  ColumnSpec u16 = ImageSpec();
  u16.dtype = DType::kUInt16;
  auto plan = TransformPlan::Make({u16}, {{"img", {Make("Resize", size)}}},
                                  DecodeErrorPolicy::kSkip);
  ASSERT_FALSE(plan.ok());
  EXPECT_NE(plan.status().message().find("uint8 and float32"), std::string::npos)
      << plan.status().ToString();
  EXPECT_NE(plan.status().message().find("column 'img'"), std::string::npos);
  // An image op on a list column (rank 1), before or after other ops.
  OpParams cast;
  cast.strings["dtype"] = "float32";
  EXPECT_FALSE(TransformPlan::Make({ListSpec()}, {{"tok", {Make("Cast", cast), Make("ToCHW")}}},
                                   DecodeErrorPolicy::kRaise)
                   .ok());
  // Normalize's means against the image's channels (one mean goes with any).
  OpParams three;
  three.lists["mean"] = {0, 0, 0};
  three.lists["std"] = {1, 1, 1};
  EXPECT_FALSE(TransformPlan::Make({ImageSpec()}, {{"img", {Make("Normalize", three)}}},
                                   DecodeErrorPolicy::kRaise)
                   .ok());
  OpParams one;
  one.lists["mean"] = {0};
  one.lists["std"] = {1};
  EXPECT_TRUE(TransformPlan::Make({ImageSpec()}, {{"img", {Make("Normalize", one)}}},
                                  DecodeErrorPolicy::kRaise)
                  .ok());
  // Resize after ToCHW, and what is left to the data: a float32 image resizes.
  EXPECT_FALSE(TransformPlan::Make({ImageSpec()}, {{"img", {Make("ToCHW"), Make("Resize", size)}}},
                                   DecodeErrorPolicy::kRaise)
                   .ok());
  ColumnSpec f32 = ImageSpec();
  f32.dtype = DType::kFloat32;
  EXPECT_TRUE(TransformPlan::Make({f32}, {{"img", {Make("Resize", size)}}},
                                  DecodeErrorPolicy::kRaise)
                  .ok());
}

// Sizes are checked before they become integers (1e20 was undefined behaviour), and a
// Normalize whose float32 factors overflow is refused (every pixel was inf or NaN).
TEST(MakeOp, SizesAndNormalizeFactorsAreCheckedBeforeConversion) {
  OpParams huge;
  huge.numbers["size"] = 1e20;
  EXPECT_FALSE(MakeOp("Resize", huge).ok());
  OpParams huge2;
  huge2.lists["size"] = {1e20, 2};
  EXPECT_FALSE(MakeOp("CenterCrop", huge2).ok());
  EXPECT_FALSE(MakeOp("RandomResizedCrop", huge2).ok());
  OpParams most;
  most.numbers["size"] = 2147483647.0;
  EXPECT_TRUE(MakeOp("Resize", most).ok());
  OpParams tiny;
  tiny.lists["mean"] = {0};
  tiny.lists["std"] = {1e-300};
  EXPECT_FALSE(MakeOp("Normalize", tiny).ok());
  OpParams far;
  far.lists["mean"] = {1e300};
  far.lists["std"] = {1e-10};
  EXPECT_FALSE(MakeOp("Normalize", far).ok());
  OpParams usual;
  usual.lists["mean"] = {0.485};
  usual.lists["std"] = {0.229};
  EXPECT_TRUE(MakeOp("Normalize", usual).ok());
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
