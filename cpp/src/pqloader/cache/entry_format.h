// The on-disk format of one cache entry (one decoded, deterministically transformed
// split). Specified in docs/cache_format.md. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <arrow/buffer.h>
#include <arrow/result.h>
#include <arrow/status.h>

#include "pqloader/tensor/batch.h"

namespace pqloader {

constexpr uint32_t kCacheFormatVersion = 3;

/// Where an entry's rows come from: a row group of a file, and that file's identity
/// (size, modification time, footer hash) when it was read. Stored in the entry's header
/// (format 3), so that `pqloader cache stats|prune` can tell entries whose file has
/// changed since (stale: no loader asks for their key any more) without a loader.
struct SourceIdentity {
  std::string path;         ///< The file as loaders name it (DataFile::display).
  int64_t size = 0;         ///< Bytes.
  int64_t mtime_ns = 0;     ///< Modification time, ns since the epoch (0: unknown).
  std::string footer_hash;  ///< FooterHash of the file's footer.
  int64_t row_group = 0;

  /// Return whether `other` describes the same version of the same file (the row
  /// group aside).
  bool SameFileVersion(const SourceIdentity& other) const {
    return path == other.path && size == other.size && mtime_ns == other.mtime_ns &&
           footer_hash == other.footer_hash;
  }
  /// Return the text stored in entry headers (docs/cache_format.md, "Source identity").
  std::string Serialize() const;
  /// Parse what Serialize wrote; Invalid if `text` is not such a text.
  static arrow::Result<SourceIdentity> Parse(const std::string& text);
};

/// The most bytes a serialized SourceIdentity may take in an entry header.
constexpr int64_t kMaxSourceIdentityBytes = 16 << 10;

/// Write `unit` as a complete entry for `key` (a CacheKey, 32 characters) whose rows come
/// from `source` to the open file descriptor `fd` (from offset 0). Returns the number of
/// bytes written.
arrow::Result<int64_t> WriteCacheEntry(int fd, const std::string& key,
                                       const SourceIdentity& source, const DecodedUnit& unit);

/// Parse an entry held in `file`: verify magic, length, checksum (unless
/// `checksum_verified`: the caller hashed the bytes while reading them, see
/// EntryChecksum) and that it is the entry of `key`, then build a DecodedUnit whose
/// buffers are slices of `file` (no copy). Any inconsistency is an Invalid status (the
/// caller drops the entry).
arrow::Result<std::shared_ptr<DecodedUnit>> ReadCacheEntry(
    const std::shared_ptr<arrow::Buffer>& file, const std::string& key,
    bool checksum_verified = false);

/// Where the columns of a plain entry lie in its file, for reading them on demand
/// (straight into a window gather's scratch, see DiskCache's deferred reads): every
/// column fixed-width and in its own buffer (no row mask, row-major block, offsets or
/// samples).
struct CacheEntryColumns {
  struct Column {
    int64_t row_bytes = 0;
    std::vector<int64_t> row_shape;
    int64_t offset = 0;  ///< Of its num_rows * row_bytes bytes in the file.
    int64_t bytes = 0;
  };
  int64_t num_rows = 0;
  std::vector<Column> columns;
};

/// From the first `n` bytes of an entry file of `size` bytes (at least 64 of them, or
/// Invalid), return how many of its first bytes hold its header, source identity and
/// metadata: what ReadCacheEntryColumns needs.
arrow::Result<int64_t> CacheEntryHeadBytes(const uint8_t* head, int64_t n, int64_t size);

/// Parse an entry from its head (its first `n` bytes, at least CacheEntryHeadBytes of
/// them) and its trailer (its last kCacheEntryTrailerBytes bytes), checking what
/// ReadCacheEntry checks but the checksum (the caller verified this version of the file
/// before) and the bytes the metadata references. nullopt for an entry that is not
/// plain (see CacheEntryColumns); Invalid for any inconsistency.
arrow::Result<std::optional<CacheEntryColumns>> ReadCacheEntryColumns(
    const uint8_t* head, int64_t n, const uint8_t* trailer, int64_t size, const std::string& key);

/// Bytes of an entry's fixed header (magic, version, reserved, metadata length, key).
constexpr int64_t kCacheEntryHeaderBytes = 56;

/// What the head of an entry file says.
struct CacheEntryHeader {
  uint32_t version = 0;
  std::string key;  ///< Empty before format 2.
  /// The entry's source; absent before format 3.
  std::optional<SourceIdentity> source;
};
/// Bytes of an entry's head that hold its header and any source identity, at most.
constexpr int64_t kMaxCacheEntryHeadBytes = kCacheEntryHeaderBytes + 8 + kMaxSourceIdentityBytes;
/// Parse the first `n` bytes of an entry file (up to kMaxCacheEntryHeadBytes of them, or
/// the whole file if shorter). Invalid unless they start with an entry header; a format 3
/// header whose source identity is cut off or malformed is Invalid too.
arrow::Result<CacheEntryHeader> ParseCacheEntryHeader(const uint8_t* head, int64_t n);

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

/// Whether `trailer`, the last kCacheEntryTrailerBytes bytes of a file of `size` bytes,
/// ends an entry of that size (its end magic, its stored length equal to `size`): what
/// tells a damaged file before it is read whole.
bool CacheEntryTrailerMatches(const uint8_t* trailer, int64_t size);

}  // namespace pqloader
