"""Processes sharing a cache directory killed (SIGKILL) at exact points of their cache
writes: strace delivers the signal as the process enters one system call on one path,
so the point is the same on every run (no timing); or held there while another process
changes the directory. Skipped where strace cannot trace."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import subprocess_env


def _strace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    try:
        return subprocess.run(["strace", "-qq", "-o", "/dev/null", "true"], timeout=30,
                              capture_output=True).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


pytestmark = pytest.mark.skipif(not _strace_works(), reason="needs a working strace")

# The loads of this file: a loader over `source` inserting into `cache` (one shard).
LOAD = textwrap.dedent("""
    import sys, pqloader
    loader = pqloader.Loader(sys.argv[1], batch_size=100, cache_dir=sys.argv[2], cache_shards=1,
                             num_workers=1)
    print(sum(len(b["x"]) for b in loader))
""")


def load_killed(tmp_path: Path, source: Path, cache: Path,
                kill_at: tuple[str, int, Path | None]) -> subprocess.CompletedProcess:
    """LOAD in a process, SIGKILLed as it enters the n-th of `kill_at`'s (system calls, n,
    a path or None) calls (on that path: its first path argument)."""
    script = tmp_path / "load.py"
    script.write_text(LOAD)
    calls, n, path = kill_at
    cmd = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={calls}",
           "-e", f"inject={calls}:signal=KILL:when={n}"] + (["-P", str(path)] if path is not None else []) + [
               sys.executable, str(script), str(source), str(cache)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=subprocess_env())


def load_here(source: Path, cache: Path, limit: int = 0) -> int:
    """LOAD in this process (only a killed load needs a process of its own), with a
    cache_size_limit: its rows."""
    loader = pqloader.Loader(str(source), batch_size=100, cache_dir=str(cache), cache_shards=1,
                             num_workers=1, cache_size_limit=limit or None)
    return sum(len(b["x"]) for b in loader)


def entries(cache: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in (cache / "shard-00").glob("*.pqc")}


# The writer of f1's entry in a cache holding f0's makes these calls on the shard's files:
# it writes .usage.new (opens it, renames it to .usage), renames its temp file to the entry
# and, last, renames records.new. Killed as it opens .usage.new, or at its second rename:
# before 2026-12 the entry was published first, and either kill left it uncounted.
@pytest.mark.parametrize("point", ["opening .usage.new", "second rename"])
def test_a_writer_killed_while_publishing_never_leaves_the_usage_under_its_entries(tmp_path, point):
    # Three one-row-group files of one size: three entries of one size.
    files = []
    for i in range(3):
        files.append(tmp_path / f"f{i}.parquet")
        pq.write_table(pa.table({"x": np.arange(i * 1000, i * 1000 + 1000)}), files[-1])
    cache = tmp_path / "cache"
    shard = cache / "shard-00"
    assert load_here(files[0], cache) == 1000
    (size,) = entries(cache).values()
    assert int((shard / ".usage").read_text()) == size
    kill_at = (("openat", 1, shard / ".usage.new") if point == "opening .usage.new"
               else ("rename,renameat,renameat2", 2, None))
    killed = load_killed(tmp_path, files[1], cache, kill_at)
    assert killed.returncode in (-9, 137), killed.stderr  # killed at the point
    # Whatever the order of its steps, the usage never counts less than the entries hold
    # (more is recounted by the next insert that does not fit).
    held = sum(entries(cache).values())
    assert int((shard / ".usage").read_text()) >= held
    # So a budget of two entries holds: a third loader inserting finds the shard full,
    # recounts it and inserts only within the budget.
    limit = 2 * size + size // 2
    assert load_here(files[2], cache, limit=limit) == 1000
    assert sum(entries(cache).values()) <= limit
    assert pqloader.cache_stats(str(cache))["bytes"] <= limit
    assert int((shard / ".usage").read_text()) == sum(entries(cache).values())


FILTERED = textwrap.dedent("""
    import sys, pqloader
    loader = pqloader.Loader(sys.argv[1], batch_size=100, cache_dir=sys.argv[2], num_workers=1,
                             filter=sys.argv[3] or None)
    print(sum(len(b["x"]) for b in loader))
""")


def test_a_selection_writer_killed_mid_write_leaves_a_temp_file_stats_count_and_a_writer_sweeps(
        tmp_path):
    source = tmp_path / "d.parquet"
    pq.write_table(pa.table({"x": np.arange(1000)}), source, row_group_size=100)
    cache = tmp_path / "cache"
    script = tmp_path / "filtered.py"
    script.write_text(FILTERED)

    def killed_run(expr: str) -> subprocess.CompletedProcess:
        # killed as it renames its selection's temp file into place (its first rename)
        cmd = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=rename,renameat,renameat2",
               "-e", "inject=rename,renameat,renameat2:signal=KILL:when=1",
               sys.executable, str(script), str(source), str(cache), expr]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=subprocess_env())

    def run(expr: str) -> int:  # FILTERED's load, in this process
        return sum(len(b["x"]) for b in pqloader.Loader(str(source), batch_size=100, cache_dir=str(cache),
                                                         num_workers=1, filter=expr or None))

    assert run("") == 1000  # a marked cache
    killed = killed_run("x >= 150")
    assert killed.returncode in (-9, 137), killed.stderr
    (temp,) = (cache / "filters").glob("*.sel.tmp-*")
    assert not list((cache / "filters").glob("*.sel"))
    # What the directory holds is counted (a selection may be 4 bytes a kept row).
    assert pqloader.cache_stats(str(cache))["temp_files"] == 1
    # Never read: the selection is computed again.
    assert run("x >= 150") == 850
    # Once its writer is gone for ten minutes, the next selection's writer deletes it.
    then = temp.stat().st_mtime - 11 * 60
    os.utime(temp, (then, then))
    assert run("x >= 400") == 600
    assert not temp.exists()
    assert pqloader.cache_stats(str(cache))["temp_files"] == 0


WRITER = textwrap.dedent("""
    import os, sys, warnings, pqloader
    print(os.getpid(), flush=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = pqloader.Loader(sys.argv[1], batch_size=100, cache_dir=sys.argv[2],
                                 cache_shards=1, num_workers=1)
        rows = sum(len(b["x"]) for b in loader)
    s = loader.stats()
    print(rows, s["cache_write_errors"], len(caught), *[str(w.message) for w in caught], flush=True)
""")


def test_a_cache_clear_between_an_entry_write_and_its_publication_is_no_write_error(tmp_path):
    # `cache clear` deletes temp files (docs/cache_format.md, "Clearing"): the writer of one
    # then found nothing to rename, and reported a write error and warned "cannot publish
    # cache entry ...: No such file or directory; continuing without caching this data" to
    # a loader whose cache works.
    source = tmp_path / "d.parquet"
    pq.write_table(pa.table({"x": np.arange(1000)}), source)
    cache = tmp_path / "cache"
    pqloader.Loader(str(source), cache_dir=str(cache), cache_shards=1)  # a marked cache
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    # Held for 3 s as it opens the shard's lock to publish its entry, written by then: the
    # clear runs meanwhile, once the entry's temp file is seen (the report below tells that
    # it did; a clear too late finds the entry published and fails the test).
    p = subprocess.Popen(["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=openat",
                          "-e", "inject=openat:delay_enter=3000000:when=1", "-P",
                          str(cache / "shard-00" / ".lock"), sys.executable, str(script),
                          str(source), str(cache)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=subprocess_env())
    try:
        p.stdout.readline()  # started
        for _ in range(6000):  # until its entry is written (bounded: at most a minute)
            if list((cache / "shard-00").glob(".tmp-*")) or p.poll() is not None:
                break
            time.sleep(0.01)
        cleared = pqloader.cache_clear(str(cache))
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0, err
    # The clear deleted the writer's temp file (and claim marker), no entry: it ran in time.
    assert cleared["entries"] == 0 and cleared["other_files"] >= 1, cleared
    rows, write_errors, warned, *messages = out.split(maxsplit=3)
    assert (rows, write_errors, warned) == ("1000", "0", "0"), messages
