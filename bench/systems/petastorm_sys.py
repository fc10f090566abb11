"""Petastorm 0.13.1 (its own venv: pyarrow 14, NumPy 1.26).

config:
  reader: "batch" -> make_batch_reader(plain Parquet files) + petastorm.pytorch.BatchedDataLoader
          "row"   -> make_reader(<workload>.petastorm, the Unischema view made by petastorm_prep.py)
                     + petastorm.pytorch.DataLoader
  cache:  true -> cache_type='local-disk' (epoch 1 fills it, epoch 2 reads it)
  workers_count, pool ('thread' | 'process')
Images are decoded in a TransformSpec with the shared PIL decoder (224x224).
make_batch_reader cannot return variable-length lists ("Length of all values
in column 'tokens' are expected to be the same"), so its TransformSpec pads
them to TOKENS_MAX_LEN (the row reader pads per batch in a collate_fn).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import warnings

import numpy as np

warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)

from petastorm import TransformSpec, make_batch_reader, make_reader  # noqa: E402
from petastorm.pytorch import BatchedDataLoader, DataLoader  # noqa: E402

import common as C  # noqa: E402


def _tokens_collate(rows):
    import torch

    toks, lens = C.pad_sequences([np.asarray(r["tokens"]) for r in rows])
    return {"tokens": torch.from_numpy(toks), "lengths": torch.from_numpy(lens),
            "label": torch.as_tensor(np.array([r["label"] for r in rows]))}


def _batch_images(df):
    df["image"] = [C.decode_image(b) for b in df["image"]]
    return df


def _batch_npy(df):
    df["array"] = [C.decode_npy(b) for b in df["array"]]
    return df


def _batch_pad_tokens(df):
    """make_batch_reader only yields equal-length lists: pad to the global maximum (the Petastorm way)."""
    lens = df["tokens"].map(len).to_numpy()
    df["tokens"] = [np.pad(np.asarray(t, dtype=np.int32), (0, C.TOKENS_MAX_LEN - len(t))) for t in df["tokens"]]
    df["lengths"] = lens.astype(np.int64)
    return df


def _row_image(row):
    row["image"] = C.decode_image(row["image"])
    return row


class Adapter:
    def __init__(self, workload, data_dir, manifest, cfg):
        self.workload, self.cfg = workload, cfg
        self.bs = manifest["batch_size"]
        self.kind = cfg.get("reader", "batch")
        self.workers = int(cfg.get("workers_count", 2))
        self.pool = cfg.get("pool", "thread")
        self.files = ["file://" + os.path.abspath(f) for f in C.parquet_files(data_dir, workload)]
        self.pst_url = "file://" + os.path.abspath(os.path.join(data_dir, workload + ".petastorm"))
        self.cache_dir = tempfile.mkdtemp(prefix="pst-cache-", dir=cfg.get("tmp")) if cfg.get("cache") else None
        self.columns = C.columns_for(workload)
        self.ddp = manifest.get("uncompressed_bytes", manifest["bytes"]) / max(1, manifest["row_groups"])

    def describe(self):
        loader = "BatchedDataLoader" if self._batched_loader() else "DataLoader"
        r = "make_batch_reader(plain parquet files)" if self.kind == "batch" else "make_reader(Unischema view)"
        d = (f"{r}, reader_pool_type='{self.pool}', workers_count={self.workers}"
             f"{', cache_type=local-disk' if self.cache_dir else ''} + petastorm.pytorch.{loader}(batch_size={self.bs})")
        if self.workload == "images":
            d += "; TransformSpec PIL decode+resize"
        if self.workload == "ndarray" and self.kind == "batch":
            d += "; TransformSpec np.load"
        if self.workload == "tokens":
            d += ("; TransformSpec pads to %d (ragged lists unsupported by make_batch_reader)" % C.TOKENS_MAX_LEN
                  if self.kind == "batch" else "; padding collate_fn")
        return d

    def _batched_loader(self):
        return self.kind == "batch"

    def _reader(self, shuffle, seed):
        kw = dict(reader_pool_type=self.pool, workers_count=self.workers, num_epochs=1,
                  shuffle_row_groups=shuffle, seed=seed)
        if self.cache_dir:
            kw.update(cache_type="local-disk", cache_location=self.cache_dir, cache_size_limit=64 * 2**30,
                      cache_row_size_estimate=int(self.ddp))
        if self.kind == "batch":
            if self.workload == "images":
                kw["transform_spec"] = TransformSpec(_batch_images, edit_fields=[
                    ("image", np.uint8, (C.IMAGE_SIZE, C.IMAGE_SIZE, 3), False)])
            elif self.workload == "ndarray":
                kw["transform_spec"] = TransformSpec(_batch_npy, edit_fields=[
                    ("array", np.float32, C.NDARRAY_SHAPE, False)])
            elif self.workload == "tokens":
                kw["transform_spec"] = TransformSpec(_batch_pad_tokens, edit_fields=[
                    ("tokens", np.int32, (C.TOKENS_MAX_LEN,), False), ("lengths", np.int64, (), False)])
            return make_batch_reader(self.files, schema_fields=self.columns, **kw)
        if self.workload == "images":
            kw["transform_spec"] = TransformSpec(_row_image, edit_fields=[
                ("image", np.uint8, (C.IMAGE_SIZE, C.IMAGE_SIZE, 3), False)])
        return make_reader(self.pst_url, schema_fields=self.columns, **kw)

    def epoch(self, e, shuffle=False, seed=None):
        reader = self._reader(shuffle, seed)
        try:
            if self._batched_loader():
                loader = BatchedDataLoader(reader, batch_size=self.bs, shuffling_queue_capacity=0)
            elif self.workload == "tokens":
                loader = DataLoader(reader, batch_size=self.bs, collate_fn=_tokens_collate)
            else:
                loader = DataLoader(reader, batch_size=self.bs)
            yield from loader
        finally:
            reader.stop()
            reader.join()

    def cold_dirs(self):
        """Its local-disk cache, where epochs after the first read (a cold epoch must not
        find it in the page cache either)."""
        return [self.cache_dir] if self.cache_dir else []

    def close(self):
        if self.cache_dir:
            shutil.rmtree(self.cache_dir, ignore_errors=True)
