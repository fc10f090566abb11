#include "pqloader/random/philox.h"

#include <Random123/philox.h>

#include <random>

namespace pqloader {

void Philox4x32_10(uint32_t counter[4], const uint32_t key[2]) {
  r123::Philox4x32_R<10> rng;
  r123::Philox4x32_R<10>::ctr_type c = {{counter[0], counter[1], counter[2], counter[3]}};
  r123::Philox4x32_R<10>::key_type k = {{key[0], key[1]}};
  auto r = rng(c, k);
  for (int i = 0; i < 4; ++i) counter[i] = r.v[i];
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
