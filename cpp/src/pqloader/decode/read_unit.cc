#include "pqloader/decode/read_unit.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <unordered_set>

#include <arrow/array.h>
#include <arrow/array/util.h>
#include <arrow/chunked_array.h>
#include <arrow/compute/api_vector.h>
#include <arrow/compute/exec.h>
#include <arrow/datum.h>
#include <arrow/record_batch.h>
#include <arrow/filesystem/filesystem.h>
#include <arrow/io/caching.h>
#include <arrow/io/file.h>
#include <arrow/util/future.h>
#include <arrow/io/interfaces.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>
#include <parquet/properties.h>

#include "pqloader/dataset/bounded_read.h"
#include "pqloader/dataset/column_types.h"
#include "pqloader/dataset/columns.h"
#include "pqloader/dataset/int96.h"
#include "pqloader/decode/nested.h"
#include "pqloader/error.h"
#include "pqloader/tensor/batch.h"
#include "pqloader/util/exact_text.h"
#include "pqloader/util/fork_gate.h"
#include "pqloader/util/start_threads.h"

namespace pqloader {

namespace {

// A column made of one partition value repeated `rows` times (the fill when it is null).
arrow::Result<ColumnData> PartitionColumn(const ColumnSpec& spec, const std::string& path_value,
                                          bool is_null, const NullFill& fill, int64_t rows,
                                          arrow::MemoryPool* pool) {
  ColumnData out;
  if (is_null && !fill.enabled) {
    return MakeError(ErrorKind::kInvalidData, "partition key '", spec.name,
                     "' is null (__HIVE_DEFAULT_PARTITION__); pass fill_null= or null_mask=");
  }
  const std::string value = is_null ? fill.bytes_value : path_value;
  if (spec.kind == ColumnKind::kTensor) {
    const int64_t v = is_null ? (fill.is_float ? static_cast<int64_t>(fill.float_value)
                                               : fill.int_value)
                              : std::stoll(value);
    ARROW_ASSIGN_OR_RAISE(auto data, arrow::AllocateBuffer(rows * sizeof(int64_t), pool));
    auto* p = reinterpret_cast<int64_t*>(data->mutable_data());
    for (int64_t i = 0; i < rows; ++i) p[i] = v;
    out.data = std::move(data);
    out.row_bytes = sizeof(int64_t);
    return out;
  }
  // Strings: `rows` copies of the value.
  const auto len = static_cast<int64_t>(value.size());
  ARROW_ASSIGN_OR_RAISE(auto offsets, arrow::AllocateBuffer((rows + 1) * sizeof(int64_t), pool));
  ARROW_ASSIGN_OR_RAISE(auto data, arrow::AllocateBuffer(len * rows, pool));
  auto* o = reinterpret_cast<int64_t*>(offsets->mutable_data());
  o[0] = 0;
  for (int64_t i = 0; i < rows; ++i) {
    if (len > 0) std::memcpy(data->mutable_data() + i * len, value.data(), len);
    o[i + 1] = (i + 1) * len;
  }
  out.data = std::move(data);
  out.offsets = std::move(offsets);
  return out;
}

// Leaf values (repetition/definition levels) decoded at once, at most, for a list
// column: reading a whole row group of a list column materialises two int16 levels
// per value (8192 rows x 4096 uint8 values: 134 MB of levels for 32 MB of data).
constexpr int64_t kNestedSliceValues = int64_t{1} << 20;

// The values (levels) of Parquet leaf columns `leaves` in row group `rg`, summed;
// saturated (hostile footers' counts).
int64_t ValuesOf(const parquet::RowGroupMetaData& rg, const std::vector<int>& leaves) {
  int64_t values = 0;
  for (int leaf : leaves) {
    const int64_t n = std::max<int64_t>(0, rg.ColumnChunk(leaf)->num_values());
    if (__builtin_add_overflow(values, n, &values)) return std::numeric_limits<int64_t>::max();
  }
  return values;
}

// Read the Parquet leaf columns `leaves` of top-level field `field` of `split`'s row
// group in slices of rows, so that the levels of list columns stay small: the field as
// Arrow builds it from those leaves (a struct holding only the fields they are in), one
// chunk per slice. The leaves' levels of a slice are in memory together, so the slice's
// rows are bounded by their values summed.
arrow::Status ReadFieldInSlices(parquet::arrow::FileReader* reader, const DataFile& file,
                                const Split& split, int field, std::vector<int> leaves,
                                arrow::ArrayVector* out) {
  leaves = LeavesToRead(reader->manifest().schema_fields[field], std::move(leaves));
  const int64_t values = ValuesOf(*file.RowGroup(split.row_group), leaves);
  const int64_t per_row = std::max<int64_t>(1, values / std::max<int64_t>(1, split.file_rows));
  reader->set_batch_size(std::clamp<int64_t>(kNestedSliceValues / per_row, 1, 1 << 16));
  ARROW_ASSIGN_OR_RAISE(auto batches, reader->GetRecordBatchReader({split.row_group}, leaves));
  while (true) {
    std::shared_ptr<arrow::RecordBatch> batch;
    ARROW_RETURN_NOT_OK(batches->ReadNext(&batch));
    if (batch == nullptr) break;
    if (batch->num_columns() != 1) return arrow::Status::Invalid("expected one column");
    out->push_back(batch->column(0));
  }
  return arrow::Status::OK();
}

// Column `src` (a path below a top-level field, or the field itself) of the chunks
// ReadFieldInSlices read of its field.
arrow::Status ExtractColumn(const arrow::ArrayVector& field_chunks, const ColumnSource& src,
                            arrow::MemoryPool* pool, std::shared_ptr<arrow::ChunkedArray>* out) {
  arrow::ArrayVector chunks;
  for (const auto& chunk : field_chunks) {
    ARROW_ASSIGN_OR_RAISE(auto values, ExtractPath(chunk, src.path, pool));
    chunks.push_back(std::move(values));
  }
  if (chunks.empty()) {
    ARROW_ASSIGN_OR_RAISE(auto empty, arrow::MakeEmptyArray(src.type, pool));
    chunks.push_back(std::move(empty));
  }
  // The type first: the order in which arguments are evaluated is unspecified, and the
  // vector may be moved from before chunks[0] is read (clang does; make fuzz's UBSan saw it).
  const std::shared_ptr<arrow::DataType> type = chunks[0]->type();
  ARROW_ASSIGN_OR_RAISE(*out, arrow::ChunkedArray::Make(std::move(chunks), type));
  return arrow::Status::OK();
}

// Read column `src` (a top-level field, or a path below one) of `split`'s row group in
// slices of rows (ReadFieldInSlices); the result has one chunk per slice.
arrow::Status ReadNestedInSlices(parquet::arrow::FileReader* reader, const DataFile& file,
                                 const Split& split, const ColumnSource& src,
                                 arrow::MemoryPool* pool,
                                 std::shared_ptr<arrow::ChunkedArray>* out) {
  arrow::ArrayVector field_chunks;
  ARROW_RETURN_NOT_OK(ReadFieldInSlices(reader, file, split, src.field, src.leaves, &field_chunks));
  return ExtractColumn(field_chunks, src, pool, out);
}

// The columns below one top-level field (struct leaves "s.a", "s.b", ...) that a unit
// selects are read together, up to kSharedReadLeaves leaves a read: Arrow builds a
// reader of the whole field for each read (GetReader visits every child, selected or
// not), so reading a struct's K leaves one at a time cost O(K^2) per row group (5,000
// leaves: 5x the time of as many top-level columns, half of it in GetReader). The bounds
// keep a read's slices (levels of kNestedSliceValues values) from shrinking to a few
// rows, and its memory (all its columns' values are held until the last one is taken)
// from holding the whole field at once: a read takes a column only while its values
// summed stay within kSharedReadValues and kSharedReadValuesPerRow a row (leaves of long
// lists, 4,096 values a row each, 256 to a read, were read in slices of one row where
// each alone had slices of 256 rows; such a column is read alone, as before).
constexpr size_t kSharedReadLeaves = 256;
constexpr int64_t kSharedReadValues = int64_t{1} << 24;
constexpr int64_t kSharedReadValuesPerRow = kNestedSliceValues / 1024;  // slices >= 1,024 rows

struct SharedRead {
  int field = -1;
  std::vector<int> leaves;  // of its columns
  int64_t values = 0;       // theirs in the row group, summed (saturated)
  size_t users = 0;         // its columns still to take theirs from `chunks`
  bool read = false, ok = false;
  arrow::ArrayVector chunks;  // ReadFieldInSlices's
};

struct SharedReads {
  std::vector<SharedRead> reads;
  std::vector<int> of;  // per output column: its read, or -1 (read alone)
};

SharedReads PlanSharedReads(const Dataset& dataset, const DataFile& file, const Split& split) {
  SharedReads out;
  const auto& specs = dataset.specs();
  out.of.assign(specs.size(), -1);
  // Only columns below a field (a struct's) share reads: none, nothing to plan (most
  // datasets; this runs for every unit).
  if (std::none_of(file.columns.begin(), file.columns.end(),
                   [](const ColumnSource& src) { return !src.path.empty(); })) {
    return out;
  }
  std::unique_ptr<parquet::RowGroupMetaData> rg;  // (made at the first column below a field)
  // A read's values summed: at most kSharedReadValuesPerRow a row, and kSharedReadValues.
  const int64_t max_values =
      split.file_rows >= kSharedReadValues / kSharedReadValuesPerRow
          ? kSharedReadValues
          : std::max<int64_t>(1, split.file_rows) * kSharedReadValuesPerRow;
  std::unordered_map<int, size_t> open;  // field -> its read still taking leaves
  for (size_t c = 0; c < specs.size(); ++c) {
    if (specs[c].mask_of >= 0 || dataset.partition_index()[c] >= 0) continue;
    const ColumnSource& src = file.columns[c];
    if (src.field < 0 || src.path.empty() || src.leaves.empty() || src.type == nullptr ||
        src.type->id() == arrow::Type::NA) {
      continue;
    }
    int64_t values = 0;
    try {
      if (rg == nullptr) rg = file.RowGroup(split.row_group);
      values = ValuesOf(*rg, src.leaves);
    } catch (const std::exception&) {
      continue;  // a corrupt footer: read alone, where the error names the column
    }
    auto it = open.find(src.field);
    if (it == open.end() || out.reads[it->second].leaves.size() >= kSharedReadLeaves ||
        out.reads[it->second].values > max_values - std::min(values, max_values)) {
      out.reads.emplace_back();
      out.reads.back().field = src.field;
      it = open.insert_or_assign(src.field, out.reads.size() - 1).first;
    }
    SharedRead& r = out.reads[it->second];
    r.leaves.insert(r.leaves.end(), src.leaves.begin(), src.leaves.end());
    r.values = values > std::numeric_limits<int64_t>::max() - r.values
                   ? std::numeric_limits<int64_t>::max()
                   : r.values + values;
    ++r.users;
    out.of[c] = static_cast<int>(it->second);
  }
  for (int& s : out.of) {
    if (s >= 0 && out.reads[s].users < 2) s = -1;  // a read of one column: as before
  }
  for (SharedRead& r : out.reads) {
    std::sort(r.leaves.begin(), r.leaves.end());
    r.leaves.erase(std::unique(r.leaves.begin(), r.leaves.end()), r.leaves.end());
  }
  return out;
}

// Read `r` once, at its first column. A failure (corrupt data, out of memory) leaves it
// unread: its columns are then read one by one, as alone, so that the error names the
// column it is in.
bool ReadShared(parquet::arrow::FileReader* reader, const DataFile& file, const Split& split,
                SharedRead* r) {
  if (!r->read) {
    r->read = true;
    try {
      r->ok = ReadFieldInSlices(reader, file, split, r->field, r->leaves, &r->chunks).ok();
    } catch (const std::exception&) {
      r->ok = false;
    }
    if (!r->ok) r->chunks.clear();
  }
  return r->ok;
}

// A row group claiming more rows than this many per byte of its selected (uncompressed)
// column chunks, plus kOneShotMinRows, is read in batches of kBoundedBatchRows rows, so
// that a corrupt footer's count costs nothing until data backs it: reading a column in
// one piece reserves memory for every row the footer claims. Real data rarely comes near
// (a bit-packed boolean column has 8 rows per byte); when it does (long RLE runs), the
// batched read is correct, just a little slower.
constexpr int64_t kPlausibleRowsPerByte = 8;
constexpr int64_t kOneShotMinRows = int64_t{1} << 16;

// Read top-level field `field` of row group `row_group` in bounded batches
// (dataset/bounded_read.h), stopping once more than `claimed_rows` rows arrived.
arrow::Status ReadColumnBounded(parquet::arrow::FileReader* reader, int row_group, int field,
                                int64_t claimed_rows,
                                std::shared_ptr<arrow::ChunkedArray>* out) {
  const auto& schema_field = reader->manifest().schema_fields.at(field);
  std::vector<int> leaves;
  LeavesOf(schema_field, &leaves);
  ARROW_ASSIGN_OR_RAISE(auto table, ReadRowGroupBounded(reader, row_group, leaves, claimed_rows));
  if (table->num_columns() != 1) return arrow::Status::Invalid("unexpected column count");
  ARROW_ASSIGN_OR_RAISE(*out, arrow::ChunkedArray::Make(table->column(0)->chunks(),
                                                        schema_field.field->type()));
  return arrow::Status::OK();
}

}  // namespace

bool FillLengthFromRowGroup(const ColumnSpec& spec, const ReadOptions& options, size_t c) {
  const NullFill& fill = options.fills[c];
  const bool ragged = c < options.allow_ragged.size() && options.allow_ragged[c];
  return fill.enabled && fill.list_length < 0 && !ragged && spec.kind == ColumnKind::kTensor &&
         !spec.row_shape.empty() && spec.row_shape[0] < 0;
}

namespace {

// The length of the first list of `column` that is not null, or -1 where every row is
// null (or the column holds no lists).
int64_t FirstListLength(const arrow::ChunkedArray& column) {
  for (const auto& chunk : column.chunks()) {
    if (chunk->null_count() == chunk->length()) continue;
    for (int64_t r = 0; r < chunk->length(); ++r) {
      if (chunk->IsNull(r)) continue;
      switch (chunk->type_id()) {
        case arrow::Type::LIST:
          return static_cast<const arrow::ListArray&>(*chunk).value_length(r);
        case arrow::Type::LARGE_LIST:
          return static_cast<const arrow::LargeListArray&>(*chunk).value_length(r);
        case arrow::Type::FIXED_SIZE_LIST:
          return static_cast<const arrow::FixedSizeListArray&>(*chunk).value_length(r);
        default:
          return -1;
      }
    }
  }
  return -1;
}

}  // namespace

namespace {

// The unit's rows of a row group's column: a slice, or with a filter's selection the
// rows it kept (a slice still where they are contiguous).
arrow::Result<std::shared_ptr<arrow::ChunkedArray>> SelectRows(
    const std::shared_ptr<arrow::ChunkedArray>& column, const Split& split, const Unit& unit,
    arrow::MemoryPool* pool) {
  if (split.rows == nullptr) return column->Slice(unit.row_begin, unit.num_rows());
  const int32_t* rows = split.rows->data();
  const int64_t first = rows[unit.row_begin];
  if (unit.num_rows() == 0 || rows[unit.row_end - 1] - first == unit.num_rows() - 1) {
    return column->Slice(first, unit.num_rows());
  }
  auto indices = std::make_shared<arrow::Int32Array>(
      unit.num_rows(),
      std::make_shared<arrow::Buffer>(reinterpret_cast<const uint8_t*>(rows + unit.row_begin),
                                      unit.num_rows() * sizeof(int32_t)));
  arrow::compute::ExecContext ctx(pool);
  ARROW_ASSIGN_OR_RAISE(auto taken,
                        arrow::compute::Take(arrow::Datum(column), arrow::Datum(indices),
                                             arrow::compute::TakeOptions::NoBoundsCheck(), &ctx));
  return taken.chunked_array();
}

}  // namespace

arrow::Status SetUpFills(const Dataset& dataset, const NullFill& default_fill,
                         const std::map<std::string, NullFill>& fills, ReadOptions* out) {
  const auto& specs = dataset.specs();
  // The selected (non-mask) column names, once: a scan of specs per key was
  // O(keys x columns), seconds for a dict over 40k columns.
  std::unordered_set<std::string_view> selected;
  selected.reserve(specs.size());
  for (const auto& spec : specs) {
    if (spec.mask_of < 0) selected.insert(spec.name);
  }
  for (const auto& [name, fill] : fills) {
    if (selected.count(name) == 0) {
      // A struct's name: its leaves are the columns (null_mask= takes the name for all of them).
      std::string leaves;
      for (const auto& spec : specs) {
        if (spec.mask_of < 0 && spec.name.rfind(name + ".", 0) == 0) {
          leaves += (leaves.empty() ? "'" : ", '") + spec.name + "'";
        }
      }
      if (!leaves.empty()) {
        return MakeError(ErrorKind::kColumnNotFound, "fill_null names '", name,
                         "', a struct: name its leaf columns (", leaves, ") with their fills");
      }
      return MakeError(ErrorKind::kColumnNotFound, "fill_null names column '", name,
                       "', which is not among the selected columns");
    }
  }
  out->fills.clear();
  for (size_t c = 0; c < specs.size(); ++c) {
    const auto it = fills.find(specs[c].name);
    const bool named = it != fills.end();
    NullFill fill = named ? it->second : default_fill;
    const bool masked = c + 1 < specs.size() && specs[c + 1].mask_of == static_cast<int>(c);
    if (specs[c].mask_of >= 0) fill = NullFill{};
    if (masked && !fill.enabled) {
      fill = NullFill{};
      fill.enabled = true;
      fill.is_bytes = specs[c].kind != ColumnKind::kTensor;
      fill.rows_only = true;
    }
    out->fills.push_back(fill);
  }
  return arrow::Status::OK();
}

arrow::Status CheckFills(const Dataset& dataset, const std::map<std::string, NullFill>& fills,
                         const ReadOptions& options) {
  const auto& specs = dataset.specs();
  for (size_t c = 0; c < specs.size() && c < options.fills.size(); ++c) {
    const NullFill& fill = options.fills[c];
    if (!fill.enabled || specs[c].mask_of >= 0) continue;
    const bool named = fills.count(specs[c].name) > 0;
    const bool text = specs[c].kind != ColumnKind::kTensor;
    if (!text && !fill.is_bytes && !fill.rows_only) {
      // The fill is written in the decoded dtype (before any transform): one it cannot
      // hold was cast (2^31 in int32 became -2^31, 1.5 became 1, 300 in bool true). The
      // Python Loader checks first, in its words; this is a C++ caller's check.
      const DType d = specs[c].dtype;
      const bool fits =
          fill.is_float ? PadValueFits(d, fill.float_value)
          : d == DType::kInt64 ? true
          : d == DType::kUInt64 ? fill.int_value >= 0
                                : PadValueFits(d, static_cast<double>(fill.int_value));
      if (!fits) {
        return arrow::Status::Invalid(
            named ? "fill_null['" + specs[c].name + "']" : std::string("fill_null"), "=",
            fill.is_float ? ExactText(fill.float_value) : std::to_string(fill.int_value),
            " does not fit column '", specs[c].name, "' (", DTypeName(d),
            "): it would be cast (a fill is written in the column's decoded dtype, before "
            "its transforms)");
      }
    }
    if (text == fill.is_bytes) continue;
    const std::string value =
        fill.is_bytes ? "'" + fill.bytes_value + "'"
                      : (fill.is_float ? ExactText(fill.float_value)
                                       : std::to_string(fill.int_value));
    return arrow::Status::TypeError(
        named ? "fill_null['" + specs[c].name + "']" : std::string("fill_null"), "=", value,
        " is ", fill.is_bytes ? "a str/bytes" : "a number", ", but column '", specs[c].name,
        "' (", specs[c].arrow_type, ") holds ",
        text ? "strings or bytes: give a str or bytes" : "numbers: give an int or float",
        named ? "" : "; a scalar fill_null applies to every column, a dict only to those it names");
  }
  return arrow::Status::OK();
}

namespace {

// How a row group's column chunks are read: adjacent chunks merged into one request up
// to kReadRangeBytes (Arrow's default: 32 MiB). Each request's bytes land in one block
// of the buffer pool; 32 MiB blocks whose sizes vary with the row groups a shuffle
// window holds kept coming fresh from the OS in steady shuffled epochs (page faults and
// zeroing, a VM's dearest memory), where 8 MiB ones are recycled (docs/performance.md,
// nineteenth session). Also more requests in flight on S3 (a 44 MB row group of ~0.4 MB
// chunks: 6 instead of 2). A chunk larger than the limit is still one request (ranges
// are only ever merged, never split).
constexpr int64_t kReadRangeBytes = int64_t{8} << 20;

arrow::io::CacheOptions ReadRanges() {
  arrow::io::CacheOptions options = arrow::io::CacheOptions::Defaults();
  options.range_size_limit = kReadRangeBytes;
  return options;
}

}  // namespace

FetchedUnit::~FetchedUnit() {
  if (stat_fd >= 0) ::close(stat_fd);
}

namespace {
int64_t StatMtimeNs(const struct stat& st) {
  return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
}
}  // namespace

arrow::Result<std::shared_ptr<FetchedUnit>> FetchUnit(const Dataset& dataset, const Unit& unit,
                                                      const ReadOptions& options,
                                                      arrow::MemoryPool* pool,
                                                      const arrow::io::IOContext& io) {
  const Split& split = dataset.splits()[unit.split];
  const DataFile& file = dataset.files()[split.file];
  auto fetched = std::make_shared<FetchedUnit>();
  if (file.leaf_indices.empty()) return fetched;
  // A fork waits for this: PreBuffer spawns Arrow's I/O tasks, and the first spawn in a
  // process initialises function-local statics (Arrow's tracer); a fork in the middle of
  // that left the child waiting on the static's guard for good (a helper saw it in gdb).
  const fork_gate::Inside inside;
  const std::string where =
      "'" + file.display + "', row group " + std::to_string(split.row_group);
  ARROW_RETURN_NOT_OK(CheckFooterUnchanged(file));  // files taken from an index unlisted
  auto input = file.Open(pool);  // the listed size: no request for it
  if (!input.ok()) {
    return MakeIOError(input.status(), "cannot open ", where);
  }
  if (auto local = std::dynamic_pointer_cast<arrow::io::ReadableFile>(*input)) {
    struct stat st;
    fetched->stat_fd = ::fcntl(local->file_descriptor(), F_DUPFD_CLOEXEC, 0);
    if (fetched->stat_fd >= 0 && ::fstat(fetched->stat_fd, &st) == 0) {
      fetched->opened_size = st.st_size;
      fetched->opened_mtime_ns = StatMtimeNs(st);
      // A file changed since the listing is read as it now is, but not with a filter's
      // selection, made from the listed version: the rows handed out failed the filter
      // (the same layout with other values, silently).
      if (options.filtered && (st.st_size != file.size ||
                               (file.mtime_ns != 0 && fetched->opened_mtime_ns != file.mtime_ns))) {
        return MakeError(ErrorKind::kInvalidData, "cannot read ", where,
                         ": the filter selected its rows from the version the loader listed");
      }
    }
  }
  parquet::ReaderProperties props(pool);
  props.set_page_checksum_verification(options.verify_checksums);
  parquet::ArrowReaderProperties arrow_props = dataset.ArrowProperties();
  arrow_props.set_use_threads(false);
  arrow_props.set_pre_buffer(false);  // PreBuffer is called below, for this row group only
  try {
    auto pq = parquet::ParquetFileReader::Open(*input, props, file.Metadata());
    pq->PreBuffer({split.row_group}, file.leaf_indices, io, ReadRanges());
    auto made = parquet::arrow::FileReader::Make(pool, std::move(pq), arrow_props);
    if (!made.ok()) return WithContext(made.status(), "cannot read " + where);
    fetched->reader = std::move(made).ValueUnsafe();
  } catch (const parquet::ParquetStatusException& e) {
    // One of ours (a storage task the executor refused: no thread) keeps its kind.
    if (GetErrorDetail(e.status()) != nullptr) return WithContext(e.status(), "cannot read " + where);
    return MakeError(ErrorKind::kInvalidData, "cannot read ", where, ": ", e.what());
  } catch (const std::system_error& e) {  // a thread the OS refused, not the data
    return MakeOsError(e.code().value(), "cannot read ", where, kThreadLimitHint);
  } catch (const std::exception& e) {
    return MakeError(ErrorKind::kInvalidData, "cannot read ", where, ": ", e.what());
  }
  return fetched;
}

arrow::Status WaitForBytes(const Dataset& dataset, const Unit& unit, FetchedUnit* fetched,
                           const std::atomic<bool>* stop) {
  parquet::arrow::FileReader* reader = fetched->reader.get();
  if (reader == nullptr) return arrow::Status::OK();
  const Split& split = dataset.splits()[unit.split];
  const DataFile& file = dataset.files()[split.file];
  auto buffered = reader->parquet_reader()->WhenBuffered({split.row_group}, file.leaf_indices);
  if (stop != nullptr) {
    while (!buffered.Wait(0.05)) {
      if (stop->load()) return arrow::Status::Cancelled("the epoch was stopped");
    }
  }
  auto st = buffered.status();
  if (!st.ok()) {
    const std::string where =
        "cannot read '" + file.display + "', row group " + std::to_string(split.row_group);
    // One of ours (the object gone or changed since the listing: ListedObject's CheckSize)
    // keeps its kind: a deleted object is a DataNotFoundError, as a local file deleted so.
    if (GetErrorDetail(st) != nullptr) return WithContext(st, where);
    return MakeIOError(st, where);
  }
  if (fetched->opened_size >= 0) {
    // A local file written in place while its row group was read gave rows of two
    // versions (one column of each, silently). Seen where the write moved the size or
    // the modification time (whose clock ticks every few ms: this narrows the window).
    struct stat now;
    if (::fstat(fetched->stat_fd, &now) == 0 &&
        (now.st_size != fetched->opened_size || StatMtimeNs(now) != fetched->opened_mtime_ns)) {
      return MakeError(ErrorKind::kInvalidData, "cannot read '", file.display, "', row group ",
                       split.row_group, ": it was modified while the row group was read "
                       "(make a new Loader once it is written)");
    }
  }
  return arrow::Status::OK();
}

arrow::Result<std::shared_ptr<DecodedUnit>> ReadUnit(const Dataset& dataset,
                                                           const Unit& unit,
                                                           const ReadOptions& options,
                                                           arrow::MemoryPool* pool,
                                                           FetchedUnit* fetched) {
  const Split& split = dataset.splits()[unit.split];
  const DataFile& file = dataset.files()[split.file];
  const std::string where =
      "'" + file.display + "', row group " + std::to_string(split.row_group);
  auto decoded = std::make_shared<DecodedUnit>();
  decoded->num_rows = unit.num_rows();
  const auto& specs = dataset.specs();
  parquet::arrow::FileReader* reader = fetched->reader.get();
  ARROW_RETURN_NOT_OK(WaitForBytes(dataset, unit, fetched));  // a storage failure: kIO

  auto row_group = reader ? reader->RowGroup(split.row_group) : nullptr;
  const auto& types = dataset.column_types();
  SharedReads shared = PlanSharedReads(dataset, file, split);
  for (size_t c = 0; c < specs.size(); ++c) {
    if (specs[c].mask_of >= 0) continue;  // made with its column, below
    const bool masked = c + 1 < specs.size() && specs[c + 1].mask_of == static_cast<int>(c);
    const int key = dataset.partition_index()[c];
    if (key >= 0) {
      const bool is_null = file.partition_null[key] != 0;
      // (named: "partition key 'g' is null" alone did not say which file)
      auto col = PartitionColumn(specs[c], file.partition_values[key], is_null, options.fills[c],
                                 unit.num_rows(), pool);
      if (!col.ok()) return WithContext(col.status(), "in " + where);
      decoded->columns.push_back(std::move(col).ValueUnsafe());
      if (masked) {
        ARROW_ASSIGN_OR_RAISE(auto valid, ConstantValidity(unit.num_rows(), !is_null, pool));
        decoded->columns.push_back(std::move(valid));
      }
      continue;
    }
    const std::string col_where = where + ", column '" + specs[c].name + "'";
    const ColumnSource& src = file.columns[c];
    const bool ragged = c < options.allow_ragged.size() && options.allow_ragged[c];
    // A filled null list is as long as the others: where the footers do not say how long
    // (NullFill::list_length; Polars writes no level histograms), the row group's first
    // list does, for a unit of null lists only (a rank's share of a row group, or what a
    // filter kept of it: rows of length 0 came out beside rows of 2, silently).
    const NullFill* fill = &options.fills[c];
    NullFill row_group_fill;
    const bool length_unknown = FillLengthFromRowGroup(specs[c], options, c);
    std::shared_ptr<arrow::ChunkedArray> slice;
    if (src.field < 0 || src.type->id() == arrow::Type::NA) {
      // The file lacks the column (or holds only nulls of type null): null rows.
      ARROW_ASSIGN_OR_RAISE(auto nulls, arrow::MakeArrayOfNull(types[c], unit.num_rows(), pool));
      slice = std::make_shared<arrow::ChunkedArray>(arrow::ArrayVector{nulls});
    } else {
      std::shared_ptr<arrow::ChunkedArray> chunked;
      arrow::Status st;
      try {
        const int s = shared.of[c];
        if (s >= 0 && ReadShared(reader, file, split, &shared.reads[s])) {
          SharedRead& r = shared.reads[s];
          st = ExtractColumn(r.chunks, src, pool, &chunked);
          if (--r.users == 0) r.chunks.clear();  // (its memory: released)
        } else if (!src.path.empty() ||
            (specs[c].kind == ColumnKind::kTensor && !specs[c].row_shape.empty()) ||
            IsStringList(specs[c].kind)) {
          st = ReadNestedInSlices(reader, file, split, src, pool, &chunked);
        } else if (split.file_rows <=
                   kOneShotMinRows + kPlausibleRowsPerByte * split.uncompressed_bytes) {
          st = row_group->Column(src.field)->Read(&chunked);
        } else {
          st = ReadColumnBounded(reader, split.row_group, src.field, split.file_rows, &chunked);
        }
      } catch (const std::bad_alloc&) {
        st = arrow::Status::OutOfMemory("out of memory");
      } catch (const std::exception& e) {
        st = arrow::Status::IOError(e.what());
      }
      if (st.IsOutOfMemory()) {  // (a malloc that failed, not the data: MemoryError)
        return WithContext(st, "cannot decode " + col_where);
      }
      // A valid file Arrow C++ cannot decode (e.g. a dictionary column stored with a delta
      // encoding): Parquet C++'s ParquetException::NYI, which reaches us as an IOError.
      if (st.IsNotImplemented() || st.message().rfind("Not yet implemented", 0) == 0) {
        return MakeError(ErrorKind::kInvalidData, "cannot decode ", col_where,
                         ": Arrow C++ does not implement its encoding for this column type: ",
                         st.message());
      }
      if (!st.ok() && st.message().find("Expected all lists to be of size=") != std::string::npos) {
        // Null rows of a fixed-size list a summary's footers did not show (the footer
        // check refuses those it sees): valid, but Arrow C++ cannot read them back.
        return MakeError(ErrorKind::kUnsupportedType, "cannot decode ", col_where,
                         ": a fixed-size list with null rows or of size 0, which Arrow C++ "
                         "cannot read back from Parquet (apache/arrow#35692; the file is "
                         "valid, pyarrow fails too): ",
                         st.message(), "; write the column as a variable-size list, or select "
                         "other columns");
      }
      if (!st.ok()) {
        // A layout from a summary that records no identity of the file (pyarrow's
        // _metadata without _pqloader_index): most likely the file was rewritten since.
        const bool summary_layout = file.summary != nullptr && !file.footer_hash_is_own;
        return MakeError(ErrorKind::kInvalidData, "cannot decode ", col_where,
                         " (corrupt or truncated data): ", st.message(),
                         summary_layout
                             ? "; its row groups were taken from the directory's _metadata, "
                               "which records no size or time of the file: if it was "
                               "rewritten since, run `pqloader index` or load with "
                               "use_summary=False"
                             : "");
      }
      if (chunked->length() != split.file_rows) {
        return MakeError(ErrorKind::kInvalidData, "cannot decode ", col_where, ": read ",
                         chunked->length(), " rows, the footer says ", split.file_rows);
      }
      auto plain = WithoutExtension(chunked, pool);  // as the dataset's schema has it
      if (!plain.ok()) return WithContext(plain.status(), "cannot decode " + col_where);
      chunked = std::move(plain).ValueUnsafe();
      if (length_unknown) {
        const int64_t length = FirstListLength(*chunked);
        if (length >= 0) {
          row_group_fill = *fill;
          row_group_fill.list_length = length;
          fill = &row_group_fill;
        }
      }
      for (int leaf : src.leaves) {  // Arrow wraps INT96 dates outside int64 of their unit
        if (file.schema()->Column(leaf)->physical_type() != parquet::Type::INT96) continue;
        ARROW_RETURN_NOT_OK(CheckInt96Rows(reader->parquet_reader(), split.row_group, leaf,
                                           unit.row_begin, unit.row_end, split.rows.get(),
                                           dataset.int96_unit(), col_where));
      }
      ARROW_ASSIGN_OR_RAISE(slice, SelectRows(chunked, split, unit, pool));
    }
    auto converted = ConvertColumn(specs[c], *slice, *fill, pool, ragged,
                                   RowNumbering(unit.row_begin, split.rows.get()));
    if (!converted.ok()) return WithContext(converted.status(), "in " + where);
    decoded->columns.push_back(std::move(converted).ValueUnsafe());
    if (masked) {
      ARROW_ASSIGN_OR_RAISE(auto valid, ValidityColumn(*slice, pool));
      decoded->columns.push_back(std::move(valid));
    }
  }
  return decoded;
}

}  // namespace pqloader
