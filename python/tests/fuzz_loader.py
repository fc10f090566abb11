"""Randomised option sets for pqloader.Loader and pqloader.mix, checked against pyarrow.

The library behind test_fuzz.py. A *draw* is one seed: a tiny random dataset (several
files, uneven row groups including 0- and 1-row ones, nulls, hive partitions or
extension types and decimals) and a few random option sets over it. Each option set is
checked for

- determinism: the same batches across num_workers / io_threads / prefetch /
  max_inflight_bytes / readahead / cache settings, two runs, a cold and a warm disk
  cache, a resume from a state saved at a random batch, a loop left and a new one,
  set_epoch, one loop per epoch;
- exactness: each epoch's rows are the dataset's rows after the filter (as pyarrow reads
  and filters them), values equal pyarrow's, batch sizes, len() and num_rows follow
  drop_last and the shard policy, rank shares are disjoint (pad repeats < world_size
  rows) and unshuffled shares are the documented contiguous cuts; an elastic resume on
  another world size or batch size delivers the old ranks' rest;

and, by mode:

- ``base``: Loader options (columns, lists, fill_null, null_mask, strings, stack,
  transforms, filters, shuffling, sharding, epochs);
- ``mix``: pqloader.mix of several filtered Loaders (weights, stop, samples_per_epoch),
  deterministic and resumable; sometimes a row group is corrupted after the reference
  run: the batches before the first batch holding its rows are delivered, then an
  InvalidDataError naming the file and row group;
- ``ext``: pack=, row_groups=, use_summary, schema= (casts, the files' own extension
  types), decimals=, tensor columns with random transforms, output='torch' and the torch
  DataLoader (resume, other worker counts), a file rewritten under a disk cache;
- ``drift``: numeric columns whose type drifts between files (int8..uint64, float32/64,
  decimals of other precisions and scales, all null in a file, absent from one), with or
  without schema= declaring wider types, under random pyarrow filters (literals of other
  types, isin, arithmetic, is_null, &, |, ~) whose columns may not be loaded: rows and
  values as pyarrow's dataset reads them in the loaded (or declared) schema; where pyarrow
  raises, a pqloader error; a drift that does not unify is a SchemaMismatchError.

Every check raises :class:`Fail` with the seed's option set; :func:`run_draw` is the
entry point (``run_draw("ext", 17, tmp_path)`` replays ext seed 17).
"""

from __future__ import annotations

import decimal
import os
import re
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

import pqloader
from pqloader import transforms as T


class Fail(AssertionError):
    """A fuzz check failed; the message says which and with what options."""


def check(cond, msg) -> None:
    if not cond:
        raise Fail(msg() if callable(msg) else msg)


@contextmanager
def describing(what: str):
    """Add `what` (the option set) to any failure or unexpected error raised inside."""
    try:
        yield
    except Fail as e:
        raise Fail(f"{e}\n    {what}") from None
    except Exception as e:
        raise Fail(f"{type(e).__name__}: {e}\n    {what}") from e


# ----------------------------------------------------------------------------- datasets
ROW_GROUP_SIZES = [0, 1, 1, 2, 3, 5, 7, 11, 16]


def write_row_groups(path, table: pa.Table, sizes, **writer_kwargs) -> None:
    """Write `table` with exactly these row groups, empty ones included."""
    with pq.ParquetWriter(str(path), table.schema, **writer_kwargs) as w:
        start = 0
        for n in sizes:
            w.write_table(table.slice(start, n))
            start += n


def draw_layout(rng) -> list[list[int]]:
    """Row-group sizes of 1-4 files of 1-4 row groups each."""
    return [[int(rng.choice(ROW_GROUP_SIZES)) for _ in range(int(rng.integers(1, 5)))]
            for _ in range(int(rng.integers(1, 5)))]


def base_table(ids, null_v: bool, null_s: bool) -> pa.Table:
    return pa.table({
        "id": ids,
        "x": (ids * 0.5 + 0.25).astype(np.float32),
        "y": (ids * -1.5).astype(np.float32),
        "k": (ids * 7919 % 13).astype(np.int32),
        "v": pa.array([int(i % 5) if not (null_v and i % 3 == 1) else None for i in ids], pa.int32()),
        "s": pa.array([f"s{i}" * int(i % 3) if not (null_s and i % 4 == 2) else None for i in ids], pa.string()),
        "lst": pa.array([[int(i), int(i) + 1, int(i) * 2] for i in ids], pa.list_(pa.int16())),
        "vl": pa.array([list(range(int(i), int(i) + int(i * 31 % 5))) for i in ids], pa.list_(pa.int32())),
    })


def ext_table(ids, null_v: bool, dscale: int, salt: int) -> pa.Table:
    """ids, x, k, v, vl (a list; null documents), img (a 2x3 int16 tensor), dec (decimal128(9, dscale));
    `salt` changes every value but id (a rewritten file)."""
    tensor = pa.fixed_shape_tensor(pa.int16(), (2, 3))
    pixels = (np.arange(len(ids) * 6).reshape(len(ids), 2, 3) % 97 + ids[:, None, None] * 6 + salt).astype(np.int16)
    img = (pa.FixedShapeTensorArray.from_numpy_ndarray(pixels) if len(ids) else
           pa.ExtensionArray.from_storage(tensor, pa.array([], pa.list_(pa.int16(), 6))))
    q = decimal.Decimal(1).scaleb(-dscale)
    return pa.table({
        "id": ids,
        "x": (ids * 0.5 + 0.25 + salt).astype(np.float32),
        "k": ((ids * 7919 + salt) % 13).astype(np.int32),
        "v": pa.array([int((i + salt) % 5) if not (null_v and i % 3 == 1) else None for i in ids], pa.int32()),
        "vl": pa.array([list(range(int(i) * 10 + salt, int(i) * 10 + salt + int(i * 31 % 5)))
                        if not (null_v and i % 7 == 3) else None for i in ids], pa.list_(pa.int32())),
        "img": img,
        "dec": pa.array([(decimal.Decimal(int(i) * 37 - 500 + salt) / 7).quantize(q) for i in ids],
                        pa.decimal128(9, dscale)),
    })


class Dataset:
    """Files of consecutive ids (0..N-1 in natural order) under `root`."""

    def __init__(self, root: Path, ext: bool):
        self.root, self.ext = root, ext
        self.paths: list[str] = []      # natural order
        self.layout: list[list[int]] = []
        self.writer_kwargs: dict[str, dict] = {}
        self.hive = self.null_v = self.null_s = False
        self.dscale = 0

    def __repr__(self):
        return f"layout={self.layout} hive={self.hive} dscale={self.dscale}"

    def reference(self, row_groups=None) -> pa.Table:
        """The rows as pyarrow reads them (the hive column p appended), in natural order."""
        tabs = []
        for path in self.paths:
            pf = pq.ParquetFile(path)
            t = pf.read()
            if row_groups and path in row_groups:
                t = pf.read_row_groups(row_groups[path]) if row_groups[path] else t.slice(0, 0)
            if self.hive:
                p = int(Path(path).parent.name.split("=")[1])
                t = t.append_column("p", pa.array([p] * t.num_rows, pa.int64()))
            tabs.append(t)
        return pa.concat_tables(tabs, promote_options="permissive")


def make_base_dataset(rng, root: Path) -> Dataset:
    ds = Dataset(root, ext=False)
    layout = draw_layout(rng)
    ds.null_v, ds.null_s, ds.hive = bool(rng.random() < 0.5), bool(rng.random() < 0.3), bool(rng.random() < 0.3)
    first = 0
    for f, sizes in enumerate(layout):
        ids = np.arange(first, first + sum(sizes), dtype=np.int64)
        first += len(ids)
        t = base_table(ids, ds.null_v, ds.null_s)
        d = root / f"p={f // 2}" if ds.hive else root
        d.mkdir(parents=True, exist_ok=True)
        if rng.random() < 0.3:
            t = t.set_column(t.schema.get_field_index("s"), "s", t["s"].cast(pa.large_string()))
        wkw = {}
        if rng.random() < 0.3:
            wkw["use_dictionary"] = False
        if rng.random() < 0.3:
            wkw["compression"] = str(rng.choice(["none", "zstd"]))
        if rng.random() < 0.2:
            wkw["data_page_size"] = 16  # many pages per column chunk
        path = str(d / f"part-{f:03d}.parquet")
        write_row_groups(path, t, sizes, **wkw)
        ds.paths.append(path)
        ds.writer_kwargs[path] = wkw
    ds.layout = layout
    return ds


def make_ext_dataset(rng, root: Path) -> Dataset:
    ds = Dataset(root, ext=True)
    root.mkdir(parents=True, exist_ok=True)
    plain = bool(rng.random() < 0.5)  # fixed-size encodings: a rewrite keeps the file's size
    layout = draw_layout(rng)
    ds.null_v, ds.dscale = bool(rng.random() < 0.4), int(rng.choice([0, 2, 4]))
    first = 0
    for f, sizes in enumerate(layout):
        ids = np.arange(first, first + sum(sizes), dtype=np.int64)
        first += len(ids)
        wkw = {}
        if plain:
            wkw = dict(use_dictionary=False, compression="none")
        elif rng.random() < 0.3:
            wkw["use_dictionary"] = False
        path = str(root / f"part-{f:03d}.parquet")
        write_row_groups(path, ext_table(ids, ds.null_v, ds.dscale, 0), sizes, **wkw)
        ds.paths.append(path)
        ds.writer_kwargs[path] = wkw
    ds.layout = layout
    return ds


# ----------------------------------------------------------------------------- filters
# (make the Loader's filter, the reference mask of a pyarrow table); the last needs hive.
FILTERS = [
    None,
    (lambda: pc.field("k") < 7, lambda t: pc.less(t["k"], 7)),
    (lambda: pc.field("k").isin([1, 2, 3, 11]), lambda t: pc.is_in(t["k"], pa.array([1, 2, 3, 11], pa.int32()))),
    (lambda: "k >= 5 and id != 3", lambda t: pc.and_(pc.greater_equal(t["k"], 5), pc.not_equal(t["id"], 3))),
    (lambda: pc.field("v") == 2, lambda t: pc.equal(t["v"], 2)),
    (lambda: pc.field("id") > 10000, lambda t: pc.greater(t["id"], 10000)),  # keeps nothing
    (lambda: pqloader.Predicate(["id"], lambda b: pc.equal(pc.bit_wise_and(b["id"], 1), 0)),
     lambda t: pc.equal(pc.bit_wise_and(t["id"], 1), 0)),
    (lambda: "p == 1 or k == 3", lambda t: pc.or_(pc.equal(t["p"], 1), pc.equal(t["k"], 3))),
]


def filtered(table: pa.Table, fi: int) -> pa.Table:
    return table if FILTERS[fi] is None else table.filter(FILTERS[fi][1](table))


# ----------------------------------------------------------------------------- options
def draw_common(rng, batch_sizes, max_epochs, world_sizes) -> dict:
    return {
        "batch_size": int(rng.choice(batch_sizes)),
        "shuffle": bool(rng.random() < 0.6),
        "seed": int(rng.integers(0, 2**63)),
        "shuffle_window": int(rng.choice([1, 2, 3, 5, 64] if max_epochs == 3 else [1, 2, 5, 64])),
        "num_epochs": int(rng.integers(1, max_epochs + 1)),
        "drop_last": bool(rng.random() < 0.3),
        "world_size": int(rng.choice(world_sizes)),
        "shard_policy": str(rng.choice(["drop", "pad"])),
    }


def draw_base(rng, ds: Dataset) -> dict:
    """Loader options; keys starting with '_' are the fuzzer's (the filter's index, the source)."""
    o = draw_common(rng, [1, 2, 3, 4, 5, 7, 8, 16, 100], 3, [1, 1, 2, 3, 4])
    cols = ["id"] + [c for c in ["x", "y", "k", "v", "s", "lst", "vl"] + (["p"] if ds.hive else [])
                     if rng.random() < 0.5]
    if "vl" in cols:
        o["lists"] = {"vl": pqloader.Ragged() if rng.random() < 0.5 else
                      pqloader.Pad(max_length=int(rng.choice([2, 8])), value=-1)}
    rng.shuffle(cols)
    o["columns"] = cols
    if "v" in cols and ds.null_v:
        if rng.random() < 0.5:
            o["fill_null"] = {"v": -7}
        else:
            o["null_mask"] = ["v"]
    if "s" in cols and ds.null_s:
        o.setdefault("fill_null", {})["s"] = "NULL"
    if "s" in cols and rng.random() < 0.4:
        o["strings"] = "bytes"
    if "x" in cols and "y" in cols and rng.random() < 0.4:
        o["stack"] = {"xy": ["x", "y"]}
    elif "x" in cols and rng.random() < 0.3:
        o["transforms"] = {"x": [T.Cast("float64")]}
    o["_filter"] = int(rng.integers(0, len(FILTERS) - (0 if ds.hive else 1)))
    o["_src"] = "dir"
    return o


def draw_row_groups(rng, ds: Dataset) -> dict:
    rg = {}
    for p in ds.paths:
        n = pq.ParquetFile(p).num_row_groups
        if rng.random() < 0.7:
            rg[p] = sorted(set(int(g) for g in rng.integers(0, n, size=int(rng.integers(0, n + 1)))))
    return rg


def draw_ext(rng, ds: Dataset) -> dict:
    o = draw_common(rng, [1, 2, 3, 5, 8, 100], 2, [1, 1, 2, 3])
    cols = ["id"] + [c for c in ["x", "k", "v", "img", "dec"] if rng.random() < 0.5]
    rng.shuffle(cols)
    o["columns"] = cols
    if "v" in cols and ds.null_v:
        o["fill_null"] = {"v": -7}
    if "img" in cols:
        ops = [T.Cast(str(rng.choice(["float32", "int32", "float64"])))]
        if rng.random() < 0.8:
            ops.append(T.RandomHorizontalFlip(p=float(rng.choice([0.5, 1.0, 0.0, 0.3]))))
        o["transforms"] = {"img": ops}
    if "dec" in cols and rng.random() < 0.5:
        o["decimals"] = "int64"
    if rng.random() < 0.4:
        s = ds.dscale
        fields = [pa.field("id", pa.int64())]
        for c in cols:
            if c == "x":
                fields.append(pa.field("x", pa.float64()))
            elif c == "k":
                fields.append(pa.field("k", rng.choice([pa.int64(), pa.float64(), pa.int32(), pa.float32()])))
            elif c == "v":
                fields.append(pa.field("v", rng.choice([pa.int64(), pa.float64()])))
            elif c == "img":  # the tensor's storage, or the files' own extension type
                fields.append(pa.field("img", [pa.list_(pa.list_(pa.int16(), 3), 2),
                                               pa.fixed_shape_tensor(pa.int16(), (2, 3))][int(rng.integers(0, 2))]))
            elif c == "dec":
                fields.append(pa.field("dec", rng.choice([
                    pa.decimal128(9, s), pa.decimal128(18, s),
                    pa.decimal128(12, s if o.get("decimals") == "int64" else s + 2)])))
        o["schema"] = pa.schema(fields)
    o["_filter"] = int(rng.choice([0, 1, 2, 3, 4, 6]))
    if not draw_source(rng, ds, o, 0.35, 0.7):
        o["_src"] = str(rng.choice(["dir", "files"]))
    if rng.random() < 0.3:
        o["output"] = "torch"
    return o


def draw_source(rng, ds: Dataset, o: dict, files_below: float, summary_below: float) -> bool:
    """Maybe read chosen row groups of the files, or a directory through its summary;
    whether either was drawn."""
    x = rng.random()
    if x < files_below:
        o["row_groups"] = draw_row_groups(rng, ds)
        o["_src"] = "files"
    elif x < summary_below:
        o["use_summary"] = [True, "only"][int(rng.integers(0, 2))]
        o["_src"] = "dir"
    return x < summary_below


def draw_pack(rng, ds: Dataset) -> dict:
    o = draw_common(rng, [1, 2, 3, 5], 2, [1, 1, 2, 3])
    o["columns"] = ["vl", "id"] + (["k"] if rng.random() < 0.5 else [])
    seq_len = int(rng.choice([1, 2, 3, 5, 8, 16]))
    eos = [None, -1, 99999][int(rng.integers(0, 3))]
    truncate = bool(rng.random() < 0.3) and not (seq_len == 1 and eos is not None)  # (refused)
    o["pack"] = pqloader.Pack("vl", seq_len=seq_len, eos=eos, truncate=truncate,
                              pad=int(rng.choice([0, -7])))
    o["_filter"] = int(rng.choice([0, 1, 2, 6]))
    o["_src"] = "dir"
    if rng.random() < 0.3:
        o["output"] = "torch"
    draw_source(rng, ds, o, 0.25, 0.5)
    if rng.random() < 0.3:
        o["schema"] = pa.schema([pa.field("vl", pa.list_(pa.int64())), pa.field("id", pa.int64()),
                                 pa.field("k", pa.int64())])
    if rng.random() < 0.2:
        o["fill_null"] = {"vl": 0}
    return o


def perf_options(rng, cache_root) -> dict:
    """Options that must not change the batches."""
    p = {"num_workers": int(rng.choice([1, 2, 4])), "io_threads": int(rng.choice([1, 2, 8]))}
    if rng.random() < 0.5:
        p["prefetch_batches"] = int(rng.choice([1, 2, 5]))
    if rng.random() < 0.4:
        p["max_inflight_bytes"] = int(rng.choice([1, 100, 4096, 1 << 20]))
    if rng.random() < 0.3:
        p["readahead"] = int(rng.choice([1, 3]))
    c = rng.random()
    if c < 0.3:
        p["cache_dir"] = ":memory:"
    elif c < 0.6:
        p["cache_dir"] = str(cache_root)
    if "cache_dir" in p and rng.random() < 0.5:
        p["cache_policy"] = str(rng.choice(["keep", "lru", "plan"]))
        p["cache_size_limit"] = int(rng.choice([1, 2000, 20000, 1 << 20]))
        p["cache_shards"] = int(rng.choice([1, 2, 8]))
    if rng.random() < 0.2:
        p["_debug_max_delay_us"] = int(rng.choice([50, 500]))
    return p


REFERENCE_PERF = {"num_workers": 1, "io_threads": 1}


def shown(o: dict) -> dict:
    return {k: v for k, v in o.items()}


# ----------------------------------------------------------------------------- running
def open_loader(ds: Dataset, o: dict, p: dict, rank: int) -> pqloader.Loader:
    kw = {k: v for k, v in o.items() if not k.startswith("_")}
    kw.update(p)
    if "_expr" in o:  # drift: a pyarrow expression drawn for this option set
        kw["filter"] = o["_expr"]
    else:
        kw["filter"] = None if FILTERS[o["_filter"]] is None else FILTERS[o["_filter"]][0]()
    return pqloader.Loader(ds.paths if o.get("_src") == "files" else str(ds.root), rank=rank, **kw)


def canon(batch: dict) -> dict:
    """A batch as comparable data: arrays (numpy or torch) as (dtype, shape, bytes)."""
    out = {}
    for k, v in batch.items():
        if hasattr(v, "numpy") and not isinstance(v, np.ndarray):  # torch
            v = v.numpy()
        out[k] = (str(v.dtype), v.shape, v.tobytes()) if isinstance(v, np.ndarray) else ("list", repr(v))
    return out


def arr(b: dict, k: str) -> np.ndarray:
    dt, shape, raw = b[k]
    return np.frombuffer(raw, dtype=dt).reshape(shape)


def ids(batches) -> list[int]:
    return [int(i) for b in batches for i in arr(b, "id")]


def run(ds, o, p, rank, epochs=None):
    """All batches (canonical), len() and num_rows; `epochs` gets each batch's epoch."""
    with open_loader(ds, o, p, rank) as L:
        out = []
        for b in L:
            out.append(canon(b))
            if epochs is not None:
                epochs.append(L.epoch)
        return out, len(L), L.num_rows


def first_diff(a, b) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"batch {i} differs in {sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))}"
    return f"lengths {len(a)} vs {len(b)}"


# ----------------------------------------------------------------------------- checks
def check_determinism(rng, ds, o, rank, bs, cache, tag="") -> None:
    """Other thread/prefetch/cache settings, a warm cache and a resume give `bs`."""
    for _ in range(2):
        p = perf_options(rng, cache)
        bs2 = run(ds, o, p, rank)[0]
        check(bs2 == bs, lambda: f"{tag}rank {rank}: run with {p} differs from the reference: {first_diff(bs, bs2)}")
        if p.get("cache_dir") not in (None, ":memory:"):
            bs3 = run(ds, o, p, rank)[0]
            check(bs3 == bs, lambda: f"{tag}rank {rank}: warm cache run {p} differs: {first_diff(bs, bs3)}")
    if bs:
        cut = int(rng.integers(0, len(bs) + 1))
        p, p2 = perf_options(rng, cache), perf_options(rng, cache)
        with open_loader(ds, o, p, rank) as L:
            it = iter(L)
            head = [canon(next(it)) for _ in range(cut)]
            st = L.state_dict()
            del it
        with open_loader(ds, o, p2, rank) as L2:
            L2.load_state_dict(st)
            if cut % 2 and st["epoch"] == 0:
                # (the resume loop's set_epoch of the loaded epoch keeps the position;
                # decided without a draw: the later draws stay those of earlier runs)
                L2.set_epoch(0)
            tail = [canon(b) for b in L2]
        check(head + tail == bs, lambda: f"{tag}rank {rank}: resume at batch {cut} ({p} -> {p2}) differs: "
                                         f"{first_diff(bs, head + tail)} ({len(head)}+{len(tail)}, want {len(bs)})")


def check_loops(rng, ds, o, per_rank, nb, cache) -> None:
    """A loop left at a batch and the next loop; one loop per epoch; set_epoch."""
    W, E = o["world_size"], o["num_epochs"]
    r = int(rng.integers(0, W))
    bs = per_rank[r]
    if bs:
        cut = int(rng.integers(0, len(bs)))
        with open_loader(ds, o, perf_options(rng, cache), r) as L:
            head = []
            for b in L:
                head.append(canon(b))
                if len(head) == cut:
                    break
            if cut == 0:
                head = []
                L.set_epoch(0)
            rest = []
            for b in L:
                rest.append(canon(b))
                if len(head) + len(rest) == len(bs):
                    break
            check(head + rest == bs, lambda: f"rank {r}: a loop left at batch {cut} and a next loop differ: "
                                             f"{first_diff(bs, head + rest)}")
    r = int(rng.integers(0, W))
    bs = per_rank[r]
    with open_loader(ds, dict(o, num_epochs=1), perf_options(rng, cache), r) as L:
        loops = []
        for _ in range(E):
            loops += [canon(b) for b in L]
        check(loops == bs, lambda: f"rank {r}: {E} loops of num_epochs=1 differ from num_epochs={E}: "
                                   f"{first_diff(bs, loops)}")
        e = int(rng.integers(0, E))
        L.set_epoch(e)
        got = [canon(b) for b in L]
        want = bs[e * nb:(e + 1) * nb]
        check(got == want, lambda: f"rank {r}: set_epoch({e}) differs: {first_diff(want, got)}")


def check_elastic(rng, ds, o, per_rank, nb, kept_ids, cache) -> None:
    """All W ranks handed out k batches of epoch e; the merged state resumed on W2 ranks
    with batch size B2 delivers the old ranks' rest (pad: at most W2-1 repeats)."""
    W, B = o["world_size"], o["batch_size"]
    e = int(rng.integers(0, o["num_epochs"]))
    k = int(rng.integers(0, nb + 1))
    W2 = int(rng.choice([1, 2, 3, 4]))
    B2 = int(rng.choice([B, 1, 3, 5]))
    where = f"elastic {W}->{W2} (B {B}->{B2}) at epoch {e} batch {k}"
    states = []
    for r in range(W):
        with open_loader(ds, o, dict(num_workers=2), r) as L:
            it = iter(L)
            for _ in range(e * nb + k):
                next(it)
            states.append(L.state_dict())
            del it
    merged = pqloader.merge_states(states) if W > 1 else states[0]
    old_rest = [] if not (k == 0 and e > 0) else kept_ids  # after an epoch: a whole epoch of the new world
    if not old_rest:
        for r in range(W):
            old_rest += ids(per_rank[r][e * nb + k:(e + 1) * nb])
    new_rest, counts = [], []
    for r2 in range(W2):
        with open_loader(ds, dict(o, world_size=W2, batch_size=B2), perf_options(rng, cache), r2) as L:
            L.load_state_dict(merged)
            got = []
            for b in L:
                if L.epoch != e:
                    break
                got.append(canon(b))
            counts.append(len(got))
            new_rest += ids(got)
    check(len(set(counts)) <= 1, f"{where}: ranks got different batch counts {counts}")
    co, cn = Counter(old_rest), Counter(new_rest)
    extra = cn - co
    if o["shard_policy"] == "pad":
        lost = co - cn
        check(not lost or o["drop_last"] or k == 0 and e > 0,
              lambda: f"{where}: rows of the old rest missing: {sorted(lost.elements())[:10]}")
        nextra = sum(extra.values())
        check(nextra <= W2 - 1 + (W2 - 1 if k == 0 and e > 0 else 0) or not old_rest,
              f"{where}: {nextra} repeats")
        extra = Counter({i: c for i, c in extra.items() if i not in co}) if not (k == 0 and e > 0) else Counter()
    check(not extra, lambda: f"{where}: rows not in the old ranks' rest: {sorted(extra.elements())[:10]}")
    missing = 0 if o["shard_policy"] == "pad" else sum((co - cn).values())
    allowed = (W2 - 1) + (W2 * (B2 - 1) if o["drop_last"] else 0)
    check(missing <= allowed, f"{where}: {missing} rows of the old rest missing (allowed {allowed}); "
                              f"old rest {len(old_rest)}, new {len(new_rest)}")


def check_base_values(b, by_id, o) -> None:
    """Every column of batch `b` against pyarrow's rows (`by_id`)."""
    bid = arr(b, "id")
    n = len(bid)
    for col in o["columns"]:
        if col == "id":
            continue
        if col == "vl":
            want_rows = [by_id[int(i)]["vl"] for i in bid]
            if isinstance(o["lists"]["vl"], pqloader.Ragged):
                vals, offs = arr(b, "vl"), arr(b, "vl_offsets")
                check(len(offs) == n + 1, f"vl_offsets has {len(offs)} entries for {n} rows")
                got_rows = [list(map(int, vals[offs[j]:offs[j + 1]])) for j in range(n)]
            else:
                m = o["lists"]["vl"].max_length
                a, lens = arr(b, "vl"), arr(b, "vl_length")
                longest = min(max([len(w) for w in want_rows], default=0), m)
                check(a.shape == (n, longest), f"vl padded shape {a.shape}, want {(n, longest)}")
                got_rows = []
                for j in range(n):
                    row = list(map(int, a[j]))
                    want_len = min(len(want_rows[j]), m)
                    check(int(lens[j]) == want_len, f"vl_length {lens[j]} want {want_len}")
                    check(row[want_len:] == [-1] * (longest - want_len), f"vl padding {row}")
                    got_rows.append(row[:want_len])
                want_rows = [w[:m] for w in want_rows]
            check(got_rows == want_rows, f"vl rows {got_rows} want {want_rows}")
            continue
        stacked = "stack" in o and col in ("x", "y")
        if stacked:
            got = arr(b, "xy")[:, 0 if col == "x" else 1]
        elif col == "s":
            got = eval(b["s"][1])  # a list's repr
        else:
            got = arr(b, col)
        for j, i in enumerate(bid):
            want, g = by_id[int(i)][col], got[j]
            if col == "v":
                if "null_mask" in o:
                    valid = arr(b, "v_valid")[j]
                    check(bool(valid) == (want is not None), f"v_valid of id {i}: {valid}")
                if want is None:
                    want = o.get("fill_null", {}).get("v", 0)
                check(int(g) == want, f"v of id {i}: {g}, want {want}")
            elif col == "s":
                want = "NULL" if want is None else want
                want = want.encode() if o.get("strings") == "bytes" else want
                check(g == want, f"s of id {i}: {g!r}, want {want!r}")
            elif col == "lst":
                check(list(map(int, g)) == want, f"lst of id {i}: {g}, want {want}")
            else:
                cast = "transforms" in o and col == "x" and not stacked
                check(float(g) == float(want) and (not cast or str(got.dtype) == "float64"),
                      f"{col} of id {i}: {g} ({got.dtype}), want {want}")


def check_rows(o, per_rank, nb, kept_ids, tag="") -> None:
    """Each epoch's rows per rank and over all ranks (shares, drop/pad, contiguous cuts)."""
    W, B, E = o["world_size"], o["batch_size"], o["num_epochs"]
    N = len(kept_ids)
    share = N // W if o["shard_policy"] == "drop" else -(-N // W)
    q, rem = divmod(N, W)
    bounds = [0]
    for r in range(W):
        bounds.append(bounds[-1] + q + (1 if r < rem else 0))
    for e in range(E):
        allrows = []
        for r in range(W):
            eb = per_rank[r][e * nb:(e + 1) * nb]
            for i, b in enumerate(eb):
                n = len(arr(b, "id"))
                check(n == B or (i == len(eb) - 1 and not o["drop_last"]),
                      f"{tag}rank {r} epoch {e} batch {i}: {n} rows, want {B}")
            got = ids(eb)
            if not o["drop_last"]:
                check(len(got) == share, f"{tag}rank {r} epoch {e}: {len(got)} rows, want {share}")
            allrows += got
            if not o["shuffle"]:
                mine = kept_ids[bounds[r]:bounds[r + 1]]
                if o["shard_policy"] == "drop":
                    mine = mine[:share]
                elif len(mine) < share:  # pad borrows a row
                    mine = mine + ([mine[0]] if mine else [kept_ids[r % N]]) * (share - len(mine))
                if o["drop_last"]:
                    mine = mine[:len(got)]
                check(got == mine, f"{tag}rank {r} epoch {e}: unshuffled ids {got[:20]}..., want {mine[:20]}...")
        s, kept = set(allrows), set(kept_ids)
        check(s <= kept, lambda: f"{tag}epoch {e}: ids not in the filtered data: {sorted(s - kept)[:10]}")
        if o["shard_policy"] == "drop" or N % W == 0:
            check(len(allrows) == len(s), f"{tag}epoch {e}: duplicated ids across ranks")
        if not o["drop_last"]:
            missing = kept - s
            want_missing = N - W * share if o["shard_policy"] == "drop" else 0
            check(len(missing) == want_missing,
                  lambda: f"{tag}epoch {e}: ids missing {sorted(missing)[:10]}, want {want_missing} missing")


def base_set(rng, ds: Dataset, o: dict, cache) -> None:
    W, B, E = o["world_size"], o["batch_size"], o["num_epochs"]
    kept = filtered(ds.reference(), o["_filter"])
    N = kept.num_rows
    kept_ids = kept["id"].to_pylist()
    by_id = {r["id"]: r for r in kept.to_pylist()}
    per_rank, lens = {}, []
    share = N // W if o["shard_policy"] == "drop" else -(-N // W)
    for r in range(W):
        bs, nb, nrows = run(ds, o, REFERENCE_PERF, r)
        per_rank[r] = bs
        lens.append(nb)
        check_determinism(rng, ds, o, r, bs, cache)
        check(nrows == share, f"rank {r}: num_rows {nrows}, want {share} (N={N}, W={W})")
    nb = lens[0]
    check(len(set(lens)) == 1, f"ranks have different len(): {lens}")
    want_batches = share // B if o["drop_last"] else -(-share // B)
    check(nb == want_batches, f"len() {nb}, want {want_batches} (share {share}, B {B}, drop_last {o['drop_last']})")
    for r in range(W):
        check(len(per_rank[r]) == nb * E, f"rank {r}: {len(per_rank[r])} batches for {E} epochs, want {nb * E}")
        for b in per_rank[r]:
            check_base_values(b, by_id, o)
    check_rows(o, per_rank, nb, kept_ids)
    check_loops(rng, ds, o, per_rank, nb, cache)
    if nb > 0:
        check_elastic(rng, ds, o, per_rank, nb, kept_ids, cache)


# ----------------------------------------------------------------------------- ext
def ext_set(rng, ds: Dataset, o: dict, cache, flips: dict) -> None:
    W, E = o["world_size"], o["num_epochs"]
    if "use_summary" in o:
        pqloader.write_index(str(ds.root))
    kept = filtered(ds.reference(o.get("row_groups")), o["_filter"])
    N = kept.num_rows
    kept_ids = kept["id"].to_pylist()
    pos = {i: j for j, i in enumerate(kept_ids)}
    dcol = kept["dec"]
    sch = o.get("schema")
    if sch is not None and "dec" in sch.names:
        dcol = pc.cast(dcol, sch.field("dec").type)
    decf = pc.cast(dcol, pa.float64()).to_numpy(zero_copy_only=False)
    storage = pa.chunked_array([c.storage for c in kept["img"].chunks], pa.list_(pa.int16(), 6))
    imgs = np.asarray(pc.list_flatten(storage).to_numpy(zero_copy_only=False)).reshape(N, 2, 3)
    by_id = {r["id"]: r for r in kept.select(["id", "x", "k", "v"]).to_pylist()}
    per_rank, lens = {}, []
    for r in range(W):
        bs, nb, _ = run(ds, o, REFERENCE_PERF, r)
        per_rank[r] = bs
        lens.append(nb)
        check_determinism(rng, ds, o, r, bs, cache)
        check(len(bs) == nb * E, f"rank {r}: {len(bs)} batches, len() {nb} x {E} epochs")
    check(len(set(lens)) == 1, f"ranks have different len(): {lens}")
    nb = lens[0]
    for e in range(E):
        for r in range(W):
            for b in per_rank[r][e * nb:(e + 1) * nb]:
                bid = arr(b, "id")
                for c in o["columns"]:
                    g = arr(b, c)
                    if c in ("x", "k", "v"):
                        want_dt = (np.dtype(sch.field(c).type.to_pandas_dtype()) if sch is not None else
                                   {"x": np.float32, "k": np.int32, "v": np.int32}[c])
                        check(g.dtype == want_dt, f"{c}: dtype {g.dtype}, want {want_dt}")
                        for j, i in enumerate(bid):
                            w = by_id[int(i)][c]
                            w = o["fill_null"]["v"] if w is None else w
                            check(float(g[j]) == float(w), f"{c} of id {i}: {g[j]}, want {w}")
                    elif c == "dec":
                        for j, i in enumerate(bid):
                            if o.get("decimals") == "int64":
                                w = int(dcol[pos[int(i)]].as_py().scaleb(dcol.type.scale))
                                check(g.dtype == np.int64 and int(g[j]) == w,
                                      f"dec int64 of id {i}: {g[j]} ({g.dtype}), want {w}")
                            else:
                                w = decf[pos[int(i)]]
                                check(g.dtype == np.float64 and g[j].tobytes() == np.float64(w).tobytes(),
                                      f"dec of id {i}: {g[j]!r}, want {w!r}")
                    elif c == "img":
                        check_img(g, bid, imgs, pos, o, e, flips)
    check_rows(o, per_rank, nb, kept_ids)


def check_img(g, bid, imgs, pos, o, epoch, flips) -> None:
    """The tensor cast as asked, flipped or not; RandomHorizontalFlip's p=0 / p=1 hold, and a
    row's flip depends only on (seed, row, epoch): the same in every option set that keeps it."""
    ops = o["transforms"]["img"]
    check(g.shape[1:] == (2, 3), f"img shape {g.shape}")
    for j, i in enumerate(bid):
        w = imgs[pos[int(i)]].astype(g.dtype)
        fl, same = np.array_equal(g[j], w[:, ::-1]), np.array_equal(g[j], w)
        check(fl or same, f"img of id {i}: {g[j].tolist()}, want {w.tolist()} or flipped")
        if len(ops) > 1 and not np.array_equal(w, w[:, ::-1]):
            pflip = ops[1]._spec()[1]["p"]
            check(not (pflip == 0.0 and fl and not same), f"img of id {i} flipped at p=0")
            check(not (pflip == 1.0 and same and not fl), f"img of id {i} not flipped at p=1")
            key = (o["seed"], repr(o.get("row_groups")), o["_filter"], pflip, epoch, int(i))
            prev = flips.setdefault(key, fl)
            check(prev == fl, f"img of id {i} epoch {epoch}: flip {fl} here, {prev} in another option set "
                              f"(same seed, data, filter)")


def pack_docs(bs, epochs, pk, e, tag) -> list:
    """Epoch e's documents [id, tokens] in order, read back from the packed blocks."""
    docs = []
    for b in [b for b, x in zip(bs, epochs) if x == e]:
        tok, posi, did, lm, bid = (arr(b, "vl"), arr(b, "position_ids"), arr(b, "document_ids"),
                                   arr(b, "loss_mask"), arr(b, "id"))
        check(tok.shape[1:] == (pk.seq_len,), f"{tag}block shape {tok.shape}")
        for blk in range(tok.shape[0]):
            prev = None
            for t in range(pk.seq_len):
                if not lm[blk, t]:
                    check(did[blk, t] == -1 and tok[blk, t] == pk.pad,
                          f"{tag}padding {tok[blk].tolist()} {did[blk].tolist()}")
                    prev = -1
                    continue
                check(prev != -1, f"{tag}token after padding in block {tok[blk].tolist()}")
                i = int(bid[blk, t])
                if did[blk, t] != prev:
                    check(prev is None or did[blk, t] == prev + 1, f"{tag}document_ids {did[blk].tolist()}")
                    prev = int(did[blk, t])
                    if posi[blk, t] == 0:
                        docs.append([i, []])
                    else:
                        check(docs and docs[-1][0] == i and len(docs[-1][1]) == posi[blk, t],
                              f"{tag}continued doc id {i} pos {posi[blk, t]}: {docs[-1] if docs else None}")
                check(docs[-1][0] == i and posi[blk, t] == len(docs[-1][1]),
                      f"{tag}position_ids {posi[blk].tolist()} ids {bid[blk].tolist()}")
                docs[-1][1].append(int(tok[blk, t]))
    return docs


def pack_set(rng, ds: Dataset, o: dict, cache) -> None:
    W, E, pk = o["world_size"], o["num_epochs"], o["pack"]
    if "use_summary" in o:
        pqloader.write_index(str(ds.root))
    kept = filtered(ds.reference(o.get("row_groups")), o["_filter"])
    if kept["vl"].null_count > 0 and "vl" not in (o.get("fill_null") or {}):
        try:
            run(ds, o, dict(num_workers=1), 0)
        except pqloader.InvalidDataError as ex:
            check("vl" in str(ex) and ".parquet" in str(ex), f"pack: the null document error is unclear: {ex}")
            return
        raise Fail("pack: a null document was not refused")
    want = {}
    for i, d in zip(kept["id"].to_pylist(), kept["vl"].to_pylist()):
        d = d or []
        if pk.truncate:
            d = d[:max(0, pk.seq_len - (1 if pk.eos is not None else 0))]
        want[i] = d + ([pk.eos] if pk.eos is not None else [])
    per_rank = {}
    for r in range(W):
        epochs = []
        try:
            bs = run(ds, o, REFERENCE_PERF, r, epochs)[0]
        except pqloader.InvalidDataError as ex:
            if any(m in str(ex) for m in ("no rows", "no document", "no tokens")):
                return
            raise
        per_rank[r] = (bs, epochs)
        check_determinism(rng, ds, o, r, bs, cache, "pack ")
    for e in range(E):
        counts = [per_rank[r][1].count(e) for r in range(W)]
        check(len(set(counts)) == 1, f"pack epoch {e}: ranks' batch counts {counts}")
        alld = []
        for r in range(W):
            docs = pack_docs(*per_rank[r], pk, e, f"pack rank {r} ")
            for n, (i, d) in enumerate(docs):
                check(i in want, f"pack: id {i} not kept")
                if n == len(docs) - 1 and (o["drop_last"] or o["shard_policy"] == "drop"):
                    check(d == want[i][:len(d)], f"pack epoch {e} rank {r}: last doc {i} {d} not a prefix of {want[i]}")
                else:
                    check(d == want[i], f"pack epoch {e} rank {r}: doc {i} tokens {d}, want {want[i]}")
            alld += [i for i, d in docs]
        if o["shard_policy"] == "pad" and not o["drop_last"]:
            nonempty = [i for i, w in want.items() if w]
            check(Counter(alld) == Counter(nonempty),
                  lambda: f"pack epoch {e}: docs {sorted(alld)[:30]} want {sorted(nonempty)[:30]}")
        else:
            check(len(alld) == len(set(alld)), f"pack epoch {e}: duplicated docs")


def torch_set(rng, ds: Dataset, o: dict) -> None:
    """pqloader.torch.DataLoader: two runs agree, num_workers=0 is the Loader, and a resume
    (with the same or another worker count) continues where the state was taken."""
    import pqloader.torch as PT

    o = dict(o, num_epochs=1, _src="dir")
    if "pack" in o:
        o["fill_null"] = {"vl": 0}
    o.pop("row_groups", None)
    o.pop("use_summary", None)
    kept = filtered(ds.reference(), o["_filter"])["id"].to_pylist()

    def dl_run(r, nw, state=None, cut=None):
        L = open_loader(ds, o, dict(num_workers=1), r)
        dl = PT.DataLoader(PT.IterableDataset(L), num_workers=nw)
        if state is not None:
            dl.load_state_dict(state)
        out, st = [], None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # more workers than cores
            for b in dl:
                out.append(canon(b))
                if cut is not None and len(out) == cut:
                    st = dl.state_dict()
                    break
        del dl
        L.close()
        return out, st

    for r in range(o["world_size"]):
        nw = int(rng.choice([0, 2]))
        a = dl_run(r, nw)[0]
        b = dl_run(r, nw)[0]
        check(a == b, f"torch rank {r} num_workers {nw}: two runs differ: {first_diff(a, b)}")
        if nw == 0:
            ref = run(ds, o, dict(num_workers=1), r)[0]
            check(a == ref, f"torch num_workers 0 rank {r}: differs from the Loader: {first_diff(ref, a)}")
        if "pack" in o:
            if a:
                cut = int(rng.integers(1, len(a) + 1))
                head, st = dl_run(r, nw, cut=cut)
                tail = dl_run(r, nw, state=st)[0]
                check(head + tail == a, f"torch pack rank {r} resume at {cut} num_workers {nw}: "
                                        f"{first_diff(a, head + tail)} ({len(head)}+{len(tail)} vs {len(a)})")
            continue
        got_ids = ids(a)
        check(set(got_ids) <= set(kept), "torch: ids not kept")
        if o["shard_policy"] == "drop":
            check(len(got_ids) == len(set(got_ids)), f"torch num_workers {nw}: duplicated ids")
        elif not o["drop_last"] and o["world_size"] == 1:
            check(set(got_ids) == set(kept), lambda: f"torch num_workers {nw}: missing "
                                                     f"{sorted(set(kept) - set(got_ids))[:10]}")
        if a:
            cut = int(rng.integers(1, len(a) + 1))
            head, st = dl_run(r, nw, cut=cut)
            check(head == a[:cut], "torch: the head before a state differs")
            nw2 = nw if rng.random() < 0.6 else int(rng.choice([0, 1, 2, 3]))
            tail = dl_run(r, nw2, state=st)[0]
            if nw2 == nw:
                check(head + tail == a, f"torch rank {r} resume at {cut} num_workers {nw}: "
                                        f"{first_diff(a, head + tail)} ({len(head)}+{len(tail)} vs {len(a)})")
            else:
                hi, ti = set(ids(head)), set(ids(tail))
                check(ti <= set(kept), "torch elastic: ids not kept")
                if o["shard_policy"] == "drop" or len(kept) % max(1, o["world_size"] * max(nw, 1)) == 0:
                    check(not (hi & ti), lambda: f"torch num_workers {nw}->{nw2} at {cut}: rows again: "
                                                 f"{sorted(hi & ti)[:10]}")


def stale_set(rng, ds: Dataset, cache) -> None:
    """A file rewritten (same size, other values, mtime moved) under a disk cache and an index:
    the next run reads the new values (use_summary='only': an error naming the file, or the
    file pruned whole by the index's statistics, as documented)."""
    summ = [False, True, "only"][int(rng.integers(0, 3))]
    fi = int(rng.choice([0, 1, 2, 4]))
    o = dict(columns=["id", "x", "k", "v", "dec"], batch_size=int(rng.choice([2, 5, 100])),
             fill_null={"v": -7}, shuffle=bool(rng.random() < 0.5), seed=3, _filter=fi,
             use_summary=summ, _src="dir")
    f = int(rng.integers(0, len(ds.paths)))
    path, sizes = ds.paths[f], ds.layout[f]
    if rng.random() < 0.8:  # written plain: a rewrite with other values keeps the size
        t0 = pq.read_table(path)
        ds.writer_kwargs[path] = dict(use_dictionary=False, compression="none")
        write_row_groups(path, t0, sizes, **ds.writer_kwargs[path])
    if summ:
        pqloader.write_index(str(ds.root))
    p = dict(cache_dir=str(cache))
    if rng.random() < 0.5:
        p.update(cache_policy="lru", cache_size_limit=1 << 20)
    run(ds, o, p, 0)
    old = pq.read_table(path)
    if old.num_rows == 0:
        return
    st0 = os.stat(path)
    tmp = path + ".tmp"
    write_row_groups(tmp, ext_table(old["id"].to_numpy(), ds.null_v, ds.dscale, 1), sizes, **ds.writer_kwargs[path])
    if os.path.getsize(tmp) != st0.st_size:
        os.remove(tmp)
        return
    os.replace(tmp, path)
    delta = int(rng.choice([1, 1000, 2 * 10**9]))
    os.utime(path, ns=(st0.st_atime_ns, st0.st_mtime_ns + delta))
    where = f"stale (file {os.path.basename(path)}, use_summary {summ}, filter {fi}, {p}, mtime +{delta} ns)"
    fresh = run(ds, dict(o, use_summary=False), {}, 0)[0]
    try:
        after = run(ds, o, p, 0)[0]
    except pqloader.InvalidDataError as ex:
        check(summ == "only", f"{where}: {ex}")
        check(os.path.basename(path) in str(ex), f"{where}: the error does not name the file: {ex}")
        return
    if summ == "only":
        file_ids = set(old["id"].to_pylist())
        others = sorted(i for i in ids(fresh) if i not in file_ids)
        if fi and others == sorted(ids(after)):
            return  # documented: a rewritten file pruned whole by the index's statistics
        raise Fail(f"{where}: read a changed file without an error; values "
                   f"{'new' if after == fresh else 'OLD'}; ids fresh {ids(fresh)} got {ids(after)}")
    check(after == fresh, lambda: f"{where}: served old values: {first_diff(fresh, after)}")
    after2 = run(ds, o, p, 0)[0]
    check(after2 == fresh, lambda: f"{where}: the second run differs: {first_diff(fresh, after2)}")


# ----------------------------------------------------------------------------- mix
def corrupt_row_group(path, group: int) -> None:
    """Rewrite `path` gzip-compressed (same rows and row groups) and break the gzip check
    of the id column's page in row group `group`: reading it must fail."""
    md = pq.ParquetFile(path).metadata
    sizes = [md.row_group(i).num_rows for i in range(md.num_row_groups)]
    write_row_groups(path, pq.read_table(path), sizes, compression="gzip", use_dictionary=False)
    col = pq.ParquetFile(path).metadata.row_group(group).column(0)  # id: one page
    end = col.data_page_offset + col.total_compressed_size
    data = bytearray(Path(path).read_bytes())
    data[end - 8:end - 4] = bytes(v ^ 0xFF for v in data[end - 8:end - 4])  # the gzip trailer's CRC32
    Path(path).write_bytes(bytes(data))


def mix_draw(rng, ds: Dataset, cache) -> None:
    table = ds.reference()
    cols = ["id"] + [c for c in ["x", "k", "lst"] if rng.random() < 0.5]
    srcs = [dict(columns=cols, batch_size=4, shuffle=bool(rng.random() < 0.7), seed=int(rng.integers(0, 2**32)),
                 shuffle_window=int(rng.choice([1, 2, 64])), _filter=int(rng.choice([0, 1, 2, 6])), _src="dir")
            for _ in range(int(rng.integers(1, 4)))]
    weights = [float(rng.choice([0.0, 0.5, 1, 3])) for _ in srcs]
    if sum(weights) == 0:
        weights[0] = 1.0
    W = int(rng.choice([1, 1, 2]))
    mk = dict(batch_size=int(rng.choice([1, 3, 8])), seed=int(rng.integers(0, 2**32)),
              num_epochs=int(rng.integers(1, 3)), drop_last=bool(rng.random() < 0.3))
    stop = rng.random()
    if stop < 0.4:
        mk["stop"] = "first"
    elif stop < 0.7:
        mk["stop"] = "last"
    else:
        mk["samples_per_epoch"] = int(rng.integers(1, 60))
    corrupt = rng.random() < 0.5
    if corrupt:  # every source reads every row in order (no shuffle window reads ahead), one a
        for s in srcs:  # batch: the batch that draws the first bad row is the one that must fail
            s.update(_filter=0, batch_size=1, shuffle=False)
    kept = [set(filtered(table, s["_filter"])["id"].to_pylist()) for s in srcs]

    def make(rank, p):
        return pqloader.mix([open_loader(ds, dict(s, world_size=W), p, rank) for s in srcs], weights, **mk)

    def run_mix(m):
        with m:
            return [canon(b) for b in m]

    with describing(f"mix: {ds} sources={srcs} weights={weights} world_size={W} mix={mk}"):
        refs = []
        for rank in range(W):
            try:
                ref = run_mix(make(rank, REFERENCE_PERF))
            except pqloader.InvalidDataError as ex:
                if "has no rows" in str(ex):
                    return
                raise
            refs.append(ref)
            p = perf_options(rng, cache)
            got = run_mix(make(rank, p))
            check(got == ref, lambda: f"mix rank {rank}: run with {p} differs: {first_diff(ref, got)}")
            for b in ref:
                src = arr(b, "source")
                check(list(src) == sorted(src), f"mix: a batch not grouped by source: {list(src)}")
                for i, s in zip(arr(b, "id"), src):
                    check(int(i) in kept[int(s)], f"mix: id {i} not a row of source {s}")
            if ref:
                cut = int(rng.integers(0, len(ref) + 1))
                m = make(rank, perf_options(rng, cache))
                it = iter(m)
                head = [canon(next(it)) for _ in range(cut)]
                st = m.state_dict()
                del it
                m.close()
                m2 = make(rank, perf_options(rng, cache))
                m2.load_state_dict(st)
                tail = run_mix(m2)
                check(head + tail == ref, lambda: f"mix rank {rank}: resume at {cut} differs: "
                                                  f"{first_diff(ref, head + tail)} ({len(head)}+{len(tail)} vs {len(ref)})")
        if corrupt:
            check_mix_error(rng, ds, make, refs)


def check_mix_error(rng, ds: Dataset, make, refs) -> None:
    """docs/reliability.md: the batches before a failing one are delivered, then the error,
    naming the file and row group."""
    groups = [(f, g) for f, sizes in enumerate(ds.layout) for g, n in enumerate(sizes) if n > 0]
    if not groups:
        return
    f, g = groups[int(rng.integers(0, len(groups)))]
    path = ds.paths[f]
    start = sum(sum(s) for s in ds.layout[:f]) + sum(ds.layout[f][:g])
    bad = set(range(start, start + ds.layout[f][g]))
    corrupt_row_group(path, g)
    for rank, ref in enumerate(refs):
        first_bad = next((i for i, b in enumerate(ref) if bad & set(ids([b]))), None)
        got = []
        m = make(rank, REFERENCE_PERF)
        try:
            with m:
                for b in m:
                    got.append(canon(b))
        except pqloader.InvalidDataError as ex:
            where = f"mix rank {rank} with row group {g} of {os.path.basename(path)} (ids {min(bad)}..{max(bad)}) broken"
            check(f"{os.path.basename(path)}', row group {g}" in str(ex), f"{where}: the error is unclear: {ex}")
            check(first_bad is not None, f"{where}: raised ({ex}), but no batch holds its rows")
            check(len(got) == first_bad and got == ref[:first_bad],
                  lambda: f"{where}: raised after {len(got)} batches, want the {first_bad} before the first "
                          f"batch holding its rows ({first_diff(ref[:first_bad], got)})")
            continue
        check(first_bad is None, f"mix rank {rank}: row group {g} of {os.path.basename(path)} broken, "
                                 f"but no error (batch {first_bad} holds its rows)")
        check(got == ref, lambda: f"mix rank {rank}: differs without the broken row group's rows: {first_diff(ref, got)}")


# ----------------------------------------------------------------------------- drift
# Numeric columns whose type drifts between files: a, b (integers, floats, or both) and c
# (decimals of other precisions and scales); a file may store one all null or lack it.
DRIFT_INTS = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
DRIFT_FLOATS = [pa.float32(), pa.float64()]


def drift_values(rng, t: pa.DataType, n: int) -> pa.Array:
    """n values that `t` and every wider type of the draw hold exactly; ~20 % null."""
    null = rng.random(n) < 0.2
    if pa.types.is_decimal(t):
        digits = rng.integers(-10 ** (t.precision - 1) + 1, 10 ** (t.precision - 1), size=n)
        vals = [decimal.Decimal(int(d)).scaleb(-t.scale) for d in digits]
    elif pa.types.is_floating(t):
        vals = [float(v) for v in rng.integers(-100, 101, size=n) * 0.5]
    else:
        lo = 0 if pa.types.is_unsigned_integer(t) else -100
        vals = [int(v) for v in rng.integers(lo, 101, size=n)]
    if n and rng.random() < 0.15:  # the type's extremes (casts, statistics and arithmetic at the edges)
        if pa.types.is_decimal(t):
            big = decimal.Decimal(10 ** t.precision - 1).scaleb(-t.scale)
            ends = [-big, big]
        elif pa.types.is_floating(t):
            ends = [float("nan"), -0.0, float("inf"), float("-inf")]
        else:
            info = np.iinfo(t.to_pandas_dtype())
            ends = [int(info.min), int(info.max)]
        for j in rng.integers(0, n, size=int(rng.integers(1, 3))):
            vals[int(j)], null[int(j)] = ends[int(rng.integers(0, len(ends)))], False
    return pa.array([None if z else v for v, z in zip(vals, null)], t)


def drift_type(rng, family: str) -> pa.DataType:
    if family == "c":
        s = int(rng.integers(0, 4))
        return pa.decimal128(int(rng.integers(s + 2, s + 5)), s)
    ints = DRIFT_INTS if family.endswith("64") else DRIFT_INTS[:-1]  # "int64": uint64 too (may not unify)
    pool = {"int": ints, "int64": ints, "float": DRIFT_FLOATS, "mixed": ints[:4] + DRIFT_FLOATS}[family]
    return pool[int(rng.integers(0, len(pool)))]


def make_drift_dataset(rng, root: Path) -> Dataset:
    ds = Dataset(root, ext=False)
    root.mkdir(parents=True, exist_ok=True)
    ds.families = {"a": str(rng.choice(["int", "int", "int64", "float", "mixed"])),
                   "b": str(rng.choice(["int", "int", "float", "mixed"])), "c": "c"}
    ds.types = []  # per file: {column: type or None (absent)}
    layout = [[int(rng.choice([0, 1, 2, 3, 5, 8])) for _ in range(int(rng.integers(1, 3)))]
              for _ in range(int(rng.integers(2, 5)))]
    first = 0
    for f, sizes in enumerate(layout):
        n = sum(sizes)
        cols = {"id": pa.array(np.arange(first, first + n, dtype=np.int64))}
        first += n
        types = {}
        for c, fam in ds.families.items():
            u = rng.random()
            if u < 0.12:
                types[c] = None  # the file lacks the column
                continue
            t = pa.null() if u < 0.24 else drift_type(rng, fam)
            types[c] = t
            cols[c] = pa.nulls(n, pa.null()) if t == pa.null() else drift_values(rng, t, n)
        if f == len(layout) - 1:  # every column has a type somewhere (all null everywhere is refused)
            for c, fam in ds.families.items():
                if all(t[c] is None or t[c] == pa.null() for t in ds.types + [types]):
                    types[c] = drift_type(rng, fam)
                    cols[c] = drift_values(rng, types[c], n)
        names = list(cols)
        rng.shuffle(names)  # files order their columns differently too
        path = str(root / f"part-{f:03d}.parquet")
        write_row_groups(path, pa.table({k: cols[k] for k in names}), sizes)
        ds.paths.append(path)
        ds.types.append(types)
    ds.layout = layout
    return ds


def drift_declared(rng, ds: Dataset) -> pa.Schema | None:
    """Sometimes a schema= declaring wider types: int64 (or float64) for integers, float64
    for floats, a decimal wide enough (or float64) for the decimals."""
    if rng.random() < 0.6 and "mixed" not in ds.families.values():
        return None
    fields = [pa.field("id", pa.int64())]
    for c, fam in ds.families.items():
        stored = [t[c] for t in ds.types if t[c] is not None and t[c] != pa.null()]
        if fam == "c":
            s = max([t.scale for t in stored], default=0)
            digits = max([t.precision - t.scale for t in stored], default=1)
            s += int(rng.integers(0, 2))
            t = pa.float64() if rng.random() < 0.4 else pa.decimal128(digits + s + int(rng.integers(0, 3)), s)
        elif fam in ("float", "mixed") or rng.random() < 0.3:
            t = pa.float64() if fam == "float" or rng.random() < 0.8 else pa.float32()
        elif any(t == pa.uint64() for t in stored):
            t = pa.float64() if rng.random() < 0.5 else pa.uint64()  # uint64 only if no signed
        else:
            t = pa.int64()
        fields.append(pa.field(c, t))
    return pa.schema(fields)


def drift_literal(rng, c: str):
    u = rng.random()
    if c == "c" and u < 0.5:
        return pa.scalar(decimal.Decimal(int(rng.integers(-999, 999))).scaleb(-int(rng.integers(0, 3))))
    if u < 0.08:
        return int(rng.choice([-2**63, -2**31 - 1, -129, 128, 255, 256, 2**31, 2**32, 2**53 + 1, 2**63 - 1]))
    if u < 0.4:
        return int(rng.integers(-60, 60))
    if u < 0.8:
        return float(rng.integers(-120, 120)) * 0.25
    return pa.scalar(decimal.Decimal(int(rng.integers(-999, 999))).scaleb(-int(rng.integers(0, 3))))


def drift_term(rng, cols: list[str]):
    a = str(rng.choice(cols))
    x = pc.field(a)
    u = rng.random()
    if u < 0.2:
        x = x / int(rng.choice([2, 3]))
    elif u < 0.35 and len(cols) > 1:
        b = str(rng.choice([c for c in cols if c != a]))
        x = x - pc.field(b) if rng.random() < 0.6 else x + pc.field(b)
    elif u < 0.42:
        x = x * 2
    return x


def drift_filter(rng, cols: list[str], depth: int = 0):
    u = rng.random()
    if depth < 2 and u < 0.3:
        l, r = drift_filter(rng, cols, depth + 1), drift_filter(rng, cols, depth + 1)
        return l & r if rng.random() < 0.5 else l | r
    if depth < 2 and u < 0.4:
        return ~drift_filter(rng, cols, depth + 1)
    if u < 0.5:
        x = pc.field(str(rng.choice(cols)))
        return x.is_null() if rng.random() < 0.6 else x.is_valid()
    if u < 0.65:
        c = str(rng.choice(cols))
        vals = [drift_literal(rng, c) for _ in range(int(rng.integers(1, 4)))]
        vals = [v.as_py() if isinstance(v, pa.Scalar) else v for v in vals]
        if len({type(v) for v in vals}) > 1:  # one type in a value set
            vals = [float(v) for v in vals]
        return pc.field(c).isin(vals)
    x = drift_term(rng, cols)
    lit = drift_literal(rng, str(x) if str(x) in cols else "")
    op = str(rng.choice(["<", "<=", "==", "!=", ">", ">="]))
    return {"<": x < lit, "<=": x <= lit, "==": x == lit, "!=": x != lit, ">": x > lit, ">=": x >= lit}[op]


def drift_schema(ds: Dataset, declared, cols) -> pa.Schema:
    """The loaded Arrow types of `cols` (or the declared ones); raises as the Loader does
    where the types do not unify. A value a declared float cannot hold, which the footers'
    statistics show, is refused when the Loader is made too, but it is a value's error, not
    the types': a filter that drops its row drops it, so the declared types are returned."""
    try:
        with pqloader.Loader(str(ds.root), columns=cols, schema=declared, fill_null=0, batch_size=1) as L:
            return pa.schema([f for f in pa.schema(L.arrow_schema) if not f.name.endswith("_valid")])
    except pqloader.SchemaMismatchError as e:
        if declared is None or "without loss (it holds every integer only up to" not in str(e):
            raise
        return pa.schema([declared.field(c) for c in cols])


def drift_set(rng, ds: Dataset, o: dict, cache) -> None:
    declared, expr, cols = o.get("schema"), o["_expr"], o["columns"]
    names = ["id", "a", "b", "c"]
    try:
        full = drift_schema(ds, declared, names)
    except pqloader.SchemaMismatchError as ex:
        # the drift does not unify (uint64 and a signed integer; integers and floats
        # undeclared): the Loader of such a column is refused naming it
        bad = [c for c in cols[1:] if not _drift_loads(ds, declared, c)]
        if bad:
            try:
                run(ds, o, REFERENCE_PERF, 0)
            except pqloader.SchemaMismatchError as e2:
                check(any(f"'{c}'" in str(e2) for c in bad) and ".parquet" in str(e2),
                      f"drift: the mismatch error is unclear: {e2}")
                return
            raise Fail(f"drift: columns {bad} of types {[{c: t[c] for c in bad} for t in ds.types]} "
                       f"loaded (all columns: {ex})")
        full = pa.schema([pa.field("id", pa.int64())] +
                         [drift_schema(ds, declared, ["id", c]).field(c) for c in names[1:] if _drift_loads(ds, declared, c)])
        if not all(f in full.names for f in pc_fields(expr)):
            return  # a filter over a column that does not unify: compared in each file's type (no reference)
    ref_schema = pa.schema([full.field(n) for n in names if n in full.names])
    inexact = False
    try:
        read = [n for n in ref_schema.names if n in cols or n in pc_fields(expr)]  # (the others are not cast)
        scan = pads.dataset(str(ds.root), schema=ref_schema, format="parquet")
        want = scan.to_table(columns=read, filter=expr)  # (its errors: the reference's)
        # The rows filtered after the scan, not by it: the scan prunes row groups by
        # statistics, which leave NaN out (a row group of [NaN, 30.0] has min = max = 30:
        # `~(a * 2 > 1.34)` pruned it whole, with its NaN rows the filter keeps; drift:10263).
        try:
            want = scan.to_table(columns=read).filter(expr)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError):
            pass  # (evaluated where the statistics had ruled the row group out, and refused)
        ref_err = None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError) as ex:
        want, ref_err = None, ex
        if "not in range: " in str(ex):  # an integer past 2^53 (2^24) declared a float:
            want, ref_err, inexact = drift_exact_reference(ds, ref_schema, read, cols[1:], expr)  # exact ones load
    try:
        bs, nb, nrows = run(ds, o, REFERENCE_PERF, 0)
    except pqloader.SchemaMismatchError as ex:
        if inexact:  # a value of a column read (loaded or filtered) a float cannot hold
            check(".parquet" in str(ex) and ("exactly" in str(ex) or "without loss" in str(ex)),
                  f"drift: the inexact value's error is unclear: {ex}")
            return
        check(ref_err is not None, f"drift: pqloader raised {type(ex).__name__}: {ex}")
        return
    except pqloader.Error as ex:
        check(ref_err is not None, f"drift: pqloader raised {type(ex).__name__}: {ex}\n    pyarrow kept "
                                   f"{0 if want is None else want.num_rows} rows")
        return
    if ref_err is not None and "not in range: " in str(ref_err) and want is None:
        want = drift_decimal_reference(ds, ref_schema, read, expr)  # (pqloader pruned exactly)
        if want is not None:
            ref_err = None
    check(ref_err is None, f"drift: pyarrow raised ({type(ref_err).__name__}: {ref_err}), pqloader did not: "
                           f"{sum(len(arr(b, 'id')) for b in bs)} rows")
    if "_inexact" in want.column_names:  # kept rows' loaded values are exact, or the Loader raised
        bad = [i for i, x in zip(want["id"].to_pylist(), want["_inexact"].to_pylist()) if x]
        check(not bad, f"drift: ids {bad[:5]} hold an integer the declared float does not hold exactly: "
                       f"loaded without an error")
    want_ids = want["id"].to_pylist()
    got = ids(bs)
    if o["shuffle"]:
        check(sorted(got) == sorted(want_ids), lambda: f"drift: ids {sorted(got)[:30]}, want {sorted(want_ids)[:30]}")
    else:
        check(got == want_ids, lambda: f"drift: ids {got[:30]}, want {want_ids[:30]}")
    check(nrows == len(want_ids), f"drift: num_rows {nrows}, want {len(want_ids)}")
    pos = {i: j for j, i in enumerate(want_ids)}
    for c in cols[1:]:
        col = want[c]
        ref = pc.cast(col, pa.float64()) if pa.types.is_decimal(col.type) else col
        valid = np.asarray(pc.is_valid(ref).to_numpy(zero_copy_only=False), dtype=bool)
        fill = o.get("fill_null", {}).get(c, 0)
        vals = ref.fill_null(pa.scalar(fill).cast(ref.type)).to_numpy(zero_copy_only=False) if len(ref) else \
            np.zeros(0, ref.type.to_pandas_dtype())
        for b in bs:
            g = arr(b, c)
            check(g.dtype == vals.dtype, f"drift: {c} dtype {g.dtype}, want {vals.dtype} ({ref_schema.field(c).type})")
            rows = [pos[int(i)] for i in arr(b, "id")]
            check(g.tobytes() == vals[rows].tobytes(),
                  lambda: f"drift: {c} of ids {arr(b, 'id').tolist()}: {g.tolist()}, want {vals[rows].tolist()}")
            if o.get("null_mask"):
                check(arr(b, c + "_valid").tolist() == valid[rows].tolist(), f"drift: {c}_valid differs")
    check_determinism(rng, ds, o, 0, bs, cache, "drift ")


def drift_exact_reference(ds: Dataset, schema: pa.Schema, read: list[str], loaded: list[str], expr):
    """pyarrow's dataset refuses integers past 2^53 as float64 (2^24 as float32); the loader
    converts each value it reads exactly or refuses it (README, schema=): the files cast so
    (unchecked), then filtered, with a column `_inexact` (a loaded value is not exact)."""
    tabs, inexact_anywhere = [], False
    for path in ds.paths:
        t = pq.read_table(path)
        cols, bad = {}, np.zeros(t.num_rows, bool)
        for n in read:
            f = schema.field(n)
            col = t[n] if n in t.column_names else pa.nulls(t.num_rows, f.type)
            cast = pc.cast(col, f.type, safe=False)
            if pa.types.is_integer(col.type) and pa.types.is_floating(f.type):
                back = cast.to_pylist()
                for j, v in enumerate(col.to_pylist()):
                    if v is not None and int(back[j]) != v:
                        bad[j] |= n in loaded
                        inexact_anywhere = True
            cols[n] = cast
        cols["_inexact"] = pa.array(bad)
        tabs.append(pa.table(cols))
    t = pa.concat_tables(tabs)
    try:
        return t.filter(expr), None, inexact_anywhere
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError) as ex:
        return None, ex, inexact_anywhere


def drift_decimal_reference(ds: Dataset, schema: pa.Schema, read: list[str], expr):
    """The rows `expr` keeps, its integer columns compared as decimals (exactly), where
    pyarrow refused to compare them with a decimal literal through a float ("Integer value
    4294967295 not in range: -16777216 to 16777216"); None where the filter does
    arithmetic (whose meaning decimals change) or fails anyway. The loader compares the
    same way pyarrow does, refusing the inexact values, but only where its exact statistics
    did not already rule the row group out (seed drift:9938: `a <= -29` of a uint32 column)."""
    if any(op in str(expr) for op in ("divide", "multiply", "add", "subtract")):
        return None
    t = pads.dataset(str(ds.root), schema=schema, format="parquet").to_table(columns=read)
    exact = t
    for i, f in enumerate(t.schema):
        if pa.types.is_integer(f.type) and f.name != "id" and f.name in pc_fields(expr):
            exact = exact.set_column(i, f.name, pc.cast(t[f.name], pa.decimal128(38, 0)))
    try:
        return t.filter(pc.field("id").isin(exact.filter(expr)["id"]))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, TypeError):
        return None


def _drift_loads(ds, declared, c) -> bool:
    try:
        drift_schema(ds, declared, ["id", c])
        return True
    except pqloader.SchemaMismatchError:
        return False


def pc_fields(expr) -> set[str]:
    """The drift columns an expression names."""
    return set(re.findall(r"\b([abc])\b", str(expr)))


def draw_drift(rng, ds: Dataset, prev: dict | None) -> dict:
    o = {"batch_size": int(rng.choice([1, 2, 3, 7, 100])), "shuffle": bool(rng.random() < 0.5),
         "seed": int(rng.integers(0, 2**63)), "shuffle_window": int(rng.choice([1, 3, 64])), "_src": "dir"}
    cols = ["id"] + [c for c in ["a", "b", "c"] if rng.random() < 0.5]
    rng.shuffle(cols)
    cols.remove("id")
    o["columns"] = ["id"] + cols
    if rng.random() < 0.5:
        o["null_mask"] = cols
    else:
        o["fill_null"] = {c: int(rng.choice([0, 3])) for c in cols}  # unsigned columns too
    if prev is not None and rng.random() < 0.5:  # the same filter under another schema (one cache)
        o["_expr"] = prev["_expr"]
        o["schema"] = drift_declared(rng, ds)
    else:
        o["schema"] = drift_declared(rng, ds)
        o["_expr"] = drift_filter(rng, ["a", "b", "c"])
    if o["schema"] is None:
        del o["schema"]
    return o


def drift_draw(rng, work: Path) -> None:
    ds = make_drift_dataset(rng, work / "data")
    desc = f"{ds} types={[{k: str(v) for k, v in t.items()} for t in ds.types]}"
    prev = None
    for j in range(3):
        o = draw_drift(rng, ds, prev)
        prev = o
        with describing(f"drift option set {j}: {desc} options={shown(o)}"):
            drift_set(rng, ds, o, work / "cache")


# ----------------------------------------------------------------------------- draws
def base_draw(rng, work: Path, sets: int = 3) -> None:
    ds = make_base_dataset(rng, work / "data")
    for j in range(sets):  # option sets on one dataset share its disk cache
        o = draw_base(rng, ds)
        with describing(f"option set {j}: {ds} options={shown(o)}"):
            base_set(rng, ds, o, work / "cache")


def ext_draw(rng, work: Path) -> None:
    ds = make_ext_dataset(rng, work / "data")
    flips: dict = {}
    for j in range(3):
        o = draw_ext(rng, ds)
        with describing(f"ext option set {j}: {ds} options={shown(o)}"):
            ext_set(rng, ds, o, work / "cache", flips)
        if j < 2:
            op = draw_pack(rng, ds)
            with describing(f"pack option set {j}: {ds} options={shown(op)}"):
                pack_set(rng, ds, op, work / "cache")
        if j == 0:
            ot = o if rng.random() < 0.7 else draw_pack(rng, ds)
            with describing(f"torch option set: {ds} options={shown(ot)}"):
                torch_set(rng, ds, ot)
        if j == 2:
            with describing(f"stale cache: {ds}"):
                stale_set(rng, ds, work / "cache_stale")


MODES = {
    "base": base_draw,
    "mix": lambda rng, work: mix_draw(rng, make_base_dataset(rng, work / "data"), work / "cache"),
    "ext": ext_draw,
    "drift": drift_draw,
}


def run_draw(mode: str, seed: int, work: Path) -> None:
    """One draw of `mode` ('base', 'mix', 'ext', 'drift') from `seed`, in the empty directory `work`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        MODES[mode](np.random.default_rng(seed), Path(work))
