// Weighted mixing of several sources into one stream (pqloader.mix): which source each
// position of a mixture epoch draws from, and the row interleave of a batch.
//
// Position p of mixture epoch e draws from source i with probability weights[i]: one
// Philox4x32-10 block with counter (p low, p high, RngPurpose::kMixture, e low) under
// the seed's key; words 0..1 give a 53-bit uniform u, and the source is the first i with
// u < cumulative[i]. So a draw depends on (seed, epoch, position) only: any worker
// count, any resume point, every rank the same sequence (ranks differ in the rows each
// source's own shard gives). This layout is part of the determinism contract
// (docs/determinism.md, "Mixtures"). Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "pqloader/util/cancel.h"

namespace pqloader {

/// Cumulative probabilities of `weights` (positive, any scale), the last exactly 1.
std::vector<double> CumulativeWeights(const std::vector<double>& weights);

/// The draw's integer form: with k = the 53 bits of a draw (u = k * 2^-53), the source
/// is the number of thresholds <= k, threshold i being ceil(cumulative[i] * 2^53) for
/// i < n - 1: cumulative[i] <= u exactly when threshold i <= k (both sides scaled by a
/// power of two, so without rounding). Bulk draws compare integers.
std::vector<uint64_t> DrawThresholds(const std::vector<double>& cumulative);

/// The source of position `position` of mixture epoch `epoch`.
int DrawSource(uint64_t seed, int64_t epoch, int64_t position,
               const std::vector<double>& cumulative);

/// Sources of positions [start, start + count) into out[0, count).
void DrawSources(uint64_t seed, int64_t epoch, int64_t start, int64_t count,
                 const std::vector<double>& cumulative, int32_t* out);

/// Draws of each source among positions [start, end) ([0, end) without `start`).
std::vector<int64_t> CountDraws(uint64_t seed, int64_t epoch, int64_t end,
                                const std::vector<double>& cumulative);
std::vector<int64_t> CountDraws(uint64_t seed, int64_t epoch, int64_t start, int64_t end,
                                const std::vector<double>& cumulative);

/// The first position in [0, end) that draws a source i with wanted[i] != 0, `end` if
/// none does; -1 once `cancel` is set (checked every few thousand draws: `end` may be
/// a trillion samples, and no wanted source may ever be drawn).
int64_t FirstDrawOf(uint64_t seed, int64_t epoch, int64_t end,
                    const std::vector<double>& cumulative, const std::vector<uint8_t>& wanted,
                    const CancelFlag& cancel = nullptr);

/// The length of a mixture epoch that ends when a source runs out: with `until_all`
/// false, the first position whose draw would need row rows[i] of its source i (the
/// first source exhausted); with `until_all`, the first position after which every
/// source i has been drawn at least rows[i] times (the last source exhausted). Sources
/// with no rows make a "first" epoch empty and are ignored by "last"; sources of weight 0
/// (never drawn) neither end a "first" epoch nor are waited for by "last". At most `limit`.
/// With `kept`, it receives the sources of positions [0, length), a byte each (the
/// draws made to find the length, which the epoch's batches then need not draw again:
/// MixStreamOptions::kept_draws), if there are at most 256 sources and the length is at
/// most `max_kept`; else it is left empty. -1 (and `kept` empty) once `cancel` is set:
/// it is checked every few thousand draws (a skewed mixture may draw up to `limit`,
/// billions, seconds to minutes).
int64_t EpochLengthUntilExhausted(uint64_t seed, int64_t epoch,
                                  const std::vector<double>& cumulative,
                                  const std::vector<int64_t>& rows, bool until_all,
                                  int64_t limit,
                                  std::vector<uint8_t>* kept = nullptr, int64_t max_kept = 0,
                                  const CancelFlag& cancel = nullptr);

/// One column of a mixed batch: its output rows and, per piece, where that piece's rows
/// of this column are.
struct InterleaveColumn {
  uint8_t* out = nullptr;
  int64_t row_bytes = 0;
  std::vector<const uint8_t*> pieces;  ///< One pointer per piece (InterleavePlan order).
};

/// Where each row of a mixed batch comes from. Pieces hold the rows of one source each
/// (piece_sources[k]), a source's pieces taken in order; the pieces must hold enough rows
/// of every source drawn. Rows are counted across the pieces, piece 0's first: piece k's
/// rows are [first[k], first[k + 1]), of which its first used[k] are drawn.
struct InterleavePlan {
  std::vector<int32_t> piece;   ///< Row r's piece.
  std::vector<int32_t> index;   ///< Row r's row, counted across the pieces.
  std::vector<int64_t> first;   ///< Per piece, + the total at the end.
  std::vector<int64_t> used;    ///< Per piece.
  /// Row r's row within its piece.
  int64_t row(int64_t r) const { return index[r] - first[piece[r]]; }
  static InterleavePlan Make(const std::vector<int64_t>& piece_rows,
                             const std::vector<int32_t>& piece_sources, const int32_t* sources,
                             int64_t rows);
  /// The same plan made in place, reusing this one's memory (a stream's plan per batch
  /// allocates nothing once its vectors have grown).
  void Reset(const std::vector<int64_t>& piece_rows, const std::vector<int32_t>& piece_sources,
             const int32_t* sources, int64_t rows);

 private:
  // Per source while planning: its current piece (-1: none yet), the next row of it and
  // its end (counted across the pieces), and where to look for its next piece.
  std::vector<int32_t> current_;
  std::vector<int64_t> next_, end_;
  std::vector<std::size_t> scan_;
};

/// Fill every column's output: row r of column c is row plan.row(r) of piece
/// plan.piece[r] of that column (typed loads for 1/2/4/8-byte rows, memcpy otherwise).
void InterleaveRows(const InterleavePlan& plan, std::vector<InterleaveColumn>& columns);

}  // namespace pqloader
