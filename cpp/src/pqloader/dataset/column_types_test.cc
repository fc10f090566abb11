#include "pqloader/dataset/column_types.h"

#include <gtest/gtest.h>

#include <arrow/api.h>

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

}  // namespace pqloader
