"""The CLI's progress line: on stderr, only on a terminal, never with --quiet."""

from __future__ import annotations

import io
import shutil
import os
import subprocess
import sys

import pytest

from conftest import subprocess_env, write_dataset
import pqloader
from pqloader._cli_progress import Progress, enabled_for


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_when_the_stream_is_not_a_terminal():
    out = io.StringIO()
    with Progress("work", total=3, unit="batches", stream=out) as p:
        assert not p.enabled
        p.update(3)
    assert out.getvalue() == ""


def test_on_a_terminal_draws_counts_and_erases_the_line():
    out = _Tty()
    with Progress("work", total=3, unit="batches", stream=out, interval=0) as p:
        p.update(2, "epoch 1/1")
        assert "\rwork  2/3 batches" in out.getvalue()
        assert "epoch 1/1" in out.getvalue()
    assert out.getvalue().endswith("\r")  # erased: blanks, then back to the start
    width = max(len(line) for line in out.getvalue().split("\r"))
    assert out.getvalue().endswith("\r" + " " * width + "\r")


def test_quiet_and_dumb_terminals_turn_it_off(monkeypatch):
    assert enabled_for(_Tty())
    assert not enabled_for(_Tty(), quiet=True)
    monkeypatch.setenv("TERM", "dumb")
    assert not enabled_for(_Tty())


def test_redraws_are_throttled():
    out = _Tty()
    p = Progress("work", total=1000, stream=out, interval=3600)
    for _ in range(1000):
        p.update()
    p.close()
    assert out.getvalue().count("\rwork") == 1  # the first draw only


@pytest.fixture
def ds(tmp_path):
    write_dataset(tmp_path / "data", [[1000, 234], [777]])
    return tmp_path / "data"


def _run(args, cwd, stderr_tty: bool):
    """Run the CLI; stdout a pipe, stderr a pipe or a pseudo-terminal. (stdout, stderr, rc)"""
    cmd = [sys.executable, "-m", "pqloader", *map(str, args)]
    if not stderr_tty:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=str(cwd),
                           env=subprocess_env())
        return r.stdout, r.stderr, r.returncode
    import pty

    master, slave = pty.openpty()
    env = subprocess_env()
    env.pop("TERM", None)
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=slave, text=True, cwd=str(cwd),
                         env=env)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    with p.stdout:  # (left open, it warned ResourceWarning under -W error)
        out = p.stdout.read()
    rc = p.wait(timeout=120)
    os.close(master)
    return out, err.decode(), rc


@pytest.mark.parametrize("args", [("inspect", "{d}"), ("bench", "{d}", "--batch-size", "100"),
                                  ("cache", "stats", "{tmp}/cache")])
def test_not_a_terminal_no_progress_and_stdout_unchanged(ds, tmp_path, args):
    (tmp_path / "cache").mkdir()
    args = [a.format(d=ds, tmp=tmp_path) for a in args]
    out, err, rc = _run(args, tmp_path, stderr_tty=False)
    assert rc == 0 and err == ""
    quiet_out, quiet_err, rc = _run([*args, "--quiet"], tmp_path, stderr_tty=False)
    assert rc == 0 and quiet_err == ""
    if args[0] != "bench":  # bench's numbers are timings
        assert out == quiet_out
    else:
        assert out.splitlines()[0].split()[:2] == quiet_out.splitlines()[0].split()[:2]


@pytest.mark.parametrize("args, shows", [(("bench", "{d}", "--batch-size", "100", "--epochs", "2"),
                                          "/42 batches"),  # 21 a epoch (1234 + 777 rows, batch 100)
                                         (("inspect", "{d}"), "reading footers"),
                                         (("cache", "stats", "{tmp}/cache"), "cache stats")])
def test_on_a_terminal_progress_goes_to_stderr_only(ds, tmp_path, args, shows):
    (tmp_path / "cache").mkdir()
    args = [a.format(d=ds, tmp=tmp_path) for a in args]
    out, err, rc = _run(args, tmp_path, stderr_tty=True)
    assert rc == 0, err
    assert shows in err
    assert "\r" not in out and shows not in out
    _, quiet_err, rc = _run([*args, "-q"], tmp_path, stderr_tty=True)
    assert rc == 0 and quiet_err == ""


def test_the_engine_counts_footers_read_for_inspect_and_index(ds, tmp_path):
    from pqloader import _core

    counter = _core.Progress()
    assert (counter.done, counter.total) == (0, -1)
    line = Progress("inspect", unit="files", stream=io.StringIO(), enabled=True, counter=counter)
    info = pqloader.inspect(str(ds), _progress=counter)
    assert counter.done == counter.total == info["num_files"] == 2
    assert "2/2 files" in line.text()
    line.close()
    shutil.copytree(ds, tmp_path / "copy")
    counter = _core.Progress()
    pqloader.write_index(str(tmp_path / "copy"), _progress=counter)
    assert counter.done == counter.total == 2


def test_without_a_total_the_count_shows_once_nonzero():
    out = _Tty()
    p = Progress("scan", unit="rows", stream=out, interval=0)
    assert out.getvalue().startswith("\rscan  0.")  # no count yet: label, then the time
    p.update(5)
    assert "\rscan  5 rows  " in out.getvalue()
    assert "/" not in out.getvalue().split("\r")[-1].split("  ")[1]  # no total shown
    p.close()


def test_the_ticker_redraws_from_the_counter_without_updates():
    import threading
    import time

    class _Counter:
        done, total = 0, -1

    out, counter = _Tty(), _Counter()
    p = Progress("read", unit="files", stream=out, interval=0.01, ticker=True, counter=counter)
    try:
        counter.done, counter.total = 3, 7
        deadline = time.monotonic() + 60
        while "3/7 files" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "\rread  3/7 files" in out.getvalue()  # drawn by the thread: no update() call
    finally:
        p.close()
    assert not any(t.name == "pqloader-progress" for t in threading.enumerate())


def test_a_warning_erases_the_progress_line_first():
    # A warning printed while the line was drawn went on after its text:
    # "bench  0/1000 batches  0.0 spqloader: warning: cache: ...".
    from pqloader import cli as cli_module

    out = _Tty()
    with Progress("work", total=3, unit="batches", stream=out, interval=0) as p:
        p.update(1)
        cli_module._show_warning(RuntimeWarning("pqloader: cache: not usable"), RuntimeWarning,
                                 "f.py", 1, file=out)
        before, _, after = out.getvalue().partition("pqloader: warning: cache: not usable\n")
        assert after == ""
        assert before.endswith(" \r"), repr(before)  # erased: the warning starts its own line
        p.update(1)  # and drawn again at the next update
        assert out.getvalue().rpartition("\n")[2].startswith("\rwork  2/3 batches")
    other = _Tty()  # a warning on another stream leaves the line alone
    with Progress("work", total=3, unit="batches", stream=out, interval=0) as p:
        p.update(1)
        drawn = out.getvalue()
        cli_module._show_warning(RuntimeWarning("x"), RuntimeWarning, "f.py", 1, file=other)
        assert out.getvalue() == drawn
