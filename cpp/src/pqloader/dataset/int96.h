// INT96 timestamps (Impala, Hive and Spark's default) checked from their stored bytes.
//
// Arrow C++ converts an INT96 value (nanoseconds of the day, Julian day) to int64
// nanoseconds since 1970 without checking the range, so a date outside 1677-09-21 ..
// 2262-04-11 (Spark's 9999-12-31 "end of time", a year 1500) comes out wrapped: another
// date, silently. pqloader reads INT96 as nanoseconds unless told another unit
// (DatasetOptions::int96_unit: microseconds hold years -290308 to 294247), and this check
// refuses a value the conversion to that unit cannot hold, naming its row and date.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <arrow/status.h>
#include <arrow/type_fwd.h>
#include <parquet/file_reader.h>

namespace pqloader {

/// Whether the INT96 value (nanoseconds of the day, Julian day) is held exactly by
/// Arrow's conversion to int64 `unit`s since the Unix epoch (parquet/types.h
/// Int96GetNanoSeconds and its siblings, which wrap); else `*day` is its day number since
/// 1970-01-01 (for the message).
bool Int96Fits(const uint32_t value[3], arrow::TimeUnit::type unit, int64_t* day);

/// Return "YYYY-MM-DD" of `day` days since 1970-01-01 (proleptic Gregorian).
std::string CivilDate(int64_t day);

/// Check the INT96 values of leaf column `leaf` in row group `row_group` of `reader`, in
/// the rows `[first, last)` of the row group, or, when `kept` is not null, in rows
/// (*kept)[first..last) (ascending), as read in `unit`. Returns kInvalidData naming
/// `where`, the row and its date for the first value that does not fit; the rows after
/// `last` are not read.
arrow::Status CheckInt96Rows(parquet::ParquetFileReader* reader, int row_group, int leaf,
                             int64_t first, int64_t last, const std::vector<int32_t>* kept,
                             arrow::TimeUnit::type unit, const std::string& where);

}  // namespace pqloader
