#include "pqloader/mix/mix_draws.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "pqloader/random/philox.h"
#include "pqloader/tensor/group_rows.h"

namespace pqloader {

std::vector<double> CumulativeWeights(const std::vector<double>& weights) {
  double total = 0;
  for (double w : weights) total += w;
  std::vector<double> out;
  double running = 0;
  for (double w : weights) {
    running += w;
    out.push_back(running / total);
  }
  if (!out.empty()) out.back() = 1.0;
  return out;
}

std::vector<uint64_t> DrawThresholds(const std::vector<double>& cumulative) {
  std::vector<uint64_t> out;
  for (size_t i = 0; i + 1 < cumulative.size(); ++i) {
    out.push_back(static_cast<uint64_t>(std::ceil(cumulative[i] * 0x1.0p53)));
  }
  return out;
}

namespace {

// The first i with u < cumulative[i] (the last source if none): as cumulative does not
// decrease, the number of i < n - 1 with cumulative[i] <= u. Counted without branches,
// which a random u would mispredict half the time.
int Pick(uint64_t bits, const double* cumulative, int n) {
  const double u = static_cast<double>(bits >> 11) * 0x1.0p-53;
  int s = 0;
  for (int i = 0; i < n - 1; ++i) s += cumulative[i] <= u ? 1 : 0;
  return s;
}

// Draws per call of the lane-wise Philox: a few KiB of stack, enough lanes to vectorise.
constexpr int64_t kBlock = 1024;

// out[i] = the number of thresholds <= k[i], for i in [0, n).
void CountThresholds(const uint64_t* k, int64_t n, const std::vector<uint64_t>& thresholds,
                     int32_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    int32_t s = 0;
    for (const uint64_t t : thresholds) s += k[i] >= t ? 1 : 0;
    out[i] = s;
  }
}

// The same, 4 draws per AVX2 compare
// (k and the thresholds are below 2^53: signed compares are exact).
__attribute__((target("avx2"))) void CountThresholdsAvx2(const uint64_t* k, int64_t n,
                                                         const std::vector<uint64_t>& thresholds,
                                                         int32_t* out) {
  const __m256i pick = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  const __m256i all = _mm256_set1_epi64x(static_cast<long long>(thresholds.size()));
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k + i));
    __m256i s = all;  // each threshold above k takes one off (a compare's true is -1)
    for (const uint64_t t : thresholds) {
      s = _mm256_add_epi64(s, _mm256_cmpgt_epi64(_mm256_set1_epi64x(static_cast<long long>(t)), v));
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(s, pick)));
  }
  CountThresholds(k + i, n - i, thresholds, out + i);
}

// The sources of positions [start, start + count), count <= kBlock, by the thresholds of
// DrawThresholds (the same as Pick, compared as integers: vectorised).
void DrawBlock(uint64_t seed, int64_t epoch, int64_t start, int64_t count,
               const std::vector<uint64_t>& thresholds, int32_t* out) {
  uint64_t k[kBlock];
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  Philox53Bits(static_cast<uint64_t>(start), count, static_cast<uint32_t>(RngPurpose::kMixture),
               static_cast<uint32_t>(epoch), key, k);
  if (HasAvx2()) return CountThresholdsAvx2(k, count, thresholds, out);
  CountThresholds(k, count, thresholds, out);
}

// Call fn(drawn, at, m) for the draws of positions [start, end), kBlock at a time
// (drawn[i] is position at + i); stop early when fn returns false.
template <typename Fn>
void ForEachDrawBlock(uint64_t seed, int64_t epoch, int64_t start, int64_t end,
                      const std::vector<double>& cumulative, Fn&& fn) {
  const std::vector<uint64_t> thresholds = DrawThresholds(cumulative);
  int32_t drawn[kBlock];
  for (int64_t at = start; at < end; at += kBlock) {
    const int64_t m = std::min(kBlock, end - at);
    DrawBlock(seed, epoch, at, m, thresholds, drawn);
    if (!fn(static_cast<const int32_t*>(drawn), at, m)) return;
  }
}

}  // namespace

int DrawSource(uint64_t seed, int64_t epoch, int64_t position,
               const std::vector<double>& cumulative) {
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  uint32_t counter[4] = {static_cast<uint32_t>(position),
                         static_cast<uint32_t>(static_cast<uint64_t>(position) >> 32),
                         static_cast<uint32_t>(RngPurpose::kMixture),
                         static_cast<uint32_t>(epoch)};
  Philox4x32_10(counter, key);
  return Pick((static_cast<uint64_t>(counter[0]) << 32) | counter[1], cumulative.data(),
              static_cast<int>(cumulative.size()));
}

void DrawSources(uint64_t seed, int64_t epoch, int64_t start, int64_t count,
                 const std::vector<double>& cumulative, int32_t* out) {
  const std::vector<uint64_t> thresholds = DrawThresholds(cumulative);
  for (int64_t at = 0; at < count; at += kBlock) {  // straight into `out`
    DrawBlock(seed, epoch, start + at, std::min(kBlock, count - at), thresholds, out + at);
  }
}

std::vector<int64_t> CountDraws(uint64_t seed, int64_t epoch, int64_t end,
                                const std::vector<double>& cumulative) {
  return CountDraws(seed, epoch, 0, end, cumulative);
}

std::vector<int64_t> CountDraws(uint64_t seed, int64_t epoch, int64_t start, int64_t end,
                                const std::vector<double>& cumulative) {
  std::vector<int64_t> counts(cumulative.size(), 0);
  ForEachDrawBlock(seed, epoch, start, end, cumulative, [&](const int32_t* drawn, int64_t, int64_t m) {
    for (int64_t i = 0; i < m; ++i) ++counts[drawn[i]];
    return true;
  });
  return counts;
}

int64_t FirstDrawOf(uint64_t seed, int64_t epoch, int64_t end,
                    const std::vector<double>& cumulative, const std::vector<uint8_t>& wanted,
                    const CancelFlag& cancel) {
  int64_t first = end;
  ForEachDrawBlock(seed, epoch, 0, end, cumulative, [&](const int32_t* drawn, int64_t at, int64_t m) {
    if ((at & 0xFFFF) == 0 && IsCancelled(cancel)) {  // every 64 blocks
      first = -1;
      return false;
    }
    for (int64_t i = 0; i < m; ++i) {
      if (wanted[static_cast<size_t>(drawn[i])] != 0) {
        first = at + i;
        return false;
      }
    }
    return true;
  });
  return first;
}

int64_t EpochLengthUntilExhausted(uint64_t seed, int64_t epoch,
                                  const std::vector<double>& cumulative,
                                  const std::vector<int64_t>& source_rows, bool until_all,
                                  int64_t limit, std::vector<uint8_t>* kept, int64_t max_kept,
                                  const CancelFlag& cancel) {
  if (kept != nullptr) kept->clear();
  // A source of weight 0 is never drawn: "last" does not wait for it (the epoch ran to
  // `limit`), and "first" is not ended by it (as if it had no end).
  std::vector<int64_t> rows = source_rows;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (cumulative[i] <= (i > 0 ? cumulative[i - 1] : 0.0)) rows[i] = until_all ? 0 : INT64_MAX;
  }
  bool keep = kept != nullptr && rows.size() <= 256 && max_kept > 0;
  std::vector<int64_t> counts(rows.size(), 0);
  int64_t unfinished = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] <= 0 && !until_all) return 0;
    if (rows[i] > 0) ++unfinished;
  }
  if (until_all && unfinished == 0) return 0;
  int64_t length = limit;
  // Up to this many sources, each block's draws are counted per source first (one
  // vectorised pass per source) and scanned draw by draw only if the epoch may end in
  // it: the draws' cost, not a dependent count per draw.
  constexpr size_t kCountedSources = 16;
  const size_t n = rows.size();
  std::vector<int64_t> block(n, 0);
  ForEachDrawBlock(seed, epoch, 0, limit, cumulative, [&](const int32_t* drawn, int64_t at, int64_t m) {
    if ((at & 0xFFFF) == 0 && IsCancelled(cancel)) {  // every 64 blocks
      length = -1;
      return false;
    }
    if (keep && at > max_kept) {  // the length is past max_kept: nothing is kept
      keep = false;
      kept->clear();
      kept->shrink_to_fit();
    }
    if (keep) kept->insert(kept->end(), drawn, drawn + m);  // (each below 256)
    if (n <= kCountedSources) {
      for (size_t s = 0; s < n; ++s) {
        int64_t c = 0;
        for (int64_t i = 0; i < m; ++i) c += drawn[i] == static_cast<int32_t>(s) ? 1 : 0;
        block[s] = c;
      }
      bool may_end = until_all;
      for (size_t s = 0; s < n; ++s) {
        if (until_all) {
          if (rows[s] > 0 && counts[s] + block[s] < rows[s]) may_end = false;
        } else if (counts[s] + block[s] > rows[s]) {
          may_end = true;
        }
      }
      if (!may_end) {
        for (size_t s = 0; s < n; ++s) counts[s] += block[s];
        return true;
      }
    }
    if (until_all) {
      unfinished = 0;
      for (size_t s = 0; s < n; ++s) unfinished += rows[s] > 0 && counts[s] < rows[s] ? 1 : 0;
    }
    for (int64_t i = 0; i < m; ++i) {
      const int s = drawn[i];
      if (!until_all && counts[s] == rows[s]) {
        length = at + i;
        return false;
      }
      if (++counts[s] == rows[s] && until_all && --unfinished == 0) {
        length = at + i + 1;
        return false;
      }
    }
    return true;
  });
  if (keep && length >= 0 && length <= max_kept) {
    kept->resize(static_cast<size_t>(length));
  } else if (kept != nullptr) {
    kept->clear();
    kept->shrink_to_fit();
  }
  return length;
}

InterleavePlan InterleavePlan::Make(const std::vector<int64_t>& piece_rows,
                                   const std::vector<int32_t>& piece_sources,
                                   const int32_t* sources, int64_t rows) {
  InterleavePlan plan;
  plan.Reset(piece_rows, piece_sources, sources, rows);
  return plan;
}

void InterleavePlan::Reset(const std::vector<int64_t>& piece_rows,
                           const std::vector<int32_t>& piece_sources, const int32_t* sources,
                           int64_t rows) {
  const size_t pieces = piece_rows.size();
  int32_t num_sources = 0;
  for (int32_t s : piece_sources) num_sources = std::max(num_sources, s + 1);
  const auto n = static_cast<size_t>(num_sources);
  first.assign(pieces + 1, 0);
  for (size_t k = 0; k < pieces; ++k) first[k + 1] = first[k] + piece_rows[k];
  current_.assign(n, -1);
  next_.assign(n, 0);
  end_.assign(n, 0);
  scan_.assign(n, 0);
  piece.resize(static_cast<size_t>(rows));
  index.resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t s = sources[r];
    while (next_[s] == end_[s]) {  // the source's next piece (rarely: a batch's worth)
      size_t k = scan_[s];
      while (piece_sources[k] != s) ++k;
      scan_[s] = k + 1;
      current_[s] = static_cast<int32_t>(k);
      next_[s] = first[k];
      end_[s] = first[k + 1];
    }
    piece[r] = current_[s];
    index[r] = static_cast<int32_t>(next_[s]++);
  }
  // A source's pieces before its current one are used whole, those after not at all.
  used.assign(pieces, 0);
  for (size_t k = 0; k < pieces; ++k) {
    const int32_t s = piece_sources[k];
    if (current_[s] < 0 || k > static_cast<size_t>(current_[s])) continue;
    used[k] = static_cast<int32_t>(k) == current_[s] ? next_[s] - first[k] : piece_rows[k];
  }
}

namespace {

template <typename T>
void Gather(const InterleavePlan& plan, const InterleaveColumn& c) {
  T* out = reinterpret_cast<T*>(c.out);
  const auto* pieces = reinterpret_cast<const T* const*>(c.pieces.data());
  const size_t n = plan.piece.size();
  for (size_t r = 0; r < n; ++r) {
    const int32_t k = plan.piece[r];
    std::memcpy(out + r, pieces[k] + (plan.index[r] - plan.first[k]), sizeof(T));
  }
}


// Columns of 4 or 8 bytes, K = kGroupBytes / W of them: each piece's drawn rows (its
// first ones) interleaved into 32-byte rows at the piece's place in the plan's count,
// then gathered back into the columns by the plan's index, one load per row
// (tensor/group_rows.h).
template <int W>
void InterleaveGroupOfColumns(const InterleaveColumn* cols, const InterleavePlan& plan) {
  constexpr int64_t K = kGroupBytes / W;
  thread_local std::vector<uint8_t> staging;
  staging.resize(static_cast<size_t>(plan.first.back() * kGroupBytes));
  const uint8_t* src[K];
  for (size_t k = 0; k < plan.used.size(); ++k) {
    if (plan.used[k] == 0) continue;
    for (int64_t j = 0; j < K; ++j) src[j] = cols[j].pieces[k];
    InterleaveGroup<W>(src, plan.used[k], staging.data() + plan.first[k] * kGroupBytes);
  }
  uint8_t* dst[K];
  for (int64_t j = 0; j < K; ++j) dst[j] = cols[j].out;
  GatherGroupRows<W>(staging.data(), plan.index.data(), static_cast<int64_t>(plan.index.size()), dst);
}

}  // namespace

void InterleaveRows(const InterleavePlan& plan, std::vector<InterleaveColumn>& columns) {
  const auto n = static_cast<int64_t>(plan.piece.size());
  // Runs of K columns of 4 or 8 bytes with the same pieces go in groups (with AVX2);
  // the rest row by row.
  thread_local std::vector<uint8_t> grouped;
  grouped.assign(columns.size(), 0);
  if (HasAvx2() && n > 0) {
    const size_t pieces = plan.used.size();
    for (size_t c = 0; c < columns.size();) {
      const int64_t w = columns[c].row_bytes;
      const auto k = static_cast<size_t>(w == 4 || w == 8 ? kGroupBytes / w : 0);
      bool run = k > 0 && c + k <= columns.size();
      for (size_t j = c; run && j < c + k; ++j) {
        run = columns[j].row_bytes == w && columns[j].pieces.size() == pieces;
      }
      if (!run) {
        ++c;
        continue;
      }
      if (w == 4) {
        InterleaveGroupOfColumns<4>(&columns[c], plan);
      } else {
        InterleaveGroupOfColumns<8>(&columns[c], plan);
      }
      std::fill(grouped.begin() + c, grouped.begin() + c + k, uint8_t{1});
      c += k;
    }
    StreamFence();  // the groups' streamed stores, before the batch is handed on
  }
  for (size_t i = 0; i < columns.size(); ++i) {
    if (grouped[i] != 0) continue;
    const InterleaveColumn& c = columns[i];
    switch (c.row_bytes) {
      case 1: Gather<uint8_t>(plan, c); break;
      case 2: Gather<uint16_t>(plan, c); break;
      case 4: Gather<uint32_t>(plan, c); break;
      case 8: Gather<uint64_t>(plan, c); break;
      default:
        for (size_t r = 0; r < plan.piece.size(); ++r) {
          std::memcpy(c.out + r * c.row_bytes,
                      c.pieces[plan.piece[r]] + plan.row(static_cast<int64_t>(r)) * c.row_bytes,
                      static_cast<size_t>(c.row_bytes));
        }
    }
  }
}

}  // namespace pqloader
