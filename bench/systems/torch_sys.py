"""Plain torch.utils.data.DataLoader over pyarrow row groups (no framework).

An IterableDataset hands row groups round-robin to the DataLoader workers;
each worker reads its row group with pyarrow.ParquetFile.iter_batches and
converts/decodes it into the common batch format (images: PIL decode +
resize in the worker). batch_size=None: the dataset yields whole batches.
"""
from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

import common as C


class RowGroupBatches(IterableDataset):
    def __init__(self, files, columns, workload, batch_size, use_threads, shuffle=False, seed=0):
        self.units = []
        for f in files:
            n = pq.ParquetFile(f).metadata.num_row_groups
            self.units += [(f, rg) for rg in range(n)]
        if shuffle:
            np.random.default_rng(seed).shuffle(self.units)
        self.columns, self.workload, self.batch_size, self.use_threads = columns, workload, batch_size, use_threads

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        for i, (f, rg) in enumerate(self.units):
            if i % nw != wid:
                continue
            pf = pq.ParquetFile(f)
            for rb in pf.iter_batches(batch_size=self.batch_size, row_groups=[rg], columns=self.columns,
                                      use_threads=self.use_threads):
                yield C.arrow_to_batch(rb, self.workload)


class Adapter:
    def __init__(self, workload, data_dir, manifest, cfg):
        self.workload, self.cfg = workload, cfg
        self.files = C.parquet_files(data_dir, workload)
        self.columns = C.columns_for(workload)
        self.bs = manifest["batch_size"]
        self.nw = int(cfg.get("num_workers", 0))
        torch.set_num_threads(1)

    def describe(self):
        return (f"torch.utils.data.DataLoader(IterableDataset over row groups, batch_size=None, "
                f"num_workers={self.nw}, prefetch_factor={2 if self.nw else None}); pyarrow iter_batches "
                f"use_threads={self.nw == 0}; decode in {'workers' if self.nw else 'main process'}")

    def epoch(self, e, shuffle=False, seed=None):
        ds = RowGroupBatches(self.files, self.columns, self.workload, self.bs, use_threads=self.nw == 0,
                             shuffle=shuffle, seed=(seed or 0) + e)
        dl = DataLoader(ds, batch_size=None, num_workers=self.nw, prefetch_factor=2 if self.nw else None,
                        persistent_workers=False)
        it = iter(dl)
        try:
            yield from it
        finally:
            del it  # shuts the worker processes down
