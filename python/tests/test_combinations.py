"""Options combined: every batch checked value by value against the table itself.

Each option has tests of its own; the bugs found late sat where two met (a per-sample
Cast on one of several number columns of a shuffled loader read a buffer the shuffled
units had moved: a segfault). Here shuffle x cache x a Cast x padded lists x stack x
threads, over a table of number, list, fixed-size list, string and nullable (masked)
columns: each row's values equal the table's row of its id, every id comes once per
epoch, and the order does not depend on the thread count.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from pqloader import transforms as T

from conftest import write_dataset


def table(n: int, start: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed + start)
    ids = np.arange(start, start + n, dtype=np.int64)
    lengths = rng.integers(0, 7, n)
    return pa.table({
        "id": ids,
        "f": rng.standard_normal(n).astype(np.float32),
        "d": rng.standard_normal(n),
        "k": rng.integers(-50, 50, n, dtype=np.int32),
        "v": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(3 * n).astype(np.float32)), 3),
        "tok": pa.array([list(range(int(i), int(i) + int(m))) for i, m in zip(ids, lengths)], pa.list_(pa.int32())),
        "s": [f"s{i}" for i in ids],
        "m": pa.array(np.where(ids % 7 == 3, np.nan, ids * 0.5).astype(np.float32), from_pandas=True),
    })


LAYOUT = [[300, 211], [64], [400, 25, 100]]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("combinations")
    paths = write_dataset(root, LAYOUT, table)
    whole = pa.concat_tables(pq.read_table(p) for p in paths)
    return root, whole


CASES = list(itertools.product([False, True], [None, ":memory:"], [False, True], [False, True], [False, True]))


def options(shuffle, cache, cast, pad, stack):
    o = dict(batch_size=50, shuffle=shuffle, seed=3, shuffle_window=2, num_epochs=2, cache_dir=cache,
             null_mask=["m"], fill_null={"m": -1.0})
    if cast:
        o["transforms"] = {"d": [T.Cast("float32")]}
    o["lists"] = {"tok": pqloader.Pad(length=5) if pad else "ragged"}
    if stack:
        o["stack"] = {"fd": ["f", "d"]} if cast else {"fv": ["f"], "kk": ["k"]}
    return o


def expected_rows(whole: pa.Table):
    cols = {name: whole[name].to_numpy(zero_copy_only=False) for name in ("id", "f", "d", "k", "s")}
    cols["v"] = np.stack(whole["v"].to_numpy(zero_copy_only=False))
    cols["tok"] = whole["tok"].to_pylist()
    return cols


def check_batch(batch: dict, want: dict, cast: bool, pad: bool, stack: bool) -> np.ndarray:
    ids = batch["id"]
    f, d, k = want["f"][ids], want["d"][ids], want["k"][ids]
    if cast:
        d = d.astype(np.float32)
    if stack and cast:
        np.testing.assert_array_equal(batch["fd"], np.stack([f, d], axis=1))
        assert "f" not in batch and "d" not in batch
    elif stack:
        np.testing.assert_array_equal(batch["fv"], f[:, None])
        np.testing.assert_array_equal(batch["kk"], k[:, None])
        np.testing.assert_array_equal(batch["d"], d)
    else:
        np.testing.assert_array_equal(batch["f"], f)
        np.testing.assert_array_equal(batch["d"], d)
        np.testing.assert_array_equal(batch["k"], k)
    assert batch["d" if "d" in batch else "fd"].dtype == (np.float32 if cast else np.float64)
    np.testing.assert_array_equal(batch["v"], want["v"][ids])
    valid = ids % 7 != 3
    np.testing.assert_array_equal(batch["m_valid"], valid)
    np.testing.assert_array_equal(batch["m"], np.where(valid, ids * 0.5, -1.0).astype(np.float32))
    assert batch["s"] == [want["s"][i] for i in ids]
    rows = [want["tok"][i] for i in ids]
    if pad:
        padded = np.zeros((len(ids), 5), np.int32)
        for r, row in enumerate(rows):
            padded[r, :min(5, len(row))] = row[:5]
        np.testing.assert_array_equal(batch["tok"], padded)
        np.testing.assert_array_equal(batch["tok_length"], [min(5, len(r)) for r in rows])
    else:
        np.testing.assert_array_equal(batch["tok"], np.concatenate([np.asarray(r, np.int32) for r in rows]))
        np.testing.assert_array_equal(batch["tok_offsets"], np.cumsum([0] + [len(r) for r in rows]))
    return ids


@pytest.mark.parametrize("shuffle, cache, cast, pad, stack", CASES)
def test_values_and_order_of_combined_options(data, shuffle, cache, cast, pad, stack):
    root, whole = data
    want = expected_rows(whole)
    n = whole.num_rows
    orders = []
    for workers in (1, 3):
        loader = pqloader.Loader(root, num_workers=workers, **options(shuffle, cache, cast, pad, stack))
        ids = np.concatenate([check_batch(b, want, cast, pad, stack) for b in loader])
        assert len(ids) == 2 * n
        for epoch in (ids[:n], ids[n:]):
            np.testing.assert_array_equal(np.sort(epoch), np.arange(n))
        if not shuffle:
            np.testing.assert_array_equal(ids, np.tile(np.arange(n), 2))
        orders.append(ids)
    np.testing.assert_array_equal(orders[0], orders[1])
