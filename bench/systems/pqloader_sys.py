"""pqloader (the system under test), run with the project .venv's python.

config:
  native: false -> raw columns; the consumer decodes: images with PIL in a thread pool of
                   os.cpu_count() threads (PIL releases the GIL), .npy blobs with np.load;
                   ragged tokens are not supported without a transform (pqloader raises)
  native: true  -> pqloader's C++ per-sample transforms (NATIVE_TRANSFORMS below): the same work,
                   bit-exact with common.decode_image for images, done in pqloader's workers
  cache:  true  -> cache_dir=<tmp>: epoch 1 fills pqloader's decoded-sample cache, epoch 2 reads it
  num_workers   -> Loader(num_workers=...)
  tokens only (language-model outputs, issue 16):
  lists: "ragged" -> Loader(lists={"tokens": "ragged"}): values + tokens_offsets
  lists: "pad8"   -> Loader(lists={"tokens": Pad(multiple_of=8)}): [B, L] + tokens_length, L the
                     batch's longest row rounded up to a multiple of 8
  pack: N         -> Loader(columns=["tokens"], pack=Pack("tokens", seq_len=N), batch_size=pack_blocks):
                     blocks of N tokens with position_ids, document_ids, loss_mask, cu_seqlens
One Loader object serves all epochs of a measurement (iterating it again starts the next epoch).
"""
from __future__ import annotations

import gc
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pqloader

import common as C


def native_transforms(workload):
    """pqloader's own decode path for each workload (None: nothing to decode)."""
    from pqloader import transforms as T

    return {
        "images": {"image": [T.DecodeImage(), T.Resize(C.RESIZE_SHORT), T.CenterCrop(C.IMAGE_SIZE)]},
        "ndarray": {"array": [T.DecodeNdarray()]},
        "tokens": {"tokens": [T.PadOrTruncate(C.TOKENS_MAX_LEN)]},
    }.get(workload)


class Adapter:
    def __init__(self, workload, data_dir, manifest, cfg):
        self.workload, self.cfg = workload, cfg
        self.source = os.path.join(data_dir, workload)
        self.columns = C.columns_for(workload)
        self.bs = manifest["batch_size"]
        self.nw = cfg.get("num_workers")
        self.transforms = native_transforms(workload) if cfg.get("native") else None
        self.lists = self.pack = None
        if cfg.get("lists") == "ragged":
            self.lists = {"tokens": "ragged"}
        elif cfg.get("lists") == "pad8":
            self.lists = {"tokens": pqloader.Pad(multiple_of=8)}
        elif cfg.get("lists") is not None:
            raise ValueError(f"unknown lists config {cfg['lists']!r}")
        if cfg.get("pack"):
            self.pack = pqloader.Pack("tokens", seq_len=int(cfg["pack"]))
            self.bs = int(cfg.get("pack_blocks", C.PACK_BLOCKS))
            # A block has no per-row label (pre-training packs tokens alone; Grain's packed row
            # drops it too): selected, it would be copied per token.
            self.columns = ["tokens"]
        self.cache_dir = tempfile.mkdtemp(prefix="pql-cache-", dir=cfg.get("tmp")) if cfg.get("cache") else None
        ncpu = os.cpu_count() or 1
        self.pool = ThreadPoolExecutor(ncpu) if workload == "images" and self.transforms is None else None
        self._loaders = {}
        self._iters = {}

    def describe(self):
        d = f"pqloader.Loader(batch_size={self.bs}, num_workers={self.nw}"
        if self.transforms is not None:
            ops = ", ".join(f"{k}: [{', '.join(type(t).__name__ for t in v)}]" for k, v in self.transforms.items())
            d += f", transforms={{{ops}}}"
        if self.cache_dir:
            d += ", cache_dir=<tmp>"
        if self.lists:
            d += f", lists={{'tokens': {self.lists['tokens']!r}}}"
        if self.pack:
            d += f", pack={self.pack!r}"
        d += ")"
        if self.workload == "images" and self.transforms is None:
            d += f" + PIL decode in consumer ThreadPool({os.cpu_count()}) (no pqloader transforms)"
        elif self.workload == "ndarray" and self.transforms is None:
            d += " + np.load in consumer"
        return d

    def _loader(self, shuffle, seed):
        key = (bool(shuffle), seed)
        if key not in self._loaders:
            # One endless iteration per (shuffle, seed), as a training loop runs it: each
            # epoch() call takes one epoch's batches from it, so the loader starts the next
            # epoch while one ends.
            kw = dict(columns=self.columns, batch_size=self.bs, num_workers=self.nw, shuffle=shuffle, seed=seed,
                      num_epochs=None, drop_last=False)
            if self.transforms is not None:
                kw["transforms"] = self.transforms
            if self.lists is not None:
                kw["lists"] = self.lists
            if self.pack is not None:
                kw["pack"] = self.pack
            if self.cache_dir:
                kw["cache_dir"] = self.cache_dir
            self._loaders[key] = pqloader.Loader(self.source, **kw)
            self._iters[key] = iter(self._loaders[key])
        return self._loaders[key], self._iters[key]

    def restart(self):
        """Drop the running iterations and their loaders (what they read ahead with them):
        the next epoch() makes a new loader, as a fresh process would."""
        self._iters.clear()
        self._loaders.clear()
        gc.collect()

    def cold_dirs(self):
        """Its cache_dir, where the epochs after the first read (evicted with the data
        before a cold epoch)."""
        return [self.cache_dir] if self.cache_dir else []

    def _decode_images(self, blobs):
        n = len(blobs)
        out = np.empty((n, C.IMAGE_SIZE, C.IMAGE_SIZE, 3), dtype=np.uint8)
        ncpu = os.cpu_count() or 1
        k = max(1, -(-n // ncpu))

        def work(lo):
            for i in range(lo, min(n, lo + k)):
                out[i] = C.decode_image(blobs[i])

        list(self.pool.map(work, range(0, n, k)))
        return out

    def epoch(self, e, shuffle=False, seed=None):
        loader, stream = self._loader(shuffle, seed)
        for _ in range(len(loader)):
            b = next(stream)
            if self.transforms is None:
                if self.workload == "images":
                    b["image"] = self._decode_images(b["image"])
                elif self.workload == "ndarray":
                    a = b["array"]
                    if not isinstance(a, np.ndarray) or a.dtype == object:  # list[bytes] of .npy blobs
                        b["array"] = C.decode_npys(a)
                elif self.workload == "tokens" and self.lists is None and self.pack is None:
                    t = b["tokens"]
                    if not (isinstance(t, np.ndarray) and t.ndim == 2):
                        b["tokens"], b["lengths"] = C.pad_sequences(t)
            yield b

    def extra(self):
        out = {}
        for (shuffle, seed), ld in self._loaders.items():
            try:
                out[f"stats(shuffle={shuffle})"] = ld.stats()
            except Exception as e:  # noqa: BLE001
                out["stats_error"] = repr(e)
        return out

    def close(self):
        if self.pool:
            self.pool.shutdown()
        self._iters.clear()
        self._loaders.clear()
        if self.cache_dir:
            shutil.rmtree(self.cache_dir, ignore_errors=True)
