#include "pqloader/decode/read_unit.h"

#include <algorithm>
#include <cstring>

#include <arrow/chunked_array.h>
#include <arrow/record_batch.h>
#include <arrow/filesystem/filesystem.h>
#include <arrow/io/caching.h>
#include <arrow/util/future.h>
#include <arrow/io/interfaces.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>
#include <parquet/properties.h>

#include "pqloader/error.h"

namespace pqloader {

namespace {

// A column made of one partition value repeated `rows` times.
arrow::Result<ColumnData> PartitionColumn(const ColumnSpec& spec, const std::string& value,
                                          int64_t rows, arrow::MemoryPool* pool) {
  ColumnData out;
  if (spec.kind == ColumnKind::kTensor) {
    const int64_t v = std::stoll(value);
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

// Leaf (Parquet column) indices of a field of the Arrow schema.
void LeavesOf(const parquet::arrow::SchemaField& f, std::vector<int>* out) {
  if (f.column_index >= 0) out->push_back(f.column_index);
  for (const auto& child : f.children) LeavesOf(child, out);
}

// Leaf values (repetition/definition levels) decoded at once, at most, for a list
// column: reading a whole row group of a list column materialises two int16 levels
// per value (8192 rows x 4096 uint8 values: 134 MB of levels for 32 MB of data).
constexpr int64_t kNestedSliceValues = int64_t{1} << 20;

// Read list column `field` of `split`'s row group in slices of rows, so that its
// levels stay small; the result has one chunk per slice.
arrow::Status ReadNestedInSlices(parquet::arrow::FileReader* reader, const DataFile& file,
                                 const Split& split, int field,
                                 std::shared_ptr<arrow::ChunkedArray>* out) {
  std::vector<int> leaves;
  LeavesOf(reader->manifest().schema_fields[field], &leaves);
  int64_t values = 0;
  auto rg = file.metadata->RowGroup(split.row_group);
  for (int leaf : leaves) values = std::max(values, rg->ColumnChunk(leaf)->num_values());
  const int64_t per_row = std::max<int64_t>(1, values / std::max<int64_t>(1, split.num_rows));
  reader->set_batch_size(std::clamp<int64_t>(kNestedSliceValues / per_row, 1, 1 << 16));
  ARROW_ASSIGN_OR_RAISE(auto batches, reader->GetRecordBatchReader({split.row_group}, leaves));
  arrow::ArrayVector chunks;
  while (true) {
    std::shared_ptr<arrow::RecordBatch> batch;
    ARROW_RETURN_NOT_OK(batches->ReadNext(&batch));
    if (batch == nullptr) break;
    if (batch->num_columns() != 1) return arrow::Status::Invalid("expected one column");
    chunks.push_back(batch->column(0));
  }
  ARROW_ASSIGN_OR_RAISE(*out, arrow::ChunkedArray::Make(
                                  std::move(chunks), reader->manifest().schema_fields[field].field->type()));
  return arrow::Status::OK();
}

// A row group claiming more rows than this many per byte of its selected (uncompressed)
// column chunks, plus kOneShotMinRows, is read in batches of kBoundedBatchRows rows, so
// that a corrupt footer's count costs nothing until data backs it: reading a column in
// one piece reserves memory for every row the footer claims. Real data rarely comes near
// (a bit-packed boolean column has 8 rows per byte); when it does (long RLE runs), the
// batched read is correct, just a little slower.
constexpr int64_t kPlausibleRowsPerByte = 8;
constexpr int64_t kOneShotMinRows = int64_t{1} << 16;
constexpr int64_t kBoundedBatchRows = int64_t{1} << 16;

// Read top-level field `field` of row group `row_group` in batches of kBoundedBatchRows,
// stopping once more than `claimed_rows` rows arrived or the data ends.
arrow::Status ReadColumnBounded(parquet::arrow::FileReader* reader, int row_group, int field,
                                int64_t claimed_rows,
                                std::shared_ptr<arrow::ChunkedArray>* out) {
  const auto& schema_field = reader->manifest().schema_fields.at(field);
  std::vector<int> leaves;
  LeavesOf(schema_field, &leaves);
  reader->set_batch_size(kBoundedBatchRows);
  ARROW_ASSIGN_OR_RAISE(auto batches, reader->GetRecordBatchReader({row_group}, leaves));
  arrow::ArrayVector chunks;
  int64_t rows = 0;
  while (rows <= claimed_rows) {
    std::shared_ptr<arrow::RecordBatch> batch;
    ARROW_RETURN_NOT_OK(batches->ReadNext(&batch));
    if (batch == nullptr) break;
    if (batch->num_columns() != 1) return arrow::Status::Invalid("unexpected column count");
    rows += batch->num_rows();
    chunks.push_back(batch->column(0));
  }
  ARROW_ASSIGN_OR_RAISE(*out, arrow::ChunkedArray::Make(std::move(chunks),
                                                        schema_field.field->type()));
  return arrow::Status::OK();
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
  const std::string where =
      "'" + file.display + "', row group " + std::to_string(split.row_group);
  arrow::fs::FileInfo info(file.path, arrow::fs::FileType::File);
  info.set_size(file.size);  // known since Dataset::Open: no request for it
  auto input = file.fs->OpenInputFile(info);
  if (!input.ok()) {
    return MakeError(ErrorKind::kIO, "cannot open ", where, ": ", input.status().message());
  }
  parquet::ReaderProperties props(pool);
  props.set_page_checksum_verification(options.verify_checksums);
  parquet::ArrowReaderProperties arrow_props;
  arrow_props.set_use_threads(false);
  arrow_props.set_pre_buffer(false);  // PreBuffer is called below, for this row group only
  try {
    auto pq = parquet::ParquetFileReader::Open(*input, props, file.metadata);
    pq->PreBuffer({split.row_group}, file.leaf_indices, io, arrow::io::CacheOptions::Defaults());
    auto made = parquet::arrow::FileReader::Make(pool, std::move(pq), arrow_props);
    if (!made.ok()) return WithContext(made.status(), "cannot read " + where);
    fetched->reader = std::move(made).ValueUnsafe();
  } catch (const std::exception& e) {
    return MakeError(ErrorKind::kInvalidData, "cannot read ", where, ": ", e.what());
  }
  return fetched;
}

arrow::Status WaitForBytes(const Dataset& dataset, const Unit& unit, FetchedUnit* fetched) {
  parquet::arrow::FileReader* reader = fetched->reader.get();
  if (reader == nullptr) return arrow::Status::OK();
  const Split& split = dataset.splits()[unit.split];
  const DataFile& file = dataset.files()[split.file];
  auto st = reader->parquet_reader()->WhenBuffered({split.row_group}, file.leaf_indices).status();
  if (!st.ok()) {
    return MakeError(ErrorKind::kIO, "cannot read '", file.display, "', row group ",
                     split.row_group, ": ", st.message());
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
  size_t file_column = 0;
  for (size_t c = 0; c < specs.size(); ++c) {
    const int key = dataset.partition_index()[c];
    if (key >= 0) {
      ARROW_ASSIGN_OR_RAISE(auto col, PartitionColumn(specs[c], file.partition_values[key],
                                                      unit.num_rows(), pool));
      decoded->columns.push_back(std::move(col));
      continue;
    }
    const std::string col_where = where + ", column '" + specs[c].name + "'";
    std::shared_ptr<arrow::ChunkedArray> chunked;
    arrow::Status st;
    const int field = file.field_indices[file_column++];
    try {
      if (specs[c].kind == ColumnKind::kTensor && !specs[c].row_shape.empty()) {
        st = ReadNestedInSlices(reader, file, split, field, &chunked);
      } else if (split.num_rows <=
                 kOneShotMinRows + kPlausibleRowsPerByte * split.uncompressed_bytes) {
        st = row_group->Column(field)->Read(&chunked);
      } else {
        st = ReadColumnBounded(reader, split.row_group, field, split.num_rows, &chunked);
      }
    } catch (const std::exception& e) {
      st = arrow::Status::IOError(e.what());
    }
    if (!st.ok()) {
      return MakeError(ErrorKind::kInvalidData, "cannot decode ", col_where,
                       " (corrupt or truncated data): ", st.message());
    }
    if (chunked->length() != split.num_rows) {
      return MakeError(ErrorKind::kInvalidData, "cannot decode ", col_where, ": read ",
                       chunked->length(), " rows, the footer says ", split.num_rows);
    }
    auto slice = chunked->Slice(unit.row_begin, unit.num_rows());
    const bool ragged = c < options.allow_ragged.size() && options.allow_ragged[c];
    auto converted =
        ConvertColumn(specs[c], *slice, options.fills[c], pool, ragged, unit.row_begin);
    if (!converted.ok()) return WithContext(converted.status(), "in " + where);
    decoded->columns.push_back(std::move(converted).ValueUnsafe());
  }
  return decoded;
}

}  // namespace pqloader
