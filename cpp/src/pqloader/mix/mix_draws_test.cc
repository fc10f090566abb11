#include "pqloader/mix/mix_draws.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include <gtest/gtest.h>

namespace pqloader {
namespace {

TEST(MixDraws, ProportionsWithinBinomialBoundsOver100kDraws) {
  const std::vector<double> weights = {5, 3, 2};
  const auto cum = CumulativeWeights(weights);
  constexpr int64_t kDraws = 100000;
  for (uint64_t seed : {0ull, 7ull, 123456789ull}) {
    const auto counts = CountDraws(seed, 3, kDraws, cum);
    for (size_t i = 0; i < weights.size(); ++i) {
      const double p = weights[i] / 10.0;
      const double sd = std::sqrt(kDraws * p * (1 - p));
      EXPECT_LT(std::abs(counts[i] - kDraws * p), 4.5 * sd) << "seed " << seed << " source " << i;
    }
  }
}

// Bulk draws (lane-wise Philox in blocks) equal the one-position draw everywhere,
// across block boundaries and from any start; counts and epoch lengths agree with them.
TEST(MixDraws, BulkDrawsEqualOnePositionDraws) {
  const auto cum = CumulativeWeights({0.6, 0.3, 0.1});
  const int64_t start = (int64_t{1} << 32) - 700;  // the position's high word changes inside
  std::vector<int32_t> bulk(3000);
  DrawSources(99, 4, start, 3000, cum, bulk.data());
  for (int64_t i = 0; i < 3000; ++i) {
    ASSERT_EQ(bulk[i], DrawSource(99, 4, start + i, cum)) << "position " << start + i;
  }
  std::vector<int64_t> counts(3, 0);
  std::vector<int32_t> head(2500);
  DrawSources(99, 4, 0, 2500, cum, head.data());
  for (int32_t s : head) ++counts[s];
  EXPECT_EQ(CountDraws(99, 4, 2500, cum), counts);
  // "first": the position whose draw needs a row past a source's rows.
  const std::vector<int64_t> rows = {1000000, 1000000, counts[2]};
  int64_t expect = -1;
  std::vector<int64_t> seen(3, 0);
  std::vector<int32_t> long_run(20000);
  DrawSources(99, 4, 0, 20000, cum, long_run.data());
  for (int64_t p = 0; p < 20000; ++p) {
    if (seen[long_run[p]] == rows[long_run[p]]) {
      expect = p;
      break;
    }
    ++seen[long_run[p]];
  }
  ASSERT_GE(expect, 2500);
  EXPECT_EQ(EpochLengthUntilExhausted(99, 4, cum, rows, false, 1 << 30), expect);
}

TEST(MixDraws, BulkDrawsEqualOnePositionDrawsForAnyNumberOfSources) {
  // One source (no threshold), two, and 17 of uneven weights (thresholds close together),
  // blocks of 1,024 draws and a partial one.
  for (const int sources : {1, 2, 17}) {
    std::vector<double> weights;
    for (int s = 0; s < sources; ++s) weights.push_back(1.0 + (s * 7) % 5);
    const auto cum = CumulativeWeights(weights);
    std::vector<int32_t> bulk(2500);
    DrawSources(7, 2, 1000, 2500, cum, bulk.data());
    std::vector<int64_t> seen(sources, 0);
    for (int64_t i = 0; i < 2500; ++i) {
      ASSERT_EQ(bulk[i], DrawSource(7, 2, 1000 + i, cum)) << sources << " sources, position " << 1000 + i;
      ++seen[bulk[i]];
    }
    for (int s = 0; s < sources; ++s) EXPECT_GT(seen[s], 0) << "source " << s << " of " << sources;
  }
}

TEST(MixDraws, ThresholdsSplitThe53BitDrawsWhereTheCumulativeWeightsDo) {
  // Source i is the count of cumulative[j] <= u, u = k * 2^-53 (the contract); bulk draws
  // count thresholds <= k. At k = threshold - 1 and k = threshold the two must agree,
  // for cumulative values whose scaled value is a whole number or not.
  const std::vector<double> cum = {0.1, 1.0 / 3.0, 0.5, std::nextafter(0.7, 1.0), 0x1.0p-60, 1.0};
  const std::vector<uint64_t> t = DrawThresholds(cum);
  ASSERT_EQ(t.size(), cum.size() - 1);
  for (size_t i = 0; i < t.size(); ++i) {
    for (uint64_t k : {t[i] - 1, t[i], t[i] + 1}) {
      if (t[i] == 0 && k == t[i] - 1) continue;
      const double u = static_cast<double>(k) * 0x1.0p-53;
      EXPECT_EQ(cum[i] <= u, k >= t[i]) << "cumulative " << cum[i] << ", k " << k;
    }
  }
}

TEST(MixDraws, ADrawDependsOnSeedEpochAndPositionOnly) {
  const auto cum = CumulativeWeights({1, 1, 1, 1});
  std::vector<int32_t> run(1000), part(400);
  DrawSources(5, 2, 0, 1000, cum, run.data());
  DrawSources(5, 2, 300, 400, cum, part.data());
  for (int i = 0; i < 400; ++i) EXPECT_EQ(part[i], run[300 + i]);
  std::vector<int32_t> other_epoch(1000), other_seed(1000);
  DrawSources(5, 3, 0, 1000, cum, other_epoch.data());
  DrawSources(6, 2, 0, 1000, cum, other_seed.data());
  EXPECT_NE(run, other_epoch);
  EXPECT_NE(run, other_seed);
  // The documented layout, pinned: a change here is a versioned change of order.
  std::vector<int32_t> first(12);
  DrawSources(1, 0, 0, 12, CumulativeWeights({1, 1}), first.data());
  EXPECT_EQ(first, (std::vector<int32_t>{1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0}));
}

TEST(MixDraws, ZeroWeightIsNeverDrawn) {
  const auto cum = CumulativeWeights({1, 0, 1});
  const auto counts = CountDraws(9, 0, 20000, cum);
  EXPECT_EQ(counts[1], 0);
  EXPECT_GT(counts[0], 9000);
  EXPECT_GT(counts[2], 9000);
}

TEST(MixDraws, EpochLengthStopsOnceCancelled) {
  // A skewed "last" epoch: source 0 (weight 1e-9, 1,000 rows) runs out only after
  // ~10^12 draws, near the limit of 2^40 positions (about twenty minutes of draws).
  const auto cum = CumulativeWeights({1e-9, 1.0});
  const std::vector<int64_t> rows = {1000, 1};
  auto flag = std::make_shared<std::atomic<bool>>(false);
  std::vector<uint8_t> kept;
  int64_t length = 0;
  std::thread drawing([&] {
    length = EpochLengthUntilExhausted(4, 1, cum, rows, true, int64_t{1} << 40, &kept, 1 << 20, flag);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  flag->store(true);
  drawing.join();  // returns at its next check, within 65,536 draws
  EXPECT_EQ(length, -1);
  EXPECT_TRUE(kept.empty());
  EXPECT_EQ(EpochLengthUntilExhausted(4, 1, cum, {600, 100}, false, 1 << 20, nullptr, 0, flag), -1);
}

TEST(MixDraws, FirstDrawOfASetOfSources) {
  const auto cum = CumulativeWeights({0.5, 0.3, 0.2});
  for (int64_t end : {int64_t{1}, int64_t{1000}, int64_t{5000}}) {
    for (const std::vector<uint8_t>& wanted :
         {std::vector<uint8_t>{0, 0, 1}, std::vector<uint8_t>{0, 1, 1}, std::vector<uint8_t>{0, 0, 0}}) {
      int64_t expected = end;  // draw by draw, as the contract states it
      for (int64_t p = 0; p < end; ++p) {
        if (wanted[static_cast<size_t>(DrawSource(7, 2, p, cum))] != 0) {
          expected = p;
          break;
        }
      }
      EXPECT_EQ(FirstDrawOf(7, 2, end, cum, wanted), expected);
    }
  }
  EXPECT_EQ(FirstDrawOf(7, 2, 0, cum, {1, 1, 1}), 0);
}

TEST(MixDraws, FirstDrawOfStopsOnceCancelled) {
  // Source 1 (weight 0) is never drawn: the search would run through 2^40 positions.
  const auto cum = CumulativeWeights({1.0, 0.0});
  auto flag = std::make_shared<std::atomic<bool>>(false);
  int64_t first = 0;
  std::thread drawing([&] { first = FirstDrawOf(4, 1, int64_t{1} << 40, cum, {0, 1}, flag); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  flag->store(true);
  drawing.join();
  EXPECT_EQ(first, -1);
}

TEST(MixDraws, EpochEndsWhenTheFirstOrTheLastSourceRunsOut) {
  const auto cum = CumulativeWeights({0.6, 0.4});
  const std::vector<int64_t> rows = {600, 100};
  const int64_t first = EpochLengthUntilExhausted(4, 1, cum, rows, false, 1 << 20);
  auto counts = CountDraws(4, 1, first, cum);
  EXPECT_LE(counts[0], rows[0]);
  EXPECT_LE(counts[1], rows[1]);
  const int s = DrawSource(4, 1, first, cum);
  EXPECT_EQ(counts[s], rows[s]);  // the next draw would need a row the source lacks
  const int64_t last = EpochLengthUntilExhausted(4, 1, cum, rows, true, 1 << 20);
  counts = CountDraws(4, 1, last, cum);
  EXPECT_GE(counts[0], rows[0]);
  EXPECT_GE(counts[1], rows[1]);
  counts = CountDraws(4, 1, last - 1, cum);
  EXPECT_TRUE(counts[0] < rows[0] || counts[1] < rows[1]);
  EXPECT_GT(last, first);
  EXPECT_EQ(EpochLengthUntilExhausted(4, 1, cum, {0, 5}, false, 100), 0);
  EXPECT_EQ(EpochLengthUntilExhausted(4, 1, cum, rows, true, 50), 50);
}

// The epoch length draw by draw, as the contract states it (the reference for the
// block-counted EpochLengthUntilExhausted).
int64_t LengthDrawByDraw(uint64_t seed, int64_t epoch, const std::vector<double>& cum,
                         const std::vector<int64_t>& rows, bool until_all, int64_t limit) {
  std::vector<int64_t> counts(rows.size(), 0);
  for (int64_t p = 0; p < limit; ++p) {
    const int s = DrawSource(seed, epoch, p, cum);
    if (!until_all && counts[s] == rows[s]) return p;
    ++counts[s];
    bool all = true;
    for (size_t i = 0; i < rows.size(); ++i) all = all && counts[i] >= rows[i];
    if (until_all && all) return p + 1;
  }
  return limit;
}

TEST(MixDraws, EpochLengthEqualsTheDrawByDrawCount) {
  // Ends in the first block, inside later blocks and on their edges, with few sources
  // (counted per block) and many (scanned draw by draw), "first" and "last".
  for (const int n : {2, 3, 17}) {
    std::vector<double> weights;
    for (int i = 0; i < n; ++i) weights.push_back(1.0 + i);
    const auto cum = CumulativeWeights(weights);
    for (const int64_t scale : {1, 40, 700, 3000}) {
      std::vector<int64_t> rows;
      for (int i = 0; i < n; ++i) rows.push_back(scale * (1 + (i * 7) % 5));
      for (const bool until_all : {false, true}) {
        const int64_t limit = 1 << 21;
        EXPECT_EQ(EpochLengthUntilExhausted(11, 2, cum, rows, until_all, limit),
                  LengthDrawByDraw(11, 2, cum, rows, until_all, limit))
            << "sources " << n << " scale " << scale << " until_all " << until_all;
      }
    }
  }
  // A limit inside the block where the epoch would end.
  const auto cum = CumulativeWeights({1, 1});
  EXPECT_EQ(EpochLengthUntilExhausted(3, 0, cum, {5000, 5000}, false, 2100),
            LengthDrawByDraw(3, 0, cum, {5000, 5000}, false, 2100));
}

TEST(MixDraws, TheEpochLengthsDrawsAreKeptAsBytes) {
  // "first" and "last": the kept bytes are the draws of positions [0, length); none are
  // kept past max_kept, nor for more than 256 sources.
  const auto cum = CumulativeWeights({0.5, 0.3, 0.2});
  const std::vector<int64_t> rows = {2000, 1500, 900};
  for (bool until_all : {false, true}) {
    std::vector<uint8_t> kept = {7};
    const int64_t n = EpochLengthUntilExhausted(3, 1, cum, rows, until_all, 1 << 30, &kept, 1 << 20);
    ASSERT_EQ(n, EpochLengthUntilExhausted(3, 1, cum, rows, until_all, 1 << 30));
    std::vector<int32_t> draws(n);
    DrawSources(3, 1, 0, n, cum, draws.data());
    ASSERT_EQ(kept, std::vector<uint8_t>(draws.begin(), draws.end())) << until_all;
    EpochLengthUntilExhausted(3, 1, cum, rows, until_all, 1 << 30, &kept, n - 1);
    EXPECT_TRUE(kept.empty()) << until_all;
    EpochLengthUntilExhausted(3, 1, cum, rows, until_all, 1 << 30, &kept, n);
    EXPECT_EQ(static_cast<int64_t>(kept.size()), n) << until_all;
  }
  std::vector<double> weights(300, 1.0);
  std::vector<uint8_t> kept;
  EpochLengthUntilExhausted(3, 1, CumulativeWeights(weights), std::vector<int64_t>(300, 10), false,
                            1 << 30, &kept, 1 << 20);
  EXPECT_TRUE(kept.empty());
}

TEST(MixDraws, InterleaveTakesEachSourcesRowsInOrderAcrossPieces) {
  const std::vector<int64_t> a1 = {10, 11}, a2 = {12}, b = {20, 21};
  auto bytes = [](const auto& v) { return reinterpret_cast<const uint8_t*>(v.data()); };
  const std::vector<int32_t> sources = {1, 0, 0, 1, 0};
  const auto plan = InterleavePlan::Make({2, 2, 1}, {0, 1, 0}, sources.data(), 5);
  EXPECT_EQ(plan.piece, (std::vector<int32_t>{1, 0, 0, 1, 2}));
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < 5; ++r) rows.push_back(plan.row(r));
  EXPECT_EQ(rows, (std::vector<int64_t>{0, 0, 1, 1, 0}));
  EXPECT_EQ(plan.used, (std::vector<int64_t>{2, 2, 1}));
  std::vector<int64_t> out(5);
  // A second column of 3-byte rows, through the generic path.
  const std::vector<uint8_t> w1 = {1, 1, 1, 2, 2, 2}, w2 = {3, 3, 3}, wb = {7, 7, 7, 8, 8, 8};
  std::vector<uint8_t> wide(15);
  std::vector<InterleaveColumn> columns = {
      {reinterpret_cast<uint8_t*>(out.data()), 8, {bytes(a1), bytes(b), bytes(a2)}},
      {wide.data(), 3, {w1.data(), wb.data(), w2.data()}}};
  InterleaveRows(plan, columns);
  EXPECT_EQ(out, (std::vector<int64_t>{20, 10, 11, 21, 12}));
  EXPECT_EQ(wide, (std::vector<uint8_t>{7, 7, 7, 1, 1, 1, 2, 2, 2, 8, 8, 8, 3, 3, 3}));
}

TEST(MixDraws, InterleaveOfEveryWidthEqualsTheRowByRowCopy) {
  // Three sources in five pieces, 1,000 rows drawn at random; columns of 1 to 12 bytes,
  // among them runs of 8 of 4 bytes and 4 of 8 bytes (interleaved in groups of 32-byte
  // rows where the CPU has AVX2) and others row by row; each against its rows copied
  // from (piece, row) one by one.
  std::mt19937 gen(4);
  std::vector<int32_t> sources(1000);
  for (int32_t& s : sources) s = static_cast<int32_t>(gen() % 3);
  std::vector<int64_t> drawn(3, 0);
  for (int32_t s : sources) ++drawn[s];
  const std::vector<int32_t> piece_sources = {0, 1, 2, 0, 1};
  std::vector<int64_t> piece_rows = {drawn[0] / 2, drawn[1] - 7, drawn[2] + 3,
                                     drawn[0] - drawn[0] / 2 + 5, 7};
  const auto plan = InterleavePlan::Make(piece_rows, piece_sources, sources.data(), 1000);
  // Rows drawn of each piece: the first pieces of a source whole, its last in part.
  EXPECT_EQ(plan.used, (std::vector<int64_t>{drawn[0] / 2, drawn[1] - 7, drawn[2],
                                             drawn[0] - drawn[0] / 2, 7}));
  std::vector<int64_t> widths = {1, 2, 12};
  widths.insert(widths.begin() + 1, 8, 4);   // a group of 8
  widths.insert(widths.end(), 5, 8);         // a group of 4 and one alone
  widths.push_back(4);                       // alone
  std::vector<std::vector<std::vector<uint8_t>>> pieces(widths.size());
  std::vector<std::vector<uint8_t>> got(widths.size()), want(widths.size());
  std::vector<InterleaveColumn> columns(widths.size());
  for (size_t c = 0; c < widths.size(); ++c) {
    const int64_t width = widths[c];
    for (int64_t rows : piece_rows) {
      std::vector<uint8_t> p(static_cast<size_t>(rows * width));
      for (uint8_t& b : p) b = static_cast<uint8_t>(gen());
      pieces[c].push_back(std::move(p));
    }
    got[c].assign(1000 * width, 0);
    want[c].assign(1000 * width, 0);
    for (int64_t r = 0; r < 1000; ++r) {
      std::memcpy(want[c].data() + r * width,
                  pieces[c][plan.piece[r]].data() + plan.row(r) * width, static_cast<size_t>(width));
    }
    columns[c].out = got[c].data();
    columns[c].row_bytes = width;
    for (const auto& p : pieces[c]) columns[c].pieces.push_back(p.data());
  }
  InterleaveRows(plan, columns);
  for (size_t c = 0; c < widths.size(); ++c) {
    EXPECT_EQ(got[c], want[c]) << "column " << c << " of " << widths[c] << " bytes";
  }
}

TEST(MixDraws, ALastSourceEndingOnABlocksLastDrawOfItEndsTheEpochThere) {
  // Every source's rows are exactly its draws among the first `end` positions, `end` a
  // multiple of the 1024-draw blocks: the epoch ends inside the last of those blocks,
  // whose draws bring every count to its rows exactly, at the draw-by-draw position.
  const auto cum = CumulativeWeights({1, 2, 3});
  for (const int64_t end : {1024, 2048, 5 * 1024}) {
    const std::vector<int64_t> rows = CountDraws(7, 1, end, cum);
    const int64_t expect = LengthDrawByDraw(7, 1, cum, rows, true, 1 << 20);
    ASSERT_LE(expect, end);
    EXPECT_EQ(EpochLengthUntilExhausted(7, 1, cum, rows, true, 1 << 20), expect) << end;
  }
}

TEST(MixDraws, ASourceOfWeightZeroIsNotWaitedForNorEndsAnEpoch) {
  const auto cum = CumulativeWeights({1, 0, 1});
  // "last": the epoch ends once sources 0 and 2 ran out, not at the limit.
  const int64_t last = EpochLengthUntilExhausted(5, 0, cum, {50, 50, 50}, true, 1 << 20);
  EXPECT_EQ(last, LengthDrawByDraw(5, 0, cum, {50, 0, 50}, true, 1 << 20));
  EXPECT_LT(last, 1 << 20);
  // "first": a weight-0 source without rows does not make the epoch empty.
  const int64_t first = EpochLengthUntilExhausted(5, 0, cum, {50, 0, 50}, false, 1 << 20);
  EXPECT_EQ(first, LengthDrawByDraw(5, 0, cum, {50, 1 << 30, 50}, false, 1 << 20));
  EXPECT_GT(first, 0);
}

}  // namespace
}  // namespace pqloader
