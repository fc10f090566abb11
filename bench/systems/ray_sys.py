"""Ray Data: read_parquet -> (map_batches decode) -> iter_torch_batches.

ray.init(num_cpus=os.cpu_count()) happens in the constructor, so it is part
of time-to-first-batch. Each epoch re-executes the lazy Dataset (streaming
executor), as `for epoch: ds.iter_torch_batches()` does in Ray Train.
"""
from __future__ import annotations

import logging
import os


os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import ray  # noqa: E402
import torch  # noqa: E402

import common as C  # noqa: E402


def _decode_images(batch):
    batch["image"] = C.decode_images(batch["image"])
    return batch


def _decode_npy(batch):
    batch["array"] = C.decode_npys(batch["array"])
    return batch


def _pad_collate(batch):
    toks, lens = C.pad_sequences(list(batch["tokens"]))
    return {"tokens": torch.from_numpy(toks), "lengths": torch.from_numpy(lens),
            "label": torch.as_tensor(batch["label"])}


class Adapter:
    def __init__(self, workload, data_dir, manifest, cfg):
        self.workload, self.cfg = workload, cfg
        self.bs = manifest["batch_size"]
        ncpu = int(cfg.get("num_cpus", os.cpu_count()))
        store = int(cfg.get("object_store_gb", 2) * 2**30)
        ray.init(num_cpus=ncpu, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
                 object_store_memory=store, configure_logging=False)
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
        try:
            ctx.enable_operator_progress_bars = False
        except Exception:  # noqa: BLE001
            pass
        self.files = C.parquet_files(data_dir, workload)
        self.columns = C.columns_for(workload)
        self.ncpu = ncpu

    def describe(self):
        d = f"ray.init(num_cpus={self.ncpu}); read_parquet"
        if self.workload == "images":
            d += " -> map_batches(PIL decode+resize)"
        elif self.workload == "ndarray":
            d += " -> map_batches(np.load)"
        d += f" -> iter_torch_batches(batch_size={self.bs}, prefetch_batches=2"
        d += ", padding collate_fn)" if self.workload == "tokens" else ")"
        return d

    def _ds(self, shuffle, seed):
        ds = ray.data.read_parquet(self.files, columns=self.columns, shuffle="files" if shuffle else None)
        if self.workload == "images":
            ds = ds.map_batches(_decode_images, batch_format="numpy", batch_size=self.bs)
        elif self.workload == "ndarray":
            ds = ds.map_batches(_decode_npy, batch_format="numpy", batch_size=self.bs)
        return ds

    def epoch(self, e, shuffle=False, seed=None):
        ds = self._ds(shuffle, seed)
        kw = dict(batch_size=self.bs, prefetch_batches=2)
        if self.workload == "tokens":
            kw["collate_fn"] = _pad_collate
        it = iter(ds.iter_torch_batches(**kw))
        try:
            yield from it
        finally:
            close = getattr(it, "close", None)
            if close:
                close()  # stops the prefetch thread of an abandoned epoch

    def close(self):
        ray.shutdown()
