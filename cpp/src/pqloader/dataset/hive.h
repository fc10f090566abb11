// Hive-style partition directories (`key=value/`) and how files are told to be Parquet.
//
// Partition values are decoded as pyarrow's HivePartitioning does by default
// (segment_encoding="uri"): the key and the value are percent-decoded ("New%20York" →
// "New York", Spark's "my%3Akey" → "my:key"; '+' stays); Hive's __HIVE_DEFAULT_PARTITION__ (Spark's value for a null
// key) is null. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pqloader {

/// The value Hive and Spark write for a null partition key.
inline constexpr std::string_view kHiveNullValue = "__HIVE_DEFAULT_PARTITION__";

/// A `key=value` path component, decoded.
struct HiveSegment {
  std::string key;
  std::string value;  ///< Percent-decoded; empty when null.
  bool is_null = false;
};

/// Parse one path component; nullopt if it is not `key=value` (with a non-empty key).
std::optional<HiveSegment> ParseHiveSegment(std::string_view component);

/// Whether a partition value is an int64 in decimal (the keys whose every non-null value
/// is one load as int64, the others as strings).
bool ParsesAsInt64(std::string_view value);

/// Percent-decode `s` ("%20" → ' '); a '%' not followed by two hex digits stays as is.
std::string UriUnescape(std::string_view s);

/// Whether a file name says Parquet by its extension (.parquet, .parq, .pq; any case).
bool HasParquetExtension(std::string_view path);

/// Whether `head` (the first 4 bytes of a file) is Parquet's magic "PAR1" (or "PARE", an
/// encrypted footer). Only the head: a file cut short or with a damaged end is still
/// Parquet, and its footer's error names it (a tail check skipped it, its rows lost).
bool HasParquetMagic(std::string_view head);

}  // namespace pqloader
