// The on-disk format of one cache entry (one decoded, deterministically transformed
// split). Specified in docs/cache_format.md. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <arrow/buffer.h>
#include <arrow/result.h>
#include <arrow/status.h>

#include "pqloader/tensor/batch.h"

namespace pqloader {

constexpr uint32_t kCacheFormatVersion = 1;

/// Write `unit` as a complete entry to the open file descriptor `fd` (from offset 0).
/// Returns the number of bytes written.
arrow::Result<int64_t> WriteCacheEntry(int fd, const DecodedUnit& unit);

/// Parse an entry held in `file` (typically memory-mapped): verify magic, length and
/// checksum, then build a DecodedUnit whose buffers are slices of `file` (no copy).
/// Any inconsistency is an Invalid status (the caller drops the entry).
arrow::Result<std::shared_ptr<DecodedUnit>> ReadCacheEntry(const std::shared_ptr<arrow::Buffer>& file);

}  // namespace pqloader
