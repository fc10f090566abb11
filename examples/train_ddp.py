"""Data-parallel training (DDP) with pqloader: one process per GPU, or gloo on CPU.

    .venv/bin/torchrun --nproc_per_node=2 examples/train_ddp.py            # CPU, gloo
    .venv/bin/torchrun --nproc_per_node=2 examples/train_ddp.py --resume   # continue from the checkpoint

Each process builds the same Loader; rank and world size come from the initialised
process group, so each rank reads its own disjoint share of the rows (the engine reads
only that share's row groups) and every rank gets the same number of batches, so no
rank waits forever on a gradient all_reduce at the end of an epoch. At each epoch end
every rank saves its loader's state_dict() next to the model (torch.save);
``--resume`` continues exactly there. Rank 0 prints samples/s over all ranks and the
worst rank's data stall.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import pqloader

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_tabular import ROOT, make_dataset, make_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT / "build" / "tabular-data")
    parser.add_argument("--checkpoint-dir", type=Path, default=ROOT / "build" / "ddp-checkpoint")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=512, help="per rank")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_*
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if not cuda:  # the ranks share this machine's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // (2 * world)))

    if rank == 0:
        make_dataset(args.data, args.rows, args.features)
    dist.barrier()
    columns = [f"f{i:03d}" for i in range(args.features)]
    loader = pqloader.Loader(
        args.data, columns=columns + ["label"], batch_size=args.batch_size, shuffle=True, seed=7,
        num_workers=max(1, (os.cpu_count() or 1) // (2 * world)), output="torch",
        device=device if cuda else None)  # rank and world size: from the process group
    model = DistributedDataParallel(make_model(args.features).to(device),
                                    device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    ckpt_path = args.checkpoint_dir / f"rank{rank}.pt"
    if args.resume:
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=True)
        model.module.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])
    if rank == 0:
        print(f"{world} ranks, backend {dist.get_backend()}, {len(loader)} batches/epoch/rank, "
              f"rows dropped to equalise ranks: {loader.shard_info['dropped']}, starting at epoch {loader.epoch}")

    for epoch in range(loader.epoch, args.epochs):
        before = loader.stats()
        start = time.perf_counter()
        seen, loss_sum = 0, 0.0
        for batch in loader:
            x = torch.stack([batch[c] for c in columns], dim=1)
            y = batch["label"]
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # gradients all_reduced across ranks here
            optimizer.step()
            seen += len(y)
            loss_sum += loss.item() * len(y)
        seconds = time.perf_counter() - start
        stall = (loader.stats()["wait_seconds"] - before["wait_seconds"]) / seconds
        totals = torch.tensor([seen, loss_sum, seconds], dtype=torch.float64, device=device)
        worst = torch.tensor([stall, seconds], dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict()}, ckpt_path)
        if rank == 0:
            print(f"epoch {epoch}: loss {totals[1].item() / totals[0].item():.4f}  "
                  f"{totals[0].item() / worst[1].item():,.0f} samples/s (all ranks)  "
                  f"data stall {worst[0].item():.1%} (worst rank)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
