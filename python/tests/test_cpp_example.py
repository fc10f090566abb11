"""The C++ API as a program of its own uses it: examples/cpp/read_batches.

The program links libpqloader through CMake (`target_link_libraries(... pqloader)`, as
examples/cpp/CMakeLists.txt does) and is built with the tests (`make build`). Each of its
lines (one per epoch: batches, rows, per column of numbers the sum and an order checksum,
per string column the total length) must equal the same line computed from
pqloader.Loader's batches with the same options and seed: one engine, two front ends,
the same stream. The sums are also checked against the table itself (integers as floats,
so every sum is exact in any order).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader

ROOT = Path(__file__).resolve().parents[2]
PROGRAM = Path(os.environ.get("PQLOADER_CPP_EXAMPLE", ROOT / "build/py/examples/cpp/read_batches"))


@pytest.fixture(scope="module")
def program():
    assert PROGRAM.is_file(), f"{PROGRAM} is missing: `make build` builds it (or set PQLOADER_CPP_EXAMPLE)"
    return str(PROGRAM)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpp_example")
    start = 0
    for i, (rows, group) in enumerate([(3000, 700), (1234, 1234), (2000, 512)]):
        ids = np.arange(start, start + rows)
        pq.write_table(pa.table({
            "id": ids.astype(np.int64),
            "x": (ids % 1000).astype(np.float32),
            "v": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids % 7, 2).astype(np.int16)), 2),
            "s": [f"row{j}" for j in ids],
        }), root / f"part-{i}.parquet", row_group_size=group)
        start += rows
    return root


def python_lines(source, *, epochs, **options):
    """The program's lines, computed from pqloader.Loader's batches."""
    loader = pqloader.Loader(str(source), num_epochs=1, **options)
    lines = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        batches = list(loader)
        text = f"epoch {epoch} batches {len(batches)} rows {sum(len(b['id']) for b in batches)}"
        for name in batches[0]:
            values = [b[name] for b in batches]
            if isinstance(values[0], list):  # strings
                text += f" {name}={sum(len(s.encode()) for v in values for s in v):.17g}"
                continue
            flat = np.concatenate([v.reshape(-1) for v in values]).astype(np.float64)
            ordered = float(np.sum(flat * np.arange(1, len(flat) + 1, dtype=np.float64)))
            text += f" {name}={repr_g(float(flat.sum()))}/{repr_g(ordered)}"
        lines.append(text)
    return lines


def repr_g(value: float) -> str:
    return f"{value:.17g}"


def run(program, source, *args):
    done = subprocess.run([program, *args, str(source)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("workers", [1, 3])
def test_the_cpp_program_reads_what_python_reads(program, data, shuffle, workers):
    args = ["--batch-size", "300", "--seed", "11", "--epochs", "2", "--workers", str(workers)]
    if shuffle:
        args.append("--shuffle")
    lines = run(program, data, *args)
    assert lines == python_lines(data, epochs=2, batch_size=300, seed=11, shuffle=shuffle, num_workers=workers)
    table = pq.read_table(data)
    for line in lines:
        fields = dict(f.split("=") for f in line.split()[6:])
        assert float(fields["id"].split("/")[0]) == pa.compute.sum(table["id"]).as_py()
        assert float(fields["x"].split("/")[0]) == pa.compute.sum(table["x"]).as_py()
        assert float(fields["v"].split("/")[0]) == 2 * sum(i % 7 for i in range(table.num_rows))
        assert float(fields["s"]) == sum(len(s) for s in table["s"].to_pylist())
    if shuffle:  # each epoch its own order, the same rows
        assert lines[0].split()[6] != lines[1].split()[6]


def test_the_cpp_program_selects_columns_and_reports_errors(program, data, tmp_path):
    lines = run(program, data, "--columns", "x,id", "--epochs", "1")
    assert lines == python_lines(data, epochs=1, batch_size=1024, seed=0, columns=["x", "id"])
    assert [f.split("=")[0] for f in lines[0].split()[6:]] == ["x", "id"]
    done = subprocess.run([program, str(tmp_path / "missing.parquet")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "missing.parquet" in done.stderr and "does not exist" in done.stderr


def test_an_installed_pqloader_is_found_by_cmake_and_reads_what_python_reads(program, data, tmp_path):
    """`cmake --install` of the build's component "cpp" (libpqloader, its headers, the
    CMake package), then the example built as an outside project with find_package: its
    lines equal pqloader.Loader's. (The build tree's program is `make build`'s; this one
    links only what the prefix holds, and the Arrow of this Python's pyarrow.)"""
    build = Path(program).parents[2]  # build/py/examples/cpp/read_batches -> build/py
    bin_dir = Path(sys.executable).parent
    cmake = shutil.which("cmake", path=str(bin_dir)) or shutil.which("cmake")
    ninja = shutil.which("ninja", path=str(bin_dir)) or shutil.which("ninja")
    assert cmake and ninja, "cmake and ninja come with requirements-dev.txt"
    prefix, example = tmp_path / "prefix", tmp_path / "example"

    def step(*args):
        done = subprocess.run([cmake, *map(str, args)], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done.stdout

    step("--install", build, "--component", "cpp", "--prefix", prefix)
    installed = {p.relative_to(prefix).as_posix() for p in prefix.rglob("*") if p.is_file()}
    assert "lib/libpqloader.a" in installed and "include/pqloader/api.h" in installed
    assert "lib/cmake/pqloader/pqloaderConfig.cmake" in installed
    assert not any("_core" in p or p.endswith("test_util.h") for p in installed), installed
    step("-S", ROOT / "examples/cpp", "-B", example, "-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}",
         "-DPQLOADER_FIND_PACKAGE=ON", f"-DCMAKE_PREFIX_PATH={prefix}",
         f"-DPython_EXECUTABLE={sys.executable}")
    cache = (example / "CMakeCache.txt").read_text()
    assert f"pqloader_DIR:PATH={prefix}/lib/cmake/pqloader" in cache  # not the source tree
    assert "pqloader_SOURCE_DIR" not in cache
    step("--build", example)
    lines = run(str(example / "read_batches"), data, "--batch-size", "300", "--seed", "5",
                "--epochs", "2", "--shuffle")
    assert lines == python_lines(data, epochs=2, batch_size=300, seed=5, shuffle=True)
