"""Null rows of maps and lists of structs (their fields by dotted path) under fill_null=
and null_mask=, and the footers' checks of the null rows pyarrow's statistics leave out."""
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader

ST = pa.struct([("a", pa.int32()), ("b", pa.int32())])


def _rows(loader):
    out = {}
    for b in loader:
        for k, v in b.items():
            out.setdefault(k, []).extend(v.tolist() if hasattr(v, "tolist") else v)
    return out


@pytest.mark.parametrize("kwargs", [{"fill_null": {"m.key": 9, "m.value": "z"}},
                                    {"null_mask": True},
                                    {"fill_null": {"m.key": 9, "m.value": "z"}, "null_mask": True}],
                         ids=["fill", "mask", "fill+mask"])
def test_a_null_map_rows_number_field_is_filled_and_its_string_field_empty(tmp_path, kwargs):
    # As the README says: a null list of numbers is a list of fills as long as the others,
    # a null list of strings (list[list[str]], rows of any length) is empty, so the fields
    # of one null map row differ in length; null_mask= flags the row in both.
    m = pa.array([[(1, "x"), (2, "y")], None, [(3, "z"), (4, "w")]], pa.map_(pa.int32(), pa.string()))
    pq.write_table(pa.table({"m": m}), tmp_path / "a.parquet")
    got = _rows(pqloader.Loader(str(tmp_path / "a.parquet"), columns=["m.key", "m.value"],
                                batch_size=3, **kwargs))
    fill = 9 if "fill_null" in kwargs else 0
    assert got["m.key"] == [[1, 2], [fill, fill], [3, 4]]
    assert got["m.value"] == [["x", "y"], [], ["z", "w"]]
    if "null_mask" in kwargs:
        assert got["m.key_valid"] == got["m.value_valid"] == [True, False, True]


def test_null_rows_of_a_list_of_structs_are_refused_when_the_loader_is_made(tmp_path):
    # pyarrow writes a null count of 0 for s.list.element.a where whole rows are null
    # (its count leaves out nulls above the struct), while the definition-level histogram
    # counts them: the Loader was made and failed at the first batch of row group 1.
    s = pa.array([[{"a": 1, "b": 2}], [{"a": 3, "b": 4}], None, None], pa.list_(ST))
    pq.write_table(pa.table({"s": s}), tmp_path / "a.parquet", row_group_size=2)
    assert pq.ParquetFile(tmp_path / "a.parquet").metadata.row_group(1).column(0).statistics.null_count == 0
    with pytest.raises(pqloader.InvalidDataError, match=r"'s\.a'.*null"):
        pqloader.Loader(str(tmp_path / "a.parquet"), columns=["s.a"])


def _spoil_histograms(src, dst, pairs):
    data = src.read_bytes()
    (length,) = struct.unpack("<i", data[-8:-4])
    start = len(data) - 8 - length
    footer = bytes(data[start:-8])
    for old, new in pairs:
        assert footer.count(old) == 2, footer.count(old)  # (s.a's and s.b's)
        footer = footer.replace(old, new)
    dst.write_bytes(data[:start] + footer + struct.pack("<i", len(footer)) + b"PAR1")


def test_a_list_of_structs_without_histograms_is_not_taken_for_ragged_by_its_null_rows(tmp_path):
    # Without a definition-level histogram (older writers; here spoilt to sum past the
    # chunk's levels, so not used), pyarrow's null count of 0 was taken for "no null row
    # and no empty list": row group 0's 3 levels (2 values and a null row) in 2 rows read
    # as "not one length per row", and the Loader refused the column as ragged.
    s = pa.array([[{"a": 1, "b": 2}, {"a": 3, "b": 4}], None, [{"a": 5, "b": 6}, {"a": 7, "b": 8}],
                  [{"a": 9, "b": 10}, {"a": 11, "b": 12}]], pa.list_(ST))
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"s": s}), good, row_group_size=2)
    bad = tmp_path / "bad.parquet"
    # SizeStatistics.definition_level_histogram, 5 i64 (zigzag): [1,0,0,0,2] and [0,0,0,0,4]
    _spoil_histograms(good, bad, [(b"\x19\x56\x02\x00\x00\x00\x04", b"\x19\x56\x02\x00\x00\x00\x06"),
                                  (b"\x19\x56\x00\x00\x00\x00\x08", b"\x19\x56\x00\x00\x00\x00\x0a")])
    assert pq.read_table(bad).column("s").to_pylist() == s.to_pylist()
    got = _rows(pqloader.Loader(str(bad), columns=["s.a", "s.b"], batch_size=4, fill_null=9))
    assert got == {"s.a": [[1, 3], [9, 9], [5, 7], [9, 11]], "s.b": [[2, 4], [9, 9], [6, 8], [10, 12]]}
