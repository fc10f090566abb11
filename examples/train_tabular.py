"""Train an MLP on a wide numeric Parquet dataset with pqloader as the data loader.

    .venv/bin/python examples/train_tabular.py            # CPU: about a minute
    .venv/bin/python examples/train_tabular.py --device cuda

The dataset (generated once into build/tabular-data) has `--features` float32 columns
and an int64 label that a linear function of the features decides, so the loss falls.
pqloader replaces torch.utils.data.DataLoader: batches arrive as torch tensors (no copy
from the C++ buffers; the feature columns stacked into one [batch, features] tensor by
`stack=`) and, on a GPU, already on the device (pinned, copied on a side stream ahead of
use). Each epoch prints the loss, accuracy, samples/s and the data
stall: the fraction of the epoch the training loop spent waiting inside next().
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

import pqloader

ROOT = Path(__file__).resolve().parents[1]
NUM_CLASSES = 10


def make_dataset(path: Path, rows: int, features: int, files: int = 8, seed: int = 2026) -> list[str]:
    """Write the dataset once (a marker records its shape); return the feature column names."""
    names = [f"f{i:03d}" for i in range(features)]
    marker = path / "_COMPLETE"
    if marker.exists() and marker.read_text() == f"{rows}/{features}/{files}":
        return names
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.parquet"):
        old.unlink()
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((features, NUM_CLASSES)).astype(np.float32)
    per_file = -(-rows // files)
    for i in range(files):
        n = min(per_file, rows - i * per_file)
        if n <= 0:
            break
        x = rng.standard_normal((n, features), dtype=np.float32)
        y = np.argmax(x @ weights + 0.5 * rng.standard_normal((n, NUM_CLASSES)), axis=1).astype(np.int64)
        table = pa.table({**{name: x[:, j] for j, name in enumerate(names)}, "label": y})
        pq.write_table(table, path / f"part-{i:03d}.parquet", row_group_size=8192)
    marker.write_text(f"{rows}/{features}/{files}")
    return names


def make_model(features: int) -> nn.Module:
    return nn.Sequential(nn.Linear(features, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                         nn.Linear(256, NUM_CLASSES))


def split_cpu_threads() -> int:
    """Give torch half the cores for compute; return the other half for pqloader."""
    cores = pqloader.available_cpus()  # (a container's CPU limit, not the node's cores)
    torch.set_num_threads(max(1, cores // 2))
    return max(1, cores - cores // 2)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT / "build" / "tabular-data")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--num-workers", type=int, default=None,
                        help="pqloader C++ threads (default: on CPU, the cores torch does not use)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ...")
    args = parser.parse_args()

    device = pick_device(args.device)
    if device.type == "cpu" and args.num_workers is None:
        # Training on the CPU: split the cores between torch's compute threads and the
        # loader's, rather than oversubscribe them (which can cost several times the speed).
        args.num_workers = split_cpu_threads()
    columns = make_dataset(args.data, args.rows, args.features)
    loader = pqloader.Loader(
        args.data, columns=columns + ["label"], batch_size=args.batch_size, shuffle=True, seed=7,
        num_workers=args.num_workers, output="torch",
        stack={"x": columns},  # the features as one [batch, features] tensor, stacked in C++
        device=device if device.type != "cpu" else None)  # on a GPU: pinned + copied ahead
    model = make_model(args.features).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    print(f"{loader!r}\n{len(loader)} batches/epoch, device {device}, torch {torch.__version__}")

    total_samples, total_seconds = 0, 0.0
    for epoch in range(args.epochs):
        before = loader.stats()
        start = time.perf_counter()
        seen = correct = 0
        loss_sum = 0.0
        for batch in loader:
            # One (B, features) matrix from the column tensors: a single copy per batch.
            x, y = batch["x"], batch["label"]
            logits = model(x)
            loss = loss_fn(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen += len(y)
            loss_sum += loss.item() * len(y)
            correct += (logits.argmax(1) == y).sum().item()
        seconds = time.perf_counter() - start
        stall = (loader.stats()["wait_seconds"] - before["wait_seconds"]) / seconds
        total_samples += seen
        total_seconds += seconds
        print(f"epoch {epoch}: loss {loss_sum / seen:.4f}  accuracy {correct / seen:.3f}  "
              f"{seen / seconds:,.0f} samples/s  data stall {stall:.1%}")
    st = loader.stats()
    print(f"overall: {total_samples / total_seconds:,.0f} samples/s, data stall {st['wait_fraction']:.1%} "
          f"(waited {st['wait_seconds']:.2f} s in next() over {st['wall_seconds']:.2f} s)")


if __name__ == "__main__":
    main()
