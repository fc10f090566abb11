"""Paths no other test executed (found by line+branch coverage of the Python layer):
refusals whose messages matter, and fills of transformed columns checked against the
stored type."""

import pickle
import re

import numpy as np
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
        "d32": pa.array([1, None, 3], pa.date32()),
        "ts": pa.array([1, None, 3], pa.timestamp("ms")),
        "lnn": pa.array([[1], None, [3]], pa.list_(pa.field("item", pa.int8(), nullable=False))),
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
    # (the engine's check refused these, as InvalidDataError, not in the Python's words)
    ("d32", 1.5, ["'d32'", "whole number"]),
    ("d32", 2**31, ["'d32'", "int32", "does not fit"]),
    ("ts", 1.5, ["'ts'", "whole number"]),
    ("lnn", 300, ["'lnn'", "int8", "does not fit"]),
])
@pytest.mark.parametrize("scalar", [False, True])
def test_fill_of_a_transformed_column_must_fit_its_stored_type(path, column, fill, words, scalar):
    kw = dict(lists={column: pqloader.Pad(4)}) if column in ("l8", "lnn") else {}
    with pytest.raises(ValueError) as e:
        pqloader.Loader(path, batch_size=3, columns=[column], transforms={column: T.Cast("float32")},
                        fill_null=fill if scalar else {column: fill}, **kw)
    # The Loader's own check (the engine's, made after it, raises InvalidDataError: this
    # test passed with the Python check removed for 12 of its 16 cases).
    assert type(e.value) is ValueError, e.value
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
    (lambda p: T.PadOrTruncate(4, side="mid"), ValueError, "PadOrTruncate(side=...) must be 'left' or 'right'"),
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


# --- C++ paths no test executed (found by gcov line coverage of cpp/src/pqloader) ---

def test_a_column_that_is_a_struct_in_one_file_and_not_in_another_is_refused_naming_both(tmp_path):
    pq.write_table(pa.table({"s": pa.array([{"a": 1}], pa.struct([("a", pa.int64())]))}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"s": pa.array([5])}), tmp_path / "b.parquet")
    with pytest.raises(pqloader.SchemaMismatchError,
                       match=r"column 's' is a struct \(struct<a: int64>\) in '.*a.parquet' but int64 in '.*b.parquet'"):
        pqloader.Loader(str(tmp_path), batch_size=1)


def test_a_filter_that_gives_one_bool_for_every_row_keeps_all_or_none(tmp_path):
    import pyarrow.compute as pc

    pq.write_table(pa.table({"id": np.arange(10)}), tmp_path / "a.parquet")
    ids = lambda f: [i for b in pqloader.Loader(str(tmp_path), batch_size=4, shuffle=False, filter=f)  # noqa: E731
                     for i in b["id"].tolist()]
    assert ids(pc.scalar(1) < pc.scalar(2)) == list(range(10))
    assert ids(pc.scalar(1) > pc.scalar(2)) == []
    assert ids(pc.scalar(False)) == []


def test_a_uint64_literal_below_2_63_is_told_apart_from_an_int64_one_in_states(tmp_path):
    import pyarrow.compute as pc

    pq.write_table(pa.table({"id": np.arange(20, dtype=np.uint64)}), tmp_path / "a.parquet")
    make = lambda v, t: pqloader.Loader(str(tmp_path), batch_size=4, shuffle=False,  # noqa: E731
                                        filter=pc.field("id") < pa.scalar(v, t))
    a = make(5, pa.uint64())
    next(iter(a))
    assert a.state_dict()["options"]["transforms"].endswith("|filter-literals=uint64")
    b = make(5, pa.uint64())
    b.load_state_dict(a.state_dict())
    assert [x for batch in b for x in batch["id"].tolist()] == [4]
    with pytest.raises(pqloader.InvalidDataError, match="filter-literals=uint64"):
        make(5, pa.int64()).load_state_dict(a.state_dict())
    # Beyond int64 a uint64 prints as no int64 does: no type recorded.
    assert "filter-literals" not in make(2**63 + 1, pa.uint64()).state_dict()["options"]["transforms"]


def _image_column(tmp_path, shapes, fmt):
    import io

    from PIL import Image

    rng = np.random.default_rng(0)
    images = []
    for h, w in shapes:
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, format=fmt)
        images.append(buf.getvalue())
    path = tmp_path / f"img-{fmt}.parquet"
    pq.write_table(pa.table({"img": pa.array(images, pa.binary())}), path)
    return str(path)


def _images(path, ops):
    return [np.asarray(b["img"])[0] for b in
            pqloader.Loader(path, batch_size=1, shuffle=False, transforms={"img": ops})]


@pytest.mark.parametrize("fmt, shapes", [("PNG", [(37, 53), (64, 40), (20, 20), (9, 31)]),
                                         ("JPEG", [(400, 300), (300, 500)])])  # (DCT-scaled)
@pytest.mark.parametrize("size, crop", [(16, (12, 12)), (16, (16, 30)), (10, (3, 17)), (7, (8, 5))])
def test_resize_then_center_crop_computed_together_equals_the_two_apart(tmp_path, fmt, shapes, size, crop):
    # The engine fuses Resize directly followed by CenterCrop (only the crop's pixels are
    # computed, and a crop larger than the resize pads); Cast between them keeps them apart.
    path = _image_column(tmp_path, shapes, fmt)
    fused = _images(path, [T.DecodeImage(), T.Resize(size), T.CenterCrop(crop)])
    apart = _images(path, [T.DecodeImage(), T.Resize(size), T.Cast("uint8"), T.CenterCrop(crop)])
    assert [a.shape for a in fused] == [(*crop, 3)] * len(shapes)
    for a, b in zip(fused, apart):
        np.testing.assert_array_equal(a, b)


def _damage_index(lines):
    head, files = lines[:2], lines[2:]
    first = files[0].split("\t")
    return {
        "it does not start with 'pqloader-index 2'": ["nope"] + lines[1:],
        "line 2 does not name the summary's hash": [head[0], "summary\t"] + files,
        "line 3 has fewer than 4 fields": head + ["1\t2\t3"] + files[1:],
        "line 3 has a bad size or time": head + ["x" + files[0]] + files[1:],
        "line 3 has a bad size or time ": head + ["\t".join([first[0], "-5"] + first[2:])] + files[1:],
        "line 3 has a bad path": head + ["\t".join(first[:3] + ["/etc/passwd"])] + files[1:],
        "line 3 has a bad path ": head + ["\t".join(first[:3] + ["a/../f0.parquet"])] + files[1:],
        "line 4 repeats a path or is out of order ('f0.parquet')": head + [files[1], files[0]] + files[2:],
        "line 4 repeats a path or is out of order ('f0.parquet') ": head + [files[0]] + files,
    }


def test_a_damaged_dataset_index_is_refused_naming_it_and_the_line(tmp_path):
    for i in range(3):
        pq.write_table(pa.table({"y": np.arange(5) + 10 * i}), tmp_path / f"f{i}.parquet")
    pqloader.write_index(str(tmp_path))
    index = tmp_path / "_pqloader_index"
    lines = index.read_text().splitlines()
    rows = lambda **kw: sorted(y for b in pqloader.Loader(str(tmp_path), batch_size=100, **kw)  # noqa: E731
                               for y in b["y"].tolist())
    everything = rows(use_summary="only")
    assert everything == rows(use_summary=False) and len(everything) == 15
    for why, damaged in _damage_index(lines).items():
        index.write_text("\n".join(damaged) + "\n")
        for use_summary in (True, "only"):
            with pytest.raises(pqloader.InvalidDataError,
                               match=f"'{index}' \\(a dataset index\\) is not readable: {re.escape(why.strip())}; "
                                     "rewrite it with `pqloader index`, delete it, or pass use_summary=False"):
                pqloader.Loader(str(tmp_path), use_summary=use_summary)
    # Blank lines are skipped; an index of format 1 (no summary line) is still read.
    for kept in (lines[:2] + [""] + lines[2:] + [""], ["pqloader-index 1"] + lines[2:]):
        index.write_text("\n".join(kept) + "\n")
        assert rows(use_summary="only") == everything


def test_write_index_refusals_name_the_path_and_the_problem(tmp_path):
    with pytest.raises(pqloader.DataNotFoundError, match="nope' does not exist"):
        pqloader.write_index(str(tmp_path / "nope"))
    (tmp_path / "a\tb").mkdir()
    pq.write_table(pa.table({"y": [1]}), tmp_path / "a\tb" / "x.parquet")
    with pytest.raises(pqloader.Error, match="cannot index '.*x.parquet': its path has a tab, a newline or an empty part"):
        pqloader.write_index(str(tmp_path))
    other = tmp_path / "other"
    other.mkdir()
    pq.write_table(pa.table({"y": pa.array(["a"], pa.large_string())}), other / "f0.parquet")
    pq.write_table(pa.table({"y": pa.array(["b"], pa.string())}), other / "f1.parquet")
    with pytest.raises(pqloader.SchemaMismatchError, match="f1.parquet' has other Arrow types than '.*f0.parquet' "
                                                           r"\(column 'y': string against large_string\)"):
        pqloader.write_index(str(other))
    assert not (other / "_metadata").exists() and not (other / "_pqloader_index").exists()


def test_a_directory_of_files_none_of_which_is_parquet_is_refused_naming_some(tmp_path):
    # (Files without the .parquet suffix are checked by their magic bytes and passed over.)
    names = ["part-0", "part-1", "v", "w", "x", "y", "z"]
    for n in names[:1]:
        (tmp_path / n).write_text("not parquet")
    with pytest.raises(pqloader.DataNotFoundError,
                       match=r"no Parquet files found: every file found \('.*part-0'\) is not Parquet"):
        pqloader.Loader(str(tmp_path))
    for n in names[1:]:
        (tmp_path / n).write_text("not parquet")
    with pytest.raises(pqloader.DataNotFoundError, match=r"every file found \('.*part-0', '.*part-1', .*, \.\.\.\) is not"):
        pqloader.Loader(str(tmp_path))


@pytest.mark.parametrize("stored, value, declared, bits", [
    (pa.int16(), 2049, pa.float16(), 11), (pa.uint16(), 4097, pa.float16(), 11),
    (pa.int32(), 16777217, pa.float32(), 24), (pa.int32(), -16777217, pa.float32(), 24),
    (pa.uint32(), 16777217, pa.float32(), 24), (pa.int8(), None, pa.float16(), 11),
    (pa.uint8(), None, pa.float16(), 11), (pa.int16(), None, pa.float16(), 11),
])
def test_narrow_integers_declared_as_floats_are_checked_from_the_footers_statistics(tmp_path, stored, value, declared, bits):
    # Only int64 and uint64 statistics were exercised; an int16 2049 declared float16 must
    # be refused when the loader is made (as 2048 it would load another value).
    fits = {pa.int8(): 127, pa.uint8(): 255, pa.int16(): 2048}
    values = [1, value if value is not None else fits[stored]]
    pq.write_table(pa.table({"x": pa.array(values, stored)}), tmp_path / "a.parquet")
    make = lambda: pqloader.Loader(str(tmp_path), batch_size=2, shuffle=False,  # noqa: E731
                                   schema=pa.schema([("x", declared)]))
    if value is None:
        assert [b["x"].tolist() for b in make()] == [[float(v) for v in values]]
        return
    with pytest.raises(pqloader.SchemaMismatchError,
                       match=f"row group 0: column 'x': value {value} \\({stored}\\) does not convert to the "
                             f"declared {'float16' if bits == 11 else 'float32'} without loss .it holds every "
                             f"integer only up to 2\\^{bits}"):
        make()


def test_ops_on_variable_length_list_rows_keep_each_rows_length_and_inner_shape(tmp_path):
    pq.write_table(pa.table({
        "c": pa.array([[1, 2, 3], [4], [], [5, 6]], pa.list_(pa.int32())),
        "m": pa.array([[[1, 2], [3, 4]], [[5, 6]], [], [[7, 8]]], pa.list_(pa.list_(pa.int16(), 2))),
    }), tmp_path / "l.parquet")

    def one(column, **kw):
        batch = next(iter(pqloader.Loader(str(tmp_path), batch_size=4, shuffle=False, columns=[column], **kw)))
        return {k: v.tolist() for k, v in batch.items()}

    cast = [T.Cast("float32")]
    assert one("c", lists={"c": "ragged"}, transforms={"c": cast}) == \
        {"c": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "c_offsets": [0, 3, 4, 4, 6]}
    assert one("c", transforms={"c": cast + [T.PadOrTruncate(2)]}) == \
        {"c": [[1.0, 2.0], [4.0, 0.0], [0.0, 0.0], [5.0, 6.0]], "c_length": [2, 1, 0, 2]}
    assert one("m", lists={"m": "ragged"}, transforms={"m": cast}) == \
        {"m": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]], "m_offsets": [0, 2, 3, 3, 4]}
    padded = one("m", transforms={"m": cast + [T.PadOrTruncate(3)]})
    assert padded["m_length"] == [2, 1, 0, 1]
    assert padded["m"][0] == [[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]] and padded["m"][3][0] == [7.0, 8.0]
