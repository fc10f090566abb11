"""Two "nodes" x 2 ranks under torchrun --nnodes=2 on loopback (c10d rendezvous).

Each node is its own torchrun agent with its own cache directory, as on two machines;
the four ranks build the same Loader without rank or world size (they come from the
process group) and take a step together (all_reduce) for every batch. In the first run,
the ranks save their merged position (gather_state_dict) after a few steps of epoch 1,
and then node 1 is killed (SIGKILL of its ranks): the job dies. A second run of both
nodes resumes from the saved position. Checked: each rank's stream, first run up to the
checkpoint then the resumed run, equals an uninterrupted Loader of that rank; per epoch
the ranks are disjoint, equal in length and together the dataset; each node's cache
directory was filled by its own ranks.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
import torch.distributed  # noqa: E402

import pqloader  # noqa: E402
from conftest import subprocess_env, write_dataset  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="needs torch.distributed with gloo")

NODES, PER_NODE = 2, 2
WORLD = NODES * PER_NODE
LAYOUT = [[64, 64], [64, 64], [64, 64], [64, 64]]  # 512 rows: a multiple of WORLD
N = sum(map(sum, LAYOUT))
BS = 16
EPOCHS = 2
OPTIONS = dict(batch_size=BS, shuffle=True, seed=99, num_workers=1, shuffle_window=2)

RANK_SCRIPT = textwrap.dedent("""
    import datetime, json, os, signal, sys
    import torch, torch.distributed as dist
    import pqloader, pqloader.torch

    phase, data, out, ckpt_step, epochs = sys.argv[1:6]
    ckpt_step, epochs = int(ckpt_step), int(epochs)
    options = json.loads(sys.argv[6])
    node = int(os.environ["GROUP_RANK"])  # torchrun: this agent's node rank
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    loader = pqloader.Loader(data, num_epochs=epochs, cache_dir=os.path.join(out, f"cache-node{node}"),
                             **options)  # rank and world size from the process group
    state_path = os.path.join(out, "loader-state.json")
    if phase == "resume":
        with open(state_path) as f:
            loader.load_state_dict(json.load(f))
    seen, step = [], 0
    for batch in loader:
        total = torch.tensor([len(batch["id"])])
        dist.all_reduce(total)  # every rank takes part in every step
        seen.append([int(i) for i in batch["id"]])
        step += 1
        if phase == "run" and step == ckpt_step:
            state = pqloader.torch.gather_state_dict(loader)  # a collective
            if rank == 0:
                with open(state_path + ".tmp", "w") as f:
                    json.dump(state, f)
                os.replace(state_path + ".tmp", state_path)
            with open(os.path.join(out, f"run-{rank}.json"), "w") as f:
                json.dump({"seen": seen, "node": node, "info": loader.shard_info,
                           "cache_inserts": loader.stats()["cache_inserts"]}, f)
            dist.barrier()
            if node == 1:
                os.kill(os.getpid(), signal.SIGKILL)  # the node dies
            total = torch.tensor([1])
            dist.all_reduce(total)  # fails: its peers are gone
            os._exit(3)
    with open(os.path.join(out, f"{phase}-{rank}.json"), "w") as f:
        json.dump({"seen": seen, "node": node, "info": loader.shard_info,
                   "cache_inserts": loader.stats()["cache_inserts"]}, f)
    dist.barrier()
    dist.destroy_process_group()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_nodes(tmp_path, phase: str, data: str, ckpt_step: int) -> tuple[list[int], list[str]]:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = free_port()
    env = subprocess_env(tmp_path)  # no RANK / WORLD_SIZE: torchrun sets them
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    agents = [
        subprocess.Popen([sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}",
                          f"--nproc_per_node={PER_NODE}", f"--node_rank={node}", "--rdzv-backend=c10d",
                          f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id=pqloader-{phase}",
                          "--max-restarts=0", "--monitor-interval=0.5", str(script), phase, data,
                          str(tmp_path), str(ckpt_step), str(EPOCHS), json.dumps(OPTIONS)],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         cwd=str(tmp_path))
        for node in range(NODES)
    ]
    codes, logs = [], []
    try:
        for a in agents:
            out, _ = a.communicate(timeout=240)
            codes.append(a.returncode)
            logs.append(out[-3000:])
    except subprocess.TimeoutExpired:
        pytest.fail(f"{phase}: a node hung (all killed)")
    finally:
        for a in agents:
            if a.poll() is None:
                a.kill()
                a.wait()
    return codes, logs


def test_two_nodes_shard_disjointly_and_resume_exactly_after_one_is_killed(tmp_path):
    data = tmp_path / "data"
    write_dataset(data, LAYOUT)
    per_epoch = len(pqloader.Loader(str(data), rank=0, world_size=WORLD, num_epochs=1, **OPTIONS))
    ckpt_step = per_epoch + 3  # mid-way through epoch 1

    codes, logs = run_nodes(tmp_path, "run", str(data), ckpt_step)
    assert all(c != 0 for c in codes), "\n".join(logs)  # the job died with its node
    first = [json.loads((tmp_path / f"run-{r}.json").read_text()) for r in range(WORLD)]
    assert sorted((f["node"], f["info"]["rank"]) for f in first) == [
        (r // PER_NODE, r) for r in range(WORLD)]  # ranks 0, 1 on node 0; 2, 3 on node 1
    codes, logs = run_nodes(tmp_path, "resume", str(data), ckpt_step)
    assert codes == [0] * NODES, "\n".join(logs)
    resumed = [json.loads((tmp_path / f"resume-{r}.json").read_text()) for r in range(WORLD)]

    streams = [first[r]["seen"] + resumed[r]["seen"] for r in range(WORLD)]
    for rank, stream in enumerate(streams):
        assert resumed[rank]["info"]["world_size"] == WORLD
        ref = pqloader.Loader(str(data), rank=rank, world_size=WORLD, num_epochs=EPOCHS, **OPTIONS)
        assert stream == [[int(i) for i in b["id"]] for b in ref], f"rank {rank} did not resume exactly"
    for epoch in range(EPOCHS):
        shares = [sum(s[epoch * per_epoch:(epoch + 1) * per_epoch], []) for s in streams]
        assert len({len(s) for s in shares}) == 1
        assert sorted(sum(shares, [])) == list(range(N)), f"epoch {epoch}: not disjoint and complete"
    # Each node's ranks filled their own node's cache directory.
    for node in range(NODES):
        assert any((tmp_path / f"cache-node{node}").rglob("*")), f"node {node} cached nothing"
        assert sum(r["cache_inserts"] for r in first + resumed if r["node"] == node) > 0
