// Dataset summaries: the row-group layout of every file of a directory in one file, so
// that opening a dataset of many files reads one object instead of every footer.
//
// `_metadata` at a directory's root is the summary pyarrow (`pq.write_metadata` with a
// metadata collector), Dask and Spark write: one Parquet footer holding the row groups
// of every file, each column chunk naming its file (`file_path`, relative to the root).
// `pqloader index` writes it (WriteDatasetIndex) together with `_pqloader_index`, the
// identity of each file when it was indexed (size, modification time, footer hash):
//
//   pqloader-index 1
//   <size>\t<mtime_ns>\t<footer hash>\t<relative path>
//   ...
//
// A file found by listing is taken from the summary when the summary holds its row
// groups and, where `_pqloader_index` exists, its listed size and modification time are
// those indexed; otherwise (a file written or rewritten since) its own footer is read.
// Without `_pqloader_index` (a summary from another writer) a file the summary holds is
// trusted by its path, as pyarrow and Dask trust it.
#pragma once

#include <future>

#include "pqloader/util/cancel.h"
#include "pqloader/util/progress.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <arrow/filesystem/filesystem.h>
#include <arrow/result.h>
#include <parquet/arrow/schema.h>
#include <parquet/metadata.h>

#include "pqloader/io/filesystem.h"

namespace pqloader {

/// The summary of one directory, as read by ReadSummary.
struct DatasetSummaryFile {
  std::string root;     ///< The directory (path within its filesystem).
  std::string display;  ///< How errors name `_metadata`.
  /// Per file path relative to `root` ('/'-separated, as `file_path` spells it): its row
  /// groups' metadata and the footer hash its cache entries are keyed by.
  struct Entry {
    std::vector<int> row_groups;  ///< The file's row groups in `metadata`, in order.
    std::string footer_hash;
    bool has_identity = false;  ///< Indexed size and mtime known (`_pqloader_index`).
    int64_t size = 0;
    int64_t mtime_ns = 0;
  };
  std::map<std::string, Entry> files;
  /// The whole summary, and its Arrow schema and manifest (every file's: a summary has one
  /// schema), derived by Dataset::Open.
  std::shared_ptr<parquet::FileMetaData> metadata;
  std::shared_ptr<arrow::Schema> arrow_schema;
  std::shared_ptr<const parquet::arrow::SchemaManifest> manifest;

  /// The entry of the file at `path` (within the filesystem) listed with `size` and
  /// `mtime_ns`, or nullptr when the summary does not hold it or it changed since it was
  /// indexed.
  const Entry* Find(const std::string& path, int64_t size, int64_t mtime_ns) const;
};

/// Where a summary was found while listing a directory.
/// One line of `_pqloader_index`.
struct IndexedFile {
  std::string path;  ///< Relative to the directory, '/'-separated.
  int64_t size = 0;
  int64_t mtime_ns = 0;
  std::string footer_hash;
};

/// `_pqloader_index`: the files, in path order, and the hash of the `_metadata` it was
/// written with (empty for an index of format 1, which recorded none).
struct DatasetIndex {
  std::string summary_hash;
  std::vector<IndexedFile> files;
};

struct SummaryRef {
  std::shared_ptr<arrow::fs::FileSystem> fs;
  std::string root;     ///< The directory.
  std::string display;  ///< The source's spelling of `<root>/_metadata`.
  int64_t size = 0;     ///< Of `_metadata`, from the listing.
  bool has_index = false;  ///< `_pqloader_index` was listed beside it.
  int64_t index_size = 0;
  /// The index, when already read (use_summary="only" lists the files from it).
  std::shared_ptr<const DatasetIndex> index;
  /// `_metadata`'s bytes, when their read was started early (PrefetchSummary).
  std::shared_future<arrow::Result<std::string>> bytes;
};

/// Start reading `<root>/_metadata` (`size` bytes) on another thread, so that it travels
/// while the index is read and parsed.
std::shared_future<arrow::Result<std::string>> PrefetchSummary(
    const std::shared_ptr<arrow::fs::FileSystem>& fs, const std::string& root, int64_t size,
    const std::string& display);

/// Read `_pqloader_index` of directory `root` (`size` bytes; -1: ask the filesystem),
/// in the order written (path order). `display` names it in errors.
arrow::Result<DatasetIndex> ReadIndexFile(
    const std::shared_ptr<arrow::fs::FileSystem>& fs, const std::string& root, int64_t size,
    const std::string& display);

/// `rel` below directory `root`, as a path within the filesystem.
std::string JoinPath(const std::string& root, const std::string& rel);

/// Read and split `ref`'s `_metadata` (and `_pqloader_index`) by file. An unreadable or
/// inconsistent summary is an InvalidDataError naming it.
arrow::Result<std::shared_ptr<DatasetSummaryFile>> ReadSummary(const SummaryRef& ref);

/// What WriteDatasetIndex did.
struct IndexResult {
  std::string metadata_path;  ///< As the source names it.
  int64_t files = 0;
  int64_t row_groups = 0;
  int64_t rows = 0;
  int64_t bytes = 0;  ///< Of `_metadata`.
};

/// Write `_metadata` and `_pqloader_index` for the Parquet files below directory
/// `source` (local or s3://), replacing any there: each is written to a temporary name
/// and moved into place. Every file must have the same Parquet schema (a summary has
/// one); files are read with `metadata_threads` threads.
/// `progress` (if given) counts the footers read. Cancelled, writing nothing, once
/// `cancel` is set while the footers are read.
arrow::Result<IndexResult> WriteDatasetIndex(const std::string& source,
                                             const StorageOptions& storage,
                                             int metadata_threads = 8,
                                             Progress* progress = nullptr,
                                             const CancelFlag& cancel = nullptr);

}  // namespace pqloader
