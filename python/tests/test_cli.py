"""`python -m pqloader inspect|bench`."""

from __future__ import annotations

import os
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


def test_inspect_escapes_control_characters_of_names(tmp_path):
    # A file or column name holding an escape sequence reached the terminal as one.
    import pyarrow as pa
    import pyarrow.parquet as pq
    d = tmp_path / "d"
    d.mkdir()
    pq.write_table(pa.table({"x\x1b[2Jy": [1, 2]}), d / "a\x1b]0;t\x07.parquet")
    (d / "n\x1b[31m.txt").write_text("not parquet")
    r = cli("inspect", d, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "x\\x1b[2Jy" in r.stdout and "a\\x1b]0;t\\x07.parquet" in r.stdout and "n\\x1b[31m.txt" in r.stdout


def test_inspect_of_non_ascii_names_with_an_ascii_stdout_escapes_them(tmp_path):
    # PYTHONIOENCODING=ascii (or a non-UTF-8 locale): a non-ASCII file or column name
    # stopped the listing half-way with "pqloader: error: 'ascii' codec can't encode".
    import pyarrow as pa
    import pyarrow.parquet as pq
    d = tmp_path / "d\u00fc"
    d.mkdir()
    pq.write_table(pa.table({"na\u00efve": [1, 2]}), d / "d\u00e4t\u00e4.parquet")
    env = dict(subprocess_env(), PYTHONIOENCODING="ascii", LC_ALL="C", LANG="C")
    r = subprocess.run([sys.executable, "-m", "pqloader", "inspect", str(d)], capture_output=True,
                       timeout=120, cwd=str(tmp_path), env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout.decode("ascii")
    assert "na\\xefve" in out and "d\\xe4t\\xe4.parquet" in out and "rows=2" in out


def test_main_in_process_leaves_the_callers_stdout_as_it_was(cli_ds, capsys):
    from pqloader import cli as cli_module
    before = sys.stdout.errors
    assert cli_module.main(["inspect", str(cli_ds[0])]) == 0
    assert sys.stdout.errors == before
    assert "part-000.parquet" in capsys.readouterr().out


def test_errors_and_filters_escape_control_characters_of_names(tmp_path):
    # An error naming a file, and --filter's expression naming a column, reached the
    # terminal with the name's escape sequence (inspect's listing escaped it).
    import pyarrow as pa
    import pyarrow.parquet as pq
    d = tmp_path / "d"
    d.mkdir()
    pq.write_table(pa.table({"x\x1b[2Jy": [1, 2]}), d / "a.parquet")
    r = cli("inspect", d, "--filter", "`x\x1b[2Jy` > 1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "x\\x1b[2Jy" in r.stdout
    (d / "b\x1b]0;t\x07.parquet").write_bytes(b"PAR1 not a footer")
    r = cli("inspect", d, cwd=tmp_path)
    assert r.returncode == 1
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr and "b\\x1b]0;t\\x07.parquet" in r.stderr


def test_inspect_and_bench_take_the_int96_unit(tmp_path):
    # Spark's 9999-12-31 as INT96: refused as nanoseconds, naming the option, which the
    # CLI takes as the Loader and inspect() do.
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq
    d = tmp_path / "far"
    d.mkdir()
    ts = pa.array([dt.datetime(9999, 12, 31), dt.datetime(2000, 1, 1)], pa.timestamp("us"))
    pq.write_table(pa.table({"ts": ts}), d / "a.parquet", use_deprecated_int96_timestamps=True)
    r = cli("inspect", d, "--json", "--coerce-int96-timestamp-unit", "us", "--filter", "ts is not None", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert '"ts": "timestamp[us]"' in r.stdout and '"rows_kept": 2' in r.stdout
    r = cli("bench", d, cwd=tmp_path)
    assert r.returncode != 0 and "coerce_int96_timestamp_unit" in r.stderr
    r = cli("bench", d, "--coerce-int96-timestamp-unit", "us", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


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


def _cli_into_closed_pipe(*args, cwd):
    """Run the CLI with stdout a pipe whose reader is already gone (deterministic EPIPE on
    the first write, unlike racing a reader that closes early)."""
    import os

    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([sys.executable, "-m", "pqloader", *map(str, args)], stdout=w,
                              stderr=subprocess.PIPE, text=True, timeout=120, cwd=str(cwd),
                              env=subprocess_env())
    finally:
        os.close(w)


@pytest.mark.parametrize("args", [("inspect", "{d}"), ("inspect", "{d}", "--json"),
                                  ("bench", "{d}", "--batch-size", "512"),
                                  ("cache", "stats", "{tmp}/cache")])
def test_closed_stdout_exits_quietly_with_141(cli_ds, tmp_path, args):
    d, _ = cli_ds
    (tmp_path / "cache").mkdir()  # empty: a cache not used yet
    args = [a.format(d=d, tmp=tmp_path) for a in args]
    r = _cli_into_closed_pipe(*args, cwd=tmp_path)
    assert r.stderr == "", r.stderr
    assert r.returncode == 141


def test_version_into_closed_pipe_is_quiet(tmp_path):
    r = _cli_into_closed_pipe("--version", cwd=tmp_path)
    assert r.stderr == "", r.stderr
    assert r.returncode in (0, 141)  # argparse ignores errors writing its own messages


def test_reader_closing_early_ends_quietly(tmp_path):
    # `pqloader inspect X --all-files --json | head -n 1`
    write_dataset(tmp_path / "many", [[3]] * 500)  # ~110 KB of JSON: more than a pipe holds
    head = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.readline())"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    r = subprocess.run([sys.executable, "-m", "pqloader", "inspect", str(tmp_path / "many"),
                        "--all-files", "--json"], stdout=head.stdin, stderr=subprocess.PIPE,
                       text=True, timeout=120, cwd=str(tmp_path), env=subprocess_env())
    head.stdin.close()
    with head.stdout:  # (left open, it warned ResourceWarning under -W error)
        first = head.stdout.read()
    head.wait(timeout=60)
    assert first.strip() == "{"
    assert r.stderr == "", r.stderr
    assert r.returncode == 141


def test_bench_prints_the_stage_table_and_a_diagnosis(cli_ds, tmp_path):
    d, _ = cli_ds
    r = cli("bench", d, "--batch-size", "256", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    stages = [line.split()[0] for line in r.stdout.splitlines()
              if line.split() and line.split()[0] in ("read", "decode", "transform", "gather", "wait")]
    assert stages == ["read", "decode", "transform", "gather", "wait"]
    assert re.search(r"^diagnosis: \S", r.stdout, re.M)


def test_bench_json_has_stages_and_diagnosis(cli_ds, tmp_path):
    import json

    d, _ = cli_ds
    r = cli("bench", d, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["stages_seconds"]) == {"read", "decode", "transform", "gather", "wait"}
    assert out["diagnosis"]


def test_transform_spec_parses_ops_as_written_in_python():
    from pqloader import transforms as T
    from pqloader._cli_args import parse_storage_options, parse_transforms

    assert parse_transforms(["image=DecodeImage(), Resize(256), CenterCrop(size=224), ToCHW",
                             "x = Cast('float32')"]) == {
        "image": [T.DecodeImage(), T.Resize(256), T.CenterCrop(size=224), T.ToCHW()],
        "x": [T.Cast("float32")]}
    assert parse_transforms(["a.b=Normalize(mean=[0.5], std=(0.25,))"]) == {
        "a.b": [T.Normalize([0.5], [0.25])]}
    assert parse_transforms(None) is None
    assert parse_storage_options(["region=us-east-1", "endpoint_override=h:9000=x"]) == {
        "region": "us-east-1", "endpoint_override": "h:9000=x"}
    # A key given twice was the last one's, silently.
    with pytest.raises(ValueError, match="'region' given twice"):
        parse_storage_options(["region=us-east-1", " region=eu-west-1"])


@pytest.mark.parametrize("spec, message", [
    ("Cast('float32')", "COLUMN="), ("x=", "COLUMN="), ("x=Bogus()", "unknown op 'Bogus'"),
    ("x=Cast(open('f'))", "literals"), ("x=Cast(", "not a list of ops"),
    ("x=os.system('true')", "Name(args)"), ("x=Cast(1, 2, 3)", "Cast"),
    # Python refuses a repeated keyword; the parser had kept the last one (size=3).
    ("x=Resize(size=2, size=3)", "keyword argument 'size' repeated"),
])
def test_bad_transform_specs_are_refused(spec, message):
    from pqloader._cli_args import parse_transforms

    with pytest.raises(ValueError, match=re.escape(message)):
        parse_transforms([spec])


def test_bench_runs_the_given_transforms(cli_ds, tmp_path):
    import json

    d, _ = cli_ds
    plain = json.loads(cli("bench", d, "--columns", "x", "--json", cwd=tmp_path).stdout)
    r = cli("bench", d, "--columns", "x", "--transform", "x=Cast('float64')", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert plain["stages_seconds"]["transform"] == 0
    assert json.loads(r.stdout)["stages_seconds"]["transform"] > 0


def test_bench_with_an_unknown_transform_exits_1_with_a_one_line_message(cli_ds, tmp_path):
    d, _ = cli_ds
    _assert_clean_failure(cli("bench", d, "--transform", "x=Bogus()", cwd=tmp_path), "Bogus")


@pytest.mark.parametrize("command", ["inspect", "bench"])
def test_storage_options_reach_the_loader(cli_ds, tmp_path, command):
    d, _ = cli_ds
    r = cli(command, d, "--storage-option", "region=us-east-1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    _assert_clean_failure(cli(command, d, "--storage-option", "bogus_key=1", cwd=tmp_path),
                          "bogus_key")


def test_bench_reports_the_workers_it_ran_with_and_no_first_batch_when_none_came(cli_ds, tmp_path):
    # --num-workers left out: the JSON said "num_workers": null (the Loader ran one per
    # CPU); a run of no batch printed "time to first batch: 0.0 ms".
    import json

    d, _ = cli_ds
    r = cli("bench", d, "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["num_workers"] == (os.cpu_count() or 1)
    r = cli("bench", d, "--filter", "id < 0", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^rows: 0 ", r.stdout, re.M), r.stdout
    assert "time to first batch: none (no batch)" in r.stdout, r.stdout
    r = cli("bench", d, "--filter", "id < 0", "--json", cwd=tmp_path)
    assert json.loads(r.stdout)["time_to_first_batch_seconds"] is None


def test_bench_takes_a_filter(cli_ds, tmp_path):
    import json

    d, total = cli_ds
    r = cli("bench", d, "--filter", "id < 1000 or id >= 3000", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rows"] == 1012
    _assert_clean_failure(cli("bench", d, "--filter", "nope == 1", cwd=tmp_path), "nope")


def test_a_filter_without_pyarrow_is_a_one_line_error(cli_ds, tmp_path):
    # Filters are pyarrow compute expressions: without pyarrow, --filter says to install
    # it (it printed ImportError's traceback); the rest of the CLI needs no pyarrow.
    d, _ = cli_ds
    script = ("import sys; sys.modules['pyarrow'] = None; sys.modules['pyarrow.compute'] = None; "
              "from pqloader import cli; sys.exit(cli.main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", script, "inspect", str(d), "--filter", "id < 5"],
                       capture_output=True, text=True, timeout=120, cwd=str(tmp_path), env=subprocess_env())
    _assert_clean_failure(r, "pip install pyarrow")
    r = subprocess.run([sys.executable, "-c", script, "inspect", str(d)],
                       capture_output=True, text=True, timeout=120, cwd=str(tmp_path), env=subprocess_env())
    assert r.returncode == 0, r.stderr


def test_bench_takes_io_threads_and_readahead(cli_ds, tmp_path):
    d, _ = cli_ds
    r = cli("bench", d, "--io-threads", "2", "--readahead", "1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    _assert_clean_failure(cli("bench", d, "--io-threads", "100000", cwd=tmp_path), "io_threads")


def test_a_broken_pipe_elsewhere_is_still_an_error(monkeypatch, capfd, cli_ds):
    from pqloader import cli as cli_module

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe (a socket, not stdout)")

    monkeypatch.setattr(cli_module, "_inspect", broken)
    d, _ = cli_ds
    assert cli_module.main(["inspect", str(d)]) == 1
    assert "pqloader: error: " in capfd.readouterr().err


@pytest.mark.parametrize("flag", ["--epochs", "--batch-size", "--num-workers", "--io-threads", "--readahead"])
def test_bench_refuses_counts_below_one_naming_the_flag(cli_ds, tmp_path, flag):
    # argparse's usage error (rc 2) naming the flag, not the Loader's argument's name.
    d, _ = cli_ds
    r = cli("bench", d, flag, "0", cwd=tmp_path)
    assert r.returncode == 2 and f"{flag}: must be at least 1, not 0" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_bench_refuses_an_empty_column_name(cli_ds, tmp_path):
    d, _ = cli_ds
    for columns in ("", "id,", ",x"):
        r = cli("bench", d, "--columns", columns, cwd=tmp_path)
        assert r.returncode == 2 and "--columns: an empty column name" in r.stderr, r.stderr


@pytest.mark.parametrize("args", [
    ("inspect", "{d}", "--filter", "not " * 2000 + "id > 1"),  # RecursionError in convert()
    ("inspect", "{d}", "--filter", "id == " + "-" * 3000 + "1"),  # in ast.parse
    ("bench", "{d}", "--transform", "x=Cast(" + "-" * 5000 + "1)"),
])
def test_deeply_nested_filter_or_transform_is_a_one_line_error(cli_ds, tmp_path, args):
    # They ended in a RecursionError's traceback.
    d, _ = cli_ds
    r = cli(*[a.format(d=d) for a in args], cwd=tmp_path)
    _assert_clean_failure(r, "nested too deeply")
    assert len(r.stderr) < 400  # the expression is shortened in the message


def test_deeply_nested_transform_spec_raises_value_error():
    from pqloader._cli_args import parse_transforms

    with pytest.raises(ValueError, match="nested too deeply"):
        parse_transforms(["x=Cast(" + "-" * 5000 + "1)"])


@pytest.mark.parametrize("args", [("inspect", "{d}"), ("inspect", "{d}", "--json"),
                                  ("index", "{d}")])
def test_a_command_started_with_stdout_closed_says_so_in_one_line(cli_ds, tmp_path, args):
    # `pqloader inspect X >&-`: Python sets sys.stdout to None; main's flush of it raised
    # AttributeError with a traceback. Now the lost output is an error, as coreutils' is.
    d, _ = cli_ds
    r = subprocess.run([sys.executable, "-m", "pqloader", *[a.format(d=d) for a in args]],
                       stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120,
                       cwd=str(tmp_path), env=subprocess_env(), preexec_fn=lambda: os.close(1))
    _assert_clean_failure(r, "stdout is closed")


def test_version_with_stdout_closed_is_not_a_traceback(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pqloader", "--version"], stdin=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=120, cwd=str(tmp_path),
                       env=subprocess_env(), preexec_fn=lambda: os.close(1))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "pqloader" in r.stderr  # argparse writes to stderr when sys.stdout is None


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("args", [("--help",), ("--version",), ("bench", "--help")])
def test_help_that_cannot_be_written_fails(tmp_path, args):
    # argparse drops an OSError of its own output: `pqloader --help > /dev/full` printed
    # nothing and said status 0, where `cat --help > /dev/full` fails.
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "pqloader", *args], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=120, cwd=str(tmp_path),
                           env=subprocess_env())
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("pqloader: error: ") and "No space left" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("name, shown", [("not-a-dir", "not-a-dir"), ("blk\nx", "blk\\nx")])
def test_warnings_are_one_line_without_python_file_and_line(cli_ds, tmp_path, name, shown):
    # An unusable --cache-dir: the Loader warns and goes on without the cache. The CLI
    # printed Python's "<internal path>:<line>: RuntimeWarning: ..." and the source line.
    # A newline in a name was kept raw: under 'blk\nx' the warning split in two, its
    # second line without the "pqloader: warning:" prefix (a log took it for another
    # record); each message is one line, the newline shown as \n.
    d, _ = cli_ds
    blocker = tmp_path / name
    blocker.write_text("x")
    r = cli("bench", d, "--columns", "x", "--cache-dir", blocker / "cache", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines and all(line.startswith("pqloader: warning: ") for line in lines), r.stderr
    assert "warning: pqloader" not in r.stderr  # the message's own "pqloader cache:" prefix once
    assert "not usable" in r.stderr and shown in r.stderr, r.stderr
    assert ".py:" not in r.stderr and "RuntimeWarning" not in r.stderr


def test_a_warning_with_stderr_closed_does_not_go_to_stdout(monkeypatch, capsys):
    from pqloader import cli as cli_module

    monkeypatch.setattr(sys, "stderr", None)  # print(file=None) would write to stdout
    cli_module._show_warning(RuntimeWarning("x"), RuntimeWarning, "f.py", 1)
    assert capsys.readouterr().out == ""


def test_main_restores_showwarning(cli_ds):
    import warnings

    from pqloader import cli as cli_module

    before = warnings.showwarning
    d, _ = cli_ds
    assert cli_module.main(["inspect", str(d), "-q", "--json"]) == 0
    assert warnings.showwarning is before


def test_a_file_name_that_is_not_utf8_is_named_in_a_one_line_error(cli_ds, tmp_path):
    # The engine's listing found it; turning its path into str raised UnicodeDecodeError
    # (the CLI printed "'utf-8' codec can't decode byte 0xff ...", naming no file).
    d, _ = cli_ds
    import shutil

    shutil.copy(d / "part-000.parquet", os.path.join(os.fsencode(d), b"\xff.parquet"))
    for command in ("inspect", "bench"):
        _assert_clean_failure(cli(command, d, cwd=tmp_path), str(d), r"b'\xff.parquet'", "UTF-8")


def test_a_source_path_that_is_not_utf8_is_a_one_line_error(cli_ds, tmp_path):
    # It reached the engine's binding: "incompatible function arguments".
    r = subprocess.run([sys.executable, "-m", "pqloader", "inspect", b"data/\xff.parquet"],
                       capture_output=True, timeout=120, cwd=str(tmp_path), env=subprocess_env())
    assert r.returncode == 1, r.stderr
    err = r.stderr.decode("utf-8", "replace")
    assert "Traceback" not in err and "incompatible" not in err, err
    assert "not UTF-8" in err


def test_a_batch_that_cannot_be_allocated_is_a_one_line_error(cli_ds, tmp_path):
    # The engine's MemoryError (a transform's output of ~10^12 values a row) ended in a
    # traceback.
    d, _ = cli_ds
    r = cli("bench", d, "--columns", "v", "--transform", "v=PadOrTruncate(1000000000000)",
            cwd=tmp_path)
    _assert_clean_failure(r, "part-000.parquet")


@pytest.mark.parametrize("args", [
    ("bench", "{d}", "--cache-dir", "s3://bucket/cache"),
    ("cache", "stats", "s3://bucket/cache"),
    ("cache", "clear", "s3://bucket/cache"),
])
def test_a_url_as_cache_dir_is_refused_naming_it(cli_ds, tmp_path, args):
    # It was made absolute as a local path: bench created and filled ./s3:/bucket/cache
    # without a word, and the cache commands named '<cwd>/s3:/bucket/cache'.
    d, _ = cli_ds
    r = cli(*[a.format(d=d) for a in args], cwd=tmp_path)
    _assert_clean_failure(r, "'s3://bucket/cache'", "local directory")
    assert not (tmp_path / "s3:").exists()


def test_a_file_url_as_cache_dir_is_its_path(cli_ds, tmp_path):
    d, _ = cli_ds
    r = cli("bench", d, "--columns", "id", "--cache-dir", f"file://{tmp_path / 'c'}", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "c" / "PQLOADER_CACHE").exists() and not (tmp_path / "file:").exists()
    r = cli("cache", "stats", f"file://{tmp_path / 'c'}", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_inspect_escapes_names_inside_types_and_loads_as(tmp_path):
    # A map's type names its column ("map<string, int32 ('m\x1b[5m')>") and an unsupported
    # column's loads_as quotes it: both reached the terminal unescaped.
    import pyarrow as pa
    import pyarrow.parquet as pq
    d = tmp_path / "d"
    d.mkdir()
    pq.write_table(pa.table({"m\x1b[5m": pa.array([[("k", 1)]] * 2, pa.map_(pa.string(), pa.int32())),
                             "x": [1, 2]}), d / "a.parquet")
    r = cli("inspect", d, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout, r.stdout
    assert "map<string, int32 ('m\\x1b[5m')>" in r.stdout and "unsupported: column 'm\\x1b[5m'" in r.stdout


def test_an_error_with_stderr_closed_does_not_go_into_stdout(tmp_path):
    # `pqloader inspect X --json 2>&- > out.json`: Python sets sys.stderr to None and
    # print(file=None) writes to stdout, so the error message became the command's output.
    r = subprocess.run([sys.executable, "-m", "pqloader", "inspect", str(tmp_path / "nope"), "--json"],
                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, timeout=120,
                       cwd=str(tmp_path), env=subprocess_env(), preexec_fn=lambda: os.close(2))
    assert r.returncode == 1
    assert r.stdout == ""


def test_index_and_cache_commands_escape_control_characters_of_paths(cli_ds, tmp_path):
    # inspect escaped a path's escape sequences and newlines; index, cache prune and cache
    # clear printed theirs raw (a newline split the one-line result, an escape sequence
    # reached the terminal as one).
    import shutil

    d, _ = cli_ds
    odd = tmp_path / "a\nb\x1b[31m"
    shutil.copytree(d, odd)
    cache = tmp_path / "c\nd\x1b]0;t\x07"
    r = cli("bench", odd, "--cache-dir", cache, "--columns", "id", "-q", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    for args in (("index", odd), ("cache", "prune", cache), ("cache", "clear", cache)):
        r = cli(*args, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert "\x1b" not in r.stdout and "\x07" not in r.stdout, (args, r.stdout)
        assert r.stdout.count("\n") == 1, (args, r.stdout)
        assert "\\n" in r.stdout and "\\x1b" in r.stdout, (args, r.stdout)


def test_a_gs_source_without_credentials_fails_within_the_retry_budget(tmp_path):
    # google-cloud-cpp retries for 15 minutes by default: a gs:// source without
    # credentials (no metadata server) hung that long, and Ctrl-C did not stop it.
    import time

    pytest.importorskip("pyarrow._gcsfs")  # an Arrow built with GCS
    env = subprocess_env()
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    env.update(GCE_METADATA_HOST="127.0.0.1:9", HOME=str(tmp_path))  # refused at once
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pqloader", "inspect", "gs://x/y", "--storage-option",
                        "retry_budget=2"], capture_output=True, text=True, timeout=120, env=env,
                       cwd=str(tmp_path))
    assert r.returncode == 1 and "'gs://x/y'" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert time.monotonic() - start < 60
