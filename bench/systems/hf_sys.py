"""Hugging Face `datasets` reading the Parquet files.

load_dataset("parquet", data_files=..., num_proc=N) converts the files into
its Arrow cache (a fresh cache_dir per measurement, so epoch 1 / time to
first batch include that conversion, as on first use); epochs then read
the memory-mapped Arrow table. Batches: contiguous slices in Arrow format
(`with_format("arrow")`, the zero-copy fast path) fetched through a
torch DataLoader with `num_workers` processes, which also do the decode.

config collate: "pad_sequence" (tokens) -> the usual way instead: `with_format("torch")`,
a torch DataLoader(batch_size, shuffle) over the rows and a collator that pads them with
`torch.nn.utils.rnn.pad_sequence` (longest row of the batch) + lengths.
"""
from __future__ import annotations

import gc
import os
import shutil
import tempfile

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

import datasets  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils.data import DataLoader, Dataset, Sampler  # noqa: E402

import common as C  # noqa: E402

datasets.disable_progress_bars()
datasets.logging.set_verbosity_error()


class _Slices(Sampler):
    def __init__(self, n, bs, order):
        self.n, self.bs, self.order = n, bs, order

    def __iter__(self):
        for i in self.order:
            yield slice(i * self.bs, min(self.n, (i + 1) * self.bs))

    def __len__(self):
        return len(self.order)


class _SliceView(Dataset):
    """Map-style view whose keys are slices -> Arrow table -> common batch."""

    def __init__(self, ds, workload):
        self.ds, self.workload = ds, workload

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, key):
        return C.arrow_to_batch(self.ds[key], self.workload)


def pad_collate(rows):
    """The collator a Hugging Face user writes for token rows of different lengths."""
    tokens = [r["tokens"] for r in rows]
    return {"tokens": torch.nn.utils.rnn.pad_sequence(tokens, batch_first=True, padding_value=0),
            "lengths": torch.tensor([len(t) for t in tokens]),
            "label": torch.stack([r["label"] for r in rows])}


class Adapter:
    def __init__(self, workload, data_dir, manifest, cfg):
        self.workload, self.cfg = workload, cfg
        self.bs = manifest["batch_size"]
        self.nw = int(cfg.get("num_workers", 2))
        self.num_proc = cfg.get("num_proc", os.cpu_count())
        self.cache_dir = tempfile.mkdtemp(prefix="hf-cache-", dir=cfg.get("tmp"))
        self.files = C.parquet_files(data_dir, workload)
        self.ds = None
        torch.set_num_threads(1)

    def describe(self):
        if self.cfg.get("collate"):
            return (f"load_dataset('parquet', num_proc={self.num_proc}) -> Arrow cache; with_format('torch'); "
                    f"torch DataLoader(batch_size={self.bs}, shuffle, num_workers={self.nw}, "
                    "collate_fn=pad_sequence(batch_first=True) + lengths)")
        return (f"load_dataset('parquet', num_proc={self.num_proc}) -> Arrow cache; with_format('arrow') "
                f"contiguous slices of {self.bs} via torch DataLoader(num_workers={self.nw})")

    def _dataset(self):
        if self.ds is None:
            ds = datasets.load_dataset("parquet", data_files=self.files, split="train", cache_dir=self.cache_dir,
                                       num_proc=self.num_proc if self.num_proc and self.num_proc > 1 else None)
            self.ds = ds.with_format("arrow")
        return self.ds

    def _collated_epoch(self, e, shuffle, seed):
        ds = self._dataset().with_format("torch")
        g = torch.Generator()
        g.manual_seed((seed or 0) + e)
        dl = DataLoader(ds, batch_size=self.bs, shuffle=shuffle, generator=g, collate_fn=pad_collate,
                        num_workers=self.nw, prefetch_factor=2 if self.nw else None)
        it = iter(dl)
        try:
            yield from it
        finally:
            del it

    def epoch(self, e, shuffle=False, seed=None):
        if self.cfg.get("collate"):
            yield from self._collated_epoch(e, shuffle, seed)
            return
        ds = self._dataset()
        nb = (len(ds) + self.bs - 1) // self.bs
        order = np.arange(nb)
        if shuffle:
            np.random.default_rng((seed or 0) + e).shuffle(order)
        dl = DataLoader(_SliceView(ds, self.workload), sampler=_Slices(len(ds), self.bs, order.tolist()),
                        batch_size=None, num_workers=self.nw, prefetch_factor=2 if self.nw else None)
        it = iter(dl)
        try:
            yield from it
        finally:
            del it

    def restart(self):
        """Drop the memory-mapped Arrow table: the next epoch maps the cache files anew, as a
        fresh process would (pages a process maps are not dropped from the page cache)."""
        self.ds = None
        gc.collect()

    def cold_dirs(self):
        """What the epochs read instead of the Parquet files (its Arrow cache): a cold
        epoch must not find it in the page cache either."""
        return [self.cache_dir]

    def close(self):
        self.ds = None
        shutil.rmtree(self.cache_dir, ignore_errors=True)
