#include "pqloader/random/philox.h"

#include <Random123/philox.h>
#include <immintrin.h>

#include <random>

#include "pqloader/util/avx512.h"
#include "pqloader/util/cpu_level.h"

namespace pqloader {

void Philox4x32_10(uint32_t counter[4], const uint32_t key[2]) {
  r123::Philox4x32_R<10> rng;
  r123::Philox4x32_R<10>::ctr_type c = {{counter[0], counter[1], counter[2], counter[3]}};
  r123::Philox4x32_R<10>::key_type k = {{key[0], key[1]}};
  auto r = rng(c, k);
  for (int i = 0; i < 4; ++i) counter[i] = r.v[i];
}

namespace {

// Random123's Philox4x32 constants: the round multipliers and the key's bumps.
constexpr uint32_t kM0 = 0xD2511F53, kM1 = 0xCD9E8D57;
constexpr uint32_t kBump0 = 0x9E3779B9, kBump1 = 0xBB67AE85;

// Counter i of n through the 10 rounds, one at a time (the baseline, and the lanes left
// over by the vector kernels).
void PhiloxScalar(uint32_t* w0, uint32_t* w1, uint32_t* w2, uint32_t* w3, int64_t n,
                  const uint32_t key[2]) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t c[4] = {w0[i], w1[i], w2[i], w3[i]};
    Philox4x32_10(c, key);
    w0[i] = c[0];
    w1[i] = c[1];
    w2[i] = c[2];
    w3[i] = c[3];
  }
}

PQLOADER_AVX512_BEGIN
// One Philox round on 16 lanes (words a, b, c, d; round keys k0, k1). It multiplies
// words 0 and 2 by its constants (32 x 32 -> 64 bits: vpmuludq on the even lanes, and on
// the odd ones shifted down) and xors the high halves with words 1 and 3 and the key.
__attribute__((target("avx512f"))) inline void PhiloxRoundAvx512(__m512i& a, __m512i& b, __m512i& c,
                                                                __m512i& d, __m512i k0, __m512i k1) {
  const __m512i m0 = _mm512_set1_epi32(static_cast<int>(kM0));
  const __m512i m1 = _mm512_set1_epi32(static_cast<int>(kM1));
  constexpr __mmask16 kOdd = 0xAAAA;
  const __m512i ae = _mm512_mul_epu32(a, m0), ao = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m0);
  const __m512i ce = _mm512_mul_epu32(c, m1), co = _mm512_mul_epu32(_mm512_srli_epi64(c, 32), m1);
  const __m512i lo0 = _mm512_mask_blend_epi32(kOdd, ae, _mm512_slli_epi64(ao, 32));
  const __m512i hi0 = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(ae, 32), ao);
  const __m512i lo1 = _mm512_mask_blend_epi32(kOdd, ce, _mm512_slli_epi64(co, 32));
  const __m512i hi1 = _mm512_mask_blend_epi32(kOdd, _mm512_srli_epi64(ce, 32), co);
  a = _mm512_ternarylogic_epi32(hi1, b, k0, 0x96);
  b = lo1;
  c = _mm512_ternarylogic_epi32(hi0, d, k1, 0x96);
  d = lo0;
}

// 16 counters per AVX-512 register, all 10 rounds in registers.
__attribute__((target("avx512f"))) void PhiloxAvx512(uint32_t* w0, uint32_t* w1, uint32_t* w2,
                                                     uint32_t* w3, int64_t n,
                                                     const uint32_t key[2]) {
  for (int64_t at = 0; at < n; at += 16) {
    const __mmask16 live = n - at >= 16 ? __mmask16{0xFFFF}
                                        : static_cast<__mmask16>((1u << (n - at)) - 1);
    __m512i a = _mm512_maskz_loadu_epi32(live, w0 + at);
    __m512i b = _mm512_maskz_loadu_epi32(live, w1 + at);
    __m512i c = _mm512_maskz_loadu_epi32(live, w2 + at);
    __m512i d = _mm512_maskz_loadu_epi32(live, w3 + at);
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
      PhiloxRoundAvx512(a, b, c, d, _mm512_set1_epi32(static_cast<int>(k0)),
                        _mm512_set1_epi32(static_cast<int>(k1)));
      k0 += kBump0;
      k1 += kBump1;
    }
    _mm512_mask_storeu_epi32(w0 + at, live, a);
    _mm512_mask_storeu_epi32(w1 + at, live, b);
    _mm512_mask_storeu_epi32(w2 + at, live, c);
    _mm512_mask_storeu_epi32(w3 + at, live, d);
  }
}

PQLOADER_AVX512_END

// One Philox round on 8 lanes (words a, b, c, d; round keys k0, k1).
__attribute__((target("avx2"))) inline void PhiloxRoundAvx2(__m256i& a, __m256i& b, __m256i& c,
                                                            __m256i& d, __m256i k0, __m256i k1) {
  const __m256i m0 = _mm256_set1_epi32(static_cast<int>(kM0));
  const __m256i m1 = _mm256_set1_epi32(static_cast<int>(kM1));
  const __m256i ae = _mm256_mul_epu32(a, m0), ao = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m0);
  const __m256i ce = _mm256_mul_epu32(c, m1), co = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), m1);
  const __m256i lo0 = _mm256_blend_epi32(ae, _mm256_slli_epi64(ao, 32), 0xAA);
  const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(ae, 32), ao, 0xAA);
  const __m256i lo1 = _mm256_blend_epi32(ce, _mm256_slli_epi64(co, 32), 0xAA);
  const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(ce, 32), co, 0xAA);
  a = _mm256_xor_si256(_mm256_xor_si256(hi1, b), k0);
  b = lo1;
  c = _mm256_xor_si256(_mm256_xor_si256(hi0, d), k1);
  d = lo0;
}

// The same with 8 counters per AVX2 register; the last n % 8 counters one at a time.
__attribute__((target("avx2"))) void PhiloxAvx2(uint32_t* w0, uint32_t* w1, uint32_t* w2,
                                                uint32_t* w3, int64_t n, const uint32_t key[2]) {
  const int64_t full = n - n % 8;
  for (int64_t at = 0; at < full; at += 8) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + at));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w1 + at));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w2 + at));
    __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w3 + at));
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
      PhiloxRoundAvx2(a, b, c, d, _mm256_set1_epi32(static_cast<int>(k0)),
                      _mm256_set1_epi32(static_cast<int>(k1)));
      k0 += kBump0;
      k1 += kBump1;
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w0 + at), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w1 + at), b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w2 + at), c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(w3 + at), d);
  }
  PhiloxScalar(w0 + full, w1 + full, w2 + full, w3 + full, n - full, key);
}

// (word 0 << 32 | word 1) >> 11 of 8 lanes, stored in lane order.
__attribute__((target("avx2"))) inline void Store53Avx2(__m256i a, __m256i b, uint64_t* out) {
  // Joined per lane: lanes 0, 1, 4, 5 (even) and 2, 3, 6, 7 (odd), then put in order.
  const __m256i even = _mm256_unpacklo_epi32(b, a), odd = _mm256_unpackhi_epi32(b, a);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_srli_epi64(_mm256_permute2x128_si256(even, odd, 0x20), 11));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 4),
                      _mm256_srli_epi64(_mm256_permute2x128_si256(even, odd, 0x31), 11));
}

void Philox53One(uint64_t q, uint32_t c2, uint32_t c3, const uint32_t key[2], uint64_t* out) {
  uint32_t c[4] = {static_cast<uint32_t>(q), static_cast<uint32_t>(q >> 32), c2, c3};
  Philox4x32_10(c, key);
  *out = ((static_cast<uint64_t>(c[0]) << 32) | c[1]) >> 11;
}

// Philox53Bits' AVX2 kernel: 16 counters at a time in two independent sets of 8 lanes
// (one set's rounds are a chain of dependent multiplies; two keep the multipliers busy),
// the counters made in registers (a group of 16 whose high word changes inside is done
// one at a time), then words 0 and 1 of each lane joined and shifted.
__attribute__((target("avx2"))) void Philox53Avx2(uint64_t start, int64_t n, uint32_t c2,
                                                  uint32_t c3, const uint32_t key[2],
                                                  uint64_t* out) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i eight = _mm256_set1_epi32(8);
  int64_t at = 0;
  for (; at + 16 <= n; at += 16) {
    const uint64_t p = start + static_cast<uint64_t>(at);
    if ((p >> 32) != ((p + 15) >> 32)) {
      for (int64_t i = 0; i < 16; ++i) Philox53One(p + static_cast<uint64_t>(i), c2, c3, key, out + at + i);
      continue;
    }
    __m256i a0 = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(p))), lanes);
    __m256i a1 = _mm256_add_epi32(a0, eight);
    __m256i b0 = _mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(p >> 32))), b1 = b0;
    __m256i c0 = _mm256_set1_epi32(static_cast<int>(c2)), cc1 = c0;
    __m256i d0 = _mm256_set1_epi32(static_cast<int>(c3)), d1 = d0;
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
      const __m256i r0 = _mm256_set1_epi32(static_cast<int>(k0));
      const __m256i r1 = _mm256_set1_epi32(static_cast<int>(k1));
      PhiloxRoundAvx2(a0, b0, c0, d0, r0, r1);
      PhiloxRoundAvx2(a1, b1, cc1, d1, r0, r1);
      k0 += kBump0;
      k1 += kBump1;
    }
    Store53Avx2(a0, b0, out + at);
    Store53Avx2(a1, b1, out + at + 8);
  }
  for (; at < n; ++at) Philox53One(start + static_cast<uint64_t>(at), c2, c3, key, out + at);
}

PQLOADER_AVX512_BEGIN
// (word 0 << 32 | word 1) >> 11 of 16 lanes, stored in lane order.
__attribute__((target("avx512f"))) inline void Store53Avx512(__m512i a, __m512i b, uint64_t* out) {
  // Joined per lane within each 128-bit quarter: lanes 0, 1, 4, 5, ... (even) and 2, 3,
  // 6, 7, ... (odd), then put in order.
  const __m512i even = _mm512_unpacklo_epi32(b, a), odd = _mm512_unpackhi_epi32(b, a);
  const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const __m512i second = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  _mm512_storeu_si512(out, _mm512_srli_epi64(_mm512_permutex2var_epi64(even, first, odd), 11));
  _mm512_storeu_si512(out + 8, _mm512_srli_epi64(_mm512_permutex2var_epi64(even, second, odd), 11));
}

// Philox53Bits' AVX-512 kernel: Philox53Avx2's with 16 lanes a set, 32 counters at a time.
__attribute__((target("avx512f"))) void Philox53Avx512(uint64_t start, int64_t n, uint32_t c2,
                                                       uint32_t c3, const uint32_t key[2],
                                                       uint64_t* out) {
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i sixteen = _mm512_set1_epi32(16);
  int64_t at = 0;
  for (; at + 32 <= n; at += 32) {
    const uint64_t p = start + static_cast<uint64_t>(at);
    if ((p >> 32) != ((p + 31) >> 32)) {
      for (int64_t i = 0; i < 32; ++i) Philox53One(p + static_cast<uint64_t>(i), c2, c3, key, out + at + i);
      continue;
    }
    __m512i a0 = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(p))), lanes);
    __m512i a1 = _mm512_add_epi32(a0, sixteen);
    __m512i b0 = _mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(p >> 32))), b1 = b0;
    __m512i c0 = _mm512_set1_epi32(static_cast<int>(c2)), cc1 = c0;
    __m512i d0 = _mm512_set1_epi32(static_cast<int>(c3)), d1 = d0;
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
      const __m512i r0 = _mm512_set1_epi32(static_cast<int>(k0));
      const __m512i r1 = _mm512_set1_epi32(static_cast<int>(k1));
      PhiloxRoundAvx512(a0, b0, c0, d0, r0, r1);
      PhiloxRoundAvx512(a1, b1, cc1, d1, r0, r1);
      k0 += kBump0;
      k1 += kBump1;
    }
    Store53Avx512(a0, b0, out + at);
    Store53Avx512(a1, b1, out + at + 16);
  }
  // The rest (fewer than 32) by the AVX2 kernel.
  Philox53Avx2(start + static_cast<uint64_t>(at), n - at, c2, c3, key, out + at);
}
PQLOADER_AVX512_END

PhiloxIsa BestIsa() {
  static const PhiloxIsa isa = CurrentCpuLevel() == CpuLevel::kAvx512 ? PhiloxIsa::kAvx512
                               : CurrentCpuLevel() == CpuLevel::kAvx2   ? PhiloxIsa::kAvx2
                                                                        : PhiloxIsa::kScalar;
  return isa;
}

}  // namespace

bool PhiloxIsaSupported(PhiloxIsa isa) {
  return isa == PhiloxIsa::kBest || static_cast<int>(isa) <= static_cast<int>(BestIsa());
}

void Philox4x32_10Lanes(uint32_t* w0, uint32_t* w1, uint32_t* w2, uint32_t* w3, int64_t n,
                        const uint32_t key[2], PhiloxIsa isa) {
  if (isa == PhiloxIsa::kBest || !PhiloxIsaSupported(isa)) isa = BestIsa();
  switch (isa) {
    case PhiloxIsa::kAvx512: return PhiloxAvx512(w0, w1, w2, w3, n, key);
    case PhiloxIsa::kAvx2: return PhiloxAvx2(w0, w1, w2, w3, n, key);
    default: return PhiloxScalar(w0, w1, w2, w3, n, key);
  }
}

void Philox53Bits(uint64_t start, int64_t n, uint32_t c2, uint32_t c3, const uint32_t key[2],
                  uint64_t* out, PhiloxIsa isa) {
  if (isa == PhiloxIsa::kBest || !PhiloxIsaSupported(isa)) isa = BestIsa();
  if (isa == PhiloxIsa::kAvx512) return Philox53Avx512(start, n, c2, c3, key, out);
  if (isa == PhiloxIsa::kAvx2) return Philox53Avx2(start, n, c2, c3, key, out);
  for (int64_t i = 0; i < n; ++i) Philox53One(start + static_cast<uint64_t>(i), c2, c3, key, out + i);
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

void BulkCounterRng::Refill() {
  CounterRng& s = stream_;
  uint32_t w0[kBlocks], w1[kBlocks], w2[kBlocks], w3[kBlocks];
  for (int i = 0; i < kBlocks; ++i) {
    w0[i] = s.block_base_ | s.block_index_++;  // as CounterRng::NextU32 counts
    w1[i] = s.purpose_;
    w2[i] = s.id_a_;
    w3[i] = s.id_b_;
  }
  Philox4x32_10Lanes(w0, w1, w2, w3, kBlocks, s.key_);
  for (int i = 0; i < kBlocks; ++i) {
    words_[4 * i] = w0[i];
    words_[4 * i + 1] = w1[i];
    words_[4 * i + 2] = w2[i];
    words_[4 * i + 3] = w3[i];
  }
  at_ = 0;
}

uint64_t DrawFreshSeed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

}  // namespace pqloader
