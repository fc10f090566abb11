#include "pqloader/dataset/footer_checks.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>

#include <arrow/scalar.h>
#include <arrow/type_traits.h>
#include <arrow/util/checked_cast.h>
#include <arrow/util/decimal.h>
#include <arrow/util/float16.h>
#include <parquet/arrow/reader.h>
#include <parquet/metadata.h>
#include <parquet/schema.h>
#include <parquet/size_statistics.h>
#include <parquet/statistics.h>

#include "pqloader/dataset/hive.h"
#include "pqloader/error.h"
#include "pqloader/tensor/batch.h"

namespace pqloader {

namespace {

// Definition levels of a leaf whose first repeated ancestor is its only one: below
// `row` a row is null (an optional node above the list is undefined), `row` is an
// empty list, from `row + 1` up to max an element (max: a value, below: a null one).
struct Levels {
  int16_t max_def = 0, max_rep = 0;
  int16_t row = 0;  // optional nodes above the first repeated node
  // Whether a statistics null count of 0 rules out null rows and empty lists. pyarrow's
  // count leaves them out where a struct lies between the list and the leaf (the 'a' of
  // list<struct<a>> counts 0 for null rows and empty lists, 1 for a null struct), and
  // counts them where the leaf is the list's element (or a map's key or value).
  bool zero_count_covers_rows = true;
};

Levels LevelsOf(const parquet::ColumnDescriptor& descr) {
  Levels l;
  l.max_def = descr.max_definition_level();
  l.max_rep = descr.max_repetition_level();
  std::vector<const parquet::schema::Node*> chain;
  for (const parquet::schema::Node* n = descr.schema_node().get(); n != nullptr; n = n->parent()) {
    chain.push_back(n);
  }
  // chain: leaf ... root; walk root-first, the root itself is not a level.
  for (auto it = chain.rbegin() + 1; it != chain.rend(); ++it) {
    if ((*it)->is_repeated()) break;
    if ((*it)->is_optional()) ++l.row;
  }
  if (l.max_rep > 0) {
    const parquet::schema::Node* leaf = descr.schema_node().get();
    l.zero_count_covers_rows =
        leaf->is_repeated() || (leaf->parent() != nullptr && leaf->parent()->is_repeated());
  }
  return l;
}

// Nulls (rows and list elements) of one column chunk; -1 when the footer cannot tell.
// The chunk's definition-level histogram where it can be true: max_def + 1 counts, none
// negative, summing to the chunk's levels (num_values); else null (unknown: the data read
// tells). A hostile footer's [0, -10, 0, 100] made lists of two values "ragged", and its
// counts overflowed the sums.
const std::vector<int64_t>* DefHistogram(const parquet::ColumnChunkMetaData& chunk,
                                         const parquet::SizeStatistics* size_stats,
                                         const Levels& levels) {
  if (size_stats == nullptr) return nullptr;
  const auto& hist = size_stats->definition_level_histogram;
  if (static_cast<int>(hist.size()) != levels.max_def + 1) return nullptr;
  int64_t sum = 0;
  for (int64_t h : hist) {
    if (h < 0 || h > chunk.num_values() - sum) return nullptr;  // (and no overflow)
    sum += h;
  }
  return sum == chunk.num_values() ? &hist : nullptr;
}

int64_t ChunkNulls(const parquet::ColumnChunkMetaData& chunk, const Levels& levels) {
  if (levels.max_def == 0) return 0;
  // The null count as stored (not the typed statistics: decoding their min and max for
  // every chunk was a fifth of the start-up at 10^5 files).
  auto stats = chunk.is_stats_set() ? chunk.encoded_statistics() : nullptr;
  // (A count outside 0..num_values is a hostile footer's: "9223372036854775807 null
  // values" refused a row group without nulls. Unknown then: the read tells.)
  const bool has_null_count = stats != nullptr && stats->has_null_count && stats->null_count >= 0 &&
                              stats->null_count <= chunk.num_values();
  if (levels.max_rep == 0 && has_null_count) return stats->null_count;
  if (levels.max_rep != 0 && has_null_count && stats->null_count == 0 &&
      levels.zero_count_covers_rows) {
    return 0;
  }
  auto size_stats = chunk.size_statistics();
  const std::vector<int64_t>* hist = DefHistogram(chunk, size_stats.get(), levels);
  if (levels.max_rep == 0) {
    if (hist != nullptr) {
      int64_t n = 0;
      for (int d = 0; d < levels.max_def; ++d) n += (*hist)[d];
      return n;
    }
    return -1;
  }
  // A list: null rows and null elements, not empty lists (which statistics count too).
  if (hist == nullptr || levels.max_rep != 1) return -1;
  int64_t n = 0;
  for (int d = 0; d < levels.max_def; ++d) {
    if (d != levels.row) n += (*hist)[d];
  }
  return n;
}

// The first row group (index into `splits`) whose chunk of list column `column` holds a
// null inside a list (an element, not a row), as its definition-level histogram tells:
// levels above an empty list's and below a value's (a null element; below a list of
// structs, a null struct too, as the read counts it); its count in *count. -1 where none
// is known (no histogram: the read tells; a filter restricted the row group).
int64_t FirstElementNullsFromFooters(const std::vector<DataFile>& files,
                                     const std::vector<Split>& splits, int column,
                                     int64_t* count) {
  for (size_t i = 0; i < splits.size(); ++i) {
    const Split& s = splits[i];
    const DataFile& f = files[s.file];
    if (s.file_rows == 0 || s.rows != nullptr || f.columns.empty()) continue;
    const ColumnSource& src = f.columns[column];
    if (src.field < 0 || src.type == nullptr || src.leaves.size() != 1) continue;
    try {
      auto chunk = f.RowGroup(s.row_group)->ColumnChunk(src.leaves[0]);
      const Levels levels = LevelsOf(*f.schema()->Column(src.leaves[0]));
      if (levels.max_rep != 1) continue;
      auto size_stats = chunk->size_statistics();
      const auto* hist = DefHistogram(*chunk, size_stats.get(), levels);
      if (hist == nullptr) continue;
      int64_t n = 0;
      for (int d = levels.row + 1; d < levels.max_def; ++d) n += (*hist)[d];
      if (n > 0) {
        *count = n;
        return static_cast<int64_t>(i);
      }
    } catch (const std::exception&) {
      // a corrupt footer is reported when the row group is read
    }
  }
  return -1;
}

// Null values of output column `column` that the footers prove the loader reads, in
// one file: how many (at least), the first row group holding them, and whether the
// count is exact. A row group the footers cannot tell about (or a filter's selection
// within one) does not hide the nulls proven in the file's others (NullsFromFooters,
// which counts a file only where exact, is made of it).
struct ProvenNulls {
  int64_t count = 0;
  int32_t first_row_group = -1;
  int64_t row_groups = 0;  // holding proven nulls
  bool exact = true;
};

std::vector<ProvenNulls> ProvenNullsFromFooters(const std::vector<DataFile>& files,
                                                const std::vector<Split>& splits, int column,
                                                int partition_key) {
  std::vector<ProvenNulls> out(files.size());
  for (const Split& s : splits) {
    const DataFile& f = files[s.file];
    ProvenNulls& p = out[s.file];
    if (s.file_rows == 0 || s.num_rows == 0) continue;  // no rows read, no nulls
    int64_t n = -1;  // proven in this row group's rows read; -1: unknown
    bool exact = true;
    if (partition_key >= 0) {
      n = f.partition_null[partition_key] ? s.num_rows : 0;
    } else if (!f.columns.empty()) {
      const ColumnSource& src = f.columns[column];
      if (src.field < 0 || src.type == nullptr || src.type->id() == arrow::Type::NA) {
        n = s.num_rows;  // the file lacks the column: every row read is null
      } else if (src.leaves.size() == 1) {
        try {
          auto chunk = f.RowGroup(s.row_group)->ColumnChunk(src.leaves[0]);
          const Levels levels = LevelsOf(*f.schema()->Column(src.leaves[0]));
          const int64_t c = ChunkNulls(*chunk, levels);
          if (c == 0 || (c > 0 && s.rows == nullptr)) {
            n = c;
          } else if (c > 0 && levels.max_rep == 0 && s.file_rows >= s.num_rows) {
            // One value per row: a filter that kept num_rows of file_rows rows dropped at
            // most file_rows - num_rows of the chunk's nulls (a list's null elements share
            // rows: unknown).
            n = std::max<int64_t>(0, c - (s.file_rows - s.num_rows));
            exact = false;
          }
        } catch (const std::exception&) {
          // a corrupt footer is reported when the row group is read
        }
      }
    }
    if (n < 0 || !exact) p.exact = false;
    if (n <= 0) continue;
    if (p.first_row_group < 0) p.first_row_group = s.row_group;
    ++p.row_groups;
    p.count += n;
  }
  return out;
}

}  // namespace

std::vector<int64_t> NullsFromFooters(const std::vector<DataFile>& files,
                                      const std::vector<Split>& splits, int column,
                                      int partition_key) {
  const auto proven = ProvenNullsFromFooters(files, splits, column, partition_key);
  std::vector<int64_t> out(files.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = proven[i].exact ? proven[i].count : -1;
  return out;
}

ListLayout ListLayoutFromFooters(const std::vector<DataFile>& files,
                                 const std::vector<Split>& splits, int column) {
  ListLayout out;
  int64_t per_row = -1;
  std::string first_where;
  bool unknown = false, told = false;
  for (const Split& s : splits) {
    const DataFile& f = files[s.file];
    const ColumnSource& src = f.columns[column];
    if (src.field < 0 || src.leaves.size() != 1 || s.file_rows == 0) continue;
    const std::string where =
        "'" + f.display + "' row group " + std::to_string(s.row_group);
    int64_t rows = s.file_rows, values = -1, empty = 0;
    try {
      auto chunk = f.RowGroup(s.row_group)->ColumnChunk(src.leaves[0]);
      const Levels levels = LevelsOf(*f.schema()->Column(src.leaves[0]));
      auto size_stats = chunk->size_statistics();
      auto stats = chunk->is_stats_set() ? chunk->statistics() : nullptr;
      const auto* hist = DefHistogram(*chunk, size_stats.get(), levels);
      if (levels.max_rep == 1 && hist != nullptr) {
        values = 0;
        for (int d = 0; d <= levels.max_def; ++d) {
          if (d < levels.row) rows -= (*hist)[d];  // null rows take the length of the others
          else if (d == levels.row) empty += (*hist)[d];
          else values += (*hist)[d];
        }
      } else if (levels.zero_count_covers_rows && stats != nullptr && stats->HasNullCount() &&
                 stats->null_count() == 0) {
        values = chunk->num_values();  // no null and no empty list: one level per value
      }
    } catch (const std::exception&) {
      values = -1;
    }
    if (values < 0) {
      unknown = true;
      continue;
    }
    told = true;
    const int64_t filled = rows - empty;  // rows with at least one value
    if (empty > 0 && filled > 0) {
      out.lengths = ListLayout::Lengths::kRagged;
      out.evidence = where + " has " + std::to_string(empty) + " empty list(s) beside " +
                     std::to_string(filled) + " non-empty one(s)";
      return out;
    }
    // Only null rows: they take the others' length. Only empty lists (and nulls): rows
    // of length 0 (skipped as if null, they passed beside rows of 2 values).
    if (filled <= 0 && empty == 0) continue;
    if (filled > 0 && values % filled != 0) {
      out.lengths = ListLayout::Lengths::kRagged;
      out.evidence = where + " holds " + std::to_string(values) + " values in " +
                     std::to_string(filled) + " rows, not one length per row";
      return out;
    }
    const int64_t length = filled > 0 ? values / filled : 0;
    if (per_row < 0) {
      per_row = length;
      first_where = where;
    } else if (per_row != length) {
      out.lengths = ListLayout::Lengths::kRagged;
      out.evidence = "rows of " + first_where + " hold " + std::to_string(per_row) +
                     " values each, rows of " + where + " " + std::to_string(length);
      return out;
    }
  }
  if (!unknown && per_row >= 0) {
    out.lengths = ListLayout::Lengths::kUniform;
    out.values_per_row = per_row;
  }
  // (Every row group's rows null: no length but 0, the rows of 0 such a column had.)
  out.known_values_per_row = per_row >= 0 ? per_row : unknown || !told ? -1 : 0;
  return out;
}

namespace {

// The path's text of a key as a value of `type`: a decimal's at the column's scale, as
// pyarrow casts the text ("1.5" of a decimal(10, 2) column is 1.50; Scalar::Parse refused
// another scale), else Scalar::Parse's.
arrow::Result<std::shared_ptr<arrow::Scalar>> ParseKey(const std::shared_ptr<arrow::DataType>& type,
                                                       const std::string& text) {
  auto decimal = [&](auto value) -> arrow::Result<std::shared_ptr<arrow::Scalar>> {
    int32_t precision = 0, scale = 0;
    ARROW_RETURN_NOT_OK(decltype(value)::FromString(text, &value, &precision, &scale));
    const int32_t to = static_cast<const arrow::DecimalType&>(*type).scale();
    ARROW_ASSIGN_OR_RAISE(value, value.Rescale(scale, to));  // (an error where it loses digits)
    return arrow::MakeScalar(type, value);
  };
  if (type->id() == arrow::Type::DECIMAL128) return decimal(arrow::Decimal128());
  if (type->id() == arrow::Type::DECIMAL256) return decimal(arrow::Decimal256());
  return arrow::Scalar::Parse(type, text);
}

constexpr const char* kTimeToTheSecond =
    ": the path holds the time without its fraction of a second, as Polars' partition_by "
    "writes a time of day, so that times within one second share one directory (where one's "
    "file may have replaced another's); partition by the time as an integer (Polars: "
    "t.cast(pl.Int64)) or as a string with its fraction (t.dt.strftime('%H:%M:%S%.f'))";

// A partition key that the files store too: their statistics must agree with the path.
// `leaf_of(file)`: the key's Parquet leaf in that file, or -1 where it stores none.
arrow::Status CheckStoredKey(const Dataset& ds, const std::string& name, int key,
                             const std::function<int(const DataFile&)>& leaf_of) {
  for (const Split& s : ds.splits()) {
    const DataFile& f = ds.files()[s.file];
    const int leaf = leaf_of(f);
    if (leaf < 0) continue;
    std::shared_ptr<arrow::Scalar> min, max;
    bool has_min_max = false;
    int64_t nulls = 0;
    try {
      auto chunk = f.RowGroup(s.row_group)->ColumnChunk(leaf);
      auto stats = chunk->is_stats_set() ? chunk->statistics() : nullptr;
      if (stats == nullptr) continue;
      if (stats->HasNullCount()) nulls = stats->null_count();
      has_min_max = stats->HasMinMax() && parquet::arrow::StatisticsAsScalars(*stats, &min, &max).ok();
    } catch (const std::exception&) {
      continue;
    }
    const std::string& path_value = f.partition_values[key];
    // A null key (__HIVE_DEFAULT_PARTITION__, where Polars and DuckDB write a null key's
    // rows, storing the nulls) over values, or a key's value over nulls: Polars and
    // DuckDB read the path's value, pyarrow refuses to merge the types; the file's values
    // loaded silently (7 under k=__HIVE_DEFAULT_PARTITION__/, null under k=1/).
    if (f.partition_null[key]) {
      if (!has_min_max) continue;
      return MakeError(ErrorKind::kSchemaMismatch, "partition key '", name, "' is null (",
                       kHiveNullValue, ") in the path of '", f.display,
                       "', but the file stores values from ", min->ToString(), " to ",
                       max->ToString(), " in that column (row group ", s.row_group, ")");
    }
    if (nulls > 0) {
      return MakeError(ErrorKind::kSchemaMismatch, "partition key '", name, "' is '", path_value,
                       "' in the path of '", f.display, "', but the file stores ", nulls,
                       " null value(s) in that column (row group ", s.row_group,
                       "; a null key's rows lie under ", kHiveNullValue, ")");
    }
    if (!has_min_max) continue;
    // Compared as values where the path's text parses as the column's type (Polars
    // writes a float key as "1.0", a zoned time as "...+00:00": the statistics print
    // "1", "...Z"), else as text.
    const auto equal = arrow::EqualOptions::Defaults().signed_zeros_equal(true);
    auto parsed = ParseKey(min->type, path_value);
    const bool agrees = parsed.ok() ? (*parsed)->Equals(*min, equal) && (*parsed)->Equals(*max, equal)
                                    : min->ToString() == path_value && max->ToString() == path_value;
    if (!agrees) {
      // Polars' partition_by writes a time of day to the second ("12:30:00" of 12:30:00.25):
      // the path cannot name the value, and values of one second share one directory, where
      // one's file replaced another's (Polars 2.1: a row of two was lost as it wrote them).
      const arrow::Type::type id = min->type->id();
      const bool whole_seconds = parsed.ok() && (id == arrow::Type::TIME32 || id == arrow::Type::TIME64) &&
                                 path_value.find('.') == std::string::npos;
      return MakeError(ErrorKind::kSchemaMismatch, "partition key '", name,
                       "' is '", path_value, "' in the path of '", f.display,
                       "', but the file stores values from ", min->ToString(), " to ",
                       max->ToString(), " in that column (row group ", s.row_group, ")",
                       whole_seconds ? kTimeToTheSecond : "");
    }
  }
  return arrow::Status::OK();
}

// A selected key's check: its leaf is the column's source in each file.
arrow::Status CheckSelectedStoredKey(const Dataset& ds, int column, int key) {
  return CheckStoredKey(ds, ds.specs()[column].name, key, [column](const DataFile& f) {
    if (f.columns.empty()) return -1;
    const ColumnSource& src = f.columns[column];
    // (a struct's leaf of the key's dotted name is another column: not the key's)
    return src.field < 0 || !src.path.empty() || src.leaves.size() != 1 ? -1 : src.leaves[0];
  });
}

}  // namespace

int64_t ListLengthFromFooters(const Dataset& ds, const std::vector<Split>& all_splits, int column) {
  const ColumnSpec& spec = ds.specs()[column];
  if (spec.kind != ColumnKind::kTensor || spec.row_shape.empty() || spec.row_shape[0] >= 0 ||
      ds.partition_index()[column] >= 0) {
    return -1;
  }
  // values_per_row counts leaf values: a list of fixed-size lists holds `inner` of them
  // per element (a null row of list<fixed_size_list<_, 2>> was a row of 0 such elements).
  int64_t inner = 1;
  for (size_t d = 1; d < spec.row_shape.size(); ++d) {
    if (spec.row_shape[d] < 0 || __builtin_mul_overflow(inner, spec.row_shape[d], &inner)) return -1;
  }
  const auto length = [inner](int64_t values) {
    return values >= 0 && inner > 0 && values % inner == 0 ? values / inner : -1;
  };
  const ListLayout all = ListLayoutFromFooters(ds.files(), all_splits, column);
  if (all.lengths == ListLayout::Lengths::kUniform) return length(all.values_per_row);
  // (rows a filter dropped may differ)
  const ListLayout kept = ListLayoutFromFooters(ds.files(), ds.splits(), column);
  if (kept.lengths == ListLayout::Lengths::kUniform) return length(kept.values_per_row);
  // Footers that tell of some row groups only (Polars writes no level histograms, and a
  // row group with nulls then tells nothing): the length those agree on. A row group of
  // null lists only, where none told, gave rows of length 0 beside rows of 2.
  if (all.lengths == ListLayout::Lengths::kUnknown && all.known_values_per_row >= 0) {
    return length(all.known_values_per_row);
  }
  return kept.lengths == ListLayout::Lengths::kUnknown ? length(kept.known_values_per_row) : -1;
}

arrow::Status CheckStoredKeys(const Dataset& ds, const std::vector<std::string>& named) {
  const auto& specs = ds.specs();
  const auto& keys = ds.partition_keys();
  std::vector<bool> done(keys.size(), false);
  for (size_t c = 0; c < specs.size(); ++c) {
    if (specs[c].mask_of >= 0 || ds.partition_index()[c] >= 0) continue;
    const auto it = std::find(keys.begin(), keys.end(), specs[c].name);
    if (it == keys.end()) continue;
    ARROW_RETURN_NOT_OK(CheckSelectedStoredKey(ds, static_cast<int>(c), static_cast<int>(it - keys.begin())));
    done[it - keys.begin()] = true;
  }
  const auto& loads = ds.key_loads();
  for (const auto& name : named) {
    const auto it = std::find(keys.begin(), keys.end(), name);
    if (it == keys.end()) continue;
    const size_t k = static_cast<size_t>(it - keys.begin());
    if (done[k] || k >= loads.size() || loads[k] != KeyLoad::kFiles) continue;
    done[k] = true;
    // Read by the filter only: the files' own top-level leaf of that name.
    ARROW_RETURN_NOT_OK(CheckStoredKey(ds, name, static_cast<int>(k), [&name](const DataFile& f) {
      const parquet::SchemaDescriptor* schema = f.schema();
      const int leaf = schema == nullptr ? -1 : schema->ColumnIndex(name);
      return leaf >= 0 && schema->Column(leaf)->max_repetition_level() == 0 &&
                     schema->Column(leaf)->path()->ToDotVector().size() == 1
                 ? leaf
                 : -1;
    }));
  }
  return arrow::Status::OK();
}

namespace {

// The values a row of `type` holds when it is fixed-size lists down to a leaf of one
// Parquet column (the product of their sizes), or -1.
int64_t FixedSizeListSlots(const arrow::DataType& type) {
  if (type.id() != arrow::Type::FIXED_SIZE_LIST) return -1;
  int64_t slots = 1;
  const arrow::DataType* t = &type;
  while (t->id() == arrow::Type::FIXED_SIZE_LIST) {
    const auto& fsl = static_cast<const arrow::FixedSizeListType&>(*t);
    if (__builtin_mul_overflow(slots, static_cast<int64_t>(fsl.list_size()), &slots)) return -1;
    t = fsl.value_type().get();
  }
  return arrow::is_nested(t->id()) ? -1 : slots;
}

// Arrow C++ 25 cannot read a fixed-size list back from Parquet where a row (or a struct
// above it) is null, nor one of size 0 (apache/arrow#35692, "Expected all lists to be of
// size=2 but index 2 had size=0"; pyarrow's read_table fails the same way): refused from
// the footers, before any batch, instead of mid-epoch as corrupt data (no fill_null helps).
// Such a chunk has one level per value of its rows, null values included, and one level
// per null row: its level count is rows x slots exactly when no row is null.
arrow::Status CheckFixedSizeListRows(const Dataset& ds, size_t c) {
  const ColumnSpec& spec = ds.specs()[c];
  for (const Split& s : ds.splits()) {
    const DataFile& f = ds.files()[s.file];
    if (f.columns.empty() || s.file_rows == 0) continue;
    const ColumnSource& src = f.columns[c];
    if (src.field < 0 || src.type == nullptr || src.leaves.size() != 1) continue;
    const int64_t slots = FixedSizeListSlots(*src.type);
    if (slots < 0) continue;
    int64_t levels = -1;
    try {
      levels = f.RowGroup(s.row_group)->ColumnChunk(src.leaves[0])->num_values();
    } catch (const std::exception&) {
      continue;  // a corrupt footer is reported when the row group is read
    }
    int64_t expected = 0;  // (hostile footers: a product past int64 is no match)
    if (slots > 0 && !__builtin_mul_overflow(s.file_rows, slots, &expected) &&
        levels == expected) {
      continue;
    }
    // (a null inner list of a row, in fixed-size lists of fixed-size lists, counts the
    // same: not a null row)
    const bool nested = static_cast<const arrow::FixedSizeListType&>(*src.type)
                            .value_type()
                            ->id() == arrow::Type::FIXED_SIZE_LIST;
    const std::string what =
        slots == 0 ? "holds lists of size 0"
                   : std::string(nested ? "has null rows or null inner lists (" : "has null rows (") +
                         std::to_string(levels) + " levels for " +
                         std::to_string(s.file_rows) + " rows of " + std::to_string(slots) +
                         " values)";
    return MakeError(ErrorKind::kUnsupportedType, "column '", spec.name, "' (",
                     src.type->ToString(), ") in '", f.display, "', row group ", s.row_group,
                     " ", what,
                     ", which Arrow C++ cannot read back from Parquet (apache/arrow#35692; "
                     "pyarrow.parquet.read_table fails too): the file is valid, but no "
                     "fill_null loads it; write the column as a variable-size list "
                     "(pa.list_(t)), or select other columns");
  }
  return arrow::Status::OK();
}

// Whether float `dst` holds integer scalar `s` exactly (as CheckExactAsFloat in
// decode/convert.cc decides it at decode); true for a scalar of any other type. `text`:
// the value, for the message.
bool FloatHoldsExactly(const arrow::Scalar& s, DType dst, std::string* text) {
  if (!s.is_valid) return true;
  auto check = [&](auto v) {
    using T = decltype(v);  // int64_t or uint64_t
    *text = std::to_string(v);
    const double d = static_cast<double>(v);
    double back = d;
    if (dst == DType::kFloat32) back = static_cast<double>(static_cast<float>(v));
    if (dst == DType::kFloat16) back = arrow::util::Float16::FromDouble(d).ToDouble();
    const double end = std::ldexp(1.0, std::numeric_limits<T>::digits);
    return back >= -end && back < end && static_cast<T>(back) == v;
  };
  using arrow::internal::checked_cast;
  switch (s.type->id()) {
    case arrow::Type::INT8: return check(int64_t{checked_cast<const arrow::Int8Scalar&>(s).value});
    case arrow::Type::INT16: return check(int64_t{checked_cast<const arrow::Int16Scalar&>(s).value});
    case arrow::Type::INT32: return check(int64_t{checked_cast<const arrow::Int32Scalar&>(s).value});
    case arrow::Type::INT64: return check(int64_t{checked_cast<const arrow::Int64Scalar&>(s).value});
    case arrow::Type::UINT8: return check(uint64_t{checked_cast<const arrow::UInt8Scalar&>(s).value});
    case arrow::Type::UINT16: return check(uint64_t{checked_cast<const arrow::UInt16Scalar&>(s).value});
    case arrow::Type::UINT32: return check(uint64_t{checked_cast<const arrow::UInt32Scalar&>(s).value});
    case arrow::Type::UINT64: return check(uint64_t{checked_cast<const arrow::UInt64Scalar&>(s).value});
    default: return true;
  }
}

// The innermost value type of `type` (below lists and a dictionary).
const arrow::DataType& LeafValueType(const arrow::DataType& type) {
  const arrow::DataType* t = &type;
  while (true) {
    if (t->id() == arrow::Type::DICTIONARY) {
      t = static_cast<const arrow::DictionaryType*>(t)->value_type().get();
    } else if (t->id() == arrow::Type::LIST || t->id() == arrow::Type::LARGE_LIST ||
               t->id() == arrow::Type::FIXED_SIZE_LIST) {
      t = static_cast<const arrow::BaseListType*>(t)->value_type().get();
    } else {
      return *t;
    }
  }
}

// An integer column loaded as a float (schema= declared it): a row group whose statistics'
// min or max the float does not hold is refused now, with the message decoding gives it,
// not when the epoch reaches it. Row groups a filter restricted are left to the read (a
// row it drops drops its check).
arrow::Status CheckIntegersAsFloats(const Dataset& ds, size_t c) {
  const ColumnSpec& spec = ds.specs()[c];
  const DType dst = spec.dtype;
  const int bits = dst == DType::kFloat16   ? 11
                   : dst == DType::kFloat32 ? 24
                   : dst == DType::kFloat64 ? 53
                                            : 0;
  if (spec.kind != ColumnKind::kTensor || bits == 0) return arrow::Status::OK();
  for (const Split& s : ds.splits()) {
    const DataFile& f = ds.files()[s.file];
    if (f.columns.empty() || s.file_rows == 0 || s.rows != nullptr) continue;
    const ColumnSource& src = f.columns[c];
    if (src.field < 0 || src.type == nullptr || src.leaves.size() != 1) continue;
    if (!arrow::is_integer(LeafValueType(*src.type).id())) continue;
    std::shared_ptr<arrow::Scalar> min, max;
    try {
      auto chunk = f.RowGroup(s.row_group)->ColumnChunk(src.leaves[0]);
      auto stats = chunk->is_stats_set() ? chunk->statistics() : nullptr;
      if (stats == nullptr || !stats->HasMinMax()) continue;
      if (!parquet::arrow::StatisticsAsScalars(*stats, &min, &max).ok()) continue;
    } catch (const std::exception&) {
      continue;  // a corrupt footer is reported when the row group is read
    }
    for (const auto& v : {min, max}) {
      std::string text;
      if (v == nullptr || FloatHoldsExactly(*v, dst, &text)) continue;
      return MakeError(ErrorKind::kSchemaMismatch, "in '", f.display, "', row group ",
                       s.row_group, ": column '", spec.name, "': value ", text, " (",
                       v->type->ToString(), ") does not convert to the declared ",
                       DTypeName(dst), " without loss (it holds every integer only up to 2^",
                       bits, "); declare an integer type, or a wider float where one holds them");
    }
  }
  return arrow::Status::OK();
}

}  // namespace

arrow::Status CheckColumnsFromFooters(const Dataset& ds, const std::vector<bool>& null_policy,
                                      const std::vector<bool>& ragged_ok,
                                      const std::vector<bool>& rows_only) {
  const auto& specs = ds.specs();
  for (size_t c = 0; c < specs.size(); ++c) {
    const ColumnSpec& spec = specs[c];
    if (spec.mask_of >= 0) continue;
    const int key = ds.partition_index()[c];
    if (key < 0) {
      const auto& keys = ds.partition_keys();
      const auto it = std::find(keys.begin(), keys.end(), spec.name);
      if (it != keys.end()) {
        ARROW_RETURN_NOT_OK(CheckSelectedStoredKey(ds, static_cast<int>(c),
                                                   static_cast<int>(it - keys.begin())));
      }
    }
    if (key < 0) ARROW_RETURN_NOT_OK(CheckFixedSizeListRows(ds, c));
    if (key < 0) ARROW_RETURN_NOT_OK(CheckIntegersAsFloats(ds, c));
    if (!null_policy[c]) {
      // (Proven counts: with a filter, the rows it kept; a row group whose footer does not
      // tell no longer hides its file's others, which failed mid-epoch, after batches.)
      const auto nulls = ProvenNullsFromFooters(ds.files(), ds.splits(), static_cast<int>(c), key);
      std::string where;
      int64_t total = 0, files = 0;
      bool exact = true;
      for (size_t f = 0; f < nulls.size(); ++f) {
        if (nulls[f].count <= 0) continue;
        total += nulls[f].count;
        exact = exact && nulls[f].exact;
        if (++files <= 3) {
          const bool lacks = !ds.files()[f].columns.empty() && key < 0 &&
                             ds.files()[f].columns[c].field < 0;
          where += (files > 1 ? ", " : "") + std::to_string(nulls[f].count) + " in '" +
                   ds.files()[f].display + "'";
          if (lacks) {
            where += " (which lacks the column)";
          } else if (key < 0) {
            where += " (row group " + std::to_string(nulls[f].first_row_group) +
                     (nulls[f].row_groups > 1 ? " first)" : ")");
          }
        }
      }
      if (files > 3) where += ", and " + std::to_string(files - 3) + " more file(s)";
      if (total > 0) {
        const bool text = spec.kind != ColumnKind::kTensor;
        const bool list = !spec.row_shape.empty() || IsStringList(spec.kind);
        // A fill that works: a fixed_size_binary column's is of its width.
        std::string fill = text ? "''" : "0";
        std::string type = spec.arrow_type;
        if (type.rfind("dictionary<values=", 0) == 0) type = type.substr(18);
        if (type.rfind("fixed_size_binary[", 0) == 0) {
          fill = "b'\\x00' * " + type.substr(18, type.find(']') - 18);
        }
        return MakeError(ErrorKind::kInvalidData, "column '", spec.name, "' (", spec.arrow_type,
                         ") has ", exact ? "" : "at least ", total, " null value(s): ", where,
                         "; pass fill_null={'", spec.name, "': ", fill,
                         "} to replace them, null_mask=['", spec.name, "'] to add a '",
                         spec.name, "_valid' column beside it (nulls become ",
                         text ? "''" : "0",
                         list ? "; it flags null rows, and nulls inside lists need fill_null too"
                              : "",
                         "), or select other columns");
      }
    }
    if (null_policy[c] && c < rows_only.size() && rows_only[c] && key < 0) {
      // A mask alone flags null rows: a null inside a list (its row valid) is refused when
      // read; refused now where the footers tell (it came after batches were handed out).
      int64_t count = 0;
      const int64_t at = FirstElementNullsFromFooters(ds.files(), ds.splits(), static_cast<int>(c), &count);
      if (at >= 0) {
        const Split& s = ds.splits()[at];
        return MakeError(ErrorKind::kInvalidData, "in '", ds.files()[s.file].display,
                         "', row group ", s.row_group, ": column '", spec.name, "' (",
                         spec.arrow_type, ") has ", count,
                         " null(s) inside a list: null_mask flags null rows only; pass "
                         "fill_null={'", spec.name, "': ",
                         spec.kind == ColumnKind::kTensor ? "0" : "''",
                         "} to replace the nulls inside lists too (the mask still flags null "
                         "rows), or select other columns");
      }
    }
    if (spec.kind == ColumnKind::kTensor && !spec.row_shape.empty() && spec.row_shape[0] < 0 &&
        key < 0 && !ragged_ok[c]) {
      // A file without the column has null lists there (with a fill): of no length the
      // footers or the rows tell, where the other files' rows have one.
      std::string absent;
      int64_t files = 0;
      std::vector<bool> has_rows(ds.files().size(), false);
      for (const Split& s : ds.splits()) has_rows[s.file] = has_rows[s.file] || s.num_rows > 0;
      for (size_t i = 0; i < ds.files().size(); ++i) {
        const DataFile& f = ds.files()[i];
        if (f.columns.empty() || !has_rows[i]) continue;  // not known yet, or no rows read
        const ColumnSource& src = f.columns[c];
        if (src.field >= 0 && (src.type == nullptr || src.type->id() != arrow::Type::NA)) continue;
        if (++files <= 3) absent += (files > 1 ? ", '" : "'") + f.display + "'";
      }
      if (files > 3) absent += ", and " + std::to_string(files - 3) + " more file(s)";
      if (files > 0) {
        return MakeError(ErrorKind::kInvalidData, "column '", spec.name, "' (", spec.arrow_type,
                         ") is absent from ", absent,
                         ": its rows there are null lists of no known length, and a batch "
                         "needs one length per column: pass lists={'", spec.name,
                         "': 'ragged'} (values + offsets) or lists={'", spec.name,
                         "': pqloader.Pad(...)} (padded + lengths), or select other columns");
      }
      const ListLayout layout = ListLayoutFromFooters(ds.files(), ds.splits(), static_cast<int>(c));
      if (layout.lengths == ListLayout::Lengths::kRagged) {
        return MakeError(ErrorKind::kInvalidData, "column '", spec.name, "' (", spec.arrow_type,
                         ") is a list whose rows differ in length (", layout.evidence,
                         "); a batch needs one length per column: pass lists={'", spec.name,
                         "': 'ragged'} (values + offsets) or lists={'", spec.name,
                         "': pqloader.Pad(...)} (padded + lengths), or a transform such as "
                         "PadOrTruncate");
      }
    }
  }
  return arrow::Status::OK();
}

}  // namespace pqloader
