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

constexpr uint32_t kCacheFormatVersion = 2;

/// Write `unit` as a complete entry for `key` (a CacheKey, 32 characters) to the open
/// file descriptor `fd` (from offset 0). Returns the number of bytes written.
arrow::Result<int64_t> WriteCacheEntry(int fd, const std::string& key, const DecodedUnit& unit);

/// Parse an entry held in `file`: verify magic, length, checksum (unless
/// `checksum_verified`: the caller hashed the bytes while reading them, see
/// EntryChecksum) and that it is the entry of `key`, then build a DecodedUnit whose
/// buffers are slices of `file` (no copy). Any inconsistency is an Invalid status (the
/// caller drops the entry).
arrow::Result<std::shared_ptr<DecodedUnit>> ReadCacheEntry(
    const std::shared_ptr<arrow::Buffer>& file, const std::string& key,
    bool checksum_verified = false);

/// Bytes of an entry's fixed header (magic, version, reserved, metadata length, key).
constexpr int64_t kCacheEntryHeaderBytes = 56;

/// Return whether the first `n` bytes of a file (at least kCacheEntryHeaderBytes of
/// them, else false) are the header of a cache entry for `key`: the magic, and for
/// format 2 and later, the key stored in the header. Used to prove that a file is an
/// entry before deleting it.
bool IsCacheEntryHeader(const uint8_t* head, int64_t n, const std::string& key);

/// Bytes at the end of an entry that its checksum does not cover.
constexpr int64_t kCacheEntryTrailerBytes = 24;

/// The checksum stored in an entry whose first `covered` bytes hash to `hash`
/// (XXH3-64 with seed 0 of bytes [0, size - kCacheEntryTrailerBytes)), and the stored
/// value: true when they match.
bool EntryChecksumMatches(const uint8_t* entry, int64_t size, uint64_t hash);

}  // namespace pqloader
