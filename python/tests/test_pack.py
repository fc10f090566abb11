"""Sequence packing (issue 16): blocks of exactly seq_len tokens from documents.

Blocks are compared with a NumPy reference that packs the documents in the order an
unpacked loader with the same options yields them (the plan is shared), for shuffled
and natural order, separators, truncation, 1/2 workers, every rank of world sizes 1-4.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader

N = 240


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    rng = np.random.default_rng(11)
    lengths = np.concatenate([[0, 45], rng.integers(1, 40, N - 2)])  # an empty and a long one
    rows = [rng.integers(1, 30000, n).astype(np.int32) for n in lengths]
    path = tmp_path_factory.mktemp("pack") / "docs.parquet"
    table = pa.table({"tokens": pa.array(rows, pa.list_(pa.int32())), "id": np.arange(N),
                      "weight": rng.random(N).astype(np.float32)})
    pq.write_table(table, path, row_group_size=37)
    return str(path), rows, table.column("weight").to_numpy()


def doc_order(path, **kw):
    """Row ids in the order the (unpacked) plan gives them to this rank."""
    loader = pqloader.Loader(path, columns=["id"], batch_size=1000, **kw)
    return [i for b in loader for i in b["id"].tolist()]


def stream_of(order, rows, L, eos, truncate):
    toks, ids, pos = [], [], []
    for d in order:
        t = rows[d]
        if truncate:
            t = t[:L - (1 if eos is not None else 0)]
        t = list(t) + ([eos] if eos is not None else [])
        toks += t
        ids += [d] * len(t)
        pos += list(range(len(t)))
    return toks, ids, pos


def blocks_of(n_tokens, L, drop_last):
    return n_tokens // L + (0 if drop_last or n_tokens % L == 0 else 1)


def reference(path, rows, weights, L, eos, truncate, drop_last, pad_policy, **kw):
    """Expected blocks for this rank: tokens, position_ids, document_ids, loss_mask, weight, id."""
    world = kw.get("world_size", 1)
    counts = []
    for r in range(world):
        o = doc_order(path, **{**kw, "rank": r})
        counts.append(blocks_of(len(stream_of(o, rows, L, eos, truncate)[0]), L, drop_last))
    nb = max(counts) if pad_policy == "pad" else min(counts)
    toks, ids, pos = stream_of(doc_order(path, **kw), rows, L, eos, truncate)
    out = {k: np.zeros((nb, L), t) for k, t in
           (("tokens", np.int32), ("position_ids", np.int64), ("document_ids", np.int64),
            ("loss_mask", bool), ("weight", np.float32), ("doc", np.int64))}
    out["tokens"][:] = -5  # the pad token of these tests
    out["document_ids"][:] = -1
    out["doc"][:] = -1
    for b in range(nb):
        seg, prev = -1, None
        for j in range(L):
            k = b * L + j
            if k >= len(toks):
                break
            d = ids[k]
            if d != prev or j == 0:
                seg += 1
                prev = d
            out["tokens"][b, j] = toks[k]
            out["position_ids"][b, j] = pos[k]
            out["document_ids"][b, j] = seg
            out["loss_mask"][b, j] = True
            out["weight"][b, j] = weights[d]
            out["doc"][b, j] = d
    return out


def packed(path, L, eos, truncate, batch_size=3, **kw):
    loader = pqloader.Loader(path, columns=["tokens", "weight"], batch_size=batch_size,
                             pack=pqloader.Pack("tokens", seq_len=L, eos=eos, truncate=truncate, pad=-5), **kw)
    got = {k: [] for k in ("tokens", "position_ids", "document_ids", "loss_mask", "weight")}
    cus = []
    for b in loader:
        for k in got:
            got[k].append(b[k])
        cus.append(b["cu_seqlens"])
    return {k: np.concatenate(v) if v else np.zeros((0, L)) for k, v in got.items()}, cus, len(loader)


def check_cu_seqlens(cus, doc_ids_batches, L):
    for cu, d in zip(cus, doc_ids_batches):
        flat = d.reshape(-1)
        starts = [0] + [i for i in range(1, len(flat)) if i % L == 0 or flat[i] != flat[i - 1]]
        assert cu.dtype == np.int32
        assert cu.tolist() == starts + [len(flat)]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("eos,truncate", [(None, False), (7, False), (7, True), (None, True)])
@pytest.mark.parametrize("workers", [1, 2])
def test_blocks_equal_a_numpy_reference(docs, shuffle, eos, truncate, workers):
    path, rows, weights = docs
    L = 32
    kw = dict(shuffle=shuffle, seed=3, shuffle_window=2, num_workers=workers)
    got, cus, num_batches = packed(path, L, eos, truncate, **kw)
    want = reference(path, rows, weights, L, eos, truncate, False, "drop", shuffle=shuffle, seed=3,
                     shuffle_window=2)
    for k in ("tokens", "position_ids", "document_ids", "loss_mask", "weight"):
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert num_batches == -(-len(want["tokens"]) // 3)
    per_batch = [got["document_ids"][i:i + 3] for i in range(0, len(got["document_ids"]), 3)]
    check_cu_seqlens(cus, per_batch, L)


def test_every_token_of_the_epoch_appears_exactly_once(docs):
    path, rows, _ = docs
    loader = pqloader.Loader(path, columns=["tokens", "id"], batch_size=4, shuffle=True, seed=8,
                             pack=pqloader.Pack("tokens", seq_len=50))
    seen = []
    for b in loader:
        m = b["loss_mask"]
        seen += list(zip(b["id"][m].tolist(), b["position_ids"][m].tolist(), b["tokens"][m].tolist()))
    want = [(d, p, int(t)) for d, r in enumerate(rows) for p, t in enumerate(r)]
    assert sorted(seen) == sorted(want)  # split documents included, none twice


def test_resume_at_every_batch_gives_the_rest_exactly(docs):
    path, _, _ = docs
    kw = dict(columns=["tokens"], batch_size=2, shuffle=True, seed=5,
              pack=pqloader.Pack("tokens", seq_len=40, eos=1))
    full = [b["tokens"].tolist() for b in pqloader.Loader(path, **kw)]
    for k in range(len(full) + 1):
        loader = pqloader.Loader(path, **kw)
        it = iter(loader)
        head = [next(it)["tokens"].tolist() for _ in range(k)]
        state = loader.state_dict()
        resumed = pqloader.Loader(path, **kw)
        resumed.load_state_dict(state)
        assert head + [b["tokens"].tolist() for b in resumed] == full, k


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("policy", ["drop", "pad"])
def test_every_rank_gets_the_same_number_of_blocks(docs, world, policy):
    path, rows, weights = docs
    L = 30
    counts, tokens = [], []
    for rank in range(world):
        kw = dict(shuffle=True, seed=2, rank=rank, world_size=world, shard_policy=policy)
        got, _, n = packed(path, L, None, False, batch_size=5, **kw)
        want = reference(path, rows, weights, L, None, False, False, policy, shuffle=True, seed=2,
                         rank=rank, world_size=world, shard_policy=policy)
        np.testing.assert_array_equal(got["tokens"], want["tokens"])
        counts.append((n, len(got["tokens"])))
        tokens.append(int(got["loss_mask"].sum()))
    assert len(set(counts)) == 1, counts
    total = sum(len(r) for r in rows)
    if policy == "pad" and world == 1:
        assert tokens[0] == total


def test_packing_is_refused_for_other_columns(docs, tmp_path):
    path, _, _ = docs
    with pytest.raises(pqloader.UnsupportedTypeError, match="'id'"):
        pqloader.Loader(path, columns=["id"], pack=pqloader.Pack("id", seq_len=8))
    with pytest.raises(pqloader.ColumnNotFoundError, match="nope"):
        pqloader.Loader(path, pack=pqloader.Pack("nope", seq_len=8))
    with pytest.raises(ValueError, match="seq_len"):
        pqloader.Pack("tokens", seq_len=0)
    with pytest.raises(TypeError, match="pack"):
        pqloader.Loader(path, pack={"column": "tokens"})
    table = pa.table({"tokens": pa.array([[1, 2]], pa.list_(pa.int32())), "label": pa.array(["a"])})
    pq.write_table(table, tmp_path / "s.parquet")
    with pytest.raises(pqloader.UnsupportedTypeError, match="'label'"):
        pqloader.Loader(str(tmp_path / "s.parquet"), pack=pqloader.Pack("tokens", seq_len=8))


def test_pack_with_lists_or_transforms_is_an_argument_error_naming_them(docs):
    # The engine refused them as bad data (InvalidDataError), naming no argument.
    from pqloader import transforms as T

    path, _, _ = docs
    for kw, named in (({"lists": {"tokens": "ragged"}}, "lists="),
                      ({"transforms": {"tokens": [T.Cast("int64")]}}, "transforms=")):
        with pytest.raises(ValueError, match=f"pack= cannot be combined with {named}") as e:
            pqloader.Loader(path, pack=pqloader.Pack("tokens", seq_len=8), **kw)
        assert not isinstance(e.value, pqloader.InvalidDataError)


@pytest.mark.parametrize("dtype,kw,message", [
    (pa.int8(), {"eos": 300}, r"Pack\(eos=300\) does not fit column 'tokens' \(int8"),
    (pa.uint16(), {"pad": -100}, r"Pack\(pad=-100\) does not fit column 'tokens' \(uint16"),
    (pa.int64(), {"eos": 2**53 + 1}, r"beyond 2\*\*53 are not exact"),
])
def test_eos_and_pad_must_be_tokens_of_the_columns_dtype(tmp_path, dtype, kw, message):
    # They were cast unchecked: eos=300 in an int8 column became 44 (a token of the data).
    pq.write_table(pa.table({"tokens": pa.array([[1, 2, 44], [3]], pa.list_(dtype))}), tmp_path / "p.parquet")
    with pytest.raises(ValueError, match=message):
        pqloader.Loader(str(tmp_path), batch_size=1, pack=pqloader.Pack("tokens", seq_len=4, **kw))
    with pytest.raises(ValueError, match="does not fit int64"):
        pqloader.Pack("tokens", seq_len=4, eos=2**70)


def test_a_null_document_is_refused_with_the_remedies_an_empty_one_with_fill_null(tmp_path):
    # A null list is no document: refused when the Loader is made, naming the row and
    # how to load it; fill_null packs it as an empty document (no tokens), and a filter
    # that drops it leaves the same batches.
    pq.write_table(pa.table({"tokens": pa.array([[1, 2], None, [3]], pa.list_(pa.int64()))}),
                   tmp_path / "p.parquet")
    pack = pqloader.Pack("tokens", seq_len=4)
    for kw in ({}, {"null_mask": True}):
        with pytest.raises(pqloader.InvalidDataError,
                           match=r"row group 0: row 1 is a null list; a null document: pass "
                                 r"fill_null=\{'tokens': 0\}"):
            pqloader.Loader(str(tmp_path), batch_size=2, pack=pack, **kw)
    filled = [b for b in pqloader.Loader(str(tmp_path), batch_size=2, pack=pack, fill_null=0)]
    kept = [b for b in pqloader.Loader(str(tmp_path), batch_size=2, pack=pack,
                                       filter="tokens is not None")]
    assert [b["tokens"].tolist() for b in filled] == [[[1, 2, 3, 0]]]
    assert filled[0]["cu_seqlens"].tolist() == [0, 2, 3, 4]
    assert len(kept) == len(filled)
    for a, b in zip(filled, kept):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_a_file_without_the_token_column_is_empty_documents_with_fill_null(tmp_path):
    # Its rows are null documents: refused without a fill, empty ones (no tokens) with.
    pq.write_table(pa.table({"tokens": pa.array([[1, 2], [3]], pa.list_(pa.int64())),
                             "w": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"w": [3]}), tmp_path / "b.parquet")
    pack = pqloader.Pack("tokens", seq_len=4)
    with pytest.raises(pqloader.InvalidDataError, match=r"b\.parquet', row group 0: the file lacks"):
        pqloader.Loader(str(tmp_path), columns=["tokens"], batch_size=2, pack=pack)
    got = [b["tokens"].tolist() for b in pqloader.Loader(str(tmp_path), columns=["tokens"], batch_size=2,
                                                         pack=pack, fill_null=0)]
    assert got == [[[1, 2, 3, 0]]]


def test_a_filter_beside_a_file_without_the_token_column_keeps_the_lengths_aligned(tmp_path):
    # A file without the column holds one empty document per row the filter keeps.
    pq.write_table(pa.table({"w": np.arange(10)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"tokens": pa.array([[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]], pa.list_(pa.int64())),
                             "w": [0, 1, 2, 3]}), tmp_path / "b.parquet")
    pack = pqloader.Pack("tokens", seq_len=5, eos=-1)
    got = [b["tokens"].tolist() for b in pqloader.Loader(str(tmp_path), columns=["tokens"], batch_size=1,
                                                         pack=pack, fill_null=0, filter="w < 3")]
    # kept: a's rows 0-2 (empty documents: eos only), b's rows 0-2
    stream = [-1, -1, -1, 1, 2, 3, -1, 4, 5, -1, 6, -1] + [0] * 3  # the last block padded
    assert got == [[stream[i:i + 5]] for i in range(0, 15, 5)]


def test_a_state_is_refused_by_a_pad_apart_past_the_6th_digit(tmp_path):
    # State fingerprints printed pad values with 6 digits: Pack(pad=1234567)'s state
    # resumed a loader padding with 1234568 (values that 6 digits hold keep their text).
    pq.write_table(pa.table({"tokens": pa.array([[1, 2, 3], [4], [5, 6]] * 4, pa.list_(pa.int64()))}),
                   tmp_path / "t.parquet")

    def loader(pad):
        return pqloader.Loader(str(tmp_path), batch_size=2, pack=pqloader.Pack("tokens", seq_len=4, pad=pad))

    state = loader(1234567).state_dict()
    with pytest.raises(ValueError, match="different options"):
        loader(1234568).load_state_dict(state)
    loader(1234567).load_state_dict(state)
    assert "pad=-100)" in json.dumps(loader(-100).state_dict())  # the text states always had


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("policy", ["pad", "drop"])
def test_ranks_pack_each_document_once_and_equalise_blocks_not_rows(tmp_path, world, policy):
    # The row policy ran first: "pad" repeated a rank's first document (each of 3 ranks
    # packed a one-document dataset whole), "drop" dropped whole documents, then the
    # blocks were equalised again. Now each rank packs its own documents once; "drop"
    # drops the larger ranks' last blocks, "pad" adds blocks of padding.
    docs = [list(range(100 * d, 100 * d + n)) for d, n in enumerate([3, 0, 5, 2, 7, 1, 4])]
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int64()))}), tmp_path / "d.parquet",
                   row_group_size=3)
    seen, blocks = [], []
    for rank in range(world):
        loader = pqloader.Loader(str(tmp_path), batch_size=2, rank=rank, world_size=world, shard_policy=policy,
                                 pack=pqloader.Pack("tokens", seq_len=4, pad=-1))
        rows = [b["tokens"] for b in loader]
        blocks.append(sum(len(r) for r in rows))
        tokens = np.concatenate(rows).reshape(-1) if rows else np.zeros(0, np.int64)
        seen += tokens[tokens >= 0].tolist()
    assert len(set(blocks)) == 1  # equal blocks per rank
    every = [t for d in docs for t in d]
    assert len(seen) == len(set(seen))  # no token twice
    if policy == "pad" or world == 2:  # (world 2: both ranks fill 3 blocks; whole documents were dropped)
        assert sorted(seen) == every  # every document, once
    else:  # world 3: ranks of 8, 9 and 5 tokens, 2 blocks each: the 9th token of rank 1 is dropped
        assert sorted(seen) == sorted(set(every) - {406})


def test_truncating_to_a_block_of_only_the_separator_is_refused(tmp_path):
    # Pack(seq_len=1, eos=..., truncate=True) kept no token of any document: every block
    # was the separator alone, silently. seq_len=2 keeps one token and the separator;
    # without truncate or eos, seq_len=1 keeps every token.
    pq.write_table(pa.table({"tokens": pa.array([[1, 2, 3], [4]], pa.list_(pa.int32()))}), tmp_path / "p.parquet")
    with pytest.raises(ValueError, match=r"seq_len=1, eos=9, truncate=True\) leaves no room"):
        pqloader.Pack("tokens", seq_len=1, eos=9, truncate=True)

    def flat(**kw):
        loader = pqloader.Loader(str(tmp_path), batch_size=8, pack=pqloader.Pack("tokens", pad=-1, **kw))
        return [t for b in loader for t in b["tokens"].reshape(-1).tolist()]

    assert flat(seq_len=2, eos=9, truncate=True) == [1, 9, 4, 9]
    assert flat(seq_len=1, eos=9) == [1, 2, 3, 9, 4, 9]
    assert flat(seq_len=1, truncate=True) == [1, 4]


def test_a_batch_beyond_the_int32_cu_seqlens_is_refused(tmp_path):
    # cu_seqlens are int32 offsets into the flattened batch: 2048 blocks of 2**20 tokens
    # (2**31 a batch) would wrap them.
    pq.write_table(pa.table({"tokens": pa.array([[1, 2, 3], [4]], pa.list_(pa.int32()))}), tmp_path / "p.parquet")
    with pytest.raises(ValueError, match=r"batch_size x seq_len = 2048 x 1048576 .* cu_seqlens"):
        pqloader.Loader(str(tmp_path), batch_size=2048, pack=pqloader.Pack("tokens", seq_len=2**20))
    pqloader.Loader(str(tmp_path), batch_size=2047, pack=pqloader.Pack("tokens", seq_len=2**20)).close()


@pytest.mark.parametrize("dtype,kw,message", [
    (pa.float16(), {"eos": 2049}, r"Pack\(eos=2049\) is not exact in column 'tokens' \(float16: it would be 2048\)"),
    (pa.float32(), {"pad": 2**24 + 1}, r"Pack\(pad=16777217\) is not exact in column 'tokens' \(float32"),
])
def test_eos_and_pad_a_float_column_would_round_are_refused(tmp_path, dtype, kw, message):
    # Only overflow was checked: eos=2049 in a float16 column became 2048 (another token).
    pq.write_table(pa.table({"tokens": pa.array([[1, 2], [3]], pa.list_(dtype))}), tmp_path / "p.parquet")
    with pytest.raises(ValueError, match=message):
        pqloader.Loader(str(tmp_path), batch_size=1, pack=pqloader.Pack("tokens", seq_len=4, **kw))
    loader = pqloader.Loader(str(tmp_path), batch_size=1, pack=pqloader.Pack("tokens", seq_len=4, eos=2048, pad=-1))
    assert next(iter(loader))["tokens"].tolist() == [[1, 2, 2048, 3]]


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_fixed_size_list_token_column_packs_every_token_once_beside_its_companions(tmp_path, shuffle):
    # (C++ coverage: the packer's fixed-size-list reads, column-major and from the row-major
    # block of shuffled gathers, no test executed.) Document i holds 3i+1..3i+3.
    n = 40
    table = pa.table({"tokens": pa.array([[3 * i + 1, 3 * i + 2, 3 * i + 3] for i in range(n)],
                                         pa.list_(pa.int32(), 3)),
                      "id": np.arange(n), "x": np.arange(n, dtype=np.float32)})
    pq.write_table(table, tmp_path / "f.parquet", row_group_size=8)
    loader = pqloader.Loader(str(tmp_path), batch_size=2, shuffle=shuffle, seed=3, num_workers=2,
                             pack=pqloader.Pack("tokens", seq_len=8))
    tokens = []
    for b in loader:
        mask = np.asarray(b["loss_mask"])
        t, i, x = (np.asarray(b[k])[mask] for k in ("tokens", "id", "x"))
        assert ((t - 1) // 3 == i).all() and (i == x).all()
        tokens += t.tolist()
    assert sorted(tokens) == list(range(1, 3 * n + 1))
    if not shuffle:
        assert tokens == list(range(1, 3 * n + 1))


def test_a_column_named_as_a_packed_output_and_a_float_pad_that_overflows_are_refused(tmp_path):
    # (C++ coverage: both refusals of Loader::MakePack no test executed.)
    pq.write_table(pa.table({"tokens": pa.array([[1, 2], [3]], pa.list_(pa.float32())),
                             "position_ids": [1, 2]}), tmp_path / "a.parquet")
    with pytest.raises(ValueError, match="column 'position_ids' has the name of one of packing's outputs"):
        pqloader.Loader(str(tmp_path / "a.parquet"), batch_size=1, pack=pqloader.Pack("tokens", seq_len=4))
    pq.write_table(pa.table({"tokens": pa.array([[1, 2], [3]], pa.list_(pa.float16()))}), tmp_path / "b.parquet")
    with pytest.raises(ValueError, match=r"Pack\(pad=.*\) overflows column 'tokens' \(float16\)"):
        pqloader.Loader(str(tmp_path / "b.parquet"), batch_size=1, pack=pqloader.Pack("tokens", seq_len=4, pad=10**6))


def test_drop_last_with_pad_policy_drops_the_partial_block_for_every_rank(tmp_path):
    # Rank 0 (documents 0, 1: 10 tokens) fills 2 blocks of 4 and 2 tokens of a third;
    # rank 1 (documents 2, 3: 16 tokens) fills 4. drop_last drops rank 0's partial block
    # and "pad" then adds blocks of padding: no block is part documents, part padding.
    # The partial block came back as rank 0's first "padding" block.
    rows = [[1] * 5, [2] * 5, [3] * 8, [4] * 8]
    pq.write_table(pa.table({"tokens": pa.array(rows, pa.list_(pa.int32()))}), tmp_path / "d.parquet")
    per_rank = []
    for rank in range(2):
        loader = pqloader.Loader(str(tmp_path), batch_size=1, rank=rank, world_size=2,
                                 shard_policy="pad", drop_last=True,
                                 pack=pqloader.Pack("tokens", seq_len=4, pad=-1))
        blocks = [b for b in loader]
        per_rank.append([(b["tokens"][0].tolist(), b["loss_mask"][0].tolist()) for b in blocks])
    assert [len(p) for p in per_rank] == [4, 4]
    assert per_rank[0] == [([1, 1, 1, 1], [True] * 4), ([1, 2, 2, 2], [True] * 4),
                           ([-1] * 4, [False] * 4), ([-1] * 4, [False] * 4)], per_rank[0]
    assert per_rank[1] == [([3] * 4, [True] * 4)] * 2 + [([4] * 4, [True] * 4)] * 2


def test_eos_or_pad_past_2_53_in_int64_tokens_says_so(tmp_path):
    pq.write_table(pa.table({"tokens": pa.array([[1, 2]], pa.list_(pa.int64()))}), tmp_path / "a.parquet")
    for kw in ({"eos": 2**63 - 1}, {"pad": 2**63 - 1}, {"pad": -2**63}, {"eos": 2**53 + 1}):
        with pytest.raises(ValueError, match=r"beyond 2\*\*53"):
            pqloader.Loader(str(tmp_path), pack=pqloader.Pack("tokens", seq_len=4, **kw))


def _token_files(root, files=2, docs=90, seed=5):
    rng = np.random.default_rng(seed)
    root.mkdir()
    rows_of = []
    for i in range(files):
        rows = [rng.integers(0, 1000, int(n)).astype(np.int32) for n in rng.integers(0, 30, docs)]
        pq.write_table(pa.table({"tokens": pa.array(rows, pa.list_(pa.int32()))}),
                       root / f"part-{i}.parquet", row_group_size=25)
        rows_of.append(rows)
    return rows_of


def _damage_pages(path):
    """Overwrite a Parquet file's column chunks, keeping its size, footer and mtime."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        footer = int.from_bytes(f.read(4), "little")
        f.seek(4)
        f.write(b"\xa5" * (st.st_size - 8 - footer - 4))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_documents_lengths_are_kept_in_cache_dir_and_a_restart_reads_no_token_page(tmp_path, capsys):
    # pack= read every document's length at every start (a pass over the whole token
    # column). With cache_dir they are kept there (lengths/): a second loader takes them,
    # and its blocks from the split cache, from files none of whose pages read any more.
    _token_files(tmp_path / "data")
    cache = str(tmp_path / "cache")
    kw = dict(columns=["tokens"], pack=pqloader.Pack("tokens", seq_len=16), batch_size=4,
              shuffle=True, seed=3, cache_dir=cache)
    first = pqloader.Loader(str(tmp_path / "data"), **kw)
    blocks = [b["tokens"].copy() for b in first]
    s = first.stats()
    assert (s["pack_lengths_stored"], s["pack_lengths_from_cache"]) == (2, 0)
    stats = pqloader.cache_stats(cache)
    assert stats["lengths"] == 2 and stats["lengths_bytes"] > 0
    from pqloader import cli
    assert cli.main(["cache", "stats", cache]) == 0
    assert "packing's row lengths (outside the size limit): 2" in capsys.readouterr().out
    for part in (tmp_path / "data").iterdir():
        _damage_pages(part)
    with pytest.raises(pqloader.InvalidDataError, match="part-0.parquet"):
        pqloader.Loader(str(tmp_path / "data"), **{**kw, "cache_dir": None})
    again = pqloader.Loader(str(tmp_path / "data"), **kw)
    s = again.stats()
    assert (s["pack_lengths_stored"], s["pack_lengths_from_cache"]) == (0, 2)
    got = [b["tokens"] for b in again]
    assert len(got) == len(blocks) and all(np.array_equal(a, b) for a, b in zip(got, blocks))
    assert again.stats()["cache_misses"] == 0
    cleared = pqloader.cache_clear(cache)
    assert cleared["foreign_count"] == 0
    assert pqloader.cache_stats(cache)["lengths"] == 0


LENGTHS_RUN = """
import json, sys, pqloader
loader = pqloader.Loader(sys.argv[1], columns=["tokens"], pack=pqloader.Pack("tokens", seq_len=16),
                         batch_size=4, rank=int(sys.argv[3]), world_size=2, cache_dir=sys.argv[2])
s = loader.stats()
print(json.dumps([s["pack_lengths_stored"], s["pack_lengths_from_cache"], len(loader)]))
"""


def test_the_ranks_of_a_node_read_the_lengths_once(tmp_path):
    # Started together: one reads every file's lengths and keeps them; the other waits for
    # it (the lengths' lock) or comes after, and takes them from cache_dir.
    import json
    import subprocess
    import sys
    from conftest import subprocess_env
    _token_files(tmp_path / "data", files=3)
    cache = str(tmp_path / "cache")
    procs = [subprocess.Popen([sys.executable, "-c", LENGTHS_RUN, str(tmp_path / "data"), cache,
                               str(rank)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=subprocess_env()) for rank in range(2)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    assert sorted((stored, taken) for stored, taken, _ in outs) == [(0, 3), (3, 0)]
    assert outs[0][2] == outs[1][2] > 0  # the ranks' blocks, equalised


LENGTHS_READ_ONLY = """
import json, sys, pqloader
loader = pqloader.Loader(sys.argv[1], columns=["tokens"], pack=pqloader.Pack("tokens", seq_len=16),
                         batch_size=4, cache_dir=sys.argv[2])
s = loader.stats()
print(json.dumps([s["pack_lengths_stored"], s["pack_lengths_from_cache"],
                  sum(len(b["tokens"]) for b in loader)]))
"""


def test_a_read_only_cache_dir_keeps_no_loader_waiting_on_the_lengths_lock(tmp_path):
    # A loader that could store no lengths (a read-only cache_dir with its lengths/) took
    # lengths/.lock all the same to read them: the ranks of a node read one after another,
    # each waiting (up to 30 minutes) for one that stored nothing. It reads at once now.
    from conftest import run_beside_a_held_lock_on_a_read_only_cache
    rows = _token_files(tmp_path / "data")
    # (another rank of the node holds the lock, reading its lengths)
    out = run_beside_a_held_lock_on_a_read_only_cache(tmp_path, "lengths/.lock", LENGTHS_READ_ONLY,
                                                       str(tmp_path / "data"))
    assert out.returncode == 0, out.stderr
    tokens = sum(len(r) for f in rows for r in f)
    assert json.loads(out.stdout) == [0, 0, -(-tokens // 16)]


def test_a_null_documents_remedy_offers_only_a_filter_that_parses(tmp_path):
    # It offered filter="my-tokens is not None", which does not parse (a name that is no
    # Python name is written in backticks), and filter="s.tokens is not None" for a
    # struct's field, which no filter names.
    tokens = pa.array([[1, 2], None, [3]], pa.list_(pa.int32()))
    pq.write_table(pa.table({"my-tokens": tokens, "s": pa.StructArray.from_arrays([tokens], ["tokens"])}),
                   tmp_path / "p.parquet")
    with pytest.raises(pqloader.InvalidDataError, match=r'or filter them out \(filter="`my-tokens` is not None"\)'):
        pqloader.Loader(str(tmp_path), columns=["my-tokens"], pack=pqloader.Pack("my-tokens", seq_len=4))
    loader = pqloader.Loader(str(tmp_path), columns=["my-tokens"], pack=pqloader.Pack("my-tokens", seq_len=4, pad=-1),
                             filter="`my-tokens` is not None")
    assert [b["my-tokens"].tolist() for b in loader] == [[[1, 2, 3, -1]]]
    with pytest.raises(pqloader.InvalidDataError, match=r"row 1 is a null list; .*fill_null=\{'s\.tokens': 0\}") as e:
        pqloader.Loader(str(tmp_path), columns=["s.tokens"], pack=pqloader.Pack("s.tokens", seq_len=4))
    assert "filter=" not in str(e.value)
