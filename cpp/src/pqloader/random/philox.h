// Counter-based random numbers (Philox4x32-10) keyed by purpose and identity.
//
// Every random choice in pqloader is drawn from a stream identified by
// (seed, purpose, id_a, id_b), never from a shared sequential generator, so the
// value of a draw depends only on what it is for, not on which thread makes it or
// when. Thread-safety: a CounterRng is a small value type; use one per thread.
#pragma once

#include <cstdint>

namespace pqloader {

/// What a random stream is used for. Values are part of the determinism contract:
/// never renumber them, only append.
enum class RngPurpose : uint32_t {
  kSplitOrder = 1,  ///< Permutation of splits in an epoch (id_a = epoch).
  kWindowRows = 2,  ///< Row permutation of one shuffle window (id_a = epoch, id_b = window;
                    ///< the rank in bits 8..31 of the purpose word: CounterRng::ForWindow).
  kAugment = 3,     ///< Per-sample augmentation draws (see CounterRng::ForSample).
  kMixture = 4,     ///< Which source a mixture's position draws from (mix/mix_draws.h).
};

/// Apply Philox4x32 with 10 rounds to `counter` under `key`, in place.
void Philox4x32_10(uint32_t counter[4], const uint32_t key[2]);

/// The instruction sets Philox4x32_10Lanes can run on, widest last but one.
enum class PhiloxIsa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kBest = 3 };
/// Whether this CPU runs `isa` (kBest: always).
bool PhiloxIsaSupported(PhiloxIsa isa);

/// Philox4x32-10 of `n` counters under one key, in place: counter i is
/// (w0[i], w1[i], w2[i], w3[i]) (structure of arrays). The same values as
/// Philox4x32_10 per counter, computed in vector lanes (AVX-512: 16 counters per
/// register, AVX2: 8, by the widest the CPU has; `isa` picks one for tests, an
/// unsupported one falls back to the widest): for bulk draws such as a mixture's
/// sources and a shuffle window's permutation.
void Philox4x32_10Lanes(uint32_t* w0, uint32_t* w1, uint32_t* w2, uint32_t* w3, int64_t n,
                        const uint32_t key[2], PhiloxIsa isa = PhiloxIsa::kBest);

/// For each p in [start, start + n): Philox4x32-10 of the counter (p's low word, p's
/// high word, c2, c3) under `key`, and out[p - start] = (word 0 << 32 | word 1) >> 11,
/// the draw's top 53 bits (a mixture's draws, mix/mix_draws.h). The same values as
/// Philox4x32_10 per counter, the counters made and the rounds run in AVX-512 or AVX2
/// registers by the widest the CPU has (only the 53 bits stored: no arrays of words in
/// and out).
void Philox53Bits(uint64_t start, int64_t n, uint32_t c2, uint32_t c3, const uint32_t key[2],
                  uint64_t* out, PhiloxIsa isa = PhiloxIsa::kBest);

/// A stream of random numbers: word i of the stream is a pure function of
/// (seed, purpose, id_a, id_b, i).
class CounterRng {
 public:
  CounterRng(uint64_t seed, RngPurpose purpose, uint32_t id_a, uint32_t id_b)
      : key_{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)},
        purpose_(static_cast<uint32_t>(purpose)),
        id_a_(id_a),
        id_b_(id_b) {}

  /// Return the stream of augmentation op `op` (its position in the column's pipeline)
  /// for the sample with global index `sample` in `epoch`. Counter layout: word 0 holds
  /// the op (bits 20..27) and the block index (bits 0..19), word 1 the purpose (bits
  /// 0..7) and the epoch (bits 8..31), words 2..3 the sample index.
  static CounterRng ForSample(uint64_t seed, int64_t epoch, int64_t sample, int op) {
    CounterRng rng(seed, RngPurpose::kAugment, static_cast<uint32_t>(sample),
                   static_cast<uint32_t>(static_cast<uint64_t>(sample) >> 32));
    rng.purpose_ = static_cast<uint32_t>(RngPurpose::kAugment) |
                   (static_cast<uint32_t>(epoch) << 8);
    rng.block_base_ = (static_cast<uint32_t>(op) & 0xff) << 20;
    return rng;
  }

  /// Return the stream of the row permutation of window `window` of `rank`'s plan in
  /// `epoch`: purpose kWindowRows with the rank's low 24 bits in bits 8..31 of the
  /// purpose word (rank 0's is CounterRng(seed, kWindowRows, epoch, window), as before
  /// 2026-12-06, when every rank used it: each rank's window w then took its rows at the
  /// same offsets, so rows sorted inside row groups moved the ranks' batches together).
  static CounterRng ForWindow(uint64_t seed, int64_t epoch, int64_t window, int64_t rank) {
    CounterRng rng(seed, RngPurpose::kWindowRows, static_cast<uint32_t>(epoch),
                   static_cast<uint32_t>(window));
    rng.purpose_ = static_cast<uint32_t>(RngPurpose::kWindowRows) |
                   (static_cast<uint32_t>(rank) << 8);
    return rng;
  }

  /// Return a uniform double in [0, 1) with 53 random bits.
  double UniformDouble() { return static_cast<double>(NextU64() >> 11) * 0x1.0p-53; }

  /// Return the next 32 random bits.
  uint32_t NextU32();

  /// Return the next 64 random bits.
  uint64_t NextU64() {
    uint64_t hi = NextU32();
    return (hi << 32) | NextU32();
  }

  /// Return a uniform integer in [0, n), without modulo bias. Requires n > 0.
  uint64_t Uniform(uint64_t n) { return UniformOf(*this, n); }

  /// Uniform(n) drawn from `rng`'s NextU64: Lemire's multiply-and-reject method on
  /// 64-bit draws, exact, rejection rare. Part of the determinism contract.
  template <typename Rng>
  static uint64_t UniformOf(Rng& rng, uint64_t n) {
    uint64_t x = rng.NextU64();
    __uint128_t m = static_cast<__uint128_t>(x) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = -n % n;
      while (low < threshold) {
        x = rng.NextU64();
        m = static_cast<__uint128_t>(x) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  uint32_t key_[2];
  uint32_t purpose_;
  uint32_t id_a_;
  uint32_t id_b_;
  uint32_t block_base_ = 0;   // high bits of counter word 0 (ForSample streams)
  uint32_t block_index_ = 0;  // counter word 0: which 4-word block
  uint32_t block_[4] = {0, 0, 0, 0};
  int used_ = 4;  // words of block_ already handed out
  friend class BulkCounterRng;
};

/// A CounterRng's stream from where that CounterRng stands (the same words, so the same
/// draws), computed kBlocks blocks at a time in vector lanes: for long runs of draws,
/// such as a shuffle window's permutation (one Uniform per row).
class BulkCounterRng {
 public:
  explicit BulkCounterRng(const CounterRng& stream) : stream_(stream), at_(stream.used_ - 4 + kWords) {
    // Words still unused in the stream's current block come first.
    for (int i = stream.used_; i < 4; ++i) words_[kWords - 4 + i] = stream.block_[i];
  }

  uint32_t NextU32() {
    if (at_ == kWords) Refill();
    return words_[at_++];
  }
  uint64_t NextU64() {
    uint64_t hi = NextU32();
    return (hi << 32) | NextU32();
  }
  uint64_t Uniform(uint64_t n) { return CounterRng::UniformOf(*this, n); }

 private:
  static constexpr int kBlocks = 256;
  static constexpr int kWords = 4 * kBlocks;
  void Refill();

  CounterRng stream_;  // its key, identity and next block
  uint32_t words_[kWords];
  int at_;  // words already handed out
};

/// Draw a fresh seed from the operating system's entropy source.
uint64_t DrawFreshSeed();

}  // namespace pqloader
