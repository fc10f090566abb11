#!/usr/bin/env python3
"""Hand-made C++ mutants of the plan, pipeline, cache, Philox and batch code (`make mutants-cpp`).

Each mutant is one realistic bug: an exact snippet of a source file and what it becomes.
The script copies the C++ sources (cpp/, cmake/, examples/cpp/, CMakeLists.txt) into a scratch tree once
(build/mutants/src; later runs copy only files whose content changed), configures and
builds it once with the C++ tests (Release, no sanitizers, warnings not errors so that a
mutant that only warns is still tested), and checks that the whole ctest suite passes.
Then, per mutant: apply it to the scratch copy (the snippet must occur exactly once),
rebuild with ninja (only what depends on the file), run the whole ctest suite (a per-test
timeout turns a hang into a kill), record killed / survived / did-not-compile, and restore
the file. The working tree is never written.

A mutant that does not compile counts as neither killed nor survived (it is listed).
The kill rate is killed / (killed + survived); the exit status is 1 when it is below
--threshold (default 90 %).

    python tools/mutants/cpp_mutants.py [--only ID,ID] [--list] [--report FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import filecmp
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = "cpp/src/pqloader"


@dataclasses.dataclass(frozen=True)
class Mutant:
    id: str
    file: str  # relative to cpp/src/pqloader
    original: str
    replacement: str
    description: str


M = Mutant
MUTANTS: list[Mutant] = [
    # --- random/philox.cc ---------------------------------------------------------------
    M("philox-key-swap", "random/philox.cc",
      "k = {{key[0], key[1]}};", "k = {{key[1], key[0]}};",
      "Philox key words swapped (seed low/high)"),
    M("philox-seed-high-dropped", "random/philox.cc",
      "k = {{key[0], key[1]}};", "k = {{key[0], 0}};",
      "high 32 bits of the seed dropped from the key"),
    M("philox-counter-ids-swapped", "random/philox.cc",
      "block_[2] = id_a_;\n    block_[3] = id_b_;", "block_[2] = id_b_;\n    block_[3] = id_a_;",
      "counter words id_a / id_b swapped"),
    M("philox-purpose-dropped", "random/philox.cc",
      "block_[1] = purpose_;", "block_[1] = 0;",
      "purpose (and epoch of ForSample streams) left out of the counter"),
    M("philox-block-index-stuck", "random/philox.cc",
      "block_base_ | block_index_++", "block_base_ | block_index_",
      "block counter not advanced: every 4 words repeat"),
    M("philox-op-bits-dropped", "random/philox.cc",
      "block_base_ | block_index_++", "block_index_++",
      "augmentation op index (block base) left out of the counter"),
    M("philox-uniform-modulo", "random/philox.h",
      "return static_cast<uint64_t>(m >> 64);", "return x % n;",
      "Uniform(n) by modulo instead of Lemire's multiply (other values, biased)"),
    M("philox-uniform-32bit-draw", "random/philox.h",
      "    uint64_t x = rng.NextU64();\n    __uint128_t m", "    uint64_t x = rng.NextU32();\n    __uint128_t m",
      "Uniform(n) from a 32-bit draw in a 64-bit multiply"),
    # --- plan/epoch_plan.cc -------------------------------------------------------------
    M("plan-shuffle-sattolo", "plan/epoch_plan.cc",
      "rng.Uniform(static_cast<uint64_t>(i) + 1)", "rng.Uniform(static_cast<uint64_t>(i))",
      "Fisher-Yates off by one (Sattolo: an element never stays in place)"),
    M("plan-shuffle-skips-first", "plan/epoch_plan.cc",
      "i > 0; --i)", "i > 1; --i)",
      "Fisher-Yates loop stops one step early"),
    M("plan-split-order-epoch-ignored", "plan/epoch_plan.cc",
      "RngPurpose::kSplitOrder,\n                                                           static_cast<uint32_t>(epoch), 0)",
      "RngPurpose::kSplitOrder,\n                                                           0, 0)",
      "split order keyed without the epoch: same order every epoch"),
    M("plan-window-key-swapped", "plan/epoch_plan.cc",
      "CounterRng::ForWindow(options_.seed, epoch_, w, options_.rank)",
      "CounterRng::ForWindow(options_.seed, w, epoch_, options_.rank)",
      "window permutation key: epoch and window swapped"),
    M("plan-window-no-rank", "plan/epoch_plan.cc",
      "CounterRng::ForWindow(options_.seed, epoch_, w, options_.rank)",
      "CounterRng::ForWindow(options_.seed, epoch_, w, 0)",
      "every rank's window w shuffled alike (the rank left out of the key)"),
    M("plan-share-begin-no-rem", "plan/epoch_plan.cc",
      "options.rank * base + std::min(options.rank, rem)", "options.rank * base",
      "share start ignores the larger shares before it (overlap)"),
    M("plan-share-count-le", "plan/epoch_plan.cc",
      "base + (options.rank < rem ? 1 : 0)", "base + (options.rank <= rem ? 1 : 0)",
      "one rank too many gets the larger share"),
    M("plan-pad-target-always", "plan/epoch_plan.cc",
      "base + (rem > 0 ? 1 : 0)", "base + 1",
      "kPad pads every rank by one even when rows divide evenly"),
    M("plan-pad-borrow-row0", "plan/epoch_plan.cc",
      "count > 0 ? begin : options.rank % total", "count > 0 ? begin : 0",
      "empty share always borrows row 0"),
    M("plan-ceil-div", "plan/epoch_plan.cc",
      "return (a + b - 1) / b;", "return (a + b) / b;",
      "batch count rounds up one too many when rows divide evenly"),
    M("plan-search-skips-split", "plan/epoch_plan.cc",
      "i = i == 0 ? 0 : i - 1;", "i = i == 0 ? 0 : i;",
      "binary search starts after the split holding `begin`: rows skipped"),
    M("plan-empty-units", "plan/epoch_plan.cc",
      "if (lo < hi) units_.push_back(Unit{order[i]", "if (lo <= hi) units_.push_back(Unit{order[i]",
      "empty units appended at share edges"),
    M("plan-batch-range-unclamped", "plan/epoch_plan.cc",
      "return {first, std::min(first + options_.batch_size, num_rows_)};",
      "return {first, first + options_.batch_size};",
      "last batch's range runs past the rank's rows"),
    M("plan-unit-range-window-unshuffled", "plan/epoch_plan.cc",
      "const int64_t window = options_.shuffle ? options_.shuffle_window : 1;",
      "const int64_t window = options_.shuffle_window;",
      "batch unit range uses shuffle windows when not shuffling"),
    M("plan-unit-range-last", "plan/epoch_plan.cc",
      "(WindowOfRow(last - 1) + 1) * window", "(WindowOfRow(last) + 1) * window",
      "batch unit range off by one at its end (reads one window too many)"),
    M("plan-unit-of-offset-lower-bound", "plan/epoch_plan.cc",
      "auto it = std::upper_bound(unit_first_row_.begin()", "auto it = std::lower_bound(unit_first_row_.begin()",
      "row of a unit's first position resolved into the previous unit"),
    # --- plan/row_order.cc (elastic resume) ---------------------------------------------
    M("remainder-count-no-rem", "plan/row_order.cc",
      "each + (options.rank < rem ? 1 : 0)", "each",
      "elastic remainder: larger shares lose their extra position"),
    M("remainder-skips-a-batch", "plan/row_order.cc",
      "std::min(end, base.batches[r] * base.batch_size)",
      "std::min(end, (base.batches[r] + 1) * base.batch_size)",
      "elastic remainder starts one batch after what was consumed"),
    M("remainder-unit-offset", "plan/row_order.cc",
      "RowRef{s.unit_offset + (r.unit - s.lo), r.row}", "RowRef{s.unit_offset + r.unit, r.row}",
      "remainder order maps child units without their base"),
    # --- plan/split_uses.cc -------------------------------------------------------------
    M("split-uses-epoch-dropped", "plan/split_uses.cc",
      "static_cast<double>(epoch) + static_cast<double>(p) / n", "static_cast<double>(p) / n",
      "read clock of the plan policy without the epoch"),
    M("split-uses-next-read-lower-bound", "plan/split_uses.cc",
      "std::upper_bound(begin, end, after)", "std::lower_bound(begin, end, after)",
      "next read may be the read happening now"),
    M("split-uses-prefix-off-by-one", "plan/split_uses.cc",
      "++out.first_[s + 1];", "++out.first_[s];",
      "reads counted under the wrong split"),
    # --- exec/ordered_pipeline.h --------------------------------------------------------
    M("pipeline-batch-bytes-kept", "exec/ordered_pipeline.h",
      "    inflight_bytes_ -= node.mapped().bytes;\n", "",
      "a consumed batch's bytes are not released from the in-flight count"),
    M("pipeline-unit-bytes-kept", "exec/ordered_pipeline.h",
      "          inflight_bytes_ -= it->second.bytes;\n          units_.erase(it);",
      "          units_.erase(it);",
      "a freed unit's bytes are not released from the in-flight count"),
    M("pipeline-prefetch-plus-one", "exec/ordered_pipeline.h",
      "next_batch_ >= consumed_ + max_prefetch_batches_",
      "next_batch_ > consumed_ + max_prefetch_batches_",
      "one batch more assembled ahead than max_prefetch_batches"),
    M("pipeline-floor-not-advanced", "exec/ordered_pipeline.h",
      "needed_end_ = std::max(needed_end_, work_.batch_units(consumed_).second);",
      "(void)needed_end_;",
      "the floor (units the consumer needs now) never moves past the first batch"),
    M("pipeline-no-sticky-error", "exec/ordered_pipeline.h",
      "    if (!sticky_error_.ok()) return sticky_error_;\n    if (consumed_ >= work_.num_batches) return BatchPtr{};",
      "    if (consumed_ >= work_.num_batches) return BatchPtr{};",
      "after a failed batch, later Next() calls do not repeat its error"),
    M("pipeline-failed-unit-not-flagged", "exec/ordered_pipeline.h",
      "if (!slot.status.ok()) unit_failed_ = true;", "(void)unit_failed_;",
      "units after a failed one are still claimed"),
    M("pipeline-ratio-min", "exec/ordered_pipeline.h",
      "ratio_ = std::max(ratio_, static_cast<double>(slot.bytes)",
      "ratio_ = std::min(ratio_, static_cast<double>(slot.bytes)",
      "estimate scaling ignores units larger than estimated"),
    # --- exec/readahead.h ---------------------------------------------------------------
    M("readahead-cost-kept", "exec/readahead.h",
      "    held_cost_ -= it->second.second;\n", "",
      "a taken item's cost stays counted: read-ahead stalls"),
    M("readahead-window-plus-one", "exec/readahead.h",
      "    held_.erase(it);\n    while (next_ < end_ && static_cast<int64_t>(held_.size()) < options_.window",
      "    held_.erase(it);\n    while (next_ < end_ && static_cast<int64_t>(held_.size()) <= options_.window",
      "one item more started ahead than the window"),
    M("readahead-take-not-started", "exec/readahead.h",
      "while (next_ <= i && next_ < end_) StartNext();", "while (next_ < i && next_ < end_) StartNext();",
      "Take(i) does not start item i itself"),
    # --- cache/split_cache.cc -----------------------------------------------------------
    M("cache-checksum-ignored", "cache/split_cache.cc",
      "if (verify && !EntryChecksumMatches(", "if (false && !EntryChecksumMatches(",
      "disk cache reads do not verify the entry checksum"),
    M("cache-put-usage-not-added", "cache/split_cache.cc",
      "WriteUsage(usage_path, usage + size);", "WriteUsage(usage_path, usage);",
      "a published entry's size is not added to the shard's usage"),
    M("cache-remove-usage-kept", "cache/split_cache.cc",
      "if (usage >= 0) WriteUsage(usage_path, std::max<int64_t>(0, usage - st.st_size));",
      "if (usage >= 0) WriteUsage(usage_path, usage);",
      "a dropped corrupt entry's size is not subtracted from the shard's usage"),
    M("cache-evict-usage-kept", "cache/split_cache.cc",
      "      *usage -= files[i].size;\n", "",
      "an evicted entry's size is not subtracted from the shard's usage"),
    M("cache-admit-exact-fit", "cache/split_cache.cc",
      "if (budget <= 0 || usage + size <= budget) return a;", "if (budget <= 0 || usage + size < budget) return a;",
      "an entry that exactly fills the budget is treated as over it"),
    M("cache-lru-evicts-newest", "cache/split_cache.cc",
      "return held[x].last_use < held[y].last_use;", "return held[x].last_use > held[y].last_use;",
      "LRU evicts the most recently used entry first"),
    M("cache-plan-evicts-equal", "cache/split_cache.cc",
      "held[i].next_use <= next_use) break;", "held[i].next_use < next_use) break;",
      "plan policy evicts an entry read at the same time as the newcomer"),
    M("cache-plan-read-again", "cache/split_cache.cc",
      "if (used + size > budget || read_again > 1) {", "if (used + size > budget) {",
      "plan policy trades several entries read again for one newcomer"),
    M("cache-memory-lru-no-touch", "cache/split_cache.cc",
      "    lru_.splice(lru_.end(), lru_, it->second);  // most recently used last\n", "",
      "in-memory cache hits do not refresh the entry's recency"),
    M("cache-memory-evict-usage-kept", "cache/split_cache.cc",
      "          used_ -= entries[i]->size;\n", "",
      "in-memory eviction does not subtract the entry's size"),
    M("cache-stale-format", "cache/split_cache.cc",
      "const bool stale = head->version < 3 ||", "const bool stale = head->version < 2 ||",
      "entries of format 2 are not treated as stale"),
    # --- cache/entry_format.cc ----------------------------------------------------------
    M("entry-checksum-ignored", "cache/entry_format.cc",
      "if (!checksum_verified && XXH3_64bits(", "if (false && XXH3_64bits(",
      "ReadCacheEntry does not verify the checksum"),
    M("entry-key-unchecked", "cache/entry_format.cc",
      "  if (std::memcmp(head + 24, key.data(), std::min<size_t>(key.size(), kKeyBytes)) != 0 ||\n"
      "      static_cast<int64_t>(key.size()) != kKeyBytes) {",
      "  if (static_cast<int64_t>(key.size()) != kKeyBytes) {",
      "an entry of another key is accepted"),
    M("entry-decreasing-offsets", "cache/entry_format.cc",
      "if (off[r + 1] < off[r]) return", "if (false) return",
      "decreasing string offsets accepted"),
    M("entry-skipped-rows-lost", "cache/entry_format.cc",
      "l.meta.push_back(unit.skipped_rows);", "l.meta.push_back(0);",
      "skipped-row count not written"),
    M("entry-row-major-lost", "cache/entry_format.cc",
      "l.meta.push_back(rm ? rm->offset[c] : -1);", "l.meta.push_back(-1);",
      "row-major column offsets not written"),
    M("entry-source-unpadded", "cache/entry_format.cc",
      "kHeaderBytes + kSourceLengthBytes + AlignUp8(source_bytes)",
      "kHeaderBytes + kSourceLengthBytes + source_bytes",
      "metadata offset not padded after the source identity (format drift)"),
    M("entry-misaligned-accepted", "cache/entry_format.cc",
      "if (r.offset % kAlignment != 0) {", "if (false) {",
      "misaligned buffer references accepted"),
    # --- tensor/batch.cc ----------------------------------------------------------------
    M("batch-int8-unsigned", "tensor/batch.cc",
      "case DType::kInt8: return Load<int8_t>(p);", "case DType::kInt8: return Load<uint8_t>(p);",
      "int8 scalars loaded as unsigned"),
    M("batch-shape-string", "tensor/batch.cc",
      'out << (shape.size() == 1 ? ",)" : ")");', 'out << ")";',
      "1-d shapes printed without the trailing comma"),
    M("batch-layout-shape-unchecked", "tensor/batch.cc",
      "if (!same_shape && specs[c].kind == ColumnKind::kTensor) {", "if (false) {",
      "a unit's row shape is not checked against the column's"),
    M("batch-unit-bytes-no-offsets", "tensor/batch.cc",
      "    if (c.offsets) n += c.offsets->size();\n    for (const auto& s",
      "    for (const auto& s",
      "a unit's byte size leaves out its offsets"),
    # --- tensor/assemble.cc -------------------------------------------------------------
    M("assemble-run-merge", "tensor/assemble.cc",
      "runs.back().row + runs.back().count == rows[i].row", "runs.back().row + runs.back().count >= rows[i].row",
      "rows that go back are merged into a run"),
    M("assemble-zero-copy-offset", "tensor/assemble.cc",
      "arrow::SliceBuffer(c.data, r.row * row_bytes_[col], n_ * row_bytes_[col])",
      "arrow::SliceBuffer(c.data, r.row, n_ * row_bytes_[col])",
      "zero-copy slice starts at the row index, not its byte offset"),
    M("assemble-var-data-base", "tensor/assemble.cc",
      "std::memcpy(dst + off[i], c.data->data() + begin, end - begin);",
      "std::memcpy(dst + off[i], c.data->data(), end - begin);",
      "string bytes copied from the unit's start instead of the run's"),
    M("assemble-var-offsets-not-rebased", "tensor/assemble.cc",
      "off[i + 1] = off[i] + (s[r.row + k + 1] - s[r.row + k]);", "off[i + 1] = s[r.row + k + 1];",
      "string offsets copied from the unit without rebasing"),
    M("assemble-pad-truncate-side", "tensor/assemble.cc",
      "(c.truncate_left ? (row.length - kept) * element : 0)", "(c.truncate_left ? 0 : (row.length - kept) * element)",
      "truncation keeps the wrong end of a row"),
    M("assemble-pad-length-uncapped", "tensor/assemble.cc",
      "std::memcpy(&valid[i], &kept, sizeof(kept));", "std::memcpy(&valid[i], &row.length, sizeof(kept));",
      "pad lengths report the untruncated row length"),
    M("assemble-pad-multiple-floor", "tensor/assemble.cc",
      "length = (length + m - 1) / m * m;", "length = length / m * m;",
      "pad length rounded down to the multiple"),
    M("assemble-row-major-tile", "tensor/assemble.cc",
      "dst_[col] + i0 * w, w);", "dst_[col], w);",
      "row-major gather writes every tile over the first"),
    # --- tensor/window_gather.cc --------------------------------------------------------
    M("gather-index-unit-base", "tensor/window_gather.cc",
      "const int64_t r = at - unit_first[u];",
      "const int64_t r = at;",
      "window index ignores which unit a row is in"),
    M("gather-batch-window-base", "tensor/window_gather.cc",
      "Rows(c, first - starts[0], last - starts[0])", "Rows(c, first, last)",
      "a batch inside one window sliced from the epoch position, not the window's"),
    M("gather-avx2-scale", "tensor/window_gather.cc",
      "_mm256_i32gather_epi64(reinterpret_cast<const long long*>(src), ix, 8)",
      "_mm256_i32gather_epi64(reinterpret_cast<const long long*>(src), ix, 4)",
      "8-byte AVX2 gather with a 4-byte scale"),
    M("gather-wide-lower-bound", "tensor/window_gather.cc",
      "std::upper_bound(unit_first.begin(), unit_first.end(), at) - unit_first.begin() - 1",
      "std::lower_bound(unit_first.begin(), unit_first.end(), at) - unit_first.begin() - 1",
      "wide-row gather puts a unit's first row in the previous unit"),
    M("gather-window-never-released", "tensor/window_gather.cc",
      "--it->second <= 0", "--it->second < 0",
      "a gathered window is kept after its last batch"),
    # --- tensor/buffer_pool.cc ----------------------------------------------------------
    M("pool-size-class-floor", "tensor/buffer_pool.cc",
      "(size - base + step - 1) / step", "(size - base) / step",
      "size class rounds down: blocks smaller than requested"),
    M("pool-cached-bytes-not-added", "tensor/buffer_pool.cc",
      "      cached_bytes_ += capacity;\n", "",
      "freed blocks kept without counting them"),
    M("pool-realloc-grow-in-place", "tensor/buffer_pool.cc",
      "SizeClass(old_size) == SizeClass(new_size)", "SizeClass(old_size) <= SizeClass(new_size)",
      "reallocation to a larger class keeps the small block"),
    M("pool-trim-newest", "tensor/buffer_pool.cc",
      "free_[c].front().second < free_[oldest].front().second",
      "free_[c].front().second > free_[oldest].front().second",
      "cache trim frees the newest class first instead of the oldest"),
    # --- added 2026-12-06 (a round of hand-made mutants in filter/, pack/, mix/, decode/,
    # cache/entry_format, plan/, tensor/; each killed by a C++ test, see docs/testing.md) ---
    M('null-mask-keeps', 'filter/row_filter.cc',
      'if (!mask.IsValid(i) || !mask.Value(i)) (*keep)[i] = 0;',
      'if (mask.IsValid(i) && !mask.Value(i)) (*keep)[i] = 0;',
      '!IsValid(i) || !Value(i) -> IsValid(i) && !Value(i) (null mask keeps row)'),
    M('true-expr-skips-predicate', 'filter/row_filter.cc',
      '} else if (IsLiteralTrue(by_keys) && options_.predicate == nullptr) {',
      '} else if (IsLiteralTrue(by_keys)) {',
      'kAll without mask even with a predicate'),
    M('stats-nulls-ignored', 'filter/row_filter.cc',
      'if (!null_count_ok || stats.null_count() != 0) {',
      'if (!null_count_ok) {',
      '|| null_count() != 0 dropped (no or is_null in guarantee)'),
    M('stats-float-used', 'filter/row_filter.cc',
      'if (arrow::is_floating(field.type()->id())) return std::nullopt;',
      '',
      'float columns get statistics'),
    M('mask-all-off-by-one', 'filter/row_filter.cc',
      '} else if (static_cast<int64_t>((*rows)->size()) == splits[s].file_rows) {',
      '} else if (static_cast<int64_t>((*rows)->size()) >= splits[s].file_rows - 1) {',
      '== file_rows -> >= file_rows - 1 (kAll with one row dropped)'),
    M('first-error-any', 'util/parallel_for.h',
      '    if (i < failed_at.load()) {',
      '    if (true) {',
      'if (i < failed_at) -> if (true) (last failure named, nondeterministic)'),
    M('runs-after-failure', 'util/parallel_for.h',
      '    if (i > failed_at.load()) return;',
      '    (void)0;',
      'indices claimed after a failure still run (a failed pass does all its work)'),
    M('kept-rows-ignored', 'pack/document_lengths.cc',
      'const int64_t row = split.rows != nullptr ? (*split.rows)[i] : i;',
      'const int64_t row = i;',
      "a filter's kept rows ignored: the row group's first rows taken (its dropped nulls refused)"),
    M('null-rows-uncounted', 'pack/document_lengths.cc',
      '      ++*nulls;\n      n = 0;',
      '      n = 0;',
      'filled null documents not counted in null_rows'),
    M('missing-col-file-rows', 'pack/document_lengths.cc',
      'rows += split.num_rows;',
      'rows += split.file_rows;',
      'splits laid out by file_rows instead of kept rows'),
    M('quantile-index', 'pack/document_lengths.cc',
      'const int64_t index = (n - 1) * numerator / denominator;',
      'const int64_t index = n * numerator / denominator;',
      'quantile index n*q instead of (n-1)*q'),
    M('truncate-ignores-eos', 'pack/pack_plan.cc',
      'std::max<int64_t>(0, o.seq_len - sep)',
      'o.seq_len',
      'truncate to seq_len, ignoring eos'),
    M('blocks-ceil-always', 'pack/pack_plan.cc',
      '((!drop_last && tokens % seq_len != 0) ? 1 : 0)',
      '((!drop_last) ? 1 : 0)',
      'always one block more without drop_last'),
    M('equal-blocks-most', 'pack/pack_plan.cc',
      'return policy == ShardPolicy::kPad ? most : std::max<int64_t>(0, fewest);',
      'return most;',
      'EqualBlocks always most (kDrop pads)'),
    M('span-lower-bound', 'pack/checkpointed_sums.h',
      'while (i < size() && sum + static_cast<int64_t>(values_[static_cast<size_t>(i)]) <= t) {',
      'while (i < size() && sum + static_cast<int64_t>(values_[static_cast<size_t>(i)]) < t) {',
      'LastAtOrBelow <= -> < (BlocksSpan upper_bound -> lower_bound)'),
    M('first-at-or-above-le', 'pack/checkpointed_sums.h',
      'while (sum < t) {',
      'while (sum <= t) {',
      'FirstAtOrAbove < -> <= (BlocksSpan lower_bound -> upper_bound)'),
    M('checkpoint-stride-off', 'pack/checkpointed_sums.h',
      'if ((i + 1) % kStride == 0) checkpoints_.push_back(total_);',
      'if (i % kStride == 0) checkpoints_.push_back(total_);',
      'Assign checkpoints one value early'),
    M('lengths-key-unchecked', 'pack/length_store.cc',
      'in.compare(sizeof kLengthsMagic, kLengthsKeyBytes, key) != 0) {',
      'false) {',
      "stored lengths taken without checking the key they carry (another file's served)"),
    M('lengths-find-rows-unchecked', 'pack/length_store.cc',
      'if (rows[i] != num_rows) return -1;',
      '',
      'stored lengths of a row group used whatever its row count'),
    M('lengths-null-kept', 'pack/document_lengths.cc',
      '    if (n < 0) {\n      if (!null_is_empty) {',
      '    if (n < -1) {\n      if (!null_is_empty) {',
      'a null row (-1) taken as a length'),
    M('lengths-merge-drops-held', 'pack/document_lengths.cc',
      'if (!read_now) parts.emplace_back(old.row_groups[i], old.lengths.data() + offset, old.rows[i]);',
      '',
      "a file's stored row groups dropped when others are added"),
    M('may-end-le', 'mix/mix_draws.cc',
      'if (rows[s] > 0 && counts[s] + block[s] < rows[s]) may_end = false;',
      'if (rows[s] > 0 && counts[s] + block[s] <= rows[s]) may_end = false;',
      'may_end < -> <='),
    M('zero-weight-lt', 'mix/mix_draws.cc',
      'if (cumulative[i] <= (i > 0 ? cumulative[i - 1] : 0.0))',
      'if (cumulative[i] < (i > 0 ? cumulative[i - 1] : 0.0))',
      'weight-0 test <= -> <'),
    M('first-length-plus-one', 'mix/mix_draws.cc',
      '        length = at + i;\n',
      '        length = at + i + 1;\n',
      '"first" length +1'),
    M('neg-big-int-unchecked', 'decode/convert.cc',
      'if (v <= limit && (!std::is_signed_v<In> || v >= -limit)) continue;',
      'if (v <= limit) continue;',
      'negative side of the exact-float check dropped'),
    M('null-slot-checked', 'decode/convert.cc',
      '      if (arr.IsNull(r)) continue;\n      const double d',
      '      const double d',
      'null slots checked too'),
    M('utf8-boundary-unchecked', 'decode/convert.cc',
      'ok = off[r] >= end || (static_cast<unsigned char>(data[off[r]]) & 0xC0) != 0x80;',
      'ok = true;',
      'UTF-8 row-boundary check -> true'),
    M('stringlist-last-dropped', 'decode/convert.cc',
      'if (at + len > size) break;',
      'if (at + len >= size) break;',
      'DecodeStringList > -> >='),
    M('stack-shape-unchecked', 'tensor/stack.cc',
      '} else if (rows->dtype != out.dtype || rows->shape != out.row_shape) {',
      '} else if (rows->dtype != out.dtype) {',
      'stack member shape unchecked'),
    M('ref-length-unbounded', 'cache/entry_format.cc',
      '        r.length > file_size_ - kTrailerBytes - r.offset) {',
      '        false) {',
      'ref length past file accepted'),
    M('offsets-size-unchecked', 'cache/entry_format.cc',
      'if (c.offsets.present() && (c.offsets.length != (e.num_rows + 1) * 8 || !c.data.present())) {',
      'if (false) {',
      'offsets ref size unchecked'),
    M('offsets-end-unchecked', 'cache/entry_format.cc',
      'if (off[0] < 0 || off[unit->num_rows] > c.data->size()) {',
      'if (off[0] < 0) {',
      'last offset <= data size unchecked'),
    M('rowmajor-width-unchecked', 'cache/entry_format.cc',
      'offset > e.stride || c.row_bytes > e.stride - offset ||',
      'offset > e.stride ||',
      'row-major column may cross its row'),
    M('sample-size-unchecked', 'cache/entry_format.cc',
      'if (s.data.present() && s.data.length != elements * DTypeSize(s.dtype)) {',
      'if (false) {',
      'sample data size unchecked'),
    M('drop-last-rows-unclamped', 'plan/epoch_plan.cc',
      'return num_rows_ - std::min(num_rows_, num_batches_ * options_.batch_size);',
      'return num_rows_ - num_batches_ * options_.batch_size;',
      'drop_last_rows unclamped (negative without drop_last)'),
    M('window-end-unclamped', 'plan/epoch_plan.cc',
      'plan.window_first_row_.push_back(plan.unit_first_row_[std::min(u + window, num_units)]);',
      'plan.window_first_row_.push_back(plan.unit_first_row_[u + window < num_units ? u + window : num_units - 1]);',
      'last window ends one unit early'),
    M('placed-samples-order-unchecked', 'tensor/assemble.cc',
      'if (d.parent() != block || d.data() != base + i * bytes) return;',
      'if (d.parent() != block) return;',
      'placed samples: order check dropped (block taken as is)'),
    M('deferred-short-read-accepted', 'cache/split_cache.cc',
      '    if (got < n) {\n      return arrow::Status::IOError("cache entry \'", path_',
      '    if (false) {\n      return arrow::Status::IOError("cache entry \'", path_',
      'deferred ReadAt short read accepted'),
    M('deferred-changed-file-accepted', 'cache/split_cache.cc',
      '    if (st.ok()) st = file_->CheckRead(offset_, size_, out);\n', '',
      'a deferred column of a file written in place since its hit is served unchecked'),
    # --- added 2026-12-06, third round: transform/image_ops.cc, transform/ndarray.cc, dataset/hive.cc,
    # dataset/int96.cc, io/filesystem.cc ------------------------------------------------
    M("img-center-box-floor", "transform/image_ops.cc",
      "box.top = crop_h > h ? -((crop_h - h) / 2) : RoundHalfEven((h - crop_h) / 2.0);", "box.top = crop_h > h ? -((crop_h - h) / 2) : (h - crop_h) / 2;",
      "CenterCrop top floored instead of rounded half to even (torchvision's round)"),
    M("img-center-pad-sign", "transform/image_ops.cc",
      "box.left = crop_w > w ? -((crop_w - w) / 2) : ", "box.left = crop_w > w ? ((crop_w - w) / 2) : ",
      "CenterCrop larger than the image: left offset positive (image shifted, wrong pixels)"),
    M("img-crop-right-edge", "transform/image_ops.cc",
      "std::min<int64_t>(box.width, d.w - box.left);", "std::min<int64_t>(box.width, d.w);",
      "Crop copies past the image's right edge (pixels of the next row)"),
    M("img-crop-plane-stride", "transform/image_ops.cc",
      "uint8_t* dp = dst + p * box.height * box.width * px;", "uint8_t* dp = dst + p * d.h * d.w * px;",
      "channels-first Crop writes planes at the source's plane stride"),
    M("img-flip-chw-first-plane", "transform/image_ops.cc",
      "const int64_t rows = in.channels_first ? d.c * d.h : d.h;", "const int64_t rows = d.h;",
      "RandomHorizontalFlip of a CHW image flips only its first channel"),
    M("img-flip-p-inverted", "transform/image_ops.cc",
      "if (!(rng.UniformDouble() < p_)) return in;", "if (rng.UniformDouble() < p_) return in;",
      "RandomHorizontalFlip flips with probability 1 - p"),
    M("img-normalize-255", "transform/image_ops.cc",
      "1.0 / 255.0 : 1.0;", "1.0 / 256.0 : 1.0;",
      "uint8 pixels scaled by 1/256 instead of ToTensor's 1/255"),
    M("img-normalize-one-mean", "transform/image_ops.cc",
      "const size_t k = mean_.size() == 1 ? 0 : static_cast<size_t>(c);", "const size_t k = 0;",
      "Normalize applies the first channel's mean and std to every channel"),
    M("img-normalize-fast-channel", "transform/image_ops.cc",
      "d2[p] = static_cast<float>(src[3 * p + 2]) * m2 + a2;", "d2[p] = static_cast<float>(src[3 * p + 1]) * m2 + a2;",
      "fused Normalize+ToCHW of RGB writes green into the blue plane"),
    M("img-normalize-chw-index", "transform/image_ops.cc",
      "const int64_t o = chw_out ? c * plane + p : i;", "const int64_t o = i;",
      "Normalize fused with ToCHW (not 3-channel uint8) writes HWC order into a CHW tensor"),
    M("img-normalize-fewer-means", "transform/image_ops.cc",
      "if (static_cast<int64_t>(mean_.size()) != d.c && mean_.size() != 1) {", "if (static_cast<int64_t>(mean_.size()) < d.c && mean_.size() != 1) {",
      "Normalize with more means than channels is accepted (extra means ignored silently)"),
    M("img-dims-chw-as-hwc", "transform/image_ops.cc",
      "d.c = s.shape[0]; d.h = s.shape[1]; d.w = s.shape[2];", "d.h = s.shape[0]; d.w = s.shape[1]; d.c = s.shape[2];",
      "a channels-first image's dims read as HWC"),
    M("img-tochw-transpose", "transform/image_ops.cc",
      "for (int64_t p = 0; p < plane; ++p) out[p] = src[p * channels + c];", "for (int64_t p = 0; p < plane; ++p) out[p] = src[c * plane + p];",
      "ToCHW copies instead of transposing"),
    M("img-cast-int8-zero-extend", "transform/image_ops.cc",
      "case DType::kInt8: return static_cast<uint64_t>(int64_t{get(int8_t{})});", "case DType::kInt8: return get(uint8_t{});",
      "Cast of int8 zero-extends (-1 becomes 255)"),
    M("img-cast-int64-through-double", "transform/image_ops.cc",
      "    case DType::kInt64:\n    case DType::kUInt64: put(bits); break;", "    case DType::kInt64: put(static_cast<int64_t>(static_cast<double>(as_signed))); break;\n    case DType::kUInt64: put(bits); break;",
      "Cast to int64 through a double (uint64 2^53+1 loses its low bit)"),
    M("img-pad-left-ignored", "transform/image_ops.cc",
      "const int64_t at = pad_left_ ? length_ - keep : 0;", "const int64_t at = 0;",
      "PadOrTruncate side='left' pads on the right"),
    M("img-truncate-left-ignored", "transform/image_ops.cc",
      "const int64_t skip = truncate_left_ ? in.shape[0] - keep : 0;", "const int64_t skip = 0;",
      "PadOrTruncate truncation='left' keeps the first rows"),
    M("img-rrc-top-range", "transform/image_ops.cc",
      "rng->Uniform(static_cast<uint64_t>(height - h + 1))", "rng->Uniform(static_cast<uint64_t>(height - h))",
      "RandomResizedCrop never starts a box at its last possible row"),
    M("img-rrc-fallback-corner", "transform/image_ops.cc",
      "return CropBox{(height - h) / 2, (width - w) / 2, h, w};", "return CropBox{0, 0, h, w};",
      "RandomResizedCrop fallback takes the top-left corner, not the centre"),
    M("img-rrc-fallback-ratio", "transform/image_ops.cc",
      "h = RoundHalfEven(w / ratio_lo);", "h = RoundHalfEven(w * ratio_lo);",
      "RandomResizedCrop fallback clamps the ratio the wrong way"),
    M("img-resize-aspect-rounded", "transform/image_ops.cc",
      "    if (w <= h) return {static_cast<int64_t>(static_cast<double>(size_) * h / w), size_};",
      "    if (w <= h) return {static_cast<int64_t>(std::round(static_cast<double>(size_) * h / w)), size_};",
      "Resize rounds the longer side instead of truncating (torchvision truncates)"),
    M("img-resize-longer-side", "transform/image_ops.cc",
      "    return {size_, static_cast<int64_t>(static_cast<double>(size_) * w / h)};",
      "    return {static_cast<int64_t>(static_cast<double>(size_) * h / w), size_};",
      "Resize sets the longer side (width) to size for landscape images"),
    M("img-weights-no-antialias", "transform/image_ops.cc",
      "const double filter_scale = std::max(scale, 1.0);", "const double filter_scale = 1.0;",
      "downscaling without antialias (filter not widened by the scale)"),
    M("img-weights-center", "transform/image_ops.cc",
      "const double center = in_begin + (i + 0.5) * scale;", "const double center = in_begin + i * scale;",
      "resample taps centred half a pixel off"),
    M("img-weights-not-normalized", "transform/image_ops.cc",
      "if (total != 0) {\n      for (int64_t x = 0; x < n; ++x) w[x] /= total;", "if (total == 0) {\n      for (int64_t x = 0; x < n; ++x) w[x] /= total;",
      "resample weights not normalized to sum 1"),
    M("img-make-flip-nan", "transform/image_ops.cc",
      "if (!(prob >= 0 && prob <= 1)) {", "if (prob < 0 || prob > 1) {",
      "RandomHorizontalFlip(p=NaN) accepted (never flips)"),
    M("img-make-rrc-order", "transform/image_ops.cc",
      "!std::isfinite(scale[1]) || !std::isfinite(ratio[1]) || scale[0] > scale[1] ||", "!std::isfinite(scale[1]) || !std::isfinite(ratio[1]) ||",
      "RandomResizedCrop scale=(hi, lo) accepted"),
    M("img-make-size-max", "transform/image_ops.cc",
      "if (v[0] > most || v[1] > most) {", "if (v[0] > most) {",
      "CenterCrop width above 2^31-1 cast to int64 unchecked"),
    M("npy-fortran-2d-as-c", "transform/ndarray.cc",
      "if (!h.fortran || h.shape.size() < 2) {", "if (!h.fortran || h.shape.size() < 3) {",
      "2-D Fortran-order .npy copied as C order"),
    M("npy-fortran-stride", "transform/ndarray.cc",
      "        stride *= h.shape[k];", "        stride *= h.shape[nd - 1 - k];",
      "Fortran strides built from the reversed shape"),
    M("npy-v1-header-len-low-byte", "transform/ndarray.cc",
      "*header_len = p[8] | (p[9] << 8);", "*header_len = p[8];",
      ".npy v1 header length's high byte dropped"),
    M("npy-truncation-counts-elements", "transform/ndarray.cc",
      "if (h.data_offset + count * elem > n) {", "if (h.data_offset + count > n) {",
      "truncation check counts elements not bytes (reads past the buffer)"),
    M("npz-several-arrays", "transform/ndarray.cc",
      "if (entries != 1 && entries != 0xFFFF) {", "if (entries == 0) {",
      ".npz of several arrays decodes the first silently"),
    M("hive-unescape-trailing", "dataset/hive.cc",
      "if (s[i] == '%' && i + 2 < s.size()) {", "if (s[i] == '%' && i + 3 < s.size()) {",
      "a %XX escape at the end of a value is not decoded"),
    M("hive-hex-lowercase-f", "dataset/hive.cc",
      "if (c >= 'a' && c <= 'f') return c - 'a' + 10;", "if (c >= 'a' && c < 'f') return c - 'a' + 10;",
      "lower-case hex digit f not decoded (%2f stays)"),
    M("hive-split-last-equals", "dataset/hive.cc",
      "const size_t eq = component.find('=');", "const size_t eq = component.rfind('=');",
      "key=a=b splits at the last '=' (key 'key=a')"),
    M("hive-parq-extension", "dataset/hive.cc",
      "EndsWithNoCase(path, \".parquet\") || EndsWithNoCase(path, \".parq\") ||", "EndsWithNoCase(path, \".parquet\") ||",
      "'.parq' files not listed as Parquet"),
    M("hive-int64-trailing-text", "dataset/hive.cc",
      "return !v.empty() && ec == std::errc() && ptr == v.data() + v.size();", "return !v.empty() && ec == std::errc();",
      "'12abc' partition values typed as int64"),
    M("int96-civil-negative-era", "dataset/int96.cc",
      "const int64_t era = (z >= 0 ? z : z - 146096) / 146097;", "const int64_t era = z / 146097;",
      "CivilDate wrong before 0000-03-01 (message dates)"),
    M("int96-coarse-signed-division", "dataset/int96.cc",
      "static_cast<__int128>(nanos_of_day / static_cast<uint64_t>(divisor));", "static_cast<__int128>(static_cast<int64_t>(nanos_of_day) / divisor);",
      "coarse units divide nanos of the day as signed (Arrow: unsigned)"),
    M("img-cast-unsigned-by-output", "transform/image_ops.cc",
      "const bool is_unsigned = IsUnsignedDType(in.dtype);", "const bool is_unsigned = IsUnsignedDType(to_);",
      "Cast reads the input as unsigned when the output type is (uint32 4e9 to float64 as negative)"),
    M("fs-backoff-no-equal-jitter", "io/filesystem.cc",
      "* (1 + std::clamp(u, 0.0, 1.0)) / 2;", "* std::clamp(u, 0.0, 1.0);",
      "full jitter instead of equal jitter (a delay may be 0)"),
    M("fs-max-attempts-off-by-one", "io/filesystem.cc",
      "if (policy.max_attempts > 0 && retry + 1 >= policy.max_attempts) return false;", "if (policy.max_attempts > 0 && retry >= policy.max_attempts) return false;",
      "one attempt more than retry_max_attempts"),
    M("fs-budget-strict", "io/filesystem.cc",
      "return elapsed_s + delay_s <= policy.budget_s;", "return elapsed_s + delay_s < policy.budget_s;",
      "a retry ending exactly at the budget is refused"),
    M("fs-budget-ignores-delay", "io/filesystem.cc",
      "return elapsed_s + delay_s <= policy.budget_s;", "return elapsed_s <= policy.budget_s;",
      "a retry may sleep past the budget"),
    M("fs-delay-cap-ignored", "io/filesystem.cc",
      "return std::min(cap, policy.max_delay_s) *", "return cap *",
      "retry_max_delay not applied"),
    M("fs-endpoint-slash", "io/filesystem.cc",
      "while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();", "",
      "an endpoint's trailing '/' kept"),
    M("fs-scheme-unchecked", "io/filesystem.cc",
      "if (scheme != \"http\" && scheme != \"https\") {", "if (false) {",
      "an endpoint scheme other than http(s) accepted"),
    M("fs-unknown-key", "io/filesystem.cc",
      "if (KnownKeys().count(key) == 0) {", "if (false) {",
      "unknown storage option keys accepted silently"),
    M("npy-big-endian-2-byte", "transform/ndarray.cc",
      "h->swap = order == '>' && size > 1;", "h->swap = order == '>' && size > 2;",
      "big-endian 2-byte .npy (>i2, >u2, >f2) not byte-swapped"),
    # --- added 2026-12-06, fourth round: dataset/, transform/pipeline.cc, tensor/window_gather.cc
    # --- dataset/dataset.cc (round 4) ------------------------------------------
    M('dataset-rowgroups-duplicates-kept', 'dataset/dataset.cc',
      '  selected.erase(std::unique(selected.begin(), selected.end()), selected.end());\n',
      '',
      'row_groups listing an index twice reads that row group twice (duplicated rows)'),
    M('dataset-rowgroups-past-end', 'dataset/dataset.cc',
      'selected.back() >= num))',
      'selected.back() > num))',
      "row_groups may select the row group one past the file's last"),
    M('dataset-rowgroups-unknown-name-ignored', 'dataset/dataset.cc',
      'files_selected += listed ? 1 : 0;',
      'files_selected += 1;',
      'row_groups naming a file not in the dataset is silently ignored (when as many names as files)'),
    M('dataset-listing-reverse-order', 'dataset/dataset.cc',
      '[](const auto& a, const auto& b) { return a.path() < b.path(); });',
      '[](const auto& a, const auto& b) { return a.path() > b.path(); });',
      "a directory's files listed in reverse path order"),
    # --- dataset/columns.cc (round 4) ------------------------------------------
    M('columns-unify-keeps-first-type', 'dataset/columns.cc',
      '      unified = common;\n',
      '',
      "the unified type stays the first file's (int32 beside int64 truncates)"),
    M('columns-decimal-scale-only-larger', 'dataset/columns.cc',
      ': first >= 0 && DecimalScale(*t) != DecimalScale(*sources[first].type);',
      ': first >= 0 && DecimalScale(*t) > DecimalScale(*sources[first].type);',
      "decimals='int64' lets a file of a smaller scale through (unscaled integers of another scale)"),
    M('columns-null-type-beside-struct', 'dataset/columns.cc',
      '      if (type == nullptr || type->id() == arrow::Type::NA) continue;\n      if (type->id() == arrow::Type::STRUCT) {',
      '      if (type == nullptr) continue;\n      if (type->id() == arrow::Type::STRUCT) {',
      'an all-null (type null) column beside a struct refused as another type'),
    M('columns-struct-children-duplicated', 'dataset/columns.cc',
      'if (child_names.insert(child->name()).second) children.push_back(child->name());',
      'children.push_back(child->name());',
      'a struct in two files expands to each field twice'),
    M('columns-selected-twice-allowed', 'dataset/columns.cc',
      '        if (!added) {\n          return arrow::Status::Invalid("column \'"',
      '        if (false) {\n          return arrow::Status::Invalid("column \'"',
      'a column named twice in columns= is not refused'),
    M('columns-pandas-index-in-defaults', 'dataset/columns.cc',
      'if ((declared || !indexes.LeftOut(n)) && seen.insert(n).second) names.push_back(n);',
      'if (seen.insert(n).second) names.push_back(n);',
      'pandas index columns loaded by default'),
    M('columns-leaf-path-decode-off-by-one', 'dataset/columns.cc',
      'at = colon + 1 + n;',
      'at = colon + n;',
      'DecodeLeafPath misreads the parts after the first'),
    M('columns-null-mask-all-ignored', 'dataset/columns.cc',
      'if (!(asked || (options_.null_mask_all && nullable_[c]))) continue;',
      'if (!asked) continue;',
      'null_mask_all adds no mask'),
    M('columns-null-mask-exact-name-missed', 'dataset/columns.cc',
      '  if (wanted.count(name) > 0) out.push_back(name);\n',
      '',
      "null_mask=['x'] does not match column 'x' itself"),
    M('columns-null-key-makes-text', 'dataset/columns.cc',
      'if (!keys_[k].null[f] && !ParsesAsInt64(keys_[k].values[f])) return KeyLoad::kText;',
      'if (!ParsesAsInt64(keys_[k].values[f])) return KeyLoad::kText;',
      'a null partition (__HIVE_DEFAULT_PARTITION__) turns an integer key into text'),
    M('columns-null-key-not-nullable', 'dataset/columns.cc',
      'for (size_t f = 0; f < k.values.size(); ++f) any_null = any_null || k.null[f];',
      'for (size_t f = 0; f < k.values.size(); ++f) any_null = false;',
      'a partition key with null paths is not nullable in the schema'),
    M('columns-key-in-some-files-first-lacks', 'dataset/columns.cc',
      'if (has < 0 || lacks < 0) return arrow::Status::OK();',
      'if (has < 0 || lacks <= 0) return arrow::Status::OK();',
      'a key stored in some files passes when the first file lacks it (rows null there)'),
    M('columns-absent-not-nullable', 'dataset/columns.cc',
      "        nullable = true;  // absent: null in this file's rows\n",
      '',
      'a column absent from a file is not nullable'),
    # --- dataset/footer_checks.cc (round 4) ------------------------------------
    M('footer-null-count-ignored', 'dataset/footer_checks.cc',
      'if (levels.max_rep == 0 && has_null_count) return stats->null_count;',
      'if (levels.max_rep == 0 && has_null_count) return 0;',
      'nulls of a flat column not refused from the footers (late, mid-epoch)'),
    M('footer-null-partition-not-counted', 'dataset/footer_checks.cc',
      'n = f.partition_null[partition_key] ? s.num_rows : 0;',
      'n = 0;',
      'null partition keys not refused from the paths'),
    M('footer-absent-column-no-nulls', 'dataset/footer_checks.cc',
      'n = s.num_rows;  // the file lacks the column: every row read is null',
      'n = 0;  // (mutant)',
      'a file lacking the column counts no nulls'),
    M('footer-empty-lists-counted-as-nulls', 'dataset/footer_checks.cc',
      'if (d != levels.row) n += (*hist)[d];',
      'n += (*hist)[d];',
      'empty lists counted as nulls (refused without fill_null)'),
    M('footer-ragged-only-longer', 'dataset/footer_checks.cc',
      '} else if (per_row != length) {',
      '} else if (per_row < length) {',
      'a later row group of shorter rows passes as uniform'),
    M('footer-one-empty-list-passes', 'dataset/footer_checks.cc',
      'if (empty > 0 && filled > 0) {',
      'if (empty > 1 && filled > 0) {',
      'one empty list beside non-empty ones passes as uniform'),
    M('footer-fsl-null-rows-pass', 'dataset/footer_checks.cc',
      'levels == expected) {',
      'levels <= expected) {',
      'fixed-size lists with null rows pass the footer check (fail mid-epoch)'),
    M('footer-stored-key-max-unchecked', 'dataset/footer_checks.cc',
      '(*parsed)->Equals(*min, equal) && (*parsed)->Equals(*max, equal)',
      '(*parsed)->Equals(*min, equal)',
      'a stored key whose max disagrees with the path passes'),
    M('footer-float32-as-float64', 'dataset/footer_checks.cc',
      '    if (dst == DType::kFloat32) back = static_cast<double>(static_cast<float>(v));\n',
      '',
      'integers checked against float64 when float32 is declared'),
    # --- transform/pipeline.cc (round 4) ---------------------------------------
    M('pipeline-prefix-fingerprint-short', 'transform/pipeline.cc',
      'for (size_t i = 0; i < c.first_random; ++i) out += c.ops[i]->Fingerprint() + ";";',
      'for (size_t i = 0; i + 1 < c.first_random; ++i) out += c.ops[i]->Fingerprint() + ";";',
      'the cache key leaves out the last cached op'),
    M('pipeline-fingerprint-no-collate', 'transform/pipeline.cc',
      '    out += c.collate + "|";\n',
      '    out += "|";\n',
      'the state fingerprint leaves out PadOrTruncate / lists='),
    M('pipeline-ragged-shape-in-bytes', 'transform/pipeline.cc',
      's.shape[0] = inner == 0 ? 0 : len / inner;',
      's.shape[0] = len;',
      "a ragged list row's length in bytes, not elements"),
    M('pipeline-masked-null-inverted', 'transform/pipeline.cc',
      'v.data->data()[0] == 0;',
      'v.data->data()[0] != 0;',
      'MaskedNull true for valid rows'),
    M('pipeline-extra-name-clash-at-0', 'transform/pipeline.cc',
      'if (index_of(extra.name) >= 0) {',
      'if (index_of(extra.name) > 0) {',
      'x_length clash not refused when the clashing column is the first'),
    # --- dataset/summary.cc (round 4) ------------------------------------------
    M('summary-row-group-twice-passes', 'dataset/summary.cc',
      'if (start <= previous) {',
      'if (start < previous) {',
      'a summary listing one row group twice is taken (its rows served twice)'),
    M('summary-stale-size-ignored', 'dataset/summary.cc',
      '(e.size != size || (e.mtime_ns != 0',
      '(e.size != size && (e.mtime_ns != 0',
      'a file rewritten with another size but the indexed mtime is served from the stale summary'),
    M('summary-index-repeats-accepted', 'dataset/summary.cc',
      'if (!out.empty() && !(previous < id.path)) {',
      'if (!out.empty() && previous > id.path) {',
      'an index line repeating a path is accepted (the file listed twice)'),
    M('summary-index-dotdot-path', 'dataset/summary.cc',
      'if (part.empty() || part == "." || part == "..") return false;',
      'if (part.empty() || part == ".") return false;',
      "an index or summary path with '..' (outside the directory) is accepted"),
    M('summary-index-negative-size', 'dataset/summary.cc',
      'return ec == std::errc() && ptr == line.data() + to && *v >= 0;',
      'return ec == std::errc() && ptr == line.data() + to;',
      'a negative size or time in the index is accepted'),
    # --- tensor/window_gather.cc (round 4) -------------------------------------
    M('gather-chunkof-boundary', 'tensor/window_gather.cc',
      'if (chunks_[mid].last <= row) lo = mid + 1;',
      'if (chunks_[mid].last < row) lo = mid + 1;',
      "the row at a chunk's end is looked up in the chunk before"),
    M('gather-rows-past-chunk', 'tensor/window_gather.cc',
      'if (last > chunk.last) return nullptr;',
      'if (last > chunk.last + 1) return nullptr;',
      "a batch one row past its chunk is sliced from it (the next column's bytes)"),
    M('gather-copyrows-no-chunk-end', 'tensor/window_gather.cc',
      'const int64_t end = std::min(last, chunk.last);',
      'const int64_t end = last;',
      'a copy across chunks reads past the first chunk'),
    M('gather-unfilled-group-drops-column', 'tensor/window_gather.cc',
      'for (size_t j = 2; j < open->size(); ++j) tasks.push_back({(*open)[j]});',
      'for (size_t j = 3; j < open->size(); ++j) tasks.push_back({(*open)[j]});',
      'a column of an unfilled 4/8-byte group is never gathered (uninitialized rows)'),
    M('gather-rowmajor-stride-concat', 'tensor/window_gather.cc',
      'std::memcpy(scratch + at + r * width, src + r * rm.stride, static_cast<size_t>(width));',
      'std::memcpy(scratch + at + r * width, src + r * width, static_cast<size_t>(width));',
      "a row-major unit's narrow column read with the column's width as stride"),
    M('gather-rowmajor-stride-wide', 'tensor/window_gather.cc',
      '        stride[u] = unit.row_major->stride;\n',
      '',
      "a row-major unit's wide column read with the column's width as stride"),
    M('gather-batch-shape-unchecked', 'tensor/window_gather.cc',
      'if (windows[k]->row_shape(c) != shape) {',
      'if (false) {',
      'a batch across windows of different row shapes is not refused'),
    M('gather-window-shape-unchecked', 'tensor/window_gather.cc',
      '} else if (d.row_shape != row_shapes[c]) {',
      '} else if (false) {',
      'units of one window with different row shapes are not refused'),
    # --- added 2026-12-06, fifth round: util/exact_text.h, decode/read_unit.cc, decode/nested.cc,
    # exec/readahead.h ---
    # --- util/exact_text.h --------------------------------------------------------------
    M("exact-text-float", "util/exact_text.h",
      "std::to_chars(text, text + sizeof(text), v)", "std::to_chars(text, text + sizeof(text), static_cast<float>(v))",
      "exact text of a double written through float: 16777217 and 16777216 alike"),
    M("exact-text-to-string", "util/exact_text.h",
      "  return std::string(text, end);", "  (void)end;\n  return std::to_string(v);",
      "std::to_string's 6 decimals: 0 and 1e-7 alike in keys and messages"),
    M("compatible-text-six-always", "util/exact_text.h",
      "parsed == v ? six", "parsed == parsed ? six",
      "the 6-digit stream text kept even when it does not read back (1234567 and 1234568 alike)"),
    M("compatible-text-exact-always", "util/exact_text.h",
      "read.ec == std::errc() && read.ptr", "false && read.ptr",
      "fingerprints always exact text: old fingerprints of -100 etc. differ (1e+02)"),
    # --- decode/read_unit.cc ------------------------------------------------------------
    M("partition-fill-float-ignored", "decode/read_unit.cc",
      "(fill.is_float ? static_cast<int64_t>(fill.float_value)", "(false ? static_cast<int64_t>(fill.float_value)",
      "a null int partition key takes int_value even when the fill is a float"),
    M("partition-null-path-value", "decode/read_unit.cc",
      "const std::string value = is_null ? fill.bytes_value : path_value;", "const std::string value = path_value;",
      "a null string partition key gets the path's text, not the fill"),
    M("partition-string-offsets-off", "decode/read_unit.cc",
      "o[i + 1] = (i + 1) * len;", "o[i + 1] = i * len;",
      "partition string offsets shifted: every row one copy short"),
    M("partition-int-null-not-filled", "decode/read_unit.cc",
      "const int64_t v = is_null ? (fill.is_float", "const int64_t v = false ? (fill.is_float",
      "a null int partition key parsed from the path (stoll of the default-partition text)"),
    M("select-slice-from-zero", "decode/read_unit.cc",
      "if (split.rows == nullptr) return column->Slice(unit.row_begin, unit.num_rows());",
      "if (split.rows == nullptr) return column->Slice(0, unit.num_rows());",
      "a unit inside a row group reads the group's first rows"),
    M("select-always-slice", "decode/read_unit.cc",
      "rows[unit.row_end - 1] - first == unit.num_rows() - 1", "rows[unit.row_end - 1] - first >= unit.num_rows() - 1",
      "a filter's scattered rows read as a contiguous slice"),
    M("select-slice-first-zero", "decode/read_unit.cc",
      "return column->Slice(first, unit.num_rows());", "return column->Slice(unit.row_begin, unit.num_rows());",
      "a contiguous kept range sliced at the unit's index, not the kept row"),
    M("select-take-from-split-start", "decode/read_unit.cc",
      "reinterpret_cast<const uint8_t*>(rows + unit.row_begin)", "reinterpret_cast<const uint8_t*>(rows)",
      "a filtered row group's later unit takes the kept rows of the split's first unit"),
    M("fills-unknown-name-accepted", "decode/read_unit.cc",
      "if (selected.count(name) == 0) {", "if (false) {",
      "fill_null naming a column not selected is silently ignored"),
    M("fills-named-ignored", "decode/read_unit.cc",
      "NullFill fill = named ? it->second : default_fill;", "NullFill fill = named ? default_fill : default_fill;",
      "per-column fills ignored: the default fill (or none) used"),
    M("fills-mask-no-rows-only", "decode/read_unit.cc",
      "if (masked && !fill.enabled) {", "if (false && masked && !fill.enabled) {",
      "a null_mask column without fill: its nulls become an error"),
    M("checkfills-uint64-negative", "decode/read_unit.cc",
      ": d == DType::kUInt64 ? fill.int_value >= 0", ": d == DType::kUInt64 ? true",
      "a negative fill of a uint64 column accepted (wraps to 2^64-1)"),
    M("checkfills-range-skipped", "decode/read_unit.cc",
      "if (!fits) {", "if (!fits && false) {",
      "a fill the dtype cannot hold is silently cast"),
    M("checkfills-kind-skipped", "decode/read_unit.cc",
      "if (text == fill.is_bytes) continue;", "continue;",
      "a number fill for a string column (or str for numbers) not refused"),
    M("partition-mask-inverted", "decode/read_unit.cc",
      "ConstantValidity(unit.num_rows(), !is_null, pool)", "ConstantValidity(unit.num_rows(), is_null, pool)",
      "a partition key's null mask inverted"),
    # --- decode/nested.cc ---------------------------------------------------------------
    M("struct-field-parent-nulls-lost", "decode/nested.cc",
      "return st.GetFlattenedField(i, pool);", "return st.field(i);",
      "a struct leaf ignores the struct's null rows (garbage values read as valid)"),
    M("list-values-not-struct-unchecked", "decode/nested.cc",
      "if (values->type_id() != arrow::Type::STRUCT) {", "if (false) {",
      "a path below a list of non-structs cast as struct: crash"),
    M("withvalues-large-list-as-list", "decode/nested.cc",
      "case arrow::Type::LARGE_LIST: type = arrow::large_list(values->type()); break;", "",
      "a large_list's field rebuilt as a 32-bit-offset list over 64-bit offsets"),
    M("validity-all-valid", "decode/nested.cc",
      "p[r] = chunk->IsValid(r) ? 1 : 0;", "p[r] = 1;",
      "null_mask says every row is valid"),
    M("validity-pointer-not-advanced", "decode/nested.cc",
      "    p += n;\n", "",
      "null_mask of a multi-chunk column: later chunks overwrite the first rows"),
    M("constant-validity-always-one", "decode/nested.cc",
      "valid ? 1 : 0, rows);", "1, rows);",
      "a null partition's mask says valid"),
    # --- exec/readahead.h ---------------------------------------------------------------
    M("readahead-prime-window-plus-one", "exec/readahead.h",
      "    MutexLock lock(mu_);\n    while (next_ < end_ && static_cast<int64_t>(held_.size()) < options_.window",
      "    MutexLock lock(mu_);\n    while (next_ < end_ && static_cast<int64_t>(held_.size()) <= options_.window",
      "Prime starts one item more than the window"),
    M("readahead-take-no-forced-one", "exec/readahead.h",
      "           (held_.empty() || held_cost_ + cost_(next_) <= options_.max_cost)) {\n      StartNext();\n    }\n    return out;",
      "           (held_cost_ + cost_(next_) <= options_.max_cost)) {\n      StartNext();\n    }\n    return out;",
      "after a take, an item over the cost bound is never started ahead"),
    M("readahead-taken-kept", "exec/readahead.h",
      "    held_.erase(it);\n", "",
      "a taken item stays held: a second take returns a moved-from result"),
    # Sixth round (2026-12-06): mix/mix_stream.cc, decode/convert.cc, dataset/column_types.cc,
    # tensor/stack.cc, pack/packer.cc.
    M('ct-float-narrowing', 'dataset/column_types.cc',
      'return to_float >= FloatBits(from.id());',
      'return to_float > 0;',
      'a float converts to any float type (float64 -> float32 loses precision)'),
    M('ct-decimal-places-dropped', 'dataset/column_types.cc',
      'return t.scale() >= f.scale() && t.precision()',
      'return t.precision()',
      'a decimal converts to one of fewer places'),
    M('ct-decimal-int-digits-dropped', 'dataset/column_types.cc',
      ' && t.precision() - t.scale() >= f.precision() - f.scale();',
      ';',
      'a decimal converts to one of fewer integer digits'),
    M('ct-decimal-float-undeclared', 'dataset/column_types.cc',
      'if (IsDecimal(from.id()) && to_float == 64) return declared;',
      'if (IsDecimal(from.id()) && to_float == 64) return true;',
      'a decimal converts to float64 without schema='),
    M('ct-fsl-size-unchecked', 'dataset/column_types.cc',
      'static_cast<const arrow::FixedSizeListType&>(from).list_size() !=',
      'static_cast<const arrow::FixedSizeListType&>(from).list_size() <',
      'a fixed-size list converts to a shorter one'),
    M('ct-fsb-size-unchecked', 'dataset/column_types.cc',
      '    return to.id() != arrow::Type::FIXED_SIZE_BINARY;\n',
      '    return true;\n',
      'binary converts to a fixed-size binary (of any size)'),
    M('ct-common-decimal-min-scale', 'dataset/column_types.cc',
      'const int32_t scale = std::max(dx.scale(), dy.scale());',
      'const int32_t scale = std::min(dx.scale(), dy.scale());',
      "two decimals' common type keeps the fewer places"),
    M('ct-common-decimal-min-digits', 'dataset/column_types.cc',
      'const int32_t digits = std::max(',
      'const int32_t digits = std::min(',
      "two decimals' common type keeps the fewer integer digits"),
    M('ct-common-large-list-and', 'dataset/column_types.cc',
      'x.id() == arrow::Type::LARGE_LIST || y.id() == arrow::Type::LARGE_LIST',
      'x.id() == arrow::Type::LARGE_LIST && y.id() == arrow::Type::LARGE_LIST',
      'a list and a large list unify to a list'),
    M('ct-common-fsl-size-unchecked', 'dataset/column_types.cc',
      '      if (n != static_cast<const arrow::FixedSizeListType&>(y).list_size()) return nullptr;\n',
      '',
      "fixed-size lists of two sizes unify to the first's"),
    M('ct-common-unsigned-bits', 'dataset/column_types.cc',
      'const int bits = std::max(signed_bits, 2 * unsigned_bits);',
      'const int bits = std::max(signed_bits, unsigned_bits);',
      'uint and int unify to a signed type as wide as the uint (wraps)'),
    M('ct-tensor-shape-reversed', 'dataset/column_types.cc',
      '    for (size_t d = shape.size(); d-- > 0;) {\n      out = arrow::fixed_size_list(out, static_cast<int32_t>(shape[d]));',
      '    for (size_t d = 0; d < shape.size(); ++d) {\n      out = arrow::fixed_size_list(out, static_cast<int32_t>(shape[d]));',
      "a tensor extension's dims nested innermost first"),
    M('ct-tensor-offset-dropped', 'dataset/column_types.cc',
      '{values->data()}, data->null_count,\n                                                       data->offset));',
      '{values->data()}, data->null_count,\n                                                       0));',
      'a sliced tensor extension array loses its offset'),
    M('cv-bool-offset-dropped', 'decode/convert.cc',
      'arrow::bit_util::GetBit(bits, arr.offset() + r)',
      'arrow::bit_util::GetBit(bits, r)',
      "a sliced bool array read from its buffer's start"),
    M('cv-copy-offset-dropped', 'decode/convert.cc',
      'std::memcpy(dst, arr.data()->buffers[1]->data() + arr.offset() * elem_, n * elem_);',
      'std::memcpy(dst, arr.data()->buffers[1]->data(), n * elem_);',
      "a copied sliced chunk read from its buffer's start"),
    M('cv-zero-copy-fsl-offset', 'decode/convert.cc',
      'begin = (list.offset() + begin) * size;\n      count *= size;\n      a = list.values().get();',
      'begin = begin * size;\n      count *= size;\n      a = list.values().get();',
      'a sliced fixed-size list used as it is from its first row'),
    M('cv-zero-copy-inner-nulls', 'decode/convert.cc',
      '      a = list.values().get();\n      if (a->null_count() != 0) return false;\n',
      '      a = list.values().get();\n',
      'nulls inside a fixed-size list used as they are (no error, no fill)'),
    M('cv-fsl-fill-row-stride', 'decode/convert.cc',
      'start + (r * row_elems + e) * elem_',
      'start + (r + e) * elem_',
      "a null fixed-size-list row's fill written at the wrong place"),
    M('cv-null-list-inner-from-level', 'decode/convert.cc',
      'for (size_t i = level + 1; i < shape_.size(); ++i) inner *=',
      'for (size_t i = level; i < shape_.size(); ++i) inner *=',
      "a null list's fill counts its own dim twice"),
    M('cv-null-list-footer-length', 'decode/convert.cc',
      'if (shape_[level] < 0) shape_[level] = level == 0 ? fill_.list_length : 0;',
      'if (shape_[level] < 0) shape_[level] = 0;',
      "a unit of null lists only ignores the footers' list length"),
    M('cv-string-fast-path-nulls', 'decode/convert.cc',
      'if (array.num_chunks() == 1 && array.null_count() == 0) {',
      'if (array.num_chunks() == 1) {',
      'a one-chunk string column with nulls kept as it is (nulls become empty strings)'),
    M('cv-dict-index-bound', 'decode/convert.cc',
      'if (idx < 0 || idx >= arr.dictionary()->length()) {',
      'if (idx < 0 || idx > arr.dictionary()->length()) {',
      'a numeric dictionary index one past the end read'),
    M('cv-string-dict-index-bound', 'decode/convert.cc',
      'if (idx < 0 || idx >= values.length()) {',
      'if (idx < 0) {',
      'a string dictionary index past the end read'),
    M('cv-dict-nulls-unchecked', 'decode/convert.cc',
      '    if (arr.null_count() > 0 && !fill_.enabled) return NullError(spec_, arr.null_count());\n    ARROW_RETURN_NOT_OK(out_.Reserve(arr.length() * entry));',
      '    ARROW_RETURN_NOT_OK(out_.Reserve(arr.length() * entry));',
      'nulls of a numeric dictionary column filled without a fill'),
    M('st-place-first-listed', 'tensor/stack.cc',
      'first_of.emplace(*std::min_element(out.members.begin(), out.members.end()), static_cast<int>(s));',
      'first_of.emplace(out.members.front(), static_cast<int>(s));',
      'a stack placed at its first listed member, not its earliest'),
    M('st-short-member-unchecked', 'tensor/stack.cc',
      '(n > 0 && (c.data == nullptr || c.data->size() < n * st.row_bytes))',
      'false',
      'a member buffer shorter than the batch read past its end'),
    M('st-owned-bytes-assigned', 'tensor/stack.cc',
      'batch->owned_bytes += block->size();',
      'batch->owned_bytes = block->size();',
      "the batch's owned bytes forget its other columns"),
    M('mx-skip-dropped', 'mix/mix_stream.cc',
      '    s.skip = row % s.source_batch_size;\n',
      '    s.skip = 0;\n',
      'a resumed stream re-reads the rows of a source batch already used'),
    M('mx-in-place-other-sources-rows', 'mix/mix_stream.cc',
      'for (size_t o = 0; o < s; ++o) row += starts_[o][b + 1] - starts_[o][b];',
      'for (size_t o = 0; o + 1 < s; ++o) row += starts_[o][b + 1] - starts_[o][b];',
      "in place: a source's rows written over an earlier source's"),
    M('mx-in-place-wrap-unchecked', 'mix/mix_stream.cc',
      '    if (starts[i][n] > source.loader->batch_rows(epoch, source.seed)) return none;\n',
      '',
      'in place although a source wraps'),
    M('mx-segment-block-start', 'mix/mix_stream.cc',
      'if (t % L == 0 || s[t] != s[t - 1])',
      'if (s[t] != s[t - 1])',
      'mixed cu_seqlens miss a block start whose segment index equals the last'),
    M('mx-pad-multiple-of', 'mix/mix_stream.cc',
      '        extent = (extent + m - 1) / m * m;\n',
      '',
      'mixed padded lists ignore multiple_of'),
    M('mx-pad-source-side-ignored', 'mix/mix_stream.cc',
      '(row * in_length + (list.collate.pad_left ? in_length - valid : 0)) * element',
      '(row * in_length) * element',
      'a source row padded on the left read from its padding'),
    M('mx-pad-value-dropped', 'mix/mix_stream.cc',
      '    if (list.collate.pad_value != 0) {\n',
      '    if (false) {\n',
      "the mixture pads lists with 0, not the collate's value"),
    M('mx-group-by-source', 'mix/mix_stream.cc',
      'for (int64_t k = 0; k < need_[i]; ++k) draws_[r++] = static_cast<int32_t>(i);',
      'for (int64_t k = 0; k < need_[i]; ++k) draws_[r++] = static_cast<int32_t>(sources_.size() - 1 - i);',
      "a batch's rows grouped in reversed source order"),
    M('pk-eos-dropped', 'pack/packer.cc',
      'if (copy < m) std::memcpy(tok + (t + copy) * elem, eos.data(), elem);',
      '',
      'no separator token after a document'),
    M('pk-block-segments-continue', 'pack/packer.cc',
      '    if (t % L == 0) in_block = -1;  // a new block\n',
      '',
      'document_ids do not restart at each block'),
    M('pk-pad-mask-on', 'pack/packer.cc',
      '      seg[t + j] = -1;\n      msk[t + j] = 0;',
      '      seg[t + j] = -1;\n      msk[t + j] = 1;',
      'padding counted in the loss mask'),
    M('pk-continued-position', 'pack/packer.cc',
      'pos[t + j] = k + j;',
      'pos[t + j] = j;',
      'a document continued from an earlier block restarts its positions'),
]


# Tests known to fail now and then on unmutated code; their failures never count as a
# kill (and a test that fails when the killers are rerun on the unmutated build, below,
# is reported). Empty: Loader.RanksSharingACacheInThreadsGetTheirUncachedBatches, which
# the first runs found flaky, was made deterministic (commit 3a0f9d4).
KNOWN_FLAKY: set[str] = set()


def sync_tree(dst: Path) -> None:
    """Copy cpp/, cmake/, examples/cpp/ (the tests build and run its program) and
    CMakeLists.txt to `dst`, writing only files whose content differs (so that ninja
    rebuilds only what changed) and deleting files gone here."""
    wanted: set[Path] = set()
    for rel in ("cpp", "cmake", "examples/cpp", "CMakeLists.txt"):
        src = REPO / rel
        files = [src] if src.is_file() else [p for p in src.rglob("*") if p.is_file()]
        for f in files:
            r = f.relative_to(REPO)
            wanted.add(r)
            out = dst / r
            if out.exists() and filecmp.cmp(f, out, shallow=False):
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, out)
    for f in list(dst.rglob("*")):
        if f.is_file() and f.relative_to(dst) not in wanted:
            f.unlink()


def run(cmd: list[str], cwd: Path, timeout: float | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def touch(path: Path) -> None:
    now = time.time_ns()
    os.utime(path, ns=(now, now))


FAILED_RE = re.compile(r"^\s*\d+ - (\S+) \((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception|[^)]*)\)")


class Runner:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.root = (REPO / args.build_dir).resolve()
        self.src = self.root / "src"
        self.build = self.root / "build"
        venv = REPO / ".venv" / "bin"
        self.cmake = str(venv / "cmake")
        self.ctest = str(venv / "ctest")
        self.ninja = str(venv / "ninja")
        self.python = str(venv / "python")

    def configure(self) -> None:
        r = run([self.cmake, "-S", str(self.src), "-B", str(self.build), "-G", "Ninja",
                 "-DCMAKE_BUILD_TYPE=Release", f"-DPython_EXECUTABLE={self.python}",
                 "-DPQLOADER_BUILD_TESTS=ON", "-DPQLOADER_WERROR=OFF",
                 f"-DCMAKE_MAKE_PROGRAM={self.ninja}"], REPO)
        if r.returncode != 0:
            sys.exit("cpp_mutants: configure failed:\n" + r.stdout[-4000:])

    def compile(self) -> subprocess.CompletedProcess:
        return run([self.ninja, "-C", str(self.build), f"-j{self.args.jobs}"], REPO)

    def test(self) -> tuple[bool, list[str], float]:
        t0 = time.monotonic()
        r = run([self.ctest, "-j", str(self.args.jobs), "--timeout", str(self.args.test_timeout)],
                self.build, timeout=self.args.test_timeout * 20)
        failed = [m.group(1) + ("" if m.group(2) == "Failed" else f" ({m.group(2)})")
                  for m in map(FAILED_RE.match, r.stdout.splitlines()) if m]
        if r.returncode != 0 and not failed:
            failed = ["(ctest failed: " + (r.stdout.strip().splitlines() or ["?"])[-1] + ")"]
        real = [f for f in failed if f.split(" (")[0] not in KNOWN_FLAKY]
        return not real, real, time.monotonic() - t0


def markdown(results: list[dict], elapsed: float) -> str:
    killed = sum(r["status"] == "killed" for r in results)
    survived = sum(r["status"] == "survived" for r in results)
    nocompile = sum(r["status"] == "did not compile" for r in results)
    rate = 100.0 * killed / max(1, killed + survived)
    lines = ["| mutant | file | bug | result | killed by |", "| --- | --- | --- | --- | --- |"]
    for r in results:
        m: Mutant = r["mutant"]
        by = ", ".join(r["failed"][:3]) + (f" (+{len(r['failed']) - 3})" if len(r["failed"]) > 3 else "")
        lines.append(f"| {m.id} | {m.file} | {m.description} | {r['status']} | {by} |")
    lines.append("")
    lines.append(f"C++ mutants: {len(results)}, killed {killed}, survived {survived}, "
                 f"did not compile {nocompile}; kill rate {rate:.1f} % "
                 f"(killed / (killed + survived)); {elapsed:.0f} s"
                 + (f". Failures of {', '.join(sorted(KNOWN_FLAKY))} (flaky) are not counted as kills."
                    if KNOWN_FLAKY else "."))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build/mutants", help="scratch dir (relative to the repo)")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("JOBS", "2")))
    ap.add_argument("--test-timeout", type=int, default=30, help="seconds per test (ctest --timeout)")
    ap.add_argument("--only", default="", help="comma-separated mutant ids")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--report", default="build/mutants/cpp-report.md", help="markdown report (repo-relative)")
    ap.add_argument("--threshold", type=float, default=90.0, help="lowest passing kill rate, percent")
    args = ap.parse_args()

    ids = [m.id for m in MUTANTS]
    assert len(ids) == len(set(ids)), "duplicate mutant ids"
    selected = MUTANTS
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - set(ids)
        if unknown:
            sys.exit(f"cpp_mutants: unknown ids {sorted(unknown)}")
        selected = [m for m in MUTANTS if m.id in wanted]
    # Every snippet must occur exactly once in the working tree's file.
    for m in selected:
        n = (REPO / SRC / m.file).read_text().count(m.original)
        if n != 1:
            sys.exit(f"cpp_mutants: {m.id}: the original snippet occurs {n} times in {m.file}")
    if args.list:
        for m in selected:
            print(f"{m.id:38} {m.file:28} {m.description}")
        return 0

    t_start = time.monotonic()
    r = Runner(args)
    r.src.mkdir(parents=True, exist_ok=True)
    sync_tree(r.src)
    r.configure()
    print("cpp_mutants: baseline build ...", flush=True)
    b = r.compile()
    if b.returncode != 0:
        sys.exit("cpp_mutants: the unmutated build fails:\n" + b.stdout[-4000:])
    ok, failed, secs = r.test()
    if not ok:
        sys.exit(f"cpp_mutants: the unmutated test suite fails ({', '.join(failed)}); fix that first")
    # (failures of KNOWN_FLAKY tests are ignored here too)
    print(f"cpp_mutants: baseline passes ({secs:.1f} s of tests); {len(selected)} mutants", flush=True)

    results = []
    for i, m in enumerate(selected, 1):
        path = r.src / SRC / m.file
        original = path.read_text()
        assert original.count(m.original) == 1, m.id
        t0 = time.monotonic()
        try:
            path.write_text(original.replace(m.original, m.replacement))
            touch(path)
            b = r.compile()
            if b.returncode != 0:
                status, failed = "did not compile", []
            else:
                try:
                    ok, failed, _ = r.test()
                    status = "survived" if ok else "killed"
                except subprocess.TimeoutExpired:
                    status, failed = "killed", ["(ctest hung)"]
        finally:
            path.write_text(original)
            touch(path)
        results.append({"mutant": m, "status": status, "failed": failed})
        by = f" by {', '.join(failed[:2])}" if failed else ""
        print(f"[{i}/{len(selected)}] {m.id}: {status}{by} ({time.monotonic() - t0:.0f} s)", flush=True)

    # The tests that killed mutants must pass on the unmutated code (not flaky): rebuild
    # it and run each of them ten times.
    killers = sorted({f.split(" (")[0] for x in results for f in x["failed"] if not f.startswith("(")})
    flaky = []
    if killers:
        b = r.compile()
        if b.returncode != 0:
            sys.exit("cpp_mutants: the restored tree does not build:\n" + b.stdout[-4000:])
        for name in killers:
            q = run([r.ctest, "-R", "^" + re.escape(name) + "$", "--repeat", "until-fail:10",
                     "--timeout", str(args.test_timeout)], r.build)
            if q.returncode != 0:
                flaky.append(name)
        print(f"cpp_mutants: {len(killers)} killing tests rerun 10 times on the unmutated build: "
              f"{'all pass' if not flaky else 'FAIL: ' + ', '.join(flaky)}", flush=True)
        # A mutant that only tests failing on the unmutated code killed is not killed.
        for x in results:
            if x["status"] == "killed" and x["failed"] and all(f.split(" (")[0] in flaky for f in x["failed"]):
                x["status"] = "survived"
                x["failed"] = [f"(only flaky {', '.join(x['failed'])})"]

    report = markdown(results, time.monotonic() - t_start)
    if flaky:
        report += "\n\nTests that killed mutants but also fail on the unmutated code: " + ", ".join(flaky)
    out = REPO / args.report
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report + "\n")
    print()
    print(report)
    print(f"\n(report written to {args.report})")
    killed = sum(x["status"] == "killed" for x in results)
    survived = sum(x["status"] == "survived" for x in results)
    rate = 100.0 * killed / max(1, killed + survived)
    return 0 if rate >= args.threshold and not flaky else 1


if __name__ == "__main__":
    sys.exit(main())
