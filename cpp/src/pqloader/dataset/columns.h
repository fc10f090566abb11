// Column resolution: which output columns a dataset has, their one (unified) type, and
// where each one is in every file.
//
// Files of one dataset may differ, as Arrow's dataset layer allows: a column absent from
// a file is null in that file's rows; types unify by safe widening (int32 and int64 →
// int64, float32 and float64 → float64, string and large_string → large_string, null →
// anything; see CommonType); a declared schema fixes them instead. A struct column is its
// leaf columns, named by dotted path ("image.bytes"); a dotted path through a list of
// structs (or a map) is a list of that field. Anything else is an error naming the
// column, both files and both types. Thread-safety: pure functions.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include <arrow/result.h>
#include <arrow/type.h>
#include <parquet/arrow/schema.h>

#include "pqloader/dataset/column_types.h"
#include "pqloader/tensor/batch.h"

namespace pqloader {

/// Where one selected column is in one file.
struct ColumnSource {
  /// Top-level field of the file; -1 when the file lacks the column (its rows are null).
  int field = -1;
  /// Field names below it (struct fields, or fields of the structs of a list or map).
  std::vector<std::string> path;
  /// Parquet leaf columns to read.
  std::vector<int> leaves;
  /// The column's type in this file (null when absent).
  std::shared_ptr<arrow::DataType> type;
};

/// What column resolution needs of one file.
struct FileColumns {
  std::string display;
  std::shared_ptr<arrow::Schema> schema;
  const parquet::arrow::SchemaManifest* manifest = nullptr;
  /// The Arrow schema's metadata (pandas metadata lives there), if any.
  std::shared_ptr<const arrow::KeyValueMetadata> metadata;
};

struct ColumnsOptions {
  /// Columns to read, in output order: top-level names, dotted paths or partition keys.
  /// Default: empty, meaning every column of every file (in order of first appearance,
  /// pandas index columns left out), then the partition keys.
  std::vector<std::string> columns;
  /// The declared schema: its fields' types replace unification (each file's type must
  /// convert to the declared one), and without `columns`, its fields are the columns.
  /// Default: none.
  std::shared_ptr<arrow::Schema> schema;
  /// See SpecOptions.
  SpecOptions spec;
  /// Add "<name>_valid" after every column that can hold nulls. Default: false.
  bool null_mask_all = false;
  /// Add "<name>_valid" after these columns (a struct's name means all its leaves).
  std::vector<std::string> null_mask_columns;
};

/// A partition key of the dataset's paths.
struct PartitionKey {
  std::string name;
  /// Per file: its value and whether it is null (Hive's __HIVE_DEFAULT_PARTITION__).
  std::vector<std::string> values;
  std::vector<uint8_t> null;
};

/// How a partition key loads.
enum class KeyLoad {
  kFiles,  ///< From the files, which store it as a column (or a repeat of a key in a path).
  kInt64,  ///< From the paths, as int64 (every value an integer, not declared a string).
  kText,   ///< From the paths, as str.
};

struct ResolvedColumns {
  /// Output columns, in output order ("<name>_valid" masks after their columns).
  std::vector<ColumnSpec> specs;
  /// Per output column: its index among the partition keys, or -1.
  std::vector<int> partition_index;
  /// Per output column: its unified type (null for partition keys and masks).
  std::vector<std::shared_ptr<arrow::DataType>> types;
  /// Per output column: whether it can hold nulls (masks: false).
  std::vector<bool> nullable;
  /// Per output column of a dotted name (a struct's leaf, or a top-level name holding a
  /// '.'): its EncodeLeafPath; "" for other columns.
  std::vector<std::string> leaf_paths;
  /// [file][output column]: where the column is in the file (field -1 for partition
  /// keys, masks and columns the file lacks).
  std::vector<std::vector<ColumnSource>> sources;
  /// Per partition key, selected or not: how it loads (the filter types keys so).
  std::vector<KeyLoad> key_loads;
  /// Per partition key: why it cannot load (OK if it can): a key some files store and
  /// others lack. Raised where the key is selected, or named by a filter.
  std::vector<arrow::Status> key_errors;
};

/// Resolve the output columns of `files` (with hive `keys`).
arrow::Result<ResolvedColumns> ResolveColumns(const std::vector<FileColumns>& files,
                                              const std::vector<PartitionKey>& keys,
                                              const ColumnsOptions& options);

/// Names of the pandas index columns a file's pandas metadata lists (stored columns
/// only, not RangeIndexes).
std::vector<std::string> PandasIndexColumns(const arrow::KeyValueMetadata* metadata);

/// Which pandas index columns a default selection leaves out: those some file's pandas
/// metadata lists as its index and no file stores as data (one file's set_index("id")
/// beside files whose "id" is a plain column keeps "id"). Add every file, then ask.
class PandasIndexes {
 public:
  /// A file's fields and the key-value metadata holding its pandas metadata.
  void Add(const arrow::Schema& schema, const arrow::KeyValueMetadata* metadata);
  bool LeftOut(const std::string& name) const {
    return index_.count(name) != 0 && data_.count(name) == 0;
  }

 private:
  std::set<std::string> index_, data_;
};

/// Field metadata key of a loader's arrow_schema that says which struct leaf a dotted
/// column is (its top-level field and path): a declared schema taken from it reads that
/// leaf, where the files also have a top-level column of the dotted name.
inline constexpr const char* kLeafPathKey = "pqloader.leaf_path";
std::string EncodeLeafPath(const std::string& top, const std::vector<std::string>& path);
/// False when `metadata` has no (well-formed) kLeafPathKey.
bool DecodeLeafPath(const std::shared_ptr<const arrow::KeyValueMetadata>& metadata,
                    std::string* top, std::vector<std::string>* path);

/// Append the Parquet leaf column indices below `field` (itself if a leaf) to `out`.
void LeavesOf(const parquet::arrow::SchemaField& field, std::vector<int>* out);

/// The leaves to read for a column of top-level `field` whose own leaves are `leaves`:
/// those, else (none given: the whole field) every leaf below it. Every one also where
/// the field is an extension type (its ARROW:schema's, registered in the process: pandas'
/// interval, storage struct<left, right>): Arrow builds one only from all of its storage's
/// leaves ("Due to column pruning only part of an extension's storage type was loaded");
/// ExtractPath then takes the column's from the storage.
std::vector<int> LeavesToRead(const parquet::arrow::SchemaField& field, std::vector<int> leaves);

}  // namespace pqloader
