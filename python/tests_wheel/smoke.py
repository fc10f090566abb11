"""Smoke suite run by the installed wheel in a fresh virtualenv (python/tests_wheel).

Runs inside one of the wheel test environments (Petastorm's own: pyarrow 14 + NumPy
1.26; the newest pyarrow + NumPy 2; no pyarrow), never in the development .venv:
it imports nothing of the repository, only the installed `pqloader`. The harness
(test_wheel.py) writes the datasets and the expected values, serves the S3 bucket, and
reads the JSON this prints: {check: "ok" | traceback}.

Usage: python smoke.py SPEC_JSON [--pyarrow-first | --pyarrow-global]
  SPEC_JSON: {"data": dir, "s3": {"url": ..., "storage_options": {...}}}
  --pyarrow-first: import pyarrow (parquet, fs, compute) and petastorm, where installed,
  before pqloader, so the process holds pyarrow's Arrow before pqloader's.
  --pyarrow-global: the same with pyarrow loaded RTLD_GLOBAL (its Arrow symbols in the
  global scope, ahead of pqloader's).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
import time
import traceback

PYARROW_GLOBAL = "--pyarrow-global" in sys.argv
PYARROW_FIRST = "--pyarrow-first" in sys.argv or PYARROW_GLOBAL
if PYARROW_GLOBAL:  # pyarrow's Arrow in the global scope: pqloader must load with DEEPBIND
    sys.setdlopenflags(os.RTLD_NOW | os.RTLD_GLOBAL)
if PYARROW_FIRST:
    import pyarrow  # noqa: F401
    import pyarrow.compute  # noqa: F401
    import pyarrow.fs  # noqa: F401
    import pyarrow.parquet  # noqa: F401
    try:
        import petastorm  # noqa: F401
    except ImportError:
        pass

if PYARROW_GLOBAL:
    sys.setdlopenflags(os.RTLD_NOW)

_t0 = time.perf_counter()
import pqloader  # noqa: E402
from pqloader import transforms as T  # noqa: E402
IMPORT_SECONDS = time.perf_counter() - _t0

import numpy as np  # noqa: E402

SPEC = json.loads(open(sys.argv[1]).read())
DATA = SPEC["data"]
EXPECTED = np.load(os.path.join(DATA, "expected.npz"))
TAB = os.path.join(DATA, "tab")
IMG = os.path.join(DATA, "img")


def _has(module: str) -> bool:
    """Whether `module` is installed (without importing it)."""
    return importlib.util.find_spec(module) is not None


def _ids(loader) -> np.ndarray:
    return np.concatenate([b["id"] for b in loader])


def check_import_is_lean():
    """pqloader imports neither pyarrow nor torch, and uses RTLD_DEEPBIND only beside an
    Arrow loaded RTLD_GLOBAL."""
    assert pqloader._native.LOADED_WITH_DEEPBIND == PYARROW_GLOBAL
    if not PYARROW_FIRST:
        assert "pyarrow" not in sys.modules, "import pqloader imported pyarrow"
    assert "torch" not in sys.modules, "import pqloader imported torch"
    assert pqloader.Loader(TAB, batch_size=5) is not None
    if not PYARROW_FIRST:
        assert "pyarrow" not in sys.modules, "making a Loader imported pyarrow"


def check_load_and_shuffle():
    loader = pqloader.Loader(TAB, batch_size=7, shuffle=True, seed=7, num_workers=2)
    batches = list(loader)
    ids = np.concatenate([b["id"] for b in batches])
    assert sorted(ids.tolist()) == list(range(len(EXPECTED["tab_ids"]))), "not a permutation"
    # The order for seed 7 is the one the development build produced: same on every NumPy.
    np.testing.assert_array_equal(ids, EXPECTED["order_seed7"])
    for b in batches:
        np.testing.assert_array_equal(b["x"], (b["id"] * 0.5).astype(np.float32))
        assert b["name"] == [f"row{i}" for i in b["id"].tolist()]
        assert b["vec"].shape == (len(b["id"]), 3) and b["vec"].dtype == np.float64
    again = _ids(pqloader.Loader(TAB, batch_size=7, shuffle=True, seed=7, num_workers=1))
    np.testing.assert_array_equal(again, ids)


def check_jpeg_png_transforms():
    loader = pqloader.Loader(IMG, batch_size=4, transforms={
        "jpeg": [T.DecodeImage()], "png": [T.DecodeImage()]})
    jpeg = np.concatenate([b["jpeg"] for b in loader])
    loader = pqloader.Loader(IMG, batch_size=4, transforms={"png": [T.DecodeImage()]},
                             columns=["png"])
    png = np.concatenate([b["png"] for b in loader])
    np.testing.assert_array_equal(png, EXPECTED["png_pil"])  # PNG equals PIL exactly
    diff = np.abs(jpeg.astype(np.int16) - EXPECTED["jpeg_pil"].astype(np.int16))
    assert diff.max() <= 2, f"JPEG differs from PIL by {diff.max()}"
    loader = pqloader.Loader(IMG, batch_size=4, shuffle=True, seed=3, transforms={
        "jpeg": [T.DecodeImage(), T.Resize(16), T.CenterCrop(16), T.RandomHorizontalFlip(),
                 T.Normalize([0.5, 0.5, 0.5], [0.25, 0.25, 0.25]), T.ToCHW()]})
    out = np.concatenate([b["jpeg"] for b in loader])
    np.testing.assert_array_equal(out, EXPECTED["jpeg_pipeline"])


def check_cache():
    with tempfile.TemporaryDirectory() as cache:
        kwargs = dict(batch_size=8, shuffle=True, seed=5, cache_dir=cache,
                      transforms={"png": [T.DecodeImage(), T.Resize(8)]}, columns=["id", "png"])
        # Closed before the directory goes: each reads the next epoch ahead meanwhile.
        with pqloader.Loader(IMG, **kwargs) as first:
            a = [b["png"] for b in first]
        with pqloader.Loader(IMG, **kwargs) as second:
            b = [x["png"] for x in second]
        stats = second.stats()
        assert stats["cache_hits"] > 0 and stats["cache_misses"] == 0, stats
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
        assert pqloader.cache_stats(cache)["entries"] > 0


def check_torch_output():
    import torch
    loader = pqloader.Loader(TAB, batch_size=16, output="torch", columns=["id", "x", "vec"])
    for b in loader:
        assert isinstance(b["id"], torch.Tensor) and b["id"].dtype == torch.int64
        assert torch.equal(b["x"], (b["id"] * 0.5).to(torch.float32))
        assert tuple(b["vec"].shape) == (len(b["id"]), 3)


def check_s3():
    s3 = SPEC["s3"]
    loader = pqloader.Loader(s3["url"], batch_size=9, shuffle=True, seed=7,
                             storage_options=s3["storage_options"])
    ids = _ids(loader)
    assert sorted(ids.tolist()) == list(range(len(EXPECTED["tab_ids"])))
    info = pqloader.inspect(s3["url"], storage_options=s3["storage_options"])
    assert info["num_rows"] == len(EXPECTED["tab_ids"])


def check_arrow_schema():
    schema = pqloader.Loader(TAB, batch_size=5).arrow_schema
    capsule = schema.__arrow_c_schema__()
    import ctypes
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    assert get_name(capsule) == b"arrow_schema"
    if not _has("pyarrow"):
        try:
            schema.to_pyarrow()
        except ImportError as e:
            assert "pqloader[arrow]" in str(e), e
        else:
            raise AssertionError("to_pyarrow() without pyarrow did not raise ImportError")
        return
    import pyarrow as pa
    import pyarrow.parquet as pq
    files = sorted(os.listdir(TAB))
    expected = pq.read_schema(os.path.join(TAB, files[0]))
    got = schema.to_pyarrow()
    assert got.names == expected.names and got.types == expected.types, (got, expected)
    if hasattr(pa.Schema, "__arrow_c_schema__") and int(pa.__version__.split(".")[0]) >= 15:
        assert pa.schema(schema).equals(got)  # the protocol itself (pa.schema takes it from 15)


def check_declared_schema():
    """schema= takes any Arrow schema through __arrow_c_schema__: pqloader's own (no
    pyarrow needed) and, where installed, a pyarrow.Schema of that pyarrow's version."""
    mine = pqloader.Loader(TAB, batch_size=5, columns=["id", "x"]).arrow_schema
    ids = _ids(pqloader.Loader(TAB, batch_size=7, schema=mine))
    np.testing.assert_array_equal(ids, np.arange(len(EXPECTED["tab_ids"])))
    if not _has("pyarrow"):
        assert "pyarrow" not in sys.modules
        return
    import pyarrow as pa
    batches = list(pqloader.Loader(TAB, batch_size=7, schema=pa.schema([("id", pa.float64())])))
    assert list(batches[0]) == ["id"] and batches[0]["id"].dtype == np.float64
    np.testing.assert_array_equal(np.concatenate([b["id"] for b in batches]),
                                  np.arange(len(EXPECTED["tab_ids"]), dtype=np.float64))


def check_pyarrow_in_same_process():
    """pyarrow (another Arrow C++) works beside pqloader's, on the same files and server."""
    if not _has("pyarrow"):
        return
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    table = pq.read_table(TAB)
    by_id = dict(zip(table["id"].to_pylist(), table["name"].to_pylist()))
    for b in pqloader.Loader(TAB, batch_size=11, shuffle=True, seed=2):
        assert [by_id[i] for i in b["id"].tolist()] == b["name"]
    assert pc.sum(table["id"]).as_py() == int(EXPECTED["tab_ids"].sum())
    s3 = SPEC["s3"]
    o = s3["storage_options"]
    fs = pafs.S3FileSystem(endpoint_override=o["endpoint_override"], scheme=o["scheme"],
                           region=o["region"], access_key=o["access_key"],
                           secret_key=o["secret_key"])
    bucket_path = s3["url"][len("s3://"):]
    infos = fs.get_file_info(pafs.FileSelector(bucket_path))
    assert len(infos) == len(os.listdir(TAB)), infos
    remote = pq.read_table(bucket_path, filesystem=fs)
    assert remote.num_rows == table.num_rows
    ids = _ids(pqloader.Loader(s3["url"], batch_size=9, storage_options=o))
    assert sorted(ids.tolist()) == sorted(remote["id"].to_pylist())
    assert pa.array(ids).sum().as_py() == int(EXPECTED["tab_ids"].sum())


def check_pyarrow_objects_in():
    """pyarrow objects handed to pqloader (a retry strategy, a filesystem for
    pqloader.petastorm) work whatever the pyarrow version: they are read in Python."""
    if not _has("pyarrow"):
        return
    import pyarrow.fs as pafs
    from pqloader.petastorm import make_reader as pq_make_reader
    s3 = SPEC["s3"]
    o = s3["storage_options"]
    retry = pafs.AwsStandardS3RetryStrategy(max_attempts=2)
    ids = _ids(pqloader.Loader(s3["url"], batch_size=9, storage_options={**o, "retry_strategy": retry}))
    assert sorted(ids.tolist()) == list(range(len(EXPECTED["tab_ids"])))
    fs = pafs.S3FileSystem(endpoint_override=o["endpoint_override"], scheme=o["scheme"],
                           region=o["region"], access_key=o["access_key"], secret_key=o["secret_key"])
    fields = ["id", "name", "u8", "matrix"]
    with pq_make_reader(s3["petastorm_url"], filesystem=fs, schema_fields=fields,
                        shuffle_row_groups=False) as reader:
        remote = {row.id: row for row in reader}
    with pq_make_reader("file://" + os.path.join(DATA, "petastorm_codecs"), schema_fields=fields,
                        shuffle_row_groups=False) as reader:
        local = {row.id: row for row in reader}
    assert remote.keys() == local.keys() and len(local) > 0
    for i, row in local.items():
        for f in fields:
            np.testing.assert_array_equal(np.asarray(getattr(row, f)), np.asarray(getattr(remote[i], f)))


def check_petastorm_side_by_side():
    """Petastorm's own make_reader and pqloader.petastorm's, in one process, agree."""
    if not _has("petastorm"):
        return
    import petastorm
    from pqloader.petastorm import make_reader as pq_make_reader
    url = "file://" + os.path.join(DATA, "petastorm_codecs")
    # Images too: Petastorm decodes them with OpenCV (its own libjpeg/libpng in the
    # process), pqloader with the libraries its wheel carries.
    fields = ["id", "name", "u8", "f32", "flag", "matrix", "image_png", "gray_png", "image_jpeg"]
    with petastorm.make_reader(url, schema_fields=fields, reader_pool_type="dummy",
                               shuffle_row_groups=False) as reader:
        theirs = {row.id: row for row in reader}
    with pq_make_reader(url, schema_fields=fields, shuffle_row_groups=False) as reader:
        ours = {row.id: row for row in reader}
    assert theirs.keys() == ours.keys() and len(ours) > 0
    for i, row in ours.items():
        for f in fields:
            np.testing.assert_array_equal(np.asarray(getattr(row, f)), np.asarray(getattr(theirs[i], f)))


def _filters(pa, pc):
    """Filters of the kinds users write, each made by this environment's pyarrow, and the
    ids of the tab dataset (x = id / 2, name = f"row{id}") each keeps, in plain Python."""
    f = pc.field
    long_set = list(range(0, 150, 3))  # past the 20 values Arrow prints: the state hashes it
    return {
        "compare": ((f("id") >= 10) & (f("x") < pa.scalar(30.0, pa.float32())), lambda i: 10 <= i < 60),
        "isin_long": (f("id").isin(long_set), lambda i: i in long_set),
        "isin_null_skip": (pc.is_in(f("id"), value_set=pa.array([4, None]), skip_nulls=True), lambda i: i == 4),
        "not_isin_null": (~f("id").isin([4, None]), lambda i: i != 4),
        "string": (pc.starts_with(f("name"), "row1") & (pc.utf8_length(f("name")) == 5), lambda i: 10 <= i <= 19),
        "arith_cast": ((pc.multiply_checked(f("id"), 2) + 1).cast(pa.string()) == "21", lambda i: i == 10),
        # PadOptions gained lean_left_on_odd_padding after pyarrow 14: such filters of
        # pyarrow 14 were refused ("Cannot deserialize field ...") until _filter added it.
        "pad": (pc.utf8_center(f("name"), 7, "_") == "_row12_", lambda i: i == 12),
        "text": ("id in [1, 2, 3] or name == 'row7'", lambda i: i in (1, 2, 3, 7)),
    }


def check_filters_across_pyarrow():
    """A filter made by this pyarrow (14 through 26) keeps the rows the engine's Arrow 25
    would, and a state saved by the development build (pyarrow 25) with the same filter
    resumes here (a state of a long value set was refused: its hash was of the bytes
    that each pyarrow version writes differently)."""
    if not _has("pyarrow"):
        return
    import pyarrow as pa
    import pyarrow.compute as pc
    everything = EXPECTED["tab_ids"].tolist()
    for name, (expr, keeps) in _filters(pa, pc).items():
        got = sorted(_ids(pqloader.Loader(TAB, columns=["id"], batch_size=1000, filter=expr)).tolist())
        assert got == [i for i in everything if keeps(i)], name
    saved_path = os.path.join(DATA, "filter_state.json")
    if not os.path.exists(saved_path):  # (an older harness)
        return
    saved = json.loads(open(saved_path).read())
    loader = pqloader.Loader(TAB, columns=["id"], batch_size=4, shuffle=True, seed=5,
                             filter=_filters(pa, pc)["isin_long"][0])
    loader.load_state_dict(saved["state"])
    assert _ids(loader).tolist() == saved["rest"]


CHECKS = [check_import_is_lean, check_load_and_shuffle, check_jpeg_png_transforms, check_cache,
          check_torch_output, check_s3, check_arrow_schema, check_declared_schema,
          check_pyarrow_in_same_process,
          check_pyarrow_objects_in, check_petastorm_side_by_side, check_filters_across_pyarrow]


def main() -> int:
    results = {"import_seconds": IMPORT_SECONDS, "numpy": np.__version__,
               "pyarrow": importlib.metadata.version("pyarrow") if _has("pyarrow") else None}
    for check in CHECKS:
        try:
            check()
            results[check.__name__] = "ok"
        except BaseException:  # noqa: BLE001 - every failure is reported to the harness
            results[check.__name__] = traceback.format_exc()
    print("SMOKE-RESULTS " + json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
