"""bench/quick.py measures what it says: its data does not depend on the process's hash
salt, and no loader reads ahead while a ceiling is timed (a loader kept across paired
rounds reads its next epoch while the ceiling runs: the ceiling is slowed and the
loader's next epoch starts with a head start, so the ratio is inflated). And the other
bench scripts: bench/measure.py's cold epoch finds no system's own cache in memory and
its epoch-1 CPU includes the start-up; bench/wide_bench.py times every row it counts."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import REPO_ROOT, subprocess_env

QUICK = REPO_ROOT / "bench" / "quick.py"
BENCH = REPO_ROOT / "bench"


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


def test_wide_bench_times_every_row_it_counts(monkeypatch, tmp_path):
    # A clock that moves one unit per batch: 256 rows a unit is the steady rate. Timed from
    # epoch 1's first batch on, that batch's rows came in no time (4,096 rows over 15 units).
    spec = importlib.util.spec_from_file_location("bench_wide_under_test", BENCH / "wide_bench.py")
    w = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(w)
    clock = [0.0]

    class Clock:
        @staticmethod
        def perf_counter():
            return clock[0]

    class OneUnitABatch(pqloader.Loader):
        def __iter__(self):
            for batch in super().__iter__():
                clock[0] += 1.0
                yield batch

    monkeypatch.setattr(w, "time", Clock)
    monkeypatch.setattr(w.pqloader, "Loader", OneUnitABatch)
    path = tmp_path / "flat.parquet"
    w.write(path, 8, struct=False)
    assert w.steady_rows_per_second(path) == pytest.approx(w.BATCH)


def _run_measure(tmp_path, system_code: str, data, *args: str) -> dict:
    """bench/measure.py's main() in a child process, with a system defined by `system_code`
    (a module `systems.probe` whose Adapter it runs); its @@RESULT."""
    code = textwrap.dedent(f"""
        import sys, types
        sys.path.insert(0, {str(BENCH)!r})
        import measure
        mod = types.ModuleType("systems.probe")
        exec({system_code!r}, mod.__dict__)
        sys.modules["systems.probe"] = mod
        sys.argv = ["measure.py", "--system", "probe", "--workload", "tabular", "--data", {str(data)!r},
                    "--stall-steps", "", *{list(args)!r}]
        measure.main()
    """)
    r = subprocess.run([sys.executable, "-c", code], env=subprocess_env(tmp_path), capture_output=True,
                       text=True, timeout=120)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("@@RESULT ")]
    assert lines, r.stderr[-3000:]
    res = json.loads(lines[-1][len("@@RESULT "):])
    assert res["status"] == "ok", (res, r.stderr[-3000:])
    return res


def _tabular_data(root, rows=4096):
    (root / "tabular").mkdir(parents=True)
    path = root / "tabular" / "part-00000.parquet"
    pq.write_table(pa.table({"i1": np.arange(rows), "x": np.ones(rows, np.float32)}), path)
    (root / "tabular.manifest.json").write_text(json.dumps(
        {"rows": rows, "bytes": path.stat().st_size, "batch_size": 512}))
    return root


def test_measure_epoch1_cpu_includes_the_systems_start_up(tmp_path):
    # The report: "CPU s per 1,000 samples = user+sys ... during epoch 1 (incl. start-up)",
    # as TTFB includes it; an Adapter that starts its engine in the constructor (Ray's
    # ray.init: 7 CPU s here) had that CPU left out.
    data = _tabular_data(tmp_path / "data")
    system = textwrap.dedent("""
        import time
        import numpy as np

        class Adapter:
            def __init__(self, workload, data_dir, manifest, cfg):
                self.rows = manifest["rows"]
                t = time.thread_time()  # (this thread's: the wall time is then >= 0.5 s)
                while time.thread_time() - t < 0.5:  # start-up work: 0.5 CPU s
                    pass

            def describe(self):
                return "start-up in the constructor"

            def epoch(self, e, shuffle=False, seed=None):
                for i in range(0, self.rows, 512):
                    yield {"i1": np.arange(i, i + 512)}
    """)
    res = _run_measure(tmp_path, system, data, "--quick")
    assert res["epoch1"]["ttfb_s"] >= 0.5
    assert res["epoch1"]["cpu_s"] >= 0.4, res["epoch1"]


# Bytes of a file in the page cache (mincore of a shared mapping of it).
RESIDENT = textwrap.dedent("""
    import ctypes, mmap, os

    def resident(path):
        size = os.path.getsize(path)
        if not size:
            return 0
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            try:
                assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
            finally:
                libc.munmap(addr, size)
        finally:
            os.close(fd)
        return sum(v & 1 for v in vec) * mmap.PAGESIZE

    def resident_below(d):
        return sum(resident(os.path.join(r, f)) for r, _, fs in os.walk(d) for f in fs)
""")


def test_measure_cold_epoch_finds_no_system_cache_in_memory(tmp_path):
    # measure.py --cold evicted the Parquet files only: HF datasets' epochs read its Arrow
    # cache (memory-mapped), Petastorm's + cache its local-disk cache, both left in the
    # page cache, so their "cold" rows read memory (HF 1.32 M rows/s in docs/benchmarks.md,
    # its warm unshuffled epoch 1.28 M). A system like them (epochs read a memory-mapped
    # Arrow copy it made of the data; hf_sys.py's restart() and cold_dirs()) must find its
    # copy out of memory when the cold epoch starts.
    ns: dict = {}
    exec(RESIDENT, ns)
    probe = tmp_path / "probe.bin"
    probe.write_bytes(b"x" * (1 << 20))
    probe.read_bytes()
    fd = os.open(probe, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # as bench/common.py's evict_page_cache
    finally:
        os.close(fd)
    if ns["resident"](str(probe)):
        pytest.skip("posix_fadvise(DONTNEED) does not drop pages on this filesystem (tmpfs?)")
    data = _tabular_data(tmp_path / "data", rows=1 << 16)
    system = RESIDENT + textwrap.dedent(f"""
        import gc, os, tempfile
        import pyarrow as pa
        import pyarrow.parquet as pq

        class Adapter:
            def __init__(self, workload, data_dir, manifest, cfg):
                self.source = os.path.join(data_dir, workload)
                self.cache_dir = tempfile.mkdtemp(dir={str(tmp_path)!r})
                self.table = None
                self.cold_resident = None

            def describe(self):
                return "epochs read a memory-mapped Arrow copy of the data"

            def _table(self):
                path = os.path.join(self.cache_dir, "data.arrow")
                if not os.path.exists(path):
                    t = pq.read_table(self.source)
                    with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, t.schema) as w:
                        w.write_table(t)
                if self.table is None:
                    self.table = pa.ipc.open_file(pa.memory_map(path)).read_all()
                return self.table

            def epoch(self, e, shuffle=False, seed=None):
                if e == 3:  # measure.py's cold epoch, after its eviction
                    self.cold_resident = resident_below(self.cache_dir)
                t = self._table()
                for i in range(0, t.num_rows, 512):
                    yield {{"i1": t.column("i1").slice(i, 512).to_numpy()}}

            def restart(self):
                self.table = None
                gc.collect()

            def cold_dirs(self):
                return [self.cache_dir]

            def extra(self):
                return {{"cold_resident": self.cold_resident}}
    """)
    res = _run_measure(tmp_path, system, data, "--cold")
    assert res["cold"]["samples"] == 1 << 16
    assert res["extra"]["cold_resident"] == 0, res["extra"]
