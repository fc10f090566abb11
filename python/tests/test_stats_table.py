"""pqloader.format_stats / diagnose / Loader.stats_table: the per-stage table and its rules."""

from __future__ import annotations

import re

import pytest

import pqloader
from pqloader import _stats_table
from conftest import write_dataset


def _stats(read=0.0, decode=0.0, transform=0.0, gather=0.0, wait=0.0, engine_wait=None,
           wall=10.0, batches=100):
    return {"read_seconds": read, "decode_seconds": decode, "transform_seconds": transform,
            "assemble_seconds": gather, "wait_seconds": wait,
            "engine_wait_seconds": wait if engine_wait is None else engine_wait,
            "wall_seconds": wall, "batches": batches}


@pytest.mark.parametrize("stats, verdict", [
    (_stats(read=5, decode=1, wait=0.2), "training-bound"),
    (_stats(read=0.1, decode=9, wait=0.9), "training-bound"),  # just under STALL_OK
    (_stats(decode=9, wait=6, engine_wait=1), "hand-out-bound"),
    (_stats(read=6, decode=3, gather=1, wait=8), "storage-bound"),
    (_stats(read=4, decode=5, gather=1, wait=8), "storage-bound"),  # read 40 %
    (_stats(read=1, decode=8, gather=1, wait=8), "CPU-bound (decode"),
    (_stats(read=1, decode=2, transform=6, gather=1, wait=8), "CPU-bound (transforms"),
    (_stats(read=1, decode=3, transform=3, gather=1, wait=8), "CPU-bound (decode"),
    (_stats(read=1, decode=2, gather=7, wait=8), "gather-bound"),
    (_stats(read=3, decode=2, transform=2, gather=3, wait=8), "mixed"),
    (_stats(wait=8), "loader-bound"),
    (_stats(read=1, wall=0.0), "no batches yet"),
    (_stats(read=1, batches=0), "no batches yet"),
])
def test_diagnosis_rules(stats, verdict):
    assert pqloader.diagnose(stats).startswith(verdict), pqloader.diagnose(stats)


def test_storage_bound_names_io_threads_and_cpu_bound_names_num_workers():
    assert "io_threads" in pqloader.diagnose(_stats(read=9, decode=1, wait=9))
    cpu = pqloader.diagnose(_stats(read=1, decode=9, wait=9))
    assert "num_workers" in cpu and "cache_dir" in cpu


def test_without_engine_wait_the_whole_wait_counts_as_stall():
    s = _stats(read=9, decode=1, wait=9)
    del s["engine_wait_seconds"]
    assert pqloader.diagnose(s).startswith("storage-bound")


def _rows(table):
    return {line.split()[0]: line.split()[1:] for line in table.splitlines()[1:-1]}


def test_table_has_every_stage_with_seconds_and_share():
    table = pqloader.format_stats(_stats(read=1, decode=2, transform=3, gather=4, wait=5,
                                         engine_wait=4))
    rows = _rows(table)
    assert list(rows) == ["read", "decode", "transform", "gather", "wait"]
    assert [float(rows[k][0]) for k in rows] == [1, 2, 3, 4, 5]
    assert [rows[k][1] for k in rows] == ["10", "20", "30", "40", "50"]  # wait: 5 s of 10 s wall
    assert "4.000 s blocked on the engine" in table
    assert table.splitlines()[-1] == "diagnosis: " + pqloader.diagnose(
        _stats(read=1, decode=2, transform=3, gather=4, wait=5, engine_wait=4))


def test_table_of_a_fresh_loader_does_not_divide_by_zero(tmp_path):
    write_dataset(tmp_path / "d", [[100]])
    loader = pqloader.Loader(str(tmp_path / "d"), batch_size=10)
    table = loader.stats_table()
    assert table.endswith("diagnosis: no batches yet: nothing to diagnose")


def test_stats_table_of_a_real_run(tmp_path):
    write_dataset(tmp_path / "d", [[1000, 1000], [1000]])
    loader = pqloader.Loader(str(tmp_path / "d"), batch_size=100, num_workers=2)
    n = sum(len(b["id"]) for b in loader)
    assert n == 3000
    s = loader.stats()
    table = pqloader.format_stats(s)  # wall_seconds moves on: one snapshot for both checks
    assert loader.stats_table().splitlines()[0] == table.splitlines()[0]
    assert len(loader.stats_table().splitlines()) == len(table.splitlines())
    rows = _rows(table)
    assert float(rows["decode"][0]) == pytest.approx(s["decode_seconds"], abs=1e-3)
    assert float(rows["wait"][0]) == pytest.approx(s["wait_seconds"], abs=1e-3)
    assert abs(sum(int(rows[k][1]) for k in ("read", "decode", "transform", "gather")) - 100) <= 2
    verdict = table.splitlines()[-1]
    assert re.match(r"diagnosis: (training|hand-out|storage|CPU|gather|mixed|loader)", verdict)
    assert verdict == "diagnosis: " + _stats_table.diagnose(s)


def test_a_loader_that_caches_is_not_told_to_cache():
    # Hits or misses counted: cache_dir is set already.
    for key in ("cache_hits", "cache_misses"):
        stats = dict(_stats(read=1, decode=8, gather=1, wait=8), **{key: 3})
        assert "cache_dir" not in _stats_table.diagnose(stats)
        stats = dict(_stats(read=1, decode=2, transform=6, gather=1, wait=8), **{key: 3})
        assert "cache_dir" not in _stats_table.diagnose(stats)
    assert "cache decoded row groups (cache_dir)" in _stats_table.diagnose(
        _stats(read=1, decode=8, gather=1, wait=8))


def test_a_batch_transforms_thread_waiting_for_the_engine_is_not_the_consumers_wait(tmp_path):
    # With a batch_transform, the engine is read on its thread, whose waits for a slow
    # engine overlap the consumer's training: stats() took them for the consumer's
    # (wait_fraction 0.87 where the consumer spent 11 % of the time in next()).
    import time

    write_dataset(tmp_path / "d", [[50] * 40])
    loader = pqloader.Loader(str(tmp_path / "d"), batch_size=50, num_workers=1,
                             batch_transform=lambda b: b, _debug_max_delay_us=20000)
    blocked, it = 0.0, iter(loader)
    while True:
        t0 = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            break
        finally:
            blocked += time.perf_counter() - t0
        time.sleep(0.02)  # the training step
    s = loader.stats()
    # (the loader times the consumer inside its next(): never more than the loop saw)
    assert s["engine_wait_seconds"] <= s["wait_seconds"] <= blocked + 0.005
    assert s["wait_fraction"] <= blocked / s["wall_seconds"] + 0.01
