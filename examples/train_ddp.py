"""Data-parallel training (DDP) with pqloader: one process per GPU, or gloo on CPU.

    .venv/bin/torchrun --nproc_per_node=2 examples/train_ddp.py            # CPU, gloo
    .venv/bin/torchrun --nproc_per_node=2 examples/train_ddp.py --resume   # continue from the checkpoint
    .venv/bin/torchrun --nproc_per_node=3 examples/train_ddp.py --resume   # ... on 3 ranks (elastic)

Each process builds the same Loader; rank and world size come from the initialised
process group, so each rank reads its own disjoint share of the rows (the engine reads
only that share's row groups) and every rank gets the same number of batches, so no
rank waits forever on a gradient all_reduce at the end of an epoch.

Every ``--checkpoint-every`` steps (and at each epoch end) the ranks merge their loader
positions (pqloader.torch.gather_state_dict) and rank 0 saves them with the model and
optimizer. ``--resume`` continues exactly after the last saved step, mid-epoch too, and
on another number of ranks: the rest of the epoch is then the samples no rank had
consumed, dealt equally to the new ranks (elastic resume; later epochs are ordinary).
``--stop-after-steps`` stops early, as a preemption would. Rank 0 prints samples/s over
all ranks and the worst rank's data stall.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import pqloader
import pqloader.torch

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
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints")
    parser.add_argument("--stop-after-steps", type=int, default=None, help="stop after this many steps")
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    # torchrun sets RANK, WORLD_SIZE, MASTER_*; device_id binds NCCL to this rank's GPU
    # (without it NCCL guesses the device from the global rank).
    dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    if not cuda:  # the ranks share this machine's cores
        torch.set_num_threads(max(1, pqloader.available_cpus() // (2 * world)))

    if rank == 0:
        make_dataset(args.data, args.rows, args.features)
    dist.barrier()
    columns = [f"f{i:03d}" for i in range(args.features)]
    loader = pqloader.Loader(
        args.data, columns=columns + ["label"], batch_size=args.batch_size, shuffle=True, seed=7,
        num_workers=max(1, pqloader.available_cpus() // (2 * world)), output="torch",
        device=device if cuda else None)  # rank and world size: from the process group
    model = DistributedDataParallel(make_model(args.features).to(device),
                                    device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    ckpt_path = args.checkpoint_dir / "checkpoint.pt"
    step = 0
    if args.resume:
        ckpt = torch.load(ckpt_path, map_location=device, weights_only=True)
        model.module.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])  # any world size: elastic if it changed
        step = ckpt["step"]
        saved = ckpt["loader"]
        if rank == 0:
            old_world, old_bs = saved["options"]["world_size"], saved["options"]["batch_size"]
            how = ("elastic: the rest of the epoch dealt to " + str(world) + " ranks"
                   if (old_world, old_bs) != (world, args.batch_size) else "exact")
            print(f"resumed from step {step}: epoch {saved['epoch']}, batch {saved['batch']} of a "
                  f"{old_world}-rank run (batch size {old_bs}); {how}; "
                  f"{len(loader) - loader.state_dict()['batch']} batches left "
                  f"in epoch {loader.epoch} per rank")
        if loader.epoch >= args.epochs:
            if rank == 0:
                print(f"nothing to do: the checkpoint is at epoch {loader.epoch} and --epochs is "
                      f"{args.epochs}; pass a larger --epochs to train on", file=sys.stderr)
            shut_down()
            sys.exit(2)
    if rank == 0:
        print(f"{world} ranks, backend {dist.get_backend()}, {len(loader)} batches/epoch/rank, "
              f"rows dropped to equalise ranks: {loader.shard_info['dropped']}, starting at epoch {loader.epoch}")

    saved_at = [step if args.resume else None]  # the step of the last checkpoint

    def save_checkpoint() -> None:
        state = pqloader.torch.gather_state_dict(loader)  # a collective: every rank calls it
        saved_at[0] = step
        if rank == 0:
            args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            tmp = ckpt_path.with_suffix(".tmp")
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "loader": state, "step": step}, tmp)
            os.replace(tmp, ckpt_path)  # a crash never leaves half a checkpoint

    for epoch in range(loader.epoch, args.epochs):
        before = loader.stats()
        start = time.perf_counter()
        seen, loss_sum = 0, 0.0
        stopped = False
        for batch in loader:
            x = torch.stack([batch[c] for c in columns], dim=1)
            y = batch["label"]
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # gradients all_reduced across ranks here
            optimizer.step()
            seen += len(y)
            loss_sum += loss.item() * len(y)
            step += 1
            if step % args.checkpoint_every == 0:
                save_checkpoint()
            if args.stop_after_steps is not None and step >= args.stop_after_steps:
                stopped = True
                break
        seconds = time.perf_counter() - start
        stall = (loader.stats()["wait_seconds"] - before["wait_seconds"]) / seconds
        totals = torch.tensor([seen, loss_sum, seconds], dtype=torch.float64, device=device)
        worst = torch.tensor([stall, seconds], dtype=torch.float64, device=device)
        dist.all_reduce(totals)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        if rank == 0:
            print(f"epoch {epoch}: loss {totals[1].item() / max(totals[0].item(), 1):.4f}  "
                  f"{totals[0].item() / worst[1].item():,.0f} samples/s (all ranks)  "
                  f"data stall {worst[0].item():.1%} (worst rank)  [{int(totals[0].item())} samples]")
        if stopped:
            if rank == 0:
                print(f"stopped after step {step} (last checkpoint: "
                      f"{'none' if saved_at[0] is None else f'step {saved_at[0]}'})")
            break
        save_checkpoint()
    del model, optimizer
    shut_down()


def shut_down() -> None:
    """Leave the process group cleanly.

    DDP's reducer holds the process group in reference cycles; if they are collected
    only while the interpreter exits, gloo's worker threads destroy their last work
    items then and torch aborts the process ("terminate called without an active
    exception"). Collect them while Python still runs, after every rank is done.
    """
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
