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
  kWindowRows = 2,  ///< Row permutation of one shuffle window (id_a = epoch, id_b = window).
  kAugment = 3,     ///< Per-sample augmentation draws (see CounterRng::ForSample).
  kMixture = 4,     ///< Which source a mixture's position draws from (mix/mix_draws.h).
};

/// Apply Philox4x32 with 10 rounds to `counter` under `key`, in place.
void Philox4x32_10(uint32_t counter[4], const uint32_t key[2]);

/// Philox4x32-10 of `n` counters under one key, in place: counter i is
/// (w0[i], w1[i], w2[i], w3[i]) (structure of arrays). The same values as
/// Philox4x32_10 per counter, computed in vector lanes (AVX-512 or AVX2 where the CPU has it):
/// for bulk draws such as a mixture's sources.
void Philox4x32_10Lanes(uint32_t* w0, uint32_t* w1, uint32_t* w2, uint32_t* w3, int64_t n,
                        const uint32_t key[2]);

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
  uint64_t Uniform(uint64_t n);

 private:
  uint32_t key_[2];
  uint32_t purpose_;
  uint32_t id_a_;
  uint32_t id_b_;
  uint32_t block_base_ = 0;   // high bits of counter word 0 (ForSample streams)
  uint32_t block_index_ = 0;  // counter word 0: which 4-word block
  uint32_t block_[4] = {0, 0, 0, 0};
  int used_ = 4;  // words of block_ already handed out
};

/// Draw a fresh seed from the operating system's entropy source.
uint64_t DrawFreshSeed();

}  // namespace pqloader
