"""bench/quick.py measures what it says: its data does not depend on the process's hash
salt, and no loader reads ahead while a ceiling is timed (a loader kept across paired
rounds reads its next epoch while the ceiling runs: the ceiling is slowed and the
loader's next epoch starts with a head start, so the ratio is inflated)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

import pqloader
from conftest import REPO_ROOT, subprocess_env

QUICK = REPO_ROOT / "bench" / "quick.py"


def load_quick():
    spec = importlib.util.spec_from_file_location("bench_quick_under_test", QUICK)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quick_data_is_the_same_whatever_the_hash_seed(tmp_path):
    code = (
        "import importlib.util, sys, pathlib\n"
        f"spec = importlib.util.spec_from_file_location('q', {str(QUICK)!r})\n"
        "q = importlib.util.module_from_spec(spec); spec.loader.exec_module(q)\n"
        "q.DATA = pathlib.Path(sys.argv[1])\n"
        "q.SPEC['tokens'] = dict(rows=400, files=2, row_group=100, batch=32, max_len=64)\n"
        "d = q.tokens_data()\n"
        "print(b''.join(f.read_bytes() for f in q.files_of(d)).hex())\n"
    )
    out = []
    for salt in ("1", "2"):
        env = subprocess_env(tmp_path)
        env["PYTHONHASHSEED"] = salt
        r = subprocess.run([sys.executable, "-c", code, str(tmp_path / salt)], env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        out.append(r.stdout)
    assert out[0] == out[1]


@pytest.mark.parametrize("part", ["tokens", "images"])
def test_no_loader_reads_ahead_while_a_ceiling_is_timed(tmp_path, monkeypatch, part):
    if part == "images":
        pytest.importorskip("PIL")
        pytest.importorskip("skimage")
    q = load_quick()
    monkeypatch.setattr(q, "DATA", tmp_path)
    monkeypatch.setitem(q.SPEC, "tokens", dict(rows=2_000, files=2, row_group=250, batch=64, max_len=64))
    monkeypatch.setitem(q.SPEC, "images", dict(rows=24, files=2, row_group=6, batch=4))
    monkeypatch.setattr(q, "WARMUP", 1)

    live = []

    class Tracked(pqloader.Loader):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.closed = False
            live.append(self)

        def close(self):
            self.closed = True
            super().close()

    ceilings = []

    def checked(fn):
        def run(*a, **kw):
            # Loaders iterated before this ceiling must be closed (nothing read ahead).
            open_ones = [ld for ld in live if not ld.closed]
            ceilings.append(len(open_ones))
            return fn(*a, **kw)
        return run

    monkeypatch.setattr(q.pqloader, "Loader", Tracked)
    if part == "tokens":
        monkeypatch.setattr(q, "pool_decode", checked(q.pool_decode))
        monkeypatch.setattr(q.pq, "read_table", checked(q.pq.read_table))
        q.run_tokens(q.Table(), repeats=1, workers=2)
    else:
        monkeypatch.setattr(q, "jpeg_decode_seconds", checked(q.jpeg_decode_seconds))
        q.run_images(q.Table(), repeats=1, workers=2)
    assert live, "no loader made"
    assert ceilings and max(ceilings) == 0, ceilings
