"""bench-quick: pqloader against its ceilings, every figure measured in this one run.

    make bench-quick                 # = .venv/bin/python bench/quick.py
    .venv/bin/python bench/quick.py --only tabular,cache --repeats 3
    make bench-quick BENCH_QUICK_ARGS=--write-doc   # also docs/benchmarks_quick.md

Use it before and after every change on the hot path: each row is a ratio to a ceiling
measured side by side on the same files and cores, so the ratios (not the absolute
rates) are what compare across machines and runs. The tabular, tokens and images rows
are paired rounds (the ceiling, then the contenders in turns, per round; the median of
the per-round ratios), so load that comes and goes on a shared VM hits both sides of a
ratio alike; loaders are timed in steady epochs, after the epochs that start the
pipeline and fault in the process's working set (WARMUP). Rows:

* tabular (80 float32 + 21 int64 columns, 64k-row row groups, snappy, batch 1024):
  pqloader shuffled and unshuffled vs a 2-thread pool decoding whole row groups with
  pyarrow (read_row_group + to_numpy per column), and a cold-page-cache shuffled epoch
  (files evicted with posix_fadvise(DONTNEED) first) vs the same pool, also cold.
* cache: epochs served from a warm `cache_dir`, shuffled and not, vs a single-thread
  `np.copyto` of the same decoded bytes; and shuffled hits vs the shuffled uncached epoch;
  then shuffled hits with max_inflight_bytes=1 GiB (the next window gathered ahead).
* tokens (list<int32>, log-normal lengths, batch 256): PadOrTruncate(1024) vs the
  values+offsets ceiling (the 2-thread pool reading the column and taking its values
  and offsets as NumPy arrays); and the language-model layouts, shuffled — ragged
  (lists="ragged"), dynamic padding (Pad(multiple_of=8)) in seq/s, packed blocks
  (Pack(seq_len=1024), 32 blocks a batch) in tokens/s — against pyarrow's read_table of
  the same files on all cores, in paired rounds (median of the per-round ratios).
* images (500x375 JPEGs cut from scikit-image photographs, batch 64): the eval pipeline
  DecodeImage, Resize(256), CenterCrop(224), Normalize, ToCHW vs libjpeg-turbo's
  decode-only rate on all cores (Pillow, which bundles libjpeg-turbo, one thread per core;
  its decoder releases the GIL).

Data is generated once into bench/data/quick/ (seeded; reused while the spec matches).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import io
import json
import os
import platform
import shutil
import statistics
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import pqloader
from pqloader import transforms as T

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data" / "quick"
DOC = ROOT / "docs" / "benchmarks_quick.md"
ONLY = "tabular,cache,tokens,images"  # the parts, by default all
REPEATS = 2
CORES = os.cpu_count() or 1

SPEC = {
    "tabular": dict(rows=1_000_000, files=4, row_group=65_536, f32=80, i64=21, batch=1024),
    "tokens": dict(rows=240_000, files=2, row_group=40_000, batch=256, max_len=1024),
    "images": dict(rows=1_200, files=2, row_group=200, batch=64),
    # 2: the files' seeds no longer depend on PYTHONHASHSEED (version 1 seeded them with
    # hash(name), which Python salts per process: every generation wrote other bytes).
    "version": 2,
}


# ----------------------------------------------------------------------------- data
def _write_files(name: str, make_table, files: int, rows: int, row_group: int) -> Path:
    out = DATA / name
    manifest = DATA / f"{name}.manifest.json"
    spec = {"spec": SPEC[name], "version": SPEC["version"]}
    if manifest.exists() and json.loads(manifest.read_text()) == spec:
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    per_file = rows // files
    for f in range(files):
        rng = np.random.default_rng([SPEC["version"], zlib.crc32(name.encode()) % 1000, f])
        table = make_table(rng, per_file)
        pq.write_table(table, out / f"part-{f:03d}.parquet", row_group_size=row_group,
                       compression="snappy")
    manifest.write_text(json.dumps(spec))
    return out


def tabular_data() -> Path:
    s = SPEC["tabular"]

    def make(rng, n):
        cols = {f"f{i:02d}": rng.standard_normal(n, dtype=np.float32) for i in range(s["f32"])}
        cols.update({f"i{i:02d}": rng.integers(0, 1 << 40, n) for i in range(s["i64"])})
        return pa.table(cols)

    return _write_files("tabular", make, s["files"], s["rows"], s["row_group"])


def tokens_data() -> Path:
    s = SPEC["tokens"]

    def make(rng, n):
        lengths = np.clip(rng.lognormal(4.6, 0.8, n).astype(np.int64), 8, s["max_len"])
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        values = rng.integers(0, 32_000, int(offsets[-1]), dtype=np.int32)
        return pa.table({"tokens": pa.ListArray.from_arrays(offsets, values),
                         "label": rng.integers(0, 2, n)})

    return _write_files("tokens", make, s["files"], s["rows"], s["row_group"])


def images_data() -> Path:
    s = SPEC["images"]
    from PIL import Image
    import skimage.data as sd

    photos = [sd.astronaut(), sd.chelsea(), sd.coffee(), sd.rocket()]

    def make(rng, n):
        blobs = []
        for i in range(n):
            p = Image.fromarray(photos[int(rng.integers(len(photos)))])
            zoom = max(500 / p.width, 375 / p.height) * rng.uniform(1.0, 1.6)
            p = p.resize((max(500, int(p.width * zoom)), max(375, int(p.height * zoom))),
                         Image.BICUBIC)
            x, y = int(rng.integers(0, p.width - 499)), int(rng.integers(0, p.height - 374))
            p = p.crop((x, y, x + 500, y + 375))
            b = io.BytesIO()
            p.save(b, format="JPEG", quality=90)
            blobs.append(b.getvalue())
        return pa.table({"image": pa.array(blobs, pa.binary()), "label": rng.integers(0, 1000, n)})

    return _write_files("images", make, s["files"], s["rows"], s["row_group"])


def files_of(d: Path) -> list[Path]:
    return sorted(d.glob("*.parquet"))


def evict(d: Path) -> None:
    """Drop the files' pages from the page cache (posix_fadvise DONTNEED)."""
    for f in files_of(d):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# ------------------------------------------------------------------------ ceilings
def pool_decode(d: Path, columns=None, per_column=None) -> int:
    """Decode every row group with a pool of one thread per core; return rows."""
    jobs = [(f, g) for f in files_of(d) for g in range(pq.ParquetFile(f).num_row_groups)]

    def one(job):
        f, g = job
        t = pq.ParquetFile(f).read_row_group(g, columns=columns, use_threads=False)
        for c in t.columns:
            (per_column or (lambda a: a.to_numpy()))(c.combine_chunks())
        return t.num_rows

    with ThreadPoolExecutor(CORES) as ex:
        return sum(ex.map(one, jobs))


def values_offsets(a: pa.Array):
    return a.values.to_numpy(), a.offsets.to_numpy()


def copy_rate(nbytes: int) -> float:
    """Single-thread np.copyto of `nbytes`, in batch-sized pieces; bytes/s."""
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return nbytes / best


def jpeg_blobs(d: Path) -> list[bytes]:
    return [b for f in files_of(d) for b in pq.read_table(f, columns=["image"]).column(0).to_pylist()]


def jpeg_decode_seconds(blobs: list[bytes]) -> float:
    """Seconds to decode every JPEG once, one Pillow thread per core."""
    from PIL import Image

    def dec(chunk):
        for b in chunk:
            with Image.open(io.BytesIO(b)) as im:
                im.load()

    chunks = [blobs[i::CORES] for i in range(CORES)]
    t = time.perf_counter()
    with ThreadPoolExecutor(CORES) as ex:
        list(ex.map(dec, chunks))
    return time.perf_counter() - t


# --------------------------------------------------------------------- measurement
def timed(fn, repeats: int) -> float:
    """Best wall time of `fn()` over `repeats` runs."""
    best = 1e9
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def epoch(loader: pqloader.Loader) -> int:
    rows = 0
    for b in loader:
        rows += len(next(iter(b.values())))
    return rows


def epoch_times(loader: pqloader.Loader, epochs: int) -> list[float]:
    """Seconds of each of `epochs` consecutive epochs of one iteration, as training runs
    them (the loader starts the next epoch while one ends)."""
    per_epoch = len(loader)
    times, n, t = [], 0, time.perf_counter()
    for _ in loader:
        n += 1
        if n % per_epoch == 0:
            now = time.perf_counter()
            times.append(now - t)
            t = now
            if len(times) == epochs:
                break
    return times


# Epochs left out before a steady epoch is timed: the first starts the pipeline (and
# fills a cache); the next ones still fault in the process's working set (the buffer
# pool's blocks: 558, 69, 2, 0, 32, 12, then 0 MB fresh in epochs 1-7 of the shuffled
# tabular loader; cache hits 65, 64, 86, 0 MB in hit epochs 1-4; in a VM each fresh huge
# page costs ~3 ms, so a warm-up epoch can take twice a steady one's time; see
# docs/performance.md, thirteenth session). Training runs many epochs: the steady ones
# are its rate.
WARMUP = 3
CACHE_WARMUP = 4  # the filling epoch, then three of hits


def steady(loader_factory, repeats: int, warmup: int = WARMUP) -> float:
    """Best epoch time of a continuous iteration, after `warmup` epochs."""
    loader = loader_factory()
    try:
        times = epoch_times(loader, repeats + warmup)
    finally:
        loader.close()  # its read-ahead must not run on into what is timed next
    return min(times[warmup:])


def steady_median(loader_factory, epochs: int = 3, warmup: int = WARMUP) -> float:
    """Median epoch time of a continuous iteration, after `warmup` epochs (for paired
    rounds: a best-of favours whichever side has more fast outliers)."""
    loader = loader_factory()
    try:
        return statistics.median(epoch_times(loader, epochs + warmup)[warmup:])
    finally:
        # The loader reads the next epoch ahead while one ends: closed, it reads nothing
        # while the ceiling of the next round is timed (that would slow the ceiling and
        # hand the contender's next epoch an idle head start).
        loader.close()


def paired(rounds: int, ceiling, contenders: dict) -> dict:
    """Time the ceiling, then each contender, per round; return per contender the median
    time and the median of its per-round ratios (ceiling time / its time), and the same
    for every pair of contenders, so that load coming and going on a shared machine hits
    both sides of each ratio alike. `ceiling` and each contender return seconds; the
    ceiling runs twice a round, its faster run kept (its first run after a contender
    faults in the memory the contender's pool holds: up to 2x slower in a VM), and each
    contender is timed warm (its start-up left out by the caller)."""
    per = {name: [] for name in contenders}
    base = []
    for r in range(rounds):
        base.append(min(ceiling(), ceiling()))
        # Contenders in turn, in reverse order every other round (none always runs first).
        for name in list(contenders)[:: -1 if r % 2 else 1]:
            per[name].append(contenders[name]())
    out = {"ceiling": statistics.median(base)}
    for name, ts in per.items():
        out[name] = (statistics.median(ts), statistics.median(b / t for b, t in zip(base, ts)))
    names = list(contenders)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            out[(a, b)] = statistics.median(tb / ta for ta, tb in zip(per[a], per[b]))
    return out


def shown(ratio: float, goal: float | None) -> str:
    """The ratio to 2 decimals, or 3 where 2 would round it across its goal (0.896 is not
    0.90 when the goal is 0.90)."""
    two = f"{ratio:.2f}"
    if goal is not None and goal == goal and (float(two) >= goal) != (ratio >= goal):
        return f"{ratio:.3f}"
    return two


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, float, str, float, float, str]] = []

    def add(self, what: str, rate: float, unit: str, ceiling: float, goal: float | None,
            ceiling_name: str) -> None:
        ratio = rate / ceiling
        self.rows.append((what, rate, unit, ratio, goal if goal is not None else float("nan"),
                          ceiling_name))
        ok = "" if goal is None else ("  ok" if ratio >= goal else "  BELOW GOAL")
        print(f"  {what:<38} {rate:>12,.0f} {unit:<7} {shown(ratio, goal):>6}x {ceiling_name}{ok}",
              flush=True)

    def markdown(self) -> str:
        out = ["| row | rate | ratio | goal | met | ceiling |", "|---|---:|---:|---:|---|---|"]
        for what, rate, unit, ratio, goal, ceiling in self.rows:
            g = "" if goal != goal else f"≥ {goal:.2f}"
            met = "" if goal != goal else ("yes" if ratio >= goal else "**no**")
            out.append(f"| {what} | {rate:,.0f} {unit} | {shown(ratio, goal)}× | {g} | {met} | {ceiling} |")
        return "\n".join(out)


def run_tabular(table: Table, repeats: int, workers: int) -> None:
    d = tabular_data()
    s = SPEC["tabular"]
    rows = s["rows"] // s["files"] * s["files"]
    common = dict(batch_size=s["batch"], num_workers=workers)

    def loader_steady(shuffle):
        return lambda: steady_median(lambda: pqloader.Loader(str(d), shuffle=shuffle, seed=1,
                                                             num_epochs=None, **common))

    # Paired rounds: the ceiling, then a shuffled and an unshuffled loader's steady
    # epochs (a new loader of each per round), in turns.
    r = paired(max(4, repeats), lambda: timed(lambda: pool_decode(d), 1),
               {"shuffled": loader_steady(True), "unshuffled": loader_steady(False)})
    ceiling = rows / r["ceiling"]
    table.add("ceiling: row groups, pyarrow pool", ceiling, "rows/s", ceiling, None,
              f"{CORES}-thread row-group decode")
    for name in ("shuffled", "unshuffled"):
        rate = rows / r[name][0]
        table.add(f"tabular {name}", rate, "rows/s", rate / r[name][1], 0.8,
                  f"{CORES}-thread row-group decode, paired rounds")
    shuffled = rows / r["shuffled"][0]
    table.add("tabular shuffled / unshuffled", shuffled, "rows/s",
              shuffled / r[("shuffled", "unshuffled")], 0.9, "pqloader unshuffled, paired rounds")

    def cold(fn):
        def run():
            evict(d)
            fn()
        return run

    cold_ceiling = rows / timed(cold(lambda: pool_decode(d)), 1)
    loader = pqloader.Loader(str(d), shuffle=True, seed=1, **common)
    cold_rate = rows / timed(cold(lambda: epoch(loader)), 1)
    table.add("tabular shuffled, cold page cache", cold_rate, "rows/s", cold_ceiling, None,
              "row-group decode, cold")


def run_cache(table: Table, repeats: int, workers: int, tmp: Path) -> None:
    """Epoch 1 of a loader with a cache fills it; later epochs are hits."""
    d = tabular_data()
    s = SPEC["tabular"]
    rows = s["rows"] // s["files"] * s["files"]
    common = dict(batch_size=s["batch"], num_workers=workers, num_epochs=None)
    uncached_rate = rows / steady(lambda: pqloader.Loader(str(d), shuffle=True, seed=1, **common),
                                  repeats)
    for shuffle in (False, True):
        name = "shuffled" if shuffle else "unshuffled"
        cache = tmp / f"cache-{name}"
        shutil.rmtree(cache, ignore_errors=True)
        loader = pqloader.Loader(str(d), cache_dir=str(cache), shuffle=shuffle, seed=1, **common)
        times = epoch_times(loader, repeats + CACHE_WARMUP)  # epoch 1 fills the cache
        fill_rate, rate = rows / times[0], rows / min(times[CACHE_WARMUP:])
        # The bytes an epoch hands out (every column's values), copied once in one thread.
        first = next(iter(loader))
        row_bytes = sum(v.nbytes for v in first.values()) / len(next(iter(first.values())))
        decoded = int(row_bytes * rows)
        copy = copy_rate(decoded) / row_bytes
        assert loader.stats()["cache_hits"] >= repeats * loader.stats()["cache_misses"], loader.stats()
        del loader
        table.add(f"cache hits, {name}", rate, "rows/s", copy, 0.25 if shuffle else None,
                  "1-thread np.copyto of the bytes")
        if shuffle:
            table.add("cache hits shuffled / uncached shuffled", rate, "rows/s", uncached_rate,
                      3.0, "shuffled epoch, no cache")
            table.add("cache fill (epoch 1) / uncached, shuffled", fill_rate, "rows/s",
                      uncached_rate, None, "shuffled epoch, no cache")
            # The same hits with a budget that holds the next shuffle window's gather
            # (three of this data's 128 MB windows in the pipeline's share): it is made
            # while the consumer takes the current one's batches.
            big = pqloader.Loader(str(d), cache_dir=str(cache), shuffle=True, seed=1,
                                  max_inflight_bytes=1 << 30, **common)
            big_rate = rows / min(epoch_times(big, repeats + CACHE_WARMUP)[CACHE_WARMUP:])
            del big
            table.add("cache hits, shuffled, 1 GiB in flight", big_rate, "rows/s", copy, None,
                      "1-thread np.copyto of the bytes")
        shutil.rmtree(cache, ignore_errors=True)


def run_tokens(table: Table, repeats: int, workers: int) -> None:
    d = tokens_data()
    s = SPEC["tokens"]
    rows = s["rows"] // s["files"] * s["files"]
    tokens = sum(len(pq.read_table(f, columns=["tokens"]).column(0).combine_chunks().values)
                 for f in files_of(d))
    common = dict(columns=["tokens"], num_workers=workers)

    def loader_steady(**kw):
        # A new loader per round, timed in steady epochs of one continuous iteration (as
        # the tabular rows): a loader kept across rounds reads its next epoch ahead while
        # the ceiling is timed, which slows the ceiling and times the next epoch from a
        # head start (2-3x the rate of a back-to-back epoch here).
        return lambda: steady_median(lambda: pqloader.Loader(str(d), num_epochs=None, **common, **kw))

    r = paired(max(5, repeats), lambda: timed(lambda: pool_decode(d, ["tokens"], values_offsets), 1),
               {"loader": loader_steady(batch_size=s["batch"],
                                        transforms={"tokens": [T.PadOrTruncate(s["max_len"])]})})
    rate = rows / r["loader"][0]
    table.add("tokens PadOrTruncate(1024)", rate, "seq/s", rate / r["loader"][1], 0.8,
              "values+offsets, pyarrow pool, paired rounds")
    # The language-model layouts, shuffled, against pyarrow's read_table of the same column
    # (all cores: the values + offsets decode) in paired rounds: each round times one
    # read_table, then steady epochs of a new loader (its start-up, and packing's lengths
    # pass, left out; closed before the next read_table, so nothing runs ahead meanwhile);
    # the row is the median of the per-round ratios, so load that comes and goes hits both
    # sides alike.
    layouts = [
        ("tokens ragged, shuffled", "seq/s", 0.8, dict(batch_size=s["batch"], lists={"tokens": "ragged"})),
        ("tokens Pad(multiple_of=8), shuffled", "seq/s", None,
         dict(batch_size=s["batch"], lists={"tokens": pqloader.Pad(multiple_of=8)})),
        # 32 blocks of 1024 tokens a batch (about the tokens of 256 sequences), in tokens/s.
        ("tokens Pack(seq_len=1024), shuffled", "tok/s", 0.6,
         dict(batch_size=32, pack=pqloader.Pack("tokens", s["max_len"]))),
    ]
    for what, unit, goal, kw in layouts:
        r = paired(max(5, repeats), lambda: timed(lambda: pq.read_table(d, columns=["tokens"]), 1),
                   {"loader": loader_steady(shuffle=True, seed=1, **kw)})
        rate = (tokens if unit == "tok/s" else rows) / r["loader"][0]
        table.add(what, rate, unit, rate / r["loader"][1], goal, "read_table all cores, paired rounds")


def run_images(table: Table, repeats: int, workers: int) -> None:
    d = images_data()
    s = SPEC["images"]
    rows = s["rows"] // s["files"] * s["files"]
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    ops = [T.DecodeImage(), T.Resize(256), T.CenterCrop(224), T.Normalize(mean, std), T.ToCHW()]
    blobs = jpeg_blobs(d)
    # A new loader per round, closed before the next ceiling (see run_tokens).
    r = paired(max(3, repeats), lambda: jpeg_decode_seconds(blobs),
               {"loader": lambda: steady_median(lambda: pqloader.Loader(
                   str(d), columns=["image", "label"], batch_size=s["batch"], num_workers=workers,
                   transforms={"image": ops}, num_epochs=None), epochs=2, warmup=2)})
    rate = rows / r["loader"][0]
    table.add("images eval pipeline", rate, "img/s", rate / r["loader"][1], 0.7,
              "libjpeg-turbo decode only, paired rounds")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=ONLY)
    ap.add_argument("--repeats", type=int, default=REPEATS)
    ap.add_argument("--workers", type=int, default=CORES)
    ap.add_argument("--markdown", help="also write the table as Markdown to this file")
    ap.add_argument("--write-doc", action="store_true",
                    help=f"also write the table, with how it was measured, to {DOC.relative_to(ROOT)}")
    a = ap.parse_args()
    tmp = DATA / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    print(f"bench-quick: {CORES} cores, num_workers={a.workers}, best of {a.repeats} "
          f"(goal rows: medians of paired rounds)", flush=True)
    table = Table()
    for part in a.only.split(","):
        if part == "tabular":
            run_tabular(table, a.repeats, a.workers)
        elif part == "cache":
            run_cache(table, a.repeats, a.workers, tmp)
        elif part == "tokens":
            run_tokens(table, a.repeats, a.workers)
        elif part == "images":
            run_images(table, a.repeats, a.workers)
        else:
            sys.exit(f"unknown part {part!r}")
    print(f"bench-quick: {time.perf_counter() - t0:.0f} s", flush=True)
    if a.markdown:
        Path(a.markdown).write_text(table.markdown() + "\n")
    if a.write_doc:
        write_doc(table, a)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def write_doc(table: Table, a: argparse.Namespace) -> None:
    """The table of this run, with its command and machine (no paths of this machine: the
    command is rebuilt from the options that change what is measured)."""
    args = [f"--only {a.only}"] if a.only != ONLY else []
    args += [f"--repeats {a.repeats}"] if a.repeats != REPEATS else []
    args += [f"--workers {a.workers}"] if a.workers != CORES else []
    command = " ".join(["bench/quick.py", *args, "--write-doc"])
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    DOC.write_text(
        "# The quick benchmark: pqloader against its ceilings\n\n"
        f"`.venv/bin/python {command}` ({when}, {CORES} cores, {cpu_model()}, "
        f"Python {platform.python_version()}, num_workers={a.workers}). Every ratio is measured "
        "in this one run against a ceiling timed side by side on the same files and cores; a "
        "paired row's ratio is the median of its per-round ratios (not its rate over the "
        "ceiling's median rate). Goals, where a row has one: issue 11's (tabular, cache, tokens "
        "PadOrTruncate, images) and issue 16's (the language-model layouts). Rows, ceilings and "
        "method: `bench/quick.py`'s docstring and `docs/performance.md` (\"The quick "
        "benchmark\"). On a shared VM a ratio moves by ±0.05-0.1 from run to run; the README "
        "gives the spread over many runs.\n\n"
        + table.markdown() + "\n")
    print(f"bench-quick: wrote {DOC.relative_to(ROOT)}", flush=True)


if __name__ == "__main__":
    main()
