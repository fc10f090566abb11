"""Seeded dataset generators (run with the `tools` venv).

    python bench/gen_data.py --out bench/data/small --scale small --seed 1234 [--workloads tabular,images]

Writes <out>/<workload>/part-NNNNN.parquet + manifest.json. Each file is
generated from its own seed (seed, workload, file index), so output is
byte-for-byte reproducible and independent of the worker count.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from multiprocessing import Pool

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

WL_INDEX = {w: i for i, w in enumerate(C.WORKLOADS)}
COMPRESSION = "snappy"


def _rng(seed, workload, part):
    return np.random.default_rng([seed, WL_INDEX[workload], part])


# ------------------------------------------------------------------ tabular
def gen_tabular(rng, n):
    cols = {}
    feats = rng.standard_normal((n, C.N_FEATURES), dtype=np.float32)
    # a few features with realistic structure (ranges / low cardinality)
    feats[:, :10] = np.round(feats[:, :10] * 10) / 10
    for i in range(C.N_FEATURES):
        cols[f"f{i:03d}"] = pa.array(feats[:, i], pa.float32())
    cols["i0"] = pa.array(rng.integers(0, 1_000, n), pa.int64())  # categorical id
    cols["i1"] = pa.array(rng.integers(0, 2**40, n), pa.int64())  # user id
    cols["i2"] = pa.array(np.sort(rng.integers(1_600_000_000, 1_700_000_000, n)), pa.int64())  # timestamp
    cols["i3"] = pa.array(rng.integers(0, 24, n), pa.int64())  # hour
    cols["label"] = pa.array(rng.integers(0, 2, n), pa.int64())
    return pa.table(cols)


# ------------------------------------------------------------------ images
_PHOTOS = None


def _photos():
    """Real photographs shipped inside scikit-image and scikit-learn."""
    global _PHOTOS
    if _PHOTOS is None:
        import skimage.data as d
        from sklearn.datasets import load_sample_images

        names = ["astronaut", "coffee", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry", "retina"]
        photos = [(n, getattr(d, n)()) for n in names]
        s = load_sample_images()
        photos += [(os.path.basename(f), im) for f, im in zip(s.filenames, s.images)]
        _PHOTOS = [(n, np.ascontiguousarray(im[..., :3])) for n, im in photos]
    return _PHOTOS


# ImageNet-like sizes (w, h); 500x375 / 375x500 dominate ImageNet.
_SIZES = [(500, 375)] * 6 + [(375, 500)] * 2 + [(500, 333), (500, 400), (400, 500), (500, 500)]


def make_image(rng) -> bytes:
    from PIL import Image

    photos = _photos()
    _, src = photos[int(rng.integers(len(photos)))]
    w, h = _SIZES[int(rng.integers(len(_SIZES)))]
    sh, sw = src.shape[:2]
    # random rescale so that the crop fits, with extra zoom in [1, 2)
    zoom = max(w / sw, h / sh) * float(rng.uniform(1.0, 2.0))
    im = Image.fromarray(src).resize((max(w, int(round(sw * zoom))), max(h, int(round(sh * zoom)))), Image.BICUBIC)
    x = int(rng.integers(0, im.width - w + 1))
    y = int(rng.integers(0, im.height - h + 1))
    im = im.crop((x, y, x + w, y + h))
    if rng.random() < 0.5:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    # mild photometric jitter so images are not byte-identical crops
    arr = np.asarray(im, dtype=np.float32) * float(rng.uniform(0.8, 1.2)) + float(rng.uniform(-15, 15))
    im = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def gen_images(rng, n):
    imgs = [make_image(rng) for _ in range(n)]
    return pa.table({"image": pa.array(imgs, pa.binary()), "label": pa.array(rng.integers(0, 1000, n), pa.int64())})


# ------------------------------------------------------------------ ndarray
def gen_ndarray(rng, n):
    blobs = []
    for _ in range(n):
        a = rng.standard_normal(C.NDARRAY_SHAPE, dtype=np.float32)
        b = io.BytesIO()
        np.save(b, a)  # == petastorm NdarrayCodec.encode
        blobs.append(b.getvalue())
    return pa.table({"array": pa.array(blobs, pa.binary()), "label": pa.array(rng.integers(0, 10, n), pa.int64())})


# ------------------------------------------------------------------ tokens
def gen_tokens(rng, n):
    lengths = np.clip(rng.lognormal(mean=4.6, sigma=0.8, size=n).astype(np.int64), 8, C.TOKENS_MAX_LEN)
    total = int(lengths.sum())
    vals = (rng.zipf(1.2, size=total) % C.TOKENS_VOCAB).astype(np.int32)  # Zipf-ish vocabulary
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    tokens = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(vals, pa.int32()))
    return pa.table({"tokens": tokens, "label": pa.array(rng.integers(0, 2, n), pa.int64())})


GEN = {"tabular": gen_tabular, "images": gen_images, "ndarray": gen_ndarray, "tokens": gen_tokens}


def _write_part(args):
    out_dir, workload, seed, part, n, rg_rows = args
    rng = _rng(seed, workload, part)
    table = GEN[workload](rng, n)
    path = os.path.join(out_dir, f"part-{part:05d}.parquet")
    tmp = path + ".tmp"
    pq.write_table(table, tmp, row_group_size=rg_rows, compression=COMPRESSION)
    os.replace(tmp, path)
    extra = {}
    if workload == "tokens":
        lens = np.diff(table.column("tokens").combine_chunks().offsets.to_numpy())
        extra = {"token_sum": int(lens.sum())}
    md = pq.ParquetFile(path).metadata
    return {"path": os.path.basename(path), "rows": n, "row_groups": md.num_row_groups,
            "bytes": os.path.getsize(path),
            "uncompressed_bytes": sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups)), **extra}


def generate(out_root, scale, seed, workload, procs):
    cfg = C.SCALES[scale][workload]
    out_dir = os.path.join(out_root, workload)
    man_path = C.manifest_path(out_root, workload)
    if os.path.exists(man_path):
        with open(man_path) as f:
            man = json.load(f)
        if man.get("seed") == seed and man.get("spec") == cfg and C.parquet_files(out_root, workload):
            print(f"[gen] {workload}: reuse {out_dir}", file=sys.stderr)
            return man
    os.makedirs(out_dir, exist_ok=True)
    if os.path.exists(man_path):
        os.remove(man_path)
    for f in os.listdir(out_dir):
        os.remove(os.path.join(out_dir, f))
    t0 = time.time()
    jobs = []
    part, left = 0, cfg["rows"]
    while left > 0:
        n = min(cfg["rows_per_file"], left)
        jobs.append((out_dir, workload, seed, part, n, cfg["row_group_rows"]))
        part += 1
        left -= n
    with Pool(procs) as pool:
        files = pool.map(_write_part, jobs)
    man = {"workload": workload, "scale": scale, "seed": seed, "spec": cfg, "compression": COMPRESSION,
           "rows": sum(f["rows"] for f in files), "files": files,
           "bytes": sum(f["bytes"] for f in files),
           "uncompressed_bytes": sum(f["uncompressed_bytes"] for f in files),
           "row_groups": sum(f["row_groups"] for f in files),
           "columns": C.columns_for(workload), "batch_size": C.BATCH_SIZE[workload],
           "generate_seconds": round(time.time() - t0, 1), "pyarrow": pa.__version__}
    if workload == "tokens":
        man["mean_tokens"] = sum(f["token_sum"] for f in files) / man["rows"]
    if workload == "images":
        man["photos"] = [n for n, _ in _photos()]
        man["jpeg_quality"] = 90
    man["decoded_bytes_per_sample"] = C.decoded_bytes_per_sample(workload, man)
    with open(man_path, "w") as f:
        json.dump(man, f, indent=1)
    print(f"[gen] {workload}: {man['rows']} rows, {len(files)} files, {man['row_groups']} row groups, "
          f"{man['bytes'] / 1e6:.1f} MB in {man['generate_seconds']} s", file=sys.stderr)
    return man


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--scale", default="small", choices=sorted(C.SCALES))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--workloads", default=",".join(C.WORKLOADS))
    ap.add_argument("--procs", type=int, default=os.cpu_count())
    a = ap.parse_args()
    res = {w: generate(a.out, a.scale, a.seed, w, a.procs) for w in a.workloads.split(",") if w}
    json.dump({w: {k: v for k, v in m.items() if k != "files"} for w, m in res.items()}, sys.stdout)


if __name__ == "__main__":
    main()
