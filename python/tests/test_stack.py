"""stack=: columns handed out as one [batch, k, ...] column, equal to numpy.stack of the
unstacked loader's columns in every mode the loader has (shuffled windows, transforms,
padded lists, cache hits, resume, torch), and refused clearly where it cannot apply."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from pqloader import transforms as T

from conftest import write_dataset

FEATURES = [f"f{i}" for i in range(11)]  # one group of 8 float columns and 3 more


def wide_table(n: int, start: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed + start)
    cols = {"id": pa.array(np.arange(start, start + n, dtype=np.int64))}
    for name in FEATURES:
        cols[name] = pa.array(rng.standard_normal(n).astype(np.float32))
    cols["d"] = pa.array(rng.standard_normal(n))  # float64
    cols["i1"] = pa.array(rng.integers(-9, 9, n, dtype=np.int64))
    cols["i2"] = pa.array(rng.integers(-9, 9, n, dtype=np.int64))
    cols["s"] = pa.array([f"s{i}" for i in range(start, start + n)])
    lengths = rng.integers(0, 6, n)
    cols["tok"] = pa.array([list(range(start + i, start + i + int(k))) for i, k in enumerate(lengths)],
                           pa.list_(pa.int32()))
    cols["tok2"] = pa.array([list(range(int(k))) for k in lengths[::-1]], pa.list_(pa.int32()))
    return pa.table(cols)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    root = tmp_path_factory.mktemp("wide")
    write_dataset(root, [[700, 300], [1000], [250, 250, 333]], wide_table)
    return root


def pairs(a: pqloader.Loader, b: pqloader.Loader, epochs: int = 1):
    got = []
    for _ in range(epochs):
        for x, y in zip(a, b, strict=True):
            got.append((x, y))
    assert got
    return got


def assert_stacked(plain: dict, stacked: dict, stacks: dict) -> None:
    members = {c for cols in stacks.values() for c in cols}
    assert set(stacked) == (set(plain) - members) | set(stacks)
    for name, cols in stacks.items():
        want = np.stack([plain[c] for c in cols], axis=1)
        assert stacked[name].dtype == want.dtype and stacked[name].shape == want.shape
        np.testing.assert_array_equal(stacked[name], want)
        assert stacked[name].flags.c_contiguous
    for c in set(plain) - members:
        np.testing.assert_array_equal(stacked[c], plain[c])


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [1, 3])
def test_stacked_equals_numpy_stack(wide, shuffle, workers):
    columns = ["id", *FEATURES, "i1", "i2"]
    stacks = {"x": FEATURES, "ints": ["i2", "i1"]}
    common = dict(batch_size=97, shuffle=shuffle, seed=5, num_workers=workers, columns=columns)
    plain = pqloader.Loader(wide, **common)
    stacked = pqloader.Loader(wide, **common, stack=stacks)
    for a, b in pairs(plain, stacked, epochs=2):
        assert_stacked(a, b, stacks)
        assert list(b) == ["id", "x", "ints"]  # each where its first member was


def test_output_column_order_and_info(wide):
    loader = pqloader.Loader(wide, columns=["id", "f1", "i1", "f0", "s"], stack={"xy": ["f0", "f1"]})
    assert list(loader.column_info) == ["id", "xy", "i1", "s"]
    assert loader.column_info["xy"]["dtype"] == "float32"
    assert loader.column_info["xy"]["shape"] == (2,)
    batch = next(iter(loader))
    assert list(batch) == ["id", "xy", "i1", "s"]
    np.testing.assert_array_equal(batch["xy"][:, 0], next(iter(pqloader.Loader(wide, columns=["f0"])))["f0"])


def test_after_transforms_and_padding(wide):
    # A float64 column cast to float32 stacks with float32 ones; two lists padded to one
    # fixed length stack to [batch, 2, L]; the padded columns' lengths stay.
    common = dict(batch_size=128, shuffle=True, seed=9, columns=["f0", "d", "tok", "tok2"],
                  transforms={"d": [T.Cast("float32")]},
                  lists={"tok": pqloader.Pad(4), "tok2": pqloader.Pad(4)})
    stacks = {"x": ["f0", "d"], "toks": ["tok", "tok2"]}
    plain = pqloader.Loader(wide, **common)
    stacked = pqloader.Loader(wide, **common, stack=stacks)
    assert stacked.column_info["toks"]["shape"] == (2, 4)
    for a, b in pairs(plain, stacked):
        assert_stacked(a, b, stacks)
        assert {"tok_length", "tok2_length"} <= set(b)


def test_cache_hits_and_resume(wide, tmp_path):
    stacks = {"x": FEATURES}
    common = dict(batch_size=64, shuffle=True, seed=11, columns=["id", *FEATURES], stack=stacks)
    reference = list(pqloader.Loader(wide, num_epochs=2, **common))
    cached = pqloader.Loader(wide, num_epochs=2, cache_dir=tmp_path / "c", **common)
    got = list(cached)
    assert cached.stats()["cache_hits"] > 0  # the second epoch's row groups
    assert len(got) == len(reference)
    for a, b in zip(reference, got):
        np.testing.assert_array_equal(a["x"], b["x"])
        np.testing.assert_array_equal(a["id"], b["id"])

    interrupted = pqloader.Loader(wide, **common)
    it = iter(interrupted)
    first = [next(it) for _ in range(5)]
    state = json.loads(json.dumps(interrupted.state_dict()))
    resumed = pqloader.Loader(wide, **common)
    resumed.load_state_dict(state)
    rest = list(resumed)
    epoch0 = [b for b in pqloader.Loader(wide, **common)]
    assert len(first) + len(rest) == len(epoch0)
    for a, b in zip(epoch0, first + rest):
        np.testing.assert_array_equal(a["x"], b["x"])
    # A state records the output columns, the stack's included: resumed without the
    # stack, it is refused by name (as another column selection is).
    unstacked = pqloader.Loader(wide, **{k: v for k, v in common.items() if k != "stack"})
    with pytest.raises(pqloader.InvalidDataError, match="columns: state has \\['id', 'x', '@stack=x=f0,f1"):
        unstacked.load_state_dict(state)
    # So is a stack of the same name with its columns in another order.
    reordered = pqloader.Loader(wide, **{**common, "stack": {"x": FEATURES[::-1]}})
    with pytest.raises(pqloader.InvalidDataError, match="@stack=x="):
        reordered.load_state_dict(state)


def test_torch_output_is_one_tensor(wide):
    torch = pytest.importorskip("torch")
    common = dict(batch_size=100, shuffle=True, seed=2, columns=["id", *FEATURES])
    plain = pqloader.Loader(wide, **common)
    stacked = pqloader.Loader(wide, **common, output="torch", stack={"x": FEATURES})
    for a, b in pairs(plain, stacked):
        assert isinstance(b["x"], torch.Tensor) and b["x"].dtype == torch.float32
        np.testing.assert_array_equal(b["x"].numpy(), np.stack([a[c] for c in FEATURES], axis=1))


def test_null_mask_of_a_member_stays(tmp_path):
    table = pa.table({"a": pa.array([1.0, None, 3.0], pa.float32()), "b": pa.array([4.0, 5.0, 6.0], pa.float32())})
    write_dataset(tmp_path, [[3]], lambda n, start, seed: table)
    loader = pqloader.Loader(tmp_path, null_mask=["a"], fill_null=0.0, stack={"ab": ["a", "b"]})
    info = loader.column_info
    assert list(info) == ["ab", "a_valid"] and info["a_valid"]["mask"]
    batch = next(iter(loader))
    np.testing.assert_array_equal(batch["ab"], [[1, 4], [0, 5], [3, 6]])
    np.testing.assert_array_equal(batch["a_valid"], [True, False, True])


@pytest.mark.parametrize("stack, error, says", [
    ({"x": ["f0", "nope"]}, pqloader.ColumnNotFoundError, "names column 'nope', which is not among"),
    ({"x": ["f0", "d"]}, ValueError, "column 'd' is float64 with rows of shape (), column 'f0' float32"),
    ({"x": ["f0", "s"]}, ValueError, "column 's' holds strings or bytes"),
    ({"x": ["i1", "tok"]}, ValueError, "column 'tok' has rows whose shape or dtype depends on the data"),
    ({"x": ["f0", "f0"]}, ValueError, "already in this stack"),
    ({"id": ["f0", "f1"]}, ValueError, "not one of its members"),
    ({"x": []}, ValueError, "non-empty list of column names"),
    ({"x": "f0"}, TypeError, "must be a list of column names"),
    (["f0"], TypeError, "stack must be a dict"),
])
def test_refused_at_construction(wide, stack, error, says):
    with pytest.raises(error, match=None) as e:
        pqloader.Loader(wide, columns=["id", "f0", "f1", "d", "s", "i1", "tok"], lists={"tok": "ragged"}, stack=stack)
    assert says in str(e.value)


def test_fill_null_is_checked_against_the_stacked_columns_themselves(wide):
    # i1 is int64: a fraction cannot fill it, stacked or not.
    for stack in (None, {"ii": ["i1", "i2"]}):
        with pytest.raises(ValueError, match="fill_null\\['i1'\\]"):
            pqloader.Loader(wide, columns=["i1", "i2"], fill_null={"i1": 0.5}, stack=stack)
    pqloader.Loader(wide, columns=["i1", "i2"], fill_null={"i1": 5}, stack={"ii": ["i1", "i2"]})


def test_refused_with_pack_and_on_mix_sources(wide):
    with pytest.raises(ValueError, match="stack cannot be combined with pack"):
        pqloader.Loader(wide, columns=["tok", "i1", "i2"], pack=pqloader.Pack("tok", seq_len=8),
                        stack={"ii": ["i1", "i2"]})
    source = pqloader.Loader(wide, columns=["f0", "f1"], stack={"x": ["f0", "f1"]})
    with pytest.raises(ValueError, match="stacks columns"):
        pqloader.mix({"a": source, "b": pqloader.Loader(wide, columns=["f0", "f1"])}, [0.5, 0.5], batch_size=8)


def test_column_info_of_a_transformed_column_after_a_padded_one(tmp_path):
    # The "_length" companion shifts the output columns: a transformed column after it
    # still reports what its ops declare (it reported None before).
    table = pa.table({"a": pa.array([[1, 2], [3]], pa.list_(pa.int64())), "b": pa.array([1.0, 2.0])})
    write_dataset(tmp_path, [[2]], lambda n, start, seed: table)
    loader = pqloader.Loader(tmp_path, lists={"a": pqloader.Pad(4)}, transforms={"b": [T.Cast("float32")]})
    assert loader.column_info["b"]["dtype"] == "float32"
    assert loader.column_info["b"]["shape"] == ()
    assert next(iter(loader))["b"].dtype == np.float32


def test_members_of_different_units_or_scales_are_refused(tmp_path):
    # Times load as integers in their stored unit and decimals="int64" as unscaled
    # integers: files that disagree so are refused, and so must a stack that would mix
    # them in one tensor whose column_info no longer tells its columns apart.
    import datetime
    import decimal

    t0 = datetime.datetime(2020, 1, 1)
    table = pa.table({
        "us": pa.array([t0, t0 + datetime.timedelta(seconds=1)], pa.timestamp("us")),
        "us2": pa.array([t0, t0 + datetime.timedelta(seconds=2)], pa.timestamp("us")),
        "ms": pa.array([t0, t0 + datetime.timedelta(seconds=1)], pa.timestamp("ms")),
        "utc": pa.array([t0, t0], pa.timestamp("us", tz="UTC")),
        "d2": pa.array([decimal.Decimal("0.01"), decimal.Decimal("1.50")], pa.decimal128(10, 2)),
        "d2b": pa.array([decimal.Decimal("0.02"), decimal.Decimal("2.50")], pa.decimal128(12, 2)),
        "d3": pa.array([decimal.Decimal("0.001"), decimal.Decimal("1.500")], pa.decimal128(10, 3)),
    })
    write_dataset(tmp_path, [[2]], lambda n, start, seed: table)
    for stack, says in [(["us", "ms"], "column 'ms' is timestamp[ms], column 'us' timestamp[us]"),
                        (["us", "utc"], "column 'utc' is timestamp[us, tz=UTC]")]:
        with pytest.raises(ValueError, match="stack 'x'") as e:
            pqloader.Loader(tmp_path, columns=stack, stack={"x": stack})
        assert says in str(e.value)
    with pytest.raises(ValueError, match="two scales") as e:
        pqloader.Loader(tmp_path, columns=["d2", "d3"], decimals="int64", stack={"x": ["d2", "d3"]})
    assert "column 'd3' is decimal128(10, 3), column 'd2' decimal128(10, 2)" in str(e.value)
    # One unit, one scale (any precision), or decimals as their float64 values: stacked.
    for stack, decimals, want in [
        (["us", "us2"], "float64", [[1577836800000000, 1577836800000000], [1577836801000000, 1577836802000000]]),
        (["d2", "d2b"], "int64", [[1, 2], [150, 250]]),
        (["d2", "d3"], "float64", [[0.01, 0.001], [1.5, 1.5]]),
    ]:
        batch = next(iter(pqloader.Loader(tmp_path, columns=stack, decimals=decimals, stack={"x": stack})))
        assert batch["x"].tolist() == want


def test_a_plain_integer_member_is_of_scale_0_beside_unscaled_decimals(tmp_path):
    # decimals="int64": a plain int64 column beside a decimal(10, 2) was stacked (1 beside
    # 150 for 1.50: two units in one tensor), where a decimal(10, 0) one, the same
    # integers, was refused; a mixture refuses both. It counts as scale 0.
    import decimal

    table = pa.table({
        "n": pa.array([1, 2], pa.int64()),
        "d2": pa.array([decimal.Decimal("1.50"), decimal.Decimal("2.25")], pa.decimal128(10, 2)),
        "d0": pa.array([decimal.Decimal("3"), decimal.Decimal("4")], pa.decimal128(10, 0)),
    })
    write_dataset(tmp_path, [[2]], lambda n, start, seed: table)
    for stack in (["d2", "n"], ["n", "d2"]):
        with pytest.raises(ValueError, match="two scales"):
            pqloader.Loader(tmp_path, columns=stack, decimals="int64", stack={"x": stack})
    batch = next(iter(pqloader.Loader(tmp_path, columns=["n", "d0"], decimals="int64",
                                      stack={"x": ["n", "d0"]})))
    assert batch["x"].tolist() == [[1, 3], [2, 4]]


def test_list_members_of_different_units_or_scales_are_refused(tmp_path):
    # The check read only a column's own type: fixed_size_list<decimal128(10, 2)>[2] and
    # fixed_size_list<decimal128(10, 3)>[2] (or padded lists of them) stacked with
    # decimals="int64" as [[150, 200], [1500, 2000]] for 1.50 and 1.500; lists of times
    # of two units alike. Their elements' types are compared as a plain column's.
    import datetime
    import decimal

    D = decimal.Decimal
    t0 = datetime.datetime(2020, 1, 1)
    table = pa.table({
        "fa": pa.array([[D("1.50"), D("2.00")]], pa.list_(pa.decimal128(10, 2), 2)),
        "fb": pa.array([[D("1.500"), D("2.000")]], pa.list_(pa.decimal128(10, 3), 2)),
        "fc": pa.array([[D("0.01"), D("0.02")]], pa.list_(pa.decimal128(12, 2), 2)),
        "la": pa.array([[D("1.50"), D("2.00")]], pa.list_(pa.decimal128(10, 2))),
        "lb": pa.array([[D("1.500"), D("2.000")]], pa.list_(pa.decimal128(10, 3))),
        "tus": pa.array([[t0, t0]], pa.list_(pa.timestamp("us"), 2)),
        "tms": pa.array([[t0, t0]], pa.list_(pa.timestamp("ms"), 2)),
    })
    write_dataset(tmp_path, [[1]], lambda n, start, seed: table)
    pad = {"la": pqloader.Pad(length=2), "lb": pqloader.Pad(length=2)}
    for stack, lists, decimals, says in [
        (["fa", "fb"], None, "int64", "column 'fb' is fixed_size_list<element: decimal128(10, 3)>[2]"),
        (["la", "lb"], pad, "int64", "column 'lb' is list<element: decimal128(10, 3)>"),
        (["tus", "tms"], None, "float64", "column 'tms' is fixed_size_list<element: timestamp[ms]>[2]"),
    ]:
        with pytest.raises(ValueError, match="stack 'x'") as e:
            pqloader.Loader(tmp_path, columns=stack, decimals=decimals, lists=lists, stack={"x": stack})
        assert says in str(e.value)
    # One scale, or their float64 values: stacked.
    for stack, decimals, want in [(["fa", "fc"], "int64", [[[150, 200], [1, 2]]]),
                                  (["fa", "fb"], "float64", [[[1.5, 2.0], [1.5, 2.0]]])]:
        batch = next(iter(pqloader.Loader(tmp_path, columns=stack, decimals=decimals, stack={"x": stack})))
        assert batch["x"].tolist() == want


def test_a_state_loads_with_the_same_stacks_in_another_dict_order(wide):
    # The dict's order changes no batch (each stack takes its first member's place): a
    # state must load (it was refused, "columns: state has [..., '@stack=x=...',
    # '@stack=ints=...']"); the rest of the epoch is the uninterrupted one's.
    common = dict(batch_size=64, shuffle=True, seed=3, columns=["id", *FEATURES, "i1", "i2"])
    stacks = {"x": FEATURES, "ints": ["i1", "i2"]}
    interrupted = pqloader.Loader(wide, **common, stack=stacks)
    it = iter(interrupted)
    first = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(interrupted.state_dict()))
    resumed = pqloader.Loader(wide, **common, stack=dict(reversed(stacks.items())))
    assert list(resumed.column_info) == list(interrupted.column_info)
    resumed.load_state_dict(state)
    epoch = list(pqloader.Loader(wide, **common, stack=stacks))
    got = first + list(resumed)
    assert len(got) == len(epoch)
    for a, b in zip(epoch, got):
        for name in ("id", "x", "ints"):
            np.testing.assert_array_equal(a[name], b[name])
    # Other stacks are still refused.
    other = pqloader.Loader(wide, **common, stack={"x": FEATURES, "ints": ["i2", "i1"]})
    with pytest.raises(pqloader.InvalidDataError, match="@stack=ints="):
        other.load_state_dict(state)


def test_a_state_of_stacked_names_with_commas_loads_only_into_the_same_stack(tmp_path):
    # Regression: the fingerprint joined the members with ',' unescaped, so that
    # stack={"x": ["a,b", "c"]} and stack={"x": ["a", "b,c"]} both recorded "@stack=x=a,b,c"
    # (and the same output columns): each loaded the other's state and resumed on other data.
    pq_path = tmp_path / "commas.parquet"
    pq.write_table(pa.table({"a,b": [1.0, 2.0, 3.0, 4.0], "c": [10.0, 20.0, 30.0, 40.0],
                             "a": [100.0, 200.0, 300.0, 400.0], "b,c": [5.0, 6.0, 7.0, 8.0]}), pq_path)
    first = pqloader.Loader(pq_path, batch_size=2, columns=["a,b", "c"], stack={"x": ["a,b", "c"]})
    next(iter(first))
    state = json.loads(json.dumps(first.state_dict()))
    other = pqloader.Loader(pq_path, batch_size=2, columns=["a", "b,c"], stack={"x": ["a", "b,c"]})
    with pytest.raises(pqloader.InvalidDataError, match="@stack=x="):
        other.load_state_dict(state)
    same = pqloader.Loader(pq_path, batch_size=2, columns=["a,b", "c"], stack={"x": ["a,b", "c"]})
    same.load_state_dict(state)
    assert [b["x"].tolist() for b in same] == [[[3.0, 30.0], [4.0, 40.0]]]
