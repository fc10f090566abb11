"""List columns whose rows differ in length: ragged and padded batches (issue 16).

Every mode is compared with a NumPy reference built from the rows pyarrow reads, batch
by batch (an id column tells which rows a batch holds), for shuffled and natural order,
1 and 2 workers, and batches that cross row groups.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from pqloader import transforms as T

N = 700


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    rng = np.random.default_rng(4)
    lengths = np.concatenate([[0, 1], rng.integers(0, 60, N - 2)])  # empty rows too
    rows = [rng.integers(-1000, 1000, n).astype(np.int32) for n in lengths]
    path = tmp_path_factory.mktemp("lists") / "tokens.parquet"
    table = pa.table({"id": np.arange(N), "tok": pa.array(rows, pa.list_(pa.int32()))})
    pq.write_table(table, path, row_group_size=97)
    return str(path), rows


def padded(rows, pad: pqloader.Pad):
    if pad.length is not None:
        length = pad.length
        keep = length
    else:
        longest = max(len(r) for r in rows)
        capped = min(longest, pad.max_length) if pad.max_length else longest
        length = -(-capped // pad.multiple_of) * pad.multiple_of
        keep = min(length, pad.max_length) if pad.max_length else length
    out = np.full((len(rows), length), pad.value, np.int32)
    lengths = []
    for i, r in enumerate(rows):
        k = min(len(r), keep)
        kept = r[len(r) - k:] if pad.truncation == "left" else r[:k]
        if pad.side == "left":
            out[i, length - k:] = kept
        else:
            out[i, :k] = kept
        lengths.append(k)
    return out, np.array(lengths, np.int64)


PADS = [
    pqloader.Pad(),
    pqloader.Pad(multiple_of=8),
    pqloader.Pad(max_length=20, multiple_of=16, value=-7, side="left", truncation="left"),
    pqloader.Pad(max_length=20, side="right", truncation="left"),
    pqloader.Pad(length=25, value=3, side="left"),
]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("pad", PADS, ids=repr)
def test_padded_batches_equal_a_numpy_reference(tokens, shuffle, workers, pad):
    path, rows = tokens
    loader = pqloader.Loader(path, batch_size=64, shuffle=shuffle, seed=5, num_workers=workers,
                             lists={"tok": pad})
    seen = 0
    for b in loader:
        want, want_len = padded([rows[i] for i in b["id"]], pad)
        np.testing.assert_array_equal(b["tok"], want)
        np.testing.assert_array_equal(b["tok_length"], want_len)
        assert b["tok"].dtype == np.int32
        seen += len(b["id"])
    assert seen == N


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [1, 2])
def test_ragged_batches_hold_every_value_and_their_offsets(tokens, shuffle, workers):
    path, rows = tokens
    loader = pqloader.Loader(path, batch_size=64, shuffle=shuffle, seed=5, num_workers=workers,
                             lists={"tok": "ragged"})
    ids = []
    for b in loader:
        batch_rows = [rows[i] for i in b["id"]]
        np.testing.assert_array_equal(b["tok"], np.concatenate(batch_rows))
        np.testing.assert_array_equal(b["tok_offsets"], np.cumsum([0] + [len(r) for r in batch_rows]))
        ids.extend(b["id"].tolist())
    assert sorted(ids) == list(range(N))


def test_a_pad_value_must_be_a_value_of_the_columns_dtype(tmp_path):
    # Pad(value=200) on int8 rows padded with -56, value=1.5 with 1: refused, naming it.
    pq.write_table(pa.table({"t": pa.array([[1, 2, 3], [4]], pa.list_(pa.int8()))}), tmp_path / "p.parquet")
    for value, message in ((200, r"Pad\(value=200\) does not fit column 't' \(int8"),
                           (1.5, r"Pad\(value=1.5\) is not a whole number")):
        with pytest.raises(ValueError, match=message):
            pqloader.Loader(str(tmp_path), lists={"t": pqloader.Pad(value=value)})
    got = next(iter(pqloader.Loader(str(tmp_path), lists={"t": pqloader.Pad(value=-7)})))
    assert got["t"].tolist() == [[1, 2, 3], [4, -7, -7]]
    # The transform that pads, too (pad=300 became 44); and a float16 column's overflow.
    with pytest.raises(ValueError, match=r"PadOrTruncate\(pad=300\) does not fit column 't' \(int8"):
        pqloader.Loader(str(tmp_path), transforms={"t": [pqloader.transforms.PadOrTruncate(4, pad=300)]})
    pq.write_table(pa.table({"h": pa.array([[1.0], [2.0, 3.0]], pa.list_(pa.float16()))}), tmp_path / "p.parquet")
    with pytest.raises(ValueError, match=r"Pad\(value=1000000.0\) overflows column 'h' \(float16\)"):
        pqloader.Loader(str(tmp_path), lists={"h": pqloader.Pad(value=1e6)})
    with pytest.raises(ValueError, match=r"Pad\(value=65520.0\) overflows column 'h' \(float16\)"):
        pqloader.Loader(str(tmp_path), lists={"h": pqloader.Pad(value=65520.0)})
    # A value that rounds to the largest float16 pads (as np.float16(65510.0)): the batch's
    # own check refused it once, as if the dtype had been unknown when the Loader was made.
    got = next(iter(pqloader.Loader(str(tmp_path), lists={"h": pqloader.Pad(value=65510.0)})))
    assert got["h"].tolist() == [[1.0, np.float16(65510.0)], [2.0, 3.0]]
    # Python ints beyond int64 (numpy's isfinite raised TypeError on them) and beyond a double.
    with pytest.raises(ValueError, match=r"Pad\(value=\d+\) overflows column 'h' \(float16\)"):
        pqloader.Loader(str(tmp_path), lists={"h": pqloader.Pad(value=2**70)})
    with pytest.raises(ValueError, match=r"Pad\(value=\.\.\.\) is beyond any column's range"):
        pqloader.Pad(value=10**400)
    pq.write_table(pa.table({"f": pa.array([[1.0], [2.0, 3.0]], pa.list_(pa.float32()))}), tmp_path / "p.parquet")
    got = next(iter(pqloader.Loader(str(tmp_path), lists={"f": pqloader.Pad(value=2**70)})))
    assert got["f"].tolist() == [[1.0, np.float32(2**70)], [2.0, 3.0]]


def test_pad_or_truncate_sides(tokens):
    path, rows = tokens
    loader = pqloader.Loader(path, batch_size=100, transforms={
        "tok": [T.PadOrTruncate(30, pad=-1, side="left", truncation="left")]})
    for b in loader:
        want, want_len = padded([rows[i] for i in b["id"]],
                                pqloader.Pad(length=30, value=-1, side="left", truncation="left"))
        np.testing.assert_array_equal(b["tok"], want)
        np.testing.assert_array_equal(b["tok_length"], want_len)


def test_lists_resume_exactly_and_hit_the_cache_identically(tokens, tmp_path):
    path, _ = tokens
    kw = dict(batch_size=50, shuffle=True, seed=9, lists={"tok": pqloader.Pad(multiple_of=4)})
    full = [(b["id"].tolist(), b["tok"].tolist()) for b in pqloader.Loader(path, **kw)]
    loader = pqloader.Loader(path, cache_dir=str(tmp_path / "c"), **kw)
    it = iter(loader)
    head = [(b["id"].tolist(), b["tok"].tolist()) for b in (next(it) for _ in range(5))]
    state = loader.state_dict()
    resumed = pqloader.Loader(path, cache_dir=str(tmp_path / "c"), **kw)
    resumed.load_state_dict(state)
    tail = [(b["id"].tolist(), b["tok"].tolist()) for b in resumed]
    assert head + tail == full
    again = [(b["id"].tolist(), b["tok"].tolist()) for b in pqloader.Loader(path, cache_dir=str(tmp_path / "c"), **kw)]
    assert again == full  # from the cache: the same batches


def test_ragged_torch_output_makes_a_jagged_nested_tensor(tokens):
    torch = pytest.importorskip("torch")
    path, rows = tokens
    b = next(iter(pqloader.Loader(path, batch_size=16, lists={"tok": "ragged"}, output="torch")))
    nested = torch.nested.nested_tensor_from_jagged(b["tok"], b["tok_offsets"])
    for i, t in enumerate(nested.unbind()):
        np.testing.assert_array_equal(t.numpy(), rows[int(b["id"][i])])


def test_lists_are_refused_for_other_columns_and_twice(tokens, tmp_path):
    path, _ = tokens
    with pytest.raises(pqloader.ColumnNotFoundError, match="nope"):
        pqloader.Loader(path, lists={"nope": "ragged"})
    with pytest.raises(pqloader.UnsupportedTypeError, match="'id'"):
        pqloader.Loader(path, lists={"id": "ragged"})
    with pytest.raises(ValueError, match="once"):
        pqloader.Loader(path, lists={"tok": "ragged"}, transforms={"tok": [T.PadOrTruncate(4)]})
    with pytest.raises(TypeError, match="lists"):
        pqloader.Loader(path, lists={"tok": "zigzag"})
    with pytest.raises(ValueError, match="multiple_of"):
        pqloader.Pad(multiple_of=0)
    with pytest.raises(ValueError, match="not both"):
        pqloader.Pad(length=8, max_length=4)
    # Without a choice, rows of different lengths are refused when the loader is made
    # (from the footers), naming the way out.
    with pytest.raises(pqloader.InvalidDataError, match="differ in length.*lists=") as ei:
        pqloader.Loader(path, batch_size=64)
    assert "'tok'" in str(ei.value)


@pytest.mark.parametrize("cache", [None, ":memory:"])
def test_a_list_column_of_empty_lists_is_shuffled_as_rows_of_shape_0(tmp_path, cache):
    # Rows of zero bytes: the whole-window gather refused them ("cannot be gathered whole
    # in a shuffle window"), so only unshuffled loaders read such a column.
    n = 700
    pq.write_table(pa.table({"id": np.arange(n), "e": pa.array([[]] * n, pa.list_(pa.float32()))}),
                   tmp_path / "empty.parquet", row_group_size=100)
    for shuffle in (False, True):
        loader = pqloader.Loader(str(tmp_path), batch_size=64, shuffle=shuffle, seed=5, num_epochs=2,
                                 cache_dir=cache, num_workers=2)
        ids = []
        for b in loader:
            assert b["e"].shape == (len(b["id"]), 0) and b["e"].dtype == np.float32
            ids.append(b["id"])
        ids = np.concatenate(ids)
        assert sorted(ids.tolist()) == sorted(list(range(n)) * 2)
        assert (ids[:n].tolist() == list(range(n))) != shuffle


@pytest.mark.parametrize("pad", [dict(length=2**62), dict(multiple_of=2**62),
                                 dict(max_length=2**62, multiple_of=2**41)])
def test_a_padded_length_beyond_2_40_is_refused_not_written_past_the_batch(tmp_path, pad):
    # n * length * element overflowed: the batch's buffer came out empty and every row was
    # written past it, over the next column (l_length[0] read 274877907007). Refused when
    # the Pad or PadOrTruncate is made (2**70 was a bare std::bad_cast when the Loader was).
    with pytest.raises(ValueError, match=r"must be at most 2\*\*40"):
        pqloader.Pad(**pad)
    with pytest.raises(ValueError, match=r"PadOrTruncate\(length=...\) must be in \[1, 1099511627776\]"):
        T.PadOrTruncate(2**41)
    # The engine's own checks stay (past the Python ones).
    pq.write_table(pa.table({"l": pa.array([[1, 2, 3]] * 64, pa.list_(pa.int32()))}), tmp_path / "l.parquet")
    made = pqloader.Pad()
    for name, value in pad.items():
        object.__setattr__(made, name, value)
    with pytest.raises(ValueError, match=r"must be in \[.*2\^40\]"):
        list(pqloader.Loader(str(tmp_path), batch_size=64, lists={"l": made}))
    op = T.PadOrTruncate(4)
    op.params["length"] = 2**41
    with pytest.raises(ValueError, match=r"whole length in \[1, 2\^40\]"):
        list(pqloader.Loader(str(tmp_path), batch_size=64, transforms={"l": [op]}))


@pytest.mark.parametrize("mode, extra", [("ragged", "x_offsets"), (pqloader.Pad(), "x_length")])
def test_lists_extra_column_clashing_with_a_dataset_column_is_refused(tmp_path, mode, extra):
    # The batch (a dict) kept one of the two: the file's column was handed out as the
    # offsets (lengths) of x, silently.
    path = tmp_path / "clash.parquet"
    pq.write_table(pa.table({"x": pa.array([[1], [2, 3]]), extra: pa.array([7, 8])}), path)
    with pytest.raises(pqloader.InvalidDataError, match=repr(extra)):
        pqloader.Loader(str(path), lists={"x": mode}, batch_size=2)
    loader = pqloader.Loader(str(path), columns=["x"], lists={"x": mode}, batch_size=2)
    batch = next(iter(loader))
    assert batch[extra].tolist() == ([0, 1, 3] if mode == "ragged" else [1, 2])


@pytest.mark.parametrize("layout", [{"lists": {"t": "ragged"}}, {"lists": {"t": pqloader.Pad()}},
                                    {"transforms": {"t": [T.PadOrTruncate(4)]}},
                                    {"pack": pqloader.Pack("t", seq_len=4)}], ids=repr)
def test_a_scalar_fill_null_is_not_checked_against_the_columns_a_layout_adds(tmp_path, layout):
    # fill_null=0.5 in a float column was refused for t_offsets / t_length / position_ids
    # being int64, and fill_null=-1 in an int column for loss_mask being bool: columns no
    # file holds, which are never null.
    pq.write_table(pa.table({"t": pa.array([[1.5, None, 3], [5, 6]], pa.list_(pa.float32())),
                             "i": pa.array([[1, None], [2]], pa.list_(pa.int32()))}), tmp_path / "f.parquet")

    def values(column, fill, layout):
        b = next(iter(pqloader.Loader(str(tmp_path), columns=[column], batch_size=2, fill_null=fill, **layout)))
        if "loss_mask" in b:
            return b[column][b["loss_mask"]].tolist()
        if column + "_length" in b:
            return [v for row, n in zip(b[column], b[column + "_length"]) for v in row[:n].tolist()]
        return b[column].tolist()

    assert values("t", 0.5, layout) == [1.5, 0.5, 3, 5, 6]
    renamed = {k: ({"i": v["t"]} if isinstance(v, dict) else pqloader.Pack("i", seq_len=4)) for k, v in layout.items()}
    assert values("i", -1, renamed) == [1, -1, 2]


def test_a_row_group_of_empty_lists_beside_longer_rows_is_refused_when_made(tmp_path):
    # The definition-level histograms show 0 values in 3 non-null rows beside 2 per row:
    # the Loader was made and gave batches (3, 2) then (3, 0) (or failed mid-epoch).
    pq.write_table(pa.table({"id": [0, 1, 2], "l": pa.array([[1, 2]] * 3, pa.list_(pa.int32()))}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": [3, 4, 5], "l": pa.array([[]] * 3, pa.list_(pa.int32()))}),
                   tmp_path / "b.parquet")
    with pytest.raises(pqloader.InvalidDataError, match=r"differ in length .*b\.parquet' row group 0.*lists="):
        pqloader.Loader(str(tmp_path), batch_size=3)
    got = [b["l_offsets"].tolist() for b in pqloader.Loader(str(tmp_path), batch_size=6, lists={"l": "ragged"})]
    assert got == [[0, 2, 4, 6, 6, 6, 6]]
    # Every row group empty: one length, 0 (as before).
    assert next(iter(pqloader.Loader(str(tmp_path / "b.parquet"), batch_size=3)))["l"].shape == (3, 0)


def test_a_shuffle_windows_rows_of_two_lengths_name_their_row_groups(tmp_path):
    # Files whose footers tell nothing of lengths (Polars without statistics): the shuffled
    # batch's error named no file ("batch 0 of epoch 0: column 'l': rows of one shuffle
    # window have different shapes"); the unshuffled one names them.
    pl = pytest.importorskip("polars")
    for i, n in enumerate((2, 3)):
        pl.DataFrame({"l": [[1] * n] * 3}).write_parquet(str(tmp_path / f"{i}.parquet"), statistics=False)
    loader = pqloader.Loader(str(tmp_path), batch_size=3, shuffle=True, seed=1, shuffle_window=2)
    with pytest.raises(pqloader.InvalidDataError, match=r"0\.parquet' row group 0, '.*1\.parquet' row group 0\)"):
        list(loader)


def test_a_row_group_of_only_null_lists_is_filled_as_long_as_the_others(tmp_path):
    # README: "A null list is a list of fill values as long as the others".
    # A row group whose rows are all null lists gave rows of length 0: a batch of width 0,
    # or "rows of one batch have different shapes, (2,) and (0,)".
    t = pa.table({"l": pa.array([[1, 2], [3, 4], None, None], pa.list_(pa.int32()))})
    pq.write_table(t, tmp_path / "a.parquet", row_group_size=2)
    for kw in (dict(batch_size=2), dict(batch_size=4), dict(batch_size=2, shuffle=True, seed=1)):
        rows = sorted(r for b in pqloader.Loader(str(tmp_path), fill_null={"l": 7}, **kw)
                      for r in b["l"].tolist())
        assert rows == [[1, 2], [3, 4], [7, 7], [7, 7]], kw


def test_a_null_list_is_as_long_as_the_others_whatever_the_filter_keeps(tmp_path):
    # The same null row loaded as [7, 7] unfiltered and [] where the filter
    # kept only null rows of its row group.
    t = pa.table({"i": [0, 1, 2, 3], "l": pa.array([[1, 2], None, [3, 4], None], pa.list_(pa.int32()))})
    pq.write_table(t, tmp_path / "a.parquet", row_group_size=2)
    for flt in (None, "i == 1", "i in [1, 3]"):
        got = {i: r for b in pqloader.Loader(str(tmp_path), fill_null={"l": 7}, batch_size=2, filter=flt)
               for i, r in zip(b["i"].tolist(), b["l"].tolist())}
        assert got[1] == [7, 7], flt


@pytest.mark.parametrize("flt", ["i >= 2", "i in [2, 3]"])
def test_a_null_list_is_as_long_as_the_others_where_the_filter_keeps_only_row_groups_of_null_lists(tmp_path, flt):
    # The footers' length came from the row groups the filter kept: where it kept only a
    # row group of null lists, the same null row loaded as [] instead of [7, 7].
    t = pa.table({"i": [0, 1, 2, 3], "l": pa.array([[1, 2], [3, 4], None, None], pa.list_(pa.int32()))})
    pq.write_table(t, tmp_path / "a.parquet", row_group_size=2)
    got = {i: r for b in pqloader.Loader(str(tmp_path), fill_null={"l": 7}, batch_size=2, filter=flt)
           for i, r in zip(b["i"].tolist(), b["l"].tolist())}
    assert got == {2: [7, 7], 3: [7, 7]}


def _filled_rows(path, **kwargs):
    return [r for b in pqloader.Loader(str(path), fill_null={"l": 7}, batch_size=2, **kwargs)
            for r in b["l"].tolist()]


def test_a_null_list_is_as_long_as_the_others_where_the_footers_tell_no_length(tmp_path):
    # Polars writes no definition-level histograms: a row group with nulls tells no length,
    # and a unit of null lists only (a rank's share of a row group, a row group of nulls)
    # loaded as rows of 0, silently, where pyarrow's file of the same rows gave [7, 7].
    pl = pytest.importorskip("polars")
    one = tmp_path / "one.parquet"  # one row group
    pl.DataFrame({"l": [[1, 2], [3, 4], None, None]}, schema={"l": pl.List(pl.Int32)}).write_parquet(str(one))
    assert [_filled_rows(one, rank=r, world_size=2) for r in (0, 1)] == [[[1, 2], [3, 4]], [[7, 7], [7, 7]]]
    two = tmp_path / "two" / "a.parquet"  # row groups [None, None] and [[1, 2], [3, 4]]
    two.parent.mkdir()
    pl.DataFrame({"l": [None, None, [1, 2], [3, 4]]}, schema={"l": pl.List(pl.Int32)}).write_parquet(
        str(two), row_group_size=2)
    assert pq.ParquetFile(two).metadata.row_group(1).column(0).statistics.null_count == 0  # (it tells)
    assert _filled_rows(two.parent) == [[7, 7], [7, 7], [1, 2], [3, 4]]
    # Where nothing tells (no statistics either), a row group of null lists is refused
    # rather than made rows of 0.
    bare = tmp_path / "bare" / "a.parquet"
    bare.parent.mkdir()
    pl.DataFrame({"l": [None, None, [1, 2], [3, 4]]}, schema={"l": pl.List(pl.Int32)}).write_parquet(
        str(bare), row_group_size=2, statistics=False)
    with pytest.raises(pqloader.InvalidDataError, match=r"a\.parquet', row group 0.*'l'.*all null lists.*lists="):
        _filled_rows(bare.parent)
    assert _filled_rows(bare.parent, filter="l is not None") == [[1, 2], [3, 4]]


def test_a_null_list_of_fixed_size_lists_is_as_long_as_the_others(tmp_path):
    # list<fixed_size_list<int32, 2>>: the footers' values per row count the inner values,
    # so no length was taken from them, and a null row was a row of 0 pairs: (2, 0, 2).
    t = pa.table({"l": pa.array([[[1, 2], [3, 4]], [[5, 6], [7, 8]], None, None],
                                pa.list_(pa.list_(pa.int32(), 2)))})
    pq.write_table(t, tmp_path / "a.parquet", row_group_size=2)
    filled = [[[1, 2], [3, 4]], [[5, 6], [7, 8]], [[7, 7], [7, 7]], [[7, 7], [7, 7]]]
    assert _filled_rows(tmp_path) == filled
    pq.write_table(t, tmp_path / "a.parquet")  # one row group: rank 1's rows are its nulls
    assert [r for rank in (0, 1) for r in _filled_rows(tmp_path, rank=rank, world_size=2)] == filled


# -- mutation gaps (tools/mutants by hand: _lists.py) ---------------------------------------
@pytest.mark.parametrize("kwargs", [{"length": 0}, {"max_length": 0}, {"length": -1}, {"max_length": True},
                                    {"length": 2.0}])
def test_pad_refuses_a_length_below_1_or_not_an_int(kwargs):
    with pytest.raises(ValueError, match=f"Pad\\({next(iter(kwargs))}=...\\) must be a positive int"):
        pqloader.Pad(**kwargs)
    assert pqloader.Pad(length=1).length == 1 and pqloader.Pad(max_length=1).max_length == 1


@pytest.mark.parametrize("choice", [5, None, "padded", pqloader.Pack])
def test_lists_refuses_a_choice_that_is_not_ragged_or_pad(tmp_path, choice):
    pq.write_table(pa.table({"x": pa.array([[1, 2], [3]])}), tmp_path / "p.parquet")
    with pytest.raises((TypeError, ValueError), match=r"lists\['x'\]"):
        pqloader.Loader(str(tmp_path), batch_size=2, lists={"x": choice})


@pytest.mark.parametrize("name", ["eos", "pad"])
def test_pack_refuses_eos_or_pad_not_an_int64(name):
    for bad in (1.5, True, "1"):
        with pytest.raises(TypeError, match=f"Pack\\({name}=...\\) must be an int"):
            pqloader.Pack("tokens", seq_len=8, **{name: bad})
    for bad in (2**63, -2**63 - 1):
        with pytest.raises(ValueError, match="does not fit int64"):
            pqloader.Pack("tokens", seq_len=8, **{name: bad})
    for ok in (2**63 - 1, -2**63, 0):
        assert getattr(pqloader.Pack("tokens", seq_len=8, **{name: ok}), name) == ok


def test_a_field_of_a_fixed_size_list_of_structs_is_a_tensor(tmp_path):
    # f.x of fixed_size_list<struct<x, y>>[2] loaded as (batch, 2) but was declared a list
    # per row of unknown length (shape (-1,)): stack= refused it, inspect called it ragged.
    fs = pa.FixedSizeListArray.from_arrays(
        pa.array([{"x": 1, "y": 5}, {"x": 2, "y": 6}, {"x": 3, "y": 7}, {"x": 4, "y": 8}]), 2)
    pq.write_table(pa.table({"f": fs}), tmp_path / "a.parquet")
    loader = pqloader.Loader(str(tmp_path), columns=["f.x", "f.y"], batch_size=2,
                             stack={"xy": ["f.x", "f.y"]})
    assert loader.column_info["xy"]["shape"] == (2, 2)
    (batch,) = list(loader)
    assert batch["xy"].tolist() == [[[1, 2], [5, 6]], [[3, 4], [7, 8]]]
    plain = pqloader.Loader(str(tmp_path), columns=["f.x"], batch_size=2)
    assert plain.column_info["f.x"]["shape"] == (2,)
    assert [b["f.x"].tolist() for b in plain] == [[[1, 2], [3, 4]]]
