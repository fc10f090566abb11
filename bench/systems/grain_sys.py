"""Google's Grain (`grain` from PyPI, its pure-Python dataset API) on the tokens workload.

`grain.experimental.ParquetIterDataset(files)` reads each row group with pyarrow and yields
one dict of NumPy values per row; then
  output "pad":  `.batch(batch_size, batch_fn=pad)`: right-padded int32 [N, L] + lengths
                 (L = the batch's longest row), as every other padded row;
  output "pack": `grain.experimental.ConcatThenSplitIterDataset(length_struct={"tokens": N})`
                 (documents concatenated and cut into blocks of N tokens, split across
                 blocks, segment ids and positions per token), `.batch(blocks)`.
num_workers > 0 adds `.mp_prefetch(MultiprocessingOptions(num_workers))` (files are
divided between the worker processes). Grain's Parquet source has no row-level shuffle;
a shuffled epoch permutes the file order (seeded), like the torch DataLoader rows.
"""
from __future__ import annotations

import logging

import numpy as np

logging.getLogger("absl").setLevel(logging.ERROR)

import grain  # noqa: E402
import grain.experimental as ge  # noqa: E402

import common as C  # noqa: E402


def pad_batch(rows):
    """Right-pad a list of token rows -> tokens [N, L] int32, lengths, label."""
    lengths = np.fromiter((len(r["tokens"]) for r in rows), np.int64, count=len(rows))
    out = np.zeros((len(rows), int(lengths.max()) if len(rows) else 0), np.int32)
    for i, r in enumerate(rows):
        out[i, : lengths[i]] = r["tokens"]
    return {"tokens": out, "lengths": lengths, "label": np.array([r["label"] for r in rows])}


def packed_names(batch):
    """Grain's packed features under the names the measurement reads (segment ids 1..k, 0 on
    padding -> document_ids, loss_mask)."""
    seg = batch["tokens_segment_ids"]
    return {"tokens": batch["tokens"], "position_ids": batch["tokens_positions"],
            "document_ids": seg, "loss_mask": seg > 0}


class Adapter:
    def __init__(self, workload, data_dir, manifest, cfg):
        if workload != "tokens":
            raise NotImplementedError("the grain system runs the tokens workload only")
        self.cfg = cfg
        self.files = C.parquet_files(data_dir, workload)
        self.output = cfg.get("output", "pad")
        self.nw = int(cfg.get("num_workers", 0))
        self.seq_len = int(cfg.get("pack", C.PACK_SEQ_LEN))
        self.bs = manifest["batch_size"] if self.output == "pad" else int(cfg.get("pack_blocks", C.PACK_BLOCKS))

    def describe(self):
        d = "grain.experimental.ParquetIterDataset(files)"
        if self.output == "pack":
            d += (f" -> ConcatThenSplitIterDataset(length_struct={{'tokens': {self.seq_len}}}) -> "
                  f".batch({self.bs})")
        else:
            d += f" -> .batch({self.bs}, batch_fn=pad to the longest row)"
        if self.nw:
            d += f" -> .mp_prefetch(num_workers={self.nw})"
        return d + "; shuffled epochs permute the file order"

    def epoch(self, e, shuffle=False, seed=None):
        files = list(self.files)
        if shuffle:
            np.random.default_rng((seed or 0) + e).shuffle(files)
        ds = ge.ParquetIterDataset(files)
        if self.output == "pack":
            ds = ds.map(lambda r: {"tokens": r["tokens"]})
            ds = ge.ConcatThenSplitIterDataset(ds, length_struct={"tokens": self.seq_len})
            ds = ds.batch(self.bs).map(packed_names)
        else:
            ds = ds.batch(self.bs, batch_fn=pad_batch)
        if self.nw:
            ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=self.nw))
        it = iter(ds)
        try:
            yield from it
        finally:
            del it
