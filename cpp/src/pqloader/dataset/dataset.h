// Dataset: an ordered list of Parquet files, their validated schema and their splits.
//
// Sources are paths, directories (recursive), glob patterns, explicit lists or URIs that
// Arrow's filesystem layer resolves (file://, s3://, and gs:// or hdfs:// where the build
// supports them; see io/filesystem.h).
// Order is canonical: sorted by path within a directory or glob, the caller's order
// across sources. Files found in a directory or by a glob that are not Parquet (no
// .parquet/.parq/.pq extension and no "PAR1" magic at both ends: README.md,
// manifest.json) are skipped and listed (skipped_files()); a file named explicitly, or
// one with a Parquet extension, must be Parquet. Opening reads every footer once (in
// parallel) and resolves the columns (see columns.h: unified types, absent columns,
// struct leaves) up front. A split is one row group. Thread-safety: immutable after
// Open().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <arrow/filesystem/filesystem.h>
#include <arrow/io/interfaces.h>
#include <arrow/memory_pool.h>
#include <arrow/result.h>
#include <arrow/type.h>
#include <parquet/metadata.h>
#include <parquet/properties.h>

#include "pqloader/dataset/columns.h"
#include "pqloader/dataset/hive.h"
#include "pqloader/dataset/summary.h"
#include "pqloader/io/filesystem.h"
#include "pqloader/tensor/batch.h"
#include "pqloader/util/cancel.h"
#include "pqloader/util/progress.h"
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

struct DatasetOptions {
  /// Columns to read, their types, null masks; see ColumnsOptions.
  ColumnsOptions columns;
  /// Threads that read footers while opening. Default: 8.
  int metadata_threads = 8;
  /// Options of s3:// sources. Default: none (the standard AWS sources).
  StorageOptions storage;
  /// Directory where footers of remote (non-local) files are kept between runs (see
  /// cache/footer_cache.h). Local files' footers are always read from the file: that
  /// is as cheap as reading a cached copy, and never stale.
  /// Default: empty (footers are read from the source every run).
  std::string footer_cache_dir;
  /// Row groups to read, per file: file name (as DataFile::display names it: the source
  /// string for a file given explicitly) -> row-group indices. Listed row groups are read
  /// in file order, each once; a file that is not listed is read whole, one listed with
  /// no index not at all. Every name must be a file of the dataset. Default: empty
  /// (every row group of every file).
  std::map<std::string, std::vector<int>> row_groups;
  /// Take the row-group layout of files from a directory's summary (`_metadata`, see
  /// dataset/summary.h) instead of their footers. Default: true.
  bool use_summary = true;
  /// With use_summary: take a directory's files from its `_pqloader_index` instead of
  /// listing it (no LIST requests; files added since the index are not seen), and check
  /// each file's footer against the index when it is first read (a changed file is an
  /// error). Default: false.
  bool summary_only = false;
  /// Set to stop reading footers early (Cancelled). Default: none.
  CancelFlag cancel;
  /// The unit INT96 timestamps are read in (Arrow's coerce_int96_timestamp_unit): their
  /// columns load as timestamp[unit], and a value the unit cannot hold is an error
  /// (dataset/int96.h). Default: nanoseconds (dates 1677-09-21 to 2262-04-11).
  arrow::TimeUnit::type int96_unit = arrow::TimeUnit::NANO;
};

/// Whether a file's footer still is the one indexed (checked once, on first read).
struct FooterCheck {
  Mutex mu;
  bool done PQ_GUARDED_BY(mu) = false;
  arrow::Status status PQ_GUARDED_BY(mu);
};

/// A file's row groups in a dataset summary (`_metadata`), and the file's own footer
/// object made from them on first use (see DataFile::Metadata).
struct SummaryRowGroups {
  std::shared_ptr<parquet::FileMetaData> summary;  ///< The whole summary.
  std::vector<int> row_groups;                     ///< This file's, in file order.
  std::string display;                             ///< How errors name the summary.
  mutable std::once_flag once;
  mutable std::shared_ptr<parquet::FileMetaData> subset;
  mutable std::string error;
};

/// One Parquet file of the dataset.
struct DataFile {
  std::shared_ptr<arrow::fs::FileSystem> fs;
  std::string path;     ///< Path within `fs`.
  std::string display;  ///< How errors name the file (the URI or path the user gave).
  int64_t size = 0;
  int64_t mtime_ns = 0;  ///< Modification time (0 if the filesystem has none).
  /// The footer, read from the file (or the footer cache); null for a file whose layout
  /// came from a summary (`summary` then): use Metadata(), RowGroup(), schema().
  std::shared_ptr<parquet::FileMetaData> metadata;
  /// Set when the row-group layout came from a summary. RowGroup(), schema() and
  /// num_row_groups() read the summary directly; only Metadata() (a reader of the file's
  /// data) makes the file's own footer object, once: at 10^5 files, making them all up
  /// front was a third of the start-up, and a rank reads few of them.
  std::shared_ptr<const SummaryRowGroups> summary;
  /// Hash of the footer (see FooterHash): with path, size and mtime, the file's identity
  /// in cache keys, so a file rewritten with the same size and mtime is not served
  /// from stale entries.
  std::string footer_hash;
  /// Whether footer_hash is the file's own footer's (read from the file, or recorded by
  /// `_pqloader_index`), not one standing for its place in a pyarrow `_metadata` (which
  /// changes with use_summary): a state records only an own hash.
  bool footer_hash_is_own = false;
  /// Whether what cache_dir keeps under this file's identity (size, time, footer hash)
  /// is safe to keep: a local file, or an object modified at least 2 s before the dataset
  /// listed it. Object stores give times in whole seconds, so an object modified just
  /// before can still be replaced within its second by one of the same size and footer
  /// (the same values in another order): its decoded row groups and a filter's selection
  /// are then not kept (the next Loader keeps them), as its footer is not.
  bool settled = true;
  /// Where each output column (specs order) is in this file.
  std::vector<ColumnSource> columns;
  /// Leaf (Parquet column) indices of the selected file columns, sorted, each once.
  std::vector<int> leaf_indices;
  /// Value of each partition key of the dataset, decoded from the path, and whether it
  /// is null (__HIVE_DEFAULT_PARTITION__).
  std::vector<std::string> partition_values;
  std::vector<uint8_t> partition_null;
  /// Set for a file taken from an index without listing (DatasetOptions::summary_only):
  /// its footer is compared with footer_hash before its first row group is read.
  std::shared_ptr<FooterCheck> footer_check;

  /// The file's footer metadata (for a file from a summary, made from it on first use;
  /// thread-safe). Throws parquet::ParquetException if the summary's part is corrupt.
  std::shared_ptr<parquet::FileMetaData> Metadata() const;
  /// Row group `rg` (the file's index) of the footer or the summary.
  std::unique_ptr<parquet::RowGroupMetaData> RowGroup(int rg) const;
  int num_row_groups() const;
  int64_t num_rows() const;
  const parquet::SchemaDescriptor* schema() const;
  std::shared_ptr<const arrow::KeyValueMetadata> key_value_metadata() const;
  /// The file opened with its listed size; on an object store a read its current body
  /// does not fill is an error (OpenListedFile, io/filesystem.h). Buffers from `pool`.
  arrow::Result<std::shared_ptr<arrow::io::RandomAccessFile>> Open(
      arrow::MemoryPool* pool = arrow::default_memory_pool()) const;
};

/// A file found under a source that is not Parquet, and why it was skipped.
struct SkippedFile {
  std::string path;
  std::string reason;
};

/// The most rows one row group may have (row positions within a shuffle window are
/// 32-bit; writers cap row groups far lower). A footer claiming more is refused as
/// corrupt.
constexpr int64_t kMaxRowGroupRows = (int64_t{1} << 31) - 1;

/// One row group (or the rows of it a filter keeps, see filter/row_filter.h).
struct Split {
  int32_t file = 0;
  int32_t row_group = 0;
  /// Rows the loader reads: the row group's, or those the filter kept.
  int64_t num_rows = 0;
  int64_t compressed_bytes = 0;    ///< Of the selected columns' chunks.
  int64_t uncompressed_bytes = 0;  ///< Of the selected columns' chunks.
  /// Rows of the row group in the file (its footer's count).
  int64_t file_rows = 0;
  /// The rows a filter kept (ascending indices within the row group, num_rows of
  /// them); null when every row is read.
  std::shared_ptr<const std::vector<int32_t>> rows;
};

class Dataset {
 public:
  /// Discover, open and validate the files of `sources`.
  static arrow::Result<std::shared_ptr<Dataset>> Open(const std::vector<std::string>& sources,
                                                      const DatasetOptions& options);

  const std::vector<DataFile>& files() const { return files_; }
  const std::vector<Split>& splits() const { return splits_; }
  /// Output columns, in output order.
  const std::vector<ColumnSpec>& specs() const { return specs_; }
  /// The Arrow schema of the output columns, in output order: unified (or declared)
  /// types, partition keys int64 or utf8, masks bool; nullable where a column can hold nulls.
  const std::shared_ptr<arrow::Schema>& schema() const { return schema_; }
  /// For each output column, its index among partition keys, or -1 for a file column.
  const std::vector<int>& partition_index() const { return partition_index_; }
  /// The partition keys of the paths.
  const std::vector<std::string>& partition_keys() const { return partition_keys_; }
  /// Per partition key: how it loads (columns.h).
  const std::vector<KeyLoad>& key_loads() const { return key_loads_; }
  /// Per partition key: why it cannot load (OK if it can; columns.h), for a filter
  /// that names it.
  const std::vector<arrow::Status>& key_errors() const { return key_errors_; }
  /// Per output column: its unified Arrow type (null for partition keys and masks).
  const std::vector<std::shared_ptr<arrow::DataType>>& column_types() const {
    return column_types_;
  }
  /// The schema declared when opened (ColumnsOptions::schema), null if none: a filter
  /// compares a numeric column it names in its declared type, loaded or not.
  const std::shared_ptr<arrow::Schema>& declared_schema() const { return declared_schema_; }
  /// The unit INT96 timestamps are read in (DatasetOptions::int96_unit).
  arrow::TimeUnit::type int96_unit() const { return int96_unit_; }
  /// Arrow reader properties that read the columns as they load here (INT96 in
  /// int96_unit()); callers set threads, batch size and pre-buffering.
  parquet::ArrowReaderProperties ArrowProperties() const;
  /// Files found in directories or by globs that are not Parquet, in path order.
  const std::vector<SkippedFile>& skipped_files() const { return skipped_; }
  int64_t num_rows() const;
  /// Footers that came from the footer cache instead of the source.
  int64_t footers_from_cache() const { return footers_from_cache_; }
  /// Files whose row-group layout came from a summary (`_metadata`) instead of their
  /// footers.
  int64_t footers_from_summary() const { return footers_from_summary_; }
  /// Remote footers that could not be saved into the footer cache (a full or read-only
  /// disk), and why the first could not; the Loader counts them as cache write errors.
  int64_t footers_unsaved() const { return footers_unsaved_; }
  const std::string& footer_store_error() const { return footer_store_error_; }
  /// Global index of the first row of split i (rows numbered across files in order).
  int64_t split_first_row(int64_t i) const { return split_first_row_[i]; }
  /// Rows of each split, in split order.
  std::vector<int64_t> SplitRows() const;
  /// Replace the splits with `splits` (a filter's selection of them, see
  /// filter/row_filter.h). Only while the dataset is not yet shared.
  void RestrictSplits(std::vector<Split> splits);

 private:
  Dataset() = default;
  // Open()'s steps: give each file its resolved columns and the schema; list the splits
  // (checked against the footers and files) and their first rows.
  void SetColumns(ResolvedColumns resolved, const std::vector<std::string>& partition_keys);
  arrow::Status ListSplits(const DatasetOptions& options);

  std::vector<DataFile> files_;
  std::vector<Split> splits_;
  std::vector<int64_t> split_first_row_;
  int64_t footers_from_cache_ = 0;
  int64_t footers_from_summary_ = 0;
  int64_t footers_unsaved_ = 0;
  std::string footer_store_error_;
  std::vector<ColumnSpec> specs_;
  std::shared_ptr<arrow::Schema> schema_;
  std::vector<int> partition_index_;
  std::vector<std::string> partition_keys_;
  std::vector<KeyLoad> key_loads_;
  std::vector<arrow::Status> key_errors_;
  std::vector<std::shared_ptr<arrow::DataType>> column_types_;
  std::shared_ptr<arrow::Schema> declared_schema_;
  std::vector<SkippedFile> skipped_;
  arrow::TimeUnit::type int96_unit_ = arrow::TimeUnit::NANO;
};

/// A file found while expanding sources, before its footer is read.
struct FoundFile {
  std::shared_ptr<arrow::fs::FileSystem> fs;
  std::string path;
  std::string display;
  int64_t size = 0;
  int64_t mtime_ns = 0;
  /// `key=value` directories between the source root and the file, decoded.
  std::vector<HiveSegment> partitions;
  /// Found by listing a directory or matching a glob (not named explicitly): then it
  /// is skipped if it is not Parquet.
  bool listed = false;
  /// Index (in DiscoverFiles' `summaries`) of the summary of its directory, or -1.
  int summary = -1;
  /// Found in an index, not by listing: its footer is checked when it is first read.
  bool from_index = false;
};

/// What `path` is on `fs`: on S3 asked while `cancel` is polled (a refusing endpoint's
/// retries last a minute), elsewhere asked directly.
arrow::Result<arrow::fs::FileInfo> FileInfoOf(const std::shared_ptr<arrow::fs::FileSystem>& fs,
                                              const std::string& path, const CancelFlag& cancel);

/// Expand `sources` into files, in canonical order, without opening them. With
/// `summaries`, the summaries (`_metadata`) found at the roots of directory sources are
/// added there and their files point to them (FoundFile::summary). Cancelled once
/// `cancel` is set: a listing checks it while it waits for each page.
arrow::Result<std::vector<FoundFile>> DiscoverFiles(const std::vector<std::string>& sources,
                                                    const StorageOptions& storage = {},
                                                    std::vector<SummaryRef>* summaries = nullptr,
                                                    bool summary_only = false,
                                                    const CancelFlag& cancel = nullptr);

/// Check once that `file`'s footer is still the one its index recorded (footer_check);
/// an InvalidDataError naming the file if it changed. No-op without footer_check.
arrow::Status CheckFooterUnchanged(const DataFile& file);

/// Read the footers of `found` (files that are not Parquet left out), without summaries;
/// counting the files read in `progress` if given; Cancelled once `cancel` is set.
arrow::Result<std::vector<DataFile>> ReadFileFooters(std::vector<FoundFile> found,
                                                     int max_threads,
                                                     Progress* progress = nullptr,
                                                     const CancelFlag& cancel = nullptr);

/// The hash of `file`'s footer as Dataset::Open computes it (DataFile::footer_hash):
/// read from the file, or for a remote file from `footer_cache_dir` when it holds it.
arrow::Result<std::string> ReadFooterHash(const FoundFile& file,
                                          const std::string& footer_cache_dir = "");

}  // namespace pqloader

namespace pqloader {

/// What `pqloader inspect` shows of one file.
struct FileSummary {
  std::string path;
  int64_t size = 0;
  int64_t num_rows = 0;
  int num_row_groups = 0;
  std::string compression;  ///< Codec of the first column chunk, e.g. "snappy".
  std::string created_by;
};

/// What `pqloader inspect` shows of a dataset.
struct DatasetSummary {
  std::vector<FileSummary> files;
  /// Files skipped as not Parquet.
  std::vector<SkippedFile> skipped;
  /// (name, Arrow type, what it becomes or why it is refused) per column as the Loader
  /// would see it with every column selected (struct leaves by dotted path, types
  /// unified over the files), then the partition keys.
  struct Column {
    std::string name;
    std::string arrow_type;
    std::string loads_as;
    /// A list column whose rows may differ in length (a batch of it needs
    /// Loader(lists=...) or pack=, unless every row has one length).
    bool ragged = false;
  };
  std::vector<Column> columns;
};

/// Summarise `sources` without reading data pages; counting the footers read in
/// `progress` if given; Cancelled once `cancel` is set (checked per file). INT96
/// timestamps are typed in `int96_unit` (DatasetOptions::int96_unit).
arrow::Result<DatasetSummary> InspectDataset(
    const std::vector<std::string>& sources, const StorageOptions& storage = {},
    Progress* progress = nullptr, const CancelFlag& cancel = nullptr,
    arrow::TimeUnit::type int96_unit = arrow::TimeUnit::NANO);

}  // namespace pqloader
