#include "pqloader/pack/document_lengths.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <limits>
#include <mutex>
#include <tuple>

#include <arrow/array.h>
#include <arrow/record_batch.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/exception.h>
#include <parquet/file_reader.h>

#include "pqloader/decode/nested.h"
#include "pqloader/dataset/columns.h"
#include "pqloader/cache/split_cache.h"
#include "pqloader/error.h"
#include "pqloader/pack/length_store.h"
#include "pqloader/util/node_lock.h"
#include "pqloader/util/parallel_for.h"

namespace pqloader {

namespace {

// Rows decoded at once: their values and levels are the only memory the pass holds.
constexpr int64_t kRowsPerSlice = 8192;

// Every row's length of column `spec` in `split`'s row group (all its rows, whatever a
// filter keeps), -1 for a null row, into `out`.
arrow::Status ReadRowGroupLengths(const Dataset& dataset, int64_t split_index, int spec,
                                  arrow::MemoryPool* pool, std::vector<int32_t>* out) {
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
  const std::vector<int> leaves = LeavesToRead(reader->manifest().schema_fields[src.field], src.leaves);
  ARROW_ASSIGN_OR_RAISE(auto batches, reader->GetRecordBatchReader({split.row_group}, leaves));
  out->reserve(static_cast<size_t>(split.file_rows));
  while (true) {
    std::shared_ptr<arrow::RecordBatch> batch;
    ARROW_RETURN_NOT_OK(batches->ReadNext(&batch));
    if (batch == nullptr) break;
    if (batch->num_columns() != 1) return arrow::Status::Invalid("expected one column");
    ARROW_ASSIGN_OR_RAISE(auto column, ExtractPath(batch->column(0), src.path, pool));
    const arrow::Array& a = *column;
    for (int64_t r = 0; r < a.length(); ++r) {
      int64_t n = -1;
      if (a.IsNull(r)) {
        // (Kept, dropped or filled: the split's use decides; KeepLengths.)
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
  return arrow::Status::OK();
}

// The lengths of the rows `split` keeps (a filter's, or all) from `raw`, its row
// group's (ReadRowGroupLengths), into `out` (split.num_rows of them). A null row is an
// empty document with `null_is_empty` (counted in `*nulls`), an error naming it
// otherwise; a null row the filter drops is never packed, so it is neither.
arrow::Status KeepLengths(const int32_t* raw, const Split& split, bool null_is_empty,
                          const std::string& null_remedy, int32_t* out, int64_t* nulls) {
  const int64_t kept = split.rows != nullptr ? static_cast<int64_t>(split.rows->size())
                                             : split.file_rows;
  if (kept != split.num_rows) {
    return arrow::Status::Invalid("read ", kept, " rows, the split keeps ", split.num_rows);
  }
  for (int64_t i = 0; i < kept; ++i) {
    const int64_t row = split.rows != nullptr ? (*split.rows)[i] : i;
    int32_t n = raw[row];
    if (n < 0) {
      if (!null_is_empty) {
        return arrow::Status::Invalid("row ", row, " is a null list",
                                      null_remedy.empty() ? "" : "; ", null_remedy);
      }
      ++*nulls;
      n = 0;
    }
    out[i] = n;
  }
  return arrow::Status::OK();
}

// The ranks of a node wait this long for the one reading lengths the store lacks, then
// read them too.
constexpr auto kLengthsLockTimeout = std::chrono::minutes(30);

}  // namespace

arrow::Result<std::shared_ptr<const DocumentLengths>> DocumentLengths::Read(
    const Dataset& dataset, int column, bool null_is_empty, const std::string& null_remedy,
    int threads, arrow::MemoryPool* pool, const CancelFlag& cancel, const std::string& store_dir) {
  if (dataset.partition_index()[column] >= 0) {
    return arrow::Status::Invalid("column '", dataset.specs()[column].name,
                                  "' is a partition key, not a list column");
  }
  const auto& splits = dataset.splits();
  const auto& files = dataset.files();
  const auto num_splits = static_cast<int64_t>(splits.size());
  // Each split's lengths are written in place by the thread that reads it (no second
  // copy of every length while they are put together).
  auto out = std::make_shared<DocumentLengths>();
  out->first_.reserve(num_splits + 1);
  int64_t rows = 0;
  for (const Split& split : splits) {
    out->first_.push_back(rows);
    rows += split.num_rows;
  }
  out->first_.push_back(rows);
  std::vector<int32_t> lengths(static_cast<size_t>(rows));  // zeros: a split of empty documents
  std::vector<int64_t> nulls(num_splits, 0);
  std::vector<arrow::Status> status(num_splits);
  auto fail = [&](int64_t s, const arrow::Status& st) {
    const DataFile& file = files[splits[s].file];
    if (st.IsOutOfMemory()) {  // (a malloc that failed, not the data: MemoryError)
      status[s] = WithContext(st, "cannot read the lengths of column '" +
                                      dataset.specs()[column].name + "' in '" + file.display +
                                      "', row group " + std::to_string(splits[s].row_group));
    } else if (st.IsCancelled()) {
      status[s] = st;
    } else {
      status[s] = MakeError(ErrorKind::kInvalidData, "cannot read the lengths of column '",
                            dataset.specs()[column].name, "' in '", file.display,
                            "', row group ", splits[s].row_group, ": ", st.message());
    }
  };
  auto keep = [&](int64_t s, const int32_t* raw) {
    const arrow::Status st = KeepLengths(raw, splits[s], null_is_empty, null_remedy,
                                         lengths.data() + out->first_[s], &nulls[s]);
    if (!st.ok()) fail(s, st);
  };
  // The splits of each file that read the column; files lacking it decided here.
  std::vector<std::vector<int64_t>> by_file(files.size());
  for (int64_t s = 0; s < num_splits; ++s) {
    const ColumnSource& src = files[splits[s].file].columns[column];
    if (src.field >= 0) {
      by_file[splits[s].file].push_back(s);
    } else if (null_is_empty) {
      // Empty documents: one per row the split keeps (a filter's, or all): the zeros
      // already there.
      nulls[s] = splits[s].num_rows;
    } else {
      fail(s, arrow::Status::Invalid("the file lacks the column (its rows are null)",
                                     null_remedy.empty() ? "" : "; ", null_remedy));
    }
  }

  // Kept in store_dir: each file's lengths once, not at every start of every rank. Not
  // those of an object modified just before it was listed (DataFile::settled).
  const bool storing = !store_dir.empty() && store_dir != ":memory:";
  auto stored = [&](size_t f) { return storing && files[f].settled && !by_file[f].empty(); };
  std::vector<uint8_t> done(num_splits, 0);  // lengths taken from the store
  // What a file's stored lengths held that this dataset does not read (another filter's
  // row groups): kept when its lengths are stored again.
  std::vector<FileLengths> held(files.size());
  std::vector<std::string> keys(files.size());
  std::atomic<int64_t> from_store{0};
  auto load = [&](int64_t f) {
    if (!stored(f) || IsCancelled(cancel)) return;
    bool all = true;
    try {
      if (keys[f].empty()) keys[f] = LengthsKey(files[f], files[f].columns[column]);
      auto entry = LoadLengths(store_dir, keys[f], files[f].num_row_groups(), files[f].num_rows());
      for (int64_t s : by_file[f]) {
        if (done[s] != 0) continue;
        const int64_t at = entry ? entry->Find(splits[s].row_group, splits[s].file_rows) : -1;
        if (at < 0) {
          all = false;
          continue;
        }
        keep(s, entry->lengths.data() + at);
        done[s] = 1;
      }
      if (!all && entry) held[f] = std::move(*entry);
    } catch (const std::exception&) {
      return;  // (out of memory, or a footer that will not parse: read from the source)
    }
    if (all) ++from_store;
  };
  auto missing = [&] {
    std::vector<int64_t> todo;
    for (size_t f = 0; f < files.size(); ++f) {
      for (int64_t s : by_file[f]) {
        if (done[s] == 0) todo.push_back(s);
      }
    }
    return todo;
  };
  std::string store_error;  // the first failure to keep lengths
  bool prepared = false;    // lengths/ made and swept: files are stored as they are read
  std::unique_ptr<NodeLock> node_lock;
  if (storing) {
    ParallelFor(static_cast<int64_t>(files.size()), threads, load);
    if (!missing().empty()) {
      // One rank of a node reads what the store lacks; the others wait, then load it.
      // Not one that cannot store (a read-only cache_dir): holding the lock, each rank
      // of the node read in turn, waiting up to kLengthsLockTimeout for nothing.
      store_error = PrepareLengthsStore(store_dir);
      prepared = store_error.empty();
      if (prepared) {
        node_lock =
            NodeLock::AcquireToStore(LengthsLockPath(store_dir), kLengthsLockTimeout, cancel);
        if (IsCancelled(cancel)) return CancelledStatus();
        ParallelFor(static_cast<int64_t>(files.size()), threads, [&](int64_t f) {
          for (int64_t s : by_file[f]) {
            if (done[s] == 0) return load(f);
          }
        });
      }
    }
  }

  // The rest read from the source, in parallel over row groups; a file's lengths are
  // stored once its last row group is read (so only files in flight hold them twice).
  struct Pending {
    std::mutex mu;
    int64_t left = 0;
    bool failed = false;
    std::vector<std::pair<int64_t, std::vector<int32_t>>> read;  // row group, raw lengths
  };
  const std::vector<int64_t> todo = missing();
  std::vector<Pending> pending(files.size());
  for (int64_t s : todo) ++pending[splits[s].file].left;
  std::mutex store_mu;
  std::atomic<int64_t> stored_files{0};
  auto store = [&](size_t f, Pending* p) {
    // The row groups read now and those the stored file held besides, ascending.
    std::vector<std::tuple<int64_t, const int32_t*, int64_t>> parts;  // row group, lengths, rows
    for (const auto& [rg, raw] : p->read) {
      parts.emplace_back(rg, raw.data(), static_cast<int64_t>(raw.size()));
    }
    const FileLengths& old = held[f];
    int64_t offset = 0;
    for (size_t i = 0; i < old.row_groups.size(); ++i) {
      const bool read_now = std::any_of(p->read.begin(), p->read.end(),
                                        [&](const auto& r) { return r.first == old.row_groups[i]; });
      if (!read_now) parts.emplace_back(old.row_groups[i], old.lengths.data() + offset, old.rows[i]);
      offset += old.rows[i];
    }
    std::sort(parts.begin(), parts.end());
    FileLengths merged;
    for (const auto& [rg, data, n] : parts) {
      merged.row_groups.push_back(rg);
      merged.rows.push_back(n);
      merged.lengths.insert(merged.lengths.end(), data, data + n);
    }
    if (keys[f].empty()) keys[f] = LengthsKey(files[f], files[f].columns[column]);
    std::string error = StoreLengths(store_dir, keys[f], merged);
    if (error.empty()) {
      ++stored_files;
      return;
    }
    std::lock_guard<std::mutex> lock(store_mu);
    if (store_error.empty()) store_error = std::move(error);
  };
  ParallelFor(static_cast<int64_t>(todo.size()), threads, [&](int64_t i) {
    const RetryStopScope no_retry_once_cancelled(cancel);
    const int64_t s = todo[i];
    const auto f = static_cast<size_t>(splits[s].file);
    std::vector<int32_t> raw;
    arrow::Status st;
    if (IsCancelled(cancel)) {
      st = CancelledStatus();
    } else {
      try {
        st = ReadRowGroupLengths(dataset, s, column, pool, &raw);
        if (st.ok()) keep(s, raw.data());
      } catch (const std::bad_alloc&) {
        st = arrow::Status::OutOfMemory("out of memory");
      } catch (const std::exception& e) {
        st = arrow::Status::IOError(e.what());
      }
      if (!st.ok()) fail(s, st);
    }
    if (!stored(f) || !prepared) return;
    Pending& p = pending[f];
    std::unique_lock<std::mutex> lock(p.mu);
    p.failed = p.failed || !st.ok();
    if (st.ok()) p.read.emplace_back(splits[s].row_group, std::move(raw));
    if (--p.left > 0 || p.failed) return;
    lock.unlock();
    try {
      store(f, &p);
    } catch (const std::exception& e) {  // (out of memory: not kept, as a failed write)
      std::lock_guard<std::mutex> guard(store_mu);
      if (store_error.empty()) store_error = std::string("cannot save row lengths: ") + e.what();
    }
    p.read.clear();
    p.read.shrink_to_fit();
    held[f] = FileLengths();
  });
  node_lock.reset();
  for (const auto& st : status) ARROW_RETURN_NOT_OK(st);
  for (int64_t n : nulls) out->null_rows_ += n;
  out->files_from_store_ = from_store;
  out->files_stored_ = stored_files;
  out->store_error_ = std::move(store_error);
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
