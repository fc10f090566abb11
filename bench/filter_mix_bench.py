"""Filters and mixtures against the plain loader, side by side in one run (issue 19 goals).

    .venv/bin/python bench/filter_mix_bench.py [--rows 2000000] [--token-rows 400000]
        [--repeat 3] [--write-doc]

Writes a wide table (``ts`` int64 sorted across files, 24 float32 columns; 40 files, row
groups of ROWS/200 rows) twice, snappy (decoding is nearly a copy: the worst case for any
added copy) and zstd, to a temporary directory, then times shuffled epochs
(batch 1024, default workers) in fresh Loaders, construction included (a filter's mask
pass runs then), best of ``--repeat``, alternating the contenders:

* filter: ``ts < 10 %`` (statistics keep 10 % of the row groups, whole) against no filter:
  bytes read (``stats()["bytes_read"]``) and seconds;
* filter needing masks: ``c0 < 0.1`` (every row group read for its mask, 10 % of rows kept);
* mixture: the same rows as three directories (50 / 30 / 20 %) mixed by those weights
  (``stop="first"``) against one Loader over the three: rows per second; beside them the
  three Loaders read in turn without mixing (what three engines cost by themselves).

The mixture and the one loader are also timed as training runs them (rows "..., steady"):
one object iterated for 3 warm-up epochs and 3 more, the median of those 3, in
``--repeat`` paired rounds (fresh objects each round, the order reversed every other
round); the ratio is the median of the per-round ratios, with their range. A fresh
Loader's epoch above also pays its start (each source's first shuffle window decoded
before the first batch) and its first touch of memory.

Last, the language-model case, steady only: token sequences (``--token-rows`` of them,
int32, lognormal lengths 8..2048) in three directories, ``PadOrTruncate(1024)``, batch
64, mixed 50 / 30 / 20 % against one Loader over the three.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import pqloader
import pqloader.transforms

HERE = Path(__file__).resolve().parent
DOC = HERE.parent / "docs" / "benchmarks_filter_mix.md"
FILES = 40
COLUMNS = 24


def write(root: Path, rows: int, compression: str) -> None:
    rng = np.random.default_rng(0)
    per_file = rows // FILES
    parts = {"a": range(0, 20), "b": range(20, 32), "c": range(32, 40)}
    for part, indices in parts.items():
        (root / part).mkdir(parents=True)
        for f in indices:
            ts = np.arange(f * per_file, (f + 1) * per_file, dtype=np.int64)
            cols = {"ts": ts}
            for c in range(COLUMNS):
                values = rng.random(per_file, dtype=np.float32)
                # zstd: values on a 0.01 grid, which Parquet dictionary-encodes and zstd
                # compresses (decoding is real work, as in most datasets).
                cols[f"c{c}"] = np.round(values, 2) if compression == "zstd" else values
            pq.write_table(pa.table(cols), root / part / f"f{f:03d}.parquet",
                           row_group_size=max(1, rows // 200), compression=compression)


class InTurn:
    """Three loaders' batches one after another, round robin: the cost of three engines
    without the mixing."""

    def __init__(self, loaders: list) -> None:
        self.loaders = loaders

    def __iter__(self):
        its = [iter(l) for l in self.loaders]
        while its:
            for it in list(its):
                b = next(it, None)
                if b is None:
                    its.remove(it)
                else:
                    yield b

    def stats(self) -> dict:
        return {"bytes_read": sum(l.stats()["bytes_read"] for l in self.loaders)}


def epoch(make) -> tuple[float, int, dict]:
    t0 = time.perf_counter()
    it = make()
    rows = 0
    for b in it:
        rows += len(b["ts"])
    seconds = time.perf_counter() - t0
    stats = it.stats() if hasattr(it, "stats") else {}
    return seconds, rows, stats


WARMUP = 3  # epochs left out of a steady measurement (see steady())
MEASURED = 3


def steady(make, column: str = "ts") -> tuple[float, int]:
    """One object iterated as training runs it: WARMUP epochs left out (its first shuffle
    windows, its pool's blocks and the process's pages come in during the first 2-5
    epochs: docs/performance.md, thirteenth session), then the median of MEASURED epochs'
    seconds, and the rows of one. The object is dropped before the caller makes the
    next, so nothing of it runs ahead during another's epochs."""
    it = make()
    batches = iter(it)
    times, rows = [], 0
    t = time.perf_counter()
    for e in range(WARMUP + MEASURED):
        # Each epoch's length asked for when it starts, as a training loop does (a
        # mixture draws it half way through the epoch before and keeps those draws).
        n = it.num_batches(e) if hasattr(it, "num_batches") else len(it)
        rows = 0
        for _ in range(n):
            rows += len(next(batches)[column])
        now = time.perf_counter()
        times.append(now - t)
        t = now
    del batches, it
    gc.collect()  # its threads and memory gone before the next object is made
    return statistics.median(times[WARMUP:]), rows


def paired_steady(contenders: dict, rounds: int, column: str = "ts") -> dict:
    """Steady epochs of each contender, in rounds (the order reversed every other round),
    each round's fresh objects; per contender the median (seconds, rows) and, against the
    first contender, the median of the per-round rows/s ratios and their range: load
    coming and going on a shared machine hits both sides of a round alike."""
    names = list(contenders)
    per = {n: [] for n in names}
    for r in range(rounds):
        for n in names[:: -1 if r % 2 else 1]:
            per[n].append(steady(contenders[n], column))
    out = {}
    for n in names:
        ratios = [(rows / s) / (rb / sb) for (s, rows), (sb, rb) in zip(per[n], per[names[0]])]
        out[n] = (statistics.median(s for s, _ in per[n]), int(statistics.median(r for _, r in per[n])),
                  statistics.median(ratios), min(ratios), max(ratios))
    return out


def steady_lines(result: dict, unit: str, bytes_column: bool = True) -> list[str]:
    gap = " |" if bytes_column else ""
    return [f"| {name} | {s:.2f} | {rows} | {rows / s:,.0f} |{gap} {ratio:.2f}x the {unit} "
            f"(rounds {lo:.2f}-{hi:.2f}) |" for name, (s, rows, ratio, lo, hi) in result.items()]


def run(a: argparse.Namespace, codec: str) -> str:
    tmp = Path(tempfile.mkdtemp(prefix="pqloader-filter-mix-"))
    try:
        write(tmp, a.rows, codec)
        dirs = [str(tmp / d) for d in ("a", "b", "c")]
        kw = dict(batch_size=1024, shuffle=True, seed=1, num_epochs=1)
        cut = a.rows // 10
        contenders = {
            "no filter": lambda: pqloader.Loader(dirs, **kw),
            "filter ts < 10 % (statistics)": lambda: pqloader.Loader(dirs, filter=pc.field("ts") < cut, **kw),
            "filter c0 < 0.1 (row masks)": lambda: pqloader.Loader(dirs, filter=pc.field("c0") < 0.1, **kw),
            "one loader over a, b, c": lambda: pqloader.Loader(dirs, **kw),
            "a, b, c read in turn (3 loaders, no mixing)": lambda: InTurn(
                [pqloader.Loader(d, **{**kw, "seed": i}) for i, d in enumerate(dirs)]),
            "mix(a, b, c) by 50/30/20 %": lambda: pqloader.mix(
                [pqloader.Loader(d, **{**kw, "seed": i}) for i, d in enumerate(dirs)], [0.5, 0.3, 0.2],
                seed=1, source_column=None),
        }
        forever = {**kw, "num_epochs": None}
        steady_contenders = {
            "one loader over a, b, c, steady": lambda: pqloader.Loader(dirs, **forever),
            "mix(a, b, c) by 50/30/20 %, steady": lambda: pqloader.mix(
                [pqloader.Loader(d, **{**forever, "seed": i}) for i, d in enumerate(dirs)], [0.5, 0.3, 0.2],
                seed=1, source_column=None, num_epochs=None),
        }
        best: dict[str, tuple[float, int, dict]] = {}
        for _ in range(a.repeat):
            for name, make in contenders.items():
                r = epoch(make)
                if name not in best or r[0] < best[name][0]:
                    best[name] = r
        steady_result = paired_steady(steady_contenders, a.repeat)
        base_s, base_rows, base_stats = best["no filter"]
        lines = ["| run | seconds | rows | rows/s | bytes read | vs no filter / one loader |",
                 "|---|---|---|---|---|---|"]
        for name, (s, rows, stats) in best.items():
            three = name.startswith(("mix", "a, b, c"))
            ref = best["one loader over a, b, c"] if three else best["no filter"]
            if three or name.startswith("one"):
                ratio = f"{(rows / s) / (ref[1] / ref[0]):.2f}x the rows/s"
            else:
                ratio = (f"{base_s / s:.1f}x faster, "
                         f"{stats.get('bytes_read', 0) / max(1, base_stats['bytes_read']):.1%} of the bytes")
            lines.append(f"| {name} | {s:.2f} | {rows} | {rows / s:,.0f} | "
                         + (f"{stats['bytes_read'] / 2**20:,.1f} MiB" if "bytes_read" in stats else "") + f" | {ratio} |")
        table = "\n".join(lines + steady_lines(steady_result, "rows/s"))
        print(codec)
        print(table)
        return table
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_tokens(root: Path, rows: int) -> None:
    """Token sequences (lognormal lengths, median ~250, 8..2048 int32 tokens) in three
    directories of 5/3/2 files, 10 row groups each."""
    rng = np.random.default_rng(1)
    per_file = rows // 10
    for part, indices in {"a": range(0, 5), "b": range(5, 8), "c": range(8, 10)}.items():
        (root / part).mkdir(parents=True)
        for f in indices:
            lengths = np.clip(rng.lognormal(5.5, 0.8, per_file).astype(np.int64), 8, 2048)
            offsets = np.zeros(per_file + 1, np.int32)
            np.cumsum(lengths, out=offsets[1:])
            values = rng.integers(0, 32_000, int(offsets[-1]), dtype=np.int32)
            pq.write_table(pa.table({"tokens": pa.ListArray.from_arrays(offsets, values)}),
                           root / part / f"f{f:02d}.parquet", row_group_size=max(1, per_file // 10))


def run_tokens(a: argparse.Namespace) -> str:
    """The language-model case: sequences padded or truncated to 1024 tokens, batch 64;
    the mixture of the three directories against one loader over them, steady."""
    tmp = Path(tempfile.mkdtemp(prefix="pqloader-token-mix-"))
    try:
        write_tokens(tmp, a.token_rows)
        dirs = [str(tmp / d) for d in ("a", "b", "c")]
        kw = dict(batch_size=64, shuffle=True, seed=1, num_epochs=None,
                  transforms={"tokens": [pqloader.transforms.PadOrTruncate(1024)]})
        contenders = {
            "one loader over a, b, c, steady": lambda: pqloader.Loader(dirs, **kw),
            "mix(a, b, c) by 50/30/20 %, steady": lambda: pqloader.mix(
                [pqloader.Loader(d, **{**kw, "seed": i}) for i, d in enumerate(dirs)], [0.5, 0.3, 0.2],
                seed=1, source_column=None, num_epochs=None),
        }
        lines = ["| run | seconds | sequences | sequences/s | vs one loader |", "|---|---|---|---|---|"]
        lines += steady_lines(paired_steady(contenders, a.repeat, column="tokens"), "sequences/s",
                              bytes_column=False)
        table = "\n".join(lines)
        print("tokens")
        print(table)
        return table
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=2_000_000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--token-rows", type=int, default=400_000)
    p.add_argument("--write-doc", action="store_true")
    a = p.parse_args()
    tables = []
    for codec in ("snappy", "zstd"):
        tables.append((codec, run(a, codec)))
    tables.append((f"tokens: {a.token_rows:,} sequences padded to 1024", run_tokens(a)))
    if a.write_doc:
        when = datetime.datetime.now().strftime("%Y-%m-%d")
        body = "".join(f"### {codec}\n\n{table}\n\n" for codec, table in tables)
        DOC.write_text(
            "# Filters and mixtures: measured\n\n"
            f"`.venv/bin/python bench/filter_mix_bench.py --rows {a.rows} --token-rows {a.token_rows} "
            f"--repeat {a.repeat} --write-doc` "
            f"({when}, {os.cpu_count()} cores, {platform.python_version()}; best of {a.repeat}, "
            "contenders alternated; each a fresh Loader, construction (and so the filter's mask "
            "pass) included, but for the rows ending \"steady\" (paired rounds, below); shuffled, "
            "batch 1024).\n\n"
            f"Data: {a.rows:,} rows, {FILES} files in three directories (20/12/8 files), "
            f"`ts` int64 sorted across files + {COLUMNS} float32 columns (random), {a.rows // 200:,}-row "
            "row groups; once snappy with random floats (they do not compress: decoding is about "
            "a copy, the worst case for anything that adds one), once zstd with floats on a 0.01 "
            "grid (dictionary-encoded and compressed: decoding is real work). The last table is "
            "the language-model case: token sequences (int32, lognormal lengths, median ~250, "
            "8-2048) in three directories (5/3/2 files), `PadOrTruncate(1024)`, batch 64, "
            "steady epochs only.\n\n" + body +
            "Goals (issue 19): a filter keeping 10 % of the row groups by statistics reads <= 12 % "
            "of the bytes and runs >= 5x the unfiltered epoch; a 3-source mixture costs <= 10 % "
            "throughput against the same data as one dataset. The mixture stops when its first "
            "source runs out (`stop=\"first\"`), so it yields slightly fewer rows; rows/s compares. "
            "The mixture's bytes read are its sources' (`Mixture.stats()`). Its sources write "
            "their rows of each batch in place (grouped by source inside the batch): the tables' "
            "sources from their shuffle windows' gathers, the token sources as they pad each of "
            "their batches. Its sources "
            "run their own workers and memory bounds; \"read in turn\" "
            "is the three engines at their own full budgets, without mixing. Rows ending \"steady\" iterate one "
            f"object as training runs it: {WARMUP} warm-up epochs left out (its first shuffle windows, "
            f"its pool's blocks and pages come in over the first 2-5), then the median of {MEASURED} "
            f"epochs, in {a.repeat} paired rounds (fresh objects each round, order reversed every "
            "other round); their ratio is the median of the per-round ratios, the range in "
            "parentheses.\n")
        print(f"wrote {DOC.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
