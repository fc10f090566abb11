#include "pqloader/tensor/window_gather.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "pqloader/error.h"
#include "pqloader/tensor/group_rows.h"
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

namespace {

// out[i] = src[index[i]] for values of T; AVX2 gathers where the CPU has them.
template <typename T>
void GatherScalar(const T* src, const int32_t* index, int64_t n, T* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = src[index[i]];
}

// 32 bytes of gathered values to `out`: streamed (non-temporal) where `out` is 32-byte
// aligned, as every chunk's column is (the batch is not read back here, and a streamed
// store does not first read the line it fills); the caller fences (StreamFence).
__attribute__((target("avx2"))) inline void Store32(bool stream, void* out, __m256i v) {
  if (stream) {
    _mm256_stream_si256(static_cast<__m256i*>(out), v);
  } else {
    _mm256_storeu_si256(static_cast<__m256i*>(out), v);
  }
}

__attribute__((target("avx2"))) void Gather32Avx2(const uint32_t* src, const int32_t* index,
                                                  int64_t n, uint32_t* out) {
  const bool stream = reinterpret_cast<uintptr_t>(out) % 32 == 0;
  int64_t i = 0;
  for (const int64_t end = n - n % 8; i < end; i += 8) {
    const __m256i ix = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(index + i));
    Store32(stream, out + i, _mm256_i32gather_epi32(reinterpret_cast<const int*>(src), ix, 4));
  }
  for (; i < n; ++i) out[i] = src[index[i]];
}

__attribute__((target("avx2"))) void Gather64Avx2(const uint64_t* src, const int32_t* index,
                                                  int64_t n, uint64_t* out) {
  const bool stream = reinterpret_cast<uintptr_t>(out) % 32 == 0;
  int64_t i = 0;
  for (const int64_t end = n - n % 4; i < end; i += 4) {
    const __m128i ix = _mm_loadu_si128(reinterpret_cast<const __m128i*>(index + i));
    Store32(stream, out + i,
            _mm256_i32gather_epi64(reinterpret_cast<const long long*>(src), ix, 8));
  }
  for (; i < n; ++i) out[i] = src[index[i]];
}

int64_t AlignUp(int64_t bytes) { return (bytes + 63) / 64 * 64; }

// Columns of rows up to this wide are gathered through a contiguous copy of the
// window's column, of at most kMaxScratchBytes (per thread).
constexpr int64_t kNarrowBytes = 16;
constexpr int64_t kMaxScratchBytes = int64_t{16} << 20;

// out row i = src row index[i], rows of `width` bytes.
void GatherRowsOf(int64_t width, const uint8_t* src, const int32_t* index, int64_t n,
                  uint8_t* out) {
  switch (width) {
    case 1: return GatherScalar(src, index, n, out);
    case 2:
      return GatherScalar(reinterpret_cast<const uint16_t*>(src), index, n,
                          reinterpret_cast<uint16_t*>(out));
    case 4:
      if (HasAvx2()) {
        return Gather32Avx2(reinterpret_cast<const uint32_t*>(src), index, n,
                            reinterpret_cast<uint32_t*>(out));
      }
      return GatherScalar(reinterpret_cast<const uint32_t*>(src), index, n,
                          reinterpret_cast<uint32_t*>(out));
    case 8:
      if (HasAvx2()) {
        return Gather64Avx2(reinterpret_cast<const uint64_t*>(src), index, n,
                            reinterpret_cast<uint64_t*>(out));
      }
      return GatherScalar(reinterpret_cast<const uint64_t*>(src), index, n,
                          reinterpret_cast<uint64_t*>(out));
    default:
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(out + i * width, src + static_cast<int64_t>(index[i]) * width,
                    static_cast<size_t>(width));
      }
  }
}

}  // namespace

void GatherRows(int64_t width, const uint8_t* src, const int32_t* index, int64_t n, uint8_t* out) {
  GatherRowsOf(width, src, index, n, out);  // (the window gathers call it in this file)
}

namespace {

// The window's values of column c, next to each other (unit after unit), in `scratch`;
// a unit whose column is in its row-major block is copied out of it, one not read yet
// (a cache entry's) is read straight into it.
arrow::Status ConcatColumn(const std::vector<std::shared_ptr<const DecodedUnit>>& units, size_t c,
                           int64_t width, uint8_t* scratch) {
  int64_t at = 0;
  for (const auto& unit : units) {
    const ColumnData& d = unit->columns[c];
    const int64_t bytes = unit->num_rows * width;
    if (d.data != nullptr) {
      std::memcpy(scratch + at, d.data->data(), static_cast<size_t>(bytes));
    } else if (d.deferred != nullptr) {
      ARROW_RETURN_NOT_OK(d.deferred->ReadInto(scratch + at));
    } else {
      const RowMajorBlock& rm = *unit->row_major;
      const uint8_t* src = rm.data->data() + rm.offset[c];
      for (int64_t r = 0; r < unit->num_rows; ++r) {
        std::memcpy(scratch + at + r * width, src + r * rm.stride, static_cast<size_t>(width));
      }
    }
    at += bytes;
  }
  return arrow::Status::OK();
}

// The tasks of a window's gather: groups of kGroupBytes / width columns of width 4 or 8
// whose every unit holds them columnar in memory, in the order of
// their first column; every other column alone.
std::vector<std::vector<size_t>> GatherTasks(
    const std::vector<std::shared_ptr<const DecodedUnit>>& units,
    const std::vector<int64_t>& row_bytes, int64_t rows) {
  std::vector<std::vector<size_t>> tasks;
  std::vector<size_t> open4, open8;  // a group being filled, per width
  for (size_t c = 0; c < row_bytes.size(); ++c) {
    const int64_t width = row_bytes[c];
    bool group = HasAvx2() && (width == 4 || width == 8) && rows * kGroupBytes <= kMaxScratchBytes;
    // In memory in every unit: a column not read yet (a cache hit's) is read straight
    // into the per-column scratch, one copy less than read, then interleaved.
    for (const auto& unit : units) group = group && unit->columns[c].data != nullptr;
    if (!group) {
      tasks.push_back({c});
      continue;
    }
    std::vector<size_t>& open = width == 4 ? open4 : open8;
    if (open.empty()) {
      tasks.emplace_back();  // its place in the order; filled when the group is full
      open.push_back(tasks.size() - 1);
    }
    open.push_back(c);
    if (static_cast<int64_t>(open.size()) - 1 == kGroupBytes / width) {
      tasks[open[0]].assign(open.begin() + 1, open.end());
      open.clear();
    }
  }
  for (std::vector<size_t>* open : {&open4, &open8}) {  // an unfilled group: one by one
    if (open->empty()) continue;
    tasks[(*open)[0]] = {(*open)[1]};
    for (size_t j = 2; j < open->size(); ++j) tasks.push_back({(*open)[j]});
  }
  return tasks;
}

}  // namespace

arrow::Result<std::shared_ptr<WindowGather>> WindowGather::Make(
    const std::vector<ColumnSpec>& specs, std::vector<std::shared_ptr<const DecodedUnit>> units,
    std::shared_ptr<arrow::Buffer> index, arrow::MemoryPool* pool,
    std::vector<int64_t> chunk_ends, const ChunkMaker& make_chunks) {
  if (index == nullptr || index->size() % static_cast<int64_t>(sizeof(int32_t)) != 0) {
    return arrow::Status::Invalid("a window's index must be int32 values");
  }
  const int64_t n = index->size() / static_cast<int64_t>(sizeof(int32_t));
  if (chunk_ends.empty() || chunk_ends.back() != n ||
      !std::is_sorted(chunk_ends.begin(), chunk_ends.end()) || chunk_ends.front() <= 0) {
    if (!chunk_ends.empty() && n > 0) {
      return arrow::Status::Invalid("window chunks must end at increasing positions, the last at ", n);
    }
    chunk_ends = {n};
  }
  std::vector<int64_t> unit_first(units.size() + 1, 0);
  for (size_t u = 0; u < units.size(); ++u) {
    const DecodedUnit& unit = *units[u];
    if (!unit.row_ok.empty() || unit.columns.size() != specs.size()) {
      return arrow::Status::Invalid("a unit of a shuffle window cannot be gathered whole");
    }
    unit_first[u + 1] = unit_first[u] + unit.num_rows;
  }
  if (unit_first.back() > std::numeric_limits<int32_t>::max()) {
    return arrow::Status::Invalid("a shuffle window of more than 2^31 rows");
  }
  std::vector<int64_t> row_bytes(specs.size(), 0);
  std::vector<std::vector<int64_t>> row_shapes(specs.size());
  for (size_t c = 0; c < specs.size(); ++c) {
    bool first = true;
    for (const auto& unit : units) {
      const ColumnData& d = unit->columns[c];
      if (d.offsets != nullptr) {
        return MakeError(ErrorKind::kInvalidData, "column '", specs[c].name,
                         "': rows of different lengths; a list column must have one length "
                         "in every row, or be batched ragged or padded (lists=)");
      }
      const bool columnar =
          (d.data != nullptr && d.data->size() >= unit->num_rows * d.row_bytes) ||
          (d.deferred != nullptr && d.deferred->size() == unit->num_rows * d.row_bytes);
      const bool in_block = unit->row_major != nullptr && unit->row_major->offset[c] >= 0;
      const bool empty_rows = d.row_bytes == 0;  // e.g. a list column of empty lists: (n, 0)
      if (!d.samples.empty() || d.row_bytes < 0 || (!columnar && !in_block && !empty_rows)) {
        return arrow::Status::Invalid("column '", specs[c].name,
                                      "' cannot be gathered whole in a shuffle window");
      }
      if (first) {
        row_bytes[c] = d.row_bytes;
        row_shapes[c] = d.row_shape;
        first = false;
      } else if (d.row_shape != row_shapes[c]) {
        return MakeError(ErrorKind::kInvalidData, "column '", specs[c].name,
                         "': rows of one shuffle window have different shapes, ",
                         ShapeToString(row_shapes[c]), " and ", ShapeToString(d.row_shape),
                         "; a list column must have one length in every row, or be batched "
                         "ragged or padded (lists=)");
      }
    }
  }
  {
    // Out-of-range indices would read outside the scratch: refused, in one branch-free
    // pass (unsigned: a negative one is huge).
    const auto* ix = index->data_as<uint32_t>();
    uint32_t max = 0;
    for (int64_t i = 0; i < n; ++i) max = std::max(max, ix[i]);
    if (n > 0 && static_cast<int64_t>(max) >= unit_first.back()) {
      return arrow::Status::Invalid("a shuffle window's row index ", static_cast<int32_t>(max),
                                    " is out of its ", unit_first.back(), " rows");
    }
  }
  if (make_chunks != nullptr) {
    ARROW_ASSIGN_OR_RAISE(std::vector<Chunk> chunks, make_chunks(row_bytes));
    int64_t at = 0;
    for (const Chunk& chunk : chunks) {
      if (chunk.first != at || chunk.last <= chunk.first || chunk.block == nullptr ||
          chunk.column_offset.size() != row_bytes.size()) {
        return arrow::Status::Invalid("a window's chunks must cover its positions one after another");
      }
      at = chunk.last;
    }
    if (at != n) return arrow::Status::Invalid("a window's chunks end at ", at, ", not at ", n);
    return std::make_shared<WindowGather>(std::move(units), std::move(index), std::move(row_bytes),
                                          std::move(row_shapes), std::move(chunks), pool);
  }
  // One block per chunk, holding its rows of every column (each 64-byte aligned).
  std::vector<Chunk> chunks(chunk_ends.size());
  for (size_t k = 0; k < chunks.size(); ++k) {
    Chunk& chunk = chunks[k];
    chunk.first = k == 0 ? 0 : chunk_ends[k - 1];
    chunk.last = chunk_ends[k];
    int64_t bytes = 0;
    for (int64_t width : row_bytes) {
      chunk.column_offset.push_back(bytes);
      bytes += AlignUp((chunk.last - chunk.first) * width);
    }
    ARROW_ASSIGN_OR_RAISE(chunk.block, arrow::AllocateBuffer(bytes, pool));
  }
  return std::make_shared<WindowGather>(std::move(units), std::move(index), std::move(row_bytes),
                                        std::move(row_shapes), std::move(chunks), pool);
}

WindowGather::WindowGather(std::vector<std::shared_ptr<const DecodedUnit>> units,
                           std::shared_ptr<arrow::Buffer> index, std::vector<int64_t> row_bytes,
                           std::vector<std::vector<int64_t>> row_shapes, std::vector<Chunk> chunks,
                           arrow::MemoryPool* pool)
    : units_(std::move(units)), index_(std::move(index)),
      num_rows_(index_->size() / static_cast<int64_t>(sizeof(int32_t))),
      row_bytes_(std::move(row_bytes)),
      row_shapes_(std::move(row_shapes)), chunks_(std::move(chunks)), pool_(pool) {
  int64_t rows = 0;
  for (const auto& unit : units_) rows += unit->num_rows;
  tasks_ = GatherTasks(units_, row_bytes_, rows);
}

size_t WindowGather::ChunkOf(int64_t row) const {
  size_t lo = 0, hi = chunks_.size() - 1;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (chunks_[mid].last <= row) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

std::shared_ptr<arrow::Buffer> WindowGather::Rows(size_t c, int64_t first, int64_t last) const {
  const Chunk& chunk = chunks_[ChunkOf(first)];
  if (last > chunk.last) return nullptr;
  const int64_t width = row_bytes_[c];
  return arrow::SliceBuffer(chunk.block, chunk.column_offset[c] + (first - chunk.first) * width,
                            (last - first) * width);
}

void WindowGather::CopyRows(size_t c, int64_t first, int64_t last, uint8_t* dst) const {
  const int64_t width = row_bytes_[c];
  for (size_t k = ChunkOf(first); first < last; ++k) {
    const Chunk& chunk = chunks_[k];
    const int64_t end = std::min(last, chunk.last);
    std::memcpy(dst, chunk.block->data() + chunk.column_offset[c] + (first - chunk.first) * width,
                static_cast<size_t>((end - first) * width));
    dst += (end - first) * width;
    first = end;
  }
}

arrow::Status WindowGather::GatherColumn(size_t c) {
  const int64_t width = row_bytes_[c];
  if (width == 0) return arrow::Status::OK();  // rows without bytes: nothing to copy
  std::vector<int64_t> unit_first(units_.size() + 1, 0);
  for (size_t u = 0; u < units_.size(); ++u) unit_first[u + 1] = unit_first[u] + units_[u]->num_rows;
  const int64_t rows = unit_first.back();
  auto dst_of = [&](const Chunk& chunk) {
    return chunk.block->mutable_data() + chunk.column_offset[c];
  };
  const auto* index = index_->data_as<int32_t>();
  if (width <= kNarrowBytes && rows * width <= kMaxScratchBytes) {
    // Narrow values: the window's column next to each other, then one gather. The
    // scratch is the pool's block the previous column freed, warm in the caches.
    ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::Buffer> scratch,
                          arrow::AllocateBuffer(rows * width, pool_));
    ARROW_RETURN_NOT_OK(ConcatColumn(units_, c, width, scratch->mutable_data()));
    for (const Chunk& chunk : chunks_) {
      GatherRowsOf(width, scratch->data(), index + chunk.first, chunk.last - chunk.first,
                   dst_of(chunk));
    }
    StreamFence();  // the AVX2 gathers' streamed stores, before Run() counts the task done
  } else {
    // Wide rows (each a memcpy of its own) or a huge window: straight from the units
    // (a column not read yet is read into a buffer of its own first).
    std::vector<const uint8_t*> base(units_.size());
    std::vector<int64_t> stride(units_.size(), width);
    std::vector<std::shared_ptr<arrow::Buffer>> read(units_.size());
    for (size_t u = 0; u < units_.size(); ++u) {
      const DecodedUnit& unit = *units_[u];
      const ColumnData& d = unit.columns[c];
      if (d.data != nullptr) {
        base[u] = d.data->data();
      } else if (d.deferred != nullptr) {
        ARROW_ASSIGN_OR_RAISE(read[u], arrow::AllocateBuffer(unit.num_rows * width, pool_));
        ARROW_RETURN_NOT_OK(d.deferred->ReadInto(read[u]->mutable_data()));
        base[u] = read[u]->data();
      } else {
        base[u] = unit.row_major->data->data() + unit.row_major->offset[c];
        stride[u] = unit.row_major->stride;
      }
    }
    for (const Chunk& chunk : chunks_) {
      uint8_t* dst = dst_of(chunk);
      for (int64_t i = chunk.first; i < chunk.last; ++i) {
        const int64_t at = index[i];
        const size_t u = static_cast<size_t>(
            std::upper_bound(unit_first.begin(), unit_first.end(), at) - unit_first.begin() - 1);
        const int64_t r = at - unit_first[u];
        std::memcpy(dst + (i - chunk.first) * width, base[u] + r * stride[u],
                    static_cast<size_t>(width));
      }
    }
  }
  return arrow::Status::OK();
}

arrow::Status WindowGather::GatherGroup(const std::vector<size_t>& cols) {
  const int64_t width = row_bytes_[cols[0]];
  const auto k = static_cast<int64_t>(cols.size());
  int64_t rows = 0;
  for (const auto& unit : units_) rows += unit->num_rows;
  // The window's rows of the group's columns, interleaved (from the pool: the block the
  // previous group freed, warm in the caches).
  ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::Buffer> staging,
                        arrow::AllocateBuffer(rows * kGroupBytes, pool_));
  int64_t at = 0;
  for (const auto& unit : units_) {
    std::vector<const uint8_t*> src(k);
    for (int64_t j = 0; j < k; ++j) src[j] = unit->columns[cols[j]].data->data();
    uint8_t* out = staging->mutable_data() + at * kGroupBytes;
    if (width == 4) {
      InterleaveGroup<4>(src.data(), unit->num_rows, out);
    } else {
      InterleaveGroup<8>(src.data(), unit->num_rows, out);
    }
    at += unit->num_rows;
  }
  const auto* index = index_->data_as<int32_t>();
  std::vector<uint8_t*> dst(k);
  for (const Chunk& chunk : chunks_) {
    for (int64_t j = 0; j < k; ++j) dst[j] = chunk.block->mutable_data() + chunk.column_offset[cols[j]];
    const int32_t* at_index = index + chunk.first;
    // The prefetch runs on into the next chunk's positions.
    if (width == 4) {
      GatherGroupRows<4>(staging->data(), at_index, chunk.last - chunk.first, dst.data(),
                         num_rows_ - chunk.first);
    } else {
      GatherGroupRows<8>(staging->data(), at_index, chunk.last - chunk.first, dst.data(),
                         num_rows_ - chunk.first);
    }
  }
  StreamFence();  // before Run() counts the task done (and a batch may read it)
  return arrow::Status::OK();
}

arrow::Status WindowGather::Run() {
  const size_t tasks = tasks_.size();
  for (size_t t = next_++; t < tasks; t = next_++) {
    {
      MutexLock lock(mu_);
      if (cancelled_) break;
    }
    arrow::Status st =
        tasks_[t].size() == 1 ? GatherColumn(tasks_[t][0]) : GatherGroup(tasks_[t]);
    MutexLock lock(mu_);
    if (!st.ok() && status_.ok()) status_ = st;
    if (++done_ == tasks) {
      units_.clear();  // every column gathered: the units' memory can go
      index_.reset();
      cv_.notify_all();
    }
  }
  MutexLock lock(mu_);
  while (!cancelled_ && done_ < tasks) lock.Wait(cv_);
  if (!status_.ok()) return status_;
  if (done_ < tasks) return arrow::Status::Cancelled("the epoch was stopped");
  return arrow::Status::OK();
}

void WindowGather::Cancel() {
  MutexLock lock(mu_);
  cancelled_ = true;
  cv_.notify_all();
}

int64_t WindowGather::bytes() const {
  int64_t total = 0;
  for (const Chunk& chunk : chunks_) total += chunk.bytes > 0 ? chunk.bytes : chunk.block->size();
  return total;
}

arrow::Result<std::shared_ptr<WindowGather>> WindowStore::Get(
    int64_t w, const std::function<arrow::Result<std::shared_ptr<WindowGather>>()>& make) {
  std::shared_ptr<WindowGather> gather;
  {
    MutexLock lock(mu_);
    if (make != nullptr && made_.count(w) == 0) {
      lock.Unlock();
      auto made = make();
      lock.Lock();
      made_.emplace(w, made);
      cv_.notify_all();
    }
    while (!cancelled_ && made_.count(w) == 0) lock.Wait(cv_);
    if (cancelled_) return arrow::Status::Cancelled("the epoch was stopped");
    const auto& made = made_.at(w);  // copied, not moved: other batches take it too
    if (!made.ok()) return made.status();
    gather = *made;
  }
  ARROW_RETURN_NOT_OK(gather->Run());
  return gather;
}

arrow::Result<std::shared_ptr<Batch>> WindowBatch(
    const std::vector<ColumnSpec>& specs, const std::vector<std::shared_ptr<WindowGather>>& windows,
    const std::vector<int64_t>& starts, int64_t first, int64_t last, arrow::MemoryPool* pool) {
  auto batch = std::make_shared<Batch>();
  const int64_t n = last - first;
  batch->num_rows = n;
  batch->columns.resize(specs.size());
  std::shared_ptr<arrow::Buffer> block;
  int64_t block_bytes = 0;
  int64_t at = 0;
  for (size_t c = 0; c < specs.size(); ++c) {
    BatchColumn& out = batch->columns[c];
    out.kind = specs[c].kind;
    out.dtype = specs[c].dtype;
    out.shape = {n};
    const auto& shape = windows[0]->row_shape(c);
    out.shape.insert(out.shape.end(), shape.begin(), shape.end());
    const int64_t width = windows[0]->row_bytes(c);
    if (windows.size() == 1) {
      // Rows of one chunk: a slice of it. (The loader cuts chunks at batch boundaries.)
      out.data = windows[0]->Rows(c, first - starts[0], last - starts[0]);
      if (out.data != nullptr) continue;
    }
    if (block == nullptr) {  // rows of several windows or chunks: copied into one block
      for (size_t j = 0; j < specs.size(); ++j) block_bytes += AlignUp(n * windows[0]->row_bytes(j));
      ARROW_ASSIGN_OR_RAISE(block, arrow::AllocateBuffer(block_bytes, pool));
      batch->owned_bytes = block_bytes;
    }
    uint8_t* dst = block->mutable_data() + at;
    for (size_t k = 0; k < windows.size(); ++k) {
      if (windows[k]->row_shape(c) != shape) {
        return MakeError(ErrorKind::kInvalidData, "column '", specs[c].name,
                         "': rows of one batch have different shapes, ", ShapeToString(shape),
                         " and ", ShapeToString(windows[k]->row_shape(c)),
                         "; a list column must have one length in every row, or be batched "
                         "ragged or padded (lists=)");
      }
      const int64_t begin = std::max(first, starts[k]);
      const int64_t end = std::min(last, starts[k] + windows[k]->num_rows());
      if (end <= begin) continue;
      windows[k]->CopyRows(c, begin - starts[k], end - starts[k], dst + (begin - first) * width);
    }
    out.data = arrow::SliceBuffer(block, at, n * width);
    at += AlignUp(n * width);
  }
  return batch;
}

void WindowStore::Release(int64_t w) {
  MutexLock lock(mu_);
  auto it = uses_.find(w);
  if (it != uses_.end() && --it->second <= 0) {
    uses_.erase(it);
    made_.erase(w);
  }
}

void WindowStore::Cancel() {
  std::vector<std::shared_ptr<WindowGather>> running;
  {
    MutexLock lock(mu_);
    cancelled_ = true;
    for (auto& [w, g] : made_) {
      if (g.ok()) running.push_back(*g);
    }
    cv_.notify_all();
  }
  for (auto& g : running) g->Cancel();
}

}  // namespace pqloader
