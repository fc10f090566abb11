#include "pqloader/dataset/int96.h"

#include <arrow/type.h>
#include <gtest/gtest.h>

namespace pqloader {
namespace {

// An INT96 value as writers store it: nanoseconds of the day, then the Julian day.
void Int96Of(int64_t day_since_1970, uint64_t nanos_of_day, uint32_t out[3]) {
  out[0] = static_cast<uint32_t>(nanos_of_day);
  out[1] = static_cast<uint32_t>(nanos_of_day >> 32);
  out[2] = static_cast<uint32_t>(day_since_1970 + 2440588);
}

TEST(Int96, FitsNanosecondsExactlyAtTheEdges) {
  uint32_t v[3];
  int64_t day = 0;
  // 2262-04-11T23:47:16.854775807 is INT64_MAX ns: day 106751, 85636854775807 ns.
  Int96Of(106751, 85636854775807ULL, v);
  EXPECT_TRUE(Int96Fits(v, arrow::TimeUnit::NANO, &day));
  Int96Of(106751, 85636854775808ULL, v);
  EXPECT_FALSE(Int96Fits(v, arrow::TimeUnit::NANO, &day));
  EXPECT_EQ(day, 106751);
  // 1677-09-21T00:12:43.145224192 is INT64_MIN ns: day -106752, 763145224192 ns.
  Int96Of(-106752, 763145224192ULL, v);
  EXPECT_TRUE(Int96Fits(v, arrow::TimeUnit::NANO, &day));
  Int96Of(-106752, 763145224191ULL, v);
  EXPECT_FALSE(Int96Fits(v, arrow::TimeUnit::NANO, &day));
  Int96Of(0, 0, v);
  EXPECT_TRUE(Int96Fits(v, arrow::TimeUnit::NANO, &day));
  Int96Of(2932896, 0, v);  // 9999-12-31
  EXPECT_FALSE(Int96Fits(v, arrow::TimeUnit::NANO, &day));
  EXPECT_EQ(CivilDate(day), "9999-12-31");
}

TEST(Int96, FitsCoarserUnitsAsArrowConvertsThem) {
  uint32_t v[3];
  int64_t day = 0;
  // 9999-12-31 and the year 1 fit microseconds, milliseconds and seconds.
  for (auto unit : {arrow::TimeUnit::MICRO, arrow::TimeUnit::MILLI, arrow::TimeUnit::SECOND}) {
    Int96Of(2932896, 86399999999999ULL, v);
    EXPECT_TRUE(Int96Fits(v, unit, &day));
    Int96Of(-719162, 0, v);  // 0001-01-01
    EXPECT_TRUE(Int96Fits(v, unit, &day));
  }
  // INT64_MAX microseconds: day 106751991, 14454775807 us into it.
  Int96Of(106751991, 14454775807999ULL, v);
  EXPECT_TRUE(Int96Fits(v, arrow::TimeUnit::MICRO, &day));
  Int96Of(106751991, 14454775808000ULL, v);
  EXPECT_FALSE(Int96Fits(v, arrow::TimeUnit::MICRO, &day));
  EXPECT_EQ(day, 106751991);
  // The largest Julian day (2^32 - 1) fits milliseconds and seconds.
  Int96Of(int64_t{0xFFFFFFFF} - 2440588, 0, v);
  EXPECT_TRUE(Int96Fits(v, arrow::TimeUnit::MILLI, &day));
  EXPECT_FALSE(Int96Fits(v, arrow::TimeUnit::MICRO, &day));
}

TEST(Int96, CivilDates) {
  EXPECT_EQ(CivilDate(0), "1970-01-01");
  EXPECT_EQ(CivilDate(-1), "1969-12-31");
  EXPECT_EQ(CivilDate(11016), "2000-02-29");
  EXPECT_EQ(CivilDate(-171513), "1500-06-01");
  EXPECT_EQ(CivilDate(376200), "3000-01-01");
}

TEST(Int96, CivilDatesBeforeTheYearZero) {
  EXPECT_EQ(CivilDate(-719468), "0000-03-01");
  EXPECT_EQ(CivilDate(-719469), "0000-02-29");
  EXPECT_EQ(CivilDate(-719528), "0000-01-01");
}

TEST(Int96, CoarserUnitsDivideTheNanosecondsAsUnsigned) {
  // Nanoseconds of the day past 2^63 (corrupt, but Arrow divides them unsigned): on this
  // day the unsigned reading (+9223372036854775 us) overflows int64 microseconds, the
  // signed one (-9223372036854775 us) would fit.
  uint32_t v[3];
  int64_t day = 0;
  const uint64_t nanos = (uint64_t{1} << 63) + 5;
  Int96Of(106751991 - 106751, nanos, v);
  EXPECT_FALSE(Int96Fits(v, arrow::TimeUnit::MICRO, &day));
}

}  // namespace
}  // namespace pqloader
