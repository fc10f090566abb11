"""The gap between the last batch of an epoch and the first of the next, on a slow link.

    .venv/bin/python bench/epoch_boundary.py [--rtt-ms 20] [--rate-mbps 50] [--epochs 4]

Starts a moto S3 server on loopback and reads a Parquet dataset from it through
bench/throttle_proxy.py (a shared link with a round-trip latency and a bandwidth cap),
with a training loop's usual shape: one ``for batch in loader`` per epoch
(``num_epochs=1``), shuffled, with an optional simulated training step. It records when
each batch reaches the loop and prints the time between two batches' arrivals inside an
epoch (median and maximum: a shuffled epoch's batches come in bursts, one per shuffle
window) and at each epoch boundary (the last batch of one epoch to the first of the
next), and the worst boundary as a multiple of the median. Two runs on the same loader options:
consecutive epochs (the next epoch is read while one ends) and, for contrast, epochs
that do not follow each other (``set_epoch(2 * i)``: the read-ahead cannot be used, so
each epoch starts cold). Loopback only; the AWS instance metadata service is disabled.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from s3_bench import isolate_aws_env, throttled_s3, write_data  # noqa: E402


def run(source: str, options: dict, epochs: list[int], batch_size: int, workers: int,
        step_ms: float) -> tuple[list[float], list[float], dict]:
    """Iterate `epochs` (one for loop each); return in-epoch gaps, boundary gaps, stats."""
    import pqloader

    loader = pqloader.Loader(source, storage_options=options, batch_size=batch_size,
                             num_workers=workers, shuffle=True, seed=1, num_epochs=1)
    inner, boundary = [], []
    last = None
    for epoch in epochs:
        loader.set_epoch(epoch)
        first = True
        for _ in loader:
            now = time.perf_counter()
            if last is not None:
                (boundary if first else inner).append(now - last)
            first = False
            last = now
            if step_ms:
                time.sleep(step_ms / 1000)  # the training step
    return inner, boundary, loader.stats()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rtt-ms", type=float, default=20.0)
    p.add_argument("--rate-mbps", type=float, default=50.0, help="link limit, MB/s (10^6 B)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--rows-per-file", type=int, default=60_000)
    p.add_argument("--rows-per-group", type=int, default=10_000)
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--step-ms", type=float, default=0.0, help="simulated training step per batch")
    args = p.parse_args()

    isolate_aws_env()
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_data(Path(tmp), args.files, args.rows_per_file, args.rows_per_group, 32)
        with throttled_s3(paths, args.rate_mbps, args.rtt_ms) as options:
            total = sum(p.stat().st_size for p in paths)
            print(f"link: {args.rate_mbps:g} MB/s, {args.rtt_ms:g} ms RTT; dataset {total / 1e6:.1f} MB, "
                  f"{args.files * args.rows_per_file // args.rows_per_group} row groups; batch "
                  f"{args.batch_size}, {args.workers} workers, step {args.step_ms:g} ms; "
                  f"{args.epochs} epochs, one for loop each\n")
            print("| epochs | between batches in an epoch: median, max | at epoch boundaries | "
                  "worst boundary / median | epochs started ahead |")
            print("|---|---|---|---|---|")
            for name, epochs in [("consecutive (0, 1, 2, ...)", list(range(args.epochs))),
                                 ("not consecutive (0, 2, 4, ...)", [2 * i for i in range(args.epochs)])]:
                inner, boundary, stats = run("s3://bench/ds/", options, epochs, args.batch_size,
                                             args.workers, args.step_ms)
                med = statistics.median(inner)
                print(f"| {name} | {med * 1e3:.1f} ms, {max(inner) * 1e3:.0f} ms | "
                      f"{', '.join(f'{b * 1e3:.0f}' for b in boundary)} ms | "
                      f"{max(boundary) / med:.2f}x | {stats['epochs_started_ahead']} |")


if __name__ == "__main__":
    main()
