#include "pqloader/random/philox.h"

#include <Random123/philox.h>

#include <algorithm>
#include <random>

#include "pqloader/util/target_clones.h"

namespace pqloader {

void Philox4x32_10(uint32_t counter[4], const uint32_t key[2]) {
  r123::Philox4x32_R<10> rng;
  r123::Philox4x32_R<10>::ctr_type c = {{counter[0], counter[1], counter[2], counter[3]}};
  r123::Philox4x32_R<10>::key_type k = {{key[0], key[1]}};
  auto r = rng(c, k);
  for (int i = 0; i < 4; ++i) counter[i] = r.v[i];
}

namespace {

// One block of lanes through the 10 rounds (Random123's Philox4x32_R<10>: round r
// uses the key bumped r times). Written lane-wise so the compiler vectorises it (the
// 32x32->64 multiplies become vpmuludq), in AVX-512 or AVX2 where the CPU has them.
constexpr int kLanes = 64;

__attribute__((always_inline)) inline void PhiloxBlock(uint32_t* __restrict w0,
                                                        uint32_t* __restrict w1,
                                                        uint32_t* __restrict w2,
                                                        uint32_t* __restrict w3, int n,
                                                        uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    for (int i = 0; i < n; ++i) {
      const uint64_t p0 = uint64_t{0xD2511F53} * w0[i];
      const uint64_t p1 = uint64_t{0xCD9E8D57} * w2[i];
      const uint32_t a = static_cast<uint32_t>(p1 >> 32) ^ w1[i] ^ k0;
      const uint32_t b = static_cast<uint32_t>(p1);
      const uint32_t c = static_cast<uint32_t>(p0 >> 32) ^ w3[i] ^ k1;
      const uint32_t d = static_cast<uint32_t>(p0);
      w0[i] = a;
      w1[i] = b;
      w2[i] = c;
      w3[i] = d;
    }
    k0 += 0x9E3779B9;
    k1 += 0xBB67AE85;
  }
}

// One body, compiled for AVX-512, AVX2 and the baseline; the loader picks the clone the
// CPU runs (util/target_clones.h).
PQLOADER_TARGET_CLONES("avx512f", "avx2", "default") void PhiloxLanes(
    uint32_t* w0, uint32_t* w1, uint32_t* w2, uint32_t* w3, int64_t n, uint32_t k0, uint32_t k1) {
  for (int64_t at = 0; at < n; at += kLanes) {
    const int m = static_cast<int>(std::min<int64_t>(kLanes, n - at));
    PhiloxBlock(w0 + at, w1 + at, w2 + at, w3 + at, m, k0, k1);
  }
}

}  // namespace

void Philox4x32_10Lanes(uint32_t* w0, uint32_t* w1, uint32_t* w2, uint32_t* w3, int64_t n,
                        const uint32_t key[2]) {
  PhiloxLanes(w0, w1, w2, w3, n, key[0], key[1]);
}

uint32_t CounterRng::NextU32() {
  if (used_ == 4) {
    block_[0] = block_base_ | block_index_++;
    block_[1] = purpose_;
    block_[2] = id_a_;
    block_[3] = id_b_;
    Philox4x32_10(block_, key_);
    used_ = 0;
  }
  return block_[used_++];
}

uint64_t CounterRng::Uniform(uint64_t n) {
  // Lemire's multiply-and-reject method on 64-bit draws: exact, and rejection is rare.
  uint64_t x = NextU64();
  __uint128_t m = static_cast<__uint128_t>(x) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = -n % n;
    while (low < threshold) {
      x = NextU64();
      m = static_cast<__uint128_t>(x) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

uint64_t DrawFreshSeed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace pqloader
