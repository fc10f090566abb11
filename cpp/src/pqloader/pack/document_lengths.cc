#include "pqloader/pack/document_lengths.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <thread>

#include <arrow/array.h>
#include <arrow/record_batch.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>

#include "pqloader/decode/nested.h"
#include "pqloader/dataset/columns.h"
#include "pqloader/error.h"
#include "pqloader/util/start_threads.h"

namespace pqloader {

namespace {

// Rows decoded at once: their values and levels are the only memory the pass holds.
constexpr int64_t kRowsPerSlice = 8192;

// Append the row lengths of column `src` (a top-level field, or a path below one) in
// `split`'s row group to `out`.
arrow::Status ReadSplit(const Dataset& dataset, int64_t split_index, int spec,
                        bool null_is_empty, const std::string& null_remedy,
                        arrow::MemoryPool* pool, std::vector<int32_t>* out, int64_t* nulls) {
  const ColumnSource& src = dataset.files()[dataset.splits()[split_index].file].columns[spec];
  const Split& split = dataset.splits()[split_index];
  const DataFile& file = dataset.files()[split.file];
  ARROW_ASSIGN_OR_RAISE(auto input, file.Open());
  parquet::ArrowReaderProperties props = dataset.ArrowProperties();
  props.set_use_threads(false);
  props.set_batch_size(kRowsPerSlice);
  // Read on this thread, not Arrow's I/O pool: its RetryStopScope then ends a read
  // against a stalled store once Ctrl-C is pressed (util/cancel.h).
  props.set_pre_buffer(false);
  auto pq = parquet::ParquetFileReader::Open(input, parquet::ReaderProperties(pool), file.Metadata());
  ARROW_ASSIGN_OR_RAISE(auto reader, parquet::arrow::FileReader::Make(pool, std::move(pq), props));
  std::vector<int> leaves = src.leaves;
  if (leaves.empty()) LeavesOf(reader->manifest().schema_fields[src.field], &leaves);
  ARROW_ASSIGN_OR_RAISE(auto batches, reader->GetRecordBatchReader({split.row_group}, leaves));
  out->reserve(static_cast<size_t>(split.file_rows));
  while (true) {
    std::shared_ptr<arrow::RecordBatch> batch;
    ARROW_RETURN_NOT_OK(batches->ReadNext(&batch));
    if (batch == nullptr) break;
    if (batch->num_columns() != 1) return arrow::Status::Invalid("expected one column");
    ARROW_ASSIGN_OR_RAISE(auto column, ExtractPath(batch->column(0), src.path, pool));
    const arrow::Array& a = *column;
    const int64_t first_row = static_cast<int64_t>(out->size());
    for (int64_t r = 0; r < a.length(); ++r) {
      int64_t n = 0;
      if (a.IsNull(r)) {
        // An empty document (no tokens) with a fill; a row the filter drops is never
        // packed, so its length does not matter.
        const auto row = static_cast<int32_t>(first_row + r);
        const bool dropped = split.rows != nullptr &&
                             !std::binary_search(split.rows->begin(), split.rows->end(), row);
        if (!null_is_empty && !dropped) {
          return arrow::Status::Invalid("row ", row, " is a null list",
                                        null_remedy.empty() ? "" : "; ", null_remedy);
        }
        if (!dropped) ++*nulls;
      } else if (a.type_id() == arrow::Type::LIST) {
        n = static_cast<const arrow::ListArray&>(a).value_length(r);
      } else if (a.type_id() == arrow::Type::LARGE_LIST) {
        n = static_cast<const arrow::LargeListArray&>(a).value_length(r);
      } else if (a.type_id() == arrow::Type::FIXED_SIZE_LIST) {
        n = static_cast<const arrow::FixedSizeListArray&>(a).list_type()->list_size();
      } else {
        return arrow::Status::Invalid("not a list column (", a.type()->ToString(), ")");
      }
      if (n > std::numeric_limits<int32_t>::max()) return arrow::Status::Invalid("a list of ", n, " values");
      out->push_back(static_cast<int32_t>(n));
    }
  }
  if (static_cast<int64_t>(out->size()) != split.file_rows) {
    return arrow::Status::Invalid("read ", out->size(), " rows, the footer says ", split.file_rows);
  }
  if (split.rows != nullptr) {  // a filter kept these rows only
    std::vector<int32_t> kept;
    kept.reserve(split.rows->size());
    for (int32_t r : *split.rows) kept.push_back((*out)[r]);
    *out = std::move(kept);
  }
  return arrow::Status::OK();
}

}  // namespace

arrow::Result<std::shared_ptr<const DocumentLengths>> DocumentLengths::Read(
    const Dataset& dataset, int column, bool null_is_empty, const std::string& null_remedy,
    int threads, arrow::MemoryPool* pool, const CancelFlag& cancel) {
  if (dataset.partition_index()[column] >= 0) {
    return arrow::Status::Invalid("column '", dataset.specs()[column].name,
                                  "' is a partition key, not a list column");
  }
  const auto num_splits = static_cast<int64_t>(dataset.splits().size());
  // Each split's lengths are written in place by the thread that reads it (no second
  // copy of every length while they are put together).
  auto out = std::make_shared<DocumentLengths>();
  out->first_.reserve(num_splits + 1);
  int64_t rows = 0;
  for (const Split& split : dataset.splits()) {
    out->first_.push_back(rows);
    rows += split.num_rows;
  }
  out->first_.push_back(rows);
  std::vector<int32_t> lengths(static_cast<size_t>(rows));  // zeros: a split of empty documents
  std::vector<int64_t> nulls(num_splits, 0);
  std::vector<arrow::Status> status(num_splits);
  std::atomic<int64_t> next{0};
  auto work = [&] {
    const RetryStopScope no_retry_once_cancelled(cancel);
    for (int64_t s = next++; s < num_splits; s = next++) {
      if (IsCancelled(cancel)) {
        status[s] = CancelledStatus();
        continue;
      }
      const Split& split = dataset.splits()[s];
      const DataFile& file = dataset.files()[split.file];
      arrow::Status st;
      try {
        const ColumnSource& src = file.columns[column];
        if (src.field < 0 && null_is_empty) {
          // Empty documents: one per row the split keeps (a filter's, or all): the zeros
          // already there.
          nulls[s] = split.num_rows;
        } else if (src.field < 0) {
          st = arrow::Status::Invalid("the file lacks the column (its rows are null)",
                                      null_remedy.empty() ? "" : "; ", null_remedy);
        } else {
          std::vector<int32_t> mine;
          st = ReadSplit(dataset, s, column, null_is_empty, null_remedy, pool, &mine, &nulls[s]);
          if (st.ok() && static_cast<int64_t>(mine.size()) != split.num_rows) {
            st = arrow::Status::Invalid("read ", mine.size(), " rows, the split keeps ",
                                        split.num_rows);
          }
          if (st.ok()) std::copy(mine.begin(), mine.end(), lengths.begin() + out->first_[s]);
        }
      } catch (const std::bad_alloc&) {
        st = arrow::Status::OutOfMemory("out of memory");
      } catch (const std::exception& e) {
        st = arrow::Status::IOError(e.what());
      }
      if (st.IsOutOfMemory()) {  // (a malloc that failed, not the data: MemoryError)
        status[s] = WithContext(st, "cannot read the lengths of column '" +
                                        dataset.specs()[column].name + "' in '" + file.display +
                                        "', row group " + std::to_string(split.row_group));
      } else if (!st.ok()) {
        status[s] = MakeError(ErrorKind::kInvalidData, "cannot read the lengths of column '",
                              dataset.specs()[column].name, "' in '", file.display,
                              "', row group ", split.row_group, ": ", st.message());
      }
    }
  };
  std::vector<std::thread> pool_threads;
  const int n = std::max(1, std::min<int>(threads, static_cast<int>(num_splits)));
  if (StartThreads(n, work, &pool_threads) == 0) work();  // none started: this thread reads
  for (auto& t : pool_threads) t.join();
  for (const auto& st : status) ARROW_RETURN_NOT_OK(st);
  for (int64_t n : nulls) out->null_rows_ += n;
  out->lengths_.Assign(std::move(lengths));
  return std::shared_ptr<const DocumentLengths>(std::move(out));
}

namespace {

// The lower order statistic for the quantile numerator / denominator of `values` (a copy
// of the lengths, which nth_element reorders).
int32_t LowerQuantile(std::vector<int32_t>* values, int64_t numerator, int64_t denominator) {
  const auto n = static_cast<int64_t>(values->size());
  const int64_t index = (n - 1) * numerator / denominator;  // floor(q * (n - 1)), exact
  std::nth_element(values->begin(), values->begin() + index, values->end());
  return (*values)[index];
}

constexpr int64_t kPercent = 100;

}  // namespace

LengthStats SummarizeLengths(const std::vector<int32_t>& lengths) {
  LengthStats s;
  s.rows = static_cast<int64_t>(lengths.size());
  if (lengths.empty()) return s;
  const auto [lo, hi] = std::minmax_element(lengths.begin(), lengths.end());
  s.min = *lo;
  s.max = *hi;
  for (int32_t n : lengths) s.total += n;
  std::vector<int32_t> work = lengths;
  s.median = LowerQuantile(&work, 50, kPercent);
  s.p99 = LowerQuantile(&work, 99, kPercent);
  return s;
}

}  // namespace pqloader
