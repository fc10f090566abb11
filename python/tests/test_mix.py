"""pqloader.mix: several Loaders drawn by weight into one deterministic, resumable,
sharded stream."""

from __future__ import annotations

import copy
import gc
import itertools
import json
import math
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pqloader
from pqloader import _core
from conftest import wrap_seed


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Three datasets of different sizes; ids disjoint (source s holds s*10^6 + i)."""
    root = tmp_path_factory.mktemp("mix")
    sizes = {"web": 3000, "code": 1200, "books": 600}
    rng = np.random.default_rng(2)
    for s, (name, n) in enumerate(sizes.items()):
        d = root / name
        d.mkdir()
        ids = s * 1_000_000 + np.arange(n, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "x": rng.random((n,)).astype(np.float32),
                                 "v": pa.array(list(rng.random((n, 3)).astype(np.float32)),
                                               type=pa.list_(pa.float32(), 3))}),
                       d / "part.parquet", row_group_size=200)
    return root, sizes


def loaders(root, names=("web", "code", "books"), **kwargs):
    kwargs.setdefault("batch_size", 64)
    kwargs.setdefault("shuffle", True)
    return {n: pqloader.Loader(str(root / n), seed=10 + i, **kwargs) for i, n in enumerate(names)}


def run(m):
    return [{k: np.array(v, copy=True) for k, v in b.items()} for b in m]


def resume_after(make, cut, full):
    """A mixture from make() stopped after `cut` batches, its state loaded into another
    one; assert the rest equals full[cut:]. Returns the resumed mixture."""
    m = make()
    it = iter(m)
    for _ in range(cut):
        next(it)
    resumed = make()
    resumed.load_state_dict(m.state_dict())
    tail = run(resumed)
    assert len(tail) == len(full) - cut, cut
    for x, y in zip(tail, full[cut:]):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=f"cut {cut}, column {k}")
    return resumed


def test_a_single_loader_or_a_number_of_weights_is_a_type_error_naming_the_argument(sources):
    # mix(loader, [1]) listed the Loader, i.e. iterated it: a whole epoch read (forever
    # with num_epochs=None), its position moved, then "mix source '0' ... got dict";
    # weights=1 was a bare "'int' object is not iterable".
    from conftest import run_with_timeout

    root, _ = sources
    web = pqloader.Loader(str(root / "web"), batch_size=64, num_epochs=None)
    with pytest.raises(TypeError, match=r"^mix sources must be a list or dict of Loaders, got a "
                                        r"pqloader\.Loader: wrap it in a list"):
        run_with_timeout(lambda: pqloader.mix(web, [1]), timeout=60)
    assert (web.state_dict()["epoch"], web.state_dict()["batch"]) == (0, 0)
    assert web.stats()["batches"] == 0
    mixture = pqloader.mix([web], [1])
    with pytest.raises(TypeError, match=r"^mix sources .*got a pqloader\.Mixture"):
        run_with_timeout(lambda: pqloader.mix(mixture, [1]), timeout=60)
    assert mixture.stats()["batches"] == 0
    with pytest.raises(TypeError, match=r"^mix weights must be a list or a dict by name, got int 1"):
        pqloader.mix([web], 1)
    with pytest.raises(TypeError, match=r"^mix sources must be a list or a dict by name, got NoneType"):
        pqloader.mix(None, [1])


def test_draws_follow_the_weights_within_binomial_bounds():
    weights = [0.5, 0.3, 0.2]
    cum = _core.mix_cumulative(weights)
    n = 100_000
    draws = _core.mix_draws(3, 0, 0, n, cum)
    counts = np.bincount(draws, minlength=3)
    for c, p in zip(counts, weights):
        assert abs(c - n * p) < 4.5 * math.sqrt(n * p * (1 - p))
    # A draw is a function of (seed, epoch, position): any slice equals the whole run's.
    np.testing.assert_array_equal(_core.mix_draws(3, 0, 500, 100, cum), draws[500:600])
    for wanted in ([0, 0, 1], [0, 1, 1], [1, 0, 0]):
        first = next(i for i, s in enumerate(draws[:1000]) if wanted[s])
        assert tuple(_core.mix_first_draw(3, 0, 1000, cum, wanted)) == (first, draws[first])
    assert tuple(_core.mix_first_draw(3, 0, 1000, cum, [0, 0, 0])) == (1000, -1)


def test_every_row_of_the_first_exhausted_source_once_and_others_unrepeated(sources):
    root, sizes = sources
    m = pqloader.mix(loaders(root), {"web": 0.5, "code": 0.3, "books": 0.2}, seed=4)
    expected_batches = len(m)
    batches = run(m)
    assert len(batches) == expected_batches
    ids = np.concatenate([b["id"] for b in batches])
    src = np.concatenate([b["source"] for b in batches])
    assert len(ids) == m.epoch_samples(0)
    np.testing.assert_array_equal(src, ids // 1_000_000)  # the source column is right
    assert len(np.unique(ids)) == len(ids)  # nothing repeated within an epoch ("first")
    counts = np.bincount(src, minlength=3)
    exhausted = [i for i, n in enumerate(sizes.values()) if counts[i] == n]
    assert exhausted, counts  # the epoch ended when one source ran out
    # Every column came from the same row as its id.
    for b in batches:
        for name_index, name in enumerate(sizes):
            sel = b["source"] == name_index
            assert b["v"][sel].shape[1:] == (3,)


def test_same_batches_for_any_worker_count_and_across_runs(sources):
    root, _ = sources
    w = [2, 1, 1]
    a = run(pqloader.mix(list(loaders(root, num_workers=1).values()), w, seed=7, batch_size=50))
    b = run(pqloader.mix(list(loaders(root, num_workers=3, _debug_max_delay_us=200).values()), w,
                         seed=7, batch_size=50))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    c = run(pqloader.mix(list(loaders(root).values()), w, seed=8, batch_size=50))
    assert any(not np.array_equal(x["source"], y["source"]) for x, y in zip(a, c))


def test_resume_mid_epoch_equals_the_uninterrupted_run(sources):
    root, _ = sources
    kw = dict(seed=5, batch_size=40, stop="last", num_epochs=2)
    full = run(pqloader.mix(loaders(root), [1, 1, 1], **kw))
    for cut in (3, 61, len(full) // 2 + 1):
        resumed = resume_after(lambda: pqloader.mix(loaders(root), [1, 1, 1], **kw), cut, full)
    other = pqloader.mix(loaders(root), [1, 2, 1], **kw)
    with pytest.raises(pqloader.InvalidDataError, match="weights"):
        other.load_state_dict(resumed.state_dict())


def test_batches_written_in_place_equal_copied_ones_across_a_resume(sources):
    """Shuffled sources write an epoch read from its start in place (stop="first": no
    source runs out), the next one too when started early; a resumed epoch is copied
    from the sources' batches: the same bytes, rows grouped by source inside each
    batch."""
    root, _ = sources
    kw = dict(seed=7, batch_size=48, num_epochs=2)
    m = pqloader.mix(loaders(root), [0.5, 0.3, 0.2], **kw)
    full = run(m)
    assert m.stats()["epochs_in_place"] == 2
    # Epoch 1 was started early by epoch 0's stream, already writing in place, and kept.
    assert [s["epochs_started_ahead"] for s in m.stats()["sources"].values()] == [1, 1, 1]
    for b in full:
        assert (np.diff(b["source"]) >= 0).all()  # grouped by source
        assert (b["id"] // 1_000_000 == b["source"]).all()
    resumed = resume_after(lambda: pqloader.mix(loaders(root), [0.5, 0.3, 0.2], **kw),
                           len(full) // 4 + 1, full)  # inside epoch 0
    assert resumed.stats()["epochs_in_place"] == 1  # the rest of epoch 0 copied, epoch 1 not
    # A source iterated by itself after a mixture that ended at an epoch's end (its next
    # run started early, writing in place, is left for the mixture's next epoch) gives
    # its own batches.
    ls = loaders(root)
    m = pqloader.mix(ls, [0.5, 0.3, 0.2], seed=7, batch_size=48, num_epochs=None)
    it = iter(m)
    for _ in range(len(m)):
        next(it)
    ls["web"].set_epoch(1)
    own = [b["id"] for b in ls["web"]]
    assert sum(len(i) for i in own) == 3000 and sorted(np.concatenate(own)) == list(range(3000))


def test_an_older_iterator_finalised_later_leaves_the_newer_one_alone(sources):
    """An abandoned iterator is finalised whenever Python collects it; its stream was
    stopped when the newer iteration began, so its `finally` does not stop the sources
    under the newer stream (it did: the newer iterator's batches came out altered)."""
    root, _ = sources
    kw = dict(seed=5, batch_size=40, num_epochs=2)
    for shuffle in (True, False):
        full = run(pqloader.mix(loaders(root, shuffle=shuffle), [0.5, 0.3, 0.2], **kw))
        m = pqloader.mix(loaders(root, shuffle=shuffle), [0.5, 0.3, 0.2], **kw)
        old = iter(m)
        got = run(b for _, b in zip(range(5), old))
        new = iter(m)
        got += run(b for _, b in zip(range(1), new))
        del old
        gc.collect()
        got += run(new)
        assert len(got) == len(full)
        for x, y in zip(got, full):
            for k in x:
                np.testing.assert_array_equal(x[k], y[k])


@pytest.mark.parametrize("op", ["close", "load_state_dict", "iterate"])
@pytest.mark.parametrize("resumed", [False, True])  # written in place / copied
def test_a_source_used_by_itself_mid_epoch_stops_the_mixture_with_an_error(sources, op, resumed):
    """A source started or stopped by another caller while a mixture reads it: the
    mixture's iterator raises when it next reads from it (it used to take the stopped source's end for the end of
    its epoch and read it again: rows repeated, no error), the source's own batches are
    its own, and iterating the mixture again goes on exactly."""
    root, _ = sources
    kw = dict(seed=5, batch_size=40, num_epochs=1)
    full = run(pqloader.mix(loaders(root), [0.5, 0.3, 0.2], **kw))
    ls = loaders(root)
    m = pqloader.mix(ls, [0.5, 0.3, 0.2], **kw)
    start = 0
    if resumed:
        ref = pqloader.mix(loaders(root), [0.5, 0.3, 0.2], **kw)
        it0 = iter(ref)
        for _ in range(3):
            next(it0)
        m.load_state_dict(ref.state_dict())
        start = 3
    it = iter(m)
    got = run(b for _, b in zip(range(5), it))
    web = ls["web"]  # (source 0: far from its last rows)
    if op == "close":
        web.close()
    elif op == "load_state_dict":
        web.load_state_dict(web.state_dict())
    else:
        own = run(web)  # a whole epoch of its own
        alone = run(pqloader.Loader(str(root / "web"), seed=10, batch_size=64, shuffle=True))
        assert len(own) == len(alone)
        for x, y in zip(own, alone):
            np.testing.assert_array_equal(x["id"], y["id"])
    with pytest.raises(RuntimeError, match="source 'web' was started or stopped by another caller"):
        for b in it:  # the rows it holds already (a batch or two) are handed out first
            got += run([b])
    got += run(m)  # a new iteration from the mixture's position
    assert len(got) == len(full) - start
    for x, y in zip(got, full[start:]):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def test_an_old_mixture_iterator_collected_leaves_the_sources_new_users_alone(sources):
    """A mixture iterator abandoned mid-epoch and collected later does not stop (or
    reseed) what its sources run by then: a source's own epoch, another mixture's."""
    root, _ = sources
    kw = dict(seed=5, batch_size=40)
    ls = loaders(root)
    m = pqloader.mix(ls, [0.5, 0.3, 0.2], **kw)
    old = iter(m)
    next(old)
    ls["books"].set_epoch(1)
    own = iter(ls["books"])
    got = run(b for _, b in zip(range(2), own))
    del old
    gc.collect()
    got += run(own)
    alone = pqloader.Loader(str(root / "books"), seed=12, batch_size=64, shuffle=True)
    alone.set_epoch(1)
    want = run(alone)
    assert len(got) == len(want)
    for x, y in zip(got, want):
        np.testing.assert_array_equal(x["id"], y["id"])
    # Two mixtures over the same loaders, the first one's iterator collected mid-epoch.
    ls = loaders(root)
    full = run(pqloader.mix(loaders(root), [0.2, 0.3, 0.5], **kw))
    m1 = pqloader.mix(ls, [0.5, 0.3, 0.2], **kw)
    old = iter(m1)
    next(old)
    m2 = pqloader.mix(ls, [0.2, 0.3, 0.5], **kw)
    it2 = iter(m2)
    got = run(b for _, b in zip(range(2), it2))
    with pytest.raises(RuntimeError, match="another caller"):
        for _ in old:  # its sources are m2's now (the rows it held come first)
            pass
    del old
    gc.collect()
    got += run(it2)
    assert len(got) == len(full)
    for x, y in zip(got, full):
        np.testing.assert_array_equal(x["id"], y["id"])


def test_a_source_wrapped_by_a_mixture_reads_its_own_epochs_under_its_own_seed(sources):
    """stop="last" reads a source again under another seed when it runs out; iterated by
    itself afterwards (the mixture's iterator still alive), it uses its own seed."""
    root, _ = sources
    ls = loaders(root)
    m = pqloader.mix(ls, [0.2, 0.3, 0.5], seed=5, batch_size=40, stop="last")
    it = iter(m)
    for _ in range(len(m) - 1):  # "books" (600 rows, weight 0.5) wrapped several times
        next(it)
    got = run(ls["books"])
    want = run(pqloader.Loader(str(root / "books"), seed=12, batch_size=64, shuffle=True))
    assert len(got) == len(want)
    for x, y in zip(got, want):
        np.testing.assert_array_equal(x["id"], y["id"])


def test_moving_the_mixture_inside_its_own_loop_wins_over_the_loops_end(sources):
    root, _ = sources
    for move in ("set_epoch", "load_state_dict"):
        m = pqloader.mix(loaders(root), [0.5, 0.3, 0.2], seed=5, batch_size=40)
        n = len(m)
        for i, _ in enumerate(m):
            if i == n - 1:  # the last batch: the loop then ends by itself
                if move == "set_epoch":
                    m.set_epoch(5)
                else:
                    other = pqloader.mix(loaders(root), [0.5, 0.3, 0.2], seed=5, batch_size=40)
                    other.set_epoch(5)
                    m.load_state_dict(other.state_dict())
        assert (m.epoch, m.state_dict()["batch"]) == (5, 0)


@pytest.mark.parametrize("k", [0, 3, "end"])
def test_set_epoch_of_the_loaded_epoch_continues_a_mixture_state(sources, k):
    """The resume loop ``for e in range(start, n): m.set_epoch(e)`` after load_state_dict
    runs the rest of the loaded epoch (it ran the epoch again, handing out the state's
    batches twice); another epoch drops a position inside its epoch with a warning."""
    root, _ = sources
    make = lambda: pqloader.mix(loaders(root), [0.5, 0.3, 0.2], seed=5, batch_size=40)
    m = make()
    n = len(m)
    k = n if k == "end" else k
    full, state = [], m.state_dict() if k == 0 else None
    for e in range(2):
        m.set_epoch(e)
        for batch in m:
            full.append(batch["id"])
            if len(full) == k:
                state = json.loads(json.dumps(m.state_dict()))
    fresh = make()
    fresh.load_state_dict(state)
    rest = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for e in range(state["epoch"], 2):
            fresh.set_epoch(e)
            rest += [b["id"] for b in fresh]
    assert len(full[:k] + rest) == len(full)
    for x, y in zip(full[:k] + rest, full):
        np.testing.assert_array_equal(x, y)
    if 0 < k < n:
        fresh.load_state_dict(state)
        with pytest.warns(UserWarning, match=r"set_epoch\(1\) drops the position load_state_dict "
                          r"restored in the middle of epoch 0"):
            fresh.set_epoch(1)
        assert [b["id"].tolist() for b in fresh] == [x.tolist() for x in full[n:]]


def test_a_forked_child_neither_crashes_nor_hangs_on_an_inherited_mixture(sources):
    """In the child the sources' engines are abandoned: the inherited iterator raises,
    collecting it touches nothing, and a new iteration reads on fresh engines."""
    root, _ = sources
    code = textwrap.dedent(f"""
        import gc, os, sys
        import numpy as np
        import pqloader
        def make():
            ls = [pqloader.Loader({str(root)!r} + "/" + n, seed=10 + i, batch_size=64, shuffle=True)
                  for i, n in enumerate(("web", "code", "books"))]
            return pqloader.mix(ls, [0.5, 0.3, 0.2], seed=5, batch_size=40, num_epochs=2)
        full = [b["id"].copy() for b in make()]
        m = make()
        it = iter(m)
        head = [next(it)["id"].copy() for _ in range(3)]
        pid = os.fork()
        if pid == 0:
            try:
                next(it)
                os._exit(3)
            except RuntimeError as e:
                if "fork" not in str(e):
                    os._exit(4)
            del it
            gc.collect()
            rest = [b["id"].copy() for b in m]
            ok = len(head) + len(rest) == len(full) and all(
                np.array_equal(x, y) for x, y in zip(head + rest, full))
            os._exit(0 if ok else 5)
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
        rest = [b["id"].copy() for b in it]
        print("parent same", all(np.array_equal(x, y) for x, y in zip(head + rest, full)) and
              len(head) + len(rest) == len(full))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "child exit 0\nparent same True\n" in proc.stdout, proc.stdout + proc.stderr


def _threads():
    return len(os.listdir("/proc/self/task"))


def test_close_joins_the_sources_and_stops_iterators_in_any_thread(sources):
    """close() (or leaving `with`) stops the stream and joins every source's workers,
    the next epoch's read-ahead included; an iterator running in another thread stops
    with an error; iterating again goes on from the position, as a new loop would."""
    root, _ = sources
    kw = dict(seed=4, batch_size=40, num_epochs=2)
    full = run(pqloader.mix(loaders(root), [0.5, 0.3, 0.2], **kw))
    with pqloader.mix(loaders(root), [0.5, 0.3, 0.2], **kw) as m:
        it = iter(m)
        head = run(b for _, b in zip(range(len(m) - 2), it))  # epoch 1 started ahead
        running = _threads()
    assert running - _threads() >= 3  # each source's workers joined
    with pytest.raises(RuntimeError, match="close"):
        next(it)
    rest = run(m)  # the rest of epoch 0, then epoch 1 (num_epochs from here)
    assert len(head) + len(rest) == len(full)
    for x, y in zip(head + rest, full):
        np.testing.assert_array_equal(x["id"], y["id"])
    # From another thread: the consumer's next() raises once close() returned.
    m = pqloader.mix(loaders(root), [0.5, 0.3, 0.2], num_epochs=None, seed=4, batch_size=40)
    seen, errors, started = [], [], threading.Event()

    def consume():
        try:
            for b in m:
                seen.append(len(b["id"]))
                started.set()
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=consume)
    t.start()
    assert started.wait(60)
    m.close()
    t.join(60)
    assert not t.is_alive() and len(errors) == 1 and "stale" in errors[0] and seen


def test_a_state_after_close_with_the_old_iterator_kept_resumes_as_the_mixture_runs(sources):
    """close() ends the running iteration: a state taken after it records no end (it kept
    the stale iteration's, so that a state taken at an epoch's end resumed one epoch
    where the mixture itself ran num_epochs)."""
    root, _ = sources
    kw = dict(seed=4, batch_size=40, samples_per_epoch=400, num_epochs=2)

    def closed_at_epoch_end():
        m = pqloader.mix(loaders(root), [0.5, 0.3, 0.2], **kw)
        it = iter(m)
        for _ in range(len(m)):  # the whole of epoch 0; `it` is kept, not finished
            next(it)
        m.close()
        return m, it

    m, _kept = closed_at_epoch_end()
    expected = run(m)  # epochs 1 and 2
    m, _kept = closed_at_epoch_end()
    state = json.loads(json.dumps(m.state_dict()))
    assert state["end"] is None
    fresh = pqloader.mix(loaders(root), [0.5, 0.3, 0.2], **kw)
    fresh.load_state_dict(state)
    rest = run(fresh)
    assert len(rest) == len(expected) == 20
    for x, y in zip(rest, expected):
        np.testing.assert_array_equal(x["id"], y["id"])


@pytest.mark.parametrize("how", ["set_epoch", "load_state_dict"])
def test_set_epoch_and_load_state_dict_stop_the_running_stream(sources, how):
    """As Loader.set_epoch: a running iterator stops, and so does its stream (the
    sources went on reading for it until a new iteration began)."""
    root, _ = sources
    m = pqloader.mix(loaders(root, num_workers=1, _debug_max_delay_us=50_000), [0.5, 0.3, 0.2],
                     seed=4, batch_size=40)
    state = m.state_dict()
    it = iter(m)
    first = next(it)["id"].copy()
    if how == "set_epoch":
        m.set_epoch(0)
    else:
        m.load_state_dict(state)
    assert m._stream is None
    units = m.stats()["units_read"]
    time.sleep(0.5)
    assert m.stats()["units_read"] == units  # nothing more read for the old stream
    with pytest.raises(RuntimeError, match="stale"):
        next(it)
    np.testing.assert_array_equal(next(iter(m))["id"], first)


def test_mixing_packed_sources_refuses_batches_past_int32_cu_seqlens(tmp_path):
    """A packing Loader refuses batch_size x seq_len past 2**31 - 1 (cu_seqlens' int32
    offsets would wrap); the mixture makes its batches' cu_seqlens again over its own
    batch_size blocks, and took any batch_size."""
    pq.write_table(pa.table({"tokens": pa.array([[1, 2, 3]] * 8, pa.list_(pa.int32()))}),
                   tmp_path / "a.parquet")
    pack = pqloader.Pack("tokens", seq_len=2**20, eos=0)
    srcs = [pqloader.Loader(str(tmp_path), batch_size=1, pack=pack) for _ in range(2)]
    with pytest.raises(ValueError, match="cu_seqlens"):
        pqloader.mix(srcs, [0.5, 0.5], batch_size=4096)
    pqloader.mix(srcs, [0.5, 0.5], batch_size=2047)  # (2047 x 2**20 tokens fit)


def test_transformed_sources_write_their_batches_in_place_as_a_copy_would(tmp_path):
    """Sources with transforms (images decoded, randomly cropped and flipped; token lists
    padded to a fixed length, with their lengths) assemble each batch straight into the
    mixture's when every output column has one shape; equal to the copy that a resumed
    epoch makes, and to each row's own transform."""
    Image = pytest.importorskip("PIL.Image")
    import io
    rng = np.random.default_rng(4)
    for s, n in enumerate((120, 80, 60)):
        ids = s * 1000 + np.arange(n, dtype=np.int64)
        pngs = []
        for i in ids.tolist():
            b = io.BytesIO()
            Image.fromarray(rng.integers(0, 255, (10 + i % 5, 12, 3), dtype=np.uint8)).save(b, format="PNG")
            pngs.append(b.getvalue())
        toks = [list(range(i, i + int(k))) for i, k in zip(ids.tolist(), rng.integers(0, 12, n))]
        pq.write_table(pa.table({"id": ids, "png": pngs, "tok": toks}), tmp_path / f"{s}.parquet",
                       row_group_size=16)
    T = pqloader.transforms
    tf = {"png": [T.DecodeImage(), T.RandomResizedCrop(6), T.RandomHorizontalFlip()],
          "tok": [T.PadOrTruncate(8, pad=-1)]}

    def make(**kw):
        ls = [pqloader.Loader(str(tmp_path / f"{s}.parquet"), batch_size=10 + 3 * s, shuffle=s != 1,
                              seed=s, transforms=tf) for s in range(3)]
        return pqloader.mix(ls, [0.5, 0.3, 0.2], seed=6, batch_size=24, num_epochs=2, **kw)

    m = make()
    full = run(m)
    assert m.stats()["epochs_in_place"] == 2
    for b in full:
        assert b["png"].shape == (len(b["id"]), 6, 6, 3) and b["tok"].shape == (len(b["id"]), 8)
        assert (np.diff(b["source"]) >= 0).all() and (b["id"] // 1000 == b["source"]).all()
        for i, row, k in zip(b["id"].tolist(), b["tok"], b["tok_length"]):
            s, r = divmod(i, 1000)
            assert k == min(8, len(toks_of(tmp_path, s)[r]))
            np.testing.assert_array_equal(row, (toks_of(tmp_path, s)[r] + [-1] * 8)[:8])
    resumed = resume_after(make, 3, full)
    assert resumed.stats()["epochs_in_place"] == 1  # the rest of epoch 0 copied


def toks_of(root, s, _memo={}):
    if (root, s) not in _memo:
        _memo[root, s] = pq.read_table(root / f"{s}.parquet", columns=["tok"])["tok"].to_pylist()
    return _memo[root, s]


def test_rows_drop_last_leaves_out_are_not_read_from_a_source_written_in_place(sources):
    """With drop_last, the positions after the last batch may draw more rows of a source
    than it has; an epoch written in place reads none of them (starting the next epoch
    early included), and equals the same epoch copied (its rest after a resume)."""
    root, sizes = sources
    cum = _core.mix_cumulative([1, 1, 1])
    draws = _core.mix_draws(9, 0, 0, 4000, cum)
    last = int(np.flatnonzero(draws == 2)[sizes["books"]])  # draws "books" a 601st time
    batch = 50
    assert last % batch != batch - 1  # inside the dropped tail, not a whole batch
    samples = last + 1
    kw = dict(seed=9, batch_size=batch, samples_per_epoch=samples, drop_last=True, num_epochs=2)
    m = pqloader.mix(loaders(root, batch_size=32), [1, 1, 1], **kw)
    full = run(m)
    assert m.stats()["epochs_in_place"] >= 1 and len(full) == 2 * (samples // batch)
    m = pqloader.mix(loaders(root, batch_size=32), [1, 1, 1], **kw)
    it = iter(m)
    next(it)
    resumed = pqloader.mix(loaders(root, batch_size=32), [1, 1, 1], **kw)
    resumed.load_state_dict(m.state_dict())
    for x, y in zip(run(resumed), full[1:]):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def test_a_source_of_small_weight_beyond_its_bound_is_copied_not_written_in_place(sources):
    """A source's shuffle window spans about its rows / its share of the positions, whose
    batches' blocks its gather would make whole: beyond its max_inflight_bytes the
    epoch is copied instead, with the same batches."""
    root, _ = sources
    kw = dict(seed=3, batch_size=40, stop="first")

    def make(**budget):
        ls = loaders(root, **budget)
        return pqloader.mix(ls, {"web": 1, "code": 0.02, "books": 0.02}, **kw)

    roomy, tight = make(), make(max_inflight_bytes=1 << 16)
    a, b = run(roomy), run(tight)
    assert roomy.stats()["epochs_in_place"] == 1 and tight.stats()["epochs_in_place"] == 0
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def test_last_exhausted_reads_every_source_whole_and_reshuffles_wraps(sources):
    root, sizes = sources
    m = pqloader.mix(loaders(root), [1, 1, 1], seed=2, stop="last", batch_size=100)
    ids = np.concatenate([b["id"] for b in m])
    for s, n in enumerate(sizes.values()):
        mine = ids[ids // 1_000_000 == s]
        assert set(mine % 1_000_000) == set(range(n))  # read whole at least once
    # A small source wraps several times, each wrap a new shuffle of all its rows.
    books = ids[ids // 1_000_000 == 2] % 1_000_000
    first, second = books[:600], books[600:1200]
    assert sorted(first) == sorted(second) == list(range(600))
    assert not np.array_equal(first, second)


def test_samples_per_epoch_and_ranks_get_equal_disjoint_batches(sources):
    root, _ = sources
    per_rank = []
    for rank in range(2):
        m = pqloader.mix(loaders(root, rank=rank, world_size=2), [3, 2, 1], seed=1,
                         samples_per_epoch=2000, batch_size=100)
        assert m.epoch_samples(0) == 1000 and len(m) == 10
        batches = run(m)
        per_rank.append(np.concatenate([b["id"] for b in batches]))
        # Every rank draws the same source sequence.
        if rank:
            np.testing.assert_array_equal(per_rank[0] // 1_000_000, per_rank[1] // 1_000_000)
    assert len(set(per_rank[0]) & set(per_rank[1])) == 0  # disjoint shards


def test_epochs_differ_and_set_epoch_replays(sources):
    root, _ = sources
    m = pqloader.mix(loaders(root), [1, 1, 1], seed=3, samples_per_epoch=500, batch_size=100, num_epochs=2)
    both = run(m)
    assert len(both) == 10
    m2 = pqloader.mix(loaders(root), [1, 1, 1], seed=3, samples_per_epoch=500, batch_size=100, num_epochs=1)
    m2.set_epoch(1)
    again = run(m2)
    for x, y in zip(again, both[5:]):
        np.testing.assert_array_equal(x["id"], y["id"])
    assert not np.array_equal(both[0]["source"], both[5]["source"])


def test_an_endless_mixture_of_many_epochs_does_not_grow_and_old_epochs_replay(sources):
    """Each epoch's length was memoised for good: a mixture grew ~60 bytes an epoch,
    without bound, over num_epochs=None. The memo keeps a few; an epoch it let go is
    drawn again, to the same batches."""
    root, _ = sources
    m = pqloader.mix(loaders(root), [1, 1, 1], seed=3, samples_per_epoch=64, batch_size=32,
                     num_epochs=None)
    first = [b["id"].copy() for b in itertools.islice(iter(m), 3 * len(m))]
    epochs = 300
    it = iter(m)
    for _ in range(epochs * len(m)):
        next(it)
    del it
    assert m.epoch >= epochs
    assert len(m._lengths) <= 16, len(m._lengths)
    m.set_epoch(1)  # an epoch whose length was let go long ago
    again = [b["id"].copy() for b in itertools.islice(iter(m), 2 * len(m))]
    assert len(again) == len(first) - len(m)
    for x, y in zip(again, first[len(m):]):
        np.testing.assert_array_equal(x, y)


def test_each_next_epoch_starts_while_one_ends_with_the_same_batches(sources):
    """An iteration of several epochs starts the sources' next epoch before the current
    one's last batches (no boundary wait); the batches are those of epochs read one by
    one, and a one-epoch iteration starts nothing ahead. (Batches copied from the
    sources' batches: unshuffled sources do not write in place, mix_stream.h.)"""
    root, _ = sources
    kw = dict(seed=6, batch_size=50)
    m = pqloader.mix(loaders(root, shuffle=False), [0.5, 0.3, 0.2], num_epochs=3, **kw)
    three = run(m)
    started = [s["epochs_started_ahead"] for s in m.stats()["sources"].values()]
    assert started == [2, 2, 2]
    alone = []
    for epoch in range(3):
        one = pqloader.mix(loaders(root, shuffle=False), [0.5, 0.3, 0.2], num_epochs=1, **kw)
        one.set_epoch(epoch)
        alone += run(one)
        assert all(s["epochs_started_ahead"] == 0 for s in one.stats()["sources"].values())
    assert len(three) == len(alone)
    for x, y in zip(three, alone):
        np.testing.assert_array_equal(x["id"], y["id"])
        np.testing.assert_array_equal(x["source"], y["source"])


def test_the_draws_that_found_an_epochs_length_are_its_batches_draws(sources, monkeypatch):
    """An epoch ending at a source's end is drawn once: the draws that found its length
    (kept, a byte per position) are those of its positions, and its stream reads them;
    with none kept (and with stop="last") the batches are the same."""
    root, _ = sources
    cum = _core.mix_cumulative([0.5, 0.3, 0.2])
    rows = [3000, 1200, 600]
    n, kept = _core.mix_epoch_length_kept(6, 1, cum, rows, False, 10**6, 1 << 20)
    assert n == _core.mix_epoch_length(6, 1, cum, rows, False, 10**6) and len(kept) == n
    assert _core.mix_epoch_length_kept(6, 1, cum, rows, False, 10**6, n - 1)[1] is None
    for stop in ("first", "last"):
        kw = dict(seed=6, batch_size=50, stop=stop)
        m = pqloader.mix(loaders(root), [0.5, 0.3, 0.2], num_epochs=2, **kw)
        it = iter(m)
        with_kept = run(b for _, b in zip(range(len(m) // 2 + 1), it))
        assert m._kept[0] == 1  # epoch 1's draws, kept half way through epoch 0
        with_kept += run(it)
        assert m._kept is None  # and taken by its stream
        monkeypatch.setattr("pqloader._mix._MAX_KEPT_DRAWS", 0)
        drawn = run(pqloader.mix(loaders(root), [0.5, 0.3, 0.2], num_epochs=2, **kw))
        monkeypatch.undo()
        assert len(with_kept) == len(drawn)
        for x, y in zip(with_kept, drawn):
            np.testing.assert_array_equal(x["id"], y["id"])
            np.testing.assert_array_equal(x["source"], y["source"])


def test_sources_with_their_own_filters_and_torch_output(sources):
    torch = pytest.importorskip("torch")
    root, _ = sources
    a = pqloader.Loader(str(root / "web"), batch_size=32, filter="x < 0.5", seed=1, shuffle=True)
    b = pqloader.Loader(str(root / "code"), batch_size=32, seed=2)
    m = pqloader.mix({"a": a, "b": b}, {"a": 1, "b": 1}, output="torch", source_column="from")
    first = next(iter(m))
    assert isinstance(first["id"], torch.Tensor) and first["from"].dtype == torch.int64
    xs = np.concatenate([bb["x"].numpy()[bb["from"].numpy() == 0] for bb in m])
    assert (xs < 0.5).all()


def test_mix_refuses_what_it_cannot_mix(sources):
    root, _ = sources
    ls = loaders(root)
    with pytest.raises(ValueError, match="one weight per source"):
        pqloader.mix(list(ls.values()), [1, 1])
    with pytest.raises(ValueError, match="finite number"):
        pqloader.mix(ls, {"web": -1, "code": 1, "books": 1})
    with pytest.raises(ValueError, match="at least one weight"):
        pqloader.mix(ls, [0, 0, 0])
    with pytest.raises(ValueError, match="same columns"):
        pqloader.mix([pqloader.Loader(str(root / "web"), columns=["id"]), ls["code"]], [1, 1])
    with pytest.raises(ValueError, match="rank"):
        pqloader.mix([pqloader.Loader(str(root / "web"), rank=0, world_size=2), ls["code"]], [1, 1])
    with pytest.raises(ValueError, match="its own Loader"):
        pqloader.mix([ls["web"], ls["web"]], [1, 1])
    with pytest.raises(TypeError, match="pqloader.Loader"):
        pqloader.mix([str(root / "web")], [1])
    with pytest.raises(ValueError, match="source_column"):
        pqloader.mix(ls, [1, 1, 1], source_column="id")
    with pytest.raises(ValueError, match="output='numpy'"):
        pqloader.mix([pqloader.Loader(str(root / "web"), output="torch"), ls["code"]], [1, 1])
    with pytest.raises(ValueError, match="batch_transform"):
        pqloader.mix([pqloader.Loader(str(root / "web"), batch_transform=lambda b: b), ls["code"]], [1, 1])


def test_numpy_weights_mix_as_the_same_python_numbers(sources):
    # Weights computed with NumPy (np.array([...]), np.float32 shares) are numbers:
    # refusing them said "must be a finite number >= 0, got np.float32(1.0)".
    root, _ = sources
    want = run(pqloader.mix(loaders(root), [3, 1, 1], seed=2, batch_size=100, samples_per_epoch=400))
    for w in (np.array([3, 1, 1]), [np.float32(3), np.float32(1), np.float64(1)],
              {"web": np.int64(3), "code": np.uint8(1), "books": np.float16(1)}):
        got = run(pqloader.mix(loaders(root), w, seed=2, batch_size=100, samples_per_epoch=400))
        assert len(got) == len(want)
        for x, y in zip(got, want):
            for k in x:
                np.testing.assert_array_equal(x[k], y[k])
    ls = loaders(root)
    with pytest.raises(ValueError, match="finite number"):
        pqloader.mix(ls, [np.float32("nan"), 1, 1])
    with pytest.raises(ValueError, match="finite number"):
        pqloader.mix(ls, [np.bool_(True), 1, 1])


def test_sources_or_weights_given_as_a_set_are_refused(sources):
    # A set has no order of its own: mix({a, b}, [1, 0]) gave the weight 1 to a or to b
    # by the Loaders' addresses (another per run), and [a, b] with {3, 1} weighted a by 1.
    root, _ = sources
    ls = list(loaders(root, names=("web", "code")).values())
    with pytest.raises(TypeError, match="sources .* got a set"):
        pqloader.mix(set(ls), [1, 0])
    with pytest.raises(TypeError, match="weights .* got a set"):
        pqloader.mix(ls, {3, 1})
    with pytest.raises(TypeError, match="weights .* got a set"):
        pqloader.mix(ls, frozenset({3, 1}))


def test_stats_sum_the_sources(sources):
    root, sizes = sources
    m = pqloader.mix(loaders(root), [1, 1, 1], seed=1, samples_per_epoch=900, batch_size=100)
    rows = sum(len(b["id"]) for b in m)
    s = m.stats()
    assert set(s["sources"]) == {"web", "code", "books"}
    assert s["rows"] >= rows and s["bytes_read"] == sum(x["bytes_read"] for x in s["sources"].values()) > 0


def test_stats_time_the_mixture_and_its_sources(sources, monkeypatch):
    """A mixture's stats() has a consumer side of its own (batches it handed out, its
    wait and wall time) and the sources' worker stages summed, so that its stats table
    diagnoses it (it said "no batches yet" once)."""
    from pqloader import _iteration, _mix

    root, sizes = sources
    ls = loaders(root)
    # The batch_transform advances the consumer's clock by an hour instead of sleeping:
    # with 30 ms sleeps the engine had to answer faster than them (loaded machines).
    hour, offset = 3600.0, [0.0]
    monkeypatch.setattr(_iteration, "clock", lambda: time.perf_counter() + offset[0])
    monkeypatch.setattr(_mix, "clock", _iteration.clock)

    def transform(b):
        offset[0] += hour
        return b

    m = pqloader.mix(ls, [1, 1, 1], seed=1, samples_per_epoch=900, batch_size=100,
                     batch_transform=transform)
    n = sum(1 for _ in m)
    s = m.stats()
    assert s["batches"] == n == 9
    for k in ("read_seconds", "decode_seconds", "assemble_seconds"):
        assert s[k] == pytest.approx(sum(x[k] for x in s["sources"].values()))
    assert s["decode_seconds"] > 0
    # The transform's hours are the consumer's time in next(), not the engine's.
    assert s["wait_seconds"] >= 9 * hour > s["engine_wait_seconds"] >= 0
    assert s["wall_seconds"] >= s["wait_seconds"]
    assert s["wait_fraction"] == pytest.approx(s["wait_seconds"] / s["wall_seconds"], rel=0.05)
    table = m.stats_table()
    assert "decode" in table and "diagnosis: hand-out-bound" in table, table


def test_string_and_list_columns_are_mixed_row_by_row(tmp_path):
    """Variable-length columns (str, bytes, lists of str) take each row's bytes from its
    source, in drawn order, like fixed-width ones."""
    for s, n in enumerate((50, 30)):
        ids = s * 1000 + np.arange(n, dtype=np.int64)
        pq.write_table(pa.table({"id": ids, "name": [f"s{s}-{i}" * (i % 4) for i in ids],
                                 "blob": [bytes([i % 256]) * (i % 5) for i in ids],
                                 "tags": [[f"t{i}", "x" * (i % 3)] for i in ids]}),
                       tmp_path / f"{s}.parquet", row_group_size=7)
    m = pqloader.mix([pqloader.Loader(str(tmp_path / f"{s}.parquet"), batch_size=6, shuffle=True, seed=s)
                      for s in range(2)], [2, 1], batch_size=8, seed=3, stop="last")
    rows = 0
    for b in m:
        for i, name, blob, tags, src in zip(b["id"].tolist(), b["name"], b["blob"], b["tags"], b["source"]):
            assert i // 1000 == src
            assert name == f"s{src}-{i}" * (i % 4) and blob == bytes([i % 256]) * (i % 5)
            assert tags == [f"t{i}", "x" * (i % 3)]
            rows += 1
    assert rows == m.epoch_samples(0) >= 80


def test_batch_transform_belongs_to_the_mixture(sources):
    root, _ = sources
    ls = loaders(root)
    with pytest.raises(ValueError, match="batch_transform"):
        pqloader.mix([pqloader.Loader(str(root / "web"), batch_transform=lambda b: b), ls["code"]], [1, 1])
    plain = run(pqloader.mix(loaders(root), [1, 1, 1], seed=1, samples_per_epoch=500, batch_size=50))
    doubled = run(pqloader.mix(loaders(root), [1, 1, 1], seed=1, samples_per_epoch=500, batch_size=50,
                               batch_transform=lambda b: {**b, "x": b["x"] * 2}))
    assert len(plain) == len(doubled) == 10
    for p, d in zip(plain, doubled):
        np.testing.assert_array_equal(d["x"], p["x"] * 2)
        np.testing.assert_array_equal(d["id"], p["id"])


def test_a_batch_whose_batch_transform_raised_is_not_consumed(sources):
    """The position moves when a batch is handed out, not when the stream gives it: a
    batch_transform that raises (a bad batch, Ctrl-C in it) leaves that batch to the next
    iteration and to state_dict(), as Loader does."""
    root, _ = sources
    calls = {"n": 0, "fail_at": None}

    def transform(b):
        calls["n"] += 1
        if calls["n"] == calls["fail_at"]:
            raise KeyboardInterrupt
        return b

    def make():
        return pqloader.mix(loaders(root), [1, 1, 1], seed=1, samples_per_epoch=500, batch_size=50,
                            batch_transform=transform)

    full = run(make())
    calls.update(n=0, fail_at=4)
    m = make()
    got = []
    with pytest.raises(KeyboardInterrupt):
        for b in m:
            got.append({k: np.array(v, copy=True) for k, v in b.items()})
    assert len(got) == 3 and m.state_dict()["batch"] == 3
    got += run(m)
    assert len(got) == len(full) == 10
    for x, y in zip(got, full):
        np.testing.assert_array_equal(x["id"], y["id"])


@pytest.mark.parametrize("pad", [pqloader.Pad(), pqloader.Pad(max_length=20, multiple_of=8, value=-1, side="left"),
                                 pqloader.Pad(max_length=20, truncation="left")])
def test_lists_padded_per_batch_are_padded_again_over_the_mixed_rows(tmp_path, pad):
    """A source pads each of its batches to that batch's longest row; the mixture pads its
    own batches as one Loader pads a batch of those rows: to their longest (capped, rounded
    up), each row's values on the collate's side, nothing of a source's padding copied."""
    rng = np.random.default_rng(5)
    for s, n in enumerate((300, 200)):
        ids = s * 1000 + np.arange(n, dtype=np.int64)
        lens = rng.integers(0, 40, n)
        pq.write_table(pa.table({"id": ids, "tok": [list(range(i, i + k)) for i, k in zip(ids, lens)]}),
                       tmp_path / f"{s}.parquet", row_group_size=50)
    lengths = {s * 1000 + i: len(x) for s in (0, 1)
               for i, x in enumerate(pq.read_table(tmp_path / f"{s}.parquet")["tok"].to_pylist())}

    def make(lists, **kw):
        return pqloader.mix([pqloader.Loader(str(tmp_path / f"{s}.parquet"), batch_size=16 + 7 * s,
                                             shuffle=True, seed=s, lists={"tok": lists})
                             for s in range(2)], [2, 1], batch_size=24, seed=3, stop="last", **kw)

    batches = run(make(pad))
    ragged = run(make(pqloader.Ragged()))
    assert len(batches) == len(ragged) > 10
    cap = pad.max_length or 10**9
    for b, r in zip(batches, ragged):
        np.testing.assert_array_equal(b["id"], r["id"])  # the same rows, in the same order
        kept = np.minimum([lengths[i] for i in b["id"].tolist()], cap)
        np.testing.assert_array_equal(b["tok_length"], kept)
        assert b["tok"].shape[1] == -(-min(kept.max(), cap) // pad.multiple_of) * pad.multiple_of
        offsets = r["tok_offsets"]
        assert offsets[0] == 0 and len(offsets) == len(r["id"]) + 1
        for row, i, k, lo, hi in zip(b["tok"], b["id"].tolist(), kept, offsets[:-1], offsets[1:]):
            whole = np.arange(i, i + lengths[i])
            np.testing.assert_array_equal(r["tok"][lo:hi], whole)  # ragged rows whole
            values = whole[-k:] if pad.truncation == "left" and k else whole[:k]
            padding = np.full(len(row) - k, pad.value)
            expect = np.concatenate([padding, values] if pad.side == "left" else [values, padding])
            np.testing.assert_array_equal(row, expect)


def test_sources_must_collate_a_list_column_alike(tmp_path):
    pq.write_table(pa.table({"tok": [[1, 2], [3]]}), tmp_path / "a.parquet")
    srcs = [pqloader.Loader(str(tmp_path / "a.parquet"), lists={"tok": pqloader.Pad()}),
            pqloader.Loader(str(tmp_path / "a.parquet"), lists={"tok": pqloader.Pad(multiple_of=8)})]
    with pytest.raises(Exception, match="tok.*mixture source '1' batches it.*mixture source '0'.*same lists="):
        next(iter(pqloader.mix(srcs, [1, 1])))
    srcs = [pqloader.Loader(str(tmp_path / "a.parquet"), lists={"tok": pqloader.Ragged()}),
            pqloader.Loader(str(tmp_path / "a.parquet"), lists={"tok": pqloader.Pad(length=2)})]
    with pytest.raises(ValueError, match="same columns"):  # tok_offsets against tok_length
        pqloader.mix(srcs, [1, 1])
    packed = pqloader.Loader(str(tmp_path / "a.parquet"), pack=pqloader.Pack("tok", seq_len=4))
    padded = pqloader.Loader(str(tmp_path / "a.parquet"), lists={"tok": pqloader.Pad()})
    for srcs in ([packed, padded], [padded, packed]):  # packed blocks against padded rows
        with pytest.raises(ValueError, match=r"packs documents \(pack=\) and '[01]' does not"):
            pqloader.mix(srcs, [1, 1])
    # Blocks of 4 and of 8 tokens: the error named only the columns' shapes ("column 'tok'
    # is int64 (4,) in '0' but int64 (8,) in '1'"), not the Pack(seq_len=) that differs.
    longer = pqloader.Loader(str(tmp_path / "a.parquet"), pack=pqloader.Pack("tok", seq_len=8))
    with pytest.raises(ValueError, match=r"mix source '1' packs blocks of Pack\(seq_len=8\), '0' of "
                                         r"seq_len=4: packed sources must agree"):
        pqloader.mix([packed, longer], [1, 1])


# -- sources that pack documents (pack=): mixed block by block -------------------------
@pytest.fixture(scope="module")
def token_sources(tmp_path_factory):
    """Two token datasets; a token's value tells its source (s * 10000 + 1..9999)."""
    root = tmp_path_factory.mktemp("mixpack")
    rng = np.random.default_rng(4)
    for s, (name, n) in enumerate({"web": 400, "code": 150}.items()):
        d = root / name
        d.mkdir()
        docs = [(s * 10000 + rng.integers(1, 9999, size=int(k))).astype(np.int32)
                for k in rng.integers(1, 150, size=n)]
        pq.write_table(pa.table({"tokens": pa.array(docs, type=pa.list_(pa.int32())),
                                 "doc": np.arange(n, dtype=np.int64) + s * 100000}),
                       d / "part.parquet", row_group_size=40)
    return root


def packed(root, name, seed, **kw):
    kw.setdefault("batch_size", 8)
    return pqloader.Loader(str(root / name), columns=["tokens", "doc"], shuffle=True, seed=seed,
                           pack=pqloader.Pack("tokens", 64, eos=0), **kw)


def block_boundaries(document_ids):
    """One block's segment starts (as pqloader.Pack makes cu_seqlens), from its ids."""
    d = np.asarray(document_ids)
    return [0] + [t for t in range(1, len(d)) if d[t] != d[t - 1]]


def test_packed_sources_mix_block_by_block_with_each_batchs_cu_seqlens_made_again(token_sources):
    root = token_sources
    names, seeds = ("web", "code"), (10, 11)

    def mixture(**kw):
        return pqloader.mix({n: packed(root, n, s, **kw) for n, s in zip(names, seeds)},
                            [0.7, 0.3], batch_size=16, seed=3, stop="first")

    batches = run(mixture())
    assert batches and all(b["tokens"].shape[1:] == (64,) for b in batches)
    np.testing.assert_array_equal(  # any worker count: the same batches
        np.concatenate([b["tokens"] for b in run(mixture(num_workers=1))]),
        np.concatenate([b["tokens"] for b in batches]))
    # Each source's own blocks, one per batch (its block stream does not depend on the
    # batch size), with each block's own cu_seqlens.
    own = {}
    for s, (n, seed) in enumerate(zip(names, seeds)):
        own[s] = iter(run(packed(root, n, seed, batch_size=1)))
    for b in batches:
        expected_cu = []
        for r, s in enumerate(b["source"]):
            ref = next(own[int(s)])
            for k in ("tokens", "position_ids", "document_ids", "loss_mask", "doc"):
                np.testing.assert_array_equal(b[k][r], ref[k][0], err_msg=k)
            assert np.all(b["tokens"][r][b["loss_mask"][r]] // 10000 <= s)  # its own tokens
            np.testing.assert_array_equal(ref["cu_seqlens"][:-1], block_boundaries(ref["document_ids"][0]))
            expected_cu += [r * 64 + t for t in ref["cu_seqlens"][:-1]]
        expected_cu.append(len(b["source"]) * 64)
        assert b["cu_seqlens"].dtype == np.int32
        np.testing.assert_array_equal(b["cu_seqlens"], expected_cu)


def test_packed_sources_on_two_ranks_resume_exactly_after_wraps(token_sources):
    # Two ranks: a source's blocks per rank differ between epochs and seeds (each wrap is
    # read under another seed), so resuming must count each wrap's own blocks.
    root = token_sources
    kw = dict(batch_size=8, seed=5, stop="last", num_epochs=2)

    def mixture():
        return pqloader.mix({"web": packed(root, "web", 10, rank=0, world_size=2),
                             "code": packed(root, "code", 11, rank=0, world_size=2)}, [0.3, 0.7], **kw)

    # A loader's count of blocks follows its seed (a wrap is read under another one).
    counts = {s: packed(root, "code", s, rank=0, world_size=2)._engine.num_batches(0) for s in range(5)}
    assert len(set(counts.values())) > 1
    moved = packed(root, "code", 0, rank=0, world_size=2)
    assert moved._engine.num_batches(0) == counts[0]
    for s in range(1, 5):
        moved._engine.set_seed(s)
        assert moved._engine.num_batches(0) == counts[s]
    m = mixture()
    own = len(m._loaders[1])
    full = []
    for b in m:  # the source's len() is its own while the mixture reads its wraps
        full.append({k: np.array(v, copy=True) for k, v in b.items()})
        assert len(m._loaders[1]) == own
    rows = m._rows
    assert sum(int((b["source"] == 1).sum()) for b in full) > 2 * rows[1]  # code wrapped
    for cut in (5, len(full) // 2, len(full) - 3):
        resume_after(mixture, cut, full)



def test_a_packed_sources_wrap_without_a_whole_batch_is_passed_over(tmp_path):
    # 30 documents over two ranks, whole batches of 32 blocks only: under some seeds a rank
    # gets fewer than 32 blocks, so one of the source's rereads (wraps) gives no batch.
    rng = np.random.default_rng(3)
    for name, n in (("big", 400), ("tiny", 30)):
        docs = [rng.integers(1, 999, size=int(k)).astype(np.int32) for k in rng.integers(1, 300, size=n)]
        pq.write_table(pa.table({"tokens": pa.array(docs, type=pa.list_(pa.int32()))}),
                       tmp_path / f"{name}.parquet", row_group_size=1)

    def tiny(seed, rank):
        return pqloader.Loader(str(tmp_path / "tiny.parquet"), batch_size=32, shuffle=True, seed=seed,
                               rank=rank, world_size=2, shard_policy="drop", drop_last=True,
                               pack=pqloader.Pack("tokens", 64))

    probe = tiny(0, 0)
    rows = []
    for w in range(6):
        probe._engine.set_seed(wrap_seed(0, w))
        rows.append(probe._engine.core().batch_rows(0))
    assert rows[0] > 0 and 0 in rows[1:], rows  # the case under test

    def mixture(rank):
        big = pqloader.Loader(str(tmp_path / "big.parquet"), batch_size=4, shuffle=True, seed=99,
                              rank=rank, world_size=2, shard_policy="drop", pack=pqloader.Pack("tokens", 64))
        return pqloader.mix([big, tiny(0, rank)], [0.2, 0.8], batch_size=4, seed=1, stop="last")

    runs = [run(mixture(rank)) for rank in (0, 1)]  # "mixture source 1 has no rows" before
    assert len(runs[0]) == len(runs[1]) == len(mixture(0))
    for cut in (len(runs[0]) // 3, len(runs[0]) - 2):
        resume_after(lambda: mixture(0), cut, runs[0])


def test_a_mixture_state_loads_on_every_rank_and_the_ranks_states_merge(sources):
    """Rank 0 saves, every rank loads (as docs/distributed.md does for a Loader): each
    rank's rest equals its own uninterrupted one. The ranks' states merge into one
    (merge_states, so gather_state_dict and Checkpoint) while in step; out of step, or
    on another world size, they are refused naming why."""
    root, _ = sources

    def make(rank, world=2, **kw):
        return pqloader.mix(loaders(root, rank=rank, world_size=world, **kw), [3, 2, 1], seed=1,
                            samples_per_epoch=600, batch_size=50)

    full = [run(make(r)) for r in range(2)]
    ms = [make(r) for r in range(2)]
    its = [iter(m) for m in ms]
    for it in its:
        for _ in range(4):
            next(it)
    states = [json.loads(json.dumps(m.state_dict())) for m in ms]
    merged = pqloader.merge_states(states[::-1])
    for saved in (states[0], merged):
        for rank in range(2):
            resumed = make(rank)
            resumed.load_state_dict(saved)
            tail = run(resumed)
            assert [b["id"].tolist() for b in tail] == [b["id"].tolist() for b in full[rank][4:]]
    next(its[1])
    with pytest.raises(pqloader.InvalidDataError, match="rank 1's mixture state differs .*in step"):
        pqloader.merge_states([m.state_dict() for m in ms])
    with pytest.raises(pqloader.InvalidDataError, match="rank 0..1"):
        pqloader.merge_states([states[0], states[0]])
    # Ranks' states of two state versions (both loadable) are not merged into one (a
    # mutant that let two versions through survived).
    with pytest.raises(pqloader.InvalidDataError, match="other state versions"):
        pqloader.merge_states([states[0], {**states[1], "version": 1}])
    with pytest.raises(pqloader.InvalidDataError, match="source 'web' world_size: state has 2, mixture has 3"):
        make(0, world=3).load_state_dict(states[0])


def test_sources_without_a_seed_adopt_a_mixture_states_seeds(sources):
    # A Loader built with seed=None adopts a state's seed; the mixture's sources too (and
    # the mixture its own, taken from the first source's): the resumed rest is exact.
    root, _ = sources

    def make(**kw):
        ls = {n: pqloader.Loader(str(root / n), batch_size=64, shuffle=True) for n in ("web", "code")}
        return pqloader.mix(ls, [1, 1], batch_size=64, **kw)

    for kw in ({"samples_per_epoch": 640}, {}):  # without it, the seed decides the epoch's end
        m = make(**kw)
        full = run(m)
        m.set_epoch(0)
        it = iter(m)
        cut = len(full) - 1  # past the end of many another seed's epoch
        for _ in range(cut):
            next(it)
        state = json.loads(json.dumps(m.state_dict()))
        for _ in range(4):  # fresh seeds: some end their own epoch 0 before `cut`
            resumed = make(**kw)
            assert [l.seed for l in resumed._loaders] != [l.seed for l in m._loaders]
            resumed.load_state_dict(state)
            assert [b["id"].tolist() for b in run(resumed)] == [b["id"].tolist() for b in full[cut:]], kw
    seeded = pqloader.mix({n: pqloader.Loader(str(root / n), batch_size=64, shuffle=True, seed=5)
                           for n in ("web", "code")}, [1, 1], samples_per_epoch=640, batch_size=64)
    with pytest.raises(pqloader.InvalidDataError, match="source 'web' seed"):
        seeded.load_state_dict(m.state_dict())


def test_stop_last_does_not_wait_for_a_source_of_weight_0_and_warns_when_cut(tmp_path):
    # A weight-0 source was waited for as unfinished: the epoch ran silently to the draw
    # cap (~106 passes over the other source).
    for name, rows in (("a", range(100)), ("b", range(1000, 1050))):
        os.makedirs(tmp_path / name)
        pq.write_table(pa.table({"x": pa.array(list(rows), pa.int64())}), tmp_path / name / "p.parquet")

    def epoch(weights):
        m = pqloader.mix({n: pqloader.Loader(str(tmp_path / n), batch_size=10) for n in "ab"},
                         weights, seed=0, stop="last")
        return np.concatenate([b["x"] for b in m])

    x = epoch([1.0, 0.0])
    assert sorted(x.tolist()) == list(range(100))  # a read whole once, b never drawn
    with pytest.warns(RuntimeWarning, match="did not end within 10624 draws"):
        assert len(epoch([1.0, 1e-9])) == 10624


def test_sources_padded_with_values_apart_past_the_6th_digit_are_refused(tmp_path):
    # The collates were compared by their 6-digit text: Pad(value=1234568) rows were
    # padded with source 0's 1234567.
    for name in "ab":
        os.makedirs(tmp_path / name)
        pq.write_table(pa.table({"t": pa.array([[1, 2], [3]], pa.list_(pa.int64()))}), tmp_path / name / "p.parquet")
    sources = {n: pqloader.Loader(str(tmp_path / n), batch_size=2, lists={"t": pqloader.Pad(value=v)})
               for n, v in (("a", 1234567), ("b", 1234568))}
    with pytest.raises(ValueError, match="value=1234568"):
        next(iter(pqloader.mix(sources, [1, 1], seed=0)))


def test_stop_last_reads_a_packing_source_whole_in_every_epoch_on_several_ranks(tmp_path):
    # A packed source's blocks per rank change from epoch to epoch; every epoch's length
    # was reckoned from epoch 0's blocks, so stop="last" left some blocks unread (or drew
    # more than the epoch held, reading blocks twice).
    rng = np.random.default_rng(10)
    for name, n, longest, first in (("a", 120, 60, 0), ("b", 80, 30, 10**6)):
        os.makedirs(tmp_path / name)
        docs = [list(range(first + i * 100, first + i * 100 + int(rng.integers(1, longest)))) for i in range(n)]
        pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))}), tmp_path / name / "p.parquet",
                       row_group_size=9)

    def source(name, seed):
        return pqloader.Loader(str(tmp_path / name), batch_size=4, shuffle=True, seed=seed, rank=0, world_size=2,
                               pack=pqloader.Pack("tokens", seq_len=16, eos=-2))

    m = pqloader.mix({"a": source("a", 1), "b": source("b", 2)}, [0.6, 0.4], batch_size=5, seed=3,
                     stop="last", num_epochs=None)
    it = iter(m)
    counts = []
    for epoch in range(4):
        batches = [next(it) for _ in range(m.num_batches(epoch))]
        for i, name in enumerate("ab"):
            got = np.concatenate([b["tokens"][b["source"] == i] for b in batches])
            own = source(name, i + 1)
            own.set_epoch(epoch)
            expected = np.concatenate([b["tokens"] for b in own])
            counts.append(len(expected))
            np.testing.assert_array_equal(got[:len(expected)], expected)  # its epoch, whole, in order
    assert len(set(counts[0::2])) > 1  # the blocks did change between epochs
    m.close()


def test_an_empty_source_of_weight_0_does_not_end_a_stop_first_epoch(tmp_path):
    # A source never drawn cannot run out: an empty one of weight 0 made every "first"
    # epoch empty.
    for name, rows in (("a", range(100)), ("b", range(1000, 1010))):
        os.makedirs(tmp_path / name)
        pq.write_table(pa.table({"x": pa.array(list(rows), pa.int64())}), tmp_path / name / "p.parquet")
    m = pqloader.mix({"a": pqloader.Loader(str(tmp_path / "a"), batch_size=10),
                      "b": pqloader.Loader(str(tmp_path / "b"), batch_size=10, filter="x < 0")},
                     [1.0, 0.0], seed=0, stop="first")
    assert sorted(np.concatenate([b["x"] for b in m]).tolist()) == list(range(100))


@pytest.mark.parametrize("kw", [dict(filter="x < 0"), dict(rank=1, world_size=2, filter="x < 1001")])
def test_a_weighted_source_without_rows_that_empties_stop_first_epochs_is_warned_once(tmp_path, kw):
    # Under stop="first", a source of weight > 0 without rows on a rank ends every epoch
    # before its first draw: the loop ran no batch, with no error nor warning.
    for name, rows in (("a", range(100)), ("b", range(1000, 1100))):
        os.makedirs(tmp_path / name)
        pq.write_table(pa.table({"x": pa.array(list(rows), pa.int64())}), tmp_path / name / "p.parquet")
    shard = {k: v for k, v in kw.items() if k != "filter"}

    def mixture(weights, **options):
        return pqloader.mix({"a": pqloader.Loader(str(tmp_path / "a"), batch_size=10, **shard),
                             "b": pqloader.Loader(str(tmp_path / "b"), batch_size=10, **kw)},
                            weights, seed=0, **options)

    m = mixture([1.0, 1.0], num_epochs=3)
    rank = kw.get("rank", 0)
    with pytest.warns(RuntimeWarning, match=rf"mixture source 'b' has no rows in epoch 0 on rank {rank} "
                                            rf"of {kw.get('world_size', 1)} .*stop='first'") as caught:
        assert run(m) == []
    assert len([w for w in caught if "mixture source" in str(w.message)]) == 1  # once
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(run(mixture([1.0, 0.0]))) > 0  # never drawn: no warning


@pytest.mark.parametrize("kw", [dict(stop="last"), dict(samples_per_epoch=50)])
def test_a_drawn_source_that_its_filter_leaves_empty_is_named_before_the_first_batch(tmp_path, kw):
    # The stream raised "mixture source 0 has no rows" (its index, no cause) at the batch
    # that first drew it, after the batches before it.
    for name, rows in (("a", range(100)), ("b", range(1000, 1010))):
        os.makedirs(tmp_path / name)
        pq.write_table(pa.table({"x": pa.array(list(rows), pa.int64())}), tmp_path / name / "p.parquet")

    def mixture(weights):
        return pqloader.mix({"a": pqloader.Loader(str(tmp_path / "a"), batch_size=10),
                             "b": pqloader.Loader(str(tmp_path / "b"), batch_size=10, filter="x < 0")},
                            weights, seed=0, batch_size=10, **kw)

    it = iter(mixture([1.0, 0.05]))
    with pytest.raises(pqloader.InvalidDataError, match=r"source 'b' has no rows in epoch 0 .*filter.*weight 0"):
        next(it)
    assert len(run(mixture([1.0, 0.0]))) > 0  # never drawn: not refused


def test_an_empty_source_is_found_at_its_first_draw_in_a_huge_epoch(tmp_path):
    # The check counted every draw of samples_per_epoch samples (10^13: hours, and Ctrl-C
    # did not stop it); it stops at the first draw of an empty source.
    for name, rows in (("a", range(100)), ("b", range(1000, 1010))):
        os.makedirs(tmp_path / name)
        pq.write_table(pa.table({"x": pa.array(list(rows), pa.int64())}), tmp_path / name / "p.parquet")
    cumulative = _core.mix_cumulative([1.0, 0.05])
    first = list(_core.mix_draws(0, 0, 0, 10_000, cumulative)).index(1)
    m = pqloader.mix({"a": pqloader.Loader(str(tmp_path / "a"), batch_size=10),
                      "b": pqloader.Loader(str(tmp_path / "b"), batch_size=10, filter="x < 0")},
                     [1.0, 0.05], seed=0, batch_size=10, samples_per_epoch=10**13)
    with pytest.raises(pqloader.InvalidDataError, match=rf"source 'b' .* at sample {first} of the epoch's 10000000000000;"):
        next(iter(m))


def test_an_epoch_of_more_samples_than_the_sources_hold_starts_at_once(sources):
    # Whether the sources could write an epoch in place was found by counting each
    # batch's draws, into a count per batch and source: samples_per_epoch=2**62 raised
    # MemoryError (std::bad_alloc) before the first batch (10**9 drew every sample first,
    # seconds). Sources that run out are copied, which needs no such count; the first
    # batches are a short epoch's (a draw is a function of its position).
    root, _ = sources

    def first_batches(samples):
        m = pqloader.mix(loaders(root), [2, 1, 1], seed=3, batch_size=50, samples_per_epoch=samples)
        it = iter(m)
        return [{k: np.array(v, copy=True) for k, v in next(it).items()} for _ in range(6)]

    for x, y in zip(first_batches(2**62), first_batches(300), strict=True):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def test_an_empty_source_drawn_only_in_the_partial_batch_drop_last_drops_is_not_refused(tmp_path):
    # The check counted the draws of all samples_per_epoch samples; with drop_last the
    # stream never draws the last partial batch's, and handed out every batch before it.
    for name, rows in (("a", range(100)), ("b", range(1000, 1010))):
        os.makedirs(tmp_path / name)
        pq.write_table(pa.table({"x": pa.array(list(rows), pa.int64())}), tmp_path / name / "p.parquet")
    cumulative = _core.mix_cumulative([1.0, 0.05])
    seed = next(s for s in range(10_000)
                if 1 not in list(_core.mix_draws(s, 0, 0, 8, cumulative))
                and 1 in list(_core.mix_draws(s, 0, 8, 2, cumulative)))
    m = pqloader.mix({"a": pqloader.Loader(str(tmp_path / "a"), batch_size=1),
                      "b": pqloader.Loader(str(tmp_path / "b"), batch_size=1, filter="x < 0")},
                     [1.0, 0.05], seed=seed, batch_size=4, samples_per_epoch=10, drop_last=True)
    assert [len(b["x"]) for b in m] == [4, 4]


def test_a_packed_source_without_blocks_is_named_by_the_stream(tmp_path):
    # The stream's own check (packed sources are left to it): it named the source by its
    # index ("mixture source 1 has no rows").
    docs = [np.arange(1, 1 + k, dtype=np.int32) for k in range(5, 40)]
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int32())), "n": np.arange(len(docs))}),
                   tmp_path / "t.parquet", row_group_size=5)

    def source(**kw):
        return pqloader.Loader(str(tmp_path / "t.parquet"), batch_size=2, columns=["tokens"],
                               pack=pqloader.Pack("tokens", 16), **kw)

    m = pqloader.mix({"a": source(), "b": source(filter="n < 0")}, [1, 1], batch_size=2, seed=0,
                     samples_per_epoch=20)
    with pytest.raises(pqloader.InvalidDataError, match="mixture source 'b' has no rows"):
        run(m)


def test_endless_epochs_of_no_batch_raise_instead_of_spinning(sources):
    # num_epochs=None over epochs of no batch looped forever without yielding (a Loader
    # raises there): samples_per_epoch below world_size, or an empty source drawn. In a
    # child process, bounded: without the check it spins.
    root, _ = sources
    script = textwrap.dedent(f"""
        import pqloader
        root = {str(root)!r}
        def L(n, **kw):
            return pqloader.Loader(root + "/" + n, batch_size=64, shuffle=True, seed=1, **kw)
        cases = [pqloader.mix([L(n, world_size=4, rank=0) for n in ("web", "code")], [0.5, 0.5],
                              seed=0, samples_per_epoch=3, num_epochs=None),
                 pqloader.mix([L("web"), L("code", filter="id < 0")], [0.5, 0.5], seed=0,
                              stop="first", num_epochs=None)]
        for m in cases:
            try:
                next(iter(m))
            except pqloader.InvalidDataError as e:
                assert "has no batch" in str(e), e
            else:
                raise AssertionError("yielded")
        print("raised")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0 and "raised" in out.stdout, out.stderr[-2000:]


def test_endless_epochs_of_random_length_go_on_past_an_empty_one(tmp_path):
    # Without samples_per_epoch an epoch's length is a draw: some epochs of a stop="first"
    # mixture with drop_last have no batch between others. The check against endless
    # empty epochs raised at the first of them.
    for name, n in (("small", 10), ("big", 1000)):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"id": np.arange(n)}), tmp_path / name / "p.parquet")
    ls = [pqloader.Loader(str(tmp_path / name), batch_size=1, shuffle=True, seed=1, drop_last=True)
          for name in ("small", "big")]
    m = pqloader.mix(ls, [0.5, 0.5], seed=0, stop="first", batch_size=18, drop_last=True,
                     num_epochs=None)
    counts = [m.num_batches(e) for e in range(12)]
    assert 0 in counts[:-1] and sum(counts) > 0, counts  # the case: an empty epoch between others
    batches = list(itertools.islice(iter(m), sum(counts)))
    assert len(batches) == sum(counts)


def test_a_state_taken_right_after_loading_one_is_that_state(sources):
    root, _ = sources
    make = lambda: pqloader.mix(loaders(root), [1, 1, 1], seed=5, batch_size=40, num_epochs=3)
    full = run(make())
    m = make()
    it = iter(m)
    cut = m.num_batches(0) + 7
    for _ in range(cut):
        next(it)
    state = json.loads(json.dumps(m.state_dict()))
    assert state["end"] == 3
    once = make()
    once.load_state_dict(state)
    again = json.loads(json.dumps(once.state_dict()))
    assert again == state
    twice = make()
    twice.load_state_dict(again)
    tail = run(twice)
    assert len(tail) == len(full) - cut
    for x, y in zip(tail, full[cut:]):
        np.testing.assert_array_equal(x["id"], y["id"])


@pytest.mark.parametrize("then", ["set_epoch", "load_state_dict", "nothing"])
def test_a_loop_left_early_leaves_no_end_in_the_mixtures_states(sources, then):
    root, _ = sources
    # "nothing": left in the second epoch of two; the next loop runs two epochs on
    epochs = 2 if then == "nothing" else 1
    make = lambda: pqloader.mix(loaders(root), [1, 1, 1], seed=5, batch_size=40, num_epochs=epochs)
    other = make()
    other.set_epoch(1)
    it = iter(other)
    for _ in range(5):
        next(it)
    loaded = json.loads(json.dumps(other.state_dict()))

    def leave_then(m):
        for i, _ in enumerate(m):
            if i == (m.num_batches(0) + 2 if then == "nothing" else 2):
                break
        if then == "set_epoch":
            m.set_epoch(3)
        elif then == "load_state_dict":
            m.load_state_dict(loaded)

    uninterrupted = make()
    leave_then(uninterrupted)
    state = json.loads(json.dumps(uninterrupted.state_dict()))
    expected = run(uninterrupted)
    assert len(expected) > 0
    if then == "load_state_dict":
        assert state == loaded
    resumed = make()
    resumed.load_state_dict(state)
    tail = run(resumed)
    assert len(tail) == len(expected)
    for x, y in zip(tail, expected):
        np.testing.assert_array_equal(x["id"], y["id"])


def test_a_mixtures_state_and_a_loaders_are_told_apart_when_loaded_crosswise(sources):
    # A Loader given a mixture's state said "state['seed'] is missing".
    root, _ = sources
    ls = loaders(root, names=("web", "code"))
    m = pqloader.mix(ls, [0.5, 0.5], seed=0)
    next(iter(m))
    with pytest.raises(pqloader.InvalidDataError, match="mixture's"):
        ls["web"].load_state_dict(m.state_dict())
    with pytest.raises(pqloader.InvalidDataError, match="this is a Loader's"):
        m.load_state_dict(ls["web"].state_dict())
    # Only a Loader's is called one: a mixture state of another version, or a mapping
    # of neither, is "not a pqloader.mix state" (an `or` mutant said "Loader's" of all).
    for other in ({**m.state_dict(), "version": 999}, {"kind": "x", "options": {}}, {}):
        with pytest.raises(pqloader.InvalidDataError, match=r"^not a pqloader.mix state \(version"):
            m.load_state_dict(other)


@pytest.mark.parametrize("field,value", [("epoch", 2**32), ("epoch", 2**64), ("epoch", True),
                                         ("batch", True), ("end", True)])
def test_a_mixture_state_out_of_range_is_refused_when_loaded(sources, field, value):
    # A mixture loaded epochs a Loader's state refuses (2^32 on: refused only at the first
    # batch; 2^64: the binding's TypeError) and bools as positions.
    root, _ = sources
    m = pqloader.mix(loaders(root, ("web", "code")), [1, 1], seed=0)
    next(iter(m))
    state = dict(m.state_dict(), **{field: value})
    fresh = pqloader.mix(loaders(root, ("web", "code")), [1, 1], seed=0)
    with pytest.raises(pqloader.InvalidDataError, match="mixture state"):
        fresh.load_state_dict(state)
    assert fresh.epoch == 0


def test_a_mixture_is_neither_pickled_nor_copied(sources):
    # copy.copy made a mixture sharing the original's Loaders (iterating both stopped
    # each other), and pickling failed on a Loader, advising IterableDataset (which
    # refuses mixtures), as a Loader's does.
    root, _ = sources
    m = pqloader.mix(loaders(root, ("web", "code")), [1, 1], seed=0)
    for make_copy in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="mixture cannot be pickled or copied.*iterate it directly"):
            make_copy(m)


def test_a_mixture_given_to_a_dataloader_says_to_iterate_it(sources):
    # README: a mixture needs no DataLoader worker processes. DataLoader took it for a
    # map-style dataset and indexed it: "'Mixture' object is not subscriptable" (a Loader
    # says what to do instead).
    torch = pytest.importorskip("torch")
    root, _ = sources
    m = pqloader.mix(loaders(root, ("web", "code")), [1, 1], seed=0)
    with pytest.raises(TypeError, match="mixture is iterable, not indexable.*iterate it directly"):
        m[0]
    with pytest.raises(TypeError, match="mixture is iterable, not indexable"):
        next(iter(torch.utils.data.DataLoader(m, batch_size=None)))


@pytest.mark.parametrize("num_epochs", [1, 2, None])
def test_a_source_error_comes_after_the_good_batches_before_it_with_any_num_epochs(tmp_path, num_epochs):
    # docs/reliability.md: the batches before a failing one are delivered. With several
    # epochs per iteration the stream took the rest of the epoch from the sources half way
    # (to start their next epoch early), and a decode error anywhere in that rest was
    # raised there, the good batches between it and the failing one dropped.
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    for i in range(4):
        pq.write_table(pa.table({"id": np.arange(i * 600, (i + 1) * 600),
                                 "x": np.random.default_rng(i).standard_normal(600)}),
                       a / f"f{i}.parquet", row_group_size=150, compression="gzip", use_dictionary=False)
        if i < 3:
            pq.write_table(pa.table({"id": 10**6 + np.arange(i * 600, (i + 1) * 600), "x": np.zeros(600)}),
                           b / f"f{i}.parquet", row_group_size=150)
    path = a / "f2.parquet"
    good = path.read_bytes()
    col = pq.ParquetFile(path).metadata.row_group(1).column(1)  # ids 1350..1499, column x
    mid = col.data_page_offset + col.total_compressed_size // 2
    bad = bytearray(good)
    bad[mid:mid + 16] = bytes(v ^ 0xFF for v in bad[mid:mid + 16])

    def make():
        return pqloader.mix({"a": pqloader.Loader(str(a), batch_size=64, num_workers=1),
                             "b": pqloader.Loader(str(b), batch_size=64, num_workers=1)},
                            [0.5, 0.5], num_epochs=num_epochs)

    full = run(make()) if num_epochs is not None else run(itertools.islice(make(), 200))
    first_bad = next(i for i, batch in enumerate(full) if ((batch["id"] >= 1350) & (batch["id"] < 1500)).any())
    path.write_bytes(bytes(bad))
    m, got = make(), []
    with pytest.raises(pqloader.InvalidDataError, match=r"f2\.parquet', row group 1, column 'x'"):
        for batch in m:
            got.append({k: np.array(v, copy=True) for k, v in batch.items()})
    assert len(got) == m.state_dict()["batch"] == first_bad
    for x, y in zip(got, full):
        np.testing.assert_array_equal(x["id"], y["id"])


def test_an_iteration_started_while_another_thread_closes_the_mixture_keeps_its_stream(sources):
    """close() stops the stream and closes the sources in one step: an iteration another
    thread starts meanwhile is not stopped (its sources were closed under its new stream:
    "mixture source 0 was started or stopped by another caller")."""
    root, _ = sources
    kw = dict(seed=4, batch_size=40)
    expected = [b["id"].tolist() for b in run(pqloader.mix(loaders(root), [0.5, 0.3, 0.2], **kw))]
    m = pqloader.mix(loaders(root), [0.5, 0.3, 0.2], **kw)
    result, taken, closed = {}, threading.Event(), threading.Event()

    def other_thread():
        try:
            ids = []
            for b in m:
                ids.append(b["id"].tolist())
                taken.set()
                closed.wait(60)
            result["ids"] = ids
        except BaseException as e:
            result["error"] = e
        taken.set()

    source = m._loaders[0]
    real_close = source.close

    def close():
        # The stream is stopped; another thread starts an iteration (it waits for the
        # close to finish, or its sources are closed under it).
        close.thread = threading.Thread(target=other_thread)
        close.thread.start()
        taken.wait(1.0)
        real_close()
        closed.set()

    source.close = close
    m.close()
    del source.close
    close.thread.join(60)
    assert not close.thread.is_alive()
    assert "error" not in result, result.get("error")
    assert result["ids"] == expected


def test_a_length_drawn_while_another_thread_loads_a_state_is_not_kept_for_the_new_seed(sources, monkeypatch):
    """An epoch's length is drawn off the GIL; a load_state_dict from another thread that
    adopts other seeds meanwhile cleared the memo, which then kept the old seeds' length
    and draws: the resumed epoch had the old length and drew its rows by the old seed."""
    root, _ = sources

    def make():  # seed=None everywhere: a state's seeds are adopted
        return pqloader.mix({n: pqloader.Loader(str(root / n), batch_size=64, shuffle=True)
                             for n in ("web", "code", "books")}, [0.5, 0.3, 0.2])

    state = make().state_dict()
    ref = make()
    ref.load_state_dict(state)
    expected = run(ref)
    m = make()
    real = _core.mix_epoch_length_kept

    def drawn(*args):  # another thread loads the state while this length is drawn
        monkeypatch.setattr(_core, "mix_epoch_length_kept", real)
        out = real(*args)
        other = threading.Thread(target=m.load_state_dict, args=(state,))
        other.start()
        other.join(60)
        return out

    monkeypatch.setattr(_core, "mix_epoch_length_kept", drawn)
    len(m)
    assert len(m) == len(expected)
    got = run(m)
    assert len(got) == len(expected)
    for x, y in zip(got, expected):
        np.testing.assert_array_equal(x["id"], y["id"])


def test_sources_whose_times_load_in_different_units_are_refused(tmp_path):
    # coerce_int96_timestamp_unit="us" on one source: its INT96 column loads as int64
    # microseconds, the other's as nanoseconds; both int64 (), so they were mixed into one
    # column, values 1000 times apart, silently.
    import datetime as dt
    ts = pa.array([dt.datetime(2020, 1, 1), dt.datetime(2021, 1, 1)], pa.timestamp("us"))
    pq.write_table(pa.table({"ts": ts}), tmp_path / "a.parquet", use_deprecated_int96_timestamps=True)
    us = pqloader.Loader(str(tmp_path), batch_size=1, coerce_int96_timestamp_unit="us")
    ns = pqloader.Loader(str(tmp_path), batch_size=1)
    with pytest.raises(ValueError, match=r"column 'ts' is timestamp\[us\] in 'a' but timestamp\[ns\] in 'b'"):
        pqloader.mix({"a": us, "b": ns}, weights=[1, 1], seed=0, batch_size=2)
    m = pqloader.mix({"a": us, "b": pqloader.Loader(str(tmp_path), batch_size=1, coerce_int96_timestamp_unit="us")},
                     weights=[1, 1], seed=0, batch_size=2)
    assert {int(x) for b in m for x in b["ts"]} == {v.value for v in ts}


# -- mutation gaps (tools/mutants by hand: _mix.py) -----------------------------------------
def test_batch_size_and_seed_default_to_the_first_sources(sources):
    # Without batch_size= or seed=, the mixture takes the first source's (a mutant taking
    # loaders[1]'s options survived); a lone source is a mixture too.
    root, _ = sources
    make = lambda: [pqloader.Loader(str(root / "web"), batch_size=32, seed=7),
                    pqloader.Loader(str(root / "code"), batch_size=48, seed=9)]
    got = run(pqloader.mix(make(), [1, 1], num_epochs=1))
    want = run(pqloader.mix(make(), [1, 1], seed=7, batch_size=32, num_epochs=1))
    assert len(got) == len(want) > 1 and len(got[0]["id"]) == 32
    assert all(np.array_equal(a["id"], b["id"]) for a, b in zip(got, want))
    solo = pqloader.mix([pqloader.Loader(str(root / "books"), batch_size=50, seed=3)], [1.0], num_epochs=1)
    batches = run(solo)
    assert [len(b["id"]) for b in batches] == [50] * 12
    assert sorted(np.concatenate([b["id"] for b in batches]).tolist()) == list(range(2_000_000, 2_000_600))


def test_a_batch_size_below_1_is_refused(sources):
    root, _ = sources
    for bad in (0, -1):
        with pytest.raises(ValueError, match="batch_size"):
            pqloader.mix(loaders(root), [1, 1, 1], batch_size=bad)


@pytest.mark.filterwarnings("ignore:mixture source:RuntimeWarning")  # (its source, once)
def test_endless_empty_epochs_raise_at_the_limit_naming_the_count(tmp_path):
    # The check against endless empty epochs raises at the 1000th in a row, counting
    # the ones before it (off-by-one mutants of its counter and its message survived).
    for name, n in (("web", 100), ("none", 1)):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"id": np.arange(n)}), tmp_path / name / "p.parquet")
    m = pqloader.mix([pqloader.Loader(str(tmp_path / "web"), batch_size=8, seed=1),
                      pqloader.Loader(str(tmp_path / "none"), batch_size=8, seed=1, filter="id < 0")],
                     [0.5, 0.5], seed=0, stop="first", num_epochs=None)
    with pytest.raises(pqloader.InvalidDataError,
                       match=r"mixture epoch 999 has no batch, nor had the 999 epochs before it"):
        next(iter(m))


def test_a_failed_iteration_keeps_the_loaded_end_in_the_state(sources):
    # An iteration refused before its first batch (here: past the last epoch) keeps the
    # end a loaded state gave for the next try, and state_dict() still holds it (a
    # mutant that dropped it survived).
    root, _ = sources
    make = lambda: pqloader.mix(loaders(root, names=("code", "books")), [1, 1], seed=3,
                                batch_size=200, num_epochs=1)
    m = make()
    m.set_epoch(2**32 - 1)
    it = iter(m)
    for _ in range(m.num_batches(2**32 - 1)):
        next(it)
    state = m.state_dict()
    assert state["end"] == 2**32 and state["epoch"] == 2**32 - 1, state
    other = make()
    other.load_state_dict(state)
    with pytest.raises(pqloader.InvalidDataError, match="the last one"):
        next(iter(other))
    assert other.state_dict() == state


def test_the_draw_limit_warning_points_at_the_callers_line(tmp_path):
    # The warning names the user's line that asked for the epoch's length, not
    # pqloader's own: a fixed stacklevel=3 named _mix.py's __len__ for len(mixture) and
    # its __iter__ for a for loop (and a mutant of it survived).
    for name, rows in (("a", range(100)), ("b", range(1000, 1050))):
        os.makedirs(tmp_path / name)
        pq.write_table(pa.table({"x": pa.array(list(rows), pa.int64())}), tmp_path / name / "p.parquet")
    make = lambda: pqloader.mix({n: pqloader.Loader(str(tmp_path / n), batch_size=10) for n in "ab"},
                                [1.0, 1e-9], seed=0, stop="last")
    for ask in (lambda m: m.num_batches(0), lambda m: m.epoch_samples(0), len, lambda m: next(iter(m))):
        with pytest.warns(RuntimeWarning, match="did not end within") as record:
            ask(make())
        assert {w.filename for w in record if "did not end" in str(w.message)} == {__file__}


# ---------------------------------------------------------------------------
# arguments of mix()
# ---------------------------------------------------------------------------


def _two(root):
    return [pqloader.Loader(str(root / n), batch_size=8, columns=["id"]) for n in ("code", "books")]


def test_source_names_equal_as_text_are_refused_not_merged(sources):
    # {1: a, "1": b} with weights {1: 1, "1": 3} gave both the weight 3, silently.
    root, _ = sources
    a, b = _two(root)
    with pytest.raises(ValueError, match="names must differ"):
        pqloader.mix({1: a, "1": b}, {1: 1, "1": 3})


def test_weight_keys_equal_as_text_are_refused_naming_the_sources(sources):
    # (a bare KeyError '1')
    root, _ = sources
    with pytest.raises(ValueError, match="weights must name each source once"):
        pqloader.mix(_two(root), {0: 1, "0": 2})


@pytest.mark.parametrize("drop_last", ["False", 0.0, None])
def test_drop_last_must_be_a_bool(sources, drop_last):
    # bool("False") is True: the last partial batch was dropped, silently.
    root, _ = sources
    with pytest.raises(TypeError, match="drop_last must be True or False"):
        pqloader.mix(_two(root), [1, 1], drop_last=drop_last)
    m = pqloader.mix(_two(root), [1, 1], drop_last=np.bool_(False), samples_per_epoch=13, seed=1)
    assert [len(b["id"]) for b in m] == [8, 5]


@pytest.mark.parametrize("column,exc", [(b"src", TypeError), (3, TypeError), ("", ValueError),
                                        ("\ud800", ValueError)])
def test_a_source_column_that_is_no_name_is_refused_when_mixing(sources, column, exc):
    # bytes/int: a bare std::bad_cast at the first batch; "": no source column at all.
    root, _ = sources
    with pytest.raises(exc, match="source_column"):
        pqloader.mix(_two(root), [1, 1], source_column=column)


def test_states_take_numpy_counts_and_tuples_and_name_a_float_position(tmp_path):
    # A state rebuilt with NumPy (np.int64 counts) or holding tuples for lists resumes as
    # the state itself; a Loader's was refused ("must be an int ... got int64 0"), a
    # mixture's "position (np.int64(0), np.int64(3)) is not one of this mixture".
    import copy

    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"x": np.arange(200, dtype=np.int64)}), tmp_path / "a.parquet", row_group_size=50)

    def loader(seed):
        return pqloader.Loader(str(tmp_path), batch_size=8, shuffle=True, seed=seed, num_epochs=2)

    def rest(make, state):
        it = make()
        it.load_state_dict(state)
        out = np.concatenate([b["x"] for b in it])
        it.close()
        return out

    def mixture():
        return pqloader.mix({"a": loader(1), "b": loader(2)}, [1, 3], seed=3)

    for make in (lambda: loader(1), mixture):
        first = make()
        it = iter(first)
        for _ in range(3):
            next(it)
        state = first.state_dict()
        first.close()
        expected = rest(make, state)
        again = copy.deepcopy(state)
        for key in ("epoch", "batch", "iteration_end", "end", "seed"):
            if state.get(key) is not None:
                again[key] = np.int64(state[key])
        if "options" in state:
            again["options"]["batch_size"] = np.int64(state["options"]["batch_size"])
        else:
            again["config"]["weights"] = tuple(state["config"]["weights"])
            again["config"]["source_fingerprints"] = tuple(state["config"]["source_fingerprints"])
        np.testing.assert_array_equal(rest(make, again), expected)
        with pytest.raises(pqloader.InvalidDataError, match=r"\['batch'\] must be an int.*got float 3.0"):
            rest(make, dict(state, batch=3.0))
