"""The tabular example's training loop with per-column batches against stacked ones.

    python bench/gpu_train_loop.py [--rounds 3]

128 float32 feature columns + an int64 label (examples/train_tabular.py's data, made
once into build/tabular-data), batch 1024, shuffled, its MLP with AdamW and its two
``.item()`` a step. Per round, in turns: the loop over per-column batches (the features
stacked by ``torch.stack`` in the loop) and over ``stack={"x": features}`` batches
(stacked in C++); then each loader alone. Prints per round the loop's samples/s and
median time in ``next()`` (epochs 1-3 of 4), and the loader-only rows/s. On a CUDA
machine batches go to the GPU (``device="cuda"``); elsewhere CPU tensors.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

import pqloader

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
from train_tabular import make_dataset, make_model  # noqa: E402

CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if CUDA else "cpu")


def make_loader(path: Path, columns: list[str], stacked: bool) -> pqloader.Loader:
    return pqloader.Loader(path, columns=columns + ["label"], batch_size=1024, shuffle=True, seed=7,
                           output="torch", device=DEVICE if CUDA else None,
                           stack={"x": columns} if stacked else None)


def train(path: Path, columns: list[str], stacked: bool, epochs: int = 4) -> tuple[float, float]:
    """Median samples/s and median µs in next() of epochs 1.. of `epochs`."""
    torch.manual_seed(0)
    model = make_model(len(columns)).to(DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    loader = make_loader(path, columns, stacked)
    in_next, rates = [], []
    for epoch in range(epochs):
        start, n, it = time.perf_counter(), 0, iter(loader)
        while True:
            t0 = time.perf_counter_ns()
            try:
                batch = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter_ns()
            x = batch["x"] if stacked else torch.stack([batch[c] for c in columns], dim=1)
            y = batch["label"]
            logits = model(x)
            loss = loss_fn(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss.item()
            (logits.argmax(1) == y).sum().item()
            n += len(y)
            if epoch > 0:
                in_next.append((t1 - t0) / 1e3)
        if epoch > 0:
            rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates), statistics.median(in_next)


def loader_only(path: Path, columns: list[str], stacked: bool, epochs: int = 4) -> float:
    loader = make_loader(path, columns, stacked)
    rates = []
    for epoch in range(epochs):
        start = time.perf_counter()
        n = sum(len(b["label"]) for b in loader)
        if CUDA:
            torch.cuda.synchronize()
        if epoch > 0:
            rates.append(n / (time.perf_counter() - start))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    path = ROOT / "build" / "tabular-data"
    columns = make_dataset(path, 100_000, 128)
    print(f"device {DEVICE}, {os.cpu_count()} cpus, torch {torch.__version__}", flush=True)
    for r in range(args.rounds):
        for stacked in (False, True):
            rate, wait = train(path, columns, stacked)
            alone = loader_only(path, columns, stacked)
            print(f"round {r} {'stacked   ' if stacked else 'per-column'}: loop {rate:,.0f} samples/s, "
                  f"next() median {wait:.0f} us; loader alone {alone:,.0f} rows/s", flush=True)


if __name__ == "__main__":
    main()
