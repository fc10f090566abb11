"""Containers: the default max_inflight_bytes is sized to the cgroup's memory limit (v2
memory.max, v1 memory.limit_in_bytes, the smallest of the cgroup and its ancestors), and a
max_inflight_bytes given over half that limit warns. The limited run is a subprocess, so the
limit never reaches the test process."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from conftest import subprocess_env
from pqloader import _core, _env
from test_cpu_limits import _fake_proc, _write, child_cgroup, in_cgroup

MIB = 1 << 20
V1_NO_LIMIT = str(0x7FFFFFFFFFFFF000)  # what cgroup v1 shows for "no limit"


def test_the_memory_limit_is_the_smallest_of_the_cgroup_and_its_ancestors_v2(tmp_path):
    """cgroup v2 (a Kubernetes pod): the pod's cgroup holds the limit, its container's
    says max; the default budget is an eighth of it, at most 256 MiB, at least 16 MiB."""
    mount = tmp_path / "fs" / "cgroup"
    _write(mount / "pod", {"memory.max": str(600 * MIB)})
    _write(mount / "pod" / "c1", {"memory.max": "max"})
    proc = _fake_proc(tmp_path, ["0::/kubepods/pod/c1"], [("/kubepods", str(mount), "cgroup2", "rw")])
    assert _env.cgroup_memory_limit(proc) == 600 * MIB
    assert _env.inflight_bytes(None, proc) == 75 * MIB
    _write(mount / "pod" / "c1", {"memory.max": str(100 * MIB)})
    assert _env.cgroup_memory_limit(proc) == 100 * MIB
    assert _env.inflight_bytes(None, proc) == 16 * MIB  # the floor (an eighth is 12.5 MiB)
    _write(mount / "pod", {"memory.max": "max"})
    _write(mount / "pod" / "c1", {"memory.max": str(64 << 30)})
    assert _env.inflight_bytes(None, proc) == 256 * MIB  # the default, whatever the limit above


def test_the_memory_limit_of_cgroup_v1_and_none_without_one(tmp_path):
    """v1's "no limit" is the largest page count in bytes; the cpu hierarchy's files (the
    wrong controller) are not read."""
    memory, cpu = tmp_path / "fs" / "memory", tmp_path / "fs" / "cpu"
    _write(memory, {"memory.limit_in_bytes": V1_NO_LIMIT})
    _write(memory / "job", {"memory.limit_in_bytes": V1_NO_LIMIT})
    _write(cpu / "job", {"memory.limit_in_bytes": str(100 * MIB)})
    cgroups = ["12:memory:/job", "4:cpu,cpuacct:/job", "0::/"]
    mounts = [("/", str(cpu), "cgroup", "rw,cpu,cpuacct"), ("/", str(memory), "cgroup", "rw,memory")]
    proc = _fake_proc(tmp_path, cgroups, mounts)
    assert _env.cgroup_memory_limit(proc) is None
    assert _env.inflight_bytes(None, proc) == 256 * MIB
    _write(memory / "job", {"memory.limit_in_bytes": str(1 << 30)})
    assert _env.cgroup_memory_limit(proc) == 1 << 30
    assert _env.inflight_bytes(None, proc) == 128 * MIB
    assert _env.cgroup_memory_limit(str(tmp_path / "no-proc")) is None


def test_a_budget_given_over_half_the_limit_is_kept_and_warns_once(tmp_path):
    mount = tmp_path / "fs" / "cgroup"
    _write(mount, {"memory.max": str(600 * MIB)})
    proc = _fake_proc(tmp_path, ["0::/"], [("/", str(mount), "cgroup2", "rw")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _env.inflight_bytes(300 * MIB, proc) == 300 * MIB  # half: no warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # (as Python's: once per message and line)
        for _ in range(3):
            assert _env.inflight_bytes(301 * MIB, proc) == 301 * MIB
    assert [w.category for w in caught] == [RuntimeWarning], caught
    message = str(caught[0].message)
    assert "max_inflight_bytes=" in message and f"{600 * MIB} bytes (600 MiB" in message, message
    assert caught[0].filename == __file__  # the user's line


def test_the_budget_sized_to_a_limit_reaches_the_engine_and_keeps_the_batches(tmp_path, monkeypatch):
    """max_inflight_bytes never changes batch content or order (docs/determinism.md)."""
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": np.arange(4000, dtype=np.int64)}), path, row_group_size=250)

    def batches(**kw):
        loader = pqloader.Loader(str(path), batch_size=64, shuffle=True, seed=3, shuffle_window=2, **kw)
        return loader.options.to_engine()["max_inflight_bytes"], [b["id"].tolist() for b in loader]

    budget, unlimited = batches()
    assert budget == 256 * MIB
    monkeypatch.setattr(_env, "cgroup_memory_limit", lambda proc="/proc/self": 128 * MIB)
    budget, limited = batches()
    assert budget == 16 * MIB
    assert limited == unlimited
    assert batches(max_inflight_bytes=4096) == (4096, unlimited)  # given: kept


# A shuffled epoch with default options, its consumer slower than the workers (a training
# step), so that they fill the budget: the batches' digest and the budget the engine got.
RUN = textwrap.dedent("""
    import hashlib, json, sys, time, pqloader
    loader = pqloader.Loader(sys.argv[1], batch_size=1024, shuffle=True, seed=5, **json.loads(sys.argv[2]))
    digest, delay = hashlib.sha256(), float(sys.argv[3])
    for batch in loader:
        digest.update(batch["f0"].tobytes()); digest.update(batch["f39"].tobytes())
        time.sleep(delay)
    print(json.dumps({"budget": loader.options.to_engine()["max_inflight_bytes"], "digest": digest.hexdigest()}))
""")


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """160 MB of float32 in 2.5 MiB row groups: more than a 256 MiB budget fills in a 256 MB
    cgroup (decoded rows, their shuffled copies and the freed blocks kept for reuse)."""
    path = tmp_path_factory.mktemp("memlimit") / "wide.parquet"
    rng = np.random.default_rng(0)
    rows = 1 << 20
    table = pa.table({f"f{i}": rng.random(rows, dtype=np.float32) for i in range(40)})
    pq.write_table(table, path, row_group_size=16384, compression="none", use_dictionary=False)
    return str(path)


def run(path, options, delay, prefix=()):
    done = subprocess.run([*prefix, sys.executable, "-c", RUN, path, json.dumps(options), str(delay)],
                          capture_output=True, text=True, timeout=120, env=subprocess_env())
    return done


def test_a_shuffled_loader_with_default_options_completes_in_a_256_mb_cgroup(wide):
    """With the 256 MiB default budget this loader was OOM-killed (status -9, no error) in
    a 256 MB cgroup; sized to the limit (32 MiB) it completes, with the same batches."""
    limit = 256 * MIB
    with child_cgroup("memory", {"memory.max": str(limit)},
                      {"memory.limit_in_bytes": str(limit)}) as child:
        done = run(wide, {}, 0.002, prefix=in_cgroup(child))
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "max_inflight_bytes" not in done.stderr, done.stderr  # none given: no warning
    got = json.loads(done.stdout)
    assert got["budget"] == limit // 8
    reference = run(wide, {"max_inflight_bytes": 256 * MIB}, 0)  # (no limit)
    assert reference.returncode == 0, reference.stderr[-2000:]
    assert json.loads(reference.stdout) == {"budget": 256 * MIB, "digest": got["digest"]}


def _limited(tmp_path, monkeypatch, limit):
    """Loaders made in this test see a cgroup v2 memory limit of `limit` bytes (a fake
    /proc tree, read by the engine's parser); None: no limit."""
    root = tmp_path / f"limit-{limit}"
    mount = root / "fs" / "cgroup"
    _write(mount, {"memory.max": "max" if limit is None else str(limit)})
    proc = _fake_proc(root, ["0::/"], [("/", str(mount), "cgroup2", "rw")])
    monkeypatch.setattr(_env, "cgroup_memory_limit", lambda _=None: _core._cgroup_memory_limit(proc))


def test_dataloader_workers_share_the_limit_default_and_keep_their_batches(tmp_path, monkeypatch):
    """W DataLoader workers each rebuild the loader: the default's eighth of the limit is
    divided among them (not below 16 MiB), a given budget is kept, and every worker's
    batches are those it reads without a limit."""
    torch_dataset = pytest.importorskip("pqloader.torch")
    from types import SimpleNamespace
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": np.arange(3000, dtype=np.int64)}), path, row_group_size=200)

    def workers(w, **kw):
        ds = torch_dataset.IterableDataset(pqloader.Loader(str(path), batch_size=50, shuffle=True, seed=4,
                                                           shuffle_window=2, **kw))
        out = []
        for i in range(w):
            loader = ds._make_worker_loader(SimpleNamespace(id=i, num_workers=w))
            out.append((loader.options.to_engine()["max_inflight_bytes"], [b["id"].tolist() for b in loader]))
            ds._worker_loader = None
        return out

    _limited(tmp_path, monkeypatch, None)
    free = workers(4)
    assert [b for b, _ in free] == [256 * MIB] * 4
    _limited(tmp_path, monkeypatch, 1 << 30)  # one loader's default: 128 MiB
    limited = workers(4)
    assert [b for b, _ in limited] == [32 * MIB] * 4  # 128 MiB shared by 4
    assert [x for _, x in limited] == [x for _, x in free]
    assert [b for b, _ in workers(16)][:1] == [16 * MIB]  # (8 MiB each: the floor)
    assert [b for b, _ in workers(2, max_inflight_bytes=4096)] == [4096, 4096]  # given: kept
    _limited(tmp_path, monkeypatch, 64 << 30)
    assert [b for b, _ in workers(2)] == [256 * MIB] * 2  # a large limit: the default each


def test_a_mixture_warns_once_when_its_sources_hold_over_half_the_limit(tmp_path, monkeypatch):
    """A mixture's sources are built Loaders (their engines' budgets fixed): when theirs
    add up to more than half the limit (one loader's given budget's line), one warning
    names the option, how many are defaults and a value for each; sources of weight 0
    (never read) do not count; the batches are the same whatever the budgets. Two sources
    left at their defaults (an eighth each) do not warn in a small container: they warned
    in every container of 4 GiB or less, for nothing the user set."""
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"id": np.arange(600, dtype=np.int64)}), path, row_group_size=100)
    _limited(tmp_path, monkeypatch, 400 * MIB)  # a default of 50 MiB each

    def mixed(weights, **kw):
        sources = [pqloader.Loader(str(path), batch_size=32, shuffle=True, seed=s + 1, **kw)
                   for s in range(len(weights))]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m = pqloader.mix(sources, weights, seed=9)
        return [str(w.message) for w in caught if w.category is RuntimeWarning], \
            [b["id"].tolist() + b["source"].tolist() for b in m]

    caught, defaults = mixed([1, 1])
    assert caught == []  # 100 MiB of 400: within half
    assert mixed([1] * 4)[0] == []  # 200 MiB: half
    caught, _ = mixed([1] * 5)
    assert len(caught) == 1, caught
    for part in ("max_inflight_bytes add up to 262144000 bytes", "each the default", f"{400 * MIB} bytes (400 MiB",
                 "max_inflight_bytes=16777216"):
        assert part in caught[0], (part, caught[0])
    caught, given = mixed([1, 1], max_inflight_bytes=101 * MIB)
    assert len(caught) == 1 and "the default (" not in caught[0] and "max_inflight_bytes=26214400" in caught[0], caught
    assert given == defaults
    assert mixed([1, 0], max_inflight_bytes=101 * MIB)[0] == []


def test_a_shuffle_window_over_the_limit_warns_naming_it(tmp_path):
    """The measured model: the process, 1.3x the budget, and the window 4 times where it
    is gathered whole (3 times else). The 20 MiB row groups of docs/design.md, 4 to a
    window, in the 400 MB cgroup that killed them at a 50 MiB budget."""
    mount = tmp_path / "fs" / "cgroup"
    _write(mount, {"memory.max": str(400 * 10**6)})
    proc = _fake_proc(tmp_path, ["0::/"], [("/", str(mount), "cgroup2", "rw")])
    window = 4 * 65536 * 80 * 4
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _env.check_shuffle_window(window, True, 4, 50 * MIB, proc)
        _env.check_shuffle_window(window // 4, True, 1, 50 * MIB, proc)  # fits
        _env.check_shuffle_window(window // 2, False, 2, 50 * MIB, proc)  # fits, not gathered
        _env.check_shuffle_window(0, True, 4, 50 * MIB, proc)  # not shuffled
        _env.check_shuffle_window(window, True, 4, 50 * MIB, str(tmp_path / "no-proc"))  # no limit
    assert len(caught) == 1 and caught[0].category is RuntimeWarning, caught
    message = str(caught[0].message)
    for part in ("shuffle_window=4", f"about {window} bytes", "estimated at 461701760 bytes",
                 f"{400 * 10**6} bytes", "lower shuffle_window", "smaller row groups"):
        assert part in message, (part, message)


def test_the_engine_estimates_the_largest_window_and_a_loader_warns_at_construction(tmp_path, monkeypatch):
    """max_window_bytes, from the footers before any read: the shuffle_window largest row
    groups' rows x the row bytes (fixed-width columns, gathered whole), else the footers'
    uncompressed sizes of the selected columns; 0 unshuffled. A loader over the limit warns
    once when it is made; its batches are those of one that fits."""
    path = tmp_path / "d.parquet"
    rows = [100_000, 100_000, 60_000, 100_000, 40_000]
    table = pa.table({f"f{i}": np.arange(sum(rows), dtype=np.float64) for i in range(3)})
    with pq.ParquetWriter(path, table.schema) as writer:
        start = 0
        for n in rows:  # row groups of unequal sizes: the largest count
            writer.write_table(table.slice(start, n))
            start += n
    texts = tmp_path / "t.parquet"
    pq.write_table(pa.table({"s": [f"row {i}" * 3 for i in range(5000)], "x": np.arange(5000.0)}), texts,
                   row_group_size=1000)
    meta = pq.read_metadata(texts)
    uncompressed = [sum(meta.row_group(g).column(c).total_uncompressed_size for c in range(2))
                    for g in range(meta.num_row_groups)]
    _limited(tmp_path, monkeypatch, 100 * MIB)  # the 16 MiB floor: a window of ~6 MB fits

    def made(source, **kw):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = pqloader.Loader(str(source), batch_size=4096, seed=2, **kw)
        return loader, [str(w.message) for w in caught if w.category is RuntimeWarning]

    loader, caught = made(path, shuffle=True, shuffle_window=4)
    assert loader._plan["max_window_bytes"] == 3 * 24 * 100_000 + 24 * 60_000
    assert loader._plan["gathers_windows"] is True
    assert len(caught) == 1 and "shuffle_window=4" in caught[0] and f"{100 * MIB} bytes" in caught[0], caught
    fits, none = made(path, shuffle=True, shuffle_window=1)
    assert none == [] and fits._plan["max_window_bytes"] == 24 * 100_000
    assert [b["f0"].tolist() for b in loader] == [b["f0"].tolist() for b in made(path, shuffle=True)[0]]
    assert made(path, shuffle=False)[0]._plan["max_window_bytes"] == 0
    strings, _ = made(texts, shuffle=True, shuffle_window=2)
    assert strings._plan["gathers_windows"] is False
    assert strings._plan["max_window_bytes"] == sum(sorted(uncompressed)[-2:])


def test_dataloader_workers_do_not_repeat_the_wrapped_loaders_memory_warnings(tmp_path, monkeypatch):
    """The wrapped loader warns when it is made (a budget over half the limit, a shuffle
    window over it); each DataLoader worker, its own process, rebuilt it and warned again,
    every epoch (and so did the length probe): W more copies of the same warning."""
    torch_dataset = pytest.importorskip("pqloader.torch")
    from types import SimpleNamespace
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({f"f{i}": np.arange(40_000, dtype=np.float64) for i in range(4)}), path,
                   row_group_size=20_000)
    _limited(tmp_path, monkeypatch, 32 * MIB)  # 4 copies of a 1.2 MiB window and 20 MiB: over it
    with warnings.catch_warnings(record=True) as made:
        warnings.simplefilter("always")
        ds = torch_dataset.IterableDataset(pqloader.Loader(str(path), batch_size=1000, shuffle=True, seed=1,
                                                           shuffle_window=2, max_inflight_bytes=20 * MIB))
    made = [str(w.message) for w in made if w.category is RuntimeWarning]
    assert len(made) == 2 and made[0].startswith("max_inflight_bytes=") and \
        made[1].startswith("shuffle_window=2"), made
    with warnings.catch_warnings(record=True) as workers:
        warnings.simplefilter("always")
        for i in range(3):
            ds._make_worker_loader(SimpleNamespace(id=i, num_workers=3))
            ds._worker_loader = None
        assert ds._workers_batches(3, 0) > 0  # (a length probe rebuilds it too)
    assert [str(w.message) for w in workers if w.category is RuntimeWarning] == []


def test_a_dataloader_counts_its_workers_shuffle_windows_and_warns_once(tmp_path, monkeypatch):
    """W DataLoader workers hold W loaders, each its own window and budget (whose own
    checks are silenced): pqloader.torch.DataLoader counts them, warning once per number
    of workers (a DataLoader made again over the dataset, its iterations: no repeat),
    naming shuffle_window and num_workers; a loader that fits alone and with one worker
    does not warn."""
    torch_dataset = pytest.importorskip("pqloader.torch")
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({f"f{i}": np.arange(80_000, dtype=np.float64) for i in range(8)}), path,
                   row_group_size=20_000)  # 1.28 MB row groups: a window of 4, 5.12 MB, 4 copies
    _limited(tmp_path, monkeypatch, 128 * MIB)  # the 16 MiB floor: 100 MB alone, 143 MB with 2 workers

    def caught(make):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            out = make()
        return out, [str(w.message) for w in got if w.category is RuntimeWarning]

    ds, made = caught(lambda: torch_dataset.IterableDataset(pqloader.Loader(
        str(path), batch_size=10_000, shuffle=True, seed=3, shuffle_window=4)))
    assert made == []
    assert caught(lambda: torch_dataset.DataLoader(ds, num_workers=1))[1] == []
    dl, two = caught(lambda: torch_dataset.DataLoader(ds, num_workers=2))
    assert len(two) == 1, two
    for part in ("shuffle_window=4", "num_workers=2", "estimated at 142580760 bytes", f"{128 * MIB} bytes",
                 "lower shuffle_window or num_workers"):
        assert part in two[0], (part, two[0])
    again, repeated = caught(lambda: (torch_dataset.DataLoader(ds, num_workers=2),
                                      sum(1 for _ in torch_dataset.DataLoader(ds, num_workers=2))))
    assert repeated == [] and again[1] == 8
