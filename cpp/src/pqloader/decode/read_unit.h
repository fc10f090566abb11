// Reading one unit (a row range of one row group) into tensor columns, in two steps:
// FetchUnit opens the file and requests the coalesced byte ranges of the row group's
// selected column chunks (Parquet pre-buffering) without waiting; ReadUnit waits for
// them and decodes. Fetching ahead of decoding keeps many requests in flight.
//
// Thread-safety: FetchUnit and ReadUnit may be called concurrently for different
// units; each fetch has its own reader over the dataset's immutable metadata.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <arrow/io/interfaces.h>
#include <arrow/memory_pool.h>
#include <arrow/result.h>
#include <parquet/arrow/reader.h>

#include "pqloader/dataset/dataset.h"
#include "pqloader/decode/convert.h"
#include "pqloader/plan/epoch_plan.h"

namespace pqloader {

struct ReadOptions {
  /// Per output column (specs order): what replaces nulls.
  std::vector<NullFill> fills;
  /// Verify page CRC checksums where the writer stored them. Default: false.
  bool verify_checksums = false;
  /// Per output column: whether list rows may differ in length (transforms follow).
  std::vector<bool> allow_ragged;
  /// A filter selected the splits' rows from the listed version of each file: a local
  /// file changed since it was listed is refused rather than read with that selection
  /// (its rows would not be the ones the filter kept).
  bool filtered = false;
};

/// Whether column `c`'s filled null lists take their length from their row group's first
/// list that is not null (ReadUnit): a filled list column of one length per row whose
/// length the footers do not tell (NullFill::list_length; Polars writes no level
/// histograms). Part of a cache entry's key (such entries were rows of 0 before).
bool FillLengthFromRowGroup(const ColumnSpec& spec, const ReadOptions& options, size_t c);

/// Set `out->fills` for the columns of `dataset`: the per-column fill or the default
/// one; a column with a null mask gets zeros (or "") where it has no fill. `fills` must
/// name selected columns (kColumnNotFound).
arrow::Status SetUpFills(const Dataset& dataset, const NullFill& default_fill,
                         const std::map<std::string, NullFill>& fills, ReadOptions* out);

/// Check that each fill of `options` suits its column: str/bytes for strings and bytes
/// (lists of them too), a number for numbers; a TypeError naming the column otherwise.
/// `fills` are the per-column fills the user gave (to name them in the message).
arrow::Status CheckFills(const Dataset& dataset, const std::map<std::string, NullFill>& fills,
                         const ReadOptions& options);

/// A unit whose column chunks are being fetched.
struct FetchedUnit {
  /// Reader with the row group's selected column chunks pre-buffered; null when only
  /// partition columns are selected.
  std::unique_ptr<parquet::arrow::FileReader> reader;
  /// Kept alive as long as the fetched unit (the loader keeps its cache claim here: a
  /// FetchClaim, nothing else, which ProduceUnit casts back to refresh it).
  std::shared_ptr<void> hold;
  /// A local file's size and modification time (ns) when it was opened, -1 otherwise:
  /// WaitForBytes refuses the unit if they moved while its bytes were read.
  int64_t opened_size = -1;
  int64_t opened_mtime_ns = 0;
  /// A descriptor of the opened local file of our own (a dup: the reader closes its own
  /// when it ends, unseen by ThreadSanitizer, which then took a reused number for a race),
  /// stat'ed again then; -1 otherwise. Closed with the fetched unit.
  int stat_fd = -1;

  FetchedUnit() = default;
  FetchedUnit(const FetchedUnit&) = delete;
  FetchedUnit& operator=(const FetchedUnit&) = delete;
  ~FetchedUnit();
};

/// Start fetching the selected column chunks of `unit`'s row group on `io`'s executor,
/// without waiting for them.
arrow::Result<std::shared_ptr<FetchedUnit>> FetchUnit(const Dataset& dataset, const Unit& unit,
                                                      const ReadOptions& options,
                                                      arrow::MemoryPool* pool,
                                                      const arrow::io::IOContext& io);

/// Wait until `fetched`'s bytes have arrived. A failure is the storage's: ErrorKind::kIO,
/// naming the file and row group. Cancelled, without waiting for the reads to end, once
/// `stop` (if given) is set: a run being shut down leaves requests that may be retrying
/// against a failed endpoint to finish unread.
arrow::Status WaitForBytes(const Dataset& dataset, const Unit& unit, FetchedUnit* fetched,
                           const std::atomic<bool>* stop = nullptr);

/// Read rows [unit.row_begin, unit.row_end) of split `unit.split` from `fetched` (waiting
/// for its bytes) and convert them. Errors name the file, the row group and, where
/// known, the column; a storage failure is ErrorKind::kIO, bad bytes kInvalidData.
arrow::Result<std::shared_ptr<DecodedUnit>> ReadUnit(const Dataset& dataset,
                                                           const Unit& unit,
                                                           const ReadOptions& options,
                                                           arrow::MemoryPool* pool,
                                                           FetchedUnit* fetched);

}  // namespace pqloader
