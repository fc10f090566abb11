"""Cross-build check: caches and state_dict()s written by one pqloader build, read by another.

  python tools/crossbuild/check.py --old DIR [--new DIR] [--cases a,b] [--scratch build/crossbuild]

DIR holds a staged ``pqloader`` package (docs/testing.md); --new defaults to the installed
one. Each build runs in a subprocess (PYTHONPATH=DIR) on data this tool generates. Per case:
old>new, the old build writes cache_dir (or saves a state) and the new reads it: the batches
must be the new build's uncached ones; new>old the reverse, or a clean refusal. A DIFF is a
cache key part or version that should have changed (docs/cache_format.md). Exit status 1 on
any DIFF, crash or save error.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA_VERSION = "3"


# --- cases (evaluated in the worker, where pqloader is importable) -----------------------
# A case is (source, options), or (source, [options, ...]): Loaders run one after another on
# one cache_dir (ranks sharing a cache, several filters or string modes over one cache). A
# case that sets cache_dir itself (":memory:") keeps it.
def cases(D, T, pa, fillimg, P):
    num = f"{D}/num"
    C = {
        "num": (num, dict(fill_null={"nul": -1.5, "nuli": 7})),
        "num_shuf": (num, dict(fill_null={"nul": -1.5, "nuli": 7}, shuffle=True, seed=3)),
        "num_asfloat": (num, dict(columns=["i40", "u32", "i8"], schema=pa.schema(
            [("i40", pa.float64()), ("u32", pa.float64()), ("i8", pa.float16())]))),
        "num_asfloat_lossy": (num, dict(columns=["i64", "big"], schema=pa.schema(
            [("i64", pa.float64()), ("big", pa.float64())]))),
        "num_asfloat_fill": (num, dict(columns=["i8", "u32", "nuli"], fill_null={"nuli": 3}, schema=pa.schema(
            [("i8", pa.float16()), ("u32", pa.float64()), ("nuli", pa.float32())]))),
        "num_f16": (num, dict(columns=["f16", "f32"], transforms={"f32": [T.Cast("float16")]})),
        "num_mask": (num, dict(columns=["nul", "nuli"], fill_null={"nul": float("nan"), "nuli": 0}, null_mask=True)),
        "num_filter": (num, dict(columns=["i64", "f64"], filter="f64 > 0.1")),
        "dec": (f"{D}/dec", {}),
        "dec_i64": (f"{D}/dec", dict(decimals="int64")),
        "dec38": (f"{D}/dec38", {}),
        "i96": (f"{D}/i96", {}),
        "i96_us": (f"{D}/i96", dict(coerce_int96_timestamp_unit="us")),
        "i96far_ms": (f"{D}/i96far", dict(coerce_int96_timestamp_unit="ms")),
        "dates": (f"{D}/dates", {}),
        "str": (f"{D}/str", dict(fill_null={"s": ""})),
        "str_bytes": (f"{D}/str", dict(fill_null={"s": b""}, strings="bytes")),
        "rag_pad": (f"{D}/rag", dict(fill_null={"tok": 0}, transforms={
            "tok": [T.PadOrTruncate(8, pad=-1)], "fl": [T.PadOrTruncate(3, pad=0.5, side="left")]})),
        "rag_ragged": (f"{D}/rag", dict(fill_null={"tok": 0}, lists={"tok": "ragged", "fl": "ragged"})),
        "fsl": (f"{D}/fsl", {}),
        "hive": (f"{D}/hive", {}),
        "hive_filter": (f"{D}/hive", dict(filter="k == 2 and x > 40")),
        "mixed_files": (f"{D}/mix", dict(schema=pa.schema([("x", pa.float64())]))),
        "mixed_files16": (f"{D}/mix", dict(schema=pa.schema([("x", pa.float16())]))),
        "img": (f"{D}/img", dict(fill_null={"img": fillimg}, on_decode_error="skip", transforms={"img": [
            T.DecodeImage(), T.Resize(16), T.CenterCrop(12), T.Normalize([0.5] * 3, [0.2] * 3), T.ToCHW()]})),
        "img_rand": (f"{D}/img", dict(fill_null={"img": fillimg}, columns=["img"], shuffle=True, seed=1, transforms={
            "img": [T.DecodeImage(), T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.Cast("float16")]})),
        "jpg_rgb": (f"{D}/jpg", dict(transforms={"img": [T.DecodeImage(), T.Resize(13), T.CenterCrop(8),
                                                        T.Normalize([0.4, 0.5, 0.6], [0.2, 0.25, 0.3]), T.ToCHW()]})),
        "jpg_gray": (f"{D}/jpg", dict(transforms={"img": [T.DecodeImage(mode="gray"), T.Resize(12),
                                                         T.CenterCrop(10)]})),
        "imgnull_mask_skip": (f"{D}/imgnull", dict(null_mask=True, on_decode_error="skip",
                                                   transforms={"img": [T.DecodeImage()]})),
        "imgnull_fill_skip": (f"{D}/imgnull", dict(fill_null={"img": b""}, on_decode_error="skip",
                                                   transforms={"img": [T.DecodeImage()]})),
        "npy": (f"{D}/npy", dict(transforms={"a": [T.DecodeNdarray(), T.PadOrTruncate(3, pad=9.0)]})),
        "npz_skip": (f"{D}/npz", dict(on_decode_error="skip", transforms={"z": [T.DecodeCompressedNdarray()]})),
        "npz_raise": (f"{D}/npz", dict(transforms={"z": [T.DecodeCompressedNdarray()]})),
        "big_shuf": (f"{D}/big", dict(shuffle=True, seed=2, batch_size=256,
                                      transforms={"l": [T.PadOrTruncate(4, pad=-1)]})),
        "cast_list": (f"{D}/ext", dict(columns=["ls"],
                                       transforms={"ls": [T.Cast("int16"), T.PadOrTruncate(3, pad=0)]})),
    }
    for dt in ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16"]:
        C["cast_" + dt] = (f"{D}/ext", dict(columns=["f", "g"], transforms={"f": [T.Cast(dt)], "g": [T.Cast(dt)]}))
    C.update(more_cases(D, T, P))
    return C


def more_cases(D, T, P):
    """Options that change the decoded values or the stream, grouped by what they touch."""
    num, big, rag, tok, hive = f"{D}/num", f"{D}/big", f"{D}/rag", f"{D}/tok", f"{D}/hive"
    C = {}
    # lists: pack (eos, pad, truncate, companion columns), Pad and ragged with fills
    for name, pk in {"pack": P.Pack("tok", 16, eos=-2, pad=-1),
                     "pack_trunc": P.Pack("tok", 12, eos=-2, pad=-9, truncate=True),
                     "pack_noeos": P.Pack("tok", 8, pad=0)}.items():
        C[name] = (tok, dict(columns=["tok", "doc", "w"], pack=pk, fill_null={"tok": 3}))
    C["pack_shuf"] = (tok, dict(columns=["tok", "doc"], pack=P.Pack("tok", 16, eos=-2, pad=-1), fill_null={"tok": 3},
                                shuffle=True, seed=5))
    C["lists_pad"] = (rag, dict(fill_null={"tok": 4}, lists={
        "tok": P.Pad(None, max_length=10, multiple_of=4, value=-7, side="left", truncation="left"),
        "fl": P.Pad(3, value=0.25, side="right", truncation="right")}))
    C["lists_pad_fixed"] = (rag, dict(columns=["tok"], fill_null={"tok": 4}, lists={"tok": P.Pad(5, value=-1)}))
    C["lists_ragged_fill"] = (rag, dict(fill_null={"tok": 6}, lists={"tok": P.Ragged(), "fl": "ragged"}))
    C["lists_fill_elems"] = (f"{D}/lnull", dict(columns=["l", "lf"], fill_null={"l": -5, "lf": 2.5}, lists={"l": "ragged", "lf": P.Pad(4)}))
    # stack (after Cast to one dtype)
    C["stack"] = (num, dict(columns=["f32", "f64", "i8", "nul"], fill_null={"nul": 0.5},
                            transforms={"f64": [T.Cast("float32")], "i8": [T.Cast("float32")],
                                        "nul": [T.Cast("float32")]}, stack={"feat": ["f32", "f64", "i8", "nul"]}))
    C["stack_two"] = (num, dict(columns=["f64", "nul"], fill_null={"nul": -3.0}, stack={"p": ["nul", "f64"]}))
    # strings, bytes and their fills on one cache dir
    C["str_then_bytes"] = (f"{D}/strn", [dict(fill_null={"s": "NA", "b": b"\0"}),
                                         dict(fill_null={"s": b"NA", "b": b"\0"}, strings="bytes"),
                                         dict(fill_null={"s": "", "b": b""})])
    C["fill_str_bytes"] = (f"{D}/strn", dict(fill_null={"s": "é?", "b": b"\xff\x00"}))
    # checksums: entries written without verification, read with it (one cache dir)
    C["cks_then_verify"] = (f"{D}/cks", [dict(), dict(verify_checksums=True)])
    C["verify_then_plain"] = (f"{D}/cks", [dict(verify_checksums=True), dict()])
    # filters on one cache dir: partition keys, values, nulls
    C["filters_one_cache"] = (hive, [dict(filter="k == 1"), dict(filter="x > 50"), dict(filter="k == 2 and s == 'b'"),
                                     dict(), dict(filter=["s == 'a'", "x < 30"])])
    C["filter_null"] = (num, [dict(columns=["nul", "i64"], filter="nul is None", fill_null={"nul": -1.0}),
                              dict(columns=["nul", "i64"], filter="nul is not None"),
                              dict(columns=["nul", "i64"], filter="nul is not None and i64 > 0")])
    C["filter_shuf"] = (big, dict(filter="x > 0", shuffle=True, seed=4, columns=["x", "i"]))
    # row groups, summaries
    C["row_groups"] = (f"{big}/a.parquet", dict(row_groups={f"{big}/a.parquet": [1, 3, 6]}, columns=["x", "i"]))
    C["row_groups_shuf"] = (f"{big}/a.parquet", dict(row_groups={f"{big}/a.parquet": [6, 0, 2]}, shuffle=True,
                                                     seed=8, columns=["i", "l"],
                                                     transforms={"l": [T.PadOrTruncate(3, pad=-1)]}))
    C["summary_index"] = (f"{D}/sumidx", dict(use_summary="only", columns=["x", "i"]))
    C["summary_pyarrow"] = (f"{D}/sumpa", dict(use_summary=True, columns=["x", "i"]))
    C["summary_off"] = (f"{D}/sumidx", [dict(use_summary=False, columns=["x", "i"]), dict(columns=["x", "i"])])
    # shuffling and ranks
    for wdw in (1, 2, 16):
        C[f"shuf_window{wdw}"] = (big, dict(shuffle=True, seed=6, shuffle_window=wdw, columns=["x", "i"]))
    C["ranks_one_cache"] = (big, [dict(world_size=2, rank=0, shuffle=True, seed=9, columns=["i"]),
                                  dict(world_size=2, rank=1, shuffle=True, seed=9, columns=["i"])])
    C["ranks_rowgroup"] = (big, [dict(world_size=2, rank=r, shard_policy="pad", columns=["i"]) for r in (0, 1)])
    # cache policies and shards
    for pol in ("lru", "plan"):
        C[f"cache_{pol}"] = (big, dict(cache_policy=pol, cache_size_limit=40_000, shuffle=True, seed=2,
                                       columns=["x", "i"]))
    C["cache_shards1"] = (big, dict(cache_shards=1, columns=["x", "i"]))
    C["cache_shards3"] = (big, [dict(cache_shards=3, columns=["x", "i"]), dict(cache_shards=3, columns=["i"])])
    C["cache_memory"] = (big, dict(cache_dir=":memory:", shuffle=True, seed=1, columns=["x", "i"]))
    # nulls
    C["mask_several"] = (f"{D}/lnull", dict(columns=["x", "y", "s"], null_mask=True,
                                            fill_null={"x": 0, "y": float("nan"), "s": ""}))
    C["mask_list"] = (f"{D}/lnull", dict(columns=["x", "y", "l"], null_mask=["x", "l"],
                                         fill_null={"x": 1, "y": 2.0, "l": 0}, lists={"l": "ragged"}))
    # types
    C["i96_ns"] = (f"{D}/i96", dict(coerce_int96_timestamp_unit="ns"))
    C["i96_s"] = (f"{D}/i96", dict(coerce_int96_timestamp_unit="s"))
    C["i96far_us"] = (f"{D}/i96far", dict(coerce_int96_timestamp_unit="us"))
    C["dec38_i64"] = (f"{D}/dec38/b.parquet", dict(decimals="int64"))
    C["dec_f64_i64_one_cache"] = (f"{D}/dec/b.parquet", [dict(), dict(decimals="int64")])
    # images: corrupt JPEGs, float16 outputs, gray without a channel axis, EXIF orientation
    C["jpg_corrupt_skip"] = (f"{D}/jpgbad", dict(on_decode_error="skip", transforms={"img": [T.DecodeImage()]}))
    C["jpg_corrupt_raise"] = (f"{D}/jpgbad", dict(transforms={"img": [T.DecodeImage()]}))
    C["img_f16"] = (f"{D}/jpg", dict(transforms={"img": [T.DecodeImage(), T.Resize(10), T.CenterCrop(8),
                                                        T.Normalize([0.4, 0.5, 0.6], [0.2, 0.25, 0.3]),
                                                        T.Cast("float16"), T.ToCHW()]}))
    C["img_f16_first"] = (f"{D}/jpg", dict(transforms={"img": [T.DecodeImage(), T.CenterCrop(8), T.Cast("float16"),
                                                              T.Normalize([0.4, 0.5, 0.6], [0.2, 0.25, 0.3])]}))
    C["gray_nokeep"] = (f"{D}/jpg", dict(transforms={"img": [T.DecodeImage(mode="gray", keepdims=False),
                                                            T.Resize(10), T.CenterCrop(8)]}))
    C["exif"] = (f"{D}/exif", dict(transforms={"img": [T.DecodeImage(exif_transpose=True)]}, batch_size=1))
    C["exif_then_not"] = (f"{D}/exif", [dict(transforms={"img": [T.DecodeImage()]}, batch_size=1),
                                        dict(transforms={"img": [T.DecodeImage(exif_transpose=True)]}, batch_size=1)])
    return C


# cases whose cache does not outlive the Loader (no hit across builds expected)
NO_PERSISTENCE = {"cache_memory"}

# state cases: (the case whose Loader saves and loads, its extra options[, the epoch saved in]);
# None: built by _build (mix, petastorm)
STATE_CASES = {"state_loader": ("num_shuf", {}), "state_loader_img": ("img_rand", {"batch_size": 8}),
               "state_mix": None, "state_petastorm": None,
               "state_loader_epoch1": ("num_shuf", {}, 1),
               "state_loader_torch": ("num_shuf", {"output": "torch"}),
               "state_loader_pack": ("pack_shuf", {"batch_size": 4}),
               "state_loader_window": ("shuf_window2", {"batch_size": 64}),
               "state_loader_rank1": ("ranks_one_cache", {"batch_size": 64}),
               "state_loader_filter": ("filter_shuf", {"batch_size": 64}),
               "state_loader_rowgroups": ("row_groups_shuf", {"batch_size": 64}),
               "state_mix_last": None, "state_mix_torch": None}


# --- data --------------------------------------------------------------------------------
def _png(a):
    """A PNG of an HxWx3 uint8 array, without PIL."""
    def chunk(t, d):
        return len(d).to_bytes(4, "big") + t + d + zlib.crc32(t + d).to_bytes(4, "big")
    h, w = a.shape[:2]
    raw = b"".join(b"\0" + a[y].tobytes() for y in range(h))
    ihdr = w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def make_data(D):
    import datetime
    import decimal

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    try:
        from PIL import Image
    except ImportError:
        Image = None
    rng, n = np.random.default_rng(0), 300

    def w(name, cols, **kw):
        os.makedirs(os.path.dirname(f"{D}/{name}"), exist_ok=True)
        pq.write_table(pa.table(cols), f"{D}/{name}", row_group_size=kw.pop("rg", 100), **kw)

    def enc(a, fmt="PNG", **kw):
        if Image is None:
            return _png(a)
        b = io.BytesIO()
        Image.fromarray(a).save(b, format=fmt, **kw)
        return b.getvalue()

    def npbytes(save, *args, **kw):
        b = io.BytesIO()
        save(b, *args, **kw)
        return b.getvalue()

    w("num/a.parquet", {
        "i8": pa.array(rng.integers(-128, 127, n), pa.int8()),
        "i64": pa.array(rng.integers(-2**62, 2**62, n), pa.int64()),
        "i40": pa.array(rng.integers(-2**40, 2**40, n), pa.int64()),
        "u32": pa.array(rng.integers(0, 2**32 - 1, n, dtype=np.uint64), pa.uint32()),
        "big": pa.array([2**53 + 1 + i for i in range(n)], pa.int64()),
        "f32": pa.array(rng.standard_normal(n).astype(np.float32)),
        "f64": pa.array(rng.standard_normal(n)),
        "f16": pa.array(rng.standard_normal(n).astype(np.float16)),
        "nul": pa.array([None if i % 7 == 0 else float(i) for i in range(n)], pa.float64()),
        "nuli": pa.array([None if i % 5 == 0 else i for i in range(n)], pa.int32()),
        "b": pa.array([i % 3 == 0 for i in range(n)])})
    Dec = decimal.Decimal
    w("dec/a.parquet", {"d": pa.array([Dec(f"{i}.{i % 100:02d}") for i in range(n)], pa.decimal128(10, 2))})
    w("dec/b.parquet", {"d": pa.array([Dec(f"{i}.{i % 1000:03d}") for i in range(n)], pa.decimal128(12, 3))})
    w("dec38/a.parquet", {"d": pa.array([Dec("1234567890123456789012345678.9") + i for i in range(n)],
                                        pa.decimal128(38, 1))})
    w("dec38/b.parquet", {"d": pa.array([Dec("1.234567890") + i for i in range(n)], pa.decimal128(38, 9))})
    dt, td = datetime.datetime, datetime.timedelta
    w("i96/a.parquet", {"ts": pa.array([dt(1970, 1, 1) + td(days=300 * i, microseconds=i) for i in range(n)],
                                       pa.timestamp("us"))}, use_deprecated_int96_timestamps=True)
    w("i96far/a.parquet", {"ts": pa.array([dt(1500, 1, 1) + td(days=300 * i) for i in range(n)],
                                          pa.timestamp("us"))}, use_deprecated_int96_timestamps=True)
    w("dates/a.parquet", {
        "d32": pa.array([datetime.date(2000, 1, 1) + td(days=i) for i in range(n)], pa.date32()),
        "t": pa.array([dt(2020, 1, 1) + td(seconds=i) for i in range(n)], pa.timestamp("ms")),
        "tz": pa.array([dt(2020, 1, 1) + td(seconds=i) for i in range(n)], pa.timestamp("us", tz="UTC"))})
    w("str/a.parquet", {"s": pa.array([None if i % 11 == 0 else "x" * (i % 13) + "é" for i in range(n)]),
                        "bin": pa.array([bytes([i % 256]) * (i % 5) for i in range(n)], pa.binary())})
    w("rag/a.parquet", {
        "tok": pa.array([list(range(i % 17)) if i % 9 else None for i in range(n)], pa.list_(pa.int32())),
        "fl": pa.array([[j / 3 for j in range(i % 5)] for i in range(n)], pa.list_(pa.float32()))})
    w("fsl/a.parquet", {"v": pa.array([[i, i + 1, i + 2] for i in range(n)], pa.list_(pa.float32(), 3)),
                        "vv": pa.array([[[i, i], [i + 1, i + 1]] for i in range(n)],
                                       pa.list_(pa.list_(pa.int16(), 2), 2))})
    for k in (1, 2):
        for s in ("a", "b"):
            w(f"hive/k={k}/s={s}/f.parquet", {"x": pa.array(rng.integers(0, 100, n // 4), pa.int64())})
    w("mix/a.parquet", {"x": pa.array(range(n), pa.int32())})
    w("mix/b.parquet", {"x": pa.array([i + 0.5 for i in range(n)], pa.float32())})
    imgs = [enc(rng.integers(0, 255, (20 + i % 7, 24 + i % 5, 3), dtype=np.uint8)) for i in range(60)]
    imgs[5] = None
    w("img/a.parquet", {"img": pa.array(imgs, pa.binary()), "lab": pa.array(range(60))})
    if Image is not None:
        yy, xx = np.mgrid[0:24, 0:30]
        jp = [enc(np.stack([(xx * 8 + i) % 256, (yy * 9) % 256, (xx + yy + 5 * i) % 256], -1).astype(np.uint8),
                  "JPEG", quality=70 + i % 3 * 10) for i in range(30)]
        w("jpg/a.parquet", {"img": pa.array(jp, pa.binary())}, rg=10)
    imgs = [None if i % 7 == 2 else enc(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)) for i in range(40)]
    w("imgnull/a.parquet", {"img": pa.array(imgs, pa.binary()), "i": pa.array(range(40))}, rg=10)
    arrs = [npbytes(np.save, np.arange(i % 4 + 1, dtype=np.float64) * 1.5) for i in range(60)]
    w("npy/a.parquet", {"a": pa.array(arrs, pa.binary())})
    z = [npbytes(np.savez_compressed, a=np.arange(3.0) + i, b=np.zeros(2)) if i % 10 == 3
         else npbytes(np.savez_compressed, a=np.arange(3.0) + i) for i in range(40)]
    w("npz/a.parquet", {"z": pa.array(z, pa.binary()), "i": pa.array(range(40))}, rg=10)
    m = 2000
    w("big/a.parquet", {"x": pa.array(rng.standard_normal(m)), "i": pa.array(range(m), pa.int64()),
                        "l": pa.array([list(range(i % 7)) for i in range(m)], pa.list_(pa.int64()))}, rg=250)
    odd = [float("nan"), float("inf"), -float("inf"), 1e20, -1e20, 3.7, -2.5, 300.0, 70000.0, -129.0,
           2.0**63, 2.0**64, -0.0, 65504.0, 1e5, 0.5]
    f = [odd[i % len(odd)] for i in range(64)]
    w("ext/a.parquet", {"f": pa.array(f, pa.float64()), "g": pa.array(f, pa.float32()),
                        "ls": pa.array([f[i:i + i % 4] for i in range(64)], pa.list_(pa.float64()))}, rg=16)
    more_data(D, w, enc, rng, Image)


def more_data(D, w, enc, rng, Image):
    """The data of more_cases()."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    n = 300
    w("tok/a.parquet", {"tok": pa.array([None if i % 13 == 4 else list(range(100 * i, 100 * i + i % 41))
                                         for i in range(n)], pa.list_(pa.int32())),
                        "doc": pa.array(range(n), pa.int64()), "w": pa.array([i / 7 for i in range(n)], pa.float32())},
      rg=60)
    w("lnull/a.parquet", {
        "x": pa.array([None if i % 6 == 1 else i for i in range(n)], pa.int32()),
        "y": pa.array([None if i % 4 == 3 else i * 0.5 for i in range(n)], pa.float64()),
        "s": pa.array([None if i % 5 == 2 else f"s{i}" for i in range(n)]),
        "l": pa.array([None if i % 8 == 5 else [None if j == 1 else j for j in range(i % 4)] for i in range(n)],
                      pa.list_(pa.int64())),
        "lf": pa.array([[None if (i + j) % 3 == 0 else float(j) for j in range(i % 6)] for i in range(n)],
                       pa.list_(pa.float32()))})
    w("strn/a.parquet", {"s": pa.array([None if i % 4 == 1 else "ab" * (i % 6) + "ü" for i in range(n)]),
                         "b": pa.array([None if i % 3 == 2 else bytes([i % 256, 0]) * (i % 4) for i in range(n)],
                                       pa.binary())})
    w("cks/a.parquet", {"x": pa.array(rng.standard_normal(n)), "i": pa.array(range(n), pa.int64())},
      write_page_checksum=True)
    m = 1200
    for d in ("sumidx", "sumpa"):
        coll = []
        for k in range(3):
            f = f"{d}/p{k}.parquet"
            w(f, {"x": pa.array(rng.standard_normal(m // 3)), "i": pa.array(range(k * m, k * m + m // 3))},
              rg=70 + 30 * k, metadata_collector=coll)
            coll[-1].set_file_path(f"p{k}.parquet")
        if d == "sumpa":
            pq.write_metadata(pq.read_schema(f"{D}/{d}/p0.parquet"), f"{D}/{d}/_metadata", metadata_collector=coll)
    if Image is None:
        return
    yy, xx = np.mgrid[0:20, 0:28]
    jp = [enc(np.stack([(xx * 5 + i) % 256, (yy * 11) % 256, (xx * yy + i) % 256], -1).astype(np.uint8), "JPEG",
              quality=85) for i in range(24)]
    for i in (3, 10, 17):
        jp[i] = jp[i][:len(jp[i]) // 2]  # truncated: real bytes, cut
    jp[20] = jp[20][:200] + bytes(range(256)) * 2 + jp[20][712:]  # scan data overwritten
    w("jpgbad/a.parquet", {"img": pa.array(jp, pa.binary()), "i": pa.array(range(24))}, rg=8)
    ex = []
    for i in range(16):
        e = Image.Exif()
        e[0x0112] = i % 8 + 1
        im = Image.fromarray(np.stack([(xx * 9 + i) % 256, (yy * 13) % 256, (xx + 2 * yy) % 256], -1).astype(np.uint8))
        b = io.BytesIO()
        im.save(b, format="JPEG", quality=90, exif=e.tobytes())
        ex.append(b.getvalue())
    w("exif/a.parquet", {"img": pa.array(ex, pa.binary())}, rg=4)


# --- worker: runs jobs in one build ------------------------------------------------------
def _digest(v):
    if type(v).__module__.startswith("torch"):
        v = v.numpy()
    if isinstance(v, dict):
        return {k: _digest(x) for k, x in sorted(v.items())}
    if isinstance(v, (list, tuple)):
        return [_digest(x) for x in v]
    import numpy as np
    if isinstance(v, np.ndarray):
        a = np.ascontiguousarray(v)
        return hashlib.md5(a.dtype.str.encode() + str(a.shape).encode() + a.tobytes()).hexdigest()[:12]
    return repr(v)


def _epochs(L, it=None, epochs=2, start=0):
    out = [_digest(b) for b in (it if it is not None else L)]
    for ep in range(start + 1, epochs):
        L.set_epoch(ep)
        out += [_digest(b) for b in L]
    return out


def _hits(L):
    try:
        return int(L.stats().get("cache_hits") or 0)
    except Exception:  # noqa: BLE001 - a build without stats()
        return -1


def _build(name, D, cache=None, state=False):
    import pyarrow as pa
    import pyarrow.parquet as pq

    import pqloader
    import pqloader.transforms as T
    if name.startswith("state_mix"):
        a = pqloader.Loader(f"{D}/big", columns=["x", "i"], batch_size=64, shuffle=True, seed=1)
        b = pqloader.Loader(f"{D}/big", columns=["x", "i"], batch_size=64, shuffle=False)
        if name == "state_mix":
            return pqloader.mix({"a": a, "b": b}, {"a": 0.7, "b": 0.3}, seed=0)
        if name == "state_mix_last":
            c = pqloader.Loader(f"{D}/big", columns=["x", "i"], batch_size=16, shuffle=True, seed=2,
                                filter="x > 0.5")
            return pqloader.mix({"a": a, "b": b, "c": c}, {"a": 0.5, "b": 0.2, "c": 0.3}, seed=4,
                                samples_per_epoch=1500, stop="last", batch_size=48)
        return pqloader.mix([a, b], [0.4, 0.6], seed=3, output="torch", batch_size=32)
    if name == "state_petastorm":
        from pqloader.petastorm import make_batch_reader
        from pqloader.petastorm.pytorch import DataLoader
        r = make_batch_reader("file://" + f"{D}/num", schema_fields=["i64", "f64"], num_epochs=2,
                              shuffle_rows=True, seed=7)
        return DataLoader(r, batch_size=24, shuffling_queue_capacity=50)
    fillimg = pq.read_table(f"{D}/img/a.parquet").column("img")[0].as_py()
    name, extra = (STATE_CASES.get(name) or (name, {}))[:2]
    src, kws = cases(D, T, pa, fillimg, pqloader)[name]
    loaders = []
    for kw in (kws if isinstance(kws, list) else [kws]):
        kw = dict(kw, **extra)
        kw.setdefault("batch_size", 32)
        kw.setdefault("num_workers", 2)
        if cache and "cache_dir" not in kw:
            kw["cache_dir"] = cache
        loaders.append(pqloader.Loader(src, **kw))
    # a state case of several Loaders (ranks) saves the last one
    return loaders if not state and len(loaders) > 1 else loaders[-1]


def _job(job, D, at):
    import pickle
    name, mode = job["case"], job["mode"]
    obj = _build(name, D, job.get("cache"), state=mode != "run")
    if mode != "run" and not hasattr(obj, "state_dict"):
        raise TypeError(f"{type(obj).__name__} has no state_dict()")
    at[0] = "iter"  # errors before this point: the build refuses the options (n/a for an old one)
    if mode == "run":  # and the cache hits of each Loader's first epoch (entries the other build wrote)
        out, hits = [], 0
        for L in (obj if isinstance(obj, list) else [obj]):
            out += [_digest(b) for b in L]
            hits += _hits(L)
            out += _epochs(L, iter(()))
        return {"ok": out, "hits": hits}
    spec = STATE_CASES.get(name)
    start = spec[2] if spec and len(spec) > 2 else 0  # the epoch saved in
    epochs = 1 if name.startswith(("state_mix", "state_petastorm")) else start + 2
    if mode == "save":
        if start:
            obj.set_epoch(start)
        it = iter(obj)
        for _ in range(job["k"]):
            next(it)
        with open(job["path"], "wb") as f:
            pickle.dump(obj.state_dict(), f)
        return {"ok": _epochs(obj, it, epochs, start)}
    with open(job["path"], "rb") as f:
        obj.load_state_dict(pickle.load(f))
    return {"ok": _epochs(obj, None, epochs, start)}


def worker(jobs_file, out_file, D):
    with open(jobs_file) as f:
        jobs = json.load(f)
    with open(out_file, "a") as out:
        for job in jobs:
            at = ["init"]
            try:
                res = _job(job, D, at)
            except Exception as e:  # noqa: BLE001 - every error is a result
                res = {"err": f"{type(e).__name__}: {e}"[:400], "at": at[0]}
            out.write(json.dumps({"id": job["id"], **res}) + "\n")
            out.flush()


# --- driver ------------------------------------------------------------------------------
def _rel(p):
    p = os.path.abspath(p)
    return os.path.relpath(p, ROOT) if p.startswith(ROOT + os.sep) else p


def _run_worker(label, path, jobs, scratch, D, timeout):
    """Runs jobs in one build's subprocess; a job that crashes or hangs it is a result, the rest go on."""
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    if path:
        env["PYTHONPATH"] = os.path.abspath(path)
    results, todo = {}, list(jobs)
    while todo:
        jf, of = f"{scratch}/jobs-{label}.json", f"{scratch}/out-{label}.jsonl"
        with open(jf, "w") as f:
            json.dump(todo, f)
        open(of, "w").close()
        with open(f"{scratch}/err-{label}.txt", "w+") as err:
            p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", jf, of, D], env=env,
                                 cwd=scratch, stdout=subprocess.DEVNULL, stderr=err)
            try:
                why = f"worker exited {p.wait(timeout=timeout)}"
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                why = f"HANG: no result in {timeout} s"
            err.seek(0)
            why = f"CRASH ({why}: {err.read().strip()[-200:]})"
        with open(of) as f:
            for line in f:
                r = json.loads(line)
                results[r.pop("id")] = r
        todo = [j for j in todo if j["id"] not in results]
        if todo:  # the first job without a result is the one that stopped the worker
            results[todo.pop(0)["id"]] = {"err": why, "crash": True}
    return results


def run_phase(builds, scratch, D, timeout):
    """builds: {label: (pythonpath or None, jobs)}; the builds run side by side."""
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(len(builds)) as ex:
        futs = [ex.submit(_run_worker, lb, path, jobs, scratch, D, timeout) for lb, (path, jobs) in builds.items()]
        return {k: v for f in futs for k, v in f.result().items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="directory holding the old build's pqloader package")
    ap.add_argument("--new", default=None, help="directory of the new build (default: the installed one)")
    ap.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    ap.add_argument("--scratch", default=os.path.join(ROOT, "build", "crossbuild"))
    ap.add_argument("--k", type=int, default=3, help="batches read before state_dict()")
    ap.add_argument("--timeout", type=int, default=600, help="seconds a worker may go without finishing")
    a = ap.parse_args(argv)
    for d in filter(None, [a.old, a.new]):
        if not os.path.isfile(os.path.join(d, "pqloader", "__init__.py")):
            ap.error(f"{d}: no pqloader package in it (stage a build: docs/testing.md)")
    scratch = os.path.abspath(a.scratch)
    D = os.path.join(scratch, "data")
    stamp = os.path.join(D, ".version")
    if not (os.path.exists(stamp) and open(stamp).read() == DATA_VERSION):
        shutil.rmtree(D, ignore_errors=True)
        make_data(D)
        with open(stamp, "w") as f:
            f.write(DATA_VERSION)
    if not os.path.exists(os.path.join(D, "sumidx", "_pqloader_index")):  # `pqloader index`, by the new build
        env = dict(os.environ, **({"PYTHONPATH": os.path.abspath(a.new)} if a.new else {}))
        r = subprocess.run([sys.executable, "-m", "pqloader", "index", "-q", os.path.join(D, "sumidx")], env=env,
                           capture_output=True, text=True)
        if r.returncode:
            print(f"pqloader index failed ({r.stderr.strip()[-200:]}): summary_index reads footers")
    shutil.rmtree(os.path.join(scratch, "run"), ignore_errors=True)
    run = os.path.join(scratch, "run")
    os.makedirs(run)
    import pyarrow as pa
    all_cases = list(cases(D, _Stub(), pa, b"", _Stub())) + list(STATE_CASES)
    names = a.cases.split(",") if a.cases else all_cases
    bad = [c for c in names if c not in all_cases]
    if bad:
        ap.error(f"unknown case(s) {', '.join(bad)}; known: {', '.join(all_cases)}")
    builds = {"old": a.old, "new": a.new}
    p1 = {b: [] for b in builds}
    p2 = {b: [] for b in builds}
    other = {"old": "new", "new": "old"}
    for c in names:
        for b in builds:
            if c in STATE_CASES:
                st = f"{run}/state-{b}-{c}.pkl"
                p1[b].append({"id": f"{c}/{b}/save", "case": c, "mode": "save", "k": a.k, "path": st})
                p2[other[b]].append({"id": f"{c}/{b}>{other[b]}/load", "case": c, "mode": "load", "path": st})
                continue
            cache = f"{run}/cache-{b}-{c}"
            p1[b] += [{"id": f"{c}/{b}/plain", "case": c, "mode": "run"},
                      {"id": f"{c}/{b}/write", "case": c, "mode": "run", "cache": cache}]
            p2[other[b]].append({"id": f"{c}/{b}>{other[b]}/read", "case": c, "mode": "run", "cache": cache})
    R = run_phase({b: (builds[b], p1[b]) for b in builds}, run, D, a.timeout)
    R.update(run_phase({b: (builds[b], p2[b]) for b in builds}, run, D, a.timeout))
    rows, failed = [], False
    clean = (lambda s: s.replace(scratch, _rel(scratch)).replace(ROOT + os.sep, ""))
    for c in names:
        row, note = classify(c, R, c in STATE_CASES)
        failed |= any(x.startswith(("DIFF", "CRASH", "ERR")) for x in row)
        rows.append([c] + row + [clean(note)[:160]])
    hdr = (["case", "old>new", "new>old", "uncached", "note"])
    print(f"old = {_rel(a.old)}, new = {_rel(a.new) if a.new else 'installed pqloader'}, data = {_rel(D)}")
    w = [max(len(r[i]) for r in rows + [hdr]) for i in range(4)]
    for r in [hdr] + rows:
        print("  ".join(x.ljust(w[i]) for i, x in enumerate(r[:4])) + "  " + r[4])
    n = sum(1 for r in rows if "DIFF" in r[1] + r[2])
    print(f"{len(rows)} cases: {n} with a DIFF; " + ("FAILED" if failed else "OK"))
    return 1 if failed else 0


class _Stub:  # stands for pqloader.transforms where only the case names are needed
    __getattr__ = staticmethod(lambda name: lambda *a, **k: None)


def _eq(x, y):
    return x.get("ok", 0) == y.get("ok", 1) or ("err" in x and x.get("err") == y.get("err"))


def _short(r, ref=None):
    if "err" in r:
        return r["err"]
    d = f", {sum(x != y for x, y in zip(r['ok'], ref['ok']))} of them differ" if ref and "ok" in ref else ""
    return f"{len(r['ok'])} batches{d}"


def classify(c, R, state):
    """The row's cells (old>new, new>old, uncached) and a note."""
    if state:
        so, sn = R[f"{c}/old/save"], R[f"{c}/new/save"]
        if so.get("at") == "init" and "err" not in sn:
            return ["n/a"] * 3, f"old build refuses: {so['err']}"
        cells, notes = [], []
        for a, b, s in (("old", "new", so), ("new", "old", sn)):
            ld = R[f"{c}/{a}>{b}/load"]
            if "err" in s:
                cells.append("CRASH" if s.get("crash") else "ERR save")
                notes.append(f"{a} save: {s['err']}")
            elif "err" in ld:
                cells.append("CRASH" if ld.get("crash") else "refused")
                notes.append(f"{b} load: {ld['err']}")
            else:
                cells.append("SAME" if ld["ok"] == s["ok"] else f"DIFF ({len(s['ok'])} vs {len(ld['ok'])})")
        return cells + ["-"], "; ".join(notes)
    po, pn = R[f"{c}/old/plain"], R[f"{c}/new/plain"]
    wo, wn = R[f"{c}/old/write"], R[f"{c}/new/write"]
    ron, rno = R[f"{c}/old>new/read"], R[f"{c}/new>old/read"]
    if po.get("at") == "init" and "err" not in pn:
        return ["n/a"] * 3, f"old build refuses: {po['err']}"
    fwd = "CRASH" if ron.get("crash") or wo.get("crash") or pn.get("crash") else "SAME" if _eq(ron, pn) else "DIFF"
    if rno.get("crash") or wn.get("crash") or po.get("crash"):
        rev = "CRASH"
    elif _eq(rno, po):
        rev = "SAME"
    else:
        rev = "refused" if "err" in rno and "ok" in po else "DIFF"
    note = ""
    crashed = [f"{k}: {r['err']}" for k, r in (("old writing", wo), ("new reading", ron), ("new uncached", pn),
                                               ("new writing", wn), ("old reading", rno), ("old uncached", po))
               if r.get("crash")]
    if crashed:
        note = "; ".join(crashed)
    elif fwd != "SAME":
        note = f"new from old cache: {_short(ron, pn)}; new uncached: {_short(pn)}"
    elif rev != "SAME":
        note = f"old from new cache: {_short(rno, po)}; old uncached: {_short(po)}"
    elif c not in NO_PERSISTENCE and 0 in (ron.get("hits"), rno.get("hits")):
        # SAME, but one build served nothing the other wrote (a key that changed, or no entry):
        # the row checks nothing across builds
        note = f"no cache hit in old>new ({ron.get('hits')}) or new>old ({rno.get('hits')}): key changed?"
    elif "err" in pn:
        note = f"({'both raise' if 'err' in po else 'new raises'}: {pn['err']})"
    return [fwd, rev, "same" if _eq(po, pn) else "changed"], note


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:])
        sys.exit(0)
    sys.exit(main())
