"""The leaves of one struct that a loader selects are read together, up to 256 a read
(decode/read_unit.cc, shared reads: one at a time, Arrow built a reader of the whole
struct for each, O(K^2) per row group). Each column must equal pyarrow's value for value
and null for null, with the struct's leaves in several reads, a nested struct, null
struct rows, a list of structs read ragged, shuffled across workers and filtered."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import pqloader

ROWS = 1000
LEAVES = 600  # over two reads' worth (256): three reads of one field


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    rng = np.random.default_rng(3)
    kids, names = [], []
    for i in range(LEAVES):
        if i % 3 == 0:
            kids.append(pa.array(rng.random(ROWS, dtype=np.float32)))
        elif i % 3 == 1:
            kids.append(pa.array(rng.integers(-9, 9, ROWS)))
        else:
            kids.append(pa.array([f"v{i}_{j % 11}" for j in range(ROWS)]))
        names.append(f"k{i}")
    kids.append(pa.StructArray.from_arrays(
        [pa.array(rng.random(ROWS)), pa.array(np.arange(ROWS, dtype=np.int32))], ["x", "y"]))
    names.append("in")
    struct = pa.StructArray.from_arrays(kids, names, mask=pa.array(np.arange(ROWS) % 13 == 5))
    offsets = np.concatenate([[0], np.cumsum(rng.integers(0, 4, ROWS))]).astype(np.int32)
    n = int(offsets[-1])
    spans = pa.ListArray.from_arrays(pa.array(offsets), pa.StructArray.from_arrays(
        [pa.array(np.arange(n, dtype=np.int64)), pa.array(rng.random(n, dtype=np.float32))],
        ["start", "w"]))
    table = pa.table({"id": np.arange(ROWS), "s": struct, "spans": spans})
    path = tmp_path_factory.mktemp("struct") / "s.parquet"
    pq.write_table(table, path, row_group_size=300)
    leaves = [f"s.k{i}" for i in range(LEAVES)] + ["s.in.x", "s.in.y"]
    return str(path), table, leaves


def is_text(column: str) -> bool:
    return column.startswith("s.k") and int(column[3:]) % 3 == 2


@pytest.mark.parametrize("how", ["plain", "shuffled", "filtered"])
def test_every_leaf_of_a_wide_struct_equals_pyarrows(wide, how):
    path, table, leaves = wide
    keep = np.arange(ROWS)
    kw: dict = {}
    if how == "shuffled":
        kw = dict(shuffle=True, seed=5, num_workers=2)
    elif how == "filtered":
        keep = np.nonzero(np.arange(ROWS) % 3 != 1)[0]
        kw = dict(filter=pc.field("id").isin(keep.tolist()))
    loader = pqloader.Loader(path, batch_size=128, columns=["id", *leaves, "spans.start", "spans.w"],
                             null_mask=True, fill_null={c: "" if is_text(c) else 0 for c in leaves},
                             lists={"spans.start": "ragged", "spans.w": "ragged"}, **kw)
    got: dict[str, list] = {}
    ragged: dict[int, tuple[list, list]] = {}
    for b in loader:
        for k, v in b.items():
            got.setdefault(k, []).append(v)
        for name, out in (("spans.start", 0), ("spans.w", 1)):
            values, offsets = b[name], b[name + "_offsets"]
            for r, i in enumerate(b["id"]):
                ragged.setdefault(int(i), ([], []))[out][:] = values[offsets[r]:offsets[r + 1]].tolist()
    ids = np.concatenate(got["id"])
    assert sorted(ids.tolist()) == keep.tolist()
    order = np.argsort(ids)
    flat = table.flatten().flatten()
    for c in leaves:
        expected = flat.column(c).combine_chunks()
        valid = np.concatenate(got[c + "_valid"])[order]
        assert (valid == np.asarray(expected.is_valid())[keep]).all(), c
        if is_text(c):
            values = [x for v in got[c] for x in v]
            assert [values[i] for i in order] == [expected[int(i)].as_py() or "" for i in keep], c
        else:
            values = np.concatenate(got[c])[order]
            assert np.array_equal(values, np.asarray(expected.fill_null(0))[keep]), c
    spans = table.column("spans").to_pylist()
    for i in keep:
        row = spans[i] or []
        assert ragged[int(i)][0] == [x["start"] for x in row], i
        assert np.allclose(ragged[int(i)][1], [x["w"] for x in row]), i


def test_a_corrupt_leaf_read_with_others_of_its_struct_is_named(tmp_path):
    """A read of several leaves that fails is read again leaf by leaf, so that the error
    names the column whose page is corrupt, as when each leaf was read alone."""
    struct = pa.StructArray.from_arrays(
        [pa.array(np.arange(100) * k) for k in (1, 2, 3)], ["a", "b", "c"])
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"id": np.arange(100), "s": struct}), path, compression="none",
                   use_dictionary=False, row_group_size=100)
    chunk = pq.ParquetFile(path).metadata.row_group(0).column(2)
    assert chunk.path_in_schema == "s.b"
    raw = bytearray(path.read_bytes())
    raw[chunk.data_page_offset:chunk.data_page_offset + 12] = b"\xff" * 12  # its page header
    path.write_bytes(bytes(raw))
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"s\.parquet', row group 0, column 's\.b' \(corrupt or truncated data\)"):
        list(pqloader.Loader(str(path), batch_size=50, columns=["id", "s.a", "s.b", "s.c"]))


def test_long_list_leaves_of_a_struct_among_flat_ones_equal_pyarrows(tmp_path):
    """Leaves of long lists (1,500 values a row: over a shared read's values a row) are
    read alone, and the flat leaves between them together: every column still equals
    pyarrow's, in order, whichever read it fell into."""
    rows, width = 40, 1500
    kids, names = [], []
    for i in range(9):
        if i % 3 == 1:
            values = pa.array(np.arange(rows * width, dtype=np.float32) + i)
            kids.append(pa.FixedSizeListArray.from_arrays(values, width).cast(pa.list_(pa.float32())))
        else:
            kids.append(pa.array(np.arange(rows, dtype=np.int64) * (i + 1)))
        names.append(f"f{i}")
    table = pa.table({"s": pa.StructArray.from_arrays(kids, names)})
    path = tmp_path / "s.parquet"
    pq.write_table(table, path, row_group_size=rows)
    columns = [f"s.f{i}" for i in range(9)]
    lists = {c: "ragged" for c in columns[1::3]}
    got: dict[str, list] = {}
    for b in pqloader.Loader(str(path), batch_size=16, columns=columns, lists=lists):
        for c in columns:
            got.setdefault(c, []).append(b[c])
    flat = table.flatten()
    for c in columns:
        expected = flat.column(c).combine_chunks()
        if c in lists:
            assert np.array_equal(np.concatenate(got[c]), np.asarray(expected.flatten())), c
        else:
            assert np.array_equal(np.concatenate(got[c]), np.asarray(expected)), c
