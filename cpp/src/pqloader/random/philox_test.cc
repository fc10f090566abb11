#include "pqloader/random/philox.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace pqloader {

// Known-answer vectors of Philox4x32-10 published with Random123 (kat_vectors).
TEST(Philox, MatchesRandom123KnownAnswers) {
  struct Case {
    uint32_t ctr[4], key[2], expect[4];
  };
  const Case cases[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const auto& c : cases) {
    uint32_t ctr[4] = {c.ctr[0], c.ctr[1], c.ctr[2], c.ctr[3]};
    Philox4x32_10(ctr, c.key);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(ctr[i], c.expect[i]) << "word " << i;
  }
}

TEST(CounterRng, StreamDependsOnlyOnIdentity) {
  CounterRng a(42, RngPurpose::kWindowRows, 3, 9);
  CounterRng b(42, RngPurpose::kWindowRows, 3, 9);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.NextU32(), b.NextU32());
}

TEST(CounterRng, DifferentIdentitiesGiveDifferentStreams) {
  std::set<uint64_t> firsts;
  for (uint32_t epoch = 0; epoch < 4; ++epoch) {
    for (uint64_t seed : {1ull, 2ull}) {
      for (auto purpose : {RngPurpose::kSplitOrder, RngPurpose::kWindowRows}) {
        CounterRng r(seed, purpose, epoch, 0);
        firsts.insert(r.NextU64());
      }
    }
  }
  EXPECT_EQ(firsts.size(), 16u);
}

TEST(CounterRng, EveryBitOfTheSeedAndIdsMatters) {
  // Seeds that differ only in their high word (as drawn 64-bit seeds may), and sample
  // streams of samples that differ only in their high word, are different streams.
  std::set<uint64_t> firsts;
  for (uint64_t seed : {7ull, 7ull | (1ull << 32), 7ull | (1ull << 63)}) {
    firsts.insert(CounterRng(seed, RngPurpose::kWindowRows, 0, 0).NextU64());
    firsts.insert(CounterRng::ForSample(seed, 0, 5, 0).NextU64());
    firsts.insert(CounterRng::ForSample(seed, 0, 5 + (int64_t{1} << 32), 0).NextU64());
  }
  EXPECT_EQ(firsts.size(), 9u);
}

TEST(CounterRng, UniformStaysInRangeAndCoversIt) {
  CounterRng r(7, RngPurpose::kSplitOrder, 0, 0);
  std::vector<int> counts(10, 0);
  for (int i = 0; i < 10000; ++i) {
    const uint64_t v = r.Uniform(10);
    ASSERT_LT(v, 10u);
    ++counts[v];
  }
  for (int c : counts) {
    EXPECT_GT(c, 850);
    EXPECT_LT(c, 1150);
  }
  EXPECT_EQ(r.Uniform(1), 0u);
}

// The words of a stream are the determinism contract: a checkpoint resumed by another
// version must see the same draws. They are Philox4x32-10 (checked against Random123's
// known answers above) of the counter layout philox.h documents, word i being word i % 4
// of block i / 4: the key is the seed (low word first); the counter is (block, purpose,
// id_a, id_b), or for ForSample (op << 20 | block, purpose | epoch << 8, sample low,
// sample high).
TEST(CounterRng, WordsFollowTheDocumentedCounterLayout) {
  const uint64_t seed = 0x0123456789abcdefull;
  const uint32_t key[2] = {0x89abcdefu, 0x01234567u};
  auto expect = [&](uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3, int word) {
    uint32_t ctr[4] = {w0 + static_cast<uint32_t>(word / 4), w1, w2, w3};
    Philox4x32_10(ctr, key);
    return ctr[word % 4];
  };
  CounterRng plain(seed, RngPurpose::kWindowRows, 3, 9);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(plain.NextU32(), expect(0, 2, 3, 9, i)) << "word " << i;
  }
  const int64_t sample = 5 + (int64_t{7} << 32);
  CounterRng augment = CounterRng::ForSample(seed, /*epoch=*/2, sample, /*op=*/1);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(augment.NextU32(), expect(1u << 20, 3u | (2u << 8), 5, 7, i)) << "word " << i;
  }
}

// Uniform(n) is Lemire's multiply-shift of a 64-bit draw (high word first), which is
// part of the contract too: another exact method (e.g. modulo with rejection) gives
// other values.
TEST(CounterRng, UniformIsTheHighWordOfADrawTimesN) {
  for (uint64_t n : {uint64_t{2}, uint64_t{10}, uint64_t{1000003}, (uint64_t{1} << 40) + 7}) {
    CounterRng r(99, RngPurpose::kSplitOrder, 4, 0);
    CounterRng twin(99, RngPurpose::kSplitOrder, 4, 0);
    for (int i = 0; i < 200; ++i) {
      const uint64_t x = twin.NextU64();
      const __uint128_t m = static_cast<__uint128_t>(x) * n;
      // A rejected draw (probability n / 2^64) would shift the streams: none happens for
      // these n and this stream, as the equalities show.
      ASSERT_EQ(r.Uniform(n), static_cast<uint64_t>(m >> 64)) << "n " << n << " draw " << i;
    }
  }
}

}  // namespace pqloader

namespace pqloader {
namespace {

// The lane-wise kernel is Philox4x32_10 per counter, for any count (full blocks,
// a partial last block, a single lane) and keys with carries in the bumps.
TEST(Philox, LanesEqualTheOneCounterFunction) {
  CounterRng words(42, RngPurpose::kSplitOrder, 0, 0);
  for (int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 64, 65, 1000}) {
    for (const uint32_t key0 : {0u, 0xFFFFFFFFu, 0x12345678u}) {
      const uint32_t key[2] = {key0, ~key0};
      std::vector<uint32_t> w0(n), w1(n), w2(n), w3(n);
      for (int64_t i = 0; i < n; ++i) {
        w0[i] = words.NextU32();
        w1[i] = words.NextU32();
        w2[i] = words.NextU32();
        w3[i] = words.NextU32();
      }
      for (PhiloxIsa isa : {PhiloxIsa::kScalar, PhiloxIsa::kAvx2, PhiloxIsa::kAvx512,
                            PhiloxIsa::kBest}) {
        if (!PhiloxIsaSupported(isa)) continue;  // (this CPU lacks it)
        auto v0 = w0, v1 = w1, v2 = w2, v3 = w3;
        Philox4x32_10Lanes(v0.data(), v1.data(), v2.data(), v3.data(), n, key, isa);
        for (int64_t i = 0; i < n; ++i) {
          uint32_t ctr[4] = {w0[i], w1[i], w2[i], w3[i]};
          Philox4x32_10(ctr, key);
          ASSERT_EQ(v0[i], ctr[0]) << "n " << n << " lane " << i << " isa " << static_cast<int>(isa);
          ASSERT_EQ(v1[i], ctr[1]);
          ASSERT_EQ(v2[i], ctr[2]);
          ASSERT_EQ(v3[i], ctr[3]);
        }
      }
    }
  }
}

// The 53-bit draws are Philox4x32_10 of (position's low word, its high word, c2, c3),
// words 0 and 1 joined, by every kernel this CPU runs, for any count (the AVX-512
// kernel's 32 a step and what is left), starts whose high word changes inside a step
// (of 16 or 32 counters) or between steps, and keys with carries in the bumps.
TEST(Philox, FiftyThreeBitDrawsEqualTheOneCounterFunction) {
  for (const uint64_t start : {uint64_t{0}, uint64_t{5}, (uint64_t{1} << 32) - 13,
                               (uint64_t{1} << 32) - 8, (uint64_t{1} << 32) - 32,
                               (uint64_t{7} << 40) + 3}) {
    for (int64_t n : {1, 7, 8, 9, 31, 32, 33, 63, 65, 1000}) {
      for (const uint32_t key0 : {0u, 0xFFFFFFFFu, 0x12345678u}) {
        const uint32_t key[2] = {key0, ~key0};
        for (PhiloxIsa isa : {PhiloxIsa::kScalar, PhiloxIsa::kAvx2, PhiloxIsa::kAvx512,
                              PhiloxIsa::kBest}) {
          if (!PhiloxIsaSupported(isa)) continue;  // (this CPU lacks it)
          std::vector<uint64_t> got(n);
          Philox53Bits(start, n, 4, 0xABCDEF01u, key, got.data(), isa);
          for (int64_t i = 0; i < n; ++i) {
            const uint64_t p = start + static_cast<uint64_t>(i);
            uint32_t ctr[4] = {static_cast<uint32_t>(p), static_cast<uint32_t>(p >> 32), 4,
                               0xABCDEF01u};
            Philox4x32_10(ctr, key);
            ASSERT_EQ(got[i], ((uint64_t{ctr[0]} << 32) | ctr[1]) >> 11)
                << "start " << start << " n " << n << " lane " << i << " isa "
                << static_cast<int>(isa);
          }
        }
      }
    }
  }
}

// The bulk stream is CounterRng's, word for word and draw for draw, across its refills
// (256 blocks each) and wherever the 32-bit block counter starts.
TEST(BulkCounterRng, GivesCounterRngsWordsAndDraws) {
  for (uint32_t id_b : {0u, 7u, 0xFFFFFFFFu}) {
    CounterRng one(12345, RngPurpose::kWindowRows, 3, id_b);
    BulkCounterRng bulk(one);
    for (int i = 0; i < 3000; ++i) ASSERT_EQ(bulk.NextU32(), one.NextU32()) << "word " << i;
    for (uint64_t i = 1; i < 5000; ++i) {
      ASSERT_EQ(bulk.Uniform(i), one.Uniform(i)) << "draw " << i;
      ASSERT_EQ(bulk.Uniform(uint64_t{1} << 63 | i), one.Uniform(uint64_t{1} << 63 | i));
    }
  }
  // From a stream part-way through a block (one word used), and a ForSample stream.
  for (CounterRng one : {CounterRng(5, RngPurpose::kSplitOrder, 1, 2),
                         CounterRng::ForSample(5, 3, 1000, 2)}) {
    one.NextU32();
    BulkCounterRng bulk(one);
    for (int i = 0; i < 2000; ++i) ASSERT_EQ(bulk.NextU32(), one.NextU32()) << "word " << i;
  }
}

}  // namespace
TEST(CounterRng, RankZerosWindowStreamIsThePlainOneAndOtherRanksDiffer) {
  CounterRng plain(7, RngPurpose::kWindowRows, 3, 9);
  CounterRng zero = CounterRng::ForWindow(7, 3, 9, 0);
  CounterRng one = CounterRng::ForWindow(7, 3, 9, 1);
  CounterRng again = CounterRng::ForWindow(7, 3, 9, 1);
  int differ = 0;
  for (int i = 0; i < 16; ++i) {
    const uint32_t p = plain.NextU32(), z = zero.NextU32(), o = one.NextU32();
    EXPECT_EQ(p, z);
    EXPECT_EQ(o, again.NextU32());
    differ += o != p ? 1 : 0;
  }
  EXPECT_GT(differ, 12);
}

}  // namespace pqloader
