"""Wide tables: pqloader against pyarrow's iter_batches over N columns, top-level and as
the leaves of one struct (each a ratio measured in this run).

    .venv/bin/python bench/wide_bench.py --columns 5000 [--repeats 3]
    PYTHONPATH=<a staged build> .venv/bin/python bench/wide_bench.py   # another build

The columns: 70 % float32, 15 % int64, 10 % string, 5 % list<float32> of 4 values, and
an int64 `id`; 2,048 rows in 4 row groups; batches of 256 rows, 2 workers, every column.
Steady rows/s: the second and third epochs of one loader (the first starts the pipeline).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import pqloader

ROWS, GROUPS, BATCH = 2048, 4, 256


def write(path: Path, columns: int, struct: bool) -> None:
    rng = np.random.default_rng(0)
    counts = {"f": int(columns * 0.7), "i": int(columns * 0.15), "s": int(columns * 0.1)}
    counts["l"] = columns - sum(counts.values())
    make = {
        "f": lambda: pa.array(rng.random(ROWS, dtype=np.float32)),
        "i": lambda: pa.array(rng.integers(0, 1000, ROWS)),
        "s": lambda: pa.array([f"s{j % 37}" for j in range(ROWS)]),
        "l": lambda: pa.ListArray.from_arrays(pa.array(np.arange(0, ROWS * 4 + 1, 4, dtype=np.int32)),
                                              pa.array(rng.random(ROWS * 4, dtype=np.float32))),
    }
    names = [f"{kind}{i}" for kind, n in counts.items() for i in range(n)]
    arrays = [make[name[0]]() for name in names]
    ids = pa.array(np.arange(ROWS, dtype=np.int64))
    table = (pa.table({"id": ids, "feat": pa.StructArray.from_arrays(arrays, names)}) if struct
             else pa.Table.from_arrays([ids, *arrays], ["id", *names]))
    pq.write_table(table, path, row_group_size=ROWS // GROUPS)


def steady_rows_per_second(path: Path) -> float:
    """Rows of epochs 1 and 2 over their time: from the last batch of epoch 0 on (epoch 1's
    first batch counted with the time it took, as every other batch)."""
    loader = pqloader.Loader(str(path), batch_size=BATCH, num_workers=2, num_epochs=3)
    rows, start, last = 0, None, time.perf_counter()
    for batch in loader:
        if start is None and loader.epoch >= 1:
            start = last  # (timed from its arrival, the batch's rows came in no time)
        if start is not None:
            rows += len(batch["id"])
        last = time.perf_counter()
    return rows / (time.perf_counter() - start)


def arrow_rows_per_second(path: Path) -> float:
    f = pq.ParquetFile(path)
    for _ in f.iter_batches(batch_size=BATCH):
        pass
    start = time.perf_counter()
    rows = sum(b.num_rows for _ in range(2) for b in f.iter_batches(batch_size=BATCH))
    return rows / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--columns", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        files = {"flat": Path(d) / "flat.parquet", "struct": Path(d) / "struct.parquet"}
        for kind, path in files.items():
            write(path, args.columns, struct=kind == "struct")
        runs: dict[str, list[float]] = {}
        for _ in range(args.repeats):  # alternated, so that a loaded machine hits all alike
            for kind, path in files.items():
                runs.setdefault(f"pqloader {kind}", []).append(steady_rows_per_second(path))
                runs.setdefault(f"pyarrow {kind}", []).append(arrow_rows_per_second(path))
    median = {k: statistics.median(v) for k, v in runs.items()}
    print(f"{args.columns} columns, median of {args.repeats} (steady rows/s)")
    for kind in ("flat", "struct"):
        print(f"  {kind:6}  pqloader {median[f'pqloader {kind}']:9.0f}  pyarrow iter_batches "
              f"{median[f'pyarrow {kind}']:9.0f}  ratio {median[f'pqloader {kind}'] / median[f'pyarrow {kind}']:.2f}")
    print(f"  struct / flat (pqloader): {median['pqloader struct'] / median['pqloader flat']:.2f}")


if __name__ == "__main__":
    main()
