"""pqloader inside Ray Train workers on a local Ray cluster of 2 workers (Ray schedules,
pqloader loads; no Ray Data in the path).

One local Ray cluster of 2 CPUs serves the module (started once by a process that holds
it, as `ray start --head` would); each test's driver is a subprocess that connects to it by
address and runs its own trainer, data and storage. Each worker builds a Loader without
rank/world_size; what it read is compared with Loaders built here with the rank and world
size given explicitly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

import pqloader
from conftest import REPO_ROOT, run_with_timeout, subprocess_env

pytest.importorskip("ray.train")
pytest.importorskip("torch")

WORKERS = 2

HOLD_CLUSTER = textwrap.dedent(f"""
    import sys
    import ray
    ray.init(num_cpus={WORKERS}, include_dashboard=False, log_to_driver=False)
    print(ray.get_runtime_context().gcs_address, flush=True)
    sys.stdin.read()  # until the tests are done (stdin closed)
    ray.shutdown()
""")


def ray_env(ray_tmp):
    env = subprocess_env()
    env["OMP_NUM_THREADS"] = "1"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["RAY_TMPDIR"] = ray_tmp
    # Ray Train's controller polls its workers every 2 s by default; polled more often, it
    # sees a trainer's workers finish sooner
    env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.5"
    return env


@pytest.fixture(scope="module")
def cluster():
    """The address of a local Ray cluster of WORKERS CPUs, started once for the module."""
    # Ray's session files (logs, sockets) in a directory of the module's own, not /tmp/ray;
    # a short path, since its sockets' paths must fit in 107 bytes.
    with tempfile.TemporaryDirectory(prefix="ray-", ignore_cleanup_errors=True) as ray_tmp, \
            open(os.path.join(ray_tmp, "holder.log"), "w+") as log:
        holder = subprocess.Popen([sys.executable, "-c", HOLD_CLUSTER], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=log, text=True,
                                  env=ray_env(ray_tmp), cwd=ray_tmp)
        try:
            address = run_with_timeout(holder.stdout.readline, timeout=180).strip()
            if not address:
                holder.wait(timeout=60)
                log.seek(0)
                pytest.fail("the Ray cluster did not start: " + log.read()[-4000:])
            yield address, ray_tmp
        finally:
            try:
                holder.communicate(timeout=120)  # closes stdin: ray.shutdown()
            except subprocess.TimeoutExpired:
                holder.kill()
                holder.communicate()


def run(args, tmp_path, cluster, timeout=300):
    proc = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=ray_env(cluster[1]), cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc.stdout


def expected_ids(data, epoch, rank, **kw):
    loader = pqloader.Loader(str(data), rank=rank, world_size=WORKERS, columns=["id"], **kw)
    loader.set_epoch(epoch)
    return np.concatenate([b["id"] for b in loader]).tolist()


def test_torch_trainer_example_gives_each_worker_its_shard_each_epoch(tmp_path, cluster):
    data, ids = tmp_path / "data", tmp_path / "ids"
    ids.mkdir()
    out = run([REPO_ROOT / "examples" / "train_ray.py", "--data", data, "--rows", 6000,
               "--features", 8, "--epochs", 2, "--batch-size", 128, "--workers", WORKERS,
               "--ids-dir", ids, "--storage", tmp_path / "results", "--address", cluster[0]],
              tmp_path, cluster)
    assert f"ray train: {WORKERS} workers x 2 epochs finished" in out, out
    for epoch in range(2):
        got = [json.loads((ids / f"epoch{epoch}-rank{r}.json").read_text()) for r in range(WORKERS)]
        assert [(g["rank"], g["world_size"]) for g in got] == [(r, WORKERS) for r in range(WORKERS)]
        assert got[0]["batches"] == got[1]["batches"] > 0  # no worker waits on an all_reduce
        # Exactly the rows (and order) of Loaders given rank and world size explicitly:
        # disjoint shards that together are the dataset once.
        for r in range(WORKERS):
            assert got[r]["ids"] == expected_ids(data, epoch, r, batch_size=128, shuffle=True, seed=7)
        assert sorted(got[0]["ids"] + got[1]["ids"]) == list(range(6000))


def test_any_ray_train_trainer_gives_rank_and_world_from_its_context(tmp_path, cluster):
    # DataParallelTrainer initialises no torch process group: the rank and world size
    # come from ray.train.get_context().
    data = tmp_path / "data"
    data.mkdir()
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"id": np.arange(1000)}), data / "part.parquet", row_group_size=100)
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        import ray, ray.train
        from ray.train import ScalingConfig, RunConfig
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        def loop():
            import torch.distributed as dist
            import pqloader
            loader = pqloader.Loader({str(data)!r}, batch_size=64, shuffle=True, seed=3)
            ids = [int(i) for b in loader for i in b["id"]]
            rank = ray.train.get_context().get_world_rank()
            with open({str(tmp_path)!r} + f"/plain-rank{{rank}}.json", "w") as f:
                json.dump({{"rank": loader.options.rank, "world_size": loader.options.world_size,
                           "torch_group": dist.is_available() and dist.is_initialized(), "ids": ids}}, f)

        ray.init(address={cluster[0]!r}, log_to_driver=False)
        DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers={WORKERS}),
                            run_config=RunConfig(storage_path={str(tmp_path / "results")!r})).fit()
        ray.shutdown()
        print("done")
    """))
    assert "done" in run([script], tmp_path, cluster)
    got = [json.loads((tmp_path / f"plain-rank{r}.json").read_text()) for r in range(WORKERS)]
    assert [(g["rank"], g["world_size"], g["torch_group"]) for g in got] == [
        (r, WORKERS, False) for r in range(WORKERS)]
    for r in range(WORKERS):
        assert got[r]["ids"] == expected_ids(data, 0, r, batch_size=64, shuffle=True, seed=3)


def test_outside_ray_train_the_rank_comes_from_the_environment(monkeypatch):
    import ray.train  # imported, but this process is no Ray Train worker
    assert ray.train is not None
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    from pqloader import _env
    assert _env.resolve_rank_world(None, None) == (1, 3)


def test_outside_a_ray_train_v1_worker_the_rank_comes_from_the_environment(monkeypatch):
    # Ray Train v1 (RAY_TRAIN_V2_ENABLED=0, Ray before v2 was the default): outside a
    # worker, get_context() does not raise; its getters warn once and answer rank 0 of 1,
    # which must not hide RANK/WORLD_SIZE (every rank would read every row).
    import warnings

    import ray.train
    v1_context = pytest.importorskip("ray.train.context")
    monkeypatch.setattr(ray.train, "get_context", v1_context.get_context)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    from pqloader import _env
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _env.resolve_rank_world(None, None) == (1, 3)
        assert _env.resolve_rank_world(None, None) == (1, 3)  # the getters warn only once


def test_a_dataset_made_outside_a_ray_train_worker_refuses_to_iterate_in_it(monkeypatch, tmp_path):
    # Made on the driver (rank 0 of 1 found there) and passed into the workers of a
    # trainer without a torch process group (DataParallelTrainer): each worker would read
    # every row, silently; under TorchTrainer the process group check refuses it.
    import pickle

    import pyarrow as pa
    import pyarrow.parquet as pq

    import pqloader.torch
    from pqloader import _env
    pq.write_table(pa.table({"id": np.arange(100)}), tmp_path / "part.parquet", row_group_size=10)
    ds = pqloader.torch.IterableDataset(pqloader.Loader(str(tmp_path), batch_size=10))
    sent = pickle.dumps(ds)  # on the driver
    monkeypatch.setattr(_env, "_ray_train_rank_world", lambda: (1, 2))  # in a worker
    with pytest.raises(ValueError, match=r"rank 0 of 1.*Ray Train worker's context.*rank 1 of 2"):
        list(pqloader.torch.DataLoader(pickle.loads(sent), batch_size=None))
    given = pqloader.torch.IterableDataset(pqloader.Loader(str(tmp_path), batch_size=10, rank=0, world_size=1))
    assert sum(len(b["id"]) for b in pqloader.torch.DataLoader(given, batch_size=None)) == 100
