"""pqloader (the system under test), run with /work/main/.venv's python.

Images: pqloader has no decode transforms yet, so the consumer decodes the
`image` bytes with PIL in a thread pool of os.cpu_count() threads (PIL
releases the GIL while decoding/resizing). Once pqloader grows transforms,
set IMAGE_TRANSFORMS below (or pass {"native_decode": true} in the config)
and the consumer-side decode is skipped.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pqloader

import common as C


def native_image_transforms():
    """Hook for pqloader's future decode path; return the `transforms=` argument or None."""
    tr = getattr(pqloader, "transforms", None)
    if tr is None:
        return None
    # TODO(pqloader transforms): e.g. return {"image": tr.DecodeJpeg(size=(C.IMAGE_SIZE, C.IMAGE_SIZE))}
    return None


class Adapter:
    def __init__(self, workload, data_dir, manifest, cfg):
        self.workload, self.cfg = workload, cfg
        self.source = os.path.join(data_dir, workload)
        if cfg.get("source") == "files":
            self.source = C.parquet_files(data_dir, workload)
        self.columns = C.columns_for(workload)
        self.bs = manifest["batch_size"]
        self.nw = cfg.get("num_workers")
        self.transforms = native_image_transforms() if (workload == "images" and cfg.get("native_decode")) else None
        self.pool = ThreadPoolExecutor(os.cpu_count() or 1) if workload == "images" and self.transforms is None else None
        self._stats = []

    def describe(self):
        d = f"pqloader.Loader(batch_size={self.bs}, num_workers={self.nw}, shuffle=False)"
        if self.workload == "images":
            d += (" + native transforms" if self.transforms is not None else
                  f" + PIL decode in consumer ThreadPool({os.cpu_count()}) (no transforms yet)")
        return d

    def _loader(self, shuffle, seed):
        kw = dict(columns=self.columns, batch_size=self.bs, num_workers=self.nw, shuffle=shuffle, seed=seed,
                  num_epochs=1, drop_last=False)
        if self.transforms is not None:
            kw["transforms"] = self.transforms
        return pqloader.Loader(self.source, **kw)

    def _decode_images(self, blobs):
        n = len(blobs)
        out = np.empty((n, C.IMAGE_SIZE, C.IMAGE_SIZE, 3), dtype=np.uint8)
        k = max(1, (n + (os.cpu_count() or 1) - 1) // (os.cpu_count() or 1))

        def work(lo):
            for i in range(lo, min(n, lo + k)):
                out[i] = C.decode_image(blobs[i])

        list(self.pool.map(work, range(0, n, k)))
        return out

    def epoch(self, e, shuffle=False, seed=None):
        loader = self._loader(shuffle, seed)
        try:
            for b in loader:
                if self.workload == "images" and self.transforms is None:
                    b["image"] = self._decode_images(b["image"])
                elif self.workload == "ndarray":
                    a = b["array"]
                    if not isinstance(a, np.ndarray) or a.dtype == object:  # list[bytes] of .npy blobs
                        b["array"] = C.decode_npys(a)
                elif self.workload == "tokens":
                    t = b["tokens"]
                    if not (isinstance(t, np.ndarray) and t.ndim == 2):
                        b["tokens"], b["lengths"] = C.pad_sequences(t)
                yield b
        finally:
            try:
                self._stats.append(loader.stats())
            except Exception:  # noqa: BLE001
                pass

    def extra(self):
        return {"pqloader_stats": self._stats[:2]}

    def close(self):
        if self.pool:
            self.pool.shutdown()
