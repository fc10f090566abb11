"""tools/crossbuild/check.py (`make crossbuild-check`) still runs: a build against itself is all SAME."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import pqloader
from conftest import REPO_ROOT

# a case of several Loaders on one cache dir (ranks), a pack, a summary, a mixture state in
# another epoch layout
ADDED = ["pack", "ranks_one_cache", "str_then_bytes", "summary_index", "cache_memory", "state_loader_epoch1",
         "state_mix_last", "state_loader_torch"]
CASES = ["npz_skip", "state_loader", *ADDED]


@pytest.fixture(scope="module")
def against_itself(tmp_path_factory):
    """One check.py run of the installed build against itself over every case below (its
    data, index and worker processes made once): (output, {case: row cells})."""
    build = os.path.dirname(os.path.dirname(os.path.abspath(pqloader.__file__)))
    r = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "crossbuild" / "check.py"), "--old", build, "--new", build,
         "--cases", ",".join(CASES), "--scratch", str(tmp_path_factory.mktemp("crossbuild"))],
        capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{len(CASES)} cases: 0 with a DIFF; OK" in r.stdout
    rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines()[2:-1]}
    assert set(rows) == set(CASES), r.stdout
    return r.stdout, rows


def test_crossbuild_check_of_a_build_against_itself_is_all_same(against_itself):
    out, rows = against_itself
    got = {case: rows[case][:3] for case in ("npz_skip", "state_loader")}
    assert got == {"npz_skip": ["SAME", "SAME", "same"], "state_loader": ["SAME", "SAME", "-"]}, out


def test_crossbuild_check_added_cases_run_and_hit_the_other_builds_cache(against_itself):
    # against itself all SAME, and each read served entries the other run wrote (else the
    # row would check nothing across builds: a note follows the cells)
    out, rows = against_itself
    for case in ADDED:
        assert rows[case][:2] == ["SAME", "SAME"] and rows[case][3:] == [], (case, out)


def test_crossbuild_check_refuses_a_directory_without_a_build(tmp_path):
    r = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "crossbuild" / "check.py"), "--old", str(tmp_path),
                        "--scratch", str(tmp_path / "s")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no pqloader package" in r.stderr, r.stderr
