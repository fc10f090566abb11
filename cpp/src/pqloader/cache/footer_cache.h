// Parquet footers kept on local disk next to the split cache, so a remote dataset's
// footers are fetched once, not once per run. One file per footer under
// CACHE_DIR/footers/: the Thrift-serialized FileMetaData followed by its XXH64 (8
// bytes); published by rename. Keyed by (file, size, modification time), so a rewritten
// file never gets an old footer. Thread-safety: functions may be called concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <parquet/metadata.h>

namespace pqloader {

/// Return the footer stored for (file, size, mtime_ns) in `cache_dir`, or nullptr.
std::shared_ptr<parquet::FileMetaData> LoadFooter(const std::string& cache_dir,
                                                  const std::string& file, int64_t size,
                                                  int64_t mtime_ns);

/// Store `metadata` for (file, size, mtime_ns) in `cache_dir`, best effort.
void StoreFooter(const std::string& cache_dir, const std::string& file, int64_t size,
                 int64_t mtime_ns, const parquet::FileMetaData& metadata);

}  // namespace pqloader
