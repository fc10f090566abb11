"""Train a small causal transformer on packed token blocks with pqloader.

    .venv/bin/python examples/train_lm.py                 # CPU: about a minute
    .venv/bin/python examples/train_lm.py --device cuda

The dataset (generated once into build/lm-data) is a `list<int32>` column of token
documents of log-normal lengths, drawn from a fixed random bigram model (each token has a
few likely successors), so the loss falls well below log(vocab). pqloader packs the
documents, in a shuffled order, each followed by an EOS token, into blocks of exactly
`--seq-len` tokens (`pqloader.Pack`): no padding except the end of the last block. Each
batch carries, per block:

- `tokens`        [B, L] the token ids
- `position_ids`  [B, L] each token's index in its document (restarts at every document)
- `document_ids`  [B, L] the index of the token's document in its block (-1: padding)
- `loss_mask`     [B, L] False on padding
- `cu_seqlens`    the segment boundaries over the flattened batch, for variable-length
                  attention kernels (FlashAttention's `flash_attn_varlen_func(q, k, v,
                  cu_seqlens, cu_seqlens, max_len, max_len, causal=True)`)

The model attends within each document only: a block-diagonal causal mask built from
`document_ids` (what `cu_seqlens` tells a varlen kernel), with sinusoidal positions taken
from `position_ids`, so a packed block trains exactly as its documents would one by one.
Each epoch prints the loss, tokens/s and the data stall (time spent waiting in next()).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn
from torch.nn import functional as F

import pqloader

ROOT = Path(__file__).resolve().parents[1]
EOS = 1  # token 0 is the padding of the last block, 1 ends every document


# ----------------------------------------------------------------------------- data
def make_dataset(path: Path, docs: int, vocab: int, mean_len: int, files: int = 4,
                 seed: int = 2026) -> None:
    """Write `docs` documents from a random bigram model once (a marker records the spec)."""
    spec = f"{docs}/{vocab}/{mean_len}/{files}/{seed}"
    marker = path / "_COMPLETE"
    if marker.exists() and marker.read_text() == spec:
        return
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.parquet"):
        old.unlink()
    rng = np.random.default_rng(seed)
    # Every token has 4 successors, one of them likely: about 1 nat of entropy per token.
    successors = rng.integers(2, vocab, (vocab, 4))
    weights = np.array([0.7, 0.1, 0.1, 0.1])
    lengths = np.clip(rng.lognormal(math.log(mean_len), 0.7, docs), 4, 8 * mean_len).astype(np.int64)
    tokens = np.zeros((docs, int(lengths.max())), np.int32)
    tokens[:, 0] = rng.integers(2, vocab, docs)
    for t in range(1, tokens.shape[1]):  # all documents advance one token at a time
        pick = rng.choice(4, size=docs, p=weights)
        tokens[:, t] = successors[tokens[:, t - 1], pick]
    keep = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
    offsets = np.zeros(docs + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens[keep]))
    per_file = -(-docs // files)
    for i in range(files):
        part = column.slice(i * per_file, per_file)
        if len(part) == 0:
            break
        pq.write_table(pa.table({"tokens": part}), path / f"part-{i:03d}.parquet",
                       row_group_size=2048)
    marker.write_text(spec)


# ---------------------------------------------------------------------------- model
def sinusoid(position_ids: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embeddings of arbitrary positions: [B, L] -> [B, L, dim]."""
    freq = torch.exp(torch.arange(0, dim, 2, device=position_ids.device, dtype=torch.float32)
                     * (-math.log(10_000.0) / dim))
    angle = position_ids.float()[..., None] * freq
    return torch.cat([angle.sin(), angle.cos()], dim=-1)


def document_causal_mask(document_ids: torch.Tensor) -> torch.Tensor:
    """[B, L] segment ids -> [B, 1, L, L] bool: query i sees key j iff j <= i in the same
    document. Padding (-1) sees only padding, so no row is empty (no NaN); the loss ignores it."""
    same = document_ids[:, :, None] == document_ids[:, None, :]
    L = document_ids.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=document_ids.device).tril()
    return (same & causal)[:, None]


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(B, L, 3, self.heads, D // self.heads).unbind(2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=mask)
        x = x + self.out(a.transpose(1, 2).reshape(B, L, D))
        return x + self.mlp(self.norm2(x))


class CausalLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.dim = dim
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens, position_ids, document_ids):
        x = self.embed(tokens.long()) + sinusoid(position_ids, self.dim)
        mask = document_causal_mask(document_ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.norm(x))


def lm_loss(logits, tokens, document_ids, loss_mask):
    """Next-token cross-entropy where the next token is in the same document of the block."""
    target = tokens[:, 1:].long()
    valid = loss_mask[:, 1:] & loss_mask[:, :-1] & (document_ids[:, 1:] == document_ids[:, :-1])
    per_token = F.cross_entropy(logits[:, :-1].flatten(0, 1), target.flatten(), reduction="none")
    return (per_token * valid.flatten()).sum() / valid.sum().clamp(min=1), int(valid.sum())


# ----------------------------------------------------------------------------- main
def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=ROOT / "build" / "lm-data")
    parser.add_argument("--docs", type=int, default=6000)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--mean-len", type=int, default=80, help="median document length, tokens")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per packed block")
    parser.add_argument("--batch-size", type=int, default=16, help="blocks per batch")
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--num-workers", type=int, default=None,
                        help="pqloader C++ threads (default: on CPU, the cores torch does not use)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ...")
    args = parser.parse_args()

    device = pick_device(args.device)
    if device.type == "cpu" and args.num_workers is None:
        # Split the cores between torch's compute threads and the loader's.
        cores = pqloader.available_cpus()
        torch.set_num_threads(max(1, cores // 2))
        args.num_workers = max(1, cores - cores // 2)
    make_dataset(args.data, args.docs, args.vocab, args.mean_len)
    loader = pqloader.Loader(
        args.data, columns=["tokens"], batch_size=args.batch_size, shuffle=True, seed=7,
        pack=pqloader.Pack("tokens", seq_len=args.seq_len, eos=EOS, pad=0),
        num_workers=args.num_workers, output="torch",
        device=device if device.type != "cpu" else None)
    torch.manual_seed(0)
    model = CausalLM(args.vocab, args.dim, args.layers, args.heads).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    print(f"{len(loader)} batches of {args.batch_size} x {args.seq_len} tokens per epoch, device "
          f"{device}, {sum(p.numel() for p in model.parameters()):,} parameters, log(vocab) = "
          f"{math.log(args.vocab):.2f}")

    total_tokens, total_seconds = 0, 0.0
    for epoch in range(args.epochs):
        before = loader.stats()
        start = time.perf_counter()
        tokens = targets = 0
        loss_sum = 0.0
        for batch in loader:
            logits = model(batch["tokens"], batch["position_ids"], batch["document_ids"])
            loss, n = lm_loss(logits, batch["tokens"], batch["document_ids"], batch["loss_mask"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            tokens += int(batch["loss_mask"].sum())
            targets += n
            loss_sum += loss.item() * n
        seconds = time.perf_counter() - start
        stall = (loader.stats()["wait_seconds"] - before["wait_seconds"]) / seconds
        total_tokens += tokens
        total_seconds += seconds
        print(f"epoch {epoch}: loss {loss_sum / max(targets, 1):.3f}  {tokens / seconds:,.0f} tokens/s  "
              f"data stall {stall:.1%}")
    st = loader.stats()
    print(f"overall: {total_tokens / total_seconds:,.0f} tokens/s, data stall {st['wait_fraction']:.1%} "
          f"(waited {st['wait_seconds']:.2f} s in next() over {st['wall_seconds']:.2f} s)")


if __name__ == "__main__":
    main()
