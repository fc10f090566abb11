"""Shared helpers for the pqloader benchmark suite.

Imported by every measurement subprocess, whatever venv it runs in, so it
depends on the standard library and NumPy only (Pillow is imported lazily
for the image workload).
"""
from __future__ import annotations

import io
import json
import os
import time

import numpy as np

# ---------------------------------------------------------------- workloads
IMAGE_SIZE = 224  # every system decodes, resizes (shorter side 256) and center-crops JPEGs to 224x224x3 uint8
RESIZE_SHORT = 256

WORKLOADS = ("tabular", "images", "ndarray", "tokens")

# Per-workload batch size, identical for every system.
BATCH_SIZE = {"tabular": 1024, "images": 64, "ndarray": 128, "tokens": 256}

# Dataset sizes per scale: rows, rows per file, rows per row group.
# ("small" must keep a full `make bench` under 30 minutes on 2 cores.)
SCALES = {
    "small": {
        "tabular": dict(rows=200_000, rows_per_file=50_000, row_group_rows=25_000),
        "images": dict(rows=2_400, rows_per_file=600, row_group_rows=200),
        "ndarray": dict(rows=8_000, rows_per_file=2_000, row_group_rows=500),
        "tokens": dict(rows=200_000, rows_per_file=50_000, row_group_rows=25_000),
    },
    "medium": {
        "tabular": dict(rows=2_000_000, rows_per_file=250_000, row_group_rows=125_000),
        "images": dict(rows=20_000, rows_per_file=2_500, row_group_rows=500),
        "ndarray": dict(rows=64_000, rows_per_file=8_000, row_group_rows=1_000),
        "tokens": dict(rows=1_600_000, rows_per_file=200_000, row_group_rows=50_000),
    },
    "large": {
        "tabular": dict(rows=10_000_000, rows_per_file=1_000_000, row_group_rows=250_000),
        "images": dict(rows=100_000, rows_per_file=5_000, row_group_rows=1_000),
        "ndarray": dict(rows=320_000, rows_per_file=20_000, row_group_rows=2_000),
        "tokens": dict(rows=8_000_000, rows_per_file=500_000, row_group_rows=100_000),
    },
}

N_FEATURES = 100
N_INT_COLS = 4
NDARRAY_SHAPE = (64, 64)  # float32, stored as np.save bytes (Petastorm NdarrayCodec layout)
TOKENS_MAX_LEN = 1024
TOKENS_VOCAB = 32_000
# Packed outputs of the tokens workload: blocks of PACK_SEQ_LEN tokens, PACK_BLOCKS a batch
# (about the tokens of 256 log-normal sequences, so batches hold as much data as the others').
PACK_SEQ_LEN = 1024
PACK_BLOCKS = 32


def columns_for(workload: str) -> list[str]:
    if workload == "tabular":
        return [f"f{i:03d}" for i in range(N_FEATURES)] + [f"i{i}" for i in range(N_INT_COLS)] + ["label"]
    if workload == "images":
        return ["image", "label"]
    if workload == "ndarray":
        return ["array", "label"]
    if workload == "tokens":
        return ["tokens", "label"]
    raise ValueError(workload)


def decoded_bytes_per_sample(workload: str, manifest: dict | None = None) -> float:
    """Bytes of the batch a trainer receives per sample (what a cache of decoded data must copy)."""
    if workload == "tabular":
        return N_FEATURES * 4 + N_INT_COLS * 8 + 8
    if workload == "images":
        return IMAGE_SIZE * IMAGE_SIZE * 3 + 8
    if workload == "ndarray":
        return int(np.prod(NDARRAY_SHAPE)) * 4 + 8
    if workload == "tokens":
        mean_len = (manifest or {}).get("mean_tokens", 128)
        return mean_len * 4 + 8
    raise ValueError(workload)


def manifest_path(data_dir: str, workload: str) -> str:
    # kept *outside* the Parquet directory so no reader ever sees a non-Parquet file
    return os.path.join(data_dir, workload + ".manifest.json")


def load_manifest(data_dir: str, workload: str) -> dict:
    with open(manifest_path(data_dir, workload)) as f:
        return json.load(f)


def parquet_files(data_dir: str, workload: str) -> list[str]:
    d = os.path.join(data_dir, workload)
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".parquet"))


# ---------------------------------------------------------------- decoding
_PIL = None


def _pil():
    global _PIL
    if _PIL is None:
        from PIL import Image  # noqa: WPS433

        _PIL = Image
    return _PIL


def decode_image(data) -> np.ndarray:
    """The per-sample image work every system does (torchvision's eval transform on PIL):
    full JPEG decode (no Image.draft DCT shortcut) with Pillow's libjpeg-turbo, RGB,
    Resize(256) bilinear on the shorter side, CenterCrop(224) -> uint8 HWC array.
    Bit-exact with pqloader's [DecodeImage(), Resize(256), CenterCrop(224)]."""
    Image = _pil()
    with Image.open(io.BytesIO(data)) as im:
        im = im.convert("RGB")
        w, h = im.size
        if w <= h:
            ow, oh = RESIZE_SHORT, int(RESIZE_SHORT * h / w)
        else:
            oh, ow = RESIZE_SHORT, int(RESIZE_SHORT * w / h)
        im = im.resize((ow, oh), Image.BILINEAR)
        top, left = int(round((oh - IMAGE_SIZE) / 2.0)), int(round((ow - IMAGE_SIZE) / 2.0))
        return np.asarray(im.crop((left, top, left + IMAGE_SIZE, top + IMAGE_SIZE)))


def decode_images(blobs) -> np.ndarray:
    out = np.empty((len(blobs), IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8)
    for i, b in enumerate(blobs):
        out[i] = decode_image(b)
    return out


def decode_npy(data) -> np.ndarray:
    """Petastorm NdarrayCodec layout: the bytes of np.save."""
    return np.load(io.BytesIO(data), allow_pickle=False)


def decode_npys(blobs) -> np.ndarray:
    first = decode_npy(blobs[0])
    out = np.empty((len(blobs),) + first.shape, dtype=first.dtype)
    out[0] = first
    for i in range(1, len(blobs)):
        out[i] = decode_npy(blobs[i])
    return out


def pad_sequences(seqs, max_len: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad a list of 1-D int arrays -> (tokens[N, L] int32, lengths[N] int64)."""
    lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
    width = int(lengths.max()) if max_len is None and len(seqs) else (max_len or 0)
    out = np.zeros((len(seqs), width), dtype=np.int32)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out, lengths


def pad_from_arrow(list_array) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised padding straight from an Arrow ListArray (offsets + values)."""
    import pyarrow as pa  # noqa: WPS433

    if isinstance(list_array, pa.ChunkedArray):
        list_array = list_array.combine_chunks()
    offsets = list_array.offsets.to_numpy()
    values = list_array.flatten().to_numpy()
    offsets = offsets - offsets[0]
    lengths = np.diff(offsets).astype(np.int64)
    n = len(lengths)
    width = int(lengths.max()) if n else 0
    out = np.zeros((n, width), dtype=np.int32)
    mask = np.arange(width)[None, :] < lengths[:, None]
    out[mask] = values
    return out, lengths


def arrow_to_batch(table, workload: str) -> dict:
    """Arrow Table/RecordBatch -> the batch a trainer gets (same for every system):
    tabular: dict of 1-D arrays; images: uint8 [N,224,224,3]; ndarray: float32 [N,64,64];
    tokens: right-padded int32 [N,L] + lengths."""
    cols = table.column_names
    out = {}
    for name in cols:
        col = table.column(name)
        if workload == "images" and name == "image":
            out[name] = decode_images(col.to_pylist())
        elif workload == "ndarray" and name == "array":
            out[name] = decode_npys(col.to_pylist())
        elif workload == "tokens" and name == "tokens":
            out["tokens"], out["lengths"] = pad_from_arrow(col)
        else:
            out[name] = col.to_numpy()
    return out


# ---------------------------------------------------------------- hashing
def _to_numpy(v):
    if hasattr(v, "detach") and hasattr(v, "numpy"):  # torch tensor
        return v.detach().cpu().numpy()
    return v


def hash_batch(h, batch) -> None:
    """Feed one batch (dict column -> array/tensor/list) into hashlib object h."""
    if isinstance(batch, dict):
        items = sorted(batch.items())
    else:
        items = [("", batch)]
    for name, v in items:
        h.update(name.encode())
        v = _to_numpy(v)
        if isinstance(v, np.ndarray) and v.dtype != object:
            v = np.ascontiguousarray(v)
            h.update(str(v.dtype).encode() + str(v.shape).encode())
            h.update(v.tobytes())
        else:
            for x in v:
                x = _to_numpy(x)
                h.update(x.tobytes() if isinstance(x, np.ndarray) else bytes(x) if isinstance(x, (bytes, bytearray, memoryview)) else repr(x).encode())


def is_packed(batch) -> bool:
    """A batch of packed token blocks (tokens, position_ids, ..., loss_mask)."""
    return isinstance(batch, dict) and "position_ids" in batch and "loss_mask" in batch


def batch_len(batch) -> int:
    """Rows of a batch (of a ragged token batch: its `tokens_offsets` minus one). Packed
    blocks have no rows of their own: measure.py counts their tokens (batch_tokens) and
    converts them to documents with the dataset's mean length."""
    if isinstance(batch, dict):
        if "tokens_offsets" in batch:
            return len(batch["tokens_offsets"]) - 1
        v = next(iter(batch.values()))
    else:
        v = batch
    if hasattr(v, "shape"):
        return int(v.shape[0])
    return len(v)


def batch_tokens(batch) -> int | None:
    """Tokens (not padding) of a batch of the tokens workload; None for other batches."""
    if not isinstance(batch, dict) or "tokens" not in batch:
        return None
    if "tokens_offsets" in batch:
        o = batch["tokens_offsets"]
        return int(o[-1] - o[0])
    if "loss_mask" in batch:
        return int(_to_numpy(batch["loss_mask"]).sum())
    for key in ("lengths", "tokens_length"):
        if key in batch:
            return int(_to_numpy(batch[key]).sum())
    t = _to_numpy(batch["tokens"])
    return int(t.size) if hasattr(t, "size") else None


def label_column(batch):
    if isinstance(batch, dict) and "label" in batch:
        return _to_numpy(batch["label"])
    return None


# ---------------------------------------------------------------- process tree accounting
_CLK = os.sysconf("SC_CLK_TCK")


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rfind(b")") + 2 :].split()
        kids.setdefault(int(rest[1]), []).append(int(d))
    return kids


def process_tree(root: int) -> list[int]:
    kids = _children_map()
    out, stack = [], [root]
    while stack:
        p = stack.pop()
        out.append(p)
        stack.extend(kids.get(p, ()))
    return out


def tree_cpu_seconds(root: int | None = None) -> float:
    """user+sys CPU of a process tree, including reaped children (cutime/cstime)."""
    total = 0
    for pid in process_tree(root or os.getpid()):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rfind(b")") + 2 :].split()
        # fields 14..17 (1-based) -> rest indices 11..14
        total += sum(int(x) for x in rest[11:15])
    return total / _CLK


def tree_memory_mb(root: int) -> tuple[float, float]:
    """(sum of PSS, sum of RSS) over a process tree, in MiB."""
    pss = rss = 0
    for pid in process_tree(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        pss += int(line.split()[1])
                    elif line.startswith("Rss:"):
                        rss += int(line.split()[1])
        except OSError:
            continue
    return pss / 1024.0, rss / 1024.0


def now() -> float:
    return time.perf_counter()


def evict_page_cache(directory: str) -> None:
    """Drop the pages of every file below `directory` from the page cache
    (posix_fadvise DONTNEED after fsync), so the next read comes from the disk."""
    for root, _, files in os.walk(directory):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
