#include "pqloader/dataset/hive.h"

#include <gtest/gtest.h>

namespace pqloader {
namespace {

TEST(Hive, ValuesArePercentDecodedAsPyarrowDoes) {
  EXPECT_EQ(UriUnescape("New%20York"), "New York");
  EXPECT_EQ(UriUnescape("S%C3%A3o"), "S\xC3\xA3o");
  EXPECT_EQ(UriUnescape("a+b"), "a+b");        // '+' stays
  EXPECT_EQ(UriUnescape("100%"), "100%");      // a lone '%' stays
  EXPECT_EQ(UriUnescape("%zz%4"), "%zz%4");    // not two hex digits
  auto s = ParseHiveSegment("city=New%20York");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->key, "city");
  EXPECT_EQ(s->value, "New York");
  EXPECT_FALSE(s->is_null);
  auto escaped = ParseHiveSegment("my%3Akey=a%3Ab");  // Spark escapes keys too
  ASSERT_TRUE(escaped.has_value());
  EXPECT_EQ(escaped->key, "my:key");
  EXPECT_EQ(escaped->value, "a:b");
  auto n = ParseHiveSegment("city=__HIVE_DEFAULT_PARTITION__");
  ASSERT_TRUE(n.has_value());
  EXPECT_TRUE(n->is_null);
  EXPECT_FALSE(ParseHiveSegment("=x").has_value());
  EXPECT_FALSE(ParseHiveSegment("plain").has_value());
}

TEST(Hive, ParquetIsToldByExtensionOrMagic) {
  EXPECT_TRUE(HasParquetExtension("a/part-0.snappy.parquet"));
  EXPECT_TRUE(HasParquetExtension("x.PQ"));
  EXPECT_FALSE(HasParquetExtension("README.md"));
  EXPECT_TRUE(HasParquetMagic("PAR1"));
  EXPECT_TRUE(HasParquetMagic("PARE"));  // an encrypted footer
  EXPECT_FALSE(HasParquetMagic("# da"));
  EXPECT_FALSE(HasParquetMagic("PAR"));
}

TEST(Hive, EscapesAtTheEndAndInLowerCaseAreDecoded) {
  EXPECT_EQ(UriUnescape("a%2f"), "a/");
  EXPECT_EQ(UriUnescape("x%20"), "x ");
  EXPECT_EQ(UriUnescape("%41"), "A");
  EXPECT_EQ(UriUnescape("%4"), "%4");
}

TEST(Hive, ASegmentSplitsAtItsFirstEquals) {
  auto s = ParseHiveSegment("expr=a=b");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->key, "expr");
  EXPECT_EQ(s->value, "a=b");
  auto n = ParseHiveSegment("city=");
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->value, "");
  EXPECT_FALSE(n->is_null);
}

TEST(Hive, EveryParquetExtensionAndOnlyWholeIntegers) {
  EXPECT_TRUE(HasParquetExtension("a.parq"));
  EXPECT_TRUE(HasParquetExtension("a.Parquet"));
  EXPECT_TRUE(HasParquetExtension("a.pq"));
  EXPECT_FALSE(HasParquetExtension("a.parquet.tmp"));
  EXPECT_FALSE(HasParquetExtension("q"));
  EXPECT_TRUE(ParsesAsInt64("12"));
  EXPECT_TRUE(ParsesAsInt64("-5"));
  EXPECT_FALSE(ParsesAsInt64("12abc"));
  EXPECT_FALSE(ParsesAsInt64(""));
  EXPECT_FALSE(ParsesAsInt64("1.5"));
  EXPECT_FALSE(ParsesAsInt64("99999999999999999999"));
}

}  // namespace
}  // namespace pqloader
