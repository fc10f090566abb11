"""Hostile bytes in data files: every one ends in a pqloader error naming where it is (or a
documented skip), never in a crash, a hang, work proportional to a claimed size, or wrong
data (issue 12, items 1, 3, 5 and the .npz bound)."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from pqloader import _core
from pqloader import transforms as T

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


def test_failed_jpeg_header_raises_naming_file_row_and_column(tmp_path):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"image": [jpeg_missing_sos()]}), path)
    loader = pqloader.Loader(str(path), transforms={"image": [T.DecodeImage()]})
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"bad\.parquet', row group 0, row 0, column 'image'.*JPEG"):
        list(loader)
