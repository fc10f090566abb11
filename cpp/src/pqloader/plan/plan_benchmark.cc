// The planning cost of one rank at scale: 10^6 row groups of 1,000 rows (10^9 rows),
// 1,024 ranks, shuffled. EpochPlan::Make is what every rank does per epoch;
// EpochSplitUses::Make is what cache_policy="plan" adds (every rank's reads of the
// epoch, for the eviction order). The counter "plan_bytes" is the memory the rank's
// plan holds (its vectors' capacities). BM_MixtureDraws: a mixture's 53-bit draws
// (random/philox.h, Philox53Bits) of 2^20 positions, per instruction set this CPU has
// (arg: 0 scalar, 1 AVX2, 2 AVX-512). BM_WindowPermutation: one shuffle window's row
// permutation (4 row groups of 64k rows), as each shuffled window's gather first makes it.
//
//   build/py/cpp/src/pqloader/plan_benchmark
#include <benchmark/benchmark.h>

#include <vector>

#include "pqloader/plan/epoch_plan.h"
#include "pqloader/plan/split_uses.h"
#include "pqloader/random/philox.h"

namespace pqloader {
namespace {

constexpr int64_t kSplits = 1'000'000;
constexpr int64_t kRowsPerSplit = 1'000;
constexpr int64_t kRanks = 1'024;

PlanOptions Options(int64_t rank) {
  PlanOptions o;
  o.batch_size = 256;
  o.shuffle = true;
  o.seed = 1;
  o.world_size = kRanks;
  o.rank = rank;
  return o;
}

void BM_EpochPlanOneRank(benchmark::State& state) {
  const std::vector<int64_t> rows(kSplits, kRowsPerSplit);
  int64_t epoch = 0;
  for (auto _ : state) {
    EpochPlan plan = EpochPlan::Make(rows, Options(kRanks / 2), epoch++);
    benchmark::DoNotOptimize(plan.num_batches());
    state.counters["plan_bytes"] = static_cast<double>(plan.MemoryBytes());
  }
}
BENCHMARK(BM_EpochPlanOneRank)->Unit(benchmark::kMillisecond);

void BM_SplitUsesAllRanks(benchmark::State& state) {
  const std::vector<int64_t> rows(kSplits, kRowsPerSplit);
  int64_t epoch = 0;
  for (auto _ : state) {
    EpochSplitUses uses = EpochSplitUses::Make(rows, Options(0), epoch++);
    benchmark::DoNotOptimize(uses.NextRead(7, -1.0));
  }
}
BENCHMARK(BM_SplitUsesAllRanks)->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_WindowPermutation(benchmark::State& state) {
  const std::vector<int64_t> rows(16, int64_t{1} << 16);
  PlanOptions o;
  o.batch_size = 1024;
  o.shuffle = true;
  o.seed = 1;
  const EpochPlan plan = EpochPlan::Make(rows, o, 0);
  std::vector<uint32_t> out(int64_t{4} << 16);
  int64_t w = 0;
  for (auto _ : state) {
    plan.WindowPermutation(w++ % 4, out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(out.size()));
}
BENCHMARK(BM_WindowPermutation)->Unit(benchmark::kMillisecond);

void BM_MixtureDraws(benchmark::State& state) {
  const auto isa = static_cast<PhiloxIsa>(state.range(0));
  if (!PhiloxIsaSupported(isa)) {
    state.SkipWithError("this CPU lacks the instruction set");
    return;
  }
  constexpr int64_t kPositions = int64_t{1} << 20;
  std::vector<uint64_t> out(kPositions);
  const uint32_t key[2] = {1, 0};
  uint64_t start = 0;
  for (auto _ : state) {
    Philox53Bits(start, kPositions, 4, 0, key, out.data(), isa);
    benchmark::DoNotOptimize(out.data());
    start += kPositions;
  }
  state.SetItemsProcessed(state.iterations() * kPositions);
}
BENCHMARK(BM_MixtureDraws)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pqloader

BENCHMARK_MAIN();
