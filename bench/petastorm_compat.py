#!/usr/bin/env python3
"""Side by side on one Petastorm dataset: Petastorm's make_reader + petastorm.pytorch.DataLoader
against pqloader.petastorm's, the same program with only the import changed.

    python3 bench/petastorm_compat.py [--rows 3000] [--batch-size 64] [--repeats 3]

1. Builds ``bench/data/petastorm_compat/`` with **real Petastorm 0.13.1** under pyspark
   (``materialize_dataset``, bench/.venvs/petastorm; Java 17): ``id`` (ScalarCodec),
   ``image`` (CompressedImageCodec('jpeg', 90), 224×224×3 uint8), ``array``
   (NdarrayCodec, float32 64×64), ``label``. Reused when present.
2. Runs the reading program below once per system and repeat, in that system's venv
   (Petastorm: bench/.venvs/petastorm; pqloader: the repository's .venv), alternating:
   ``DataLoader(make_reader(url, num_epochs=1, shuffle_row_groups=False, workers_count=W),
   batch_size=B)``, one epoch, timed from ``make_reader`` to the last batch. Both see the
   same batches (image uint8 [B,224,224,3], array float32 [B,64,64]): the first batch's
   digest is compared.
3. Prints a table, the ratio, and writes docs/benchmarks_petastorm.md.

Petastorm runs with workers_count 10 (its default) and 2 (the cores here), the faster
kept; pqloader with workers_count=10, which it caps at the number of cores.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
DATA = os.path.join(BENCH, "data", "petastorm_compat")
PETASTORM_PY = os.path.join(BENCH, ".venvs", "petastorm", "bin", "python")
PQLOADER_PY = os.path.join(ROOT, ".venv", "bin", "python")
SIDE = 224


# --------------------------------------------------------------------------- dataset (petastorm venv)
def _image(rng, i):
    import numpy as np

    y, x = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32)
    f = 0.02 + 0.01 * (i % 7)
    img = np.stack([np.sin(x * f + c) * np.cos(y * f * 0.7 + i) for c in range(3)], axis=-1)
    img = (img * 90 + 128 + rng.normal(0, 6, img.shape)).clip(0, 255).astype(np.uint8)
    r0, c0 = rng.integers(0, SIDE - 60, 2)
    img[r0:r0 + 50, c0:c0 + 50] = rng.integers(0, 255, 3, dtype=np.uint8)
    return img


def make_dataset(path: str, rows: int) -> None:
    import numpy as np
    from petastorm.codecs import CompressedImageCodec, NdarrayCodec, ScalarCodec
    from petastorm.etl.dataset_metadata import materialize_dataset
    from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row
    from pyspark.sql import SparkSession
    from pyspark.sql.types import IntegerType, LongType

    schema = Unischema("CompatSchema", [
        UnischemaField("id", np.int64, (), ScalarCodec(LongType()), False),
        UnischemaField("image", np.uint8, (SIDE, SIDE, 3), CompressedImageCodec("jpeg", 90), False),
        UnischemaField("array", np.float32, (64, 64), NdarrayCodec(), False),
        UnischemaField("label", np.int32, (), ScalarCodec(IntegerType()), False),
    ])

    def row(i):
        rng = np.random.default_rng(i)
        return {"id": np.int64(i), "image": _image(rng, i),
                "array": rng.standard_normal((64, 64)).astype(np.float32), "label": np.int32(i % 10)}

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.driver.memory", "2g").getOrCreate())
    url = "file://" + path
    with materialize_dataset(spark, url, schema, row_group_size_mb=16):
        rdd = spark.sparkContext.parallelize(range(rows), 4).map(row).map(lambda r: dict_to_spark_row(schema, r))
        spark.createDataFrame(rdd, schema.as_spark_schema()).write.mode("overwrite").parquet(url)
    spark.stop()


# --------------------------------------------------------------------------- one measurement (either venv)
def measure(system: str, path: str, batch_size: int, workers: int) -> dict:
    import warnings

    warnings.simplefilter("ignore")
    if system == "petastorm":
        from petastorm import make_reader
        from petastorm.pytorch import DataLoader
    else:
        from pqloader.petastorm import make_reader
        from pqloader.petastorm.pytorch import DataLoader
    t0 = time.perf_counter()
    rows, digest, first = 0, "", None
    with DataLoader(make_reader("file://" + path, num_epochs=1, shuffle_row_groups=False, workers_count=workers),
                    batch_size=batch_size) as loader:
        for batch in loader:
            if first is None:
                first = time.perf_counter() - t0
                h = hashlib.sha256()
                for name in ("id", "image", "array"):
                    h.update(batch[name].numpy().tobytes())
                digest = h.hexdigest()[:16]
                shapes = {k: [str(v.dtype), list(v.shape)] for k, v in batch.items()}
            rows += len(batch["id"])
    seconds = time.perf_counter() - t0
    return {"system": system, "workers_count": workers, "rows": rows, "seconds": seconds,
            "samples_per_s": rows / seconds, "first_batch_s": first, "digest": digest, "shapes": shapes}


# --------------------------------------------------------------------------- driver
def _run(python: str, *args: str) -> dict:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env.pop("PYTHONPATH", None)
    done = subprocess.run([python, os.path.abspath(__file__), *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{python} {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cpu_load() -> float:
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--report", default=os.path.join(ROOT, "docs", "benchmarks_petastorm.md"))
    ap.add_argument("--make-dataset")
    ap.add_argument("--measure", choices=("petastorm", "pqloader"))
    ap.add_argument("--path")
    ap.add_argument("--workers", type=int, default=10)
    a = ap.parse_args()
    if a.make_dataset:
        make_dataset(a.make_dataset, a.rows)
        print(json.dumps({"ok": True}))
        return
    if a.measure:
        print(json.dumps(measure(a.measure, a.path, a.batch_size, a.workers)))
        return

    stamp = os.path.join(DATA, ".rows")
    if not (os.path.exists(stamp) and open(stamp).read() == str(a.rows)):
        print(f"[compat] writing {a.rows} rows with Petastorm materialize_dataset -> {DATA}", file=sys.stderr)
        _run(PETASTORM_PY, "--make-dataset", DATA, "--rows", str(a.rows))
        with open(stamp, "w") as f:
            f.write(str(a.rows))
    runs = []
    configs = [("petastorm", PETASTORM_PY, 10), ("petastorm", PETASTORM_PY, 2), ("pqloader", PQLOADER_PY, 10)]
    for r in range(a.repeats):
        for system, python, workers in configs:
            load = _cpu_load()
            res = _run(python, "--measure", system, "--path", DATA, "--batch-size", str(a.batch_size),
                       "--workers", str(workers))
            res["load_before"] = load
            runs.append(res)
            print(f"[compat] {system:9s} workers_count={workers:2d}: {res['samples_per_s']:8.1f} samples/s "
                  f"({res['seconds']:.2f} s, first batch {res['first_batch_s']:.2f} s, load {load:.2f})",
                  file=sys.stderr)
    digests = {r["digest"] for r in runs}
    if len(digests) != 1:
        raise SystemExit(f"the systems returned different first batches: {digests}")
    best = {}
    for r in runs:
        key = (r["system"], r["workers_count"])
        if key not in best or r["samples_per_s"] > best[key]["samples_per_s"]:
            best[key] = r
    pst = max((v for k, v in best.items() if k[0] == "petastorm"), key=lambda v: v["samples_per_s"])
    pql = best[("pqloader", 10)]
    ratio = pql["samples_per_s"] / pst["samples_per_s"]
    # Per round (the three runs back to back, under about the same load): pqloader over the
    # faster Petastorm configuration; the median is steadier than best-of on a shared machine.
    per_round = []
    for i in range(0, len(runs), len(configs)):
        rnd = runs[i:i + len(configs)]
        p_best = max(r["samples_per_s"] for r in rnd if r["system"] == "petastorm")
        per_round.append(next(r for r in rnd if r["system"] == "pqloader")["samples_per_s"] / p_best)
    median = sorted(per_round)[len(per_round) // 2]
    command = f"python3 bench/petastorm_compat.py --rows {a.rows} --batch-size {a.batch_size} --repeats {a.repeats}"
    lines = [
        "# Petastorm dataset, Petastorm's reader vs pqloader.petastorm (import changed)",
        "",
        f"Generated by `{command}` on {time.strftime('%Y-%m-%d')} ({platform.machine()}, "
        f"{os.cpu_count()} cores, shared). Dataset: {a.rows} rows written by Petastorm 0.13.1 "
        f"`materialize_dataset` (pyspark): `image` CompressedImageCodec('jpeg', 90) 224×224×3, `array` "
        "NdarrayCodec float32 64×64, `id`, `label`. Program: `DataLoader(make_reader(url, num_epochs=1, "
        f"shuffle_row_groups=False, workers_count=W), batch_size={a.batch_size})`, one epoch from "
        "`make_reader` to the last batch, best of the repeats; the first batches are identical "
        f"(digest `{pql['digest']}`).",
        "",
        "| reader | workers_count | samples/s | epoch s | first batch s |",
        "|---|---|---|---|---|",
    ]
    for (system, workers), r in sorted(best.items()):
        lines.append(f"| {'Petastorm 0.13.1' if system == 'petastorm' else 'pqloader.petastorm'} | {workers} | "
                     f"{r['samples_per_s']:.0f} | {r['seconds']:.2f} | {r['first_batch_s']:.2f} |")
    lines += ["", f"**pqloader.petastorm / Petastorm: {median:.1f}× (median of the rounds; per round: "
              f"{', '.join(f'{x:.1f}×' for x in per_round)}; best of each: {ratio:.1f}×)**", "",
              "All runs (load average before each run, a noise indicator):", ""]
    lines += [f"- {r['system']} workers_count={r['workers_count']}: {r['samples_per_s']:.0f} samples/s, "
              f"load {r['load_before']:.2f}" for r in runs]
    with open(a.report, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
