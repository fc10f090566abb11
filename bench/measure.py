"""Run ONE (system, workload) measurement and print its JSON result.

    <venv>/bin/python bench/measure.py --system torch --workload images --data bench/data/small \
        [--mode perf|determinism] [--config '{"num_workers": 2}']

The result is the last stdout line that starts with "@@RESULT ". Everything
else (library chatter) is ignored by the driver. Exit code 0 even for
"not supported" results; non-zero only on crashes (the driver then records
"failed: <last stderr line>").
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import platform
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common as C  # noqa: E402


# pqloader raises these for ragged list<int32> columns read without lists= or pack=
PQLOADER_UNSUPPORTED = ("UnsupportedType", "UnsupportedTypeError", "InvalidData", "InvalidDataError")


class NotSupported(Exception):
    """Raised by an adapter for a workload the system cannot do (yet)."""


def _emit(obj) -> None:
    sys.stdout.write("@@RESULT " + json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def timed_epoch(make_iter, n_rows: int, bytes_on_disk: int, cap_s: float, start: float | None = None,
                mean_tokens: float | None = None, cpu_start: float | None = None):
    """Iterate one epoch; returns metrics. `start` (if given) is when loader construction began,
    so time-to-first-batch includes set-up (ray.init, HF Arrow conversion, ...); `cpu_start`
    (the process tree's CPU seconds then) puts the set-up's CPU in the epoch's too, as the
    report says ("incl. start-up"): read here, it left out what an Adapter's constructor ran.
    Token batches also count their tokens (padding excluded); packed blocks count as the
    documents their tokens amount to (tokens / `mean_tokens`, the dataset's mean length),
    so a packed epoch that delivers every token counts every row once."""
    cpu0 = C.tree_cpu_seconds() if cpu_start is None else cpu_start
    t0 = start if start is not None else C.now()
    it = make_iter()
    samples = batches = 0
    packed_tokens = 0
    tokens = None
    ttfb = None
    partial = False
    try:
        for b in it:
            if ttfb is None:
                ttfb = C.now() - t0
            n = C.batch_tokens(b)
            if n is not None:
                tokens = (tokens or 0) + n
            if mean_tokens and C.is_packed(b):
                packed_tokens += n
            else:
                samples += C.batch_len(b)
            batches += 1
            if C.now() - t0 > cap_s:
                partial = True
                break
    finally:
        close = getattr(it, "close", None)
        if close:
            close()
    dt = C.now() - t0
    if packed_tokens:
        samples += round(packed_tokens / mean_tokens)
    cpu = C.tree_cpu_seconds() - cpu0
    frac = samples / n_rows if n_rows else 0
    return {
        "samples": samples, "batches": batches, "seconds": dt, "partial": partial,
        "short": (not partial) and samples != n_rows,  # an epoch that ended early (a loader bug)
        "samples_per_s": samples / dt if dt > 0 else None,
        "tokens": tokens, "tokens_per_s": tokens / dt if tokens is not None and dt > 0 else None,
        "mb_per_s": bytes_on_disk * frac / dt / 1e6 if dt > 0 else None,
        "ttfb_s": ttfb, "cpu_s": cpu, "cpu_s_per_1k": cpu / samples * 1000 if samples else None,
    }


def stall_sweep(adapter, steps_ms, warm: int, max_steps: int, max_s: float, first_epoch: int = 4,
                shuffled=None):
    """Simulated trainer on ONE continuous stream of batches (epochs chained, so an epoch boundary
    costs what it costs in training). For each step time in turn: each step sleeps `step_ms` (a GPU
    step leaves the CPU free); stall fraction = time blocked in next(loader) / loop time.
    The first `warm` batches are not measured."""
    state = {"epoch": first_epoch}

    def stream():
        while True:
            it = adapter.epoch(state["epoch"], **(shuffled or {}))
            state["epoch"] += 1
            n = 0
            try:
                for b in it:
                    n += 1
                    yield b
            finally:
                close = getattr(it, "close", None)
                if close:
                    close()
            if n == 0:  # the system gave an empty epoch: say so (not a bare StopIteration)
                raise RuntimeError(f"epoch {state['epoch'] - 1} of the stall sweep gave no batches")

    gen = stream()
    out = []
    try:
        for _ in range(warm):
            next(gen)
        for step_ms in steps_ms:
            wait = 0.0
            steps = 0
            t0 = C.now()
            while steps < max_steps and C.now() - t0 < max_s:
                t = C.now()
                next(gen)
                wait += C.now() - t
                steps += 1
                if step_ms:
                    time.sleep(step_ms / 1000.0)
            total = C.now() - t0
            out.append({"step_ms": step_ms, "steps": steps, "wait_s": wait, "total_s": total,
                        "stall_fraction": wait / total if total > 0 else None})
    finally:
        gen.close()
    return out


def versions():
    out = {"python": platform.python_version()}
    for m in ("numpy", "pyarrow", "torch", "PIL", "petastorm", "datasets", "ray", "pqloader", "pandas"):
        mod = sys.modules.get(m)
        if mod is not None:
            out[m] = getattr(mod, "__version__", "?")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", required=True)
    ap.add_argument("--workload", required=True, choices=C.WORKLOADS)
    ap.add_argument("--data", required=True)
    ap.add_argument("--mode", default="perf", choices=["perf", "determinism"])
    ap.add_argument("--config", default="{}")
    ap.add_argument("--epoch-cap-s", type=float, default=120)
    ap.add_argument("--stall-steps", default="5,20,50")
    ap.add_argument("--stall-max-steps", type=int, default=60)
    ap.add_argument("--stall-max-s", type=float, default=6)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--quick", action="store_true", help="epoch 1 only (used by --tune)")
    ap.add_argument("--cold", action="store_true",
                    help="also a shuffled epoch after dropping the files from the page cache")
    a = ap.parse_args()
    cfg = json.loads(a.config)
    manifest = C.load_manifest(a.data, a.workload)
    res = {"system": a.system, "workload": a.workload, "mode": a.mode, "config": cfg, "status": "ok"}
    adapter = None
    done = False
    try:
        mod = importlib.import_module("systems." + a.system.split(":")[0])
        cpu_start, t_start = C.tree_cpu_seconds(), C.now()
        try:
            adapter = mod.Adapter(a.workload, a.data, manifest, cfg)
            res["description"] = adapter.describe()
            if a.mode == "determinism":
                h = hashlib.sha256()
                ids = []
                n = 0
                for b in adapter.epoch(0, shuffle=True, seed=a.seed):
                    C.hash_batch(h, b)
                    n += C.batch_len(b)
                    if isinstance(b, dict) and "i1" in b:
                        ids.append(C._to_numpy(b["i1"]).astype("int64"))
                res["determinism"] = {"order_hash": h.hexdigest()[:16], "samples": n, "seed": a.seed}
                if n != manifest["rows"]:
                    res["status"] = "failed"
                    res["reason"] = f"shuffled epoch yielded {n} of {manifest['rows']} samples"
                if ids:
                    import numpy as np

                    res["determinism"]["content_hash"] = hashlib.sha256(np.sort(np.concatenate(ids)).tobytes()).hexdigest()[:16]
            else:
                # Training shuffles: epochs 1 and 2 are shuffled (each system's own shuffle);
                # one natural-order epoch is measured beside them, and with --cold a shuffled
                # epoch whose files were first dropped from the page cache.
                rows, nbytes = manifest["rows"], manifest["bytes"]
                mean = manifest.get("mean_tokens")
                shuffled = dict(shuffle=True, seed=a.seed)
                res["epoch1"] = timed_epoch(lambda: adapter.epoch(0, **shuffled), rows, nbytes, a.epoch_cap_s,
                                            start=t_start, mean_tokens=mean, cpu_start=cpu_start)
                res["shuffle"] = True
                if not a.quick:
                    res["epoch2"] = timed_epoch(lambda: adapter.epoch(1, **shuffled), rows, nbytes, a.epoch_cap_s,
                                                mean_tokens=mean)
                    res["unshuffled"] = timed_epoch(lambda: adapter.epoch(2), rows, nbytes, a.epoch_cap_s,
                                                    mean_tokens=mean)
                    if a.cold:
                        # Nothing read before the eviction may serve the cold epoch: a
                        # system that keeps one iteration running (pqloader starts the next
                        # epoch while one ends) drops it and starts afresh.
                        if hasattr(adapter, "restart"):
                            adapter.restart()
                        # The dataset's files and whatever a system reads its epochs from
                        # instead (HF's Arrow cache, a local-disk cache): evicting only the
                        # Parquet files left those warm, and their "cold" epoch read memory.
                        for d in [os.path.join(a.data, a.workload),
                                  *(adapter.cold_dirs() if hasattr(adapter, "cold_dirs") else ())]:
                            C.evict_page_cache(d)
                        res["cold"] = timed_epoch(lambda: adapter.epoch(3, **shuffled), rows, nbytes, a.epoch_cap_s,
                                                  mean_tokens=mean)
                steps = [] if a.quick else [float(x) for x in a.stall_steps.split(",") if x]
                res["stall"] = stall_sweep(adapter, steps, warm=2, max_steps=a.stall_max_steps,
                                           max_s=a.stall_max_s, shuffled=shuffled) if steps else []
                e1 = res["epoch1"]
                if not e1["samples"]:
                    res["status"] = "failed"
                    res["reason"] = "epoch 1 yielded no batches"
                if e1["batches"]:
                    # seconds per batch (packed token batches hold blocks, not batch_size rows)
                    res["breakeven_step_ms"] = e1["seconds"] / e1["batches"] * 1000
            res["extra"] = adapter.extra() if hasattr(adapter, "extra") else {}
            done = True
        finally:
            res["versions"] = versions()
            if done:
                _emit(res)  # before close(): some systems die noisily while shutting down
                res["_emitted"] = True
            if adapter is not None and hasattr(adapter, "close"):
                try:
                    adapter.close()
                except Exception:  # noqa: BLE001
                    traceback.print_exc()
    except NotSupported as e:
        res["status"] = "unsupported"
        res["reason"] = str(e)
    except Exception as e:  # noqa: BLE001 - recorded as a failed row
        # pqloader's UnsupportedType / InvalidData for ragged lists = "not supported yet"
        if type(e).__name__ in PQLOADER_UNSUPPORTED and a.system.startswith("pqloader") and a.workload == "tokens":
            res["status"] = "unsupported"
            res["reason"] = (f"ragged lists need a layout: lists= or pack= (rows pqloader-ragged, -pad, -pack) "
                             f"({type(e).__name__}: {str(e)[:160]})")
        else:
            traceback.print_exc()
            res["status"] = "failed"
            res["reason"] = f"{type(e).__name__}: {str(e)[:300]}"
    if not res.get("_emitted"):
        res["versions"] = versions()
        _emit(res)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown (lingering reader/prefetch threads)


if __name__ == "__main__":
    main()
