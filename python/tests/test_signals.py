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
