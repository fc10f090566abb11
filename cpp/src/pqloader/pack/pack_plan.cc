#include "pqloader/pack/pack_plan.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "pqloader/util/exact_text.h"

namespace pqloader {

arrow::Status CheckPackedBatchFits(int64_t batch_size, int64_t seq_len, const std::string& who) {
  if (batch_size <= 0 || seq_len <= std::numeric_limits<int32_t>::max() / batch_size) {
    return arrow::Status::OK();
  }
  return arrow::Status::Invalid(who, ": batch_size x seq_len = ", batch_size, " x ", seq_len,
                                " tokens a batch, beyond the int32 offsets of its cu_seqlens "
                                "(2^31 - 1): use fewer blocks a batch or shorter ones");
}

namespace {

// The tokens a document of `length` adds to the stream.
int64_t StreamTokens(int64_t length, const PackOptions& o) {
  const int64_t sep = o.has_eos ? 1 : 0;
  if (o.truncate) length = std::min(length, std::max<int64_t>(0, o.seq_len - sep));
  return length + sep;
}

int64_t BlocksOf(int64_t tokens, int64_t seq_len, bool drop_last) {
  return tokens / seq_len + ((!drop_last && tokens % seq_len != 0) ? 1 : 0);
}

// Tokens of the rows `plan` gives its rank (order does not matter for the sum).
int64_t RankTokens(const EpochPlan& plan, const DocumentLengths& lengths, const PackOptions& o) {
  int64_t total = 0;
  for (const Unit& u : plan.units()) {
    if (!o.truncate) {
      total += lengths.Sum(u.split, u.row_begin, u.row_end) + (o.has_eos ? u.num_rows() : 0);
      continue;
    }
    for (int64_t r = u.row_begin; r < u.row_end; ++r) {
      total += StreamTokens(lengths.Length(u.split, r), o);
    }
  }
  return total;
}

}  // namespace

std::string PackOptions::ToString() const {
  std::ostringstream out;
  out.imbue(std::locale::classic());
  out << "pack(column=" << column << ", seq_len=" << seq_len;
  if (has_eos) out << ", eos=" << eos;
  out << ", truncate=" << truncate << ", pad=" << CompatibleText(pad_value) << ")";
  return out.str();
}

PackPlan PackPlan::Make(const EpochPlan& plan, const DocumentLengths& lengths,
                        const PackOptions& options, bool drop_last) {
  PackPlan p;
  p.seq_len_ = options.seq_len;
  p.has_eos_ = options.has_eos;
  std::vector<uint32_t> tokens;  // of each stream position (<= 2^31)
  tokens.reserve(static_cast<size_t>(plan.num_rows()));
  std::vector<RowRef> rows;
  // Window by window, so only one window's permutation and rows are held.
  for (int64_t w = 0; w < plan.num_windows(); ++w) {
    rows.clear();
    const auto perm = plan.WindowPermutation(w);
    const auto [first, last] = plan.WindowRowRange(w);
    plan.ResolveRows(first, last, [&](int64_t) -> const std::vector<uint32_t>& { return perm; },
                     &rows);
    for (const RowRef& r : rows) {
      const Unit& u = plan.units()[r.unit];
      tokens.push_back(static_cast<uint32_t>(
          StreamTokens(lengths.Length(u.split, u.row_begin + r.row), options)));
    }
  }
  p.tokens_.Assign(std::move(tokens));
  p.num_blocks_ = BlocksOf(p.tokens_.total(), options.seq_len, drop_last);
  return p;
}

int64_t PackPlan::EqualBlocks(const std::vector<int64_t>& split_rows, const PlanOptions& options,
                              int64_t epoch, const DocumentLengths& lengths,
                              const PackOptions& pack, ShardPolicy policy) {
  int64_t fewest = -1, most = 0;
  const auto order = EpochOrder::Make(split_rows, options, epoch);  // shared by every rank
  for (int64_t r = 0; r < options.world_size; ++r) {
    PlanOptions o = options;
    o.rank = r;
    const int64_t blocks = BlocksOf(RankTokens(EpochPlan::Make(o, epoch, order), lengths, pack),
                                    pack.seq_len, options.drop_last);
    fewest = fewest < 0 ? blocks : std::min(fewest, blocks);
    most = std::max(most, blocks);
  }
  return policy == ShardPolicy::kPad ? most : std::max<int64_t>(0, fewest);
}

int64_t PackPlan::DocumentTokensAt(int64_t p) const { return TokensAt(p) - (has_eos_ ? 1 : 0); }

PackPlan::Span PackPlan::BlocksSpan(int64_t b0, int64_t b1) const {
  // Only the blocks this rank fills: with drop_last its partial last block is not one of
  // them, and blocks past them (a "pad" rank's) are padding, not that block's documents
  // (they came back as its first padding block).
  const int64_t filled = std::min(tokens_.total(), num_blocks_ * seq_len_);
  const int64_t begin = std::min(b0 * seq_len_, filled);
  const int64_t end = std::min(b1 * seq_len_, filled);
  Span s;
  if (begin >= end) {
    s.first = s.last = tokens_.size();
    return s;
  }
  // The position whose tokens contain token `begin`, and the one after the last needed.
  s.first = tokens_.LastAtOrBelow(begin);
  s.last = tokens_.FirstAtOrAbove(end);
  s.offset = begin - tokens_.Before(s.first);
  return s;
}

}  // namespace pqloader
