"""First-epoch throughput from S3 over a slow link, as a fraction of the link's limit.

    .venv/bin/python bench/s3_bench.py [--rtt-ms 40] [--rate-mbps 25] [--repeats 3]

Starts a moto S3 server on loopback, puts a Parquet dataset in it, and reads it through
bench/throttle_proxy.py, which adds a round-trip latency and caps the bandwidth of
everything that crosses it (a shared link, both directions). Each run opens a fresh
Loader (footers fetched) and reads one epoch with 2 CPU workers; io_threads varies.
pyarrow.parquet.read_table over the same link (pre-buffered, threaded) is shown for
reference. Two more rows use cache_dir: a first run that fills the local-disk cache
through the slow link, and a second run (a new Loader, as after a restart) served from
it. Prints a markdown table: median over --repeats of the epoch time, MB/s of compressed
Parquet delivered, and that as a fraction of the link's limit.
Only loopback is used; the AWS instance metadata service is disabled.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

HERE = Path(__file__).resolve().parent
HOST = "127.0.0.1"


def isolate_aws_env() -> None:
    """Point the AWS SDKs at the loopback server's test credentials only: no instance
    metadata service, no profile or credentials file, no AWS_* variables of the caller."""
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        del os.environ[k]
    os.environ.update(AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE=os.devnull,
                      AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection((HOST, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"server on port {port} did not start")


def write_data(root: Path, files: int, rows_per_file: int, rows_per_group: int, cols: int) -> list[Path]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    paths = []
    for i in range(files):
        table = pa.table({f"f{c:02d}": rng.standard_normal(rows_per_file, dtype=np.float32)
                          for c in range(cols)}
                         | {"label": rng.integers(0, 10, rows_per_file)})
        path = root / f"part-{i:03d}.parquet"
        pq.write_table(table, path, row_group_size=rows_per_group)
        paths.append(path)
    return paths


def start_moto(procs: list[subprocess.Popen]) -> int:
    """Start a moto S3 server on loopback (added to `procs`, for the caller to stop);
    return its port once it answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(proc)
    wait_for_port(port, proc)
    return port


@contextlib.contextmanager
def throttled_s3(paths: list[Path], rate_mbps: float, rtt_ms: float) -> Iterator[dict]:
    """A moto S3 server on loopback holding `paths` under s3://bench/ds/, behind
    throttle_proxy.py (`rate_mbps`, `rtt_ms`); yields the storage_options that reach it
    through the proxy. Both processes are stopped on leaving."""
    import boto3

    procs: list[subprocess.Popen] = []
    try:
        moto_port = start_moto(procs)
        s3 = boto3.client("s3", endpoint_url=f"http://{HOST}:{moto_port}", region_name="us-east-1")
        s3.create_bucket(Bucket="bench")
        for path in paths:
            s3.put_object(Bucket="bench", Key=f"ds/{path.name}", Body=path.read_bytes())
        # Objects modified under 2 s before a loader lists them are not cached (README).
        time.sleep(2.1)
        proxy_port = free_port()
        proxy = subprocess.Popen([sys.executable, str(HERE / "throttle_proxy.py"), "--listen",
                                  f"{HOST}:{proxy_port}", "--target", f"{HOST}:{moto_port}",
                                  "--rtt-ms", str(rtt_ms), "--rate-mbps", str(rate_mbps)])
        procs.append(proxy)
        wait_for_port(proxy_port, proxy)
        yield {"endpoint_override": f"{HOST}:{proxy_port}", "scheme": "http", "region": "us-east-1"}
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rtt-ms", type=float, default=40.0)
    p.add_argument("--rate-mbps", type=float, default=25.0, help="link limit, MB/s (10^6 B)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--io-threads", default="1,4,16")
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--rows-per-file", type=int, default=100_000)
    p.add_argument("--rows-per-group", type=int, default=10_000)
    args = p.parse_args()

    isolate_aws_env()
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    import pqloader

    with tempfile.TemporaryDirectory() as tmp:
        paths = write_data(Path(tmp), args.files, args.rows_per_file, args.rows_per_group, 32)
        with throttled_s3(paths, args.rate_mbps, args.rtt_ms) as options:
            source = "s3://bench/ds/"
            total = sum(p.stat().st_size for p in paths)

            def run_pqloader(io_threads: int, readahead: int | None = None) -> tuple[float, float, int]:
                t0 = time.perf_counter()
                loader = pqloader.Loader(source, storage_options=options, batch_size=4096,
                                         num_workers=2, io_threads=io_threads,
                                         readahead=readahead)
                t1 = time.perf_counter()
                rows = sum(len(b["label"]) for b in loader)
                t2 = time.perf_counter()
                return t1 - t0, t2 - t1, loader.stats()["bytes_read"], rows

            def run_pyarrow() -> tuple[float, float, int]:
                fs = pafs.S3FileSystem(**options)
                t0 = time.perf_counter()
                table = pq.read_table("bench/ds/", filesystem=fs, pre_buffer=True, use_threads=True)
                t1 = time.perf_counter()
                return 0.0, t1 - t0, total, table.num_rows

            many = max(int(x) for x in args.io_threads.split(","))
            runs = [(f"pqloader, 2 workers, io_threads={many}, readahead=1 (about one request "
                     "per worker, as without read-ahead)", lambda: run_pqloader(many, 1))]
            runs += [(f"pqloader, 2 workers, io_threads={n}", lambda n=n: run_pqloader(n))
                     for n in (int(x) for x in args.io_threads.split(","))]
            runs.append(("pyarrow.parquet.read_table (pre_buffer, threads)", run_pyarrow))
            rate = args.rate_mbps * 1e6
            print(f"dataset: {len(paths)} files, {total / 1e6:.1f} MB, row groups of "
                  f"{args.rows_per_group} rows x 33 columns; link: {args.rtt_ms:g} ms RTT, "
                  f"{args.rate_mbps:g} MB/s; median of {args.repeats}\n")
            print("| reader | open (footers), s | first epoch, s | MB/s | fraction of link |")
            print("|---|---:|---:|---:|---:|")
            for name, fn in runs:
                results = [fn() for _ in range(args.repeats)]
                open_s = statistics.median(r[0] for r in results)
                epoch_s = statistics.median(r[1] for r in results)
                nbytes = results[0][2]
                assert all(r[3] == args.files * args.rows_per_file for r in results)
                mbps = nbytes / epoch_s / 1e6
                print(f"| {name} | {open_s:.2f} | {epoch_s:.2f} | {mbps:.1f} | "
                      f"{nbytes / epoch_s / rate:.2f} |", flush=True)

            # The local-disk cache: a first run fills it through the slow link, a second
            # run (a new Loader, as after a restart) reads footers and row groups locally.
            def run_cached(cache_dir: str) -> tuple[float, float, int, int, int]:
                t0 = time.perf_counter()
                loader = pqloader.Loader(source, storage_options=options, batch_size=4096,
                                         num_workers=2, io_threads=many, cache_dir=cache_dir)
                t1 = time.perf_counter()
                rows = sum(len(b["label"]) for b in loader)
                t2 = time.perf_counter()
                s = loader.stats()
                return t1 - t0, t2 - t1, s["bytes_read"], rows, s["cache_hits"]

            firsts, seconds = [], []
            for r in range(args.repeats):
                cache_dir = str(Path(tmp) / f"cache-{r}")
                firsts.append(run_cached(cache_dir))
                seconds.append(run_cached(cache_dir))
            for name, results in ((f"pqloader, io_threads={many}, cache_dir, first run (fills it)", firsts),
                                  (f"pqloader, io_threads={many}, cache_dir, second run (warm)", seconds)):
                open_s = statistics.median(r[0] for r in results)
                epoch_s = statistics.median(r[1] for r in results)
                eff = total / epoch_s / 1e6  # dataset MB delivered per second
                print(f"| {name} (cache hits {results[0][4]}, read {results[0][2] / 1e6:.1f} MB from S3) | "
                      f"{open_s:.2f} | {epoch_s:.2f} | {eff:.1f} | {total / epoch_s / rate:.2f} |", flush=True)


if __name__ == "__main__":
    main()
