"""Start-up of a rank on a dataset of many small files, with and without a summary.

    .venv/bin/python bench/startup_files.py [--files 1000 10000 100000] [--ranks 1 64] [--write-doc]

Starts a moto S3 server on loopback behind bench/throttle_proxy.py (which counts the HTTP
requests it forwards), uploads ``N`` small Parquet files (1 row group, 100 rows, 3
columns) per dataset size, writes their summary with ``pqloader index``, and then, for
each size, summary on/off and world size, runs one fresh process that makes rank 0's
Loader and takes its first batch (``use_summary`` True: list, then the summary; "only": the
index is the listing; False: every footer). Reported: the requests that process sent to storage
(listing, summary, footers, data of the first batch), the seconds to construct the
Loader and to the first batch. With a summary the requests should not depend on the
number of files beyond the listing (one LIST per 1,000 objects), nor on the ranks.
Loopback only, no added latency: times are a lower bound for real object storage.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import io
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOC = HERE.parent / "docs" / "performance.md"
BEGIN, END = "<!-- startup_files:begin -->", "<!-- startup_files:end -->"
sys.path.insert(0, str(HERE))
from s3_bench import HOST, free_port, isolate_aws_env, start_moto, wait_for_port  # noqa: E402

RANK = r"""
import json, sys, time
t0 = time.perf_counter()
import pqloader
source, options, world, summary = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
t1 = time.perf_counter()
loader = pqloader.Loader(source, storage_options=options, batch_size=64, shuffle=True, seed=1,
                         rank=0, world_size=world, num_workers=2, use_summary=summary)
t2 = time.perf_counter()
batch = next(iter(loader))
t3 = time.perf_counter()
print(json.dumps({"construct_s": t2 - t1, "first_batch_s": t3 - t1,
                  "footers_from_summary": loader.stats()["footers_from_summary"],
                  "rows": loader.num_rows}))
"""


MODES = {True: "summary (listed)", "only": "summary, no listing ('only')", False: "every footer"}


def small_file(i: int) -> bytes:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    table = pa.table({"id": np.arange(i * 100, (i + 1) * 100, dtype=np.int64),
                      "x": np.full(100, i, np.float32), "y": np.arange(100, dtype=np.int32)})
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def requests_now(count_file: Path) -> int:
    time.sleep(0.3)  # the proxy rewrites its counts every 0.1 s
    return json.loads(count_file.read_text())["requests"] if count_file.exists() else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--files", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 64], help="world sizes")
    p.add_argument("--no-summary-max", type=int, default=10000,
                   help="run without a summary only up to this many files (it reads every footer)")
    p.add_argument("--write-doc", action="store_true", help="update docs/performance.md")
    args = p.parse_args()

    isolate_aws_env()
    import boto3
    import pqloader

    procs = []
    rows = []
    with tempfile.TemporaryDirectory(prefix="pql-startup-") as tmp:
        tmp = Path(tmp)
        try:
            moto_port = start_moto(procs)
            proxy_port = free_port()
            count_file = tmp / "proxy-counts.json"
            proxy = subprocess.Popen([sys.executable, str(HERE / "throttle_proxy.py"), "--listen",
                                      f"{HOST}:{proxy_port}", "--target", f"{HOST}:{moto_port}",
                                      "--count-file", str(count_file)])
            procs.append(proxy)
            wait_for_port(proxy_port, proxy)
            options = {"endpoint_override": f"{HOST}:{proxy_port}", "scheme": "http",
                       "region": "us-east-1"}
            s3 = boto3.client("s3", endpoint_url=f"http://{HOST}:{moto_port}",
                              region_name="us-east-1")
            s3.create_bucket(Bucket="bench")
            template = small_file(0)
            for n in args.files:
                t0 = time.perf_counter()
                prefix = f"ds{n}"

                def put(i: int, prefix: str = prefix) -> None:
                    # The same bytes in every file: only the layout matters here.
                    s3.put_object(Bucket="bench", Key=f"{prefix}/part-{i:06d}.parquet",
                                  Body=template)
                with concurrent.futures.ThreadPoolExecutor(16) as pool:
                    list(pool.map(put, range(n)))
                up_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                pqloader.write_index(f"s3://bench/{prefix}", storage_options=options)
                index_s = time.perf_counter() - t0
                print(f"{n} files: uploaded in {up_s:.1f} s, indexed in {index_s:.1f} s", flush=True)
                for summary in (True, "only", False):
                    if not summary and n > args.no_summary_max:
                        continue
                    for world in args.ranks:
                        before = requests_now(count_file)
                        r = subprocess.run([sys.executable, "-c", RANK, f"s3://bench/{prefix}",
                                            json.dumps(options), str(world),
                                            json.dumps(summary)],
                                           capture_output=True, text=True, timeout=1800)
                        if r.returncode != 0:
                            raise SystemExit(f"the rank failed: {r.stderr[-2000:]}")
                        out = json.loads(r.stdout.strip().splitlines()[-1])
                        out.update(files=n, summary=summary, world=world,
                                   requests=requests_now(count_file) - before, index_s=index_s)
                        rows.append(out)
                        print(f"  {MODES[summary]:<28}  world {world:4d}: "
                              f"{out['requests']:6d} requests, construct {out['construct_s']:.2f} s, "
                              f"first batch {out['first_batch_s']:.2f} s "
                              f"(files from summary: {out['footers_from_summary']})", flush=True)
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
    table = ["| files | layout from | world size | requests of rank 0 | Loader() s | first batch s |",
             "|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        table.append(f"| {r['files']:,} | {MODES[r['summary']]} | "
                     f"{r['world']} | {r['requests']:,} | {r['construct_s']:.2f} | "
                     f"{r['first_batch_s']:.2f} |")
    text = "\n".join(table)
    print(text)
    if args.write_doc:
        stamp = (f"Measured {datetime.date.today()} on {platform.machine()}, {os.cpu_count()} "
                 f"cores (moto S3 on loopback, no added latency; "
                 f"`.venv/bin/python bench/startup_files.py --files {' '.join(map(str, args.files))} "
                 f"--ranks {' '.join(map(str, args.ranks))}`).")
        block = f"{BEGIN}\n{stamp}\n\n{text}\n{END}"
        doc = DOC.read_text()
        if BEGIN in doc:
            doc = doc[:doc.index(BEGIN)] + block + doc[doc.index(END) + len(END):]
        else:
            doc += "\n" + block + "\n"
        DOC.write_text(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
