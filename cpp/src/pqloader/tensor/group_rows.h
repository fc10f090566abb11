// Columns of one width moved as rows of 32 bytes (8 columns of 4 bytes or 4 of 8):
// interleaved into rows by 8x8 or 4x4 transposes, and gathered back into columns one
// 32-byte load per row. A shuffled gather is bound by its loads, so this takes one load
// per 8 or 4 values where a column-by-column gather takes one per value. Used by the
// window gather (tensor/window_gather.cc) and the mixture's interleave (mix/).
// AVX2 only: callers check HasAvx2() and keep a path without it. Moves bits only.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "pqloader/util/cpu_level.h"  // HasAvx2

namespace pqloader {

/// The bytes of a group's row. Wider rows were slower (a window's staging of 64-byte
/// rows of a window does not stay in the L3; docs/performance.md, ninth session).
inline constexpr int64_t kGroupBytes = 32;

// The 8 x 8 transpose of 32-bit lanes (its own inverse): rows of 8 values of 8 columns
// to 8 values of each column, and back. Moves bits only.
__attribute__((target("avx2"))) inline void Transpose8x32(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// The 4 x 4 transpose of 64-bit lanes (its own inverse).
__attribute__((target("avx2"))) inline void Transpose4x64(__m256i r[4]) {
  const __m256i t0 = _mm256_unpacklo_epi64(r[0], r[1]), t1 = _mm256_unpackhi_epi64(r[0], r[1]);
  const __m256i t2 = _mm256_unpacklo_epi64(r[2], r[3]), t3 = _mm256_unpackhi_epi64(r[2], r[3]);
  r[0] = _mm256_permute2x128_si256(t0, t2, 0x20);
  r[1] = _mm256_permute2x128_si256(t1, t3, 0x20);
  r[2] = _mm256_permute2x128_si256(t0, t2, 0x31);
  r[3] = _mm256_permute2x128_si256(t1, t3, 0x31);
}

// The vector operations on rows of K = kGroupBytes / W lanes of W bytes: float lanes
// for W = 4 (the 8 x 8 transpose shuffles in the float domain), integer lanes for W = 8.
template <int W>
struct Lanes;
template <>
struct Lanes<4> {
  using V = __m256;
  __attribute__((target("avx2"))) static V Load(const uint8_t* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
  __attribute__((target("avx2"))) static void Store(uint8_t* p, V v) {
    _mm256_storeu_ps(reinterpret_cast<float*>(p), v);
  }
  __attribute__((target("avx2"))) static void Stream(uint8_t* p, V v) {
    _mm256_stream_ps(reinterpret_cast<float*>(p), v);
  }
  __attribute__((target("avx2"))) static void Transpose(V* v) { Transpose8x32(v); }
};
template <>
struct Lanes<8> {
  using V = __m256i;
  __attribute__((target("avx2"))) static V Load(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  __attribute__((target("avx2"))) static void Store(uint8_t* p, V v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v);
  }
  __attribute__((target("avx2"))) static void Stream(uint8_t* p, V v) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
  }
  __attribute__((target("avx2"))) static void Transpose(V* v) { Transpose4x64(v); }
};

// A block of K x K values of W bytes (K = kGroupBytes / W) transposed: row j read at
// src[j], column j written at dst[j] (kGroupBytes each).
template <int W>
__attribute__((target("avx2"))) inline void TransposeBlock(const uint8_t* const* src,
                                                          uint8_t* const* dst) {
  using L = Lanes<W>;
  constexpr int K = kGroupBytes / W;
  typename L::V v[K];
  for (int j = 0; j < K; ++j) v[j] = L::Load(src[j]);
  L::Transpose(v);
  for (int j = 0; j < K; ++j) L::Store(dst[j], v[j]);
}

// out row r (kGroupBytes) = value r of each of the K = kGroupBytes / W columns in
// `cols`, for rows [0, n).
template <int W>
__attribute__((target("avx2"))) inline void InterleaveGroup(const uint8_t* const* cols, int64_t n,
                                                     uint8_t* out) {
  constexpr int64_t K = kGroupBytes / W;
  const uint8_t* src[K];
  uint8_t* dst[K];
  int64_t r = 0;
  for (; r + K <= n; r += K) {
    for (int64_t j = 0; j < K; ++j) {
      src[j] = cols[j] + r * W;
      dst[j] = out + (r + j) * kGroupBytes;
    }
    TransposeBlock<W>(src, dst);
  }
  for (; r < n; ++r) {
    for (int64_t j = 0; j < K; ++j) std::memcpy(out + r * kGroupBytes + j * W, cols[j] + r * W, W);
  }
}

/// Orders GatherGroupRows' streamed (non-temporal) stores before every later store (the
/// release that publishes the gathered columns to another thread).
inline void StreamFence() { _mm_sfence(); }

/// Positions ahead whose rows GatherGroupRows prefetches: its loads are at random rows
/// of a staging larger than the L2, and the out-of-order window alone keeps too few of
/// them in flight (docs/performance.md, eighteenth session).
inline constexpr int64_t kGatherPrefetch = 128;

// Value i of column j of the group = value j of row index[i] of `rows`, for positions
// [i, n) in steps of 2K (K = kGroupBytes / W), as far as whole steps go; returns where it
// stopped. Each step reads and transposes two blocks of K rows and stores each column's
// 2K values (64 bytes) back to back. With kStream (every `cols[j] + i * W` 64-byte
// aligned) each column's two stores fill one cache line around the caches at once: for
// output written once and read only after the gather, where a normal store's read of the
// line first (and its eviction of the staging from the L3) is wasted. Stored a block at
// a time, each column's line stayed half written while the other columns' lines were
// stored, and the gather was slower (docs/performance.md, twenty-first session).
template <int W, bool kStream>
__attribute__((target("avx2"))) inline int64_t GatherSteps(const uint8_t* rows,
                                                          const int32_t* index, int64_t i,
                                                          int64_t n, uint8_t* const* cols,
                                                          int64_t indexed) {
  using L = Lanes<W>;
  constexpr int64_t K = kGroupBytes / W;
  constexpr int64_t kStep = 2 * K;
  auto row = [&](int64_t p) { return rows + static_cast<int64_t>(index[p]) * kGroupBytes; };
  for (; i + kStep <= n; i += kStep) {
    if (i + kGatherPrefetch + kStep <= indexed) {
      for (int64_t j = 0; j < kStep; ++j) {
        _mm_prefetch(reinterpret_cast<const char*>(row(i + kGatherPrefetch + j)), _MM_HINT_T0);
      }
    }
    typename L::V a[K], b[K];
    for (int64_t j = 0; j < K; ++j) a[j] = L::Load(row(i + j));
    for (int64_t j = 0; j < K; ++j) b[j] = L::Load(row(i + K + j));
    L::Transpose(a);
    L::Transpose(b);
    for (int64_t j = 0; j < K; ++j) {
      uint8_t* d = cols[j] + i * W;
      if constexpr (kStream) {
        L::Stream(d, a[j]);
        L::Stream(d + kGroupBytes, b[j]);
      } else {
        L::Store(d, a[j]);
        L::Store(d + kGroupBytes, b[j]);
      }
    }
  }
  return i;
}

// Value i of column j of the group = value j of row index[i] of `rows`, for i in [0, n).
// The rows kGatherPrefetch positions ahead are prefetched (`index` may be read up to
// position `indexed` - 1, `indexed` >= n: a caller gathering a window chunk by chunk
// lets the prefetch run on into the next chunk). Where every column is misaligned from
// 64 bytes by the same multiple of W bytes (a window's chunks are aligned; a mixture's
// rows start anywhere in a batch), the first positions are copied one by one up to the
// alignment and the rest stored non-temporally, a whole cache line of each column at a
// time: the caller fences them (StreamFence) once after all its calls, before another
// thread may read them.
template <int W>
__attribute__((target("avx2"))) inline void GatherGroupRows(const uint8_t* rows, const int32_t* index,
                                                     int64_t n, uint8_t* const* cols,
                                                     int64_t indexed = -1) {
  constexpr int64_t K = kGroupBytes / W;
  if (indexed < n) indexed = n;
  auto one = [&](int64_t i) {
    const uint8_t* row = rows + static_cast<int64_t>(index[i]) * kGroupBytes;
    for (int64_t j = 0; j < K; ++j) std::memcpy(cols[j] + i * W, row + j * W, W);
  };
  const auto misaligned = reinterpret_cast<uintptr_t>(cols[0]) % 64;
  bool stream = misaligned % W == 0;
  for (int64_t j = 1; j < K; ++j) stream = stream && reinterpret_cast<uintptr_t>(cols[j]) % 64 == misaligned;
  int64_t i = 0;
  if (stream) {
    for (const int64_t head = std::min<int64_t>(n, ((64 - misaligned) % 64) / W); i < head; ++i) one(i);
    i = GatherSteps<W, true>(rows, index, i, n, cols, indexed);
  } else {
    i = GatherSteps<W, false>(rows, index, i, n, cols, indexed);
  }
  for (; i < n; ++i) one(i);
}

}  // namespace pqloader
