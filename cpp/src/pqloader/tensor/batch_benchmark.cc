// Gathers of a batch: natural order (slices), shuffled column by column, shuffled
// row-major; and the row-major transposition of a unit. A window of 4 units of 64k
// rows x (80 float32 + 21 int64) columns (125 MB, larger than the CPU caches), as a
// shuffled epoch of a wide table reads it.
//
//   build/py/cpp/src/pqloader/batch_benchmark --benchmark_min_time=1s
#include <benchmark/benchmark.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "pqloader/tensor/batch.h"
#include "pqloader/tensor/buffer_pool.h"

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

BENCHMARK(BM_GatherNaturalOrder);
BENCHMARK(BM_GatherShuffledColumns);
BENCHMARK(BM_GatherShuffledRowMajor);
BENCHMARK(BM_WithRowMajor)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pqloader

BENCHMARK_MAIN();
