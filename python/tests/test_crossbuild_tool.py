"""tools/crossbuild/check.py (`make crossbuild-check`) still runs: a build against itself is all SAME."""

from __future__ import annotations

import os
import subprocess
import sys

import pqloader
from conftest import REPO_ROOT


def test_crossbuild_check_of_a_build_against_itself_is_all_same(tmp_path):
    build = os.path.dirname(os.path.dirname(os.path.abspath(pqloader.__file__)))
    r = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "crossbuild" / "check.py"), "--old", build, "--new", build,
         "--cases", "npz_skip,state_loader", "--scratch", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {line.split()[0]: line.split()[1:4] for line in r.stdout.splitlines()[2:-1]}
    assert rows == {"npz_skip": ["SAME", "SAME", "same"], "state_loader": ["SAME", "SAME", "-"]}, r.stdout
    assert "2 cases: 0 with a DIFF; OK" in r.stdout


def test_crossbuild_check_added_cases_run_and_hit_the_other_builds_cache(tmp_path):
    # a case of several Loaders on one cache dir (ranks), a pack, a summary, a mixture state
    # in another epoch layout: against itself all SAME, and each read served entries the
    # other run wrote (else the row would check nothing across builds)
    build = os.path.dirname(os.path.dirname(os.path.abspath(pqloader.__file__)))
    cases = ["pack", "ranks_one_cache", "str_then_bytes", "summary_index", "cache_memory", "state_loader_epoch1",
             "state_mix_last", "state_loader_torch"]
    r = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "crossbuild" / "check.py"), "--old", build, "--new", build,
         "--cases", ",".join(cases), "--scratch", str(tmp_path)],
        capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines()[2:-1]}
    assert set(rows) == set(cases), r.stdout
    for case, row in rows.items():
        assert row[:2] == ["SAME", "SAME"] and row[3:] == [], (case, r.stdout)
    assert f"{len(cases)} cases: 0 with a DIFF; OK" in r.stdout


def test_crossbuild_check_refuses_a_directory_without_a_build(tmp_path):
    r = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "crossbuild" / "check.py"), "--old", str(tmp_path),
                        "--scratch", str(tmp_path / "s")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no pqloader package" in r.stderr, r.stderr
