"""torch.distributed: ranks from the process group, disjoint equal shards, crash and resume.

Three CPU processes form a gloo group. Each builds a Loader *without* rank or
world_size, so they come from the initialised group. Every step does an all_reduce, so
a rank with fewer batches than the others would hang the group (the subprocess timeout
turns that into a failure). A first run checkpoints each rank's ``state_dict()`` with
``torch.save`` and crashes a few steps later; a second run restores and finishes. The
restored streams must equal what uninterrupted loaders yield.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import torch.distributed  # noqa: E402

import pqloader  # noqa: E402
from conftest import ids_of, subprocess_env, write_dataset  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="needs torch.distributed with gloo")

WORLD = 3
LAYOUT = [[101, 60], [7], [150, 33], [80, 71]]  # 502 rows: not a multiple of WORLD
N = sum(map(sum, LAYOUT))
BS = 16
EPOCHS = 2
SEED = 4242
OPTIONS = dict(batch_size=BS, shuffle=True, seed=SEED, num_epochs=1, shuffle_window=2, num_workers=2)

RANK_SCRIPT = textwrap.dedent("""
    import datetime, json, os, sys
    import torch, torch.distributed as dist
    import pqloader

    role, data, out, port, rank, world, ckpt_step, epochs = sys.argv[1:9]
    rank, world, ckpt_step, epochs = int(rank), int(world), int(ckpt_step), int(epochs)
    options = json.loads(sys.argv[9])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    loader = pqloader.Loader(data, output="torch", **options)  # rank/world_size from the group
    info = loader.shard_info
    assert (info["rank"], info["world_size"]) == (rank, world), info
    ckpt_path = os.path.join(out, f"ckpt-{rank}.pt")
    seen, step = [], 0
    if role == "resume":
        ckpt = torch.load(ckpt_path, weights_only=True)
        loader.load_state_dict(ckpt["loader"])
        seen, step = ckpt["seen"], ckpt["step"]
    for epoch in range(loader.epoch, epochs):  # the usual loop; a restored loader is mid-epoch
        for batch in loader:  # one epoch (num_epochs=1)
            total = torch.tensor([batch["id"].numel(), 1])
            dist.all_reduce(total)  # every rank must take part in every step
            seen.append(batch["id"].tolist())
            step += 1
            if role == "run" and step == ckpt_step:
                torch.save({"loader": loader.state_dict(), "seen": seen, "step": step}, ckpt_path)
            if role == "run" and step == ckpt_step + 3:
                os._exit(17)  # crash: the steps after the checkpoint are lost
    dist.barrier()
    with open(os.path.join(out, f"result-{rank}.json"), "w") as f:
        json.dump({"seen": seen, "steps": step}, f)
    dist.destroy_process_group()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(tmp_path, role: str, data: str, ckpt_step: int, options: dict) -> list[int]:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = free_port()
    env = subprocess_env()  # no RANK / WORLD_SIZE: the loader must ask the process group
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    procs = [
        subprocess.Popen([sys.executable, str(script), role, data, str(tmp_path), str(port), str(r), str(WORLD),
                          str(ckpt_step), str(EPOCHS), json.dumps(options)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in range(WORLD)
    ]
    codes, logs = [], []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=180)
            codes.append(p.returncode)
            logs.append(out)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{role}: a rank hung (all ranks killed)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return codes, logs


@pytest.mark.parametrize("shard_policy", ["drop"])
def test_gloo_ranks_are_disjoint_complete_equal_and_resume_exactly_after_a_crash(tmp_path, shard_policy):
    data = tmp_path / "data"
    write_dataset(data, LAYOUT)
    options = dict(OPTIONS, shard_policy=shard_policy)
    per_epoch = len(pqloader.Loader(str(data), rank=0, world_size=WORLD, **options))
    ckpt_step = per_epoch + 2  # mid-way through epoch 1

    codes, logs = run_ranks(tmp_path, "run", str(data), ckpt_step, options)
    assert codes == [17] * WORLD, "\n".join(logs)  # every rank crashed as planned
    codes, logs = run_ranks(tmp_path, "resume", str(data), ckpt_step, options)
    assert codes == [0] * WORLD, "\n".join(logs)
    results = [json.loads((tmp_path / f"result-{r}.json").read_text()) for r in range(WORLD)]

    # equal batch counts: every rank took the same number of steps
    assert [r["steps"] for r in results] == [EPOCHS * per_epoch] * WORLD
    # the restored run equals uninterrupted loaders of each rank, batch for batch
    for rank, result in enumerate(results):
        ref = pqloader.Loader(str(data), rank=rank, world_size=WORLD, **dict(options, num_epochs=EPOCHS))
        assert result["seen"] == [b["id"].tolist() for b in ref], f"rank {rank} did not resume exactly"
    # per epoch: ranks disjoint, together the dataset less fewer than WORLD dropped rows
    for epoch in range(EPOCHS):
        shares = [set(ids_of([{"id": ids} for ids in r["seen"][epoch * per_epoch:(epoch + 1) * per_epoch]]))
                  for r in results]
        for a in range(WORLD):
            for b in range(a + 1, WORLD):
                assert not shares[a] & shares[b], f"epoch {epoch}: ranks {a} and {b} share rows"
        union = set().union(*shares)
        assert union <= set(range(N)) and N - len(union) < WORLD
        assert sum(len(s) for s in shares) == len(union)
    assert results[0]["seen"][:per_epoch] != results[0]["seen"][per_epoch:], "epochs repeat the same order"


GROUP_OF_ONE = textwrap.dedent("""
    import datetime, sys
    import torch.distributed as dist
    import pqloader

    data, port = sys.argv[1:3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    for kwargs in (dict(world_size=2), dict(rank=1)):
        try:
            pqloader.Loader(data, batch_size=8, **kwargs)
        except ValueError as e:
            print("refused:", e)
        else:
            print("accepted:", kwargs)
    both = pqloader.Loader(data, batch_size=8, rank=1, world_size=2)  # an override: a DP group's
    print("both:", both.shard_info["rank"], both.shard_info["world_size"])
    alone = pqloader.Loader(data, batch_size=8, world_size=1)  # e.g. evaluation on one rank
    print("alone:", alone.shard_info["rank"], alone.shard_info["world_size"])
    dist.destroy_process_group()
""")


def _gloo_script(tmp_path, text: str, layout=((10, 6),)):
    """A 16-row dataset (or `layout`), `text` as a script beside it, and the environment to run it."""
    data = tmp_path / "data"
    write_dataset(data, layout)
    script = tmp_path / "script.py"
    script.write_text(text)
    env = subprocess_env()
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    return data, script, env


def test_one_of_rank_and_world_size_against_the_process_group_is_refused(tmp_path):
    # world_size=2 beside a group of 1 made this process rank 0 of 2, silently (half the
    # rows never read by anyone); a given rank must be the group's too.
    data, script, env = _gloo_script(tmp_path, GROUP_OF_ONE)
    proc = subprocess.run([sys.executable, str(script), str(data), str(free_port())], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 4, proc.stdout
    assert lines[0].startswith("refused: world_size=2") and "torch.distributed" in lines[0], lines[0]
    assert lines[1].startswith("refused: rank=1") and "torch.distributed" in lines[1], lines[1]
    assert lines[2:] == ["both: 1 2", "alone: 0 1"]


BUILT_BEFORE_THE_GROUP = textwrap.dedent("""
    import datetime, sys
    import torch.distributed as dist
    import pqloader

    data, port, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    early = pqloader.Loader(data, batch_size=8)  # no group yet, no RANK/WORLD_SIZE: 0 of 1
    explicit = pqloader.Loader(data, batch_size=8, rank=0, world_size=1)  # asked for: all rows
    mixture = pqloader.mix([pqloader.Loader(data, batch_size=8), explicit], [1, 1])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    try:
        rows = sum(len(b["id"]) for b in early)
        print("read", rows)
    except ValueError as e:
        print("refused:", e)
    try:
        next(iter(mixture))
        print("mixture read")
    except ValueError as e:
        print("mixture refused:", e)
    for name, obj in (("len", early), ("mixture len", mixture)):
        try:
            print(name, len(obj))  # rank 0 of 1's count: a schedule sized for every row
        except ValueError as e:
            print(name, "refused:", "this Loader is rank 0 of 1" in str(e), f"rank {rank} of 2" in str(e))
    print("explicit", sum(len(b["id"]) for b in explicit))
    late = pqloader.Loader(data, batch_size=8)
    print("late", late.shard_info["rank"], late.shard_info["world_size"], sum(len(b["id"]) for b in late))
    dist.barrier()
    dist.destroy_process_group()
""")


def _run_gloo_ranks(tmp_path, body: str, timeout: float, world: int = 2, layout=((10, 6),)):
    """Run `body` (see _gloo_script) as `world` ranks; return their processes and outputs."""
    data, script, env = _gloo_script(tmp_path, body, layout)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(script), str(data), str(port), str(r)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return procs, outs


def test_a_loader_built_before_the_process_group_refuses_to_iterate(tmp_path):
    # Built before init_process_group with nothing in the environment (as mp.spawn
    # leaves it), every rank was rank 0 of 1 and read every row: each row trained
    # world-size times per epoch, silently.
    procs, outs = _run_gloo_ranks(tmp_path, BUILT_BEFORE_THE_GROUP, timeout=120)
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, out
        lines = out.splitlines()
        assert lines[0].startswith("refused: this Loader is rank 0 of 1"), out
        assert f"rank {rank} of 2" in lines[0], out
        assert lines[1].startswith("mixture refused: this Loader is rank 0 of 1"), out
        assert lines[2:4] == ["len refused: True True", "mixture len refused: True True"], out
        assert lines[4:] == ["explicit 16", f"late {rank} 2 8"], out


BUILT_BEFORE_THE_GROUP_WITH_WORKERS = textwrap.dedent("""
    import datetime, sys, traceback
    import torch.distributed as dist, torch.utils.data
    import pqloader, pqloader.torch

    def main():
        data, port, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
        early = pqloader.torch.IterableDataset(pqloader.Loader(data, batch_size=8))  # 0 of 1
        explicit = pqloader.torch.IterableDataset(pqloader.Loader(data, batch_size=8, rank=0, world_size=1))
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=60))
        loaders = {"pqloader": lambda ds: pqloader.torch.DataLoader(ds, num_workers=2),
                   "fork": lambda ds: torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                                                  multiprocessing_context="fork"),
                   "spawn": lambda ds: torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                                                   multiprocessing_context="spawn")}
        for name, make in loaders.items():
            try:
                print(name, "read", sum(len(b["id"]) for b in make(early)))
            except ValueError as e:
                print(name, "refused:", "this Loader is rank 0 of 1" in str(e), f"rank {rank} of 2" in str(e))
                # The refused iterator goes now, its workers shut down in order: kept by a
                # cycle through the traceback (torch's reraise frame holds the exception),
                # a garbage collection later unlinked its queues' semaphores first, and a
                # spawned worker still starting died on them, its exit raised by torch's
                # SIGCHLD handler in the next DataLoader's loop (one run in two, alone).
                traceback.clear_frames(e.__traceback__)
        for name, obj in (("len", early), ("dl-len", loaders["pqloader"](early))):
            try:
                print(name, len(obj))
            except ValueError as e:
                print(name, "refused:", "this Loader is rank 0 of 1" in str(e), f"rank {rank} of 2" in str(e))
        print("explicit", sum(len(b["id"]) for b in loaders["pqloader"](explicit)))
        dist.barrier()
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
""")


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_dataloader_workers_of_a_loader_built_before_the_process_group_refuse(tmp_path):
    # The workers' loaders are given their rank and world size (shards of the wrapped
    # loader's 0 of 1), so they did not refuse: every rank read every row, silently.
    procs, outs = _run_gloo_ranks(tmp_path, BUILT_BEFORE_THE_GROUP_WITH_WORKERS, timeout=180)
    for p, out in zip(procs, outs):
        assert p.returncode == 0, "\n--- next rank ---\n".join(outs)
        lines = [line for line in out.splitlines()
                 if line.split(" ")[0] in ("pqloader", "fork", "spawn", "len", "dl-len", "explicit")]
        assert lines == ["pqloader refused: True True", "fork refused: True True", "spawn refused: True True",
                         "len refused: True True", "dl-len refused: True True", "explicit 16"], out


GATHER_POSITIONS_ONLY = textwrap.dedent("""
    import datetime, pickle, sys
    import torch.distributed as dist
    import pqloader, pqloader.torch
    from pqloader._state import merge_states

    data, port, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    sent = []
    gather = dist.all_gather_object

    def spy(out, obj, group=None):
        sent.append(len(pickle.dumps(obj)))
        return gather(out, obj, group=group)

    dist.all_gather_object = spy
    loader = pqloader.Loader(data, batch_size=4, shuffle=True, seed=3)
    it = iter(loader)
    for _ in range(2 + rank):  # out of step: each rank's own count is merged
        next(it)
    merged = pqloader.torch.gather_state_dict(loader)
    sent_merged = list(sent)
    everyone = [None] * 2
    gather(everyone, loader.state_dict())
    mix = pqloader.mix([pqloader.Loader(data, batch_size=4, shuffle=True, seed=3),
                        pqloader.Loader(data, batch_size=4, shuffle=True, seed=4)], [1, 1], seed=0)
    mit = iter(mix)
    next(mit)
    sent.clear()
    mixed = pqloader.torch.gather_state_dict(mix)
    sent_mixed = list(sent)
    everyone_mix = [None] * 2
    gather(everyone_mix, mix.state_dict())
    print("state", len(pickle.dumps(loader.state_dict())), "sent", max(sent_merged + sent_mixed),
          "same", merged == merge_states(everyone), mixed == merge_states(everyone_mix),
          "batches", merged["rank_batches"])
    dist.destroy_process_group()
""")


def test_gather_state_dict_sends_positions_not_whole_states(tmp_path):
    # Every rank sent its whole state (the options list every file of the dataset) to every
    # other: world x state bytes on each rank per checkpoint (with NCCL, on its GPU):
    # 10^5 files make a ~9 MB state, 1,024 ranks 9 GB each. Only the positions travel now.
    procs, outs = _run_gloo_ranks(tmp_path, GATHER_POSITIONS_ONLY, timeout=120, layout=[[3]] * 200)
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out
        line = [x for x in out.splitlines() if x.startswith("state ")][0].split()
        assert int(line[1]) > 10_000, line  # 200 files in the state's options
        assert int(line[3]) < 1_000, line  # what one rank sent in a gather
        assert line[4:] == ["same", "True", "True", "batches", "[2,", "3]"], line
