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

}  // namespace
}  // namespace pqloader
