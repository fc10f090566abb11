"""Ctrl-C while next() waits for a batch (issue 12, item 4)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# The engine's workers sleep 60 s before each task (a test hook), so no batch comes for a
# minute; SIGINT arrives after 0.5 s. next() must raise KeyboardInterrupt then, stop the
# workers (their sleep wakes on stop), and leave the loader at its position.
CHILD = r"""
import os, signal, sys, threading, time
import pqloader
loader = pqloader.Loader(sys.argv[1], batch_size=10, num_workers=2, _debug_max_delay_us=60_000_000)
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
try:
    for batch in loader:
        print("got a batch", flush=True)
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - t0, 1), "s", flush=True)
state = loader.state_dict()
print("position", state["epoch"], state["batch"], flush=True)
"""


def test_ctrl_c_interrupts_a_waiting_next(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": np.arange(100)}), path, row_group_size=50)
    # 30 s is half the workers' sleep: finishing at all means the wait was interrupted.
    out = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert "got a batch" not in out.stdout
    assert "interrupted after" in out.stdout, out.stdout + out.stderr
    assert "position 0 0" in out.stdout  # nothing was handed out; resuming starts at batch 0


# Building a Loader: it waits for another process computing the same filter's selection
# (the flock of cache_dir/filters/.lock, held here by a child for 60 s), then would run the
# mask pass. SIGINT after 0.5 s must raise KeyboardInterrupt then (before: after the
# lock's 30-minute limit), and a Loader built afterwards works.
CHILD_LOCK = r"""
import fcntl, os, signal, sys, threading, time
import pyarrow.compute as pc
import pqloader
path, cache = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(cache, "filters"), exist_ok=True)
fd = os.open(os.path.join(cache, "filters", ".lock"), os.O_RDWR | os.O_CREAT)
holder = os.fork()
if holder == 0:
    fcntl.flock(fd, fcntl.LOCK_EX)
    time.sleep(60)
    os._exit(0)
os.close(fd)  # the lock belongs to the child's open file alone (flock is per open file)
time.sleep(0.3)
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
try:
    pqloader.Loader(path, batch_size=10, cache_dir=cache, filter=pc.field("x") > 10)
    print("built", flush=True)
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - t0, 1), "s", flush=True)
os.kill(holder, 9)
os.waitpid(holder, 0)
rows = sum(len(b["x"]) for b in pqloader.Loader(path, batch_size=10, cache_dir=cache,
                                                filter=pc.field("x") > 10))
print("rows", rows, flush=True)
"""

# A Predicate (run on the engine's threads, each call 0.3 s) over 40 row groups: about 6 s
# of mask pass on 2 threads; SIGINT after 0.5 s must end it within a call or two.
CHILD_PREDICATE = r"""
import os, signal, sys, threading, time
import pyarrow.compute as pc
import pqloader
def slow(batch):
    time.sleep(0.3)
    return pc.greater(batch.column("x"), 10)
threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
try:
    pqloader.Loader(sys.argv[1], batch_size=10, num_workers=2,
                    filter=pqloader.Predicate(["x"], slow))
    print("built", flush=True)
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - t0, 1), "s", flush=True)
"""


def _interrupted_after(stdout: str) -> float:
    line = next(l for l in stdout.splitlines() if l.startswith("interrupted after"))
    return float(line.split()[2])


def test_ctrl_c_interrupts_a_loader_waiting_for_another_processs_filter_lock(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": np.arange(100)}), path, row_group_size=50)
    out = subprocess.run([sys.executable, "-c", CHILD_LOCK, str(path), str(tmp_path / "cache")],
                         capture_output=True, text=True, timeout=45)
    assert out.returncode == 0, out.stderr
    assert "built" not in out.stdout
    assert "interrupted after" in out.stdout, out.stdout + out.stderr
    assert _interrupted_after(out.stdout) < 5
    assert "rows 89" in out.stdout


def test_ctrl_c_interrupts_a_predicates_mask_pass(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"x": np.arange(400)}), path, row_group_size=10)
    out = subprocess.run([sys.executable, "-c", CHILD_PREDICATE, str(path)], capture_output=True,
                         text=True, timeout=45)
    assert out.returncode == 0, out.stderr
    assert "built" not in out.stdout
    assert "interrupted after" in out.stdout, out.stdout + out.stderr
    assert _interrupted_after(out.stdout) < 2.5
