"""`make demo`: generate a sample dataset, stream it through pqloader, print the speed.

The dataset (written once to build/demo-data) imitates a tabular training set:
64 float32 features, a fixed-size float32 embedding, an int64 label, an id and a
string column, in 8 files with uneven row groups. The demo streams three shuffled
epochs and shows that the order does not depend on the number of worker threads.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import pqloader

ROOT = Path(__file__).resolve().parents[1]


def make_dataset(path: Path, rows: int, files: int) -> None:
    marker = path / "_COMPLETE"
    if marker.exists() and marker.read_text() == f"{rows}/{files}":
        return
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.parquet"):
        old.unlink()
    rng = np.random.default_rng(2026)
    per_file = rows // files
    for i in range(files):
        n = per_file if i < files - 1 else rows - per_file * (files - 1)
        start = i * per_file
        features = rng.standard_normal((n, 64), dtype=np.float32)
        table = pa.table({
            "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
            "features": pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), 64),
            "embedding": pa.FixedSizeListArray.from_arrays(
                pa.array(rng.random(n * 16, dtype=np.float32)), 16),
            "label": pa.array(rng.integers(0, 1000, n, dtype=np.int64)),
            "split": pa.array(np.where(rng.random(n) < 0.9, "train", "val")),
        })
        # Uneven row groups, as real writers produce.
        pq.write_table(table, path / f"part-{i:03d}.parquet", row_group_size=int(rng.integers(4000, 12000)),
                       compression="snappy")
    marker.write_text(f"{rows}/{files}")


def digest(batch: dict) -> bytes:
    h = hashlib.sha256()
    for name in sorted(batch):
        v = batch[name]
        h.update(v.tobytes() if isinstance(v, np.ndarray) else "\0".join(v).encode())
    return h.digest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--data", type=Path, default=ROOT / "build" / "demo-data")
    args = parser.parse_args()

    t0 = time.perf_counter()
    make_dataset(args.data, args.rows, args.files)
    info = pqloader.inspect(args.data)
    size = sum(f["size_bytes"] for f in info["files"])
    print(f"dataset: {args.data} — {info['num_files']} files, {info['num_row_groups']} row groups, "
          f"{info['num_rows']:,} rows, {size / 1e6:.1f} MB on disk (ready in {time.perf_counter() - t0:.1f} s)")

    loader = pqloader.Loader(args.data, batch_size=args.batch_size, shuffle=True, seed=2026,
                             num_epochs=1, shuffle_window=4)
    print(f"loader: {loader!r}, {pqloader.available_cpus()} CPUs, {len(loader)} batches/epoch")
    print(f"{'epoch':>5} {'rows/s':>12} {'MB/s (parquet)':>15} {'MB/s (tensors)':>15} {'first batch':>12} {'stall':>6}")
    hashes = []
    for epoch in range(args.epochs):
        before = loader.stats()
        start = time.perf_counter()
        first = None
        rows = 0
        h = hashlib.sha256()
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            rows += len(batch["id"])
            h.update(digest(batch))
        seconds = time.perf_counter() - start
        after = loader.stats()
        read_mb = (after["bytes_read"] - before["bytes_read"]) / 1e6
        tensor_mb = (after["bytes_decoded"] - before["bytes_decoded"]) / 1e6
        stall = (after["wait_seconds"] - before["wait_seconds"]) / seconds
        hashes.append(h.hexdigest())
        print(f"{epoch:>5} {rows / seconds:>12,.0f} {read_mb / seconds:>15.1f} {tensor_mb / seconds:>15.1f} "
              f"{first * 1000:>10.1f}ms {stall:>6.0%}")
        assert rows == info["num_rows"], (rows, info["num_rows"])

    # Determinism: epoch 1 again, with one worker thread instead of all of them.
    replay = pqloader.Loader(args.data, batch_size=args.batch_size, shuffle=True, seed=2026,
                             num_workers=1, shuffle_window=4)
    replay.load_state_dict({**loader.state_dict(), "epoch": 1, "batch": 0})
    h = hashlib.sha256()
    for batch in replay:
        h.update(digest(batch))
    same = h.hexdigest() == hashes[1]
    print(f"epoch 1 replayed with num_workers=1: {'identical' if same else 'DIFFERENT'} "
          f"(sha256 {hashes[1][:16]}…); epochs differ from each other: {len(set(hashes)) == len(hashes)}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
