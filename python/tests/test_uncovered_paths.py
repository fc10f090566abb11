"""Paths no other test executed (found by line+branch coverage of the Python layer):
refusals whose messages matter, and fills of transformed columns checked against the
stored type."""

import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from pqloader import transforms as T


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({
        "i32": pa.array([1, None, 3], pa.int32()),
        "u8": pa.array([1, None, 3], pa.uint8()),
        "b": pa.array([True, None, False]),
        "l8": pa.array([[1, None], [2], [3]], pa.list_(pa.int8())),
        "f16": pa.array([1, None, 3], pa.float16()),
    }), p)
    return str(p)


# The fill replaces the stored column's nulls before the transform: it must fit the stored
# type (these were cast silently: 2**31 -> -2**31, 1.5 -> 1, nan -> 0, 300 -> 44 or True).
@pytest.mark.parametrize("column, fill, words", [
    ("i32", 2**31, ["'i32'", "int32", "does not fit"]),
    ("i32", 2**40, ["'i32'", "int32", "does not fit"]),
    ("i32", 1.5, ["'i32'", "whole number"]),
    ("i32", float("nan"), ["'i32'", "whole number"]),
    ("u8", 300, ["'u8'", "uint8", "does not fit"]),
    ("u8", -1, ["'u8'", "uint8", "does not fit"]),
    ("b", 300, ["'b'", "bool"]),
    ("l8", 300, ["'l8'", "int8", "does not fit"]),
])
@pytest.mark.parametrize("scalar", [False, True])
def test_fill_of_a_transformed_column_must_fit_its_stored_type(path, column, fill, words, scalar):
    kw = dict(lists={column: pqloader.Pad(4)}) if column == "l8" else {}
    with pytest.raises(ValueError) as e:
        pqloader.Loader(path, batch_size=3, columns=[column], transforms={column: T.Cast("float32")},
                        fill_null=fill if scalar else {column: fill}, **kw)
    for w in words:
        assert w in str(e.value)


def test_fill_of_a_transformed_column_that_fits_is_loaded(path):
    got = list(pqloader.Loader(path, batch_size=3, columns=["i32", "u8", "f16"],
                               transforms={c: T.Cast("float32") for c in ("i32", "u8", "f16")},
                               fill_null={"i32": -2**31, "u8": 255, "f16": 300}))
    assert got[0]["i32"].tolist() == [1, -2**31, 3]
    assert got[0]["u8"].tolist() == [1, 255, 3]
    assert got[0]["f16"].tolist() == [1, 300, 3]


def _loader(path, **kw):
    return pqloader.Loader(path, batch_size=3, columns=["i32"], fill_null=0, **kw)


REFUSALS = [
    (lambda p: pqloader.mix([], []), ValueError, "at least one source"),
    (lambda p: pqloader.mix([_loader(p)], [1], stop="zz"), ValueError, "stop must be one of"),
    (lambda p: pqloader.mix([_loader(p)], [1], output="zz"), ValueError, "'numpy' or 'torch'"),
    (lambda p: pqloader.mix([_loader(p)], [1], batch_transform=3), TypeError, "batch_transform must be callable"),
    (lambda p: pqloader.mix({"a": _loader(p), "b": _loader(p, transforms={"i32": T.Cast("float32")})},
                            {"a": 1, "b": 1}), ValueError, "column 'i32' is int32 () in 'a' but float32 () in 'b'"),
    (lambda p: pqloader.merge_states([]), pqloader.InvalidDataError, "non-empty list"),
    (lambda p: pqloader.Pad(value="x"), TypeError, "Pad(value=...) must be a number"),
    (lambda p: pqloader.Pad(side="mid"), ValueError, "Pad(side=...) must be 'left' or 'right'"),
    (lambda p: _loader(p, lists=3), TypeError, "lists must be a dict"),
    (lambda p: _loader(p, lists={1: "ragged"}), TypeError, "lists keys must be column names"),
    (lambda p: pqloader.Loader(p, columns=5), TypeError, "columns must be a list of names or None, got int"),
    (lambda p: _loader(p, transforms=5), TypeError, "transforms must be a dict"),
    (lambda p: _loader(p, transforms={1: []}), TypeError, "transforms keys must be column names"),
    (lambda p: _loader(p, stack={"": ["i32"]}), TypeError, "stack keys must be"),
    (lambda p: _loader(p, row_groups=[0]), TypeError, "row_groups must be a dict"),
    (lambda p: _loader(p, cache_dir=5), TypeError, "cache_dir must be a path"),
    (lambda p: _loader(p, transforms=lambda b: b, batch_transform=lambda b: b), ValueError, "give the per-batch callable once"),
    (lambda p: pqloader.LoaderOptions().to_engine(), ValueError, "call resolve() first"),
    (lambda p: _loader(p, storage_options=3), TypeError, "storage_options must be a dict"),
    (lambda p: _loader(p, storage_options={"zzz": [1]}), TypeError, "storage_options['zzz'] must be str, bool, int or float"),
    (lambda p: _loader(p, storage_options={"zzz": 1}), ValueError, "unknown storage option 'zzz'"),
    (lambda p: pqloader.Loader([5]), TypeError, "source entries must be str or os.PathLike"),
    (lambda p: T.DecodeImage(keepdims=1), TypeError, "DecodeImage(keepdims=...) must be True or False"),
    (lambda p: T.PadOrTruncate(4, side="mid"), ValueError, "side must be 'left' or 'right'"),
    (lambda p: pqloader.Predicate([], lambda b: b), ValueError, "Predicate needs the columns"),
    (lambda p: pickle.dumps(_loader(p)), TypeError, "cannot be pickled"),
]


@pytest.mark.parametrize("i", range(len(REFUSALS)))
def test_refusals_no_other_test_reached(path, i):
    make, error, words = REFUSALS[i]
    with pytest.raises(error) as e:
        make(path)
    assert words in str(e.value)


def test_source_fspath_to_bytes_is_refused():
    class BytesPath:
        def __fspath__(self):
            return b"/tmp/x"
    with pytest.raises(TypeError, match="text paths, got bytes"):
        pqloader.Loader([BytesPath()])


def test_mixture_repr_and_sources(path):
    m = pqloader.mix({"a": _loader(path), "b": _loader(path)}, {"a": 1, "b": 3})
    assert m.sources == ["a", "b"]
    assert repr(m).startswith("pqloader.Mixture({'a': 1.0, 'b': 3.0}, batch_size=3")


def test_petastorm_torch_promotes_types_torch_lacks(tmp_path):
    torch = pytest.importorskip("torch")
    from pqloader.petastorm import make_batch_reader
    from pqloader.petastorm.pytorch import BatchedDataLoader
    pq.write_table(pa.table({"u16": pa.array([1, 65535], pa.uint16()), "u32": pa.array([1, 2**32 - 1], pa.uint32()),
                             "b": pa.array([True, False])}), tmp_path / "a.parquet")
    with make_batch_reader(f"file://{tmp_path}", num_epochs=1, shuffle_row_groups=False) as reader:
        (batch,) = list(BatchedDataLoader(reader, batch_size=2))
    assert (batch["u16"].dtype, batch["u16"].tolist()) == (torch.int32, [1, 65535])
    assert (batch["u32"].dtype, batch["u32"].tolist()) == (torch.int64, [1, 2**32 - 1])
    assert (batch["b"].dtype, batch["b"].tolist()) == (torch.uint8, [1, 0])


def test_petastorm_decimal_friendly_collate():
    torch = pytest.importorskip("torch")
    import decimal
    from pqloader.petastorm.pytorch import decimal_friendly_collate
    D = decimal.Decimal
    out = decimal_friendly_collate([{"d": D("1.5"), "s": "a", "t": (1, 2), "x": 3},
                                    {"d": D("2"), "s": "b", "t": (3, 4), "x": 4}])
    assert out["d"] == [D("1.5"), D("2")] and out["s"] == ["a", "b"]
    assert [t.tolist() for t in out["t"]] == [[1, 3], [2, 4]]
    assert isinstance(out["x"], torch.Tensor) and out["x"].tolist() == [3, 4]


def test_state_whose_seed_field_was_changed_is_refused(path):
    loader = pqloader.Loader(path, batch_size=1, columns=["i32"], fill_null=0, seed=3, shuffle=True)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    state["seed"] = 4  # the options' fingerprint still says 3
    with pytest.raises(pqloader.InvalidDataError, match="seed: state has 4, loader has 3"):
        loader.load_state_dict(state)


def test_cli_refusals(path, tmp_path, capsys):
    from pqloader import cli
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", path, "--batch-size", "x"])
    assert e.value.code == 2 and "--batch-size: not an integer: 'x'" in capsys.readouterr().err
    assert cli.main(["cache", "clear", str(tmp_path / "c"), "--dataset", path]) == 1
    err = capsys.readouterr().err
    assert "--dataset is for `cache stats` and `cache prune`" in err
    assert not (tmp_path / "c").exists()
