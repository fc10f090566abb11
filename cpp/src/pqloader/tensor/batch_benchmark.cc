// Gathers of a batch: natural order (slices), shuffled column by column, shuffled
// row-major; and the row-major transposition of a unit. A window of 4 units of 64k
// rows x (80 float32 + 21 int64) columns (125 MB, larger than the CPU caches), as a
// shuffled epoch of a wide table reads it.
//
//   build/py/cpp/src/pqloader/batch_benchmark --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <cstring>
#include <immintrin.h>

#include "pqloader/tensor/batch.h"
#include "pqloader/tensor/buffer_pool.h"
#include "pqloader/tensor/group_rows.h"
#include "pqloader/tensor/window_gather.h"

namespace pqloader {
namespace {

constexpr int64_t kRows = 65536;
constexpr int kUnits = 4;
constexpr int kFloatColumns = 80;
constexpr int kIntColumns = 21;
constexpr int64_t kBatch = 1024;

std::vector<ColumnSpec> Specs() {
  std::vector<ColumnSpec> specs;
  for (int c = 0; c < kFloatColumns + kIntColumns; ++c) {
    ColumnSpec s;
    s.name = std::to_string(c);
    s.dtype = c < kFloatColumns ? DType::kFloat32 : DType::kInt64;
    specs.push_back(s);
  }
  return specs;
}

std::shared_ptr<const DecodedUnit> MakeUnit(int seed) {
  auto unit = std::make_shared<DecodedUnit>();
  unit->num_rows = kRows;
  std::mt19937_64 gen(seed);
  for (int c = 0; c < kFloatColumns + kIntColumns; ++c) {
    ColumnData d;
    d.row_bytes = c < kFloatColumns ? 4 : 8;
    d.data = *arrow::AllocateBuffer(kRows * d.row_bytes, RecyclingPool::Global());
    auto* p = reinterpret_cast<uint32_t*>(d.data->mutable_data());
    for (int64_t i = 0; i < kRows * d.row_bytes / 4; ++i) p[i] = static_cast<uint32_t>(gen());
    unit->columns.push_back(std::move(d));
  }
  return unit;
}

struct Window {
  std::vector<std::shared_ptr<const DecodedUnit>> units;
  std::vector<RowRef> order;  // a shuffled window, as EpochPlan::ResolveRows makes it

  explicit Window(bool row_major) {
    for (int u = 0; u < kUnits; ++u) {
      auto unit = MakeUnit(u);
      if (row_major) unit = *WithRowMajor(unit, 64, RecyclingPool::Global());
      units.push_back(unit);
    }
    std::vector<int64_t> perm(kRows * kUnits);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937_64(7));
    for (int64_t p : perm) order.push_back(RowRef{p / kRows, p % kRows});
  }
};

void Gather(benchmark::State& state, bool shuffled, bool row_major) {
  const Window w(row_major);
  const auto specs = Specs();
  int64_t b = 0;
  const int64_t num_batches = kRows * kUnits / kBatch;
  for (auto _ : state) {
    std::vector<RowRef> rows;
    if (shuffled) {
      rows.assign(w.order.begin() + b * kBatch, w.order.begin() + (b + 1) * kBatch);
    } else {
      for (int64_t i = 0; i < kBatch; ++i) {
        const int64_t p = b * kBatch + i;
        rows.push_back(RowRef{p / kRows, p % kRows});
      }
    }
    auto batch = AssembleBatch(specs, w.units, 0, rows, {}, RecyclingPool::Global());
    benchmark::DoNotOptimize(batch);
    b = (b + 1) % num_batches;
  }
  state.SetItemsProcessed(state.iterations() * kBatch);
  state.SetBytesProcessed(state.iterations() * kBatch * (kFloatColumns * 4 + kIntColumns * 8));
}

void BM_GatherNaturalOrder(benchmark::State& s) { Gather(s, false, false); }
void BM_GatherShuffledColumns(benchmark::State& s) { Gather(s, true, false); }
void BM_GatherShuffledRowMajor(benchmark::State& s) { Gather(s, true, true); }

void BM_WithRowMajor(benchmark::State& state) {
  auto unit = MakeUnit(0);
  for (auto _ : state) {
    auto out = WithRowMajor(unit, 64, RecyclingPool::Global());
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations() * kRows);
  state.SetBytesProcessed(state.iterations() * kRows * (kFloatColumns * 4 + kIntColumns * 8));
}

// A whole window gathered column after column into window-ordered arrays (what a
// window-level gather would do): each column's source (4 x 64k values) stays in L2/L3.
template <typename T>
void GatherColumn(const std::vector<const T*>& src, const uint32_t* unit, const uint32_t* row,
                  int64_t n, T* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = src[unit[i]][row[i]];
}

void BM_GatherWindowByColumn(benchmark::State& state) {
  const Window w(false);
  const int64_t n = kRows * kUnits;
  std::vector<uint32_t> unit(n), row(n);
  for (int64_t i = 0; i < n; ++i) {
    unit[i] = static_cast<uint32_t>(w.order[i].unit);
    row[i] = static_cast<uint32_t>(w.order[i].row);
  }
  std::vector<std::vector<uint8_t>> out(kFloatColumns + kIntColumns);
  for (int c = 0; c < kFloatColumns + kIntColumns; ++c) out[c].resize(n * (c < kFloatColumns ? 4 : 8));
  for (auto _ : state) {
    for (int c = 0; c < kFloatColumns + kIntColumns; ++c) {
      if (c < kFloatColumns) {
        std::vector<const uint32_t*> src;
        for (const auto& u : w.units) src.push_back(reinterpret_cast<const uint32_t*>(u->columns[c].data->data()));
        GatherColumn(src, unit.data(), row.data(), n, reinterpret_cast<uint32_t*>(out[c].data()));
      } else {
        std::vector<const uint64_t*> src;
        for (const auto& u : w.units) src.push_back(reinterpret_cast<const uint64_t*>(u->columns[c].data->data()));
        GatherColumn(src, unit.data(), row.data(), n, reinterpret_cast<uint64_t*>(out[c].data()));
      }
    }
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * (kFloatColumns * 4 + kIntColumns * 8));
}
BENCHMARK(BM_GatherWindowByColumn)->Unit(benchmark::kMillisecond);

// The loader's gather of the window (WindowGather: columns of 4 and 8 bytes in groups
// of 32-byte rows, in chunks of ~16 MiB from the pool), on one thread.
void BM_WindowGather(benchmark::State& state) {
  const Window w(false);
  const auto specs = Specs();
  const int64_t n = kRows * kUnits;
  std::vector<int32_t> index(n);
  for (int64_t i = 0; i < n; ++i) index[i] = static_cast<int32_t>(w.order[i].unit * kRows + w.order[i].row);
  std::vector<int64_t> chunk_ends;
  for (int64_t p = 32 * kBatch; p < n; p += 32 * kBatch) chunk_ends.push_back(p);
  chunk_ends.push_back(n);
  const PoolCacheReservation reserve(int64_t{512} << 20);  // as a loader's: chunks recycled
  for (auto _ : state) {
    auto buffer = arrow::AllocateBuffer(n * 4, RecyclingPool::Global()).ValueOrDie();
    std::memcpy(buffer->mutable_data(), index.data(), n * 4);
    auto gather = WindowGather::Make(specs, w.units, std::move(buffer), RecyclingPool::Global(),
                                     chunk_ends).ValueOrDie();
    if (!gather->Run().ok()) state.SkipWithError("gather failed");
    benchmark::DoNotOptimize(gather);
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * (kFloatColumns * 4 + kIntColumns * 8));
}
BENCHMARK(BM_WindowGather)->Unit(benchmark::kMillisecond);

// The window's column made contiguous first (sequential copies), then gathered with
// 32-bit indices: scalar, or the loader's own gather (AVX2 where the CPU has it).
void WindowConcatGather(benchmark::State& state, bool avx2) {
  const Window w(false);
  const int64_t n = kRows * kUnits;
  std::vector<int32_t> idx(n);
  for (int64_t i = 0; i < n; ++i) idx[i] = static_cast<int32_t>(w.order[i].unit * kRows + w.order[i].row);
  std::vector<uint8_t> concat(n * 8);
  std::vector<std::vector<uint8_t>> out(kFloatColumns + kIntColumns);
  for (int c = 0; c < kFloatColumns + kIntColumns; ++c) out[c].resize(n * (c < kFloatColumns ? 4 : 8));
  for (auto _ : state) {
    for (int c = 0; c < kFloatColumns + kIntColumns; ++c) {
      const int64_t width = c < kFloatColumns ? 4 : 8;
      for (int u = 0; u < kUnits; ++u) {
        std::memcpy(concat.data() + u * kRows * width, w.units[u]->columns[c].data->data(), kRows * width);
      }
      if (avx2) {  // the production gather (window_gather.h), streamed stores included
        GatherRows(width, concat.data(), idx.data(), n, out[c].data());
        StreamFence();
      } else if (width == 4) {
        const auto* src = reinterpret_cast<const uint32_t*>(concat.data());
        auto* dst = reinterpret_cast<uint32_t*>(out[c].data());
        for (int64_t i = 0; i < n; ++i) dst[i] = src[idx[i]];
      } else {
        const auto* src = reinterpret_cast<const uint64_t*>(concat.data());
        auto* dst = reinterpret_cast<uint64_t*>(out[c].data());
        for (int64_t i = 0; i < n; ++i) dst[i] = src[idx[i]];
      }
    }
    benchmark::DoNotOptimize(out);
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * (kFloatColumns * 4 + kIntColumns * 8));
}
void BM_WindowConcatGatherScalar(benchmark::State& s) { WindowConcatGather(s, false); }
void BM_WindowConcatGatherAvx2(benchmark::State& s) { WindowConcatGather(s, true); }
BENCHMARK(BM_WindowConcatGatherScalar)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_WindowConcatGatherAvx2)->Unit(benchmark::kMillisecond);

BENCHMARK(BM_GatherNaturalOrder);
BENCHMARK(BM_GatherShuffledColumns);
BENCHMARK(BM_GatherShuffledRowMajor);
BENCHMARK(BM_WithRowMajor)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pqloader

BENCHMARK_MAIN();
