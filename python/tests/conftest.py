"""Shared fixtures and helpers for the pqloader test suite.

Everything here builds small datasets in ``tmp_path`` from seeded numpy
generators; no binary fixtures are checked in.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


def find_conformance_dir() -> Path | None:
    """Where Apache's parquet-testing corpus is, or None.

    Looked for, in order: ``$PQLOADER_CONFORMANCE_DIR``; ``python/tests/data/parquet-testing``
    in this checkout; ``shared/conformance/parquet-testing`` beside this checkout or any
    directory above it (so git worktrees nested deeper find it too).
    """
    env = os.environ.get("PQLOADER_CONFORMANCE_DIR")
    if env:
        return Path(env)
    candidates = [REPO_ROOT / "python" / "tests" / "data" / "parquet-testing"]
    candidates += [up / "shared" / "conformance" / "parquet-testing" for up in REPO_ROOT.parents]
    return next((c for c in candidates if (c / "data").is_dir()), None)


# ---------------------------------------------------------------------------
# environment hygiene
# ---------------------------------------------------------------------------


def pytest_configure(config):
    """Under `make sanitize-python`, make sure the sanitized extension is the one tested."""
    if os.environ.get("PQLOADER_EXPECT_SANITIZED"):
        from pqloader import _core

        if "sanitize-py" not in _core.__file__:
            raise pytest.UsageError(f"expected the ASan build of pqloader._core, got {_core.__file__}")


@pytest.fixture(autouse=True)
def _no_distributed_env(monkeypatch):
    """RANK / WORLD_SIZE from the outer environment must not leak into tests."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)


# ---------------------------------------------------------------------------
# writing data
# ---------------------------------------------------------------------------


def write_parquet(path, table: pa.Table, row_group_sizes: Sequence[int] | None = None, **writer_kwargs) -> Path:
    """Write ``table`` to ``path`` with *exactly* the given row-group sizes.

    ``row_group_sizes`` must sum to ``table.num_rows``; ``None`` means one
    row group.  Extra keyword arguments go to ``pq.ParquetWriter``
    (compression, use_dictionary, ...).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if row_group_sizes is None:
        row_group_sizes = [table.num_rows]
    assert sum(row_group_sizes) == table.num_rows, (row_group_sizes, table.num_rows)
    with pq.ParquetWriter(str(path), table.schema, **writer_kwargs) as w:
        start = 0
        for n in row_group_sizes:
            w.write_table(table.slice(start, n), row_group_size=max(n, 1))
            start += n
    md = pq.ParquetFile(str(path)).metadata
    assert [md.row_group(i).num_rows for i in range(md.num_row_groups)] == [n for n in row_group_sizes if n > 0] or (
        table.num_rows == 0
    )
    return path


def id_table(n: int, start: int = 0, seed: int = 0) -> pa.Table:
    """A small mixed table whose ``id`` column is start..start+n-1."""
    rng = np.random.default_rng(seed + 7919 * start)
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table(
        {
            "id": pa.array(ids),
            "x": pa.array(rng.standard_normal(n).astype(np.float32)),
            "k": pa.array(rng.integers(-1000, 1000, n, dtype=np.int32)),
            "s": pa.array([f"s{i}" for i in ids], type=pa.string()),
            "v": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 3).astype(np.float64) * 0.5), 3),
        }
    )


def write_dataset(
    root,
    layout: Sequence[Sequence[int]],
    make_table: Callable[[int, int, int], pa.Table] = id_table,
    *,
    name: str = "part-{i:03d}.parquet",
    seed: int = 0,
    **writer_kwargs,
) -> list[Path]:
    """Write one file per entry of ``layout`` (a list of row-group sizes).

    Rows are numbered consecutively across files in natural order, so with
    the default ``id_table`` the ``id`` column of the whole dataset is
    0..N-1 in natural order.  Returns the file paths in natural order.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    start = 0
    for i, rgs in enumerate(layout):
        n = int(sum(rgs))
        t = make_table(n, start, seed)
        paths.append(write_parquet(root / name.format(i=i), t, list(rgs), **writer_kwargs))
        start += n
    return paths


def random_layout(rng: np.random.Generator, num_files: int, rg_min: int, rg_max: int, max_rgs: int) -> list[list[int]]:
    return [
        [int(x) for x in rng.integers(rg_min, rg_max + 1, int(rng.integers(1, max_rgs + 1)))] for _ in range(num_files)
    ]


def read_expected(paths: Iterable, columns=None) -> pa.Table:
    """pyarrow's view of the files, concatenated in the given order."""
    tables = [pq.read_table(str(p), columns=columns) for p in paths]
    return pa.concat_tables(tables)


# ---------------------------------------------------------------------------
# converting Arrow data the way pqloader's contract says
# ---------------------------------------------------------------------------

_INT_LIKE_BITS = {
    pa.types.is_timestamp: 64,
    pa.types.is_date64: 64,
    pa.types.is_date32: 32,
    pa.types.is_time32: 32,
    pa.types.is_time64: 64,
    pa.types.is_duration: 64,
}


def _is_text(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t) or pa.types.is_string_view(t) or pa.types.is_binary_view(t)
            or pa.types.is_fixed_size_binary(t))


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _is_tensor_element(t: pa.DataType) -> bool:
    """Whether list elements of type ``t`` become one numeric/bool array (README type table)."""
    return _is_numeric(t) or pa.types.is_boolean(t) or any(pred(t) for pred in _INT_LIKE_BITS)


def classify_type(t: pa.DataType) -> str:
    """How the contract (README, "What a batch holds") treats an Arrow type.

    'scalar'       → 1-D numpy array or list[str]/list[bytes] (fixed_size_binary: bytes)
    'fsl'          → N-D numpy array (elements: number, bool or temporal)
    'list'         → (B, L) numpy array if all rows have one length, else an error
    'unsupported'  → UnsupportedTypeError (structs, maps, decimals, null, lists of
                     anything but numbers, bools and temporals)
    """
    if pa.types.is_dictionary(t):
        return classify_type(t.value_type)
    if pa.types.is_struct(t):
        return "struct"  # its leaves, by dotted path
    if pa.types.is_decimal(t) or pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return "scalar"  # decimals as float64 (pyarrow's cast), views as str / bytes
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_text(t.value_type):
        return "strlist"  # list of lists of str / bytes
    if (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_boolean(t)
        or t in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary())
        or pa.types.is_fixed_size_binary(t)
        or any(pred(t) for pred in _INT_LIKE_BITS)
    ):
        return "scalar"
    if pa.types.is_fixed_size_list(t):
        inner = t
        while pa.types.is_fixed_size_list(inner):
            inner = inner.value_type
        return "fsl" if _is_tensor_element(inner) else "unsupported"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return "list" if _is_tensor_element(t.value_type) else "unsupported"
    return "unsupported"


def type_keyword(t: pa.DataType) -> str:
    """A short lowercase word that an error message about type ``t`` should contain."""
    s = str(t)
    for sep in "<([":
        s = s.split(sep)[0]
    s = s.strip().lower()
    if s.startswith("decimal"):
        return "decimal"
    if s == "halffloat":
        return "float16"
    return s


def _nested_null_count(arr: pa.Array) -> int:
    n = arr.null_count
    t = arr.type
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        n += _nested_null_count(pc.list_flatten(arr))
    return n


def column_null_count(col: pa.ChunkedArray) -> int:
    return sum(_nested_null_count(c) for c in col.chunks)


def uniform_list_length(col: pa.ChunkedArray):
    """The common length of all rows of a list column, or None if they differ."""
    lens = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    if len(lens) == 0:
        return 0
    return int(lens[0]) if np.all(lens == lens[0]) else None


def to_expected(col) -> np.ndarray | list:
    """Convert a pyarrow (Chunked)Array to what pqloader must return for it."""
    if isinstance(col, pa.ChunkedArray):
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        if col.num_chunks == 0:
            arr = pa.array([], type=col.type)
    else:
        arr = col
    t = arr.type
    if pa.types.is_dictionary(t):
        arr = arr.dictionary_decode()
        t = arr.type
    for pred, bits in _INT_LIKE_BITS.items():
        if pred(t):
            return np.asarray(arr.cast(pa.int64() if bits == 64 else pa.int32()).to_numpy(zero_copy_only=False))
    if pa.types.is_boolean(t):
        return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.bool_)
    if pa.types.is_decimal(t):
        return arr.cast(pa.float64()).to_numpy(zero_copy_only=False)
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return arr.to_pylist()
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and _is_text(t.value_type):
        return arr.to_pylist()
    if _is_numeric(t):
        out = arr.to_numpy(zero_copy_only=False)
        assert out.dtype == np.dtype(t.to_pandas_dtype()), (out.dtype, t)
        return out
    if t in (pa.string(), pa.large_string(), pa.binary(), pa.large_binary()) or pa.types.is_fixed_size_binary(t):
        return arr.to_pylist()
    if pa.types.is_fixed_size_list(t):
        shape = []
        inner = arr
        while pa.types.is_fixed_size_list(inner.type):
            shape.append(inner.type.list_size)
            inner = inner.flatten()
        values = to_expected(inner)
        return np.asarray(values).reshape((len(arr), *shape))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        length = uniform_list_length(pa.chunked_array([arr]))
        assert length is not None, "non-uniform list has no expected array"
        values = to_expected(pc.list_flatten(arr))
        return np.asarray(values).reshape((len(arr), length))
    raise AssertionError(f"no expected conversion for {t}")


def table_to_expected(table: pa.Table) -> dict:
    return {name: to_expected(table.column(name)) for name in table.column_names}


# ---------------------------------------------------------------------------
# consuming loaders
# ---------------------------------------------------------------------------


def batch_len(batch: dict) -> int:
    lens = {len(v) for v in batch.values()}
    assert len(lens) == 1, f"columns of one batch have different lengths: {lens}"
    return lens.pop()


def concat_batches(batches: Sequence[dict]) -> dict:
    """Concatenate batches into one dict of arrays (numeric) or lists (str/bytes)."""
    if not batches:
        return {}
    out = {}
    for name in batches[0]:
        parts = [b[name] for b in batches]
        if isinstance(parts[0], list):
            merged = []
            for p in parts:
                assert isinstance(p, list), f"column {name!r} changes container type between batches"
                merged.extend(p)
            out[name] = merged
        else:
            assert all(isinstance(p, np.ndarray) for p in parts), name
            assert len({p.dtype for p in parts}) == 1, f"column {name!r} changes dtype between batches"
            out[name] = np.concatenate(parts, axis=0)
    return out


def collect(loader) -> dict:
    """One ``iter()`` pass over ``loader`` concatenated into a dict of columns."""
    return concat_batches(list(loader))


def ids_of(batches: Sequence[dict], column: str = "id") -> list[int]:
    out: list[int] = []
    for b in batches:
        out.extend(int(x) for x in b[column])
    return out


def split_epochs(batches: Sequence[dict], batches_per_epoch: int) -> list[list[dict]]:
    return [list(batches[i : i + batches_per_epoch]) for i in range(0, len(batches), batches_per_epoch)]


# ---------------------------------------------------------------------------
# exact comparisons
# ---------------------------------------------------------------------------


def assert_column_equal(actual, expected, name: str = "") -> None:
    if isinstance(expected, list):
        assert isinstance(actual, list), f"{name}: expected a list, got {type(actual).__name__}"
        assert len(actual) == len(expected), f"{name}: {len(actual)} rows != {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert type(a) is type(e) and a == e, f"{name}[{i}]: {a!r} != {e!r}"
        return
    assert isinstance(actual, np.ndarray), f"{name}: expected ndarray, got {type(actual).__name__}"
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{name}: shape {actual.shape} != {expected.shape}"
    if expected.dtype.kind == "f":
        # bit-exact, which is also NaN-aware
        width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[expected.dtype.itemsize]
        a_bits = np.ascontiguousarray(actual).view(width)
        e_bits = np.ascontiguousarray(expected).view(width)
        if not np.array_equal(a_bits, e_bits):
            np.testing.assert_array_equal(actual, expected, err_msg=name)  # readable diff
            bad = np.flatnonzero((a_bits != e_bits).reshape(len(a_bits), -1).any(axis=1))
            raise AssertionError(f"{name}: float bit patterns differ at rows {bad[:10].tolist()}")
    else:
        np.testing.assert_array_equal(actual, expected, err_msg=name, strict=True)


def assert_columns_equal(actual: dict, expected: dict, ordered: bool = True) -> None:
    if ordered:
        assert list(actual.keys()) == list(expected.keys()), (list(actual), list(expected))
    else:
        assert sorted(actual.keys()) == sorted(expected.keys()), (list(actual), list(expected))
    for name in expected:
        assert_column_equal(actual[name], expected[name], name)


def assert_batch_streams_equal(a: Sequence[dict], b: Sequence[dict]) -> None:
    assert len(a) == len(b), f"{len(a)} batches != {len(b)} batches"
    for i, (x, y) in enumerate(zip(a, b)):
        assert list(x.keys()) == list(y.keys()), f"batch {i}: keys differ"
        for name in y:
            assert_column_equal(x[name], y[name], f"batch {i} column {name}")


def assert_batch_sizes(batches: Sequence[dict], batch_size: int, total_rows: int, drop_last: bool = False) -> None:
    sizes = [batch_len(b) for b in batches]
    full, rem = divmod(total_rows, batch_size)
    expected = [batch_size] * full + ([] if drop_last or rem == 0 else [rem])
    assert sizes == expected


# ---------------------------------------------------------------------------
# hang guard (per operation; pytest-timeout in pyproject.toml is the global backstop)
# ---------------------------------------------------------------------------


def run_with_timeout(fn: Callable[[], object], timeout: float = 60.0):
    """Run ``fn`` in a daemon thread; fail the test if it does not finish.

    Returns fn's result, re-raises its exception.
    """
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(timeout)
    if th.is_alive():
        pytest.fail(f"operation did not finish within {timeout}s (hang?)")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def get_shard_info(loader) -> dict:
    info = getattr(loader, "shard_info", None)
    if info is None:
        stats = loader.stats()
        info = stats.get("shard_info", stats.get("shard", stats))
    assert "dropped" in info and "padded" in info, f"no shard info reported: {info!r}"
    return {"dropped": int(info["dropped"]), "padded": int(info["padded"])}


def subprocess_env(tmp: Path | str | None = None) -> dict:
    """os.environ without RANK / WORLD_SIZE; with `tmp`, TMPDIR set to it (torchrun's
    log directories, `torchelastic_*`, are made there instead of left in /tmp)."""
    env = dict(os.environ)
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    return env


def run_beside_a_held_lock_on_a_read_only_cache(tmp_path: Path, lock: str, script: str, *args: str):
    """Run `script` (python -c, argv: *args, then the cache directory) while this process
    holds the flock of `lock` (a path inside the cache directory, made first) on a tmpfs
    remounted read-only: a node's other rank doing the work the lock is for, in a cache
    directory this process cannot write to. Returns the finished subprocess (a 120 s
    hang guard). Skips where no tmpfs can be mounted (not root)."""
    import fcntl
    import subprocess
    import sys
    mount = tmp_path / "mnt"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        lock_path = mount / "cache" / lock
        lock_path.parent.mkdir(parents=True)
        lock_path.touch()
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        with open(lock_path, "rb") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            return subprocess.run([sys.executable, "-c", script, *args, str(mount / "cache")],
                                  capture_output=True, text=True, env=subprocess_env(), timeout=120)
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def wrap_seed(seed, wrap):
    """WrapSeed of mix/mix_stream.h: the seed of a source's wrap-th reread of an epoch."""
    if wrap == 0:
        return seed
    m = (1 << 64) - 1
    z = (seed + wrap * 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)
