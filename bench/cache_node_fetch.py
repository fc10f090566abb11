"""Bytes fetched from storage when the ranks of one node share a cache directory.

    .venv/bin/python bench/cache_node_fetch.py [--ranks 4] [--epochs 3] [--rtt-ms 20] [--write-doc]

Starts a moto S3 server on loopback behind bench/throttle_proxy.py (which counts the bytes
it forwards), uploads a generated dataset (row groups of uneven sizes, so rank shares
split row groups), and runs ``--ranks`` processes at once, each a Loader with
``rank=r, world_size=ranks``, shuffled, for ``--epochs`` epochs, all with one
``cache_dir``. Each rank reads only its share of an epoch, but over epochs every rank
reads row groups another rank fetched; with a cache as large as the dataset a node
should fetch the dataset about once. Three runs:

- ``coordinated``: the default (``cache_wait_timeout=30``): a rank claims a row group
  before fetching it; another rank that needs it meanwhile waits for its entry;
- ``uncoordinated``: ``cache_wait_timeout=0``: each rank fetches what it misses;
- ``no cache``: for scale (every rank fetches its whole share every epoch).

Reported: the bytes the server sent (counted by the proxy: row-group reads, footers,
listings, HTTP headers) over the dataset's file bytes, and the sum of the ranks'
``stats()["bytes_fetched"]`` (compressed row-group bytes requested) over the dataset's
row-group bytes. Loopback only; the AWS instance metadata service is disabled.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOC = HERE.parent / "docs" / "performance.md"
BEGIN, END = "<!-- cache_node_fetch:begin -->", "<!-- cache_node_fetch:end -->"
sys.path.insert(0, str(HERE))
from s3_bench import HOST, free_port, isolate_aws_env, start_moto, wait_for_port  # noqa: E402

WORKER = r"""
import json, sys, time, pqloader
source, options, cache_dir, rank, world, epochs, wait = (
    sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]),
    int(sys.argv[6]), float(sys.argv[7]))
t0 = time.perf_counter()
loader = pqloader.Loader(source, storage_options=options, batch_size=1024, shuffle=True, seed=1,
                         num_epochs=epochs, rank=rank, world_size=world, num_workers=1,
                         io_threads=4, cache_dir=cache_dir or None, cache_wait_timeout=wait)
rows = sum(len(b["id"]) for b in loader)
s = loader.stats()
print(json.dumps({"rows": rows, "seconds": time.perf_counter() - t0,
                  **{k: s[k] for k in ("bytes_fetched", "bytes_read", "cache_hits",
                                        "cache_misses", "cache_waits", "cache_wait_seconds",
                                        "cache_wait_timeouts")}}))
"""


def write_data(root: Path, files: int, groups: int, seed: int) -> list[Path]:
    """`files` files of `groups` row groups of 1500-2500 rows (id + 32 float32)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    paths, start = [], 0
    for i in range(files):
        sizes = rng.integers(1500, 2501, groups)
        n = int(sizes.sum())
        columns = {"id": np.arange(start, start + n, dtype=np.int64)}
        for c in range(32):
            columns[f"f{c}"] = rng.standard_normal(n).astype(np.float32)
        table = pa.table(columns)
        path = root / f"part-{i:03d}.parquet"
        with pq.ParquetWriter(path, table.schema) as w:
            offset = 0
            for s in sizes:
                w.write_table(table.slice(offset, int(s)))
                offset += int(s)
        paths.append(path)
        start += n
    return paths


def row_group_bytes(paths: list[Path]) -> int:
    """Compressed bytes of every column chunk: what one pass over the data fetches."""
    import pyarrow.parquet as pq

    total = 0
    for p in paths:
        md = pq.ParquetFile(p).metadata
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            total += sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))
    return total


def served(count_file: Path) -> int:
    time.sleep(0.3)  # the proxy rewrites its counts every 0.1 s
    return json.loads(count_file.read_text())["to_client"]


def run_ranks(source: str, options: dict, cache_dir: str, ranks: int, epochs: int,
              wait: float) -> tuple[list[dict], float]:
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, source, json.dumps(options), cache_dir,
                               str(r), str(ranks), str(epochs), str(wait)],
                              stdout=subprocess.PIPE, text=True) for r in range(ranks)]
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=900)
        if p.returncode != 0:
            raise SystemExit(f"a rank failed ({p.returncode})")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--groups", type=int, default=24, help="row groups per file")
    p.add_argument("--rtt-ms", type=float, default=20.0, help="round trip the proxy adds")
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--write-doc", action="store_true", help="update docs/performance.md")
    args = p.parse_args()

    isolate_aws_env()
    import boto3

    procs = []
    rows = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="pql-node-fetch-") as tmp:
        tmp = Path(tmp)
        try:
            (tmp / "data").mkdir()
            paths = write_data(tmp / "data", args.files, args.groups, args.seed)
            file_bytes = sum(p.stat().st_size for p in paths)
            group_bytes = row_group_bytes(paths)
            moto_port = start_moto(procs)
            s3 = boto3.client("s3", endpoint_url=f"http://{HOST}:{moto_port}",
                              region_name="us-east-1")
            s3.create_bucket(Bucket="bench")
            for path in paths:
                s3.put_object(Bucket="bench", Key=f"ds/{path.name}", Body=path.read_bytes())
            # Objects modified under 2 s before a loader lists them are not cached (README).
            time.sleep(2.1)
            proxy_port = free_port()
            count_file = tmp / "proxy-counts.json"
            proxy = subprocess.Popen([sys.executable, str(HERE / "throttle_proxy.py"), "--listen",
                                      f"{HOST}:{proxy_port}", "--target", f"{HOST}:{moto_port}",
                                      "--rtt-ms", str(args.rtt_ms), "--count-file",
                                      str(count_file)])
            procs.append(proxy)
            wait_for_port(proxy_port, proxy)
            options = {"endpoint_override": f"{HOST}:{proxy_port}", "scheme": "http",
                       "region": "us-east-1"}
            print(f"dataset: {len(paths)} files, {args.files * args.groups} row groups, "
                  f"{file_bytes / 1e6:.1f} MB ({group_bytes / 1e6:.1f} MB of row groups); "
                  f"{args.ranks} ranks x {args.epochs} epochs", flush=True)
            for name, cache, wait in (("coordinated", True, 30.0), ("uncoordinated", True, 0.0),
                                      ("no cache", False, 0.0)):
                cache_dir = str(tmp / f"cache-{name.replace(' ', '-')}") if cache else ""
                before = served(count_file) if count_file.exists() else 0
                results, seconds = run_ranks("s3://bench/ds", options, cache_dir, args.ranks,
                                             args.epochs, wait)
                sent = served(count_file) - before
                fetched = sum(r["bytes_fetched"] for r in results)
                row = dict(name=name, served=sent / file_bytes, fetched=fetched / group_bytes,
                           hits=sum(r["cache_hits"] for r in results),
                           misses=sum(r["cache_misses"] for r in results),
                           waits=sum(r["cache_waits"] for r in results),
                           wait_s=sum(r["cache_wait_seconds"] for r in results),
                           timeouts=sum(r["cache_wait_timeouts"] for r in results),
                           seconds=seconds)
                rows.append(row)
                print(f"{name:13s} server sent {sent / 1e6:7.2f} MB = {row['served']:.3f}x the files; "
                      f"ranks fetched {fetched / 1e6:7.2f} MB = {row['fetched']:.3f}x the row groups; "
                      f"hits {row['hits']}, misses {row['misses']}, waits {row['waits']} "
                      f"({row['wait_s']:.2f} s, {row['timeouts']} timed out); {seconds:.1f} s",
                      flush=True)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    table = ["| run | server sent / dataset files | Σ bytes_fetched / row groups | hits | misses "
             "| waits (s waiting, all ranks) | wall s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        table.append(f"| {r['name']} | {r['served']:.3f}× | {r['fetched']:.3f}× | {r['hits']} | "
                     f"{r['misses']} | {r['waits']} ({r['wait_s']:.2f}) | {r['seconds']:.1f} |")
    print("\n" + "\n".join(table))
    coordinated = rows[0]
    ok = coordinated["served"] <= 1.1 and coordinated["fetched"] <= 1.1
    print("goal (coordinated: <= 1.1x the dataset):", "met" if ok else "NOT met")
    failed = not ok
    if args.write_doc:
        command = (f".venv/bin/python bench/cache_node_fetch.py --ranks {args.ranks} --epochs "
                   f"{args.epochs} --files {args.files} --groups {args.groups} --rtt-ms "
                   f"{args.rtt_ms:g} --seed {args.seed} --write-doc")
        body = "\n".join([
            BEGIN,
            f"`{command}` ({datetime.date.today()}, {platform.machine()}, {os.cpu_count()} "
            f"cores): {args.files * args.groups} row groups of 1500-2500 rows (id + 32 float32), "
            f"{file_bytes / 1e6:.1f} MB of files, {group_bytes / 1e6:.1f} MB of row groups; "
            f"{args.ranks} ranks x {args.epochs} shuffled epochs, 1 worker and 4 I/O threads "
            f"each, {args.rtt_ms:g} ms added round trip.",
            "",
            *table,
            END,
        ])
        text = DOC.read_text()
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: body, text, flags=re.S)
        DOC.write_text(text)
        print(f"wrote {DOC.relative_to(HERE.parent)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
