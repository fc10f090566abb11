"""Shuffle quality of pqloader's window shuffle, per shuffle_window.

Run: .venv/bin/python bench/shuffle_quality.py [--row-groups 64 --rows-per-group 1000]

For a dataset of R row groups × G rows with an `id` column (0..N-1 in natural order),
reports per window size:
- displacement: mean |position - natural position| / N (a uniform permutation: ~0.333);
- rank corr. natural: |Spearman correlation| of delivery position with natural
  position (uniform: ~0);
- rank corr. epochs: |Spearman correlation| between the positions of each row in
  epoch 0 and epoch 1 (uniform: ~0);
Each value is the mean over seeds 1..5.
- row groups per batch: mean distinct row groups among a batch's rows (uniform: close
  to min(batch_size, R) for large groups).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import pqloader


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra = np.argsort(np.argsort(a)).astype(np.float64)
    rb = np.argsort(np.argsort(b)).astype(np.float64)
    return float(np.corrcoef(ra, rb)[0, 1])


SEEDS = (1, 2, 3, 4, 5)


def epoch_ids(path: str, window: int, epoch: int, batch_size: int, seed: int) -> tuple[np.ndarray, list[np.ndarray]]:
    loader = pqloader.Loader(path, batch_size=batch_size, shuffle=True, seed=seed, shuffle_window=window)
    loader.load_state_dict({**loader.state_dict(), "epoch": epoch, "batch": 0})
    batches = [b["id"] for b in loader]
    return np.concatenate(batches), batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--row-groups", type=int, default=64)
    parser.add_argument("--rows-per-group", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    n = args.row_groups * args.rows_per_group
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "ids.parquet")
        pq.write_table(pa.table({"id": np.arange(n, dtype=np.int64)}), path, row_group_size=args.rows_per_group)
        print(f"{args.row_groups} row groups x {args.rows_per_group} rows, batch_size={args.batch_size}\n")
        print("| shuffle_window | displacement | rank corr. natural | rank corr. epochs | row groups per batch |")
        print("|---:|---:|---:|---:|---:|")
        windows = sorted({1, 2, 4, 8, 16, args.row_groups})
        natural = np.arange(n)
        for w in windows:
            rows = []
            for seed in SEEDS:
                e0, batches = epoch_ids(path, w, 0, args.batch_size, seed)
                e1, _ = epoch_ids(path, w, 1, args.batch_size, seed)
                pos0 = np.empty(n, dtype=np.int64)
                pos0[e0] = natural
                pos1 = np.empty(n, dtype=np.int64)
                pos1[e1] = natural
                rows.append((float(np.mean(np.abs(pos0 - natural))) / n, abs(spearman(pos0, natural)),
                             abs(spearman(pos0, pos1)),
                             np.mean([len(np.unique(b // args.rows_per_group)) for b in batches])))
            d, cn, ce, g = np.mean(rows, axis=0)
            print(f"| {w} | {d:.3f} | {cn:.3f} | {ce:.3f} | {g:.1f} |")
        rng = np.random.default_rng(0)
        perm = rng.permutation(n)
        print(f"| uniform (reference) | {np.mean(np.abs(np.argsort(perm) - np.arange(n))) / n:.3f} | "
              f"{abs(spearman(np.argsort(perm), np.arange(n))):.3f} | "
              f"{abs(spearman(np.argsort(perm), np.argsort(rng.permutation(n)))):.3f} | "
              f"{np.mean([len(np.unique(perm[i:i + args.batch_size] // args.rows_per_group)) for i in range(0, n, args.batch_size)]):.1f} |")


if __name__ == "__main__":
    main()
