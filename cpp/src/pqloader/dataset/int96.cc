#include "pqloader/dataset/int96.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include <parquet/column_reader.h>
#include <parquet/exception.h>
#include <parquet/schema.h>
#include <parquet/types.h>
#include <arrow/type.h>

#include "pqloader/error.h"

namespace pqloader {

namespace {

constexpr int64_t kJulianDayOf1970 = 2440588;
constexpr int64_t kNanosPerDay = int64_t{86400} * 1000 * 1000 * 1000;
constexpr int64_t kLevelsPerRead = 4096;

}  // namespace

bool Int96Fits(const uint32_t value[3], arrow::TimeUnit::type unit, int64_t* day) {
  // Arrow's formulas (parquet/types.h Int96GetNanoSeconds and its siblings), computed
  // without wrapping.
  *day = static_cast<int64_t>(value[2]) - kJulianDayOf1970;
  __int128 exact = 0;
  if (unit == arrow::TimeUnit::NANO) {
    int64_t nanos_of_day = 0;
    std::memcpy(&nanos_of_day, value, sizeof(nanos_of_day));
    exact = static_cast<__int128>(*day) * kNanosPerDay + nanos_of_day;
  } else {
    // The other units divide the nanoseconds of the day as unsigned, as Arrow does.
    const int64_t per_second = unit == arrow::TimeUnit::MICRO   ? 1000 * 1000
                               : unit == arrow::TimeUnit::MILLI ? 1000
                                                                : 1;
    const int64_t divisor = int64_t{1000} * 1000 * 1000 / per_second;
    uint64_t nanos_of_day = 0;
    std::memcpy(&nanos_of_day, value, sizeof(nanos_of_day));
    exact = static_cast<__int128>(*day) * 86400 * per_second +
            static_cast<__int128>(nanos_of_day / static_cast<uint64_t>(divisor));
  }
  return exact >= INT64_MIN && exact <= INT64_MAX;
}

std::string CivilDate(int64_t day) {
  // Howard Hinnant's days_from_civil, inverted.
  const int64_t z = day + 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const int64_t doe = z - era * 146097;
  const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const int64_t mp = (5 * doy + 2) / 153;
  const int64_t d = doy - (153 * mp + 2) / 5 + 1;
  const int64_t m = mp < 10 ? mp + 3 : mp - 9;
  const int64_t y = yoe + era * 400 + (m <= 2 ? 1 : 0);
  char text[64];
  std::snprintf(text, sizeof(text), "%04lld-%02lld-%02lld", static_cast<long long>(y),
                static_cast<long long>(m), static_cast<long long>(d));
  return text;
}

arrow::Status CheckInt96Rows(parquet::ParquetFileReader* reader, int row_group, int leaf,
                             int64_t first, int64_t last, const std::vector<int32_t>* kept,
                             arrow::TimeUnit::type unit, const std::string& where) {
  if (first >= last) return arrow::Status::OK();
  const int64_t last_row = kept != nullptr ? (*kept)[last - 1] : last - 1;
  auto selected = [&](int64_t row) {
    if (kept == nullptr) return row >= first && row < last;
    return std::binary_search(kept->begin() + first, kept->begin() + last,
                              static_cast<int32_t>(row));
  };
  try {
    std::shared_ptr<parquet::ColumnReader> column = reader->RowGroup(row_group)->Column(leaf);
    auto* typed = dynamic_cast<parquet::Int96Reader*>(column.get());
    if (typed == nullptr) return arrow::Status::OK();  // not INT96: nothing to check
    const parquet::ColumnDescriptor* descr = column->descr();
    const int16_t max_def = descr->max_definition_level();
    const bool repeated = descr->max_repetition_level() > 0;
    std::vector<int16_t> def(kLevelsPerRead), rep(kLevelsPerRead);
    std::vector<parquet::Int96> values(kLevelsPerRead);
    int64_t row = -1;
    while (typed->HasNext() && row <= last_row) {
      int64_t values_read = 0;
      const int64_t levels = typed->ReadBatch(kLevelsPerRead, def.data(), rep.data(),
                                              values.data(), &values_read);
      if (levels == 0) break;
      int64_t v = 0;
      for (int64_t i = 0; i < levels; ++i) {
        if (!repeated || rep[i] == 0) ++row;
        if (max_def > 0 && def[i] < max_def) continue;  // a null: no value
        const parquet::Int96& value = values[v++];
        int64_t day = 0;
        if (row <= last_row && !Int96Fits(value.value.data(), unit, &day) && selected(row)) {
          if (unit != arrow::TimeUnit::NANO) {  // microseconds (coarser units hold every day)
            return MakeError(ErrorKind::kInvalidData, "cannot decode ", where,
                             ": the INT96 timestamp of row ", row, " (", CivilDate(day),
                             ") is outside the dates int64 microseconds hold (years -290308 "
                             "to 294247); pqloader does not wrap it into another date");
          }
          return MakeError(ErrorKind::kInvalidData, "cannot decode ", where,
                           ": the INT96 timestamp of row ", row, " (", CivilDate(day),
                           ") is outside the dates int64 nanoseconds hold (1677-09-21 to "
                           "2262-04-11); pqloader reads INT96 timestamps as nanoseconds and does "
                           "not wrap them into other dates: pass coerce_int96_timestamp_unit='us' "
                           "to read them as microseconds (years -290308 to 294247), or write the "
                           "column as microsecond timestamps (Spark's "
                           "spark.sql.parquet.outputTimestampType=TIMESTAMP_MICROS)");
        }
      }
    }
  } catch (const std::exception& e) {
    return MakeError(ErrorKind::kInvalidData, "cannot decode ", where,
                     " (corrupt or truncated data): ", e.what());
  }
  return arrow::Status::OK();
}

}  // namespace pqloader
