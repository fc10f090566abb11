// Parquet footers kept on local disk next to the split cache, so a remote dataset's
// footers are fetched once, not once per run (local files' footers are read from the
// file: as cheap, and never stale). One file per footer under CACHE_DIR/footers/: the
// footer's bytes as the file holds them (Thrift FileMetaData), the file's key (32 hex
// digits: a file in another key's place is not used) and the XXH64 of both (8 bytes);
// published by rename.
// Keyed by (file, size, modification time); see docs/cache_format.md for what that
// cannot see. Thread-safety: functions may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <parquet/metadata.h>

namespace pqloader {

/// Return the footer stored for (file, size, mtime_ns) in `cache_dir`, or nullptr; its
/// bytes in `*footer`.
std::shared_ptr<parquet::FileMetaData> LoadFooter(const std::string& cache_dir,
                                                  const std::string& file, int64_t size,
                                                  int64_t mtime_ns, std::string* footer);

/// Store the footer bytes `footer` of (file, size, mtime_ns) in `cache_dir`, best effort:
/// why it could not (a full or read-only disk), naming the file, or "" once it is stored.
std::string StoreFooter(const std::string& cache_dir, const std::string& file, int64_t size,
                        int64_t mtime_ns, const std::string& footer);

/// Return whether the file at `path` is a footer file whose checksum verifies.
bool IsFooterFile(const std::string& path);

/// Return the XXH3-128 hash (32 hex digits) of a footer's bytes as the file holds them
/// (not re-serialized: a hostile footer that parses may not serialize). Part of every
/// split cache key, so that a file rewritten with the same size and modification time
/// but another footer misses.
std::string FooterHash(const std::string& footer);

}  // namespace pqloader
