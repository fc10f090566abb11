"""`python -m pqloader inspect|bench`."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import pqloader  # noqa: F401  (the CLI must be importable in this interpreter)
from conftest import subprocess_env, write_dataset


def cli(*args, cwd, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "pqloader", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(cwd),
        env=subprocess_env(),
    )


@pytest.fixture
def cli_ds(tmp_path):
    write_dataset(tmp_path / "data", [[1000, 234], [777], [500, 500, 1]])  # 3012 rows, 6 row groups
    return tmp_path / "data", 3012


def _numbers(text: str) -> set[str]:
    return set(re.findall(r"\d+", text.replace(",", "").replace("_", "")))


def test_inspect_prints_files_rows_row_groups_and_schema(cli_ds, tmp_path):
    d, n = cli_ds
    r = cli("inspect", d, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert str(n) in _numbers(out)
    assert "6" in _numbers(out)  # row groups
    for f in ("part-000.parquet", "part-001.parquet", "part-002.parquet"):
        assert f in out
    for col in ("id", "x", "k", "s", "v"):
        assert re.search(rf"\b{col}\b", out), col
    assert "int64" in out and "float" in out


def test_bench_prints_throughput_and_exits_0(cli_ds, tmp_path):
    d, n = cli_ds
    r = cli("bench", d, "--columns", "id,x", "--batch-size", "128", "--num-workers", "2", "--epochs", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "rows/s" in out
    assert "MB/s" in out or "mb/s" in out.lower()
    assert "first batch" in out.lower()
    assert "rss" in out.lower()


def test_bench_with_defaults_exits_0(cli_ds, tmp_path):
    d, _ = cli_ds
    r = cli("bench", d, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "rows/s" in r.stdout


def _assert_clean_failure(r, *must_mention):
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    err = r.stderr.strip()
    assert err, "no error message on stderr"
    assert "Traceback" not in r.stderr
    assert len(err.splitlines()) == 1, f"expected a one-line message, got:\n{r.stderr}"
    for m in must_mention:
        assert m in err, f"{m!r} not in {err!r}"


@pytest.mark.parametrize("command", ["inspect", "bench"])
def test_missing_path_exits_1_with_a_one_line_message(tmp_path, command):
    r = cli(command, tmp_path / "no-such-dir", cwd=tmp_path)
    _assert_clean_failure(r, "no-such-dir")


@pytest.mark.parametrize("command", ["inspect", "bench"])
def test_non_parquet_file_exits_1_with_a_one_line_message(tmp_path, command):
    p = tmp_path / "junk.parquet"
    p.write_bytes(b"definitely not parquet" * 10)
    r = cli(command, p, cwd=tmp_path)
    _assert_clean_failure(r, "junk.parquet")


def test_bench_with_unknown_column_exits_1_with_a_one_line_message(cli_ds, tmp_path):
    d, _ = cli_ds
    r = cli("bench", d, "--columns", "id,nonexistent_col", cwd=tmp_path)
    _assert_clean_failure(r, "nonexistent_col")


def test_version_prints_the_package_version(tmp_path):
    r = cli("--version", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"pqloader {pqloader.__version__}"


def test_version_matches_pyproject():
    import pathlib
    import tomllib

    pyproject = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"
    assert tomllib.loads(pyproject.read_text())["project"]["version"] == pqloader.__version__
