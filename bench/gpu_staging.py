"""Staging batches on a GPU: loader-only rows/s with device="cuda" against CPU tensors.

    python bench/gpu_staging.py [--rows 200000] [--columns 128,4] [--rounds 5]

Needs a CUDA device. Per dataset (N float32 columns + an int64 label, 8 files, batch
1024, shuffled), each round times one epoch of the same Loader settings twice, in turns:
``output="torch"`` on the CPU (zero-copy tensors: the loader's own rate, the ceiling of
staging) and ``device="cuda"`` (packed, pinned, copied on a side stream; the epoch ends
with a synchronize, so every copy is counted). Nothing is done with the batches: the
ratio cuda/cpu is what staging costs the loader (1.0: nothing). Prints the median
rows/s of each and the median of the per-round ratios. Data is generated once into
build/gpu-staging-data/ by examples/train_tabular.py's generator (seeded). Each round's
first epoch is untimed warm-up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import pqloader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from train_tabular import make_dataset  # noqa: E402  (the tabular example's data, any width)


def epoch_rate(path: Path, device: str | None, seed: int) -> float:
    loader = pqloader.Loader(path, batch_size=1024, shuffle=True, seed=seed, output="torch",
                             device=device)
    for _ in loader:  # warm-up epoch: threads, pools, CUDA context and pinned memory
        pass
    rows = 0
    start = time.perf_counter()
    for batch in loader:
        rows += len(batch["label"])
    if device is not None:
        torch.cuda.synchronize()
    return rows / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--columns", default="128,4", help="float32 columns per dataset, comma-separated")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--label", default="", help="printed in front of each result line")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_staging.py needs a CUDA device")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}, pqloader {pqloader.__file__}")
    for columns in map(int, args.columns.split(",")):
        path = ROOT / "build" / "gpu-staging-data" / f"c{columns}"
        make_dataset(path, args.rows, columns)
        cpu, cuda, ratio = [], [], []
        for r in range(args.rounds):
            cpu.append(epoch_rate(path, None, seed=r))
            cuda.append(epoch_rate(path, "cuda", seed=r))
            ratio.append(cuda[-1] / cpu[-1])
        print(f"{args.label} {columns + 1:4d} columns: cpu {statistics.median(cpu):12,.0f} rows/s  "
              f"cuda {statistics.median(cuda):12,.0f} rows/s  cuda/cpu {statistics.median(ratio):.2f} "
              f"(rounds {' '.join(f'{x:.2f}' for x in ratio)})")


if __name__ == "__main__":
    main()
