"""Reading files in child processes, so that a crash or hang of one is a test failure
naming it, not the end of the test run (the conformance tests' crash guard)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from conftest import subprocess_env

# Reads each file given every way a crash could hide in: whole, each column alone (also
# with a null mask), with page checksums verified where the name says it has them, and
# inspect(). Prints "START path" before and "DONE path" after each.
CRASH_SCRIPT = textwrap.dedent(
    r"""
    import sys
    import pyarrow.parquet as pq
    import pqloader

    def drain(path, **kw):
        try:
            for _ in pqloader.Loader(path, **kw):
                pass
        except BaseException:
            pass

    for path in sys.argv[1:]:
        print("START", path, flush=True)
        drain(path, num_workers=2)
        try:
            names = pq.read_schema(path).names
        except Exception:
            names = []
        for c in names:
            drain(path, columns=[c], num_workers=2)
            drain(path, columns=[c], null_mask=True)
        if "checksum" in path or "crc" in path:
            drain(path, num_workers=2, verify_checksums=True)
        try:
            pqloader.inspect(path)
        except BaseException:
            pass
        print("DONE", path, flush=True)
    """
)


def run_in_children(script: str, paths: list[str], timeout: float) -> tuple[dict, dict]:
    """Run ``script`` over ``paths`` in child processes, restarting after the file a child
    died or hung on. The script prints "START path" before each file and "DONE path"
    (optionally a tab and a JSON payload) after it. Returns ({path: payload or None},
    {path: why a child crashed or hung on it})."""
    results: dict = {}
    bad: dict = {}
    remaining = list(paths)
    while remaining:
        try:
            proc = subprocess.run([sys.executable, "-c", script, *remaining], capture_output=True, text=True,
                                  timeout=timeout, env=subprocess_env())
            out, err, rc = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            err, rc = f"timeout after {timeout} s (hang?)", None
        started, done = [], set()
        for line in out.splitlines():
            if line.startswith("START "):
                started.append(line[6:])
            elif line.startswith("DONE "):
                path, _, payload = line[5:].partition("\t")
                done.add(path)
                results[path] = json.loads(payload) if payload else None
        if rc == 0 and all(p in done for p in remaining):
            break
        culprit = next((p for p in started if p not in done), None)
        if culprit is None:  # died before starting anything: blame all, stop
            for p in remaining:
                bad[p] = f"child exited with {rc} before reading: {err[-2000:]}"
            break
        bad[culprit] = f"child died (returncode {rc}) while reading it: {err[-2000:]}"
        remaining = remaining[remaining.index(culprit) + 1 :]
    return results, bad
