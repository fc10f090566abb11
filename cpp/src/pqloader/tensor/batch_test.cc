#include "pqloader/tensor/batch.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>

namespace pqloader {

namespace {

// A unit whose column c holds rows of `widths[c]` bytes; byte j of row r of column c
// is a function of (unit, row, column, j), so any misplaced byte shows.
uint8_t ByteOf(int unit, int64_t row, size_t col, int64_t j) {
  return static_cast<uint8_t>(unit * 97 + row * 31 + col * 7 + j);
}

std::shared_ptr<const DecodedUnit> MakeUnit(int unit, int64_t rows, const std::vector<int64_t>& widths) {
  auto u = std::make_shared<DecodedUnit>();
  u->num_rows = rows;
  for (size_t c = 0; c < widths.size(); ++c) {
    ColumnData d;
    d.row_bytes = widths[c];
    d.row_shape = {widths[c]};
    std::string bytes(rows * widths[c], '\0');
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < widths[c]; ++j) bytes[r * widths[c] + j] = ByteOf(unit, r, c, j);
    }
    d.data = arrow::Buffer::FromString(bytes);
    u->columns.push_back(d);
  }
  return u;
}

std::vector<ColumnSpec> Specs(const std::vector<int64_t>& widths) {
  std::vector<ColumnSpec> specs;
  for (int64_t w : widths) {
    ColumnSpec s;
    s.dtype = DType::kUInt8;
    s.row_shape = {w};
    specs.push_back(s);
  }
  return specs;
}

void ExpectRows(const Batch& batch, const std::vector<RowRef>& rows,
                const std::vector<int64_t>& widths, int64_t unit_base) {
  ASSERT_EQ(batch.num_rows, static_cast<int64_t>(rows.size()));
  for (size_t c = 0; c < widths.size(); ++c) {
    const uint8_t* p = batch.columns[c].data->data();
    ASSERT_EQ(batch.columns[c].data->size(), static_cast<int64_t>(rows.size()) * widths[c]);
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int64_t j = 0; j < widths[c]; ++j) {
        ASSERT_EQ(p[i * widths[c] + j],
                  ByteOf(static_cast<int>(rows[i].unit - unit_base), rows[i].row, c, j))
            << "column " << c << " row " << i;
      }
    }
  }
}

const std::vector<int64_t> kWidths = {1, 2, 4, 8, 16, 12, 40, 100};

}  // namespace

TEST(AssembleBatch, EveryGatherPathPutsEveryByteInPlace) {
  // Shuffled rows of three units (typed gathers per width, memcpy per row for others),
  // natural order across a unit boundary (a memcpy per run), and the same from
  // row-major units.
  std::vector<std::shared_ptr<const DecodedUnit>> units, row_major;
  for (int u = 0; u < 3; ++u) {
    units.push_back(MakeUnit(u, 50, kWidths));
    row_major.push_back(WithRowMajor(units.back(), 64, arrow::default_memory_pool()).ValueOrDie());
    ASSERT_NE(row_major.back()->row_major, nullptr);
  }
  std::vector<RowRef> shuffled;
  for (int64_t u = 0; u < 3; ++u) {
    for (int64_t r = 0; r < 50; ++r) shuffled.push_back(RowRef{10 + u, r});
  }
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(3));
  shuffled.resize(64);
  std::vector<RowRef> natural;
  for (int64_t r = 30; r < 50; ++r) natural.push_back(RowRef{10, r});
  for (int64_t r = 0; r < 20; ++r) natural.push_back(RowRef{11, r});
  for (const auto* us : {&units, &row_major}) {
    for (const auto* rows : {&shuffled, &natural}) {
      auto b = AssembleBatch(Specs(kWidths), *us, 10, *rows, {}, arrow::default_memory_pool());
      ASSERT_TRUE(b.ok()) << b.status().ToString();
      ExpectRows(**b, *rows, kWidths, 10);
      EXPECT_GT((*b)->owned_bytes, 0);
    }
  }
}

TEST(AssembleBatch, ABatchFromOneRunOfOneUnitIsASliceOfIt) {
  auto unit = MakeUnit(0, 50, kWidths);
  std::vector<RowRef> rows;
  for (int64_t r = 7; r < 27; ++r) rows.push_back(RowRef{0, r});
  auto b = AssembleBatch(Specs(kWidths), {unit}, 0, rows, {}, arrow::default_memory_pool())
               .ValueOrDie();
  ExpectRows(*b, rows, kWidths, 0);
  for (size_t c = 0; c < kWidths.size(); ++c) {
    EXPECT_EQ(b->columns[c].data->data(), unit->columns[c].data->data() + 7 * kWidths[c]);
  }
  EXPECT_EQ(b->owned_bytes, 0);
}

TEST(AssembleBatch, RowShapesAreCheckedPerUnit) {
  auto a = MakeUnit(0, 4, {4});
  auto b = MakeUnit(1, 4, {8});
  auto r = AssembleBatch(Specs({4}), {a, b}, 0, {{0, 0}, {1, 0}}, {}, arrow::default_memory_pool());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("different shapes"), std::string::npos);
}

// Units whose row-major blocks differ because a later column's rows differ in width:
// the error names that column, not the first column whose place in the block moved.
TEST(AssembleBatch, RowMajorUnitsOfDifferentShapesNameTheColumnThatDiffers) {
  auto a = WithRowMajor(MakeUnit(0, 4, {4, 4, 8}), 64, arrow::default_memory_pool()).ValueOrDie();
  auto b = WithRowMajor(MakeUnit(1, 4, {4, 8, 8}), 64, arrow::default_memory_pool()).ValueOrDie();
  ASSERT_NE(a->row_major, nullptr);
  auto specs = Specs({4, 4, 8});
  for (size_t c = 0; c < specs.size(); ++c) specs[c].name = "c" + std::to_string(c);
  auto r = AssembleBatch(specs, {a, b}, 0, {{0, 0}, {1, 0}}, {}, arrow::default_memory_pool());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("column 'c1': rows of one batch have different shapes"),
            std::string::npos)
      << r.status().ToString();
}

TEST(AssembleBatch, StringOffsetsOfAUnitNeedNotStartAtZero) {
  // A unit that starts mid row group keeps the row group's offsets (they start at 5 here).
  auto unit = std::make_shared<DecodedUnit>();
  unit->num_rows = 3;
  ColumnData s;
  s.data = arrow::Buffer::FromString("xxxxxonetwothree");
  const int64_t off[] = {5, 8, 11, 16};
  s.offsets = arrow::Buffer::FromString(std::string(reinterpret_cast<const char*>(off), sizeof(off)));
  unit->columns.push_back(s);
  ColumnSpec spec;
  spec.kind = ColumnKind::kString;
  auto b = AssembleBatch({spec}, {unit}, 0, {{0, 2}, {0, 0}, {0, 1}}, {},
                         arrow::default_memory_pool())
               .ValueOrDie();
  const auto* o = reinterpret_cast<const int64_t*>(b->columns[0].offsets->data());
  const char* d = reinterpret_cast<const char*>(b->columns[0].data->data());
  EXPECT_EQ(std::vector<int64_t>(o, o + 4), (std::vector<int64_t>{0, 5, 8, 11}));
  EXPECT_EQ(std::string(d, 11), "threeonetwo");
}

TEST(AssembleBatch, RowMajorGathersLongerThanATileKeepEveryTile) {
  // A shuffled batch of 400 rows from row-major units: more rows than one tile of the
  // row-major gather (16 KiB of rows, here 186), so each tile lands at its own rows.
  std::vector<std::shared_ptr<const DecodedUnit>> units;
  std::vector<RowRef> rows;
  for (int u = 0; u < 3; ++u) {
    units.push_back(WithRowMajor(MakeUnit(u, 200, kWidths), 64, arrow::default_memory_pool()).ValueOrDie());
    ASSERT_NE(units.back()->row_major, nullptr);
    for (int64_t r = 0; r < 200; ++r) rows.push_back(RowRef{u, r});
  }
  std::shuffle(rows.begin(), rows.end(), std::mt19937(8));
  rows.resize(400);
  auto b = AssembleBatch(Specs(kWidths), units, 0, rows, {}, arrow::default_memory_pool());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ExpectRows(**b, rows, kWidths, 0);
}

TEST(AssembleBatch, PaddingToAMultipleRoundsTheLongestRowUp) {
  // Rows of 3, 5 and 1 values padded with multiple_of 4: length 8, nothing truncated.
  auto unit = MakeUnit(0, 3, {1});
  std::vector<SampleTensor> samples;
  for (int64_t n : {3, 5, 1}) {
    SampleTensor t;
    t.dtype = DType::kUInt8;
    t.shape = {n};
    t.data = arrow::Buffer::FromString(std::string(static_cast<size_t>(n), static_cast<char>('0' + n)));
    samples.push_back(t);
  }
  ColumnSpec spec;
  spec.dtype = DType::kUInt8;
  spec.row_shape = {-1};
  ColumnCollate pad;
  pad.mode = ColumnCollate::Mode::kPad;
  pad.multiple_of = 4;
  pad.pad_value = 9;
  auto b = AssembleBatch({spec}, {unit}, 0, {{0, 0}, {0, 1}, {0, 2}}, {samples},
                         arrow::default_memory_pool(), {pad});
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  const BatchColumn& c = (*b)->columns[0];
  EXPECT_EQ(c.shape, (std::vector<int64_t>{3, 8}));
  ASSERT_NE(c.lengths, nullptr);
  const auto* lengths = reinterpret_cast<const int64_t*>(c.lengths->data());
  EXPECT_EQ(std::vector<int64_t>(lengths, lengths + 3), (std::vector<int64_t>{3, 5, 1}));
  EXPECT_EQ(c.data->ToString(), std::string("333\x09\x09\x09\x09\x09"
                                            "55555\x09\x09\x09"
                                            "1\x09\x09\x09\x09\x09\x09\x09", 24));
}

TEST(AssembleBatch, SamplesOfOneBlockOutOfItsOrderAreCopiedInTheBatchsOrder) {
  // Transforms wrote rows 0, 1, 2 at bytes 0, 4 and 2 of one block: not the block's
  // slots i * 2, so the column is gathered, not the block's first 6 bytes taken as it.
  auto block = std::shared_ptr<arrow::Buffer>(arrow::Buffer::FromString("aaccbbxxxxxx"));
  std::vector<SampleTensor> samples;
  for (int64_t at : {0, 4, 2}) {
    SampleTensor t;
    t.dtype = DType::kUInt8;
    t.shape = {2};
    t.data = arrow::SliceBuffer(block, at, 2);
    samples.push_back(t);
  }
  ColumnSpec spec;
  spec.dtype = DType::kUInt8;
  spec.row_shape = {2};
  auto b = AssembleBatch({spec}, {MakeUnit(0, 3, {2})}, 0, {{0, 0}, {0, 1}, {0, 2}}, {samples},
                         arrow::default_memory_pool());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)->columns[0].data->ToString(), "aabbcc");
  // In the block's order they are the block's bytes, as they are.
  std::swap(samples[1], samples[2]);
  b = AssembleBatch({spec}, {MakeUnit(0, 3, {2})}, 0, {{0, 0}, {0, 1}, {0, 2}}, {samples},
                    arrow::default_memory_pool());
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)->columns[0].data->ToString(), "aaccbb");
}

TEST(AssembleInto, WritesTheBytesAssembleBatchWouldIntoTheCallersMemory) {
  // Shuffled rows, a run of one unit (a slice for AssembleBatch, copied here) and
  // row-major units; then a padded column and its lengths. The target's bytes around
  // each column stay untouched.
  std::vector<std::shared_ptr<const DecodedUnit>> units, row_major;
  for (int u = 0; u < 3; ++u) {
    units.push_back(MakeUnit(u, 50, kWidths));
    row_major.push_back(WithRowMajor(units.back(), 64, arrow::default_memory_pool()).ValueOrDie());
  }
  std::vector<RowRef> shuffled, run;
  for (int64_t u = 0; u < 3; ++u) {
    for (int64_t r = 0; r < 50; ++r) shuffled.push_back(RowRef{u, r});
  }
  std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937(4));
  shuffled.resize(40);
  for (int64_t r = 5; r < 25; ++r) run.push_back(RowRef{1, r});
  for (const auto* us : {&units, &row_major}) {
    for (const auto* rows : {&shuffled, &run}) {
      const auto n = static_cast<int64_t>(rows->size());
      std::vector<std::string> memory;
      BatchTarget into;
      for (int64_t w : kWidths) memory.emplace_back(static_cast<size_t>(n * w + 2), '\x5a');
      for (size_t c = 0; c < kWidths.size(); ++c) {
        into.data.push_back(reinterpret_cast<uint8_t*>(memory[c].data()) + 1);
        into.lengths.push_back(nullptr);
        into.row_bytes.push_back(kWidths[c]);
      }
      ASSERT_TRUE(AssembleInto(Specs(kWidths), *us, 0, *rows, {}, into).ok());
      auto b = AssembleBatch(Specs(kWidths), *us, 0, *rows, {}, arrow::default_memory_pool()).ValueOrDie();
      for (size_t c = 0; c < kWidths.size(); ++c) {
        EXPECT_EQ(memory[c].substr(1, n * kWidths[c]), b->columns[c].data->ToString()) << c;
        EXPECT_EQ(memory[c].front(), '\x5a');
        EXPECT_EQ(memory[c].back(), '\x5a');
      }
    }
  }
  // Rows of 3, 5 and 1 values padded (or truncated) to 4, and their kept lengths.
  auto unit = MakeUnit(0, 3, {1});
  std::vector<SampleTensor> samples;
  for (int64_t n : {3, 5, 1}) {
    SampleTensor t;
    t.dtype = DType::kUInt8;
    t.shape = {n};
    t.data = arrow::Buffer::FromString(std::string(static_cast<size_t>(n), static_cast<char>('0' + n)));
    samples.push_back(t);
  }
  ColumnSpec spec;
  spec.dtype = DType::kUInt8;
  spec.row_shape = {-1};
  ColumnCollate pad;
  pad.mode = ColumnCollate::Mode::kPad;
  pad.length = 4;
  pad.pad_value = 9;
  std::string values(12, '\0');
  std::vector<int64_t> lengths(3, -1);
  BatchTarget into{{reinterpret_cast<uint8_t*>(values.data())},
                   {reinterpret_cast<uint8_t*>(lengths.data())}, {4}, {}, {}};
  const std::vector<RowRef> rows = {{0, 0}, {0, 1}, {0, 2}};
  ASSERT_TRUE(AssembleInto({spec}, {unit}, 0, rows, {samples}, into, {pad}).ok());
  EXPECT_EQ(values, std::string("333\x09" "5555" "1\x09\x09\x09", 12));
  EXPECT_EQ(lengths, (std::vector<int64_t>{3, 4, 1}));
  // Not as wide as the target says: an error naming the column, nothing written.
  spec.name = "tok";
  std::string before = values;
  into.row_bytes = {8};
  auto st = AssembleInto({spec}, {unit}, 0, rows, {samples}, into, {pad});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'tok': rows of 4 bytes where the mixture's batch has 8"),
            std::string::npos) << st;
  EXPECT_EQ(values, before);
  // As wide, but of another shape than the target says: refused too.
  into.row_bytes = {4};
  into.row_shape = {{2, 2}};
  st = AssembleInto({spec}, {unit}, 0, rows, {samples}, into, {pad});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("'tok': rows of uint8(4,) where the mixture's batch has uint8(2, 2)"),
            std::string::npos) << st.message();
  EXPECT_EQ(values, before);
  into.row_shape.clear();
  // Rows of varying size (padded to each batch's longest) cannot be written there.
  pad.length = 0;
  into.row_bytes = {5};
  st = AssembleInto({spec}, {unit}, 0, rows, {samples}, into, {pad});
  EXPECT_FALSE(st.ok());
}

TEST(Scalars, EveryDTypeRoundTripsAndSignedTypesKeepTheirSign) {
  struct Case {
    DType dtype;
    double value;
  };
  const Case cases[] = {{DType::kInt8, -3},     {DType::kInt16, -300},  {DType::kInt32, -70000},
                        {DType::kInt64, -5e12}, {DType::kUInt8, 200},   {DType::kUInt16, 60000},
                        {DType::kUInt32, 4e9},  {DType::kUInt64, 1e19}, {DType::kFloat16, -1.5},
                        {DType::kFloat32, -2.25}, {DType::kFloat64, -1e-300}, {DType::kBool, 1}};
  for (const auto& c : cases) {
    uint8_t bytes[8] = {0};
    StoreScalar(c.dtype, c.value, bytes);
    EXPECT_EQ(LoadScalar(c.dtype, bytes), c.value) << DTypeName(c.dtype);
  }
  const uint8_t all_ones[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  EXPECT_EQ(LoadScalar(DType::kInt8, all_ones), -1);
  EXPECT_EQ(LoadScalar(DType::kUInt8, all_ones), 255);
}

TEST(DecodedUnit, ByteSizeCountsDataOffsetsSamplesAndTheRowMajorBlock) {
  auto unit = std::make_shared<DecodedUnit>(*MakeUnit(0, 4, {4, 8}));
  auto rm = WithRowMajor(unit, 64, arrow::default_memory_pool()).ValueOrDie();
  ASSERT_NE(rm->row_major, nullptr);
  EXPECT_EQ(rm->ByteSize(), 4 * 16);  // the block: two columns, stride 16
  DecodedUnit u;
  u.num_rows = 3;
  ColumnData s;
  s.data = arrow::Buffer::FromString("onetwothree");
  const int64_t off[] = {0, 3, 6, 11};
  s.offsets = arrow::Buffer::FromString(std::string(reinterpret_cast<const char*>(off), sizeof(off)));
  u.columns.push_back(s);
  ColumnData t;
  for (int i = 0; i < 3; ++i) {
    SampleTensor x;
    x.shape = {5};
    x.data = arrow::Buffer::FromString("abcde");
    t.samples.push_back(x);
  }
  u.columns.push_back(t);
  EXPECT_EQ(u.ByteSize(), 11 + 32 + 15);
}

TEST(WithRowMajor, KeepsLargeAndVariableColumnsAsTheyAre) {
  auto unit = std::make_shared<DecodedUnit>(*MakeUnit(0, 5, {4, 8, 100}));
  auto rm = WithRowMajor(unit, 64, arrow::default_memory_pool()).ValueOrDie();
  ASSERT_NE(rm->row_major, nullptr);
  EXPECT_EQ(rm->row_major->stride, 16);
  EXPECT_EQ(rm->row_major->offset, (std::vector<int64_t>{8, 0, -1}));  // widest first
  EXPECT_EQ(rm->columns[0].data, nullptr);
  EXPECT_EQ(rm->columns[2].data, unit->columns[2].data);  // 100-byte rows stay
  // One small column alone is not worth a block.
  auto single = MakeUnit(0, 5, {4, 100});
  EXPECT_EQ(WithRowMajor(single, 64, arrow::default_memory_pool()).ValueOrDie(), single);
}

}  // namespace pqloader
