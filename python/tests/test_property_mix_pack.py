"""Mixtures and packing over random small datasets and options, checked against
plain-Python references of the documented behaviour (a compact, seeded cut of the
property search helper mixfuzz ran: 700+ mixtures and 500 packings found no bug).

Mixtures (2-4 sources: shuffled or not, filters, a Cast transform, list columns ragged
or padded, packed sources, weights with 0, stop first/last, samples_per_epoch, source
batch sizes and drop_last, world sizes 1-3): every batch equals the one built from the
draws (`_core.mix_draws`) and each source's own stream (its epoch, then rereads under
WrapSeed), grouped by source; the same bytes with other worker counts; a JSON state
taken at a random batch resumes exactly, on its own rank and on another; set_epoch;
equal batch counts per rank. Packing (seq_len 1-16, eos/pad, truncate, drop_last,
shuffle, ranks with either shard policy, batch sizes): blocks equal a reference that
packs each rank's documents once (the unpacked loader's order), cu_seqlens follows
document_ids, two epochs, other worker counts, resume at a random batch.
"""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from pqloader import _core
from pqloader import transforms as T
from conftest import wrap_seed


class Skip(Exception):
    pass


def write_source(rng, root, s, packed):
    d = os.path.join(root, f"s{s}"); os.makedirs(d)
    n = int(rng.choice([1, 3, 5, 8, 13, 30, 60]))
    ids = s * 1_000_000 + np.arange(n, dtype=np.int64)
    lens = rng.integers(0, 7 if not packed else 3 * packed, n)
    toks = [(s * 10000 + rng.integers(1, 9999, int(k))).astype(np.int32) for k in lens]
    t = pa.table({"id": ids, "x": rng.standard_normal(n),
                  "v": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(2 * n).astype(np.float32)), 2),
                  "tok": pa.array(toks, pa.list_(pa.int32()))})
    pq.write_table(t, os.path.join(d, "a.parquet"), row_group_size=int(rng.choice([1, 2, 3, 7, 100])))
    return d, n

def draw(rng, root):
    k = int(rng.integers(2, 5))
    world = int(rng.choice([1, 1, 2, 3]))
    packed = int(rng.choice([4, 8])) if rng.random() < 0.3 else 0
    layout = None if packed else str(rng.choice(["none", "ragged", "pad", "padlen"]))
    srcs = []
    for s in range(k):
        d, n = write_source(rng, root, s, packed)
        o = dict(batch_size=int(rng.choice([1, 2, 3, 5, 16])), shuffle=bool(rng.random() < 0.6),
                 seed=int(rng.integers(0, 2**32)), shuffle_window=int(rng.choice([1, 2, 4, 100])),
                 drop_last=bool(rng.random() < 0.1), world_size=world,
                 shard_policy=str(rng.choice(["drop", "pad"])))
        if packed:
            o["columns"] = ["tok", "id"]
            o["pack"] = pqloader.Pack("tok", packed, eos=(None if rng.random() < 0.5 else -1), pad=-2,
                                      truncate=bool(rng.random() < 0.2))
        else:
            o["columns"] = ["id", "x", "v"] + (["tok"] if layout != "none" else [])
            if layout == "ragged":
                o["lists"] = {"tok": "ragged"}
            elif layout == "pad":
                o["lists"] = {"tok": pqloader.Pad(value=-3)}
            elif layout == "padlen":
                o["lists"] = {"tok": pqloader.Pad(length=4, value=-3)}
            if rng.random() < 0.3:
                o["transforms"] = {"x": [T.Cast("float64")]}
            if rng.random() < 0.2:
                o["filter"] = f"id >= {s * 1_000_000 + int(rng.integers(0, max(1, n // 2)))}"
        srcs.append((d, o))
    w = [float(rng.choice([0, 0.1, 1, 2, 5])) for _ in range(k)]
    if sum(w) == 0:
        w[int(rng.integers(0, k))] = 1.0
    mo = dict(batch_size=int(rng.choice([1, 2, 3, 4, 7, 20])), seed=int(rng.integers(0, 2**32)),
              stop=str(rng.choice(["first", "last"])), drop_last=bool(rng.random() < 0.25),
              num_epochs=int(rng.integers(1, 3)))
    if rng.random() < 0.3:
        mo["samples_per_epoch"] = int(rng.integers(1, 80))
    return srcs, w, mo, world

def make(srcs, w, mo, rank, **extra):
    ls = [pqloader.Loader(d, rank=rank, **{**o, **extra}) for d, o in srcs]
    return pqloader.mix(ls, w, **mo)

def copyb(b):
    return {k: np.array(v, copy=True) for k, v in b.items()}

def rows_of_batch(b):
    n = len(b["id"]) if "id" in b else len(b["tok"])
    out = []
    for r in range(n):
        rec = {}
        for k, v in b.items():
            if k == "cu_seqlens" or k.endswith("_offsets") or k.endswith("_length"):
                continue
            if k + "_offsets" in b:
                off = b[k + "_offsets"]; rec[k] = v[off[r]:off[r + 1]].copy()
            elif k + "_length" in b:
                L = int(b[k + "_length"][r]); rec[k] = v[r][:L].copy(); rec[k + "_padded"] = v[r][L:].copy()
            else:
                rec[k] = np.array(v[r], copy=True)
        out.append(rec)
    return out

def source_rows(d, o, rank, epoch, seed_wrap):
    l = pqloader.Loader(d, rank=rank, **{**o, "seed": seed_wrap})
    l.set_epoch(epoch)
    rows = []
    for b in l:
        rows += rows_of_batch(b)
    return rows

def source_stream(d, o, rank, epoch):
    for j in range(2000):
        rows = source_rows(d, o, rank, epoch, wrap_seed(o["seed"], j))
        yield from rows

def expected_epoch(srcs, w, mo, rank, epoch):
    cum = _core.mix_cumulative([float(x) for x in w])
    world = srcs[0][1]["world_size"]
    rows = [len(source_rows(d, o, rank, epoch, o["seed"])) for d, o in srcs]
    if "samples_per_epoch" in mo:
        n = mo["samples_per_epoch"] // world
        draws = _core.mix_draws(mo["seed"], epoch, 0, n, cum) if n else []
    else:
        limit = sum(rows) * 64 + 1024
        draws = list(_core.mix_draws(mo["seed"], epoch, 0, limit, cum))
        cnt = [0] * len(srcs); n = None
        for p, s in enumerate(draws):
            if mo["stop"] == "first" and cnt[s] + 1 > rows[s]:
                n = p; break
            cnt[s] += 1
            if mo["stop"] == "last" and not any(w[i] > 0 and rows[i] > 0 for i in range(len(srcs))):
                n = 0; break
            if mo["stop"] == "last" and all(cnt[i] >= rows[i] for i in range(len(srcs)) if w[i] > 0):
                n = p + 1; break
        if n is None:
            n = limit
        if mo["stop"] == "first" and any(w[i] > 0 and rows[i] == 0 for i in range(len(srcs))):
            n = 0
        draws = draws[:n]
    B = mo["batch_size"]
    need = np.bincount(np.asarray(draws, dtype=np.int64), minlength=len(srcs)) if len(draws) else np.zeros(len(srcs))
    if n > 3000 or any(need[i] > 40 * max(rows[i], 1) for i in range(len(srcs))):
        raise Skip(f"too many wraps: n {n} rows {rows}")
    nb = n // B if mo["drop_last"] else -(-n // B)
    streams = [source_stream(d, o, rank, epoch) for d, o in srcs]
    batches = []
    for b in range(nb):
        ds = list(draws[b * B:(b + 1) * B])
        rec = []
        for i in range(len(srcs)):
            for _ in range(ds.count(i)):
                r = next(streams[i], None)
                assert r is not None, f"reference: source {i} ran out at batch {b} (rows {rows}, n {n})"
                r = dict(r); r["source"] = np.int64(i); rec.append(r)
        batches.append(rec)
    return batches

def cmp_rows(got, want, what):
    assert len(got) == len(want), f"{what}: {len(got)} rows, want {len(want)}"
    for r, (g, x) in enumerate(zip(got, want)):
        for k in x:
            if k.endswith("_padded"):
                continue
            assert k in g, f"{what} row {r}: no {k}"
            assert np.array_equal(g[k], x[k]), f"{what} row {r} col {k}: {g[k]} != {x[k]}"

def check_batch_shape(b, srcs, what):
    if "cu_seqlens" in b:
        d = b["document_ids"]; L = d.shape[1]; flat = d.reshape(-1)
        starts = [0] + [i for i in range(1, len(flat)) if i % L == 0 or flat[i] != flat[i - 1]]
        assert b["cu_seqlens"].tolist() == starts + [len(flat)], f"{what} cu_seqlens"
    if "tok_length" in b:
        pad = srcs[0][1]["lists"]["tok"]
        width = b["tok"].shape[1]
        lens = b["tok_length"]
        if getattr(pad, "length", None):
            assert width == pad.length, what
        else:
            assert width == (int(lens.max()) if len(lens) else 0), f"{what} width {width} lens {lens}"
        for r in range(len(lens)):
            assert np.all(b["tok"][r][lens[r]:] == -3), f"{what} padding"

def eq_batches(a, b, what):
    assert len(a) == len(b), f"{what}: {len(a)} batches vs {len(b)}"
    for i, (x, y) in enumerate(zip(a, b)):
        assert x.keys() == y.keys(), f"{what} batch {i} keys"
        for k in x:
            assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), f"{what} batch {i} col {k}"

def mix_case(seed, root):
    rng = np.random.default_rng(seed)
    srcs, w, mo, world = draw(rng, root)
    per_rank = []
    fulls = [[copyb(b) for b in make(srcs, w, mo, r)] for r in range(world)]
    for rank in range(world):
        full = fulls[rank]
        # reference
        want = []
        for e in range(mo["num_epochs"]):
            want += expected_epoch(srcs, w, mo, rank, e)
        assert len(full) == len(want), f"rank {rank}: {len(full)} batches, want {len(want)}"
        for i, (b, x) in enumerate(zip(full, want)):
            check_batch_shape(b, srcs, f"rank {rank} batch {i}")
            cmp_rows(rows_of_batch(b), x, f"rank {rank} batch {i}")
        m2 = make(srcs, w, mo, rank, num_workers=int(rng.integers(1, 4)), prefetch_batches=int(rng.integers(1, 4)))
        eq_batches([copyb(b) for b in m2], full, f"rank {rank} workers")
        if full:
            cut = int(rng.integers(0, len(full) + 1))
            m3 = make(srcs, w, mo, rank)
            it = iter(m3)
            for _ in range(cut):
                next(it)
            st = json.loads(json.dumps(m3.state_dict()))
            m4 = make(srcs, w, mo, rank)
            m4.load_state_dict(st)
            eq_batches([copyb(b) for b in m4], full[cut:], f"rank {rank} resume at {cut}")
            other = (rank + 1) % world
            m6 = make(srcs, w, mo, other, num_workers=2, _debug_max_delay_us=100)
            m6.load_state_dict(st)
            eq_batches([copyb(b) for b in m6], fulls[other][cut:], f"rank {rank}'s state on rank {other} at {cut}")
        # set_epoch
        m5 = make(srcs, w, {**mo, "num_epochs": 1}, rank)
        m5.set_epoch(1)
        got = [copyb(b) for b in m5]
        x = expected_epoch(srcs, w, mo, rank, 1)
        assert len(got) == len(x), f"set_epoch(1): {len(got)} vs {len(x)}"
        for i, (b, xx) in enumerate(zip(got, x)):
            cmp_rows(rows_of_batch(b), xx, f"set_epoch rank {rank} batch {i}")
        per_rank.append(len(full))
    assert len(set(per_rank)) == 1, f"batches per rank {per_rank}"



# -- packing --

def doc_order1(path, epoch, **kw):
    l = pqloader.Loader(path, columns=["id"], batch_size=1000, **kw)
    l.set_epoch(epoch)
    return [i for b in l for i in b["id"].tolist()]

def doc_order(path, epoch, **kw):
    """The rank's own documents once (shard_policy kNone), from the drop and pad orders."""
    n = pq.read_metadata(path).num_rows
    big = kw["rank"] < n % kw["world_size"]
    return doc_order1(path, epoch, shard_policy="pad" if big else "drop", **kw)

def stream_of(order, rows, L, eos, truncate):
    toks, ids, pos = [], [], []
    for d in order:
        t = list(rows[d])
        if truncate:
            t = t[:L - (1 if eos is not None else 0)]
        t = t + ([eos] if eos is not None else [])
        toks += t; ids += [d] * len(t); pos += list(range(len(t)))
    return toks, ids, pos

def pack_reference(path, rows, L, eos, pad, truncate, drop_last, B, policy, epoch, world, rank, order_kw):
    counts = []
    for r in range(world):
        o = doc_order(path, epoch, rank=r, world_size=world, **order_kw)
        n = len(stream_of(o, rows, L, eos, truncate)[0])
        counts.append(n // L + (0 if drop_last or n % L == 0 else 1))
    nb = max(counts) if policy == "pad" else min(counts)
    if drop_last:
        nb = nb // B * B
    toks, ids, pos = stream_of(doc_order(path, epoch, rank=rank, world_size=world, **order_kw), rows, L, eos, truncate)
    if drop_last:  # the rank's last block where not full is dropped (docs), then padding blocks
        toks = toks[:len(toks) // L * L]
    out = {"tok": np.full((nb, L), pad, np.int64), "position_ids": np.zeros((nb, L), np.int64),
           "document_ids": np.full((nb, L), -1, np.int64), "loss_mask": np.zeros((nb, L), bool),
           "id": np.zeros((nb, L), np.int64)}
    for b in range(nb):
        seg, prev = -1, None
        for j in range(L):
            k = b * L + j
            if k >= len(toks):
                break
            d = ids[k]
            if d != prev or j == 0:
                seg += 1; prev = d
            out["tok"][b, j] = toks[k]; out["position_ids"][b, j] = pos[k]
            out["document_ids"][b, j] = seg; out["loss_mask"][b, j] = True; out["id"][b, j] = d
    return out

def cat(batches, L):
    keys = ("tok", "position_ids", "document_ids", "loss_mask", "id")
    return {k: (np.concatenate([b[k] for b in batches]) if batches else np.zeros((0, L))) for k in keys}

def check_cu(b, what):
    d = b["document_ids"]; L = d.shape[1]; flat = d.reshape(-1)
    starts = [0] + [i for i in range(1, len(flat)) if i % L == 0 or flat[i] != flat[i - 1]]
    assert b["cu_seqlens"].dtype == np.int32
    assert b["cu_seqlens"].tolist() == starts + [len(flat)], f"{what}: cu_seqlens {b['cu_seqlens'].tolist()} want {starts + [len(flat)]}"

def pack_case(seed, root):
    rng = np.random.default_rng(seed)
    L = int(rng.choice([1, 2, 3, 4, 5, 8, 16]))
    eos = None if rng.random() < 0.4 else int(rng.integers(-5, 0))
    if eos is not None and L == 1:
        L = 2
    pad = int(rng.integers(-9, -6))
    truncate = bool(rng.random() < 0.25)
    n = int(rng.choice([1, 2, 3, 5, 9, 17, 40]))
    lens = rng.integers(0, 3 * L + 1, n)
    rows = [rng.integers(1, 1000, int(k)).astype(np.int64) for k in lens]
    path = os.path.join(root, "d.parquet")
    pq.write_table(pa.table({"tok": pa.array(rows, pa.list_(pa.int64())), "id": np.arange(n, dtype=np.int64)}),
                   path, row_group_size=int(rng.choice([1, 2, 3, 7, 100])))
    world = int(rng.choice([1, 1, 2, 3, 4]))
    policy = str(rng.choice(["drop", "pad"]))
    B = int(rng.choice([1, 2, 3, 5, 50]))
    drop_last = bool(rng.random() < 0.3)
    order_kw = dict(shuffle=bool(rng.random() < 0.6), seed=int(rng.integers(0, 2**32)),
                    shuffle_window=int(rng.choice([1, 2, 3, 100])))
    kw = dict(columns=["tok", "id"], batch_size=B, drop_last=drop_last, shard_policy=policy, world_size=world,
              pack=pqloader.Pack("tok", L, eos=eos, pad=pad, truncate=truncate), **order_kw)
    desc = f"L={L} eos={eos} pad={pad} trunc={truncate} n={n} lens={lens.tolist()} world={world} policy={policy} B={B} drop_last={drop_last} {order_kw}"
    counts = []
    for rank in range(world):
        l = pqloader.Loader(path, rank=rank, num_epochs=2, **kw)
        full = [copyb(b) for b in l]
        n0 = len(pqloader.Loader(path, rank=rank, **kw))
        got0, got1 = cat(full[:n0], L), cat(full[n0:], L)
        for e, got in ((0, got0), (1, got1)):
            want = pack_reference(path, rows, L, eos, pad, truncate, drop_last, B, policy, e, world, rank, order_kw)
            for k in want:
                assert got[k].shape == want[k].shape, f"rank {rank} epoch {e} {k}: shape {got[k].shape} want {want[k].shape}; {desc}"
                assert np.array_equal(got[k], want[k]), f"rank {rank} epoch {e} {k}: {got[k].tolist()} want {want[k].tolist()}; {desc}"
        for i, b in enumerate(full):
            check_cu(b, f"rank {rank} batch {i}; {desc}")
            assert len(b["tok"]) <= B
        # workers
        l2 = pqloader.Loader(path, rank=rank, num_epochs=2, num_workers=int(rng.integers(1, 4)), **kw)
        full2 = [copyb(b) for b in l2]
        assert len(full2) == len(full) and all(np.array_equal(x[k], y[k]) for x, y in zip(full, full2) for k in x), f"workers; {desc}"
        # resume
        cut = int(rng.integers(0, len(full) + 1))
        l3 = pqloader.Loader(path, rank=rank, num_epochs=2, **kw)
        it = iter(l3)
        for _ in range(cut):
            next(it)
        st = json.loads(json.dumps(l3.state_dict()))
        l4 = pqloader.Loader(path, rank=rank, num_epochs=2, **kw)
        l4.load_state_dict(st)
        rest = [copyb(b) for b in l4]
        assert len(rest) == len(full) - cut and all(np.array_equal(x[k], y[k]) for x, y in zip(rest, full[cut:]) for k in x), f"resume at {cut}: {len(rest)} vs {len(full) - cut}; {desc}"
        counts.append(len(full))
    assert len(set(counts)) == 1, f"batches per rank {counts}; {desc}"



@pytest.mark.parametrize("seed", [41, 43, 51, 56, 82])
def test_mixtures_equal_the_reference_of_draws_and_source_streams(seed, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mix_case(seed, str(tmp_path))


def test_packed_blocks_equal_the_reference_of_each_ranks_documents(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in range(20):
            root = tmp_path / str(seed)
            root.mkdir()
            pack_case(seed, str(root))
