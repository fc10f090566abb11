"""Ray Train with pqloader: Ray schedules the workers, pqloader loads (no Ray Data in the path).

    .venv/bin/python examples/train_ray.py                  # 2 workers on a local Ray cluster
    .venv/bin/python examples/train_ray.py --workers 4 --address auto   # on a running cluster

Each Ray Train worker builds the same Loader. Rank and world size need not be passed:
pqloader takes them from the process group that ``TorchTrainer`` initialises (and, for
other Ray Train trainers, from ``ray.train.get_context()``), so each worker reads its own
disjoint share of the rows and every worker gets the same number of batches. The
training function reports each epoch's loss; with ``--ids-dir`` each worker also writes
the ids of the rows it trained on (the test uses them to check the shards).

Checkpoints: save ``loader.state_dict()`` (gathered over the workers with
``pqloader.torch.gather_state_dict``) in the Ray checkpoint beside the model, and load it
back the same way as in examples/train_ddp.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_tabular import NUM_CLASSES, ROOT, make_model  # noqa: E402


def make_dataset(path: Path, rows: int, features: int, files: int = 4, seed: int = 2026) -> list[str]:
    """A labelled numeric table with a row id (written once); return the feature names."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = [f"f{i:03d}" for i in range(features)]
    marker = path / "_COMPLETE"
    if marker.exists() and marker.read_text() == f"{rows}/{features}/{files}":
        return names
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.parquet"):
        old.unlink()
    rng = np.random.default_rng(seed)
    weights = rng.standard_normal((features, NUM_CLASSES)).astype(np.float32)
    per_file = -(-rows // files)
    for i in range(files):
        ids = np.arange(i * per_file, min(rows, (i + 1) * per_file), dtype=np.int64)
        x = rng.standard_normal((len(ids), features), dtype=np.float32)
        y = np.argmax(x @ weights, axis=1).astype(np.int64)
        table = pa.table({"id": ids, **{n: x[:, j] for j, n in enumerate(names)}, "label": y})
        pq.write_table(table, path / f"part-{i:03d}.parquet", row_group_size=2048)
    marker.write_text(f"{rows}/{features}/{files}")
    return names


def train_loop(config: dict) -> None:
    """Runs in every Ray Train worker."""
    import numpy as np
    import ray.train
    import torch
    from torch import nn

    import pqloader

    torch.set_num_threads(1)
    context = ray.train.get_context()
    loader = pqloader.Loader(config["data"], batch_size=config["batch_size"], shuffle=True,
                             seed=config["seed"], columns=config["columns"] + ["label", "id"],
                             num_workers=1, output="torch")
    model = ray.train.torch.prepare_model(make_model(len(config["columns"])))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(config["epochs"]):
        loader.set_epoch(epoch)
        seen, total, steps = [], 0.0, 0
        for batch in loader:
            x = torch.stack([batch[c] for c in config["columns"]], dim=1)
            loss = loss_fn(model(x), batch["label"].long())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen.append(batch["id"].numpy())
            total, steps = total + float(loss), steps + 1
        if config.get("ids_dir"):
            out = Path(config["ids_dir"]) / f"epoch{epoch}-rank{context.get_world_rank()}.json"
            out.write_text(json.dumps({"rank": loader.options.rank, "world_size": loader.options.world_size,
                                       "batches": steps,
                                       "ids": np.concatenate(seen).tolist() if seen else []}))
        ray.train.report({"epoch": epoch, "loss": total / max(steps, 1), "batches": steps})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT / "build" / "ray-data")
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=256, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--address", default=None, help="a running Ray cluster (default: start one)")
    parser.add_argument("--ids-dir", type=Path, default=None, help="write each worker's row ids")
    parser.add_argument("--storage", type=Path, default=ROOT / "build" / "ray-results",
                        help="Ray Train's storage_path (run state, checkpoints)")
    args = parser.parse_args()

    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    columns = make_dataset(args.data, args.rows, args.features)
    if args.address is None:
        ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=args.address)
    config = {"data": str(args.data.resolve()), "columns": columns, "epochs": args.epochs,
              "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed,
              "ids_dir": str(args.ids_dir.resolve()) if args.ids_dir else None}
    trainer = TorchTrainer(train_loop, train_loop_config=config,
                           scaling_config=ScalingConfig(num_workers=args.workers, use_gpu=False,
                                                        resources_per_worker={"CPU": 1}),
                           run_config=RunConfig(storage_path=str(args.storage.resolve()),
                                                name="pqloader-train-ray"))
    result = trainer.fit()
    print(f"ray train: {args.workers} workers x {args.epochs} epochs finished"
          f"{'' if result.error is None else f' with {result.error!r}'}")
    ray.shutdown()


if __name__ == "__main__":
    main()
