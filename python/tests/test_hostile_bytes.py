"""Hostile bytes in data files: every one ends in a pqloader error naming where it is (or a
documented skip), never in a crash, a hang, work proportional to a claimed size, or wrong
data (issue 12, items 1, 3, 5 and the .npz bound)."""

from __future__ import annotations

import io
import re
import struct
import subprocess
import sys
import zipfile
import zlib
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import subprocess_env
from pqloader import _core
from pqloader import transforms as T
from pqloader.cli import _shown

Image = pytest.importorskip("PIL.Image")


def encode(a: np.ndarray, fmt: str, **kw) -> bytes:
    b = io.BytesIO()
    Image.fromarray(a).save(b, format=fmt, **kw)
    return b.getvalue()


def pattern(h: int, w: int, channels: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 256, (h, w, channels), dtype=np.uint8)
    return a[:, :, 0] if channels == 1 else a


def jpeg_missing_sos() -> bytes:
    """A grayscale JPEG cut before its SOS marker: TurboJPEG fails with "missing SOS
    marker" after reading the frame header (one component)."""
    gray = encode(pattern(12, 16, 1, 0), "JPEG", quality=90)
    return gray[: gray.index(b"\xff\xda")]


# -- item 1: a failed JPEG header must not poison the thread's decoder -----------------------


def test_failed_jpeg_header_then_valid_jpegs_on_one_worker_are_skipped_and_decoded_exactly(tmp_path):
    valid = [encode(pattern(20, 24, 3, s), "JPEG", quality=90) for s in range(6)]
    bad = jpeg_missing_sos()
    images, ids_ok = [], []
    for i in range(24):  # bad, good, bad, good, ...: every good image follows a bad one
        if i % 2 == 0:
            images.append(bad)
        else:
            images.append(valid[i % 6])
            ids_ok.append(i)
    path = tmp_path / "mixed.parquet"
    pq.write_table(pa.table({"id": np.arange(24, dtype=np.int64), "image": images}), path,
                   row_group_size=8)
    expected = {i: _core._apply_ops([T.DecodeImage()._spec()], images[i], 0, 0, 0)
                for i in ids_ok}
    assert all(e.shape == (20, 24, 3) for e in expected.values())
    for _ in range(2):  # a second loader in the same process works too
        loader = pqloader.Loader(str(path), batch_size=5, num_workers=1, on_decode_error="skip",
                                 transforms={"image": [T.DecodeImage()]})
        got = {}
        for batch in loader:
            for row, img in zip(batch["id"], batch["image"]):
                got[int(row)] = img
        assert sorted(got) == ids_ok
        for i in ids_ok:
            np.testing.assert_array_equal(got[i], expected[i])
        assert loader.stats()["skipped_rows"] == 12


def test_truncated_progressive_jpegs_are_refused_where_pil_refuses_them(tmp_path):
    # TurboJPEG reports a warning once any warning was emitted, also when a fatal error
    # followed: a progressive file cut short warned of its premature end, then failed on
    # the scan after it, and was taken as decoded, its pixels whatever the output buffer
    # held. Every cut PIL refuses must be refused (PIL decodes none of them).
    prog = encode(pattern(48, 64, 3, 3), "JPEG", quality=90, progressive=True)
    cuts = list(range(160, len(prog)))
    path = tmp_path / "cuts.parquet"
    pq.write_table(pa.table({"i": np.arange(len(cuts)), "image": [prog[:c] for c in cuts]}), path)
    loader = pqloader.Loader(str(path), batch_size=len(cuts), on_decode_error="skip",
                             transforms={"image": [T.DecodeImage()]})
    accepted = [(cuts[int(i)], img) for b in loader for i, img in zip(b["i"], b["image"])]
    for cut, img in accepted:
        with Image.open(io.BytesIO(prog[:cut])) as pil:
            np.testing.assert_array_equal(img, np.asarray(pil.convert("RGB")))
    assert loader.stats()["skipped_rows"] >= len(cuts) - len(accepted) > 0


def test_failed_jpeg_header_raises_naming_file_row_and_column(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"image": [jpeg_missing_sos()]}), path)
    loader = pqloader.Loader(str(path), transforms={"image": [T.DecodeImage()]})
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"bad\.parquet', row group 0, row 0, column 'image'.*JPEG"):
        list(loader)


# -- item 3: corrupt footer counts fail fast, before any work proportional to them -----------


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def patch_counts(src: Path, dst: Path, old: int, new: int, which=None) -> int:
    """Rewrite i64 fields of the footer that hold `old` and follow their predecessor
    (Thrift compact header 0x16) as `new`: occurrences `which` (indexes in footer order),
    or all. Footer order for the test file: FileMetaData.num_rows, then per column chunk
    ColumnMetaData.num_values ('id', 's'), then RowGroup.num_rows."""
    data = src.read_bytes()
    (flen,) = struct.unpack("<i", data[-8:-4])
    start = len(data) - 8 - flen
    footer = data[start:-8]
    pat, rep = b"\x16" + varint(old << 1), b"\x16" + varint(new << 1)
    parts = footer.split(pat)
    which = range(len(parts) - 1) if which is None else which
    out = parts[0]
    for i, part in enumerate(parts[1:]):
        out += (rep if i in which else pat) + part
    dst.write_bytes(data[:start] + out + struct.pack("<i", len(out)) + b"PAR1")
    return len(parts) - 1


@pytest.fixture()
def small_file(tmp_path) -> Path:
    path = tmp_path / "good.parquet"
    pq.write_table(pa.table({"id": np.arange(600, dtype=np.int64),
                             "s": [f"s{i}" for i in range(600)]}), path)
    return path


@pytest.mark.parametrize("which,match", [
    ([1], r"row group 0, column 'id' holds 5000 values for 600 rows"),
    ([2], r"row group 0, column 's' holds 5000 values for 600 rows"),
    ([0, 3], r"row group 0, column 'id' holds 600 values for 5000 rows"),
])
def test_inconsistent_footer_counts_are_refused_at_construction(small_file, which, match):
    bad = small_file.with_name("bad.parquet")
    assert patch_counts(small_file, bad, 600, 5000, which) == 4
    with pytest.raises(pqloader.InvalidDataError, match=r"bad\.parquet' has a corrupt footer: " + match):
        pqloader.Loader(str(bad))


def test_file_level_row_count_is_not_trusted_over_the_row_groups(small_file):
    """Readers go by the row groups (some old writers left the file's count 0)."""
    bad = small_file.with_name("bad.parquet")
    patch_counts(small_file, bad, 600, 5000, [0])
    assert [int(i) for b in pqloader.Loader(str(bad), batch_size=256) for i in b["id"]] == list(range(600))
    patch_counts(small_file, bad, 600, 5000, [1, 2, 3])  # row group and chunks agree on 5000
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"bad\.parquet', row group 0, column 'id': read 600 rows, the footer says 5000"):
        list(pqloader.Loader(str(bad)))


def test_row_count_beyond_any_row_group_is_refused_at_construction(small_file):
    bad = small_file.with_name("bad.parquet")
    patch_counts(small_file, bad, 600, 31_600_000_000)  # consistent everywhere
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"bad\.parquet' has a corrupt footer: row group 0 claims 31600000000 rows"):
        pqloader.Loader(str(bad), batch_size=64)
    assert pqloader.inspect(str(bad))["num_rows"] == 31_600_000_000  # inspect shows the claim


def test_inspect_refuses_a_negative_row_count_and_sums_huge_ones_exactly(small_file, tmp_path):
    # The engine's int64 sum: two files of 2**62 rows each showed -9223372036854775808
    # rows, and negative claims a negative total (CLI: "2 file(s), ..., -10 rows").
    for name, claim in (("big", 2**62), ("huge", 2**63 - 1)):
        d = tmp_path / name
        d.mkdir()
        for i in range(2):
            patch_counts(small_file, d / f"f{i}.parquet", 600, claim)
        info = pqloader.inspect(str(d))
        assert info["num_rows"] == 2 * claim
        assert [f["num_rows"] for f in info["files"]] == [claim, claim]
    d = tmp_path / "neg"
    d.mkdir()
    data = small_file.read_bytes()
    (flen,) = struct.unpack("<i", data[-8:-4])
    start = len(data) - 8 - flen
    footer = data[start:-8].replace(b"\x16" + varint(600 << 1), b"\x16" + varint(5 * 2 - 1))  # zigzag(-5)
    (d / "f0.parquet").write_bytes(data[:start] + footer + struct.pack("<i", len(footer)) + b"PAR1")
    with pytest.raises(pqloader.InvalidDataError, match=r"f0\.parquet' has a corrupt footer: .*claims -5 rows"):
        pqloader.inspect(str(d))


@pytest.mark.parametrize("claim", [5000, 0])
def test_inspect_counts_the_rows_of_the_row_groups_as_the_loader_does(small_file, claim):
    """FileMetaData.num_rows is not what a Loader goes by (old writers left it 0): inspect
    showed "5000 rows" of a file whose one row group, all a Loader reads, holds 600."""
    bad = small_file.with_name("bad.parquet")
    patch_counts(small_file, bad, 600, claim, [0])
    assert pq.ParquetFile(bad).metadata.num_rows == claim
    info = pqloader.inspect(str(bad))
    assert pqloader.Loader(str(bad)).num_rows == 600
    assert info["num_rows"] == 600 and [f["num_rows"] for f in info["files"]] == [600]


RSS_PROBE = """
import sys, pqloader
try:
    for _ in pqloader.Loader(sys.argv[1], batch_size=1 << 20, num_workers=1):
        pass
    print("ok")
except pqloader.InvalidDataError as e:
    print("error:", e)
# VmHWM: this process's own peak RSS (ru_maxrss would include the parent's at fork)
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")))
"""


def probe_rss(probe: str, path) -> tuple[str, int]:
    """Run `probe` (RSS_PROBE or a variant) on `path`: its message and peak RSS in KiB."""
    done = subprocess.run([sys.executable, "-c", probe, str(path)],
                          capture_output=True, text=True, timeout=120, env=subprocess_env())
    assert done.returncode == 0, done.stderr
    message, rss_kb = done.stdout.strip().rsplit("\n", 1)
    return message, int(rss_kb)


def test_consistent_but_false_row_count_fails_when_read_without_memory_for_the_claim(small_file):
    """2^31 - 1 rows claimed everywhere in a 600-row file: the counts agree, so the data
    decides; it is read in bounded batches (reading a column in one piece reserves
    memory for every claimed row: +280 MB peak RSS here before the fix)."""
    bad = small_file.with_name("bad.parquet")
    patch_counts(small_file, bad, 600, 2**31 - 1)
    runs = {name: probe_rss(RSS_PROBE, small_file.with_name(f"{name}.parquet")) for name in ("good", "bad")}
    assert runs["good"][0] == "ok"
    assert re.fullmatch(r"error: cannot decode '.*bad\.parquet', row group 0, column 'id': "
                        r"read 600 rows, the footer says 2147483647", runs["bad"][0])
    assert runs["bad"][1] < runs["good"][1] + 64 * 1024, runs


def test_consistent_but_false_row_count_under_a_filter_fails_without_memory_for_the_claim(small_file):
    """The same file under a filter: its columns were read in one piece and a byte per
    claimed row allocated before the count was checked (peak RSS +2.4 GB; under a 4 GB
    address-space limit a bare std::bad_alloc naming nothing)."""
    bad = small_file.with_name("bad.parquet")
    patch_counts(small_file, bad, 600, 2**31 - 1)
    probe = RSS_PROBE.replace("num_workers=1)", "num_workers=1, filter='id > 300')")
    runs = {name: probe_rss(probe, small_file.with_name(f"{name}.parquet")) for name in ("good", "bad")}
    assert runs["good"][0] == "ok"
    assert re.fullmatch(r"error: cannot read the filter's columns of '.*bad\.parquet', row group 0: "
                        r"read 600 rows, the footer says 2147483647", runs["bad"][0]), runs
    assert runs["bad"][1] < runs["good"][1] + 64 * 1024, runs


def test_long_rle_runs_beyond_the_plausible_row_density_still_read_exactly(tmp_path):
    """A constant column: far more rows than bytes, the batched read path."""
    path = tmp_path / "rle.parquet"
    n = 400_000
    table = pa.table({"c": np.full(n, -3, dtype=np.int64), "k": np.full(n, 7, dtype=np.int32)})
    pq.write_table(table, path, row_group_size=n)
    md = pq.ParquetFile(path).metadata.row_group(0)
    assert n > 65536 + 8 * sum(md.column(i).total_uncompressed_size for i in range(2))
    rows = 0
    for b in pqloader.Loader(str(path), batch_size=100_000):
        assert (b["c"] == -3).all() and (b["k"] == 7).all()
        rows += len(b["k"])
    assert rows == n


# -- item 5: invalid UTF-8 in values, headers and names -------------------------------------


def raw_strings(values: list[bytes | None]) -> pa.Array:
    """A pa.string() array holding exactly these bytes (pyarrow would refuse invalid UTF-8)."""
    offsets = np.cumsum([0] + [len(v or b"") for v in values]).astype(np.int32)
    validity = None
    if any(v is None for v in values):
        validity = pa.py_buffer(np.packbits([v is not None for v in values], bitorder="little").tobytes())
    return pa.Array.from_buffers(pa.string(), len(values),
                                 [validity, pa.py_buffer(offsets.tobytes()),
                                  pa.py_buffer(b"".join(v or b"" for v in values))])


GOOD_TEXT = ["ok", "größe", "日本語", "", "emoji 🙂"]


@pytest.mark.parametrize("dictionary", [False, True])
@pytest.mark.parametrize("bad,shown", [
    (b"ab\xff", r"ab\\xff"),
    (b"\xed\xa0\x80", r"\\xed\\xa0\\x80"),  # an encoded surrogate
    (b"caf\xc3", r"caf\\xc3"),               # truncated sequence at the end of a value
])
def test_invalid_utf8_string_raises_naming_file_row_group_row_and_column(tmp_path, dictionary, bad, shown):
    values = [t.encode() for t in GOOD_TEXT] * 3
    values[12] = bad  # row group 1 (rows 8..15), its row 4
    path = tmp_path / "text.parquet"
    pq.write_table(pa.table({"id": np.arange(15), "s": raw_strings(values)}), path, row_group_size=8,
                   use_dictionary=dictionary)
    with pytest.raises(pqloader.InvalidDataError) as e:
        list(pqloader.Loader(str(path), batch_size=4))
    assert re.search(r"text\.parquet', row group 1: column 's', row 4: a string value is not "
                     r"valid UTF-8 \(b'" + shown + r"'\); .*strings=\"bytes\"", str(e.value)), str(e.value)
    got = [v for b in pqloader.Loader(str(path), batch_size=4, strings="bytes") for v in b["s"]]
    assert got == values


def test_values_that_split_one_character_between_them_are_each_invalid(tmp_path):
    """b"a\\xc3" + b"\\xa9b" is valid UTF-8 as a whole; each value is not."""
    path = tmp_path / "split.parquet"
    pq.write_table(pa.table({"s": raw_strings([b"ok", b"a\xc3", b"\xa9b"])}), path, use_dictionary=False)
    with pytest.raises(pqloader.InvalidDataError, match=r"column 's', row 1: .*b'a\\xc3'"):
        list(pqloader.Loader(str(path)))


def test_valid_text_with_nulls_filled_round_trips(tmp_path):
    path = tmp_path / "ok.parquet"
    values = [t.encode() for t in GOOD_TEXT] + [None]
    pq.write_table(pa.table({"s": raw_strings(values)}), path)
    got = [v for b in pqloader.Loader(str(path), fill_null="∅") for v in b["s"]]
    assert got == GOOD_TEXT + ["∅"]
    # (nulls without a fill are refused when the Loader is made: issue 15)
    assert pqloader.Loader(str(path), strings="bytes", fill_null=b"").column_info["s"]["dtype"] == "bytes"


def test_entries_cached_as_bytes_are_not_served_to_a_str_loader(tmp_path):
    path = tmp_path / "text.parquet"
    pq.write_table(pa.table({"s": raw_strings([b"ok", b"\xff"])}), path)
    cache = str(tmp_path / "cache")
    assert [v for b in pqloader.Loader(str(path), strings="bytes", cache_dir=cache) for v in b["s"]] == [b"ok", b"\xff"]
    with pytest.raises(pqloader.InvalidDataError, match="not valid UTF-8"):
        list(pqloader.Loader(str(path), cache_dir=cache))


def test_strings_option_is_checked():
    with pytest.raises(ValueError, match="strings"):
        pqloader.Loader("x.parquet", strings="latin-1")


def test_invalid_utf8_column_name_raises_naming_the_file_and_escaping_the_name(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"id": [1, 2], "colA": [3, 4]}), good, store_schema=False)
    data = good.read_bytes()
    assert data.count(b"colA") == 2  # schema element and column chunk path
    bad = tmp_path / "names.parquet"
    bad.write_bytes(data.replace(b"colA", b"col\xff"))
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"names\.parquet' has a column named b'col\\xff', which is not valid UTF-8"):
        pqloader.Loader(str(bad))
    assert [int(i) for b in pqloader.Loader(str(bad), columns=["id"]) for i in b["id"]] == [1, 2]
    with pytest.raises(pqloader.ColumnNotFoundError, match=r"available columns: 'id' 'col\\xff'"):
        pqloader.Loader(str(bad), columns=["nope"])
    assert list(pqloader.inspect(str(bad))["schema"]) == ["id", "col\\xff"]


def test_npy_header_with_invalid_utf8_is_quoted_in_a_pqloader_error(tmp_path):
    b = io.BytesIO()
    np.save(b, np.arange(4, dtype=np.int32))
    blob = b.getvalue().replace(b"'<i4'", b"'\xff\xfei4'")
    path = tmp_path / "npy.parquet"
    pq.write_table(pa.table({"arr": [blob]}), path)
    loader = pqloader.Loader(str(path), transforms={"arr": [T.DecodeNdarray()]})
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"npy\.parquet', row group 0, row 0, column 'arr': DecodeNdarray\(\): "
                             r"unsupported \.npy dtype "
                             r"'\\xff\\xfei4'"):
        list(loader)


# -- .npz: decompression stops where the .npy header says the data ends ----------------------


def npz_bomb(header_shape: tuple, dtype: str, payload_bytes: int) -> bytes:
    """A one-member zip whose .npy declares `header_shape` but whose deflated stream holds
    `payload_bytes` bytes of zeros after the header (about 1000:1)."""
    b = io.BytesIO()
    np.lib.format.write_array_header_1_0(b, {"descr": dtype, "fortran_order": False,
                                             "shape": header_shape})
    header = b"\x93NUMPY\x01\x00" + b.getvalue()[8:]
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = comp.compress(header)
    chunk = bytes(1 << 20)
    for _ in range(payload_bytes >> 20):
        body += comp.compress(chunk)
    body += comp.flush()
    name = b"arr_0.npy"
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0, 0, len(body), 0xFFFFFFFF,
                        len(name), 0)
    # (an end record of one entry: an archive without one is refused as cut short)
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, 0, 0, 0)
    return local + name + body + end


BOMB_PROBE = """
import sys
from pqloader import _core, transforms as T
blob = open(sys.argv[1], "rb").read()
try:
    a = _core._apply_ops([T.DecodeCompressedNdarray()._spec()], blob, 0, 0, 0)
    print("shape", a.shape)
except Exception as e:
    print(type(e).__name__, e)
# VmHWM: this process's own peak RSS (ru_maxrss would include the parent's at fork)
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")))
"""


def probe(tmp_path: Path, blob: bytes) -> tuple[str, int]:
    path = tmp_path / "blob.npz"
    path.write_bytes(blob)
    done = subprocess.run([sys.executable, "-c", BOMB_PROBE, str(path)], capture_output=True,
                          text=True, timeout=120, env=subprocess_env())
    assert done.returncode == 0, done.stderr
    message, rss_kb = done.stdout.strip().rsplit("\n", 1)
    return message, int(rss_kb)


def test_npz_bomb_inflates_only_the_declared_array(tmp_path):
    """512 MiB of zeros behind a header that declares 4 int32s: the array is decoded from
    its first bytes, and peak RSS does not grow with the payload (it grew by 512+ MiB)."""
    small = io.BytesIO()
    np.savez_compressed(small, np.zeros(4, dtype=np.int32))
    base_message, base_rss = probe(tmp_path, small.getvalue())
    assert base_message == "shape (4,)"
    message, rss = probe(tmp_path, npz_bomb((4,), "<i4", 512 << 20))
    assert message == "shape (4,)"
    assert rss < base_rss + 64 * 1024, (rss, base_rss)


def test_npz_declaring_a_huge_array_is_refused_before_inflating_it(tmp_path):
    message, _ = probe(tmp_path, npz_bomb((1 << 40,), "<f8", 1 << 20))
    assert message.startswith("InvalidDataError .npy array in .npz archive is too large: shape "
                              "(1099511627776,) needs more than 2147483648 bytes"), message
    message, rss = probe(tmp_path, npz_bomb((1 << 28,), "<f8", 1 << 20))  # 2 GiB declared, 1 MiB there
    assert message.startswith("InvalidDataError .npy data is truncated"), message
    assert rss < 256 * 1024


def test_npz_with_a_header_longer_than_the_limit_is_refused():
    body = b"\x93NUMPY\x02\x00" + struct.pack("<I", 1 << 30)
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    deflated = comp.compress(body) + comp.flush()
    blob = struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, 8, 0, 0, 0, len(deflated), 0, 0, 0) + deflated
    blob += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, 0, 0, 0)  # (its end record)
    with pytest.raises(pqloader.InvalidDataError, match=r"\.npy header of 1073741824 bytes"):
        _core._apply_ops([T.DecodeCompressedNdarray()._spec()], blob, 0, 0, 0)


# -- invalid UTF-8 where issue 15's columns reach it: lists of strings, decoded hive values ---


def test_invalid_utf8_in_a_list_of_strings_raises_naming_file_row_group_row_and_column(tmp_path):
    values = [b"ok", "größe".encode(), b"ab\xff", b"", b"x"]
    lists = pa.ListArray.from_arrays(pa.array([0, 2, 2, 4, 5], pa.int32()), raw_strings(values))
    path = tmp_path / "words.parquet"
    pq.write_table(pa.table({"id": np.arange(4), "w": lists}), path, row_group_size=2)
    with pytest.raises(pqloader.InvalidDataError) as e:
        list(pqloader.Loader(str(path), batch_size=4))
    assert re.search(r"words\.parquet', row group 1: column 'w', row 0, list item 0: a string "
                     r"value is not valid UTF-8 \(b'ab\\xff'\); .*strings=\"bytes\"", str(e.value)), str(e.value)
    loader = pqloader.Loader(str(path), batch_size=4, strings="bytes")
    assert loader.column_info["w"]["dtype"] == "bytes"
    got = [v for b in loader for v in b["w"]]
    assert got == [[b"ok", "größe".encode()], [], [b"ab\xff", b""], [b"x"]]
    # valid lists are str, and their bytes cache entries are not served to a str loader
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"w": pa.array([["a", "ß"], []], pa.list_(pa.string()))}), good)
    cache = str(tmp_path / "cache")
    assert [v for b in pqloader.Loader(str(good), cache_dir=cache, strings="bytes") for v in b["w"]] == \
        [[b"a", "ß".encode()], []]
    assert [v for b in pqloader.Loader(str(good), cache_dir=cache) for v in b["w"]] == [["a", "ß"], []]


def test_partition_value_that_decodes_to_invalid_utf8_is_refused_when_selected(tmp_path):
    for value in ("ok", "bad%FF"):
        d = tmp_path / "d" / f"k={value}"
        d.mkdir(parents=True)
        pq.write_table(pa.table({"x": [1, 2]}), d / "part.parquet")
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"gives partition key 'k' a value that is not valid UTF-8 \(b'bad\\xff'\)"):
        pqloader.Loader(str(tmp_path / "d"))
    assert sorted(int(x) for b in pqloader.Loader(str(tmp_path / "d"), columns=["x"]) for x in b["x"]) == [1, 1, 2, 2]


def test_strings_bytes_gives_a_text_partition_key_as_bytes_too(tmp_path):
    # It came out str while every other text column was bytes (and a fill of bytes was
    # refused with "pass strings=\"bytes\"", though it was passed).
    for value in ("Paris", "New%20York", "__HIVE_DEFAULT_PARTITION__"):
        d = tmp_path / f"city={value}"
        d.mkdir()
        pq.write_table(pa.table({"x": [1], "s": ["t"]}), d / "part.parquet")
    loader = pqloader.Loader(str(tmp_path), strings="bytes", fill_null={"city": b"\xff"})
    assert loader.column_info["city"]["dtype"] == loader.column_info["s"]["dtype"] == "bytes"
    assert sorted(v for b in loader for v in b["city"]) == [b"New York", b"Paris", b"\xff"]


def test_invalid_utf8_struct_field_name_is_refused_when_selected(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"id": [1, 2], "s": pa.array([{"fldA": 1, "ok": 2}] * 2)}), good,
                   store_schema=False)
    data = good.read_bytes()
    bad = tmp_path / "nested.parquet"
    bad.write_bytes(data.replace(b"fldA", b"fld\xff"))
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"nested\.parquet' has a column named b's\.fld\\xff', which is not valid UTF-8"):
        pqloader.Loader(str(bad))
    assert [int(v) for b in pqloader.Loader(str(bad), columns=["id", "s.ok"]) for v in b["s.ok"]] == [2, 2]
    assert "not valid UTF-8" in pqloader.inspect(str(bad))["loads_as"]["s"]


# A footer that Parquet C++ parses but cannot serialize again (found by `make fuzz`:
# FileMetaData::WriteTo dereferenced a null inside it). The footer hash of the cache key
# was computed by re-serializing the footer, so merely opening the file crashed the
# process (SIGSEGV); it now hashes the footer's bytes as the file holds them.
FOOTER_PROBE = r"""
import sys, pqloader
try:
    loader = pqloader.Loader(sys.argv[1], batch_size=7, fill_null=0)
    rows = sum(len(next(iter(b.values()))) for b in loader)
    print("rows", rows)
except pqloader.Error as e:
    print("error", type(e).__name__, e)
"""


@pytest.mark.parametrize("cache", [False, True])
def test_a_footer_that_parses_but_does_not_reserialize_is_no_crash(tmp_path, cache):
    path = Path(__file__).parent / "data" / "footer_that_does_not_reserialize.parquet"
    args = [sys.executable, "-c", FOOTER_PROBE, str(path)]
    if cache:  # the footer cache stores the bytes read, not a re-serialization
        args[2] = FOOTER_PROBE.replace("fill_null=0", f"fill_null=0, cache_dir={str(tmp_path)!r}")
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, env=subprocess_env())
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith(("rows", "error")), done.stdout + done.stderr
    if done.stdout.startswith("error"):
        assert "footer_that_does_not_reserialize.parquet" in done.stdout


def test_a_corrupt_page_header_is_one_line_naming_file_row_group_and_column(tmp_path):
    # Thrift's message breaks its line ("...: TProtocolException: Invalid data\n
    # Deserializing page header failed."): an error is one line, for logs and the CLI.
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"x": list(range(100))}), path, compression="none", use_dictionary=False)
    off = pq.ParquetFile(path).metadata.row_group(0).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    data[off:off + 4] = b"\x1d\x1d\x1d\x1d"
    path.write_bytes(bytes(data))
    with pytest.raises(pqloader.InvalidDataError) as ei:
        list(pqloader.Loader(str(path)))
    msg = str(ei.value)
    assert "\n" not in msg and "Deserializing page header failed" in msg, repr(msg)
    assert f"'{path}', row group 0, column 'x'" in msg


def test_an_error_names_a_file_with_a_line_break_in_its_name_as_the_cli_shows_it(tmp_path):
    # The engine's messages are one line: a line break made a space ('a b.parquet', another
    # file's name); it is escaped, as the CLI's error line shows a name (\n, \x1b).
    path = tmp_path / "a\nb\x1b[31m.parquet"
    path.write_bytes(b"PAR1" + bytes(100) + b"PAR1")
    with pytest.raises(pqloader.InvalidDataError) as ei:
        list(pqloader.Loader(str(path)))
    msg = str(ei.value)
    assert msg.isprintable(), repr(msg)
    assert f"'{_shown(str(path))}' is not a readable Parquet file" in msg, repr(msg)


# -- statistics that contradict themselves or do not decode ---------------------------

def _rewrite_footer(src, dst, old: bytes, new: bytes) -> None:
    data = src.read_bytes()
    (length,) = struct.unpack("<i", data[-8:-4])
    start = len(data) - 8 - length
    footer = bytes(data[start:-8])
    assert footer.count(old) == 1, footer.count(old)
    footer = footer.replace(old, new)
    dst.parent.mkdir(exist_ok=True)
    dst.write_bytes(data[:start] + footer + struct.pack("<i", len(footer)) + b"PAR1")


def _ints(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"x": np.arange(100, dtype=np.int64)}), good, use_dictionary=False)
    return good


def test_a_null_count_beyond_the_chunks_values_is_not_taken_for_nulls(tmp_path):
    """Statistics claiming 1000 nulls in a 100-value chunk (none in the data) refused the
    file at construction: "column 'x' (int64) has 1000 null value(s)"."""
    bad = tmp_path / "bad" / "bad.parquet"
    # Statistics.null_count (i64 field 3, zigzag 0) before max_value (field 5, 8 bytes)
    _rewrite_footer(_ints(tmp_path), bad, b"\x16\x00\x28\x08", b"\x16\xd0\x0f\x28\x08")
    assert pq.ParquetFile(bad).metadata.row_group(0).column(0).statistics.null_count == 1000
    got = np.concatenate([b["x"] for b in pqloader.Loader(str(bad))])
    np.testing.assert_array_equal(got, np.arange(100))


def test_a_size_statistics_histogram_with_a_negative_count_does_not_make_lists_ragged(tmp_path):
    """A definition-level histogram [0, -10, 0, 100] (no level count is negative) made
    50 rows of two values each "100 values in 60 rows, not one length per row"."""
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"l": pa.array([[i, i + 1] for i in range(50)], pa.list_(pa.int64()))}), good)
    bad = tmp_path / "bad" / "bad.parquet"
    # SizeStatistics.definition_level_histogram: list of 4 i64, [0, 0, 0, 100] -> [0, -10, 0, 100]
    _rewrite_footer(good, bad, b"\x19\x46\x00\x00\x00\xc8\x01", b"\x19\x46\x00\x13\x00\xc8\x01")
    got = np.concatenate([b["l"] for b in pqloader.Loader(str(bad))])
    np.testing.assert_array_equal(got, np.array([[i, i + 1] for i in range(50)]))


def test_statistics_that_do_not_decode_are_not_used_and_the_error_is_not_the_filters(tmp_path):
    """A decimal's min of 0 bytes (FLBA(5)): the file reads (pyarrow too), but a filter
    on the column refused it: "row group 0: corrupt statistics: Unexpected end of stream"
    (naming no column)."""
    good = tmp_path / "good.parquet"
    values = [Decimal(i) / 100 for i in range(100)]
    pq.write_table(pa.table({"m": pa.array(values, pa.decimal128(10, 2))}), good, use_dictionary=False)
    bad = tmp_path / "bad" / "bad.parquet"
    zero = b"\x00" * 5
    # Statistics.min_value (field 6): 5 bytes of 0.00 -> none
    _rewrite_footer(good, bad, b"\x18\x05" + zero + b"\x11\x11", b"\x18\x00\x11\x11")
    assert pq.read_table(bad).num_rows == 100
    loader = pqloader.Loader(str(bad), filter=pc.field("m") < pa.scalar(Decimal("0.05"), pa.decimal128(10, 2)),
                             decimals="float64")
    got = np.concatenate([b["m"] for b in loader])
    np.testing.assert_array_equal(got, [0.0, 0.01, 0.02, 0.03, 0.04])


@pytest.mark.parametrize("old,new", [
    # min_value 0 -> 60 and max_value 99 -> 10: min > max, no row could satisfy them
    (b"\x28\x08" + struct.pack("<q", 99) + b"\x18\x08" + struct.pack("<q", 0),
     b"\x28\x08" + struct.pack("<q", 10) + b"\x18\x08" + struct.pack("<q", 60)),
    # null_count 0 -> 100 (all) beside a min and a max, which only non-null values have
    (b"\x16\x00\x28\x08", b"\x16\xc8\x01\x28\x08"),
], ids=["min_above_max", "all_null_beside_a_min_and_max"])
def test_statistics_that_contradict_themselves_prune_nothing(tmp_path, old, new):
    """pyarrow's dataset prunes by them too (0 rows for x < 5); they bound no row."""
    bad = tmp_path / "bad" / "bad.parquet"
    _rewrite_footer(_ints(tmp_path), bad, old, new)
    assert pq.read_table(bad).filter(pc.field("x") < 5).num_rows == 5
    loader = pqloader.Loader(str(bad), filter=pc.field("x") < 5, fill_null=0)
    got = np.concatenate([b["x"] for b in loader]) if len(loader) else np.array([])
    np.testing.assert_array_equal(got, np.arange(5))


@pytest.mark.parametrize("claim", [2**62, 2**63 - 2**31 + 2, 2**63 - 1])
def test_a_list_chunk_claiming_values_near_int64_max_is_refused_at_construction(tmp_path, claim):
    """A list chunk's num_values of 2^63 - 1 in a few hundred bytes: the check of what its
    bytes can hold rounded the claim up as (values + 2^31 - 2) / (2^31 - 1), a signed
    overflow past 2^63 - 2^31 (undefined; here it wrapped negative and passed): 2^62 was
    refused as corrupt, the larger claim not (and read as "rows differ in length")."""
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"l": pa.array([[i, i + 1] for i in range(50)], pa.list_(pa.int64()))}),
                   good, write_statistics=False)
    bad = tmp_path / "bad.parquet"
    assert patch_counts(good, bad, 100, claim) == 1  # ColumnMetaData.num_values
    assert pq.ParquetFile(bad).metadata.row_group(0).column(0).num_values == claim
    with pytest.raises(pqloader.InvalidDataError,
                       match=rf"bad\.parquet' has a corrupt footer: row group 0, column "
                             rf"'l\.list\.element' claims {claim} values in \d+ bytes"):
        pqloader.Loader(str(bad), lists={"l": "ragged"})


def test_inspect_shows_a_created_by_that_is_not_utf8_escaped(small_file, tmp_path):
    """A footer's created_by is the writer's text: one not UTF-8 failed inspect with
    "'.' holds a file or directory whose name is not UTF-8" (a Loader reads the file)."""
    d = tmp_path / "d"
    d.mkdir()
    data = small_file.read_bytes()
    old = pq.ParquetFile(small_file).metadata.created_by.encode()
    assert data.count(old) == 1
    new = b"w\xff\xfe" + old[3:]  # same length: the footer's other offsets hold
    (d / "a.parquet").write_bytes(data.replace(old, new))
    assert pqloader.Loader(str(d)).num_rows == 600
    info = pqloader.inspect(str(d))
    assert info["files"][0]["created_by"] == "w\\xff\\xfe" + old[3:].decode()
    assert info["num_rows"] == 600
