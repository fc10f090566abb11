#include "pqloader/decode/convert.h"

#include <gtest/gtest.h>

#include <cstring>

#include <arrow/api.h>
#include <arrow/builder.h>
#include <arrow/util/decimal.h>
#include <arrow/json/from_string.h>

#include "pqloader/error.h"

namespace pqloader {

namespace {

std::shared_ptr<arrow::ChunkedArray> FromJson(const std::shared_ptr<arrow::DataType>& type,
                                              const std::string& json) {
  auto array = arrow::json::ArrayFromJSONString(type, json).ValueOrDie();
  return std::make_shared<arrow::ChunkedArray>(array);
}

template <typename T>
std::vector<T> Values(const ColumnData& c) {
  std::vector<T> out(c.data->size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), c.data->data(), c.data->size());
  return out;
}

ColumnData Convert(const std::shared_ptr<arrow::DataType>& type, const std::string& json,
                   NullFill fill = {}) {
  auto spec = SpecForField(*arrow::field("c", type)).ValueOrDie();
  auto r = ConvertColumn(spec, *FromJson(type, json), fill, arrow::default_memory_pool());
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ValueOrDie();
}

}  // namespace

TEST(Convert, PrimitiveColumnsAreZeroCopy) {
  auto chunked = FromJson(arrow::int32(), "[1, 2, 3, 4]");
  auto sliced = chunked->Slice(1, 2);
  auto spec = SpecForField(*arrow::field("c", arrow::int32())).ValueOrDie();
  auto c = ConvertColumn(spec, *sliced, {}, arrow::default_memory_pool()).ValueOrDie();
  EXPECT_EQ(Values<int32_t>(c), (std::vector<int32_t>{2, 3}));
  const auto* base = chunked->chunk(0)->data()->buffers[1]->data();
  EXPECT_EQ(c.data->data(), base + sizeof(int32_t));
}

TEST(Convert, BoolBecomesOneBytePerValue) {
  auto c = Convert(arrow::boolean(), "[true, false, true]");
  EXPECT_EQ(Values<uint8_t>(c), (std::vector<uint8_t>{1, 0, 1}));
}

TEST(Convert, FixedSizeListsBecomeRowsOfAShape) {
  auto type = arrow::fixed_size_list(arrow::fixed_size_list(arrow::float32(), 2), 3);
  auto c = Convert(type, "[[[1,2],[3,4],[5,6]], [[7,8],[9,10],[11,12]]]");
  EXPECT_EQ(c.row_shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(c.row_bytes, 24);
  EXPECT_EQ(Values<float>(c).back(), 12.0f);
}

TEST(Convert, UniformListsBecomeTensorsAndRaggedListsAreRefused) {
  auto c = Convert(arrow::list(arrow::int16()), "[[1,2,3],[4,5,6]]");
  EXPECT_EQ(c.row_shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(Values<int16_t>(c), (std::vector<int16_t>{1, 2, 3, 4, 5, 6}));
  auto spec = SpecForField(*arrow::field("tok", arrow::list(arrow::int16()))).ValueOrDie();
  auto r = ConvertColumn(spec, *FromJson(arrow::list(arrow::int16()), "[[1,2],[3]]"), {},
                         arrow::default_memory_pool());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'tok'"), std::string::npos);
  EXPECT_NE(r.status().message().find("different lengths"), std::string::npos);
}

TEST(Convert, RaggedListsForTransformsUseArrowsValuesAsTheyAre) {
  for (const auto& type : {arrow::list(arrow::int32()), arrow::large_list(arrow::int32())}) {
    auto chunked = FromJson(type, "[[9], [1,2,3], [], [4,5]]");
    auto sliced = chunked->Slice(1, 3);  // a unit that starts mid row group
    auto spec = SpecForField(*arrow::field("tok", type)).ValueOrDie();
    auto c = ConvertColumn(spec, *sliced, {}, arrow::default_memory_pool(), /*allow_ragged=*/true)
                 .ValueOrDie();
    EXPECT_EQ(c.row_shape, (std::vector<int64_t>{-1}));
    EXPECT_EQ(Values<int32_t>(c), (std::vector<int32_t>{1, 2, 3, 4, 5}));
    ColumnData offsets_only;
    offsets_only.data = c.offsets;
    EXPECT_EQ(Values<int64_t>(offsets_only), (std::vector<int64_t>{0, 12, 12, 20}));
    const auto& values = *chunked->chunk(0)->data()->child_data[0]->buffers[1];
    EXPECT_EQ(c.data->data(), values.data() + sizeof(int32_t)) << "not zero-copy";
  }
  // Lists of fixed-size lists keep their inner shape; offsets count whole inner rows.
  auto type = arrow::list(arrow::fixed_size_list(arrow::float32(), 2));
  auto spec = SpecForField(*arrow::field("pts", type)).ValueOrDie();
  auto c = ConvertColumn(spec, *FromJson(type, "[[[1,2],[3,4]], [[5,6]]]"), {},
                         arrow::default_memory_pool(), true)
               .ValueOrDie();
  EXPECT_EQ(c.row_shape, (std::vector<int64_t>{-1, 2}));
  EXPECT_EQ(Values<float>(c), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  ColumnData offsets_only;
  offsets_only.data = c.offsets;
  EXPECT_EQ(Values<int64_t>(offsets_only), (std::vector<int64_t>{0, 16, 24}));
  // Null values cannot be used as they are: the copying path refuses them by name.
  auto nulls = ConvertColumn(SpecForField(*arrow::field("tok", arrow::list(arrow::int32()))).ValueOrDie(),
                             *FromJson(arrow::list(arrow::int32()), "[[1, null]]"), {},
                             arrow::default_memory_pool(), true);
  ASSERT_FALSE(nulls.ok());
  EXPECT_NE(nulls.status().message().find("null"), std::string::npos);
}

TEST(Convert, ListsInSeveralChunksAreCopiedOnceIntoOneBufferOfTheirSize) {
  // A list column is decoded in slices (one chunk each); joining them must not regrow
  // the output (each regrowth is a new block and a copy of everything so far).
  for (bool ragged : {true, false}) {
    auto type = arrow::list(arrow::int32());
    arrow::ArrayVector chunks;
    std::vector<int32_t> want;
    int32_t next = 0;
    for (int k = 0; k < 5; ++k) {
      arrow::ListBuilder builder(arrow::default_memory_pool(), std::make_shared<arrow::Int32Builder>());
      auto* values = static_cast<arrow::Int32Builder*>(builder.value_builder());
      for (int r = 0; r < 40; ++r) {
        ASSERT_TRUE(builder.Append().ok());
        const int n = ragged ? (r * 7 + k) % 50 : 25;
        for (int i = 0; i < n; ++i) ASSERT_TRUE(values->Append(next++).ok());
      }
      // Sliced, as a unit that starts inside a chunk: its values do not start at 0.
      auto chunk = builder.Finish().ValueOrDie()->Slice(3, 30);
      const auto& list = static_cast<const arrow::ListArray&>(*chunk);
      for (int64_t i = list.value_offset(0); i < list.value_offset(30); ++i) {
        want.push_back(static_cast<const arrow::Int32Array&>(*list.values()).Value(i));
      }
      chunks.push_back(chunk);
    }
    auto spec = SpecForField(*arrow::field("tok", type)).ValueOrDie();
    arrow::ProxyMemoryPool pool(arrow::default_memory_pool());
    auto c = ConvertColumn(spec, arrow::ChunkedArray(chunks), {}, &pool, ragged).ValueOrDie();
    EXPECT_EQ(Values<int32_t>(c), want);
    const int64_t values = static_cast<int64_t>(want.size() * sizeof(int32_t));
    const int64_t offsets = ragged ? (5 * 30 + 1) * static_cast<int64_t>(sizeof(int64_t)) : 0;
    constexpr int64_t kRounding = 64;  // Arrow rounds buffer capacities up to 64 bytes
    EXPECT_LE(pool.total_bytes_allocated(), values + offsets + 2 * kRounding) << "ragged=" << ragged;
  }
}

TEST(Convert, NullsAreAnErrorUnlessFilled) {
  auto spec = SpecForField(*arrow::field("v", arrow::float64())).ValueOrDie();
  auto arr = FromJson(arrow::float64(), "[1.5, null, 3]");
  auto r = ConvertColumn(spec, *arr, {}, arrow::default_memory_pool());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("null"), std::string::npos);
  EXPECT_EQ(GetErrorDetail(r.status())->kind(), ErrorKind::kInvalidData);
  NullFill fill;
  fill.enabled = true;
  fill.is_float = true;
  fill.float_value = -1;
  auto c = Convert(arrow::float64(), "[1.5, null, 3]", fill);
  EXPECT_EQ(Values<double>(c), (std::vector<double>{1.5, -1, 3}));
}

// A list of strings stops at its first null element: the message gives no count (it
// said "has 1 null value(s)" of 3).
TEST(Convert, NullsInAListOfStringsAreNotCountedAsOne) {
  auto type = arrow::list(arrow::utf8());
  auto spec = SpecForField(*arrow::field("l", type)).ValueOrDie();
  auto r = ConvertColumn(spec, *FromJson(type, R"([["a", null], [null, "b", null]])"), {},
                         arrow::default_memory_pool());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("has null value(s)"), std::string::npos)
      << r.status().message();
}

TEST(Convert, DictionariesAreDecoded) {
  auto dict_type = arrow::dictionary(arrow::int8(), arrow::utf8());
  auto indices = arrow::json::ArrayFromJSONString(arrow::int8(), "[1, 0, 1]").ValueOrDie();
  auto dict = arrow::json::ArrayFromJSONString(arrow::utf8(), R"(["a", "bc"])").ValueOrDie();
  auto arr = arrow::DictionaryArray::FromArrays(dict_type, indices, dict).ValueOrDie();
  auto spec = SpecForField(*arrow::field("s", dict_type)).ValueOrDie();
  EXPECT_EQ(spec.kind, ColumnKind::kString);
  auto c = ConvertColumn(spec, arrow::ChunkedArray(arr), {}, arrow::default_memory_pool())
               .ValueOrDie();
  ColumnData offsets_only;
  offsets_only.data = c.offsets;
  auto offsets = Values<int64_t>(offsets_only);
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 2, 3, 5}));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(c.data->data()), 5), "bcabc");
}

TEST(Convert, DecimalsBecomeFloat64OrExactUnscaledInt64) {
  arrow::Decimal128Builder b(arrow::decimal128(10, 2));
  ASSERT_TRUE(b.Append(arrow::Decimal128("12.34")).ok());
  ASSERT_TRUE(b.Append(arrow::Decimal128("-0.05")).ok());
  ASSERT_TRUE(b.AppendNull().ok());
  auto arr = b.Finish().ValueOrDie();
  auto spec = SpecForField(*arrow::field("d", arr->type())).ValueOrDie();
  EXPECT_EQ(spec.dtype, DType::kFloat64);
  NullFill fill;
  fill.enabled = true;
  fill.int_value = 7;
  auto c = ConvertColumn(spec, arrow::ChunkedArray(arr), fill, arrow::default_memory_pool()).ValueOrDie();
  const auto* d = reinterpret_cast<const double*>(c.data->data());
  EXPECT_EQ(d[0], 12.34);
  EXPECT_EQ(d[1], -0.05);
  EXPECT_EQ(d[2], 7.0);
  SpecOptions as_int;
  as_int.decimals_as_int64 = true;
  auto ispec = SpecForField(*arrow::field("d", arr->type()), as_int).ValueOrDie();
  EXPECT_EQ(ispec.dtype, DType::kInt64);
  auto ic = ConvertColumn(ispec, arrow::ChunkedArray(arr), fill, arrow::default_memory_pool()).ValueOrDie();
  const auto* i = reinterpret_cast<const int64_t*>(ic.data->data());
  EXPECT_EQ(i[0], 1234);
  EXPECT_EQ(i[1], -5);
  EXPECT_FALSE(SpecForField(*arrow::field("d", arrow::decimal128(19, 2)), as_int).ok());
  // A file's decimal(10, 2) in a column of scale 4: rescaled first, as pyarrow's cast to
  // the column's type (-0.05 at scale 2 and at scale 4 are two doubles an ulp apart).
  auto wide = SpecForField(*arrow::field("d", arrow::decimal128(12, 4))).ValueOrDie();
  EXPECT_EQ(wide.decimal_scale, 4);
  auto rc = ConvertColumn(wide, arrow::ChunkedArray(arr), fill, arrow::default_memory_pool()).ValueOrDie();
  const auto* w = reinterpret_cast<const double*>(rc.data->data());
  EXPECT_EQ(w[0], arrow::Decimal128(123400).ToDouble(4));
  EXPECT_EQ(w[1], arrow::Decimal128(-500).ToDouble(4));
}

TEST(Convert, DecimalsRescaledPast38DigitsNeverWrap) {
  // Decimal128::Rescale compares the wrapped product with the value, so most overflows
  // passed: this value at scale 0, in a column of scale 10, loaded as 7.62e27
  // ((v * 10^10 mod 2^128) / 10^10) where pyarrow's cast gives 8.3e33.
  const arrow::Decimal128 big("8315828106689743556748183507200378");
  arrow::Decimal128Builder b(arrow::decimal128(38, 0));
  ASSERT_TRUE(b.Append(big).ok());
  ASSERT_TRUE(b.Append(-big).ok());
  ASSERT_TRUE(b.Append(arrow::Decimal128(5)).ok());
  auto arr = b.Finish().ValueOrDie();
  auto spec = SpecForField(*arrow::field("d", arrow::decimal256(48, 10))).ValueOrDie();
  auto c = ConvertColumn(spec, arrow::ChunkedArray(arr), NullFill{}, arrow::default_memory_pool()).ValueOrDie();
  const auto* d = reinterpret_cast<const double*>(c.data->data());
  const double want = arrow::Decimal256(big).Rescale(0, 10).ValueOrDie().ToDouble(10);
  EXPECT_GT(want, 8e33);
  EXPECT_EQ(d[0], want);
  EXPECT_EQ(d[1], -want);
  EXPECT_EQ(d[2], 5.0);
}

TEST(Convert, DecimalsRescaledToAScaleAbove38AreDecimal256s) {
  // A decimal128 file's values in a decimal256 column of scale 39 were converted with
  // Decimal128::ToDouble(39), out of its scales (0.005 loaded as 0.0).
  arrow::Decimal128Builder b(arrow::decimal128(20, 18));
  ASSERT_TRUE(b.Append(arrow::Decimal128("5000000000000000")).ok());  // 0.005
  ASSERT_TRUE(b.Append(arrow::Decimal128("-100000000000000")).ok());  // -0.0001
  auto arr = b.Finish().ValueOrDie();
  auto spec = SpecForField(*arrow::field("d", arrow::decimal256(42, 39))).ValueOrDie();
  auto c = ConvertColumn(spec, arrow::ChunkedArray(arr), NullFill{}, arrow::default_memory_pool()).ValueOrDie();
  const auto* d = reinterpret_cast<const double*>(c.data->data());
  EXPECT_EQ(d[0], arrow::Decimal256(arrow::Decimal128("5000000000000000")).Rescale(18, 39).ValueOrDie().ToDouble(39));
  EXPECT_GT(d[0], 0.00499);
  EXPECT_LT(d[1], -0.0000999);
}

TEST(Convert, ListsOfStringsEncodeEveryValue) {
  arrow::ListBuilder lb(arrow::default_memory_pool(), std::make_shared<arrow::StringBuilder>());
  auto* sb = static_cast<arrow::StringBuilder*>(lb.value_builder());
  ASSERT_TRUE(lb.Append().ok());
  ASSERT_TRUE(sb->Append("ab").ok());
  ASSERT_TRUE(sb->Append("").ok());
  ASSERT_TRUE(lb.Append().ok());  // empty list
  ASSERT_TRUE(lb.Append().ok());
  ASSERT_TRUE(sb->AppendNull().ok());
  auto arr = lb.Finish().ValueOrDie();
  auto spec = SpecForField(*arrow::field("w", arr->type())).ValueOrDie();
  EXPECT_EQ(spec.kind, ColumnKind::kStringList);
  EXPECT_FALSE(ConvertColumn(spec, arrow::ChunkedArray(arr), NullFill{}, arrow::default_memory_pool()).ok());
  NullFill fill;
  fill.enabled = true;
  fill.is_bytes = true;
  fill.bytes_value = "?";
  auto c = ConvertColumn(spec, arrow::ChunkedArray(arr), fill, arrow::default_memory_pool()).ValueOrDie();
  const auto* off = reinterpret_cast<const int64_t*>(c.offsets->data());
  auto row = [&](int r) { return DecodeStringList(c.data->data() + off[r], off[r + 1] - off[r]); };
  EXPECT_EQ(row(0), (std::vector<std::string>{"ab", ""}));
  EXPECT_EQ(row(1), std::vector<std::string>{});
  EXPECT_EQ(row(2), std::vector<std::string>{"?"});
}

TEST(Convert, StringListValuesMustBeUtf8UnlessReadAsBytes) {
  arrow::ListBuilder lb(arrow::default_memory_pool(), std::make_shared<arrow::StringBuilder>());
  auto* sb = static_cast<arrow::StringBuilder*>(lb.value_builder());
  ASSERT_TRUE(lb.Append().ok());
  ASSERT_TRUE(sb->Append("ok").ok());
  ASSERT_TRUE(lb.Append().ok());
  ASSERT_TRUE(sb->Append("fine").ok());
  ASSERT_TRUE(sb->Append(std::string("b\xc3", 2)).ok());  // a truncated sequence
  auto arr = lb.Finish().ValueOrDie();
  auto spec = SpecForField(*arrow::field("w", arr->type())).ValueOrDie();
  auto r = ConvertColumn(spec, arrow::ChunkedArray(arr), NullFill{}, arrow::default_memory_pool(),
                         /*allow_ragged=*/false, /*row_offset=*/40);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("column 'w', row 41, list item 1: a string value is not "
                                      "valid UTF-8 (b'b\\xc3')"),
            std::string::npos)
      << r.status().message();
  SpecOptions as_bytes;
  as_bytes.strings_as_bytes = true;
  auto bspec = SpecForField(*arrow::field("w", arr->type()), as_bytes).ValueOrDie();
  EXPECT_EQ(bspec.kind, ColumnKind::kBytesList);
  EXPECT_EQ(SpecForField(*arrow::field("s", arrow::utf8()), as_bytes).ValueOrDie().kind,
            ColumnKind::kBytes);
  auto c = ConvertColumn(bspec, arrow::ChunkedArray(arr), NullFill{}, arrow::default_memory_pool())
               .ValueOrDie();
  const auto* off = reinterpret_cast<const int64_t*>(c.offsets->data());
  EXPECT_EQ(DecodeStringList(c.data->data() + off[1], off[2] - off[1]),
            (std::vector<std::string>{"fine", std::string("b\xc3", 2)}));
}

TEST(Convert, AFilesNarrowerValuesConvertIntoTheUnifiedColumn) {
  // A file's int32 values into the unified int64 column.
  auto spec = SpecForField(*arrow::field("x", arrow::int64())).ValueOrDie();
  arrow::Int32Builder b;
  ASSERT_TRUE(b.AppendValues({-3, 2147483647}).ok());
  auto c = ConvertColumn(spec, arrow::ChunkedArray(b.Finish().ValueOrDie()), NullFill{},
                         arrow::default_memory_pool()).ValueOrDie();
  const auto* v = reinterpret_cast<const int64_t*>(c.data->data());
  EXPECT_EQ(v[0], -3);
  EXPECT_EQ(v[1], 2147483647);
}

TEST(Convert, IntegersAFloatDoesNotHoldAreRefusedOnBothSides) {
  auto spec = SpecForField(*arrow::field("x", arrow::float64())).ValueOrDie();
  auto convert = [&](std::vector<int64_t> values) {
    arrow::Int64Builder b;
    EXPECT_TRUE(b.AppendValues(values).ok());
    return ConvertColumn(spec, arrow::ChunkedArray(b.Finish().ValueOrDie()), NullFill{},
                         arrow::default_memory_pool());
  };
  const int64_t two53 = int64_t{1} << 53;
  EXPECT_TRUE(convert({-two53, two53, -two53 - 2}).ok());  // float64 holds these exactly
  for (int64_t v : {two53 + 1, -two53 - 1}) {
    auto r = convert({0, v});
    ASSERT_FALSE(r.ok()) << v;
    EXPECT_NE(r.status().message().find("value " + std::to_string(v) + " (int64) does not convert"),
              std::string::npos)
        << r.status().message();
  }
}

TEST(Convert, AStringEndingInsideACharacterIsRefusedWhateverFollowsIt) {
  // "\xc3" then "\xa9": each row invalid, their bytes together a valid "é".
  arrow::StringBuilder b;
  ASSERT_TRUE(b.Append(std::string("\xc3", 1)).ok() && b.Append(std::string("\xa9", 1)).ok());
  auto spec = SpecForField(*arrow::field("s", arrow::utf8())).ValueOrDie();
  auto r = ConvertColumn(spec, arrow::ChunkedArray(b.Finish().ValueOrDie()), NullFill{},
                         arrow::default_memory_pool());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("column 's', row 0: a string value is not valid UTF-8"),
            std::string::npos)
      << r.status().message();
}

TEST(Convert, AFilledNullSlotsBytesAreNotCheckedAgainstTheFloat) {
  // A null slot's value is undefined (any bytes): 2^53 + 1 under a null is not refused as
  // a value float64 does not hold; the slot is filled.
  const int64_t values[] = {(int64_t{1} << 53) + 1, 1};
  const uint8_t validity = 0b10;  // slot 0 null
  auto arr = arrow::MakeArray(arrow::ArrayData::Make(
      arrow::int64(), 2, {arrow::Buffer::Wrap(&validity, 1), arrow::Buffer::Wrap(values, 2)}, 1));
  auto spec = SpecForField(*arrow::field("x", arrow::float64())).ValueOrDie();
  NullFill fill;
  fill.enabled = true;
  fill.is_float = true;
  fill.float_value = -1;
  auto r = ConvertColumn(spec, arrow::ChunkedArray(arr), fill, arrow::default_memory_pool());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Values<double>(*r), (std::vector<double>{-1, 1}));
}

namespace {

NullFill IntFill(int64_t v) {
  NullFill fill;
  fill.enabled = true;
  fill.int_value = v;
  return fill;
}

ColumnData ConvertChunks(const std::shared_ptr<arrow::DataType>& type, arrow::ArrayVector chunks,
                         NullFill fill = {}) {
  auto spec = SpecForField(*arrow::field("c", type)).ValueOrDie();
  auto r = ConvertColumn(spec, arrow::ChunkedArray(std::move(chunks), type), fill,
                         arrow::default_memory_pool());
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) {  // (an empty column: the test fails, the others still run)
    ColumnData none;
    none.data = std::make_shared<arrow::Buffer>(nullptr, 0);
    return none;
  }
  return r.ValueOrDie();
}

std::shared_ptr<arrow::Array> ArrayOf(const std::shared_ptr<arrow::DataType>& type, const std::string& json) {
  return arrow::json::ArrayFromJSONString(type, json).ValueOrDie();
}

}  // namespace

// Arrays that start inside their buffers (a unit starting mid row group), copied or used
// as they are, give their own rows.
TEST(Convert, SlicedArraysGiveTheirOwnRows) {
  auto bools = ArrayOf(arrow::boolean(), "[true, false, false, true, true]")->Slice(1, 3);
  EXPECT_EQ(Values<uint8_t>(ConvertChunks(arrow::boolean(), {bools})), (std::vector<uint8_t>{0, 0, 1}));
  auto ints = ArrayOf(arrow::int32(), "[1, 2, 3, 4]")->Slice(1, 2);
  EXPECT_EQ(Values<int32_t>(ConvertChunks(arrow::int32(), {ints, ArrayOf(arrow::int32(), "[5]")})),
            (std::vector<int32_t>{2, 3, 5}));
  auto fsl_type = arrow::fixed_size_list(arrow::int16(), 2);
  auto fsl = ArrayOf(fsl_type, "[[1,2],[3,4],[5,6]]")->Slice(1, 2);
  EXPECT_EQ(Values<int16_t>(ConvertChunks(fsl_type, {fsl})), (std::vector<int16_t>{3, 4, 5, 6}));
}

// A null row of a fixed-size list, or of a list of fixed-size lists, is a whole row of the
// fill; a null inside a fixed-size list is an error without a fill.
TEST(Convert, NullRowsOfListsAreWholeRowsOfTheFill) {
  auto fsl_type = arrow::fixed_size_list(arrow::int32(), 2);
  auto c = ConvertChunks(fsl_type, {ArrayOf(fsl_type, "[[1,2], null, [5,6], null]")}, IntFill(9));
  EXPECT_EQ(Values<int32_t>(c), (std::vector<int32_t>{1, 2, 9, 9, 5, 6, 9, 9}));
  auto nested = arrow::list(arrow::fixed_size_list(arrow::int32(), 2));
  auto n = ConvertChunks(nested, {ArrayOf(nested, "[[[1,2],[3,4]], null, [[5,6],[7,8]]]")}, IntFill(0));
  EXPECT_EQ(n.row_shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(Values<int32_t>(n), (std::vector<int32_t>{1, 2, 3, 4, 0, 0, 0, 0, 5, 6, 7, 8}));
  // A unit of null lists only: rows of the footers' length.
  NullFill fill = IntFill(7);
  fill.list_length = 2;
  auto list = arrow::list(arrow::int32());
  auto l = ConvertChunks(list, {ArrayOf(list, "[null, null]")}, fill);
  EXPECT_EQ(l.row_shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(Values<int32_t>(l), (std::vector<int32_t>{7, 7, 7, 7}));
  // Where neither a row nor the footers tell it (list_length -1): refused, not rows of 0.
  auto unknown = ConvertColumn(SpecForField(*arrow::field("c", list)).ValueOrDie(),
                               arrow::ChunkedArray(ArrayOf(list, "[null, null]")), IntFill(7),
                               arrow::default_memory_pool());
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("all null lists"), std::string::npos)
      << unknown.status().message();
  auto spec = SpecForField(*arrow::field("c", fsl_type)).ValueOrDie();
  auto r = ConvertColumn(spec, arrow::ChunkedArray(ArrayOf(fsl_type, "[[1,null],[3,4]]")), {},
                         arrow::default_memory_pool());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("null"), std::string::npos) << r.status().message();
}

// Nulls of a string column (one chunk, kept as it is otherwise) are an error or the fill.
TEST(Convert, NullStringsAreAnErrorUnlessFilled) {
  auto spec = SpecForField(*arrow::field("s", arrow::utf8())).ValueOrDie();
  auto arr = ArrayOf(arrow::utf8(), R"(["ab", null, "c"])");
  auto r = ConvertColumn(spec, arrow::ChunkedArray(arr), {}, arrow::default_memory_pool());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("null"), std::string::npos);
  NullFill fill;
  fill.enabled = true;
  fill.is_bytes = true;
  fill.bytes_value = "?";
  auto c = ConvertColumn(spec, arrow::ChunkedArray(arr), fill, arrow::default_memory_pool()).ValueOrDie();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(c.data->data()), c.data->size()), "ab?c");
}

// Dictionary-encoded numbers: decoded; an index past the dictionary or a null without a
// fill is an error, not a read past it or a fill.
TEST(Convert, DictionaryIndicesPastTheDictionaryAreRefused) {
  auto type = arrow::dictionary(arrow::int8(), arrow::int32());
  auto dict = ArrayOf(arrow::int32(), "[10, 20]");
  auto spec = SpecForField(*arrow::field("d", type)).ValueOrDie();
  auto ok = arrow::DictionaryArray::FromArrays(type, ArrayOf(arrow::int8(), "[1, 0, 1]"), dict).ValueOrDie();
  auto c = ConvertColumn(spec, arrow::ChunkedArray(ok), {}, arrow::default_memory_pool()).ValueOrDie();
  EXPECT_EQ(Values<int32_t>(c), (std::vector<int32_t>{20, 10, 20}));
  auto bad = std::make_shared<arrow::DictionaryArray>(type, ArrayOf(arrow::int8(), "[0, 2]"), dict);
  auto r = ConvertColumn(spec, arrow::ChunkedArray(bad), {}, arrow::default_memory_pool());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("dictionary index 2 out of range"), std::string::npos)
      << r.status().message();
  auto with_null =
      arrow::DictionaryArray::FromArrays(type, ArrayOf(arrow::int8(), "[0, null]"), dict).ValueOrDie();
  EXPECT_FALSE(ConvertColumn(spec, arrow::ChunkedArray(with_null), {}, arrow::default_memory_pool()).ok());
  auto filled =
      ConvertColumn(spec, arrow::ChunkedArray(with_null), IntFill(-1), arrow::default_memory_pool());
  ASSERT_TRUE(filled.ok()) << filled.status().ToString();
  EXPECT_EQ(Values<int32_t>(*filled), (std::vector<int32_t>{10, -1}));
  auto stype = arrow::dictionary(arrow::int8(), arrow::utf8());
  auto sspec = SpecForField(*arrow::field("s", stype)).ValueOrDie();
  auto sbad = std::make_shared<arrow::DictionaryArray>(stype, ArrayOf(arrow::int8(), "[0, 2]"),
                                                       ArrayOf(arrow::utf8(), R"(["a", "b"])"));
  auto sr = ConvertColumn(sspec, arrow::ChunkedArray(sbad), {}, arrow::default_memory_pool());
  ASSERT_FALSE(sr.ok());
  EXPECT_NE(sr.status().message().find("dictionary index 2 out of range"), std::string::npos)
      << sr.status().message();
}

}  // namespace pqloader
