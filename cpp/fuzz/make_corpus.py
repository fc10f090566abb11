"""Write the seed corpora of the fuzz drivers (cpp/fuzz/*_fuzz.cc) into OUT/<target>/.

    python cpp/fuzz/make_corpus.py OUT

Seeds are built here from seeded generators, the way the tests build their data (no
binaries are committed): small Parquet files of every supported layout (and the small
files of the parquet-testing corpus when it is present, see python/tests/conftest.py),
cache entries written by a real loader, .npy/.npz arrays, and JPEG/PNG images. Needs
the test environment (pyarrow, numpy, Pillow, and pqloader itself for cache entries).
"""

from __future__ import annotations

import io
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

MAX_SEED_BYTES = 64 << 10


def parquet_seeds(out: Path) -> None:
    rng = np.random.default_rng(0)
    n = 40
    tables = {
        "mixed": pa.table({
            "id": np.arange(n, dtype=np.int64),
            "x": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(3 * n).astype(np.float32)), 3),
            "s": [f"s{i}" for i in range(n)],
            "b": [bytes([i]) * (i % 5) for i in range(n)],
        }),
        "nulls": pa.table({"i": pa.array([None if i % 3 == 0 else i for i in range(n)], pa.int32()),
                           "s": pa.array([None if i % 4 == 0 else "v" for i in range(n)])}),
        "lists": pa.table({"l": pa.array([[i] * (i % 4) for i in range(n)], pa.list_(pa.int16())),
                           "f": pa.array(rng.standard_normal(n).astype(np.float16))}),
        "temporal": pa.table({"t": pa.array(np.arange(n).astype("datetime64[us]")),
                              "d": pa.array(np.arange(n).astype("datetime64[D]")),
                              "flag": np.arange(n) % 2 == 0}),
        "dict": pa.table({"c": pa.array(["a", "b", "a", "c"] * (n // 4)).dictionary_encode()}),
    }
    for name, table in tables.items():
        for codec in ("NONE", "SNAPPY", "ZSTD", "GZIP"):
            for version in ("1.0", "2.0"):
                path = out / f"{name}-{codec}-{version}.parquet"
                pq.write_table(table, path, compression=codec, row_group_size=13,
                               data_page_version=version, write_statistics=version == "2.0")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tests"))
    try:
        from conftest import find_conformance_dir  # noqa: PLC0415
        corpus = find_conformance_dir()
    except ImportError:
        corpus = None
    if corpus is not None:
        for p in sorted((corpus / "data").rglob("*.parquet")) + sorted((corpus / "bad_data").rglob("*.parquet")):
            if p.stat().st_size <= MAX_SEED_BYTES:
                shutil.copy(p, out / f"testing-{p.name}")


def cache_entry_seeds(out: Path) -> None:
    import pqloader  # noqa: PLC0415

    rng = np.random.default_rng(1)
    n = 30
    table = pa.table({
        "id": np.arange(n, dtype=np.int64),
        "x": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(3 * n).astype(np.float32)), 3),
        "s": [f"row-{i}" for i in range(n)],
        "b": [bytes(range(i % 7)) for i in range(n)],
    })
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "d.parquet"
        pq.write_table(table, data, row_group_size=8)
        for shuffle in (False, True):  # columnar and row-major entries
            cache = Path(tmp) / f"cache-{shuffle}"
            for _ in pqloader.Loader(str(data), batch_size=5, shuffle=shuffle, seed=1, cache_dir=str(cache)):
                pass
            for i, entry in enumerate(sorted(cache.glob("shard-*/*.pqc"))):
                shutil.copy(entry, out / f"entry-{'rowmajor' if shuffle else 'columnar'}-{i}.pqc")


def ndarray_seeds(out: Path) -> None:
    rng = np.random.default_rng(2)
    arrays = [np.arange(6, dtype=np.int32).reshape(2, 3), rng.standard_normal((3, 2)).astype(">f8"),
              np.zeros((0, 4), dtype=np.uint8), np.asfortranarray(np.arange(24, dtype=np.int16).reshape(2, 3, 4)),
              np.array([True, False]), np.float16(1.5) * np.ones(5, dtype=np.float16)]
    for i, a in enumerate(arrays):
        b = io.BytesIO()
        np.save(b, a)
        (out / f"npy-{i}").write_bytes(b"\x00" + b.getvalue())  # first byte even: DecodeNdarray
        z = io.BytesIO()
        np.savez_compressed(z, a)
        (out / f"npz-{i}").write_bytes(b"\x01" + z.getvalue())  # odd: DecodeCompressedNdarray


def image_seeds(out: Path) -> None:
    from PIL import Image  # noqa: PLC0415

    rng = np.random.default_rng(3)
    for i, (h, w, mode) in enumerate([(16, 24, "RGB"), (9, 7, "L"), (33, 17, "RGB"), (8, 8, "RGBA"), (5, 12, "P"),
                                      (12, 10, "CMYK")]):
        a = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
        img = Image.fromarray(a, "RGBA").convert(mode)
        for fmt in ("PNG", "JPEG"):
            if mode not in {"PNG": ("RGB", "L", "RGBA", "P"), "JPEG": ("RGB", "L", "CMYK")}[fmt]:
                continue
            b = io.BytesIO()
            img.save(b, format=fmt, **({"quality": 80} if fmt == "JPEG" else {}))
            (out / f"{fmt.lower()}-{i}").write_bytes(bytes([i % 4]) + b.getvalue())
    b = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(b, format="JPEG", progressive=True)
    (out / "jpeg-progressive").write_bytes(b"\x02" + b.getvalue())
    for orientation, fmt in ((6, "JPEG"), (7, "JPEG"), (8, "PNG")):  # EXIF orientation, applied (bit 2)
        exif = Image.Exif()
        exif[0x0112] = orientation
        b = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (16, 24, 3), dtype=np.uint8)).save(b, format=fmt, exif=exif)
        (out / f"{fmt.lower()}-exif-{orientation}").write_bytes(bytes([4 | (orientation & 3)]) + b.getvalue())


def summary_seeds(out: Path) -> None:
    """Modes of summary_fuzz.cc (the summary it edits is made in the driver): each mode
    unedited, and one edit of each kind."""
    for mode in range(8):
        (out / f"mode-{mode}").write_bytes(bytes([mode]))
    (out / "set").write_bytes(bytes([0, 0, 40, 0xFF, 0]))
    (out / "insert").write_bytes(bytes([1, 0, 80, 0x00, 1]))
    (out / "truncate").write_bytes(bytes([2, 0, 60, 0x00, 2]))


def main() -> int:
    root = Path(sys.argv[1])
    for target, make in (("fuzz_parquet", parquet_seeds), ("fuzz_cache_entry", cache_entry_seeds),
                         ("fuzz_ndarray", ndarray_seeds), ("fuzz_image", image_seeds),
                         ("fuzz_summary", summary_seeds)):
        out = root / target
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        make(out)
        print(f"{target}: {len(list(out.iterdir()))} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
