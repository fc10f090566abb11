// PackPlan: how one rank's documents of one epoch fill fixed-length blocks of tokens.
//
// The rank's rows, in the epoch's order (EpochPlan), are documents; their tokens, each
// followed by an optional separator, form one stream; block k holds tokens
// [k * seq_len, (k + 1) * seq_len) of it, so a document may be split across blocks
// (documents longer than a block may instead be truncated to one). Everything is a pure
// function of (document lengths, the plan, the options): the same blocks for any number
// of workers, and any batch can be found without making the ones before it (exact
// resume). Every rank gets the same number of blocks: the count is equalised across
// ranks like rows are (drop the extra blocks, or pad with blocks of padding).
// Thread-safety: immutable after Make(); shareable.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <arrow/status.h>

#include "pqloader/pack/checkpointed_sums.h"
#include "pqloader/pack/document_lengths.h"
#include "pqloader/plan/epoch_plan.h"

namespace pqloader {

struct PackOptions {
  /// Index (in the dataset's selected columns) of the list column of tokens. Default:
  /// -1, no packing.
  int column = -1;
  /// Tokens per block. Required (> 0) when packing.
  int64_t seq_len = 0;
  /// Append `eos` after every document. Default: false.
  bool has_eos = false;
  int64_t eos = 0;
  /// Documents longer than a block keep only their first tokens (a block's worth,
  /// separator included: seq_len - 1 tokens and eos, so with has_eos seq_len must be at
  /// least 2); else they are split across blocks. Default: false.
  bool truncate = false;
  /// The token value of padding (the end of the last block). Default: 0.
  double pad_value = 0;

  /// A stable description, for fingerprints.
  std::string ToString() const;
};

/// OK when a batch of `batch_size` blocks of `seq_len` tokens fits the int32 offsets of
/// its cu_seqlens (2^31 - 1 tokens); else Invalid, the message starting with `who`
/// ("pack", "mix").
arrow::Status CheckPackedBatchFits(int64_t batch_size, int64_t seq_len, const std::string& who);

class PackPlan {
 public:
  /// Lay out the blocks of `plan` (one rank, one epoch). `drop_last`: a last block that
  /// is not full is dropped (else padded).
  static PackPlan Make(const EpochPlan& plan, const DocumentLengths& lengths,
                       const PackOptions& options, bool drop_last);
  /// The number of blocks every rank gets in the epoch of `options` (every rank's plan
  /// made from them, each rank reading its own documents once: shard_policy kNone): the
  /// fewest any rank fills (`policy` kDrop: the others' last blocks are dropped) or the
  /// most (kPad: the others end with blocks of padding).
  static int64_t EqualBlocks(const std::vector<int64_t>& split_rows, const PlanOptions& options,
                             int64_t epoch, const DocumentLengths& lengths,
                             const PackOptions& pack, ShardPolicy policy);

  /// Blocks this rank fills (the last may be partly padding).
  int64_t num_blocks() const { return num_blocks_; }
  /// Tokens of the rank's stream (documents and separators).
  int64_t num_tokens() const { return tokens_.total(); }
  /// The tokens stream position `p` adds (its document's, capped, plus the separator).
  int64_t TokensAt(int64_t p) const { return tokens_[p]; }
  /// The document's own tokens at position `p` (capped, without the separator).
  int64_t DocumentTokensAt(int64_t p) const;

  /// Where blocks [b0, b1) come from: stream positions [first, last), starting
  /// `offset` tokens into the document at `first`.
  struct Span {
    int64_t first = 0, last = 0, offset = 0;
  };
  Span BlocksSpan(int64_t b0, int64_t b1) const;

 private:
  int64_t seq_len_ = 0;
  bool has_eos_ = false;
  int64_t num_blocks_ = 0;
  // The tokens of each stream position (<= 2^31: a document's, capped, and its separator),
  // with checkpointed sums: 4.125 bytes a document of the rank, not 8.
  CheckpointedSums<uint32_t> tokens_;
};

}  // namespace pqloader
