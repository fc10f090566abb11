"""OS limits: descriptors (RLIMIT_NOFILE) and tasks (RLIMIT_NPROC). Each run is a
subprocess, so the limits never reach the test process."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import subprocess_env


def many_files(root, n=200):
    root.mkdir()
    for f in range(n):
        ids = np.arange(f * 50, f * 50 + 50, dtype=np.int64)
        t = pa.table({"id": ids, "x": np.random.default_rng(f).random(50).astype(np.float32)})
        pq.write_table(t, root / f"part-{f:04d}.parquet", row_group_size=25)
    return str(root)


RUN = textwrap.dedent("""
    import json, resource, sys, warnings, pqloader
    data, cache, nofile = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if nofile:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
    cache = None if cache == "-" else cache
    try:
        loader = pqloader.Loader(data, columns=["id", "x"], batch_size=16, shuffle=True, seed=3,
                                 num_epochs=2, cache_dir=cache)
        ids = [int(i) for b in loader for i in b["id"]]
        print(json.dumps({"ids": ids, "stats": loader.stats()}))
    except pqloader.Error as e:
        print(json.dumps({"error": type(e).__name__ + ": " + str(e)}))
""")


def run(data, cache, nofile=0, prefix=(), timeout=120):
    done = subprocess.run([*prefix, sys.executable, "-c", RUN, data, cache, str(nofile)],
                          capture_output=True, text=True, timeout=timeout, env=subprocess_env())
    return done


def test_a_warm_cache_needs_no_more_descriptors_than_an_uncached_loader(tmp_path):
    """40 descriptors suffice uncached and to fill the cache; the hits of the second epoch
    kept up to 64 entry files open for deferred columns (kMaxOpenDeferred), whatever
    RLIMIT_NOFILE, and the next source file opened failed with EMFILE."""
    data = many_files(tmp_path / "data")
    cache = str(tmp_path / "cache")
    plain = run(data, "-")
    assert plain.returncode == 0, plain.stderr
    expected = json.loads(plain.stdout)["ids"]
    cold = run(data, cache, nofile=40)  # fills the cache
    assert cold.returncode == 0, cold.stderr
    assert json.loads(cold.stdout).get("ids") == expected, cold.stdout[-500:]
    for _ in range(3):  # how many entries are open at once depends on timing
        warm = run(data, cache, nofile=40)
        assert warm.returncode == 0, warm.stderr
        out = json.loads(warm.stdout)
        assert out.get("ids") == expected, out.get("error")
        assert out["stats"]["cache_hits"] > 0


def _as_other_uid(nproc):
    """Run as real uid 54321 (RLIMIT_NPROC does not bind root's real uid) keeping euid 0
    (to read the interpreter wherever it is) without capabilities."""
    return ["setpriv", "--ruid=54321", "--euid=0", "--inh-caps=-all", "--bounding-set=-all",
            "prlimit", f"--nproc={nproc}"]


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("prlimit") is None,
                    reason="needs root, setpriv and prlimit")
def test_thread_limits_end_in_an_error_or_identical_data_never_an_abort_or_a_hang(tmp_path):
    """Under RLIMIT_NPROC of 3 to 14 tasks, thread creation fails at every stage in turn:
    the footer readers (a vector of std::threads destroyed joinable: std::terminate),
    the pipeline's workers, the storage pool (an Arrow ThreadPool left with a worker that
    never started: its Shutdown at exit waited for ever)."""
    data = many_files(tmp_path / "data")
    _check_under_thread_limits(data, RUN)


def _check_under_thread_limits(data, script):
    """Run `script` under RLIMIT_NPROC of 3 to 14 tasks: each run ends in an error that
    names threads (not corrupt data) or in the ids of an unlimited run; never an abort
    or a hang."""
    expected = json.loads(run(data, "-").stdout)["ids"]
    for nproc in range(3, 15):
        try:
            done = subprocess.run([*_as_other_uid(nproc), sys.executable, "-c", script, data, "-", "0"],
                                  capture_output=True, text=True, timeout=60, env=subprocess_env())
        except subprocess.TimeoutExpired:
            pytest.fail(f"nproc={nproc}: hung")
        assert done.returncode == 0, f"nproc={nproc}: rc={done.returncode} {done.stderr[-800:]}"
        out = json.loads(done.stdout.strip().splitlines()[-1])
        if "error" in out:
            assert "thread" in out["error"] and "InvalidDataError" not in out["error"], (nproc, out)
        else:
            assert out["ids"] == expected, nproc


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("prlimit") is None,
                    reason="needs root, setpriv and prlimit")
def test_thread_limits_with_use_summary_only_name_the_limit(tmp_path):
    """use_summary='only' reads `_metadata` on a std::async thread (PrefetchSummary): a
    refused one threw std::system_error through Dataset::Open, a bare
    pqloader.Error('Resource temporarily unavailable') naming neither threads nor the limit."""
    data = many_files(tmp_path / "data", n=20)
    done = subprocess.run([sys.executable, "-m", "pqloader", "index", data], capture_output=True, text=True,
                          timeout=120, env=subprocess_env())
    assert done.returncode == 0, done.stderr
    script = RUN.replace("cache_dir=cache)", "cache_dir=cache, use_summary='only')")
    assert script != RUN
    _check_under_thread_limits(data, script)
