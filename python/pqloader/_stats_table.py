"""A per-stage table of ``Loader.stats()`` and a one-line diagnosis of what limits loading.

Stages (see ``docs/performance.md``): read, decode, transform and gather are worker time
summed over all threads; their shares are of that sum. wait is the consumer's time inside
``next()``; its share is of the wall time since the first iteration.

Diagnosis rules, first match wins (thresholds below):

1. No batch yet, or no wall time: nothing to diagnose.
2. The consumer was blocked on the engine less than ``STALL_OK`` of the wall time, and
   spent less than that converting/staging batches too: *training-bound*, the loader
   keeps up (more loader threads would not help).
3. Converting/staging batches in ``next()`` (wait_seconds minus engine_wait_seconds:
   ``batch_transform``, torch conversion, device copies) took at least ``STALL_OK`` of
   the wall time and more than blocking on the engine: *hand-out-bound*.
4. Otherwise the engine is what the consumer waits for; its worker time decides:
   read at least ``READ_BOUND`` of it: *storage-bound* (read is time spent waiting for
   bytes: raise ``io_threads`` / ``readahead``); transform at least ``CPU_BOUND`` and more
   than decode: *CPU-bound (transforms)*; decode + transform at least ``CPU_BOUND``:
   *CPU-bound*; gather at least ``CPU_BOUND``: *gather-bound*; else *mixed*.
"""

from __future__ import annotations

from typing import Any, Mapping

STALL_OK = 0.10  # consumer blocked less than this share of the wall time: the loader keeps up
READ_BOUND = 0.40  # read (waiting for storage) share of worker time: storage-bound
CPU_BOUND = 0.50  # decode + transform (or gather) share of worker time: CPU-bound

# (stage, stats() key) of the worker stages, in pipeline order
WORKER_STAGES = (("read", "read_seconds"), ("decode", "decode_seconds"),
                 ("transform", "transform_seconds"), ("gather", "assemble_seconds"))


def _f(stats: Mapping[str, Any], key: str) -> float:
    v = stats.get(key)
    return float(v) if v is not None else 0.0


def stage_seconds(stats: Mapping[str, Any]) -> dict[str, float]:
    """``{"read", "decode", "transform", "gather", "wait": seconds}`` from ``stats()``."""
    out = {name: _f(stats, key) for name, key in WORKER_STAGES}
    out["wait"] = _f(stats, "wait_seconds")
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def diagnose(stats: Mapping[str, Any]) -> str:
    """One line naming what limits loading, by the rules in this module's docstring."""
    wall = _f(stats, "wall_seconds")
    if wall <= 0 or not stats.get("batches"):
        return "no batches yet: nothing to diagnose"
    wait = _f(stats, "wait_seconds")
    engine_wait = _f(stats, "engine_wait_seconds") if "engine_wait_seconds" in stats else wait
    stall = engine_wait / wall
    handout = max(wait - engine_wait, 0.0) / wall
    if stall < STALL_OK and handout < STALL_OK:
        return (f"training-bound: the loader keeps up (the consumer waited {_pct(stall)} of "
                f"the time for batches)")
    if handout >= STALL_OK and handout > stall:
        return (f"hand-out-bound: {_pct(handout)} of the time goes to converting/staging "
                f"batches in next() (batch_transform, torch conversion, device copies, "
                f"strings made Python str), {_pct(stall)} to waiting for the engine")
    # A loader that caches already (hits or misses counted) is not told to.
    cached = bool(stats.get("cache_hits") or stats.get("cache_misses"))
    s = stage_seconds(stats)
    work = s["read"] + s["decode"] + s["transform"] + s["gather"]
    if work <= 0:
        return f"loader-bound: the consumer waited {_pct(stall)} of the time; no stage timed"
    share = {k: s[k] / work for k in ("read", "decode", "transform", "gather")}
    if share["read"] >= READ_BOUND:
        return (f"storage-bound: raise io_threads / readahead (workers waited for storage "
                f"{_pct(share['read'])} of their time)")
    if share["transform"] >= CPU_BOUND and s["transform"] > s["decode"]:
        return (f"CPU-bound (transforms {_pct(share['transform'])} of worker time): raise "
                f"num_workers if cores are free" +
                ("" if cached else "; cache_dir keeps deterministic transforms' output"))
    if share["decode"] + share["transform"] >= CPU_BOUND:
        return (f"CPU-bound (decode + transform {_pct(share['decode'] + share['transform'])} "
                f"of worker time): raise num_workers if cores are free, " +
                ("" if cached else "cache decoded row groups (cache_dir), ") +
                "load fewer columns")
    if share["gather"] >= CPU_BOUND:
        return (f"gather-bound (gathering rows into batches {_pct(share['gather'])} of worker "
                f"time): raise num_workers if cores are free, load fewer columns")
    return ("mixed: no stage dominates (" +
            ", ".join(f"{k} {_pct(v)}" for k, v in share.items()) + " of worker time)")


def format_stats(stats: Mapping[str, Any]) -> str:
    """The per-stage table of ``Loader.stats()`` (seconds and share) and the diagnosis.

    Example::

        stage        seconds   share
        read           0.012    5 %  of worker time (all threads)
        decode         0.201   88 %
        transform      0.000    0 %
        gather         0.015    7 %
        wait           0.190   95 %  of wall time 0.200 s (0.180 s blocked on the engine)
        diagnosis: CPU-bound (decode + transform 88 % of worker time): ...
    """
    s = stage_seconds(stats)
    work = s["read"] + s["decode"] + s["transform"] + s["gather"]
    wall = _f(stats, "wall_seconds")
    lines = [f"{'stage':<10} {'seconds':>9}  {'share':>5}"]
    for i, (name, _) in enumerate(WORKER_STAGES):
        share = s[name] / work if work > 0 else 0.0
        note = "  of worker time (all threads)" if i == 0 else ""
        lines.append(f"{name:<10} {s[name]:>9.3f}  {_pct(share):>5}{note}")
    wait_share = s["wait"] / wall if wall > 0 else 0.0
    note = f"  of wall time {wall:.3f} s"
    if "engine_wait_seconds" in stats:
        note += f" ({_f(stats, 'engine_wait_seconds'):.3f} s blocked on the engine)"
    lines.append(f"{'wait':<10} {s['wait']:>9.3f}  {_pct(wait_share):>5}{note}")
    lines.append(f"diagnosis: {diagnose(stats)}")
    return "\n".join(lines)
