// Loader: its units, for the pipeline's unit tasks (see loader.h) — decoded from the
// bytes read ahead (or fetched now), or taken from the cache and put there, made
// row-major for shuffled batches. Reading ahead is loader.cc's (MakeReadAhead).
#include "pqloader/loader.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <arrow/util/thread_pool.h>

#include "pqloader/cache/entry_format.h"
#include "pqloader/dataset/footer_checks.h"
#include "pqloader/error.h"
#include "pqloader/loader_internal.h"
#include "pqloader/plan/split_uses.h"
#include "pqloader/util/fork_gate.h"
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

namespace {

// Columns with rows of at most this many bytes are gathered row-major when shuffling
// (see WithRowMajor); larger rows are gathered well column by column.
constexpr int64_t kRowMajorMaxRowBytes = 64;

}  // namespace

arrow::Result<std::shared_ptr<DecodedUnit>> Loader::DecodeRows(
    const Unit& unit, arrow::Result<std::shared_ptr<FetchedUnit>> fetched, Work* work) {
  ARROW_ASSIGN_OR_RAISE(auto f, std::move(fetched));
  if (f == nullptr) {  // not fetched ahead: fetch now
    ARROW_ASSIGN_OR_RAISE(f, FetchUnit(*dataset_, unit, read_options_, pool_,
                                       arrow::io::IOContext(pool_, io_pool_.get())));
    bytes_fetched_ += dataset_->splits()[unit.split].compressed_bytes;
  }
  const int64_t t0 = NowNs();
  ARROW_RETURN_NOT_OK(WaitForBytes(*dataset_, unit, f.get(), &work->stopping));
  const int64_t t1 = NowNs();
  work->read_ns += t1 - t0;
  ARROW_ASSIGN_OR_RAISE(auto decoded, ReadUnit(*dataset_, unit, read_options_, pool_, f.get()));
  const int64_t t2 = NowNs();
  work->decode_ns += t2 - t1;
  work->bytes_read += dataset_->splits()[unit.split].compressed_bytes;
  if (!transforms_.empty()) {
    struct AddOnExit {
      std::atomic<int64_t>* to;
      int64_t since;
      ~AddOnExit() { *to += NowNs() - since; }
    } timer{&work->transform_ns, t2};
    const Split& split = dataset_->splits()[unit.split];
    ARROW_RETURN_NOT_OK(transforms_.ApplyPrefix(
        decoded.get(), dataset_->specs(), [&](int64_t r) {
          return "'" + dataset_->files()[split.file].display + "', row group " +
                 std::to_string(split.row_group) + ", row " + std::to_string(unit.row_begin + r);
        }));
  }
  return decoded;
}

SourceIdentity Loader::SourceOf(int64_t split_index) const {
  const Split& split = dataset_->splits()[split_index];
  const DataFile& file = dataset_->files()[split.file];
  return SourceIdentity{file.display, file.size, file.mtime_ns, file.footer_hash, split.row_group};
}

std::string Loader::HowChanged(int64_t split_index, bool ask_remote) const {
  const DataFile& file = dataset_->files()[dataset_->splits()[split_index].file];
  // A local file costs a stat; asking an object store costs a request.
  if (file.fs == nullptr || (!ask_remote && file.fs->type_name() != "local")) return "";
  auto info = [&] {
    const fork_gate::Inside inside;  // a request: a fork waits for it (see fork_gate.h)
    return file.fs->GetFileInfo(file.path);
  }();
  if (!info.ok()) return "";  // its next read will say what is wrong
  if (info->type() == arrow::fs::FileType::NotFound) return kGone;
  if (info->type() == arrow::fs::FileType::Directory) return kNowDirectory;
  if (info->type() != arrow::fs::FileType::File) return "is no longer a regular file";
  if (info->size() != file.size) {
    return "changed since the loader listed it (" + std::to_string(file.size) + " bytes, now " +
           std::to_string(info->size()) + ")";
  }
  const int64_t mtime_ns =
      info->mtime() == arrow::fs::kNoTime
          ? 0
          : std::chrono::duration_cast<std::chrono::nanoseconds>(info->mtime().time_since_epoch())
                .count();
  return mtime_ns != file.mtime_ns ? "was modified since the loader listed it" : "";
}

bool Loader::SourceChanged(int64_t split_index) const {
  // Not an object store's: that would cost a request per insert.
  return !HowChanged(split_index, /*ask_remote=*/false).empty();
}

arrow::Status Loader::NoteIfChanged(const arrow::Status& st, int64_t split_index) const {
  const ErrorDetail* detail = GetErrorDetail(st);
  if (st.ok() || detail == nullptr ||
      (detail->kind() != ErrorKind::kInvalidData && detail->kind() != ErrorKind::kIO)) {
    return st;
  }
  // On the error path only: on an object store this costs a request, not made after a
  // storage failure (the store may be what failed: the request would retry as long).
  const std::string what =
      HowChanged(split_index, /*ask_remote=*/detail->kind() == ErrorKind::kInvalidData);
  if (what.empty()) return st;
  const DataFile& file = dataset_->files()[dataset_->splits()[split_index].file];
  // A file deleted since it was listed is not found (FileNotFoundError in Python), not
  // a failing storage.
  std::shared_ptr<arrow::StatusDetail> kind = st.detail();
  if (what == kGone || what == kNowDirectory) {
    kind = std::make_shared<ErrorDetail>(ErrorKind::kNotFound, ENOENT);
  }
  // Files listed by an index (use_summary="only") are listed so again by a new Loader.
  const char* remedy = file.footer_check != nullptr
                           ? ": run `pqloader index` again, or load with use_summary=True)"
                           : ": make a new Loader to read it as it is now)";
  return arrow::Status(st.code(), st.message() + " ('" + file.display + "' " + what + remedy,
                       std::move(kind));
}

namespace {

// Rows [begin, end) of `full`, sharing its buffers.
std::shared_ptr<const DecodedUnit> SliceRows(const std::shared_ptr<const DecodedUnit>& full,
                                             int64_t begin, int64_t end) {
  if (begin == 0 && end == full->num_rows) return full;
  auto out = std::make_shared<DecodedUnit>();
  out->num_rows = end - begin;
  if (!full->row_ok.empty()) {
    out->row_ok.assign(full->row_ok.begin() + begin, full->row_ok.begin() + end);
    out->skipped_rows = std::count(out->row_ok.begin(), out->row_ok.end(), 0);
  }
  if (full->row_major != nullptr) {
    auto rm = std::make_shared<RowMajorBlock>(*full->row_major);
    rm->data = arrow::SliceBuffer(rm->data, begin * rm->stride, (end - begin) * rm->stride);
    out->row_major = std::move(rm);
  }
  for (const ColumnData& c : full->columns) {
    ColumnData s;
    s.row_shape = c.row_shape;
    s.row_bytes = c.row_bytes;
    if (!c.samples.empty()) {
      s.samples.assign(c.samples.begin() + begin, c.samples.begin() + end);
    } else if (c.offsets != nullptr) {
      s.data = c.data;  // offsets index into it
      s.offsets = arrow::SliceBuffer(c.offsets, begin * 8, (end - begin + 1) * 8);
    } else if (c.data != nullptr) {
      s.data = arrow::SliceBuffer(c.data, begin * c.row_bytes, (end - begin) * c.row_bytes);
    } else if (c.deferred != nullptr) {
      s.deferred = c.deferred->Slice(begin * c.row_bytes, (end - begin) * c.row_bytes);
    }
    out->columns.push_back(std::move(s));
  }
  return out;
}

// The source of a cache hit whose columns were left in its entry file (GetDeferred), for
// when the window gather cannot read them there (EIO on a bad sector, ESTALE on NFS,
// ENOMEM, a file changed in place): the cache costs speed then, not the batch. The split
// is decoded from its source once, for all its columns, when the first read fails; the
// rows are those the entry held (it holds what the source decodes to), so the batches
// do not change. Thread-safety: the gather's threads call ReadInto concurrently.
class SourceFallback {
 public:
  using Decode = std::function<arrow::Result<std::shared_ptr<DecodedUnit>>()>;
  SourceFallback(Decode decode, std::shared_ptr<const Dataset> dataset, int64_t split)
      : decode_(std::move(decode)), dataset_(std::move(dataset)), split_(split) {}

  // Copy bytes [offset, offset + n) of column c (rows of `row_bytes`) of the split, as
  // decoded from its source, to `out`; `why`: the entry's read error. An error names
  // the entry (in `why`), the file, the row group and the column.
  arrow::Status ReadInto(size_t c, int64_t row_bytes, int64_t offset, int64_t n, uint8_t* out,
                         const arrow::Status& why) {
    const Split& split = dataset_->splits()[split_];
    const std::string context = "column '" + dataset_->specs()[c].name + "' of '" +
                                dataset_->files()[split.file].display + "', row group " +
                                std::to_string(split.row_group) + ": " + why.message() +
                                "; read from the source instead";
    const arrow::Result<std::shared_ptr<DecodedUnit>> decoded = Decoded();
    if (!decoded.ok()) {
      if (decoded.status().IsCancelled()) return decoded.status();
      return WithContext(decoded.status(), context);
    }
    const DecodedUnit& unit = **decoded;
    const ColumnData* d = c < unit.columns.size() ? &unit.columns[c] : nullptr;
    if (d == nullptr || unit.num_rows != split.num_rows || !unit.row_ok.empty() ||
        unit.row_major != nullptr || d->data == nullptr || d->offsets != nullptr ||
        !d->samples.empty() || d->row_bytes != row_bytes || offset < 0 || n < 0 ||
        offset + n > d->data->size()) {
      return MakeError(ErrorKind::kInvalidData, context,
                       ": its rows are not laid out as the cache entry's were (has the file "
                       "changed since it was listed?)");
    }
    std::memcpy(out, d->data->data() + offset, static_cast<size_t>(n));
    return arrow::Status::OK();
  }

 private:
  arrow::Result<std::shared_ptr<DecodedUnit>> Decoded() {
    MutexLock lock(mu_);  // the split's other columns wait for this decode
    if (decode_ != nullptr) {
      decoded_ = decode_();
      decode_ = nullptr;
    }
    return decoded_;
  }

  Mutex mu_;
  Decode decode_ PQ_GUARDED_BY(mu_);
  arrow::Result<std::shared_ptr<DecodedUnit>> decoded_ PQ_GUARDED_BY(mu_) =
      arrow::Status::UnknownError("not decoded");
  const std::shared_ptr<const Dataset> dataset_;
  const int64_t split_;
};

// A deferred column of a cache hit: read from its entry file, or else from the source.
class EntryOrSource : public DeferredBytes {
 public:
  // Bytes [offset, offset + entry->size()) of column c of the split.
  EntryOrSource(std::shared_ptr<const DeferredBytes> entry, std::shared_ptr<SourceFallback> source,
                size_t c, int64_t row_bytes, int64_t offset)
      : entry_(std::move(entry)), source_(std::move(source)), c_(c), row_bytes_(row_bytes),
        offset_(offset) {}
  int64_t size() const override { return entry_->size(); }
  arrow::Status ReadInto(uint8_t* out) const override {
    const arrow::Status st = entry_->ReadInto(out);
    if (st.ok()) return st;
    return source_->ReadInto(c_, row_bytes_, offset_, entry_->size(), out, st);
  }
  std::shared_ptr<const DeferredBytes> Slice(int64_t offset, int64_t length) const override {
    return std::make_shared<EntryOrSource>(entry_->Slice(offset, length), source_, c_, row_bytes_,
                                           offset_ + offset);
  }

 private:
  std::shared_ptr<const DeferredBytes> entry_;
  std::shared_ptr<SourceFallback> source_;
  size_t c_;
  int64_t row_bytes_, offset_;
};

}  // namespace

arrow::Result<std::shared_ptr<const DecodedUnit>> Loader::ProduceUnit(
    const Unit& unit, arrow::Result<std::shared_ptr<FetchedUnit>> fetched, int64_t* bytes,
    const std::shared_ptr<Work>& run_work, double now, bool deferred) {
  Work* work = run_work.get();
  std::shared_ptr<const DecodedUnit> decoded;
  bool kept = false;  // its buffers are a cache entry's (a hit, or inserted)
  if (cache_ == nullptr) {
    ARROW_ASSIGN_OR_RAISE(decoded, DecodeRows(unit, std::move(fetched), work));
  } else {
    // The cache holds whole splits, so every rank and every epoch shares one entry.
    const Split& split = dataset_->splits()[unit.split];
    // use_summary="only": a file changed since it was indexed is an error before a hit
    // too (its entries are keyed by the index's identity, so they would serve the old
    // rows). Once per file (memoised); a no-op for listed files.
    ARROW_RETURN_NOT_OK(CheckFooterUnchanged(dataset_->files()[split.file]));
    const std::string key = CacheKeyOf(unit.split);
    auto lookup = [&]() -> std::shared_ptr<const DecodedUnit> {
      const int64_t t0 = NowNs();
      std::shared_ptr<const DecodedUnit> hit = deferred ? cache_->GetDeferred(key) : cache_->Get(key);
      work->read_ns += NowNs() - t0;
      if (hit != nullptr && hit->num_rows == split.num_rows &&
          CheckUnitLayout(*hit, dataset_->specs()).ok()) {
        return hit;
      }
      return nullptr;
    };
    std::shared_ptr<const DecodedUnit> full = lookup();
    bool was_hit = false;
    // The claim to fetch this split (see SplitCache::TryClaim), held until its entry is
    // published, so that other processes wait for it rather than fetch it too.
    std::shared_ptr<void> claim;
    if (full == nullptr && fetched.ok() && *fetched != nullptr) {
      claim = (*fetched)->hold;  // taken when its fetch started
      // Held in the read-ahead since (for as long as the consumer took to come here,
      // which may be longer than the wait timeout): dated now, so that the processes
      // waiting for it do not take it over while this worker decodes and inserts it.
      if (claim != nullptr) std::static_pointer_cast<FetchClaim>(claim)->Touch();
    } else if (full == nullptr && fetched.ok() && dataset_->files()[split.file].settled) {
      // Not fetched ahead: the cache held it then (and evicted it since), or another
      // process was fetching it. Wait for that process, or claim it and fetch it now.
      // (Not for an unsettled object: never cached, so never claimed; fetched below.)
      constexpr int kMaxRounds = 4;  // each round waits at most the wait timeout
      for (int round = 0; round < kMaxRounds && full == nullptr && claim == nullptr; ++round) {
        claim = cache_->TryClaim(key, CancelFlag(run_work, &work->stopping),
                                 /*needed_now=*/true);
        if (claim != nullptr) break;
        const int64_t t0 = NowNs();
        const FetchWait waited = cache_->WaitForFetch(key, &work->stopping);
        work->read_ns += NowNs() - t0;
        if (waited == FetchWait::kCancelled) {
          return arrow::Status::Cancelled("the loader stopped while waiting for another "
                                          "process to fetch a row group");
        }
        if (waited == FetchWait::kCached) full = lookup();
        if (waited == FetchWait::kTimedOut) break;  // fetch it without a claim
      }
    }
    // The unit decoded alone, uncached, where its whole split fails (below).
    std::shared_ptr<const DecodedUnit> alone;
    if (full != nullptr) {
      work->cache_bytes_saved += split.compressed_bytes;
      ++work->cache_hits;
      kept = true;
      was_hit = true;
    } else {
      ++work->cache_misses;
      auto whole = DecodeRows(Unit{unit.split, 0, split.num_rows}, std::move(fetched), work);
      if (!whole.ok() && whole.status().IsInvalid() && unit.num_rows() < split.num_rows) {
        // A row the unit does not hold may be what failed (a transform's error, text that
        // is not UTF-8 ...): another rank's to report, or no one's (a row that
        // shard_policy="drop" leaves out), which a loader without a cache never decodes.
        // The unit alone then, as that loader reads it (a bad row of its own fails as
        // there), not cached.
        ARROW_ASSIGN_OR_RAISE(alone, DecodeRows(unit, std::shared_ptr<FetchedUnit>(), work));
      } else {
        ARROW_ASSIGN_OR_RAISE(full, std::move(whole));
        // Shuffled loaders keep entries row-major: hits are then gathered as they are
        // (unless windows are gathered whole, which reads columns).
        if (options_.plan.shuffle && !window_gather_) {
          ARROW_ASSIGN_OR_RAISE(full, RowMajor(std::move(full), work));
        }
        // An entry of a file that changed while it was read would serve no current key.
        if (SourceChanged(unit.split)) {
          cache_->Refuse(CacheRefusal::kStale, SourceOf(unit.split));
        } else if (!dataset_->files()[split.file].settled) {
          // An object modified just before it was listed: a replacement within its second
          // would share this key (size, time, footer). Not kept; the next Loader keeps it.
        } else {
          kept = cache_->Put(key, full, SourceOf(unit.split), now, &work->stopping) ==
                 CacheRefusal::kNone;
        }
      }
    }
    claim.reset();  // after the entry is published: waiters find it
    decoded = alone != nullptr ? alone : SliceRows(full, unit.row_begin, unit.row_end);
    if (was_hit && deferred) decoded = WithSourceFallback(std::move(decoded), unit, run_work);
  }
  if (options_.plan.shuffle && !window_gather_) {
    ARROW_ASSIGN_OR_RAISE(decoded, RowMajor(std::move(decoded), work));
  } else if (decoded->row_major != nullptr) {
    // An entry a shuffled loader sharing the cache wrote (row-major): this loader's own
    // misses are columns, and one batch's units must share a layout.
    ARROW_ASSIGN_OR_RAISE(decoded, WithoutRowMajor(decoded, pool_));
    kept = false;  // a copy, not the entry's buffers
  }
  if (kept && cache_->KeepsUnits() && !decoded->shared) {
    // Its buffers are the entry's: a batch handed out as a slice of them would let the
    // caller's writes into the batch change the entry, and so every later epoch.
    auto marked = std::make_shared<DecodedUnit>(*decoded);
    marked->shared = true;
    decoded = std::move(marked);
  }
  work->skipped_rows += decoded->skipped_rows;
  *bytes = decoded->ByteSize();  // what it holds: a cache hit's deferred columns, nothing
  int64_t produced = *bytes;
  for (const ColumnData& c : decoded->columns) produced += c.deferred ? c.deferred->size() : 0;
  work->bytes_decoded += produced;
  return decoded;
}

std::shared_ptr<const DecodedUnit> Loader::WithSourceFallback(
    std::shared_ptr<const DecodedUnit> hit, const Unit& unit, const std::shared_ptr<Work>& work) {
  std::shared_ptr<SourceFallback> source;
  std::shared_ptr<DecodedUnit> out;
  for (size_t c = 0; c < hit->columns.size(); ++c) {
    const ColumnData& d = hit->columns[c];
    if (d.deferred == nullptr) continue;
    if (source == nullptr) {
      const int64_t split = unit.split;
      source = std::make_shared<SourceFallback>(
          [this, split, work]() -> arrow::Result<std::shared_ptr<DecodedUnit>> {
            const Unit whole{split, 0, dataset_->splits()[split].num_rows};
            auto decoded = DecodeRows(whole, std::shared_ptr<FetchedUnit>(), work.get());
            if (!decoded.ok()) return NoteIfChanged(decoded.status(), split);
            return decoded;
          },
          dataset_, split);
      out = std::make_shared<DecodedUnit>(*hit);
    }
    out->columns[c].deferred = std::make_shared<EntryOrSource>(
        d.deferred, source, c, d.row_bytes, unit.row_begin * d.row_bytes);
  }
  if (out == nullptr) return hit;  // read whole: nothing left to read
  return out;
}

arrow::Result<std::shared_ptr<const DecodedUnit>> Loader::RowMajor(
    std::shared_ptr<const DecodedUnit> unit, Work* work) {
  if (unit->row_major != nullptr) return unit;
  const int64_t t0 = NowNs();
  auto out = WithRowMajor(unit, kRowMajorMaxRowBytes, pool_);
  work->gather_ns += NowNs() - t0;
  return out;
}

}  // namespace pqloader
