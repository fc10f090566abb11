"""Containers: the default num_workers is the CPUs the process may use (its affinity
mask, at most its cgroup's CPU quota), not the node's. Each limited run is a
subprocess, so the limits never reach the test process."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import subprocess_env
from pqloader import _core

# What the engine is handed (LoaderOptions.to_engine) for a Loader without num_workers
# (None: the engine counted std::thread::hardware_concurrency, the node's CPUs).
RUN = textwrap.dedent("""
    import json, sys, pqloader
    loader = pqloader.Loader(sys.argv[1], columns=["id"], batch_size=4)
    print(json.dumps({"engine": loader.options.to_engine()["num_workers"],
                      "public": pqloader.available_cpus(),
                      "ids": [int(i) for b in loader for i in b["id"]]}))
""")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("cpus") / "d.parquet"
    pq.write_table(pa.table({"id": np.arange(20, dtype=np.int64)}), path, row_group_size=5)
    return str(path)


def run(data, prefix=()):
    done = subprocess.run([*prefix, sys.executable, "-c", RUN, data], capture_output=True, text=True,
                          timeout=120, env=subprocess_env())
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["ids"] == list(range(20))
    assert out["public"] == out["engine"]  # (pqloader.available_cpus(): the examples split it)
    return out["engine"]


needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to restrict to 1")


@needs_two_cpus
@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset")
def test_the_default_workers_are_the_cpus_of_the_affinity_mask(data):
    """Under taskset -c <one CPU> the engine got num_workers 0 and started one worker per
    CPU of the node (std::thread::hardware_concurrency ignores the mask), as os.cpu_count()
    counted for the torch Dataset's split; torch.get_num_threads() counts the mask."""
    assert run(data) == len(os.sched_getaffinity(0))
    one = str(min(os.sched_getaffinity(0)))
    assert run(data, prefix=["taskset", "-c", one]) == 1


def cgroup_with(controller: str) -> tuple[str, bool] | None:
    """This process's cgroup directory with `controller` (v2, or v1's hierarchy of it),
    and whether it is v2."""
    mounts = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            kind, _, options = fields[fields.index("-", 6) + 1:][:3]
            if kind == "cgroup2" or (kind == "cgroup" and controller in options.split(",")):
                mounts.setdefault(kind, (fields[3], fields[4]))
    with open("/proc/self/cgroup") as f:
        for line in f:
            hierarchy, controllers, path = line.rstrip("\n").split(":", 2)
            kind = "cgroup2" if hierarchy == "0" else "cgroup" if controller in controllers.split(",") else ""
            if kind not in mounts:
                continue
            root, mount = mounts[kind]
            directory = os.path.normpath(os.path.join(mount, os.path.relpath(path, root)))
            if kind == "cgroup":
                return directory, False
            try:
                with open(os.path.join(directory, "cgroup.controllers")) as c:
                    if controller in c.read().split():
                        return directory, True
            except OSError:
                pass
    return None


@contextlib.contextmanager
def child_cgroup(controller: str, v2_settings: dict[str, str], v1_settings: dict[str, str]):
    """A child of this process's cgroup with `controller` and these settings (files to
    write), removed afterwards (once the processes put in it have exited); skips the test
    where it cannot be made."""
    found = cgroup_with(controller) if os.geteuid() == 0 else None
    if found is None:
        pytest.skip(f"needs root and a cgroup with the {controller} controller (v2, or v1's {controller})")
    parent, v2 = found
    child = os.path.join(parent, f"pqloader-test-{uuid.uuid4().hex[:8]}")
    try:
        if v2:  # a process in the parent may refuse this (EBUSY: no internal processes)
            with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                f.write(f"+{controller}")
        os.mkdir(child)
    except OSError as e:
        pytest.skip(f"cannot make a child cgroup of {parent}: {e}")
    try:
        for name, value in (v2_settings if v2 else v1_settings).items():
            with open(os.path.join(child, name), "w") as f:
                f.write(value)
        yield child
    finally:
        os.rmdir(child)


def in_cgroup(child: str) -> list[str]:
    """A command prefix that runs the command in the cgroup `child`."""
    return ["sh", "-c", f'echo $$ > "{child}/cgroup.procs" && exec "$@"', "sh"]


@pytest.fixture
def half_a_cpu():
    """A child of this process's cgroup limited to half a CPU (v2 cpu.max 50000 100000,
    v1 cpu.cfs_quota_us 50000), removed after the test."""
    with child_cgroup("cpu", {"cpu.max": "50000 100000"}, {"cpu.cfs_quota_us": "50000"}) as child:
        yield child


@needs_two_cpus
def test_the_default_workers_stay_within_the_cgroup_cpu_quota(data, half_a_cpu):
    """In a cgroup of half a CPU (a pod's `limits: cpu: 500m`) the engine started one
    worker per CPU of the node, throttled by the quota."""
    assert run(data, prefix=in_cgroup(half_a_cpu)) == 1


def _fake_proc(tmp_path, cgroup_lines, mounts):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("".join(line + "\n" for line in cgroup_lines))
    (proc / "mountinfo").write_text("".join(
        f"{30 + i} 1 0:{30 + i} {root} {point} rw - {kind} {kind} {opts}\n"
        for i, (root, point, kind, opts) in enumerate(mounts)))
    return str(proc)


def _write(path, text):
    path.mkdir(parents=True, exist_ok=True)
    for name, value in text.items():
        (path / name).write_text(value + "\n")


def test_the_cpu_quota_is_the_smallest_of_the_cgroup_and_its_ancestors_v2(tmp_path):
    """cgroup v2 (a Kubernetes pod): the pod's cgroup holds the limit, its container's
    says max; a mount's root other than / (no cgroup namespace) is taken off the path."""
    mount = tmp_path / "fs" / "cgroup"
    _write(mount / "pod", {"cpu.max": "250000 100000"})
    _write(mount / "pod" / "c1", {"cpu.max": "max 100000"})
    proc = _fake_proc(tmp_path, ["0::/kubepods/pod/c1"], [("/kubepods", str(mount), "cgroup2", "rw")])
    assert _core._cgroup_cpu_quota(proc) == 2.5
    _write(mount / "pod" / "c1", {"cpu.max": "50000 100000"})
    assert _core._cgroup_cpu_quota(proc) == 0.5


def test_the_cpu_quota_of_cgroup_v1_and_none_without_one(tmp_path):
    mount = tmp_path / "fs" / "cpu,cpuacct"
    _write(mount, {"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000"})
    _write(mount / "job", {"cpu.cfs_quota_us": "-1", "cpu.cfs_period_us": "100000"})
    # (a hierarchy without the cpu controller: its files are not the process's quota)
    _write(tmp_path / "fs" / "memory" / "job", {"cpu.cfs_quota_us": "10000", "cpu.cfs_period_us": "100000"})
    cgroups = ["12:memory:/job", "4:cpu,cpuacct:/job", "0::/"]
    mounts = [("/", str(mount), "cgroup", "rw,cpu,cpuacct"),
              ("/", str(tmp_path / "fs" / "memory"), "cgroup", "rw,memory")]
    proc = _fake_proc(tmp_path, cgroups, mounts)
    assert _core._cgroup_cpu_quota(proc) is None
    _write(mount / "job", {"cpu.cfs_quota_us": "300000", "cpu.cfs_period_us": "200000"})
    assert _core._cgroup_cpu_quota(proc) == 1.5
