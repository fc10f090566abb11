"""Train a ResNet-18 image classifier from JPEG bytes stored in Parquet.

    .venv/bin/python examples/train_image_classifier.py            # CPU: a few minutes
    .venv/bin/python examples/train_image_classifier.py --device cuda

The sample dataset (generated once into build/image-data) holds `--images` 64x64 JPEGs
of 10 classes (a colour and a stripe direction per class, plus noise) in a binary
column `image` and an int64 `label`. pqloader streams the rows, shuffled; the model is
torchvision's ResNet-18 (a same-architecture copy below is used where torchvision does
not import, e.g. a CUDA torchvision wheel beside a CPU-only torch). Each epoch prints
samples/s and the data stall (time waiting in the loader's next()).

JPEG decoding and augmentation (random resized crop, flip, normalisation, CHW) run in
pqloader's C++ workers (``transforms=``), keyed per sample, so the training process
receives ready float32 tensors.
"""

from __future__ import annotations

import argparse
import io
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from PIL import Image
from torch import nn

import pqloader
from pqloader import transforms as T

ROOT = Path(__file__).resolve().parents[1]
NUM_CLASSES = 10
SIZE = 64
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def make_dataset(path: Path, images: int, files: int = 4, seed: int = 2026) -> None:
    """Write the sample image dataset once (a marker records its size)."""
    marker = path / "_COMPLETE"
    if marker.exists() and marker.read_text() == f"{images}/{files}":
        return
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.parquet"):
        old.unlink()
    rng = np.random.default_rng(seed)
    colours = rng.integers(40, 216, (NUM_CLASSES, 3))
    yy, xx = np.mgrid[0:SIZE, 0:SIZE]
    per_file = -(-images // files)
    for f in range(files):
        n = min(per_file, images - f * per_file)
        labels = rng.integers(0, NUM_CLASSES, n)
        blobs = []
        for label in labels:
            angle = np.pi * label / NUM_CLASSES
            stripes = (np.sin((xx * np.cos(angle) + yy * np.sin(angle)) / 3.0) > 0)[..., None]
            pixels = colours[label] * (0.6 + 0.4 * stripes) + rng.normal(0, 20, (SIZE, SIZE, 3))
            out = io.BytesIO()
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(out, format="JPEG", quality=90)
            blobs.append(out.getvalue())
        table = pa.table({"image": pa.array(blobs, type=pa.binary()), "label": pa.array(labels, type=pa.int64())})
        pq.write_table(table, path / f"part-{f:03d}.parquet", row_group_size=256)
    marker.write_text(f"{images}/{files}")


def resnet18(num_classes: int) -> nn.Module:
    """torchvision's ResNet-18, or the same architecture where torchvision does not import."""
    try:
        import torchvision

        return torchvision.models.resnet18(weights=None, num_classes=num_classes)
    except Exception as e:  # noqa: BLE001 - ImportError, or a torchvision built for another torch
        print(f"torchvision unavailable ({type(e).__name__}: {str(e)[:80]}); using the built-in ResNet-18")

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(out)) + self.down(x))

    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                               nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT / "build" / "image-data")
    parser.add_argument("--images", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ...")
    args = parser.parse_args()

    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    workers = None
    if device.type == "cpu":  # split the cores: torch computes, pqloader reads
        cores = pqloader.available_cpus()
        torch.set_num_threads(max(1, cores // 2))
        workers = max(1, cores - cores // 2)
    make_dataset(args.data, args.images)
    augment = [T.DecodeImage(), T.RandomResizedCrop(SIZE, scale=(0.5, 1.0)), T.RandomHorizontalFlip(),
               T.Normalize(MEAN.flatten().tolist(), STD.flatten().tolist()), T.ToCHW()]
    loader = pqloader.Loader(args.data, columns=["image", "label"], batch_size=args.batch_size, shuffle=True,
                             seed=7, num_workers=workers, output="torch", transforms={"image": augment},
                             device=device if device.type != "cpu" else None)
    model = resnet18(NUM_CLASSES).to(device).to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    print(f"{loader!r}\n{len(loader)} batches/epoch, device {device}, torch {torch.__version__}")

    for epoch in range(args.epochs):
        before = loader.stats()
        start = time.perf_counter()
        seen = correct = 0
        loss_sum = 0.0
        for batch in loader:
            x = batch["image"].to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
            y = batch["label"]
            logits = model(x)
            loss = loss_fn(logits, y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen += len(y)
            loss_sum += loss.item() * len(y)
            correct += (logits.argmax(1) == y).sum().item()
        seconds = time.perf_counter() - start
        stall = (loader.stats()["wait_seconds"] - before["wait_seconds"]) / seconds
        print(f"epoch {epoch}: loss {loss_sum / seen:.4f}  accuracy {correct / seen:.3f}  "
              f"{seen / seconds:,.0f} samples/s  data stall {stall:.1%}")


if __name__ == "__main__":
    main()
