"""Images/s of pqloader's C++ image pipeline, side by side with a PIL pipeline (what
torchvision's transforms run on PIL images) and the raw libjpeg-turbo decode rate, and
epoch 1 (cache miss) vs epoch 2 (cache hit) vs reading pre-decoded tensors from Parquet.

Run: .venv/bin/python bench/transform_cache_bench.py [--images 1500] [--out FILE.md]

Same files, same cores (all of them), one run: ratios are what to read, not absolutes.
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

import pqloader
from pqloader import transforms as T

MEAN, STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)


def make_images(n: int, seed: int = 0) -> list[bytes]:
    """ImageNet-like JPEGs (about 500×375, quality 90) cut from real photographs."""
    import skimage.data as sd

    photos = [sd.astronaut(), sd.chelsea(), sd.coffee(), sd.rocket(), np.dstack([sd.camera()] * 3)]
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = Image.fromarray(photos[i % len(photos)])
        scale = rng.uniform(1.0, 2.0)
        p = p.resize((int(p.width * scale), int(p.height * scale)), Image.BICUBIC)
        w, h = min(500, p.width), min(375, p.height)
        x, y = int(rng.integers(0, p.width - w + 1)), int(rng.integers(0, p.height - h + 1))
        p = p.crop((x, y, x + w, y + h))
        if rng.random() < 0.5:
            p = p.transpose(Image.FLIP_LEFT_RIGHT)
        b = io.BytesIO()
        p.save(b, format="JPEG", quality=90)
        out.append(b.getvalue())
    return out


def pil_pipeline(blob: bytes) -> np.ndarray:
    """Decode, Resize(256), CenterCrop(224), flip, normalize, CHW — on PIL + NumPy."""
    img = Image.open(io.BytesIO(blob)).convert("RGB")
    w, h = img.size
    s = 256 / min(w, h)
    img = img.resize((max(256, int(w * s)), max(256, int(h * s))), Image.BILINEAR)
    w, h = img.size
    left, top = int(round((w - 224) / 2)), int(round((h - 224) / 2))
    img = img.crop((left, top, left + 224, top + 224)).transpose(Image.FLIP_LEFT_RIGHT)
    a = (np.asarray(img, dtype=np.float32) / 255 - MEAN) / STD
    return a.transpose(2, 0, 1)


def pil_decode(blob: bytes) -> int:
    img = Image.open(io.BytesIO(blob))
    img.load()
    return img.size[0]


def chunks(images, size):
    for i in range(0, len(images), size):
        yield images[i:i + size]


def pil_batch(batch):
    return np.stack([pil_pipeline(b) for b in batch]).shape[0]


def drain(loader) -> int:
    """Consume every batch without keeping it (as a training loop does)."""
    return sum(1 for _ in loader)


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1500)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    tmp = Path(tempfile.mkdtemp(prefix="pqbench-"))
    try:
        images = make_images(args.images)
        src = tmp / "images.parquet"
        pq.write_table(pa.table({"image": images, "label": np.arange(len(images))}), src, row_group_size=100)
        n = len(images)
        rows = []

        # Ceiling: raw libjpeg-turbo decode (PIL bundles it), all cores.
        with mp.Pool(cores) as pool:
            t = timed(lambda: pool.map(pil_decode, images, chunksize=32))
        rows.append(("libjpeg-turbo decode only (PIL, %d processes) — ceiling" % cores, n / t))

        # PIL pipeline (torchvision's PIL path), all cores.
        with mp.Pool(cores) as pool:
            t = timed(lambda: pool.map(pil_batch, list(chunks(images, 64))))
        rows.append(("PIL + NumPy pipeline (%d processes)" % cores, n / t))

        tf = {"image": [T.DecodeImage(), T.Resize(256), T.CenterCrop(224), T.RandomHorizontalFlip(),
                        T.Normalize(MEAN.tolist(), STD.tolist()), T.ToCHW()]}
        loader = pqloader.Loader(str(src), batch_size=64, transforms=tf)
        t = timed(lambda: drain(loader))
        rows.append(("pqloader C++ pipeline (%d threads)" % cores, n / t))
        pq_rate = n / t

        # Cache: epoch 1 fills it, epoch 2 reads it (mmap), compared with a Parquet file
        # that already holds the 224×224 uint8 tensors.
        cache = tmp / "cache"
        tf_cached = {"image": [T.DecodeImage(), T.Resize(256), T.CenterCrop(224), T.RandomHorizontalFlip()]}
        loader = pqloader.Loader(str(src), batch_size=64, transforms=tf_cached, cache_dir=str(cache), num_epochs=1)
        e1 = timed(lambda: drain(loader))
        e2 = timed(lambda: drain(loader))
        hits = loader.stats()["cache_hits"]
        decoded = np.concatenate([b["image"] for b in pqloader.Loader(
            str(src), batch_size=256, transforms={"image": [T.DecodeImage(), T.Resize(256), T.CenterCrop(224)]})])
        flat = pa.FixedSizeListArray.from_arrays(pa.array(decoded.reshape(-1)), 224 * 224 * 3)
        pre = tmp / "predecoded.parquet"
        pq.write_table(pa.table({"image": flat, "label": np.arange(n)}), pre, row_group_size=100, compression="none")
        t_pre = timed(lambda: drain(pqloader.Loader(str(pre), batch_size=64)))
        rows.append(("cache epoch 1 (miss: read + decode + resize + crop)", n / e1))
        rows.append(("cache epoch 2 (hits: entries read with pread, %d hits)" % hits, n / e2))
        rows.append(("pre-decoded uint8 tensors from an uncompressed local Parquet file", n / t_pre))

        lines = [f"{n} JPEGs (~500×375, q90, from scikit-image photos), {cores} cores, batch 64.", "",
                 "| pipeline | images/s | ratio to pqloader C++ pipeline |", "|---|---:|---:|"]
        for name, rate in rows:
            lines.append(f"| {name} | {rate:,.0f} | {rate / pq_rate:.2f} |")
        lines += ["", f"Cache: epoch 2 / epoch 1 speed-up {e1 / e2:.1f}×; warm cache vs pre-decoded Parquet: "
                      f"{t_pre / e2:.2f}× the speed."]
        text = "\n".join(lines)
        print(text)
        if args.out:
            args.out.write_text(text + "\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
