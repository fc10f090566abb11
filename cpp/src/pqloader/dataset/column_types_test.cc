#include "pqloader/dataset/column_types.h"

#include <gtest/gtest.h>

#include <arrow/api.h>
#include <arrow/extension/fixed_shape_tensor.h>
#include <arrow/json/from_string.h>

#include "pqloader/error.h"

namespace pqloader {

TEST(ColumnTypes, UnsupportedTypesNameTheColumnAndType) {
  for (const auto& type :
       {arrow::struct_({arrow::field("a", arrow::int32())}), arrow::map(arrow::utf8(), arrow::int32()),
        arrow::list(arrow::list(arrow::int32())), arrow::null(),
        arrow::list(arrow::struct_({arrow::field("a", arrow::int32())}))}) {
    auto r = SpecForField(*arrow::field("bad", type));
    ASSERT_FALSE(r.ok()) << type->ToString();
    EXPECT_EQ(GetErrorDetail(r.status())->kind(), ErrorKind::kUnsupportedType);
    EXPECT_NE(r.status().message().find("'bad'"), std::string::npos);
    EXPECT_NE(r.status().message().find(type->ToString()), std::string::npos);
  }
}

TEST(ColumnTypes, WiderTypesConvertExactlyAndOthersDoNot) {
  EXPECT_TRUE(ConvertsTo(*arrow::int32(), *arrow::int64()));
  EXPECT_TRUE(ConvertsTo(*arrow::uint16(), *arrow::int32()));
  EXPECT_FALSE(ConvertsTo(*arrow::uint32(), *arrow::int32()));
  EXPECT_FALSE(ConvertsTo(*arrow::int64(), *arrow::int32()));
  EXPECT_TRUE(ConvertsTo(*arrow::float32(), *arrow::float64()));
  EXPECT_FALSE(ConvertsTo(*arrow::int64(), *arrow::float64()));
  EXPECT_TRUE(ConvertsTo(*arrow::int64(), *arrow::float64(), /*declared=*/true));
  EXPECT_TRUE(ConvertsTo(*arrow::utf8(), *arrow::large_utf8()));
  EXPECT_TRUE(ConvertsTo(*arrow::utf8_view(), *arrow::utf8()));
  EXPECT_FALSE(ConvertsTo(*arrow::utf8(), *arrow::binary()));
  EXPECT_TRUE(ConvertsTo(*arrow::null(), *arrow::list(arrow::int8())));
  EXPECT_TRUE(ConvertsTo(*arrow::list(arrow::int16()), *arrow::large_list(arrow::int64())));
  EXPECT_TRUE(CommonType(arrow::int32(), arrow::int64())->Equals(*arrow::int64()));
  EXPECT_TRUE(CommonType(arrow::uint32(), arrow::int8())->Equals(*arrow::int64()));
  EXPECT_TRUE(CommonType(arrow::utf8(), arrow::large_utf8())->Equals(*arrow::large_utf8()));
  // Whatever the files' order, and never a dictionary whose indices may not hold the values.
  EXPECT_TRUE(CommonType(arrow::large_utf8(), arrow::utf8())->Equals(*arrow::large_utf8()));
  EXPECT_TRUE(CommonType(arrow::utf8(), arrow::dictionary(arrow::int8(), arrow::utf8()))
                  ->Equals(*arrow::large_utf8()));
  EXPECT_TRUE(CommonType(arrow::fixed_size_binary(2), arrow::binary())->Equals(*arrow::large_binary()));
  EXPECT_TRUE(CommonType(arrow::utf8(), arrow::utf8())->Equals(*arrow::utf8()));
  EXPECT_EQ(CommonType(arrow::utf8(), arrow::binary()), nullptr);  // (schema= binary takes both)
  EXPECT_TRUE(CommonType(arrow::list(arrow::large_utf8()), arrow::list(arrow::utf8()))
                  ->Equals(*arrow::list(arrow::large_utf8())));
  EXPECT_TRUE(CommonType(arrow::list(arrow::utf8()), arrow::list(arrow::dictionary(arrow::int8(), arrow::utf8())))
                  ->Equals(*arrow::list(arrow::large_utf8())));
  EXPECT_TRUE(CommonType(arrow::list(arrow::int32()), arrow::list(arrow::int64()))->Equals(*arrow::list(arrow::int64())));
  EXPECT_EQ(CommonType(arrow::int64(), arrow::float64()), nullptr);
  EXPECT_EQ(CommonType(arrow::utf8(), arrow::int64()), nullptr);
  EXPECT_EQ(CommonType(arrow::timestamp(arrow::TimeUnit::MILLI), arrow::timestamp(arrow::TimeUnit::MICRO)),
            nullptr);
}

TEST(ColumnTypes, SpecsFollowTheArrowType) {
  auto f32 = SpecForField(*arrow::field("x", arrow::float32())).ValueOrDie();
  EXPECT_EQ(f32.kind, ColumnKind::kTensor);
  EXPECT_EQ(f32.dtype, DType::kFloat32);
  auto s = SpecForField(*arrow::field("s", arrow::utf8())).ValueOrDie();
  EXPECT_EQ(s.kind, ColumnKind::kString);
  SpecOptions as_bytes;
  as_bytes.strings_as_bytes = true;
  EXPECT_EQ(SpecForField(*arrow::field("s", arrow::utf8()), as_bytes).ValueOrDie().kind, ColumnKind::kBytes);
  DType d;
  EXPECT_TRUE(ElementType(*arrow::timestamp(arrow::TimeUnit::MICRO), &d));
  EXPECT_EQ(d, DType::kInt64);
  EXPECT_FALSE(ElementType(*arrow::utf8(), &d));
  EXPECT_TRUE(ValueType(*arrow::dictionary(arrow::int8(), arrow::utf8())).Equals(*arrow::utf8()));
}

// Conversions that would lose values (a narrower float, fewer decimal places or integer
// digits, another list or binary size, a decimal to float64 undeclared) are refused.
TEST(ColumnTypes, ConversionsThatLoseValuesAreRefused) {
  EXPECT_FALSE(ConvertsTo(*arrow::float64(), *arrow::float32()));
  EXPECT_FALSE(ConvertsTo(*arrow::float32(), *arrow::float16()));
  EXPECT_TRUE(ConvertsTo(*arrow::float16(), *arrow::float32()));
  EXPECT_TRUE(ConvertsTo(*arrow::decimal128(10, 2), *arrow::decimal128(12, 4)));
  EXPECT_FALSE(ConvertsTo(*arrow::decimal128(10, 4), *arrow::decimal128(12, 2)));  // places
  EXPECT_FALSE(ConvertsTo(*arrow::decimal128(10, 2), *arrow::decimal128(10, 4)));  // digits
  EXPECT_FALSE(ConvertsTo(*arrow::decimal128(10, 2), *arrow::float64()));
  EXPECT_TRUE(ConvertsTo(*arrow::decimal128(10, 2), *arrow::float64(), /*declared=*/true));
  EXPECT_FALSE(ConvertsTo(*arrow::fixed_size_list(arrow::int8(), 3),
                          *arrow::fixed_size_list(arrow::int8(), 4)));
  EXPECT_FALSE(ConvertsTo(*arrow::fixed_size_list(arrow::int8(), 4),
                          *arrow::fixed_size_list(arrow::int8(), 3)));
  EXPECT_TRUE(ConvertsTo(*arrow::fixed_size_list(arrow::int8(), 3),
                         *arrow::fixed_size_list(arrow::int16(), 3)));
  EXPECT_FALSE(ConvertsTo(*arrow::list(arrow::int8()), *arrow::fixed_size_list(arrow::int8(), 3)));
  EXPECT_FALSE(ConvertsTo(*arrow::binary(), *arrow::fixed_size_binary(4)));
  EXPECT_FALSE(ConvertsTo(*arrow::fixed_size_binary(2), *arrow::fixed_size_binary(3)));
  EXPECT_TRUE(ConvertsTo(*arrow::fixed_size_binary(2), *arrow::binary()));
}

// Two types neither converts to: a type that holds both, or none.
TEST(ColumnTypes, CommonTypesHoldBothTypesValues) {
  // decimal(10, 2) and decimal(5, 4): 8 integer digits and 4 places.
  auto d = CommonType(arrow::decimal128(10, 2), arrow::decimal128(5, 4));
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(d->Equals(*arrow::decimal128(12, 4))) << d->ToString();
  auto wide = CommonType(arrow::decimal128(38, 0), arrow::decimal128(20, 10));
  ASSERT_NE(wide, nullptr);
  EXPECT_TRUE(wide->Equals(*arrow::decimal256(48, 10))) << wide->ToString();
  // A list and a large list of values neither converts to: a large list.
  auto ll = CommonType(arrow::list(arrow::uint32()), arrow::large_list(arrow::int8()));
  ASSERT_NE(ll, nullptr);
  EXPECT_TRUE(ll->Equals(*arrow::large_list(arrow::int64()))) << ll->ToString();
  auto ll2 = CommonType(arrow::large_list(arrow::uint32()), arrow::list(arrow::int8()));
  ASSERT_NE(ll2, nullptr);
  EXPECT_TRUE(ll2->Equals(*arrow::large_list(arrow::int64()))) << ll2->ToString();
  auto fl = CommonType(arrow::fixed_size_list(arrow::uint8(), 2), arrow::fixed_size_list(arrow::int8(), 2));
  ASSERT_NE(fl, nullptr);
  EXPECT_TRUE(fl->Equals(*arrow::fixed_size_list(arrow::int16(), 2))) << fl->ToString();
  EXPECT_EQ(CommonType(arrow::fixed_size_list(arrow::uint8(), 2), arrow::fixed_size_list(arrow::int8(), 3)),
            nullptr);
  EXPECT_EQ(CommonType(arrow::uint64(), arrow::int8()), nullptr);  // no signed type holds both
}

// A fixed_shape_tensor extension column is its shape's fixed-size lists, row-major,
// outermost dim first; a sliced array keeps its rows.
TEST(ColumnTypes, ATensorExtensionIsItsShapesFixedSizeLists) {
  auto ext = arrow::extension::fixed_shape_tensor(arrow::int32(), {2, 3});
  auto plain = arrow::fixed_size_list(arrow::fixed_size_list(arrow::int32(), 3), 2);
  ASSERT_TRUE(TypeWithoutExtension(ext)->Equals(*plain)) << TypeWithoutExtension(ext)->ToString();
  EXPECT_TRUE(TypeWithoutExtension(arrow::int32())->Equals(*arrow::int32()));
  auto storage = arrow::json::ArrayFromJSONString(
                     arrow::fixed_size_list(arrow::int32(), 6),
                     "[[0,1,2,3,4,5], [6,7,8,9,10,11], [12,13,14,15,16,17]]")
                     .ValueOrDie();
  auto array = arrow::ExtensionType::WrapArray(ext, storage);
  auto column = std::make_shared<arrow::ChunkedArray>(array->Slice(1, 2));
  auto made = WithoutExtension(column, arrow::default_memory_pool());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  auto out = *made;
  ASSERT_TRUE(out->type()->Equals(*plain)) << out->type()->ToString();
  auto want = arrow::json::ArrayFromJSONString(
                  plain, "[[[6,7,8],[9,10,11]], [[12,13,14],[15,16,17]]]")
                  .ValueOrDie();
  ASSERT_EQ(out->num_chunks(), 1);
  EXPECT_TRUE(out->chunk(0)->Equals(*want)) << out->chunk(0)->ToString();
}

}  // namespace pqloader
