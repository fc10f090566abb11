"""Cache hit rates of cache_policy keep, lru and plan on reshuffled epochs.

    .venv/bin/python bench/cache_policies.py [--row-groups 200] [--epochs 5] [--write-doc]

Generates a Parquet dataset (one file, row groups of uneven sizes, so cache entries
differ in size) and reads it with a real Loader for several shuffled epochs, with a
cache of 25, 50 and 75 % of the bytes its entries take (one shard, so that the limit is
one budget, as in the offline computation), under each policy. The hit rate is
``cache_hits / (cache_hits + cache_misses)`` from ``loader.stats()``.

Against it, computed in Python over the same sequence of reads (the plan's units,
replayed with ``pqloader._core._epoch_unit_splits``) and the entries' real sizes (read
from their headers, docs/cache_format.md):

- **offline Belady**: evict the entry read furthest in the future while it is read later
  than the newcomer, else leave the newcomer out, with knowledge of every epoch;
- **bound**: an upper bound on any policy. Every row group is read once per epoch, so an
  entry hit in epoch e stayed cached since its read in epoch e - 1: the entries hit in
  an epoch all fit in the cache at its start. Hits per epoch are at most the number of
  smallest entries that fit, and the first epoch has none.

Scenario ``foreign``: the cache starts full of entries another loader left (other
columns: keys this loader never reads), as a shared cache directory often is.

``--write-doc`` replaces the section between the markers in docs/performance.md.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import struct
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import pqloader
from pqloader import _core

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "performance.md"
BEGIN, END = "<!-- cache_policies:begin -->", "<!-- cache_policies:end -->"
POLICIES = ("keep", "lru", "plan")


def make_data(path: Path, row_groups: int, seed: int) -> list[int]:
    """One file of `row_groups` row groups of 600-1400 rows; returns their row counts."""
    rng = np.random.default_rng(seed)
    sizes = [int(n) for n in rng.integers(600, 1401, row_groups)]
    n = sum(sizes)
    table = pa.table({
        "id": np.arange(n, dtype=np.int64),
        "x": pa.FixedSizeListArray.from_arrays(
            pa.array(rng.standard_normal(n * 16).astype(np.float32)), 16),
    })
    with pq.ParquetWriter(path, table.schema) as w:
        start = 0
        for s in sizes:
            w.write_table(table.slice(start, s))
            start += s
    return sizes


def entry_row_group(path: Path) -> int:
    """The row group an entry file holds, from its header's source identity."""
    head = path.read_bytes()[:64 + 16384]
    assert head[:8] == b"PQLCACHE", path
    (version,) = struct.unpack_from("<I", head, 8)
    assert version >= 3, f"{path}: format {version} has no source identity"
    (length,) = struct.unpack_from("<q", head, 56)
    text = head[64:64 + length].decode("utf-8", "surrogateescape")
    return int(re.search(r"^row_group (\d+)$", text, re.M).group(1))


SHARDS = 1  # --shards


def loader(data: str, cache_dir: Path, epochs: int, seed: int, **kw) -> pqloader.Loader:
    return pqloader.Loader(data, batch_size=256, shuffle=True, seed=seed, num_epochs=epochs,
                           cache_dir=str(cache_dir), cache_shards=SHARDS, **kw)


def entry_sizes(data: str, cache_dir: Path, seed: int) -> dict[int, int]:
    """Bytes of each row group's cache entry (split index = row group: one file)."""
    for _ in loader(data, cache_dir, 1, seed):
        pass
    return {entry_row_group(p): p.stat().st_size for p in cache_dir.glob("shard-*/*.pqc")}


def reads(split_rows: list[int], epochs: int, seed: int) -> list[int]:
    """The splits the loader reads, in order, over `epochs` epochs (rank 0 of 1)."""
    out = []
    for e in range(epochs):
        out += _core._epoch_unit_splits(split_rows, 256, True, seed, 4, 0, 1, e)
    return out


def offline_belady(sequence: list[int], sizes: dict[int, int], capacity: int) -> int:
    """Hits of Belady's rule with bypass, knowing every future read."""
    next_at = [0] * len(sequence)
    last: dict[int, float] = {}
    for t in range(len(sequence) - 1, -1, -1):
        next_at[t] = last.get(sequence[t], float("inf"))
        last[sequence[t]] = t
    held: dict[int, float] = {}  # split -> its next read
    used = hits = 0
    for t, s in enumerate(sequence):
        if s in held:
            hits += 1
            held[s] = next_at[t]
            continue
        need = sizes[s]
        if used + need > capacity:
            victims, freed = [], 0
            for v in sorted(held, key=lambda k: -held[k]):
                if used - freed + need <= capacity or held[v] <= next_at[t]:
                    break
                victims.append(v)
                freed += sizes[v]
            if used - freed + need > capacity:
                continue  # the newcomer is read later than what it would displace
            for v in victims:
                del held[v]
            used -= freed
        held[s] = next_at[t]
        used += need
    return hits


def bound(sizes: dict[int, int], capacity: int, epochs: int) -> int:
    """Most hits any policy can make: the smallest entries that fit, once per later epoch."""
    fit = used = 0
    for size in sorted(sizes.values()):
        if used + size > capacity:
            break
        used += size
        fit += 1
    return fit * (epochs - 1)


def run(data: str, cache_dir: Path, epochs: int, seed: int, policy: str, limit: int,
        foreign: bool) -> tuple[float, dict]:
    if foreign:  # another loader's entries (other columns) fill the cache first
        for _ in loader(data, cache_dir, 1, seed, columns=["x"], cache_size_limit=limit):
            pass
    t0 = time.perf_counter()
    ld = loader(data, cache_dir, epochs, seed, cache_policy=policy, cache_size_limit=limit)
    for _ in ld:
        pass
    return time.perf_counter() - t0, ld.stats()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--row-groups", type=int, default=200)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--fractions", default="0.25,0.5,0.75")
    p.add_argument("--scenarios", default="cold,foreign")
    p.add_argument("--shards", type=int, default=1,
                   help="cache_shards (each gets limit / shards; the offline columns assume one)")
    p.add_argument("--write-doc", action="store_true", help="update docs/performance.md")
    args = p.parse_args()
    global SHARDS
    SHARDS = args.shards
    warnings.simplefilter("ignore", RuntimeWarning)  # full caches say so, by design
    fractions = [float(f) for f in args.fractions.split(",")]
    with tempfile.TemporaryDirectory(prefix="pql-cache-policies-") as tmp:
        tmp = Path(tmp)
        data = str(tmp / "data.parquet")
        split_rows = make_data(Path(data), args.row_groups, args.seed)
        sizes = entry_sizes(data, tmp / "probe", args.seed)
        assert len(sizes) == args.row_groups
        total = sum(sizes.values())
        sequence = reads(split_rows, args.epochs, args.seed)
        rows = []
        failures = []
        for scenario in args.scenarios.split(","):
            for f in fractions:
                limit = int(total * f)
                best = offline_belady(sequence, sizes, limit) / len(sequence)
                top = bound(sizes, limit, args.epochs) / len(sequence)
                rates = {}
                for policy in POLICIES:
                    cache_dir = tmp / f"{scenario}-{policy}-{f}"
                    seconds, s = run(data, cache_dir, args.epochs, args.seed, policy, limit,
                                     scenario == "foreign")
                    rates[policy] = s["cache_hits"] / (s["cache_hits"] + s["cache_misses"])
                    print(f"{scenario:8s} {f:4.0%} {policy:4s} hit rate {rates[policy]:.3f} "
                          f"(hits {s['cache_hits']}, misses {s['cache_misses']}, evictions "
                          f"{s['cache_evictions']}, refused {s['cache_skipped_full']}) "
                          f"{seconds:.1f} s", flush=True)
                print(f"{scenario:8s} {f:4.0%} offline Belady {best:.3f}, bound {top:.3f}",
                      flush=True)
                rows.append((scenario, f, rates, best, top))
                if rates["plan"] < rates["lru"]:
                    failures.append(f"{scenario} {f:.0%}: plan < lru")
                if rates["plan"] < 0.95 * best:
                    failures.append(f"{scenario} {f:.0%}: plan more than 5 % under offline Belady")
    table = ["| scenario | cache size | keep | lru | plan | offline Belady | bound | plan / Belady |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for scenario, f, rates, best, top in rows:
        table.append(f"| {scenario} | {f:.0%} | {rates['keep']:.1%} | {rates['lru']:.1%} | "
                     f"{rates['plan']:.1%} | {best:.1%} | {top:.1%} | "
                     f"{rates['plan'] / best:.3f} |")
    command = (f".venv/bin/python bench/cache_policies.py --row-groups {args.row_groups} "
               f"--epochs {args.epochs} --seed {args.seed} --shards {args.shards} --write-doc")
    print("\n" + "\n".join(table))
    print("goals (plan >= lru, plan within 5 % of offline Belady):",
          "met" if not failures else "NOT met: " + "; ".join(failures))
    if args.write_doc:
        body = "\n".join([
            BEGIN,
            f"`{command}` ({datetime.date.today()}, {platform.machine()}, "
            f"{os.cpu_count()} cores): {args.row_groups} row groups of 600-1400 rows "
            f"(entries of {min(sizes.values()) >> 10}-{max(sizes.values()) >> 10} KiB, "
            f"{total / 2**20:.1f} MiB in all), {args.epochs} shuffled epochs, batch 256, "
            f"{args.shards} cache shard(s); hit rate = hits / (hits + misses) from `stats()`.",
            "",
            *table,
            END,
        ])
        text = DOC.read_text()
        if BEGIN in text:
            text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: body, text,
                          flags=re.S)
        else:
            text += "\n" + body + "\n"
        DOC.write_text(text)
        print(f"wrote {DOC.relative_to(REPO)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
