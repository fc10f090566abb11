// WindowGather: the columns of one shuffle window, gathered once into the window's
// shuffled order, so that its batches are slices of them.
//
// A shuffled epoch permutes rows within windows of consecutive units. Gathering batch by
// batch reads every column at random rows of the whole window, whose columns (100+ MB
// for a wide table) do not fit the CPU caches: nearly every value is a cache miss, or the
// units must first be made row-major (a transposition of every byte). Gathering the
// window column after column keeps one column of the window (a few MB) in the caches:
// its values are copied from the units next to each other, then read at the window's
// positions with 32-bit indices (AVX2 gathers where the CPU has them). About 70 ns per
// row of 101 columns on this project's machine, against 220 ns for the row-major path
// (tensor/batch_benchmark.cc). Columns of 4 or 8 bytes go in groups of 32 bytes a row
// (8 or 4 columns, with AVX2): the group's window is interleaved into 32-byte rows, and
// each position is one load of its row, transposed back into the columns: 10-11 ms per
// window of 4 x 64k rows x 101 columns against 19 ms column by column (the gather is
// bound by its loads; BM_WindowGather).
//
// Only fixed-width columns (numbers and fixed-size lists of them) are gathered so.
// A unit's column not read yet (a cache entry's, ColumnData::deferred) is read straight
// into the scratch (its column is not grouped).
// Memory: the gathered rows are held in chunks (consecutive positions, cut where the
// loader cuts batches: a batch is a slice of one chunk), each one block with its rows
// of every column; a chunk goes back to the pool when the last batch of it is dropped,
// so a window being consumed holds what is left of it, as the pipeline counts it. The
// gather lets go of the units as soon as every column is gathered.
// The index and the scratch come from the pool too: a window's transient arrays (MBs)
// taken from the C allocator came back as fresh pages, whose faults cost more than the
// gather in a VM (docs/performance.md).
// Thread-safety: Run() may be called by any number of threads at once; each takes the
// next task (a column, or a group of columns) not yet taken, then waits for all of
// them. Rows() and CopyRows() after Run() are OK.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <arrow/buffer.h>
#include <arrow/memory_pool.h>
#include <arrow/result.h>
#include <arrow/status.h>

#include "pqloader/tensor/batch.h"
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

/// out row i = src row index[i], for rows of `width` bytes: AVX2 gathers for 4- and 8-byte
/// rows where the CPU has them, their stores streamed where `out` is 32-byte aligned
/// (StreamFence, tensor/group_rows.h, before another thread reads `out`).
void GatherRows(int64_t width, const uint8_t* src, const int32_t* index, int64_t n, uint8_t* out);

class WindowGather {
 public:
  /// `units`: the window's units, in order; `index[i]`: the row, counted across the
  /// units (unit 0's rows first), that goes to position i of the window; `row_bytes`:
  /// per column, the bytes of one row (every column must be fixed-width: columnar data
  /// or a row-major block in each unit).
  /// Positions [first, last) of the window, all columns in one block.
  struct Chunk {
    int64_t first = 0, last = 0;
    std::shared_ptr<arrow::Buffer> block;
    std::vector<int64_t> column_offset;  ///< Of each column's rows in the block.
    /// The bytes of the block this chunk's rows take when the block is shared with
    /// others (a mixture's batch: WindowSink); 0: the whole block is the chunk's.
    int64_t bytes = 0;
  };
  /// Makes a window's chunks instead of Make: given each column's row bytes, chunks
  /// covering the window's positions [0, n) one after another.
  using ChunkMaker = std::function<arrow::Result<std::vector<Chunk>>(const std::vector<int64_t>& row_bytes)>;

  WindowGather(std::vector<std::shared_ptr<const DecodedUnit>> units,
               std::shared_ptr<arrow::Buffer> index, std::vector<int64_t> row_bytes,
               std::vector<std::vector<int64_t>> row_shapes, std::vector<Chunk> chunks,
               arrow::MemoryPool* pool);

  /// The gather of a window made of `units` whose position i holds row index[i], counted
  /// across the units (unit 0's rows first; `index`: int32 values, as many as the
  /// window's positions, each below the units' rows), its output cut into chunks ending
  /// at `chunk_ends` (increasing, the last = the positions; empty: one chunk), allocated
  /// here from `pool`, as is the scratch of each column. InvalidData if a column is not
  /// fixed-width in every unit, or its rows differ in shape between units; Invalid if
  /// an index is out of range.
  /// With `make_chunks`, the chunks are the caller's (chunk_ends is ignored); an error if
  /// they do not cover the positions one after another.
  static arrow::Result<std::shared_ptr<WindowGather>> Make(
      const std::vector<ColumnSpec>& specs, std::vector<std::shared_ptr<const DecodedUnit>> units,
      std::shared_ptr<arrow::Buffer> index, arrow::MemoryPool* pool,
      std::vector<int64_t> chunk_ends = {}, const ChunkMaker& make_chunks = nullptr);

  /// Gather columns until none is left to take, then wait until all are done. Returns
  /// the first error (also to every later caller), or Cancelled after Cancel().
  arrow::Status Run();
  /// Wake every Run() waiting, which then returns Cancelled.
  void Cancel();

  int64_t num_rows() const { return num_rows_; }
  /// Rows [first, last) of column c, in window order, as a slice of their chunk; null
  /// if they span chunks. After Run() returned OK.
  std::shared_ptr<arrow::Buffer> Rows(size_t c, int64_t first, int64_t last) const;
  /// Copy rows [first, last) of column c to `dst`. After Run() returned OK.
  void CopyRows(size_t c, int64_t first, int64_t last, uint8_t* dst) const;
  /// Bytes of all chunks.
  int64_t bytes() const;
  int64_t row_bytes(size_t c) const { return row_bytes_[c]; }
  /// The gather's tasks: columns alone or in groups (see above).
  size_t num_tasks() const { return tasks_.size(); }
  const std::vector<int64_t>& row_shape(size_t c) const { return row_shapes_[c]; }

 private:
  arrow::Status GatherColumn(size_t c);
  // Columns of one width (4 or 8 bytes) gathered together (see window_gather.cc).
  arrow::Status GatherGroup(const std::vector<size_t>& cols);
  size_t ChunkOf(int64_t row) const;

  // Both dropped once every column is gathered.
  std::vector<std::shared_ptr<const DecodedUnit>> units_;
  std::shared_ptr<arrow::Buffer> index_;
  int64_t num_rows_;
  std::vector<int64_t> row_bytes_;
  std::vector<std::vector<int64_t>> row_shapes_;
  std::vector<Chunk> chunks_;  // each column's rows written by one thread, then read
  std::vector<std::vector<size_t>> tasks_;  // columns gathered together, by one thread
  arrow::MemoryPool* pool_;  // for the scratch and columns read on demand (wide rows)
  std::atomic<size_t> next_{0};
  Mutex mu_;
  std::condition_variable cv_;
  size_t done_ PQ_GUARDED_BY(mu_) = 0;
  arrow::Status status_ PQ_GUARDED_BY(mu_);
  bool cancelled_ PQ_GUARDED_BY(mu_) = false;
};

/// Where a loader's window gathers (or batch assemblies) write their rows when it is a
/// mixture's source (mix/mix_stream.h): the chunks of the run's epoch positions
/// [first, last) (a window, or a batch), pieces of blocks the sink shares with other
/// loaders. Thread-safety: Chunks may be called by any worker.
class WindowSink {
 public:
  virtual ~WindowSink() = default;
  virtual arrow::Result<std::vector<WindowGather::Chunk>> Chunks(
      int64_t first, int64_t last, const std::vector<int64_t>& row_bytes) = 0;
};

/// Rows [first, last) of the epoch's stream as a batch whose columns are slices of
/// `windows` (consecutive windows; window k starts at stream position starts[k]), or
/// copies of their pieces when the batch spans several.
arrow::Result<std::shared_ptr<Batch>> WindowBatch(
    const std::vector<ColumnSpec>& specs, const std::vector<std::shared_ptr<WindowGather>>& windows,
    const std::vector<int64_t>& starts, int64_t first, int64_t last, arrow::MemoryPool* pool);

/// The windows of one epoch run that batches share: window w's gather is made by the
/// first batch of the run that reads w (it has w's units) and used by every batch that
/// reads w, then dropped after the last one. Thread-safety: all methods may be called
/// concurrently.
class WindowStore {
 public:
  /// `uses[w]`: how many batches of the run read window w.
  explicit WindowStore(std::map<int64_t, int64_t> uses) : uses_(std::move(uses)) {}

  /// Window w's gather, made by `make` (called once, by the batch that has the units)
  /// or, for other batches, made by an earlier one: waits until it exists. Cancelled
  /// after Cancel().
  arrow::Result<std::shared_ptr<WindowGather>> Get(
      int64_t w, const std::function<arrow::Result<std::shared_ptr<WindowGather>>()>& make);
  /// A batch has taken what it needs of window w.
  void Release(int64_t w);
  /// Wake every waiting Get() and Run() (the run is being shut down).
  void Cancel();

 private:
  Mutex mu_;
  std::condition_variable cv_;
  std::map<int64_t, int64_t> uses_ PQ_GUARDED_BY(mu_);
  std::map<int64_t, arrow::Result<std::shared_ptr<WindowGather>>> made_ PQ_GUARDED_BY(mu_);
  bool cancelled_ PQ_GUARDED_BY(mu_) = false;
};

}  // namespace pqloader
