// Loader: its batches, for the pipeline's batch tasks (see loader.h) — assembled from
// decoded units, transformed, packed, gathered from whole shuffle windows, or written
// into a mixture's sink.
#include "pqloader/loader.h"

#include <algorithm>
#include <chrono>
#include <cstring>
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
#include "pqloader/util/thread_annotations.h"

namespace pqloader {

namespace {

// Alignment of a batch column that transforms write into (as AssembleBatch's blocks).
constexpr int64_t kSampleBlockAlignment = 64;

// What a shuffle window's gathered rows are cut into (see WindowGather): about this
// many bytes of whole batches.
constexpr int64_t kWindowChunkBytes = int64_t{16} << 20;

}  // namespace

arrow::Result<std::shared_ptr<Batch>> Loader::MakeBatch(
    const RunLayout& layout, int64_t b,
    const std::vector<std::shared_ptr<const DecodedUnit>>& units, int64_t* bytes,
    Work* counters) {
  const RowOrder& order = *layout.order;
  const int64_t epoch = layout.epoch;
  const auto [first, last] = layout.Positions(b);
  const int64_t lo = layout.UnitsOf(b).first;
  auto where = [&] { return "batch " + std::to_string(b) + " of epoch " + std::to_string(epoch); };
  if (layout.windows != nullptr) {
    const int64_t t0 = NowNs();
    auto batch = WindowedBatch(*layout.plan, *layout.windows, layout.WindowsMadeBy(b), first,
                               last, units, lo, layout.sink.get());
    if (batch.ok() && stack_.has_value() && layout.sink == nullptr) {
      batch = stack_->Apply(std::move(*batch), pool_);
    }
    counters->gather_ns += NowNs() - t0;
    if (!batch.ok()) return WithContext(batch.status(), where());
    (*batch)->epoch = epoch;
    (*batch)->index = b;
    // A sink's batch holds its rows in the sink's blocks: counted as if its own.
    *bytes = layout.sink != nullptr ? (last - first) * FixedRowBytes(dataset_->specs())
                                    : (*batch)->ByteSize();
    return batch;
  }
  std::vector<RowRef> rows;
  rows.reserve(last - first);
  order.Resolve(first, last, &rows);
  std::vector<std::vector<SampleTensor>> samples;
  // Into a mixture's batches: the chunks of these positions in its blocks, where the
  // transforms write their samples too.
  std::vector<WindowGather::Chunk> chunks;
  const bool into_sink = layout.sink != nullptr && layout.pack == nullptr;
  if (into_sink) {
    auto got = layout.sink->Chunks(first, last, FixedOutputRowBytes());
    if (!got.ok()) return WithContext(got.status(), where());
    chunks = std::move(got).ValueUnsafe();
  }
  int64_t t0 = NowNs();
  if (!transforms_.empty()) {
    auto st = TransformRows(order, layout.seed, epoch, units, lo, &rows, &samples, counters,
                            into_sink ? &chunks : nullptr);
    const int64_t t1 = NowNs();
    counters->transform_ns += t1 - t0;
    t0 = t1;
    ARROW_RETURN_NOT_OK(st);
  }
  arrow::Result<std::shared_ptr<Batch>> batch;
  if (layout.pack != nullptr) {
    batch = PackBatch(dataset_->specs(), options_.pack, *layout.pack, b * layout.batch_size,
                      std::min((b + 1) * layout.batch_size, layout.num_blocks), units, lo, rows,
                      pack_companions_, pool_);
  } else if (into_sink) {
    batch = BatchIntoSink(chunks, units, lo, rows, samples);
  } else {
    batch = AssembleBatch(dataset_->specs(), units, lo, rows, samples, pool_,
                          transforms_.collate(), transforms_.signatures());
    if (batch.ok() && !transforms_.empty()) batch = SplitParts(std::move(*batch));
    if (batch.ok() && stack_.has_value()) batch = stack_->Apply(std::move(*batch), pool_);
  }
  counters->gather_ns += NowNs() - t0;
  if (!batch.ok()) {
    std::string files;
    for (size_t i = 0; i < units.size(); ++i) {
      const Split& s = dataset_->splits()[order.units()[lo + i].split];
      files += (i ? ", '" : "'") + dataset_->files()[s.file].display + "' row group " +
               std::to_string(s.row_group);
    }
    return WithContext(batch.status(), where() + " (from " + files + ")");
  }
  (*batch)->epoch = epoch;
  (*batch)->index = b;
  *bytes = (*batch)->owned_bytes;
  return batch;
}

arrow::Status Loader::TransformRows(const RowOrder& order, uint64_t seed, int64_t epoch,
                                    const std::vector<std::shared_ptr<const DecodedUnit>>& units,
                                    int64_t unit_base, std::vector<RowRef>* rows,
                                    std::vector<std::vector<SampleTensor>>* samples,
                                    Work* work, const std::vector<WindowGather::Chunk>* into) {
  const auto& specs = dataset_->specs();
  samples->assign(specs.size(), {});
  std::vector<RowRef> kept;
  kept.reserve(rows->size());
  SampleContext ctx;
  ctx.seed = seed;
  ctx.epoch = epoch;
  // Columns whose outputs have one size known ahead are written straight into the
  // batch's column, row k at k * bytes (AssembleBatch then takes the block as it is).
  // Into a mixture's chunks: each row's slot is at its place in its chunk, under the
  // column's values output (`column_at`).
  std::vector<std::shared_ptr<arrow::Buffer>> blocks(specs.size());
  std::vector<int64_t> slot_bytes(specs.size(), 0);
  std::vector<int> column_at(specs.size(), -1);
  if (into != nullptr) {
    const auto& outputs = transforms_.output_sources();
    const auto& fixed = transforms_.fixed_outputs();
    for (size_t j = 0; j < outputs.size(); ++j) {
      const auto [col, part] = outputs[j];
      if (part == TransformPlan::Part::kValues && fixed[j].has_value() &&
          fixed[j]->bytes() == transforms_.SlotBytes(col)) {
        column_at[col] = static_cast<int>(j);
      }
    }
  }
  for (size_t c = 0; c < specs.size() && !rows->empty(); ++c) {
    slot_bytes[c] = transforms_.SlotBytes(static_cast<int>(c));
    if (into != nullptr && column_at[c] < 0) slot_bytes[c] = 0;
    if (slot_bytes[c] > 0 && into == nullptr) {
      ARROW_ASSIGN_OR_RAISE(blocks[c], arrow::AllocateBuffer(
                                           static_cast<int64_t>(rows->size()) * slot_bytes[c],
                                           kSampleBlockAlignment, pool_));
    }
  }
  size_t chunk = 0;  // of the next row, with `into`
  for (const RowRef& r : *rows) {
    const DecodedUnit& unit = *units[r.unit - unit_base];
    if (!unit.row_ok.empty() && !unit.row_ok[r.row]) continue;  // skipped while decoding
    const Unit& u = order.units()[r.unit];
    ctx.sample_index = dataset_->split_first_row(u.split) + u.row_begin + r.row;
    bool ok = true;
    std::vector<SampleTensor> outs;
    const auto k = static_cast<int64_t>(kept.size());  // the row's place in the batch
    if (into != nullptr) {
      while (chunk + 1 < into->size() && (*into)[chunk].last <= k) ++chunk;
    }
    for (size_t c = 0; c < specs.size() && ok; ++c) {
      if (!transforms_.has_suffix(static_cast<int>(c))) continue;
      std::shared_ptr<arrow::Buffer> block = blocks[c];
      int64_t offset = k * slot_bytes[c];
      if (into != nullptr && slot_bytes[c] > 0 && chunk < into->size()) {
        const WindowGather::Chunk& ch = (*into)[chunk];
        block = ch.block;
        offset = ch.column_offset[column_at[c]] + (k - ch.first) * slot_bytes[c];
      }
      auto s = transforms_.ApplySuffix(static_cast<int>(c), specs[c], unit, r.row, ctx, block, offset);
      if (!s.ok()) {
        const Split& split = dataset_->splits()[u.split];
        const std::string where = "'" + dataset_->files()[split.file].display + "', row group " +
                                  std::to_string(split.row_group) + ", row " +
                                  std::to_string(u.row_begin + r.row);
        if (MaskedNull(specs, unit, static_cast<int>(c), r.row)) {
          return NullFillError(where, specs[c], s.status());
        }
        if (transforms_.policy() == DecodeErrorPolicy::kSkip) {
          ok = false;
          ++work->skipped_rows;
          break;
        }
        return arrow::Status(s.status().code(), where + ", column '" + specs[c].name + "': " +
                                                    s.status().message(),
                             s.status().detail());
      }
      outs.push_back(std::move(s).ValueUnsafe());
      // A sample that missed its slot (an op took it for a temporary) means the column
      // is copied anyway: its later rows need no slot.
      if (blocks[c] != nullptr && outs.back().data->parent() != blocks[c]) blocks[c].reset();
    }
    if (!ok) continue;
    kept.push_back(r);
    size_t o = 0;
    for (size_t c = 0; c < specs.size(); ++c) {
      if (transforms_.has_suffix(static_cast<int>(c))) (*samples)[c].push_back(std::move(outs[o++]));
    }
  }
  *rows = std::move(kept);
  return arrow::Status::OK();
}

std::vector<int64_t> Loader::FixedOutputRowBytes() const {
  std::vector<int64_t> row_bytes;
  for (const auto& f : transforms_.fixed_outputs()) row_bytes.push_back(f.has_value() ? f->bytes() : 0);
  return row_bytes;
}

arrow::Result<std::shared_ptr<Batch>> Loader::BatchIntoSink(
    const std::vector<WindowGather::Chunk>& chunks,
    const std::vector<std::shared_ptr<const DecodedUnit>>& units, int64_t unit_base,
    const std::vector<RowRef>& rows, const std::vector<std::vector<SampleTensor>>& samples) {
  using Part = TransformPlan::Part;
  const int64_t count = chunks.empty() ? 0 : chunks.back().last;
  if (static_cast<int64_t>(rows.size()) != count) {
    return arrow::Status::UnknownError("a batch written in place lost rows");
  }
  const auto& outputs = transforms_.output_sources();
  const std::vector<int64_t> row_bytes = FixedOutputRowBytes();
  int64_t all = 0;
  for (int64_t w : row_bytes) all += w;
  const size_t n = dataset_->specs().size();
  BatchTarget into{std::vector<uint8_t*>(n, nullptr), std::vector<uint8_t*>(n, nullptr),
                   std::vector<int64_t>(n, 0), std::vector<DType>(n, DType::kUInt8),
                   std::vector<std::vector<int64_t>>(n)};
  const auto& fixed = transforms_.fixed_outputs();
  for (size_t j = 0; j < outputs.size(); ++j) {
    const auto [col, what] = outputs[j];
    if (what != Part::kValues) continue;
    into.dtype[col] = fixed[j]->dtype;  // the rows must be what the mixture was told
    into.row_shape[col] = fixed[j]->shape;
  }
  std::vector<RowRef> part;
  std::vector<std::vector<SampleTensor>> part_samples(samples.size());
  for (const WindowGather::Chunk& chunk : chunks) {
    uint8_t* base = chunk.block->mutable_data();
    for (size_t j = 0; j < outputs.size(); ++j) {
      const auto [col, what] = outputs[j];
      if (what == Part::kValues) {
        into.data[col] = base + chunk.column_offset[j];
        into.row_bytes[col] = row_bytes[j];
      } else if (what == Part::kLength) {
        into.lengths[col] = base + chunk.column_offset[j];
      }
    }
    part.assign(rows.begin() + chunk.first, rows.begin() + chunk.last);
    for (size_t c = 0; c < samples.size(); ++c) {
      if (samples[c].empty()) continue;
      part_samples[c].assign(samples[c].begin() + chunk.first, samples[c].begin() + chunk.last);
    }
    ARROW_RETURN_NOT_OK(AssembleInto(dataset_->specs(), units, unit_base, part, part_samples,
                                     into, transforms_.collate(), transforms_.signatures()));
  }
  auto counted = std::make_shared<Batch>();
  counted->num_rows = count;
  counted->owned_bytes = count * all;  // its rows in the sink's blocks
  return counted;
}

arrow::Result<std::shared_ptr<Batch>> Loader::WindowedBatch(
    const EpochPlan& plan, WindowStore& windows, std::pair<int64_t, int64_t> made, int64_t first,
    int64_t last, const std::vector<std::shared_ptr<const DecodedUnit>>& units,
    int64_t unit_base, WindowSink* sink) {
  const int64_t wa = plan.WindowOfRow(first), wb = plan.WindowOfRow(last - 1);
  std::vector<std::shared_ptr<WindowGather>> gathers;
  std::vector<int64_t> starts;
  arrow::Status st;
  for (int64_t w = wa; w <= wb && st.ok(); ++w) {
    const auto [w_first, w_last] = plan.WindowRowRange(w);
    std::function<arrow::Result<std::shared_ptr<WindowGather>>()> make;
    if (w >= made.first && w <= made.second) {
      make = [&, w_first = w_first, w_last = w_last]() -> arrow::Result<std::shared_ptr<WindowGather>> {
        const auto [u_lo, u_hi] = plan.PositionUnitRange(w_first, w_last);
        // A window holds whole units: its permutation is the gather's index (rows
        // counted across its units), made in a block of the pool (see window_gather.h).
        ARROW_ASSIGN_OR_RAISE(std::shared_ptr<arrow::Buffer> index,
                              arrow::AllocateBuffer((w_last - w_first) * 4, pool_));
        plan.WindowPermutation(w, index->mutable_data_as<uint32_t>());
        std::vector<std::shared_ptr<const DecodedUnit>> mine(units.begin() + (u_lo - unit_base),
                                                             units.begin() + (u_hi - unit_base));
        // Chunks of whole batches, about kWindowChunkBytes each: a chunk goes back to
        // the pool when its last batch is dropped, so a window being consumed holds
        // what the pipeline counts of it (its batches not yet taken), not all of it.
        const int64_t bs = options_.plan.batch_size;
        const int64_t row_bytes = FixedRowBytes(dataset_->specs());  // > 0: gathered whole
        // Whole batches per chunk, at least one: kWindowChunkBytes / (bs * row_bytes),
        // without that product (and step, and the positions below) overflowing for batch
        // sizes up to 2^62 (batch_size 2^60 of 12-byte rows made step 0: an endless loop).
        const int64_t step =
            bs * std::max<int64_t>(1, kWindowChunkBytes / std::max<int64_t>(1, row_bytes) / bs);
        // Counted from the window's first batch boundary, so that windows of one size
        // have chunks of the same sizes (the pool recycles blocks by size).
        std::vector<int64_t> chunk_ends;
        int64_t p = w_first % bs == 0 ? w_first : w_first + (bs - w_first % bs);
        while (p < w_last && w_last - p > step) {
          p += step;
          chunk_ends.push_back(p - w_first);
        }
        chunk_ends.push_back(w_last - w_first);
        WindowGather::ChunkMaker chunks_of_sink;
        if (sink != nullptr) {
          chunks_of_sink = [sink, w_first = w_first, w_last = w_last](const std::vector<int64_t>& row_bytes) {
            return sink->Chunks(w_first, w_last, row_bytes);
          };
        }
        auto gather = WindowGather::Make(dataset_->specs(), std::move(mine), std::move(index), pool_,
                                         std::move(chunk_ends), chunks_of_sink);
        if (!gather.ok()) {  // (rows of another shape: name the window's row groups, as MakeBatch does)
          std::string files;
          for (int64_t u = u_lo; u < u_hi; ++u) {
            const Split& s = dataset_->splits()[plan.units()[u].split];
            files += (u > u_lo ? ", '" : "'") + dataset_->files()[s.file].display + "' row group " +
                     std::to_string(s.row_group);
          }
          return WithContext(gather.status(), "shuffle window " + std::to_string(w) + " (from " + files + ")");
        }
        return gather;
      };
    }
    auto gather = windows.Get(w, make);
    if (gather.ok()) {
      gathers.push_back(*gather);
      starts.push_back(w_first);
    } else {
      st = gather.status();
    }
  }
  arrow::Result<std::shared_ptr<Batch>> batch = std::shared_ptr<Batch>();
  if (!st.ok()) {
    batch = st;
  } else if (sink != nullptr) {  // the rows are in the sink's chunks: counted only
    auto counted = std::make_shared<Batch>();
    counted->num_rows = last - first;
    batch = std::move(counted);
  } else {
    batch = WindowBatch(dataset_->specs(), gathers, starts, first, last, pool_);
  }
  for (int64_t w = wa; w <= wb; ++w) windows.Release(w);
  return batch;
}

arrow::Result<std::shared_ptr<Batch>> Loader::SplitParts(std::shared_ptr<Batch> batch) {
  using Part = TransformPlan::Part;
  std::vector<BatchColumn> columns;
  for (const auto& [src, part] : transforms_.output_sources()) {
    const BatchColumn& in = batch->columns[src];
    if (part == Part::kValues) {
      BatchColumn values = in;
      if (values.kind == ColumnKind::kTensor) {  // companions go to their own columns
        values.offsets.reset();
        values.lengths.reset();
      }
      columns.push_back(std::move(values));
      continue;
    }
    BatchColumn c;
    c.kind = ColumnKind::kTensor;
    c.dtype = DType::kInt64;
    c.data = part == Part::kLength ? in.lengths : in.offsets;
    if (c.data == nullptr) return arrow::Status::UnknownError("no ", part == Part::kLength ? "lengths" : "offsets");
    c.shape = {c.data->size() / static_cast<int64_t>(sizeof(int64_t))};
    columns.push_back(std::move(c));
  }
  batch->columns = std::move(columns);
  return batch;
}

}  // namespace pqloader
