// Packing: a batch of fixed-length blocks made from documents (see pack_plan.h).
//
// Outputs, each [blocks, seq_len] but cu_seqlens: the tokens (the token column's
// dtype; padding = PackOptions::pad_value), position_ids (int64, a token's index in its
// document: a document continued from the previous block goes on counting),
// document_ids (int64, the segment's index in its block; -1 on padding), loss_mask
// (bool, false on padding), cu_seqlens (int32, the boundaries of the segments over the
// flattened batch, for variable-length attention kernels: a block boundary always
// starts a segment), and per-token copies of scalar companion columns (0 on padding).
// Thread-safety: pure functions.
#pragma once

#include <memory>
#include <vector>

#include <arrow/memory_pool.h>
#include <arrow/result.h>

#include "pqloader/pack/pack_plan.h"
#include "pqloader/tensor/batch.h"

namespace pqloader {

/// Names of the outputs after the token column, in order.
const std::vector<std::string>& PackedOutputNames();

/// Make blocks [b0, b1) of `pack` from `docs`, the documents of
/// pack.BlocksSpan(b0, b1) in stream order (RowRef::unit indexes `units` after
/// subtracting `unit_base`). Columns of the batch: the token column, the outputs of
/// PackedOutputNames(), then `companions` (indices into `specs`).
arrow::Result<std::shared_ptr<Batch>> PackBatch(
    const std::vector<ColumnSpec>& specs, const PackOptions& options, const PackPlan& pack,
    int64_t b0, int64_t b1, const std::vector<std::shared_ptr<const DecodedUnit>>& units,
    int64_t unit_base, const std::vector<RowRef>& docs, const std::vector<int>& companions,
    arrow::MemoryPool* pool);

}  // namespace pqloader
