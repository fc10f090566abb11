"""PyTorch output: zero-copy tensors, device staging, checkpoints, DataLoader workers, fork."""

from __future__ import annotations

import gc
import io
import multiprocessing
import os
import pickle
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.utils.data  # noqa: E402

import pqloader  # noqa: E402
import pqloader._iteration  # noqa: E402
import pqloader.torch  # noqa: E402
from conftest import (  # noqa: E402
    assert_batch_streams_equal,
    ids_of,
    run_with_timeout,
    subprocess_env,
    write_dataset,
)
from test_values import all_types_table  # noqa: E402

LAYOUT = [[120, 80], [37], [200, 3, 60], [100]]  # 600 rows, 7 row groups
N = sum(map(sum, LAYOUT))
BS = 32
PER_EPOCH = -(-N // BS)
CUDA = torch.cuda.is_available()


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch")
    write_dataset(root, LAYOUT)
    return str(root)


def as_numpy(batch: dict) -> dict:
    """A torch batch back as NumPy (a copy for CUDA tensors), lists unchanged."""
    return {k: v.cpu().numpy() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def kw(**over):
    base = dict(batch_size=BS, shuffle=True, seed=11, num_epochs=2, shuffle_window=2)
    base.update(over)
    return base


# ---------------------------------------------------------------------------
# zero-copy tensors
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", [None, pytest.param("cuda", marks=pytest.mark.skipif(
    not CUDA, reason="needs a CUDA device"))])
def test_torch_batches_equal_numpy_batches_for_every_supported_type(tmp_path, device):
    # On CUDA, the batch's columns are packed into one buffer and handed out as views of
    # its device copy (every dtype and 2-D shape through that layout).
    write_dataset(tmp_path, [[50, 13], [40]], make_table=all_types_table)
    ref = list(pqloader.Loader(str(tmp_path), batch_size=17, shuffle=True, seed=3))
    got = list(pqloader.Loader(str(tmp_path), batch_size=17, shuffle=True, seed=3, output="torch",
                               device=device))
    for batch in got:
        for name, value in batch.items():
            if isinstance(ref[0][name], np.ndarray):
                assert isinstance(value, torch.Tensor) and value.device.type == (device or "cpu"), name
            else:
                assert isinstance(value, list), name
    assert_batch_streams_equal([as_numpy(b) for b in got], ref)


def test_torch_tensors_share_the_engine_buffer_and_keep_it_alive(ds):
    batch = next(iter(pqloader.Loader(ds, batch_size=BS, columns=["id", "x", "v"])))
    expected = {k: v.copy() for k, v in batch.items()}
    pointers = {k: v.__array_interface__["data"][0] for k, v in batch.items()}
    tensors = pqloader.torch.batch_to_torch(batch)
    for name, t in tensors.items():
        assert t.data_ptr() == pointers[name], f"{name} was copied"
        assert tuple(t.shape) == expected[name].shape
    del batch
    gc.collect()
    for _ in range(3):  # churn the allocator; freed memory would be overwritten
        list(pqloader.Loader(ds, batch_size=BS, columns=["id", "x", "v"]))
    for name, t in tensors.items():
        np.testing.assert_array_equal(t.numpy(), expected[name], err_msg=name)


def test_numpy_users_never_import_torch(ds):
    code = textwrap.dedent(f"""
        import sys, pqloader
        for batch in pqloader.Loader({ds!r}, batch_size=64, shuffle=True, seed=1):
            pass
        pqloader.Loader({ds!r}).state_dict()
        assert "torch" not in sys.modules, "importing or using pqloader imported torch"
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr


def test_torch_output_without_torch_installed_is_a_clear_error(ds):
    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None  # what Python sees when torch is not installed
        import pqloader
        list(pqloader.Loader({ds!r}))  # NumPy output still works
        try:
            pqloader.Loader({ds!r}, output="torch")
        except ImportError as e:
            print("ERROR:", e)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr
    assert "ERROR:" in proc.stdout and "pip install torch" in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    "options,exc,word",
    [
        (dict(output="jax"), ValueError, "output"),
        (dict(device="cpu"), ValueError, "output='torch'"),
        (dict(pin_memory=True), ValueError, "output='torch'"),
        (dict(output="torch", device_prefetch=0), ValueError, "device_prefetch"),
        # torch's own errors named neither the argument nor, for "gpu", the right kind
        (dict(output="torch", device="gpu"), ValueError, "device='gpu' is not a torch device"),
        (dict(output="torch", device="cuda:x"), ValueError, "device='cuda:x'"),
        (dict(output="torch", device=1.5), TypeError, "device must be"),
        (dict(output="torch", device=True), TypeError, "device must be"),
    ],
)
def test_invalid_output_options_are_refused(ds, options, exc, word):
    with pytest.raises(exc, match=word):
        pqloader.Loader(ds, **options)


# ---------------------------------------------------------------------------
# pinned memory and device staging
# ---------------------------------------------------------------------------


@pytest.mark.skipif(CUDA, reason="checks the fallback of a machine without CUDA")
def test_cuda_device_without_cuda_is_a_clear_error(ds):
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        pqloader.Loader(ds, output="torch", device="cuda")


@pytest.mark.skipif(CUDA, reason="checks the fallback of a machine without CUDA")
def test_pin_memory_without_cuda_warns_once_and_yields_cpu_tensors(ds):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = pqloader.Loader(ds, **kw(output="torch", pin_memory=True))
        got = list(loader)
    pin_warnings = [w for w in caught if "pin_memory" in str(w.message)]
    assert len(pin_warnings) == 1, [str(w.message) for w in caught]
    assert all(not b["id"].is_pinned() and b["id"].device.type == "cpu" for b in got)
    assert_batch_streams_equal([as_numpy(b) for b in got], list(pqloader.Loader(ds, **kw())))


@pytest.mark.parametrize("depth", [1, 3])
def test_device_staging_runs_exactly_device_prefetch_batches_ahead(ds, depth):
    loader = pqloader.Loader(ds, **kw(output="torch", device="cpu", device_prefetch=depth, num_epochs=1))
    it = iter(loader)
    for k in range(1, 6):
        next(it)
        assert loader.state_dict()["batch"] == k  # the position counts handed-out batches only
        assert loader.stats()["batches"] == k  # and so does stats() ...
        assert loader._engine.stats()["batches"] == k + depth  # ... while the engine is `depth` ahead
    rest = list(it)
    assert 5 + len(rest) == PER_EPOCH
    assert loader.stats()["batches"] == PER_EPOCH


@pytest.mark.parametrize("depth", [1, 3])
def test_an_error_after_staged_batches_is_raised_after_them(ds, depth):
    # The batches before an error are delivered (docs/reliability.md), staged or not: the
    # staged ones were dropped, and the error raised `depth` batches early.
    def fail_at_5(batch):
        if fail_at_5.seen == 5:
            raise ValueError("batch_transform failed")
        fail_at_5.seen += 1
        return batch

    def run(**options):
        fail_at_5.seen = 0
        loader = pqloader.Loader(ds, **kw(output="torch", batch_transform=fail_at_5, **options))
        got = []
        with pytest.raises(ValueError, match="batch_transform failed"):
            for batch in loader:
                got.append(as_numpy(batch))
        return got, loader.state_dict()["batch"]

    ref, position = run()
    assert len(ref) == position == 5
    got, staged_position = run(device="cpu", device_prefetch=depth)
    assert staged_position == position
    assert_batch_streams_equal(got, ref)


@pytest.mark.parametrize("k", [0, 3, PER_EPOCH - 1, PER_EPOCH, PER_EPOCH + 2])
def test_resume_from_a_state_taken_while_batches_are_staged_ahead(ds, k):
    ref = [as_numpy(b) for b in pqloader.Loader(ds, **kw(output="torch"))]
    loader = pqloader.Loader(ds, **kw(output="torch", device="cpu", device_prefetch=3))
    it = iter(loader)
    head = [as_numpy(next(it)) for _ in range(k)]
    assert_batch_streams_equal(head, ref[:k])
    buf = io.BytesIO()
    torch.save({"loader": loader.state_dict(), "step": k}, buf)
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)  # plain data: loads under the safe default
    fresh = pqloader.Loader(ds, **kw(output="torch", device="cpu", device_prefetch=3))
    fresh.load_state_dict(ckpt["loader"])
    rest = [as_numpy(b) for b in fresh]
    assert len(head) + len(rest) == len(ref) == 2 * PER_EPOCH
    assert_batch_streams_equal(rest, ref[k:])


def test_loader_is_a_torch_distributed_checkpoint_stateful(ds):
    from torch.distributed.checkpoint.stateful import Stateful

    assert isinstance(pqloader.Loader(ds, output="torch"), Stateful)
    assert isinstance(pqloader.Loader(ds), Stateful)


def test_a_batch_packed_into_one_buffer_unpacks_to_equal_aligned_views(tmp_path):
    # The layout of the one host-to-device copy per batch, checked on the CPU: every
    # supported type, sizes that are not multiples of 8 bytes, 2-D columns, runs of
    # columns of one dtype and shape, lists kept; one layout serves every batch of its kind.
    from pqloader._torch import Packing

    write_dataset(tmp_path, [[23, 23]], make_table=all_types_table)
    first, second = list(pqloader.Loader(str(tmp_path), batch_size=23))
    arrays = {k: v for k, v in first.items() if isinstance(v, np.ndarray)}
    assert len({v.itemsize for v in arrays.values()}) > 1 and any(v.ndim > 1 for v in arrays.values())
    assert len(arrays) > len({(v.dtype, v.shape) for v in arrays.values()})  # runs to unbind
    assert Packing.signature(first) == Packing.signature(second)
    packing = Packing(first)
    assert sorted(k for names, *_ in packing.runs for k in names) == sorted(arrays)
    assert packing.nbytes == sum(v.nbytes for v in arrays.values())
    for batch in (first, second):
        buffer = packing.pack(batch, pin_memory=False)
        assert buffer.numel() == packing.nbytes
        copy = buffer.clone()  # as the device's copy would be
        got = packing.unpack(copy, batch)
        assert list(got) == list(batch)
        for name, value in got.items():
            if name not in arrays:
                assert value is batch[name]
                continue
            assert value.numpy().dtype == arrays[name].dtype and value.shape == arrays[name].shape, name
            assert value.untyped_storage().data_ptr() == copy.data_ptr(), f"{name} is not a view"
            assert (value.data_ptr() - copy.data_ptr()) % value.element_size() == 0, f"{name} misaligned"
        assert_batch_streams_equal([as_numpy(got)], [batch])
    assert not Packing({"s": ["a"]}).runs


def test_a_packing_is_made_per_kind_of_batch():
    from pqloader._torch import Packing

    # A batch whose arrays differ from the last ones in dtype, shape or name (a shorter
    # last batch, another column set) gets its own layout, never a wrong one.
    base = {"a": np.arange(6, dtype=np.float32), "b": np.arange(6, dtype=np.int64), "s": ["x"] * 6}
    kinds = [base, {**base, "a": np.arange(4, dtype=np.float32)}, {**base, "a": np.arange(6, dtype=np.float64)},
             {"c" if k == "a" else k: v for k, v in base.items()}, {**base, "a": np.zeros((), np.float32)}]
    assert len({Packing.signature(b) for b in kinds}) == len(kinds)
    for batch in kinds:
        packing = Packing(batch)
        got = packing.unpack(packing.pack(batch, pin_memory=False), batch)
        for k, v in batch.items():
            if isinstance(v, np.ndarray):
                assert got[k].shape == v.shape and (got[k].numpy() == v).all(), k
            else:
                assert got[k] is v


def test_read_only_arrays_become_tensors_of_their_own_without_a_warning():
    # (a tensor is writable: over a read-only array, an in-place op wrote into it)
    array = np.arange(5, dtype=np.int32)
    array.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tensor = pqloader.torch.batch_to_torch({"a": array})["a"]
    assert tensor.data_ptr() != array.__array_interface__["data"][0]
    tensor += 1
    assert array.tolist() == [0, 1, 2, 3, 4] and tensor.tolist() == [1, 2, 3, 4, 5]


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("pin", [True, False])
def test_cuda_batches_equal_cpu_batches_and_are_ready_on_the_current_stream(ds, pin):
    ref = list(pqloader.Loader(ds, **kw()))
    loader = pqloader.Loader(ds, **kw(output="torch", device="cuda", pin_memory=pin, device_prefetch=2))
    got = []
    for batch in loader:
        assert batch["id"].is_cuda and batch["x"].is_cuda
        # Compute on the current stream right away: it must see the copied values.
        got.append({k: (v * 1).cpu().numpy() if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
    torch.cuda.synchronize()
    assert_batch_streams_equal(got, ref)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_stacked_batches_equal_cpu_stacked_batches(ds):
    from pqloader import transforms as T

    stacked = dict(transforms={"k": [T.Cast("float32")]}, stack={"xk": ["x", "k"], "vv": ["v"]})
    ref = list(pqloader.Loader(ds, **kw(**stacked)))
    got = []
    for batch in pqloader.Loader(ds, **kw(output="torch", device="cuda", **stacked)):
        assert batch["xk"].is_cuda and batch["xk"].shape[1:] == (2,) and batch["vv"].shape[1:] == (1, 3)
        got.append({k: (v * 1).cpu().numpy() if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
    torch.cuda.synchronize()
    assert_batch_streams_equal(got, ref)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("pin", [True, False])
def test_cuda_consumer_never_reads_a_batch_before_its_copy_is_complete(ds, pin, monkeypatch):
    # Each batch's copies are queued behind ~10 ms of GPU work on the loader's side stream,
    # and the consumer computes at once on its own (non-default) stream: without the
    # event wait, it would read the device memory before the copy has landed.
    from pqloader._torch import TorchOutput

    stage = TorchOutput._stage

    def slow_stage(self, batch):
        with torch.cuda.stream(self.stream):
            torch.cuda._sleep(20_000_000)
        return stage(self, batch)

    monkeypatch.setattr(TorchOutput, "_stage", slow_stage)
    ref = list(pqloader.Loader(ds, **kw()))
    consumer = torch.cuda.Stream()
    got = []
    with torch.cuda.stream(consumer):
        loader = pqloader.Loader(ds, **kw(output="torch", device="cuda", pin_memory=pin))
        for batch in loader:
            # A kernel on the consumer's stream reads each tensor at once.
            copies = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
            got.append(as_numpy(copies))
    torch.cuda.synchronize()
    assert_batch_streams_equal(got, ref)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("k", [0, 3, PER_EPOCH + 2])
def test_cuda_resume_from_a_state_taken_while_batches_are_staged_on_the_device(ds, k):
    ref = [as_numpy(b) for b in pqloader.Loader(ds, **kw(output="torch"))]
    loader = pqloader.Loader(ds, **kw(output="torch", device="cuda", device_prefetch=3))
    it = iter(loader)
    head = [as_numpy(next(it)) for _ in range(k)]
    state = loader.state_dict()
    del it, loader
    fresh = pqloader.Loader(ds, **kw(output="torch", device="cuda:0", device_prefetch=3))
    fresh.load_state_dict(state)
    rest = [as_numpy(b) for b in fresh]
    assert len(head) + len(rest) == len(ref) == 2 * PER_EPOCH
    assert_batch_streams_equal(head + rest, ref)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "torch.device"])
def test_cuda_batches_land_on_the_requested_device(ds, device):
    device = torch.device("cuda", 0) if device == "torch.device" else device
    batch = next(iter(pqloader.Loader(ds, **kw(output="torch", device=device))))
    expected = torch.device("cuda", torch.cuda.current_device() if device == "cuda" else 0)
    assert {v.device for v in batch.values() if isinstance(v, torch.Tensor)} == {expected}


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_tensors_a_batch_transform_returns_land_on_the_device_too(ds):
    # Packing takes NumPy arrays only: a batch_transform's torch tensors stayed on the host.
    def to_tensors(batch):
        return {**batch, "x2": torch.from_numpy(batch["x"]) * 2, "h": torch.ones(len(batch["id"]), dtype=torch.bfloat16)}

    ref = list(pqloader.Loader(ds, **kw(output="torch", device="cpu", batch_transform=to_tensors)))
    got = []
    for batch in pqloader.Loader(ds, **kw(output="torch", device="cuda", batch_transform=to_tensors)):
        assert batch["x2"].is_cuda and batch["h"].is_cuda and batch["id"].is_cuda
        got.append({k: (v * 1).cpu() if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
    torch.cuda.synchronize()
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert all(torch.equal(a[k], b[k]) if isinstance(b[k], torch.Tensor) else a[k] == b[k] for k in b)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_a_cuda_device_torch_does_not_see_is_refused_naming_it(ds):
    missing = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ValueError, match=f"device='{missing}' but torch sees"):
        pqloader.Loader(ds, output="torch", device=missing)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_loader_dropped_mid_epoch_frees_its_device_memory(ds):
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()

    def drop_mid_epoch():
        loader = pqloader.Loader(ds, **kw(output="torch", device="cuda", device_prefetch=3))
        it = iter(loader)
        for _ in range(4):
            next(it)
        assert torch.cuda.memory_allocated() > before  # the staged batches
        del it, loader
        gc.collect()

    run_with_timeout(drop_mid_epoch, timeout=60)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_cuda_iterable_dataset_through_pinning_dataloader_workers(ds):
    loader = pqloader.Loader(ds, **kw(num_epochs=1))
    dl = torch.utils.data.DataLoader(pqloader.torch.IterableDataset(loader), batch_size=None,
                                     num_workers=2, pin_memory=True)
    got = []
    for batch in run_with_timeout(lambda: list(dl), timeout=60):
        assert batch["x"].is_pinned()
        got.append({k: v.to("cuda", non_blocking=True) if isinstance(v, torch.Tensor) else v
                    for k, v in batch.items()})
    torch.cuda.synchronize()
    assert sorted(ids_of([as_numpy(b) for b in got])) == list(range(N))


# ---------------------------------------------------------------------------
# the data-stall metric
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_stats_count_time_inside_next_as_wait_and_time_outside_only_as_wall(ds, output, monkeypatch):
    # The consumer's "compute" advances the loader's clock by a whole hour instead of
    # sleeping: it must appear in wall_seconds and never in wait_seconds.
    hour = 3600.0
    offset = [0.0]
    monkeypatch.setattr(pqloader._iteration, "clock", lambda: time.perf_counter() + offset[0])
    loader = pqloader.Loader(ds, batch_size=BS, output=output, _debug_max_delay_us=500)
    count = 0
    for _ in loader:
        offset[0] += hour  # "compute": time outside next(), so not a stall
        count += 1
    st = loader.stats()
    assert st["batches"] == count == PER_EPOCH
    assert 0 < st["engine_wait_seconds"] <= st["wait_seconds"]
    assert st["wait_seconds"] < hour, "time spent outside next() was counted as waiting"
    assert st["wall_seconds"] >= count * hour, "time spent outside next() is missing from wall_seconds"
    assert st["wait_fraction"] == st["wait_seconds"] / st["wall_seconds"]


# ---------------------------------------------------------------------------
# torch.utils.data.DataLoader
# ---------------------------------------------------------------------------


@pytest.fixture
def fast_worker_shutdown(monkeypatch):
    """DataLoader workers whose dataset raised exit only at their next status check
    (every 5 s by default); check often so these tests stay fast."""
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.1)
    monkeypatch.setattr(torch.utils.data._utils.worker, "MP_STATUS_CHECK_INTERVAL", 0.1)


def _raises_from_dataloader(dl, exc, match):
    it = iter(dl)
    with pytest.raises(exc, match=match):
        run_with_timeout(lambda: list(it), timeout=60)
    del it  # shuts its workers down now, while the check interval is short
    gc.collect()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_over_a_plain_loader_is_refused_with_a_clear_error(ds, num_workers, fast_worker_shutdown):
    dl = torch.utils.data.DataLoader(pqloader.Loader(ds, batch_size=BS), batch_size=None,
                                     num_workers=num_workers)
    _raises_from_dataloader(dl, TypeError, "IterableDataset")


class _UserDataset(torch.utils.data.IterableDataset):
    """What a user might write: a plain Loader inside their own IterableDataset."""

    def __init__(self, loader):
        self.loader = loader

    def __iter__(self):
        return iter(self.loader)


def test_plain_loader_inside_several_dataloader_workers_is_refused(ds, fast_worker_shutdown):
    dl = torch.utils.data.DataLoader(_UserDataset(pqloader.Loader(ds, batch_size=BS)), batch_size=None,
                                     num_workers=2)
    _raises_from_dataloader(dl, RuntimeError, "every worker")


def test_a_mixture_inside_several_dataloader_workers_is_refused(ds, fast_worker_shutdown):
    # Each worker would iterate its copy of the whole mixture: every batch twice.
    m = pqloader.mix([pqloader.Loader(ds, batch_size=BS, seed=1), pqloader.Loader(ds, batch_size=BS, seed=2)],
                     [1, 1])
    dl = torch.utils.data.DataLoader(_UserDataset(m), batch_size=None, num_workers=2)
    _raises_from_dataloader(dl, RuntimeError, "mixture iterated in DataLoader worker")


def test_plain_loader_inside_one_dataloader_worker_yields_its_stream(ds):
    dl = torch.utils.data.DataLoader(_UserDataset(pqloader.Loader(ds, **kw(num_epochs=1))),
                                     batch_size=None, num_workers=1)
    got = [{k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in b.items()}
           for b in run_with_timeout(lambda: list(dl), timeout=60)]
    assert_batch_streams_equal(got, list(pqloader.Loader(ds, **kw(num_epochs=1))))


def _interleave(streams):
    out = []
    for group in zip(*streams):
        out.extend(group)
    assert all(len(s) == len(streams[0]) for s in streams)
    return out


@pytest.mark.parametrize("rank,world_size", [(0, 1), (1, 2)])
def test_iterable_dataset_shards_across_dataloader_workers(ds, rank, world_size):
    workers = 2
    loader = pqloader.Loader(ds, **kw(num_epochs=1, rank=rank, world_size=world_size, shard_policy="pad"))
    dataset = pqloader.torch.IterableDataset(loader)
    dl = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=workers)
    epochs = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        epochs.append([{k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in b.items()}
                       for b in run_with_timeout(lambda: list(dl), timeout=60)])
    for epoch, got in enumerate(epochs):
        shards = []
        for w in range(workers):
            shard = pqloader.Loader(ds, **kw(num_epochs=1, rank=rank * workers + w,
                                             world_size=world_size * workers, shard_policy="pad"))
            shard.load_state_dict({**shard.state_dict(), "epoch": epoch, "batch": 0})
            shards.append(list(shard))
        assert_batch_streams_equal(got, _interleave(shards))  # DataLoader takes workers in turn
        if world_size == 1:  # the workers together read every row once, plus the pad repeats
            padded = pqloader.Loader(ds, **kw(rank=0, world_size=workers, shard_policy="pad")).shard_info["padded"]
            assert sorted(set(ids_of(got))) == list(range(N))
            assert len(ids_of(got)) == N + padded
    assert ids_of(epochs[0]) != ids_of(epochs[1]), "set_epoch did not change the order"


@pytest.mark.parametrize("workers", [0, 1, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_dataloader_len_is_the_batches_an_iteration_hands_out(ds, workers, drop_last):
    # 600 rows: 3 workers' shards of 200 rows hold 7 batches each (the last partial), 21
    # in all, where the loader alone has 19 (without drop_last).
    loader = pqloader.Loader(ds, **kw(num_epochs=1, drop_last=drop_last))
    dataset = pqloader.torch.IterableDataset(loader)
    dl = pqloader.torch.DataLoader(dataset, num_workers=workers)
    assert len(dataset) == len(loader)
    for epoch in range(2):
        dataset.set_epoch(epoch)
        n = len(dl)
        assert n == len(run_with_timeout(lambda: list(dl), timeout=60))
    assert n == (len(loader) if workers <= 1 else 3 * (200 // BS + (not drop_last and 200 % BS > 0)))
    pickle.loads(pickle.dumps(dataset))  # (as spawned workers get it: len()'s loader is left out)
    two = pqloader.torch.IterableDataset(pqloader.Loader(ds, **kw(num_epochs=2, drop_last=drop_last)))
    assert len(pqloader.torch.DataLoader(two)) == 2 * len(loader) == len(list(pqloader.torch.DataLoader(two)))
    forever = pqloader.torch.DataLoader(pqloader.torch.IterableDataset(pqloader.Loader(ds, **kw(num_epochs=None))))
    with pytest.raises(TypeError, match="num_epochs=None"):
        len(forever)


def test_dataloader_len_of_packed_workers_follows_the_epoch(tmp_path):
    # Packed shards equalise their blocks per epoch: the count may differ between epochs.
    import pyarrow as pa
    import pyarrow.parquet as pq
    lengths = np.random.default_rng(0).integers(1, 60, 300)
    docs = [[i] * int(n) for i, n in enumerate(lengths)]
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))}), tmp_path / "t.parquet",
                   row_group_size=20)
    loader = pqloader.Loader(str(tmp_path), batch_size=2, shuffle=True, seed=1, shuffle_window=1,
                             pack=pqloader.Pack("tokens", seq_len=16, eos=0))
    dataset = pqloader.torch.IterableDataset(loader)
    dl = pqloader.torch.DataLoader(dataset, num_workers=2)
    counts = []
    for epoch in range(3):
        dataset.set_epoch(epoch)
        counts.append(len(dl))
        assert counts[-1] == len(run_with_timeout(lambda: list(dl), timeout=60))
    assert len(set(counts)) > 1, counts  # (else this data would not test the epochs apart)


def _packed_len_ds(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    lengths = np.random.default_rng(0).integers(1, 60, 300)
    docs = [[i] * int(n) for i, n in enumerate(lengths)]
    pq.write_table(pa.table({"tokens": pa.array(docs, pa.list_(pa.int32()))}), tmp_path / "t.parquet",
                   row_group_size=20)
    return str(tmp_path), dict(batch_size=2, shuffle=True, shuffle_window=1,
                               pack=pqloader.Pack("tokens", seq_len=16, eos=0))


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_dataloader_len_of_packed_loaders_follows_the_epoch_without_set_epoch(tmp_path, workers, persistent):
    # Without set_epoch each iteration runs the next epoch: len() counted the epoch of
    # the last set_epoch (or the loader's first) instead.
    root, kw = _packed_len_ds(tmp_path)
    loader = pqloader.Loader(root, seed=1, rank=0, world_size=2 if workers == 0 else 1, **kw)
    dl = pqloader.torch.DataLoader(pqloader.torch.IterableDataset(loader), num_workers=workers,
                                   persistent_workers=persistent)
    counts = []
    for _ in range(3):
        counts.append(len(dl))
        assert counts[-1] == len(run_with_timeout(lambda: list(dl), timeout=60))
    assert len(set(counts)) > 1, counts  # (else this data would not test the epochs apart)


def test_dataloader_len_of_a_packed_loader_follows_a_seed_adopted_from_a_state(tmp_path):
    # A loader built with seed=None adopts a loaded state's seed: len() kept counting
    # the blocks of the drawn seed's order (its loader and counts were kept).
    root, kw = _packed_len_ds(tmp_path)
    state = pqloader.Loader(root, seed=1, **kw).state_dict()
    dl = pqloader.torch.DataLoader(pqloader.torch.IterableDataset(pqloader.Loader(root, seed=None, **kw)),
                                   num_workers=2)
    while len(dl) == 292:  # (the drawn seed's count must differ from seed 1's)
        dl = pqloader.torch.DataLoader(pqloader.torch.IterableDataset(pqloader.Loader(root, seed=None, **kw)),
                                       num_workers=2)
    dl.load_state_dict(state)
    assert len(dl) == len(run_with_timeout(lambda: list(dl), timeout=60)) == 292


def test_iterable_dataset_works_with_spawned_workers_and_they_exit_cleanly(ds):
    code = textwrap.dedent(f"""
        import torch.utils.data, pqloader, pqloader.torch
        if __name__ == "__main__":
            loader = pqloader.Loader({ds!r}, batch_size={BS}, shuffle=True, seed=3)
            dl = torch.utils.data.DataLoader(pqloader.torch.IterableDataset(loader), batch_size=None,
                                             num_workers=2, multiprocessing_context="spawn")
            ids = sorted(int(i) for b in dl for i in b["id"])
            print("rows", len(ids), "complete", ids == list(range({N})))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr
    assert f"rows {N} complete True" in proc.stdout, proc.stdout + proc.stderr
    # Engines released before the extension's teardown (nanobind reports leaked instances).
    # Not multiprocessing's resource_tracker, which may find the DataLoader's own semaphore
    # already unlinked when spawned workers exit under load ("1 leaked semaphore objects").
    assert "nanobind: leaked" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("plain", [False, True])
def test_a_lambda_batch_transform_under_spawn_workers_is_refused_naming_the_option(ds, plain):
    # Pickle's error named no option ("Can't pickle <function <lambda>>: attribute lookup
    # <lambda> on __main__ failed"). Raised in this process, as the first worker starts.
    import copy
    dataset = pqloader.torch.IterableDataset(pqloader.Loader(ds, **kw(batch_transform=lambda b: b)))
    make = torch.utils.data.DataLoader if plain else pqloader.torch.DataLoader
    dl = make(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    with pytest.raises(pickle.PicklingError, match=r"batch_transform=\S*<lambda> cannot be sent to the "
                       r"DataLoader's worker processes.*define it at module level"):
        run_with_timeout(lambda: next(iter(dl)), timeout=120)
    copy.deepcopy(dataset)  # a copy made in this process needs no pickling: not refused


class _Tagged(pqloader.Loader):
    """A Loader subclass that adds a column (module level: spawned workers import it)."""

    def __iter__(self):
        for batch in super().__iter__():
            batch["tag"] = 1
            yield batch


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_iterable_dataset_workers_build_the_wrapped_loaders_class(ds, context):
    # The workers rebuilt a plain Loader: a subclass's behaviour held without workers and
    # was silently lost with them.
    dataset = pqloader.torch.IterableDataset(_Tagged(ds, **kw(num_epochs=1)))
    for workers in (0, 2):
        dl = pqloader.torch.DataLoader(dataset, num_workers=workers,
                                       multiprocessing_context=context if workers else None)
        batches = list(dl)
        assert batches and all(b["tag"] == 1 for b in batches), workers


def test_iterable_dataset_resumes_a_state_with_mapping_proxy_options_under_forkserver(ds):
    # load_state_dict kept the state's options as given: a read-only MappingProxy (a
    # frozen config) did not pickle, and spawn/forkserver workers never started ("cannot
    # pickle 'mappingproxy' object"). The resumed stream is fork's, and the rest of the epoch.
    import types
    whole = pqloader.torch.DataLoader(pqloader.torch.IterableDataset(pqloader.Loader(ds, **kw(num_epochs=1))),
                                      num_workers=2, multiprocessing_context="fork")
    it = iter(whole)
    head = [next(it) for _ in range(5)]
    state = whole.state_dict()
    rest = ids_of(list(it))
    frozen = dict(state, options=types.MappingProxyType(state["options"]))
    for context in ("fork", "forkserver"):
        dataset = pqloader.torch.IterableDataset(pqloader.Loader(ds, **kw(num_epochs=1)))
        dl = pqloader.torch.DataLoader(dataset, num_workers=2, multiprocessing_context=context)
        dl.load_state_dict(frozen)
        assert ids_of(run_with_timeout(lambda: list(dl), timeout=120)) == rest, context
    assert sorted(ids_of(head) + rest) == list(range(N))


@pytest.mark.parametrize("context", ["fork", "forkserver"])
def test_iterable_dataset_workers_refuse_data_changed_since_the_loader_was_wrapped(tmp_path, context):
    # Each worker rebuilds the loader from its sources: one that listed the directory anew
    # after a file was deleted silently read the others only (the loader itself says the
    # file is gone). The error reaches the parent from the worker, naming the file.
    write_dataset(tmp_path, LAYOUT)
    dataset = pqloader.torch.IterableDataset(pqloader.Loader(str(tmp_path), **kw(num_epochs=1)))
    os.remove(tmp_path / "part-002.parquet")
    dl = pqloader.torch.DataLoader(dataset, num_workers=2, multiprocessing_context=context)
    with pytest.raises(pqloader.DataNotFoundError, match=r"part-002\.parquet' is gone"):
        run_with_timeout(lambda: list(dl), timeout=120)
    with pytest.raises(pqloader.DataNotFoundError, match=r"part-002\.parquet' is gone"):
        len(dl)  # (counted in this process, by a loader of worker 0's shard)


def test_iterable_dataset_without_workers_iterates_the_loader_itself(ds):
    loader = pqloader.Loader(ds, **kw(num_epochs=1, output="torch"))
    dataset = pqloader.torch.IterableDataset(loader)
    dl = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=0)
    it = iter(dl)
    head = [as_numpy(next(it)) for _ in range(4)]
    state = dataset.state_dict()
    assert state == loader.state_dict() and state["batch"] == 4
    ref = list(pqloader.Loader(ds, **kw(num_epochs=1)))
    assert_batch_streams_equal(head + [as_numpy(b) for b in it], ref)


@pytest.mark.parametrize("plain", [True, False])
def test_iterable_dataset_set_epoch_of_a_loop_left_early_starts_it_over_without_workers(ds, plain):
    # set_epoch(e) after a loop of epoch e was left early: the next loop is epoch e whole,
    # as with workers (it was the rest of the loop left early: its first batches lost).
    # A state loaded for that epoch still stays.
    dataset = pqloader.torch.IterableDataset(pqloader.Loader(ds, **kw(num_epochs=1)))
    dl = (torch.utils.data.DataLoader(dataset, batch_size=None) if plain
          else pqloader.torch.DataLoader(dataset))
    dataset.set_epoch(0)
    whole = ids_of(list(dl))
    dataset.set_epoch(0)
    it = iter(dl)
    head = [next(it) for _ in range(4)]
    state = dataset.state_dict()
    del it
    dataset.set_epoch(0)
    assert ids_of(list(dl)) == whole
    dataset.load_state_dict(state)
    dataset.set_epoch(0)
    assert ids_of(head) + ids_of(list(dl)) == whole


@pytest.mark.parametrize("plain", [True, False])
def test_persistent_workers_after_a_loop_left_early_run_the_epoch_from_its_start(ds, plain):
    # A plain DataLoader's persistent workers went on from where their loaders were: the
    # batches they had fetched ahead for the loop left early were lost (the next loop was
    # its epoch's rest without them), where workers made anew run the epoch again.
    make = lambda: pqloader.torch.IterableDataset(pqloader.Loader(ds, **kw(num_epochs=1)))  # noqa: E731
    dl = (torch.utils.data.DataLoader(make(), batch_size=None, num_workers=2, persistent_workers=True)
          if plain else pqloader.torch.DataLoader(make(), num_workers=2, persistent_workers=True))
    reference = pqloader.torch.DataLoader(make(), num_workers=2)
    epoch0, epoch1 = ids_of(list(reference)), ids_of(list(reference))
    it = iter(dl)
    head = [next(it) for _ in range(3)]
    assert ids_of(head) == epoch0[:3 * BS]
    del it
    assert ids_of(list(dl)) == epoch0
    assert ids_of(list(dl)) == epoch1  # and the next loop, the next epoch


# ---------------------------------------------------------------------------
# fork
# ---------------------------------------------------------------------------


def _child_after_fork(ds, position, result):
    """Runs in a forked child while the parent's epoch is in flight."""
    try:
        loader = _child_after_fork.loader
        old = _child_after_fork.iterator
        try:
            next(old)
            result.put("the pre-fork iterator kept going")
            return
        except RuntimeError as e:
            assert "forked" in str(e), e
        assert (loader.epoch, loader.state_dict()["batch"]) == position
        got = list(loader)  # continues from the parent's consumer position, on a fresh engine
        ref = list(pqloader.Loader(ds, **kw(num_epochs=3)))
        k = position[0] * PER_EPOCH + position[1]
        assert len(got) == 2 * PER_EPOCH - position[1]  # the rest of this epoch, and one more
        assert_batch_streams_equal(got, ref[k:k + len(got)])
        result.put("ok")
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        result.put(f"{type(e).__name__}: {e}")


def test_fork_while_an_epoch_is_in_flight_never_deadlocks(ds):
    ctx = multiprocessing.get_context("fork")
    ref = list(pqloader.Loader(ds, **kw()))
    loader = pqloader.Loader(ds, **kw(num_workers=4, prefetch_batches=2, _debug_max_delay_us=3000))
    it = iter(loader)
    got = []
    for fork_at in (1, 7, PER_EPOCH + 2):
        while len(got) < fork_at:
            got.append(next(it))  # workers are busy decoding ahead (with injected delays)
        _child_after_fork.loader, _child_after_fork.iterator = loader, it
        result = ctx.Queue()
        child = ctx.Process(target=_child_after_fork, args=(ds, (loader.epoch, loader.state_dict()["batch"]), result))
        child.start()
        child.join(60)
        if child.is_alive():
            child.kill()
            child.join()
            pytest.fail(f"forked child hung (fork after {fork_at} batches)")
        assert child.exitcode == 0
        assert result.get(timeout=10) == "ok"
    got.extend(run_with_timeout(lambda: list(it), timeout=60))  # the parent is unaffected
    assert_batch_streams_equal(got, ref)


def test_forked_child_may_drop_an_inherited_loader_mid_epoch(ds):
    """The child's interpreter frees the loader and the iterator: their engine must not be touched."""
    code = textwrap.dedent(f"""
        import gc, os, sys, pqloader
        loader = pqloader.Loader({ds!r}, batch_size=16, num_workers=4, _debug_max_delay_us=3000)
        it = iter(loader)
        next(it)
        pid = os.fork()
        if pid == 0:
            del it, loader
            gc.collect()
            sys.exit(0)  # full interpreter shutdown in the child
        _, status = os.waitpid(pid, 0)
        print("child exit", os.waitstatus_to_exitcode(status))
        print("parent rows", 16 + sum(len(b["id"]) for b in it))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=subprocess_env())
    assert proc.returncode == 0, proc.stderr
    assert f"child exit 0\nparent rows {N}\n" in proc.stdout, proc.stdout + proc.stderr


def test_batch_transform_arrays_torch_cannot_share_are_copied_or_named(tmp_path):
    # A flip (x[::-1]) or another byte order from batch_transform: torch.from_numpy
    # refuses them, so the batch is handed out as a native, contiguous copy.
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pqloader._torch import Packing
    pq.write_table(pa.table({"x": np.arange(8, dtype=np.float32)}), tmp_path / "a.parquet")

    def flip(b):
        return {"x": b["x"][::-1], "y": b["x"].astype(">f4")}

    batch = next(iter(pqloader.Loader(tmp_path, batch_size=8, output="torch", batch_transform=flip)))
    assert batch["x"].tolist() == list(range(7, -1, -1)) and batch["x"].dtype == torch.float32
    assert batch["y"].tolist() == list(range(8)) and batch["y"].dtype == torch.float32
    # The CUDA path packs the same arrays into one buffer (checked here on the CPU).
    np_batch = flip({"x": np.arange(8, dtype=np.float32)})
    packing = Packing(np_batch)
    out = packing.unpack(packing.pack(np_batch, False), np_batch)
    assert out["x"].tolist() == list(range(7, -1, -1)) and out["y"].tolist() == list(range(8))
    # Arrays torch cannot hold: a TypeError naming the column.
    loader = pqloader.Loader(tmp_path, batch_size=8, output="torch",
                             batch_transform=lambda b: {**b, "when": b["x"].astype("datetime64[s]")})
    with pytest.raises(TypeError, match="column 'when'.*datetime64"):
        next(iter(loader))


def test_pqloader_torch_without_torch_says_how_to_install_it():
    # (torch made unimportable in a child: a bare "No module named 'torch'" named no remedy)
    code = ("import sys; sys.modules['torch'] = None\n"
            "try:\n    import pqloader.torch\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=subprocess_env())
    assert "pqloader.torch needs PyTorch" in out.stdout and "pqloader[torch]" in out.stdout, out.stdout + out.stderr
    assert subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None; import pqloader; "
                           "pqloader.Loader"], timeout=120, env=subprocess_env()).returncode == 0


@pytest.mark.parametrize("persistent", [False, True])
def test_dataloader_refuses_the_epoch_after_the_last_in_the_main_process(ds, persistent, fast_worker_shutdown):
    # Persistent workers going on past epoch 2**32 - 1 skipped the check made for workers
    # made anew: the refusal came late, from worker 0, as its traceback at the first batch.
    # Persistent workers are shut down when `dl` goes, at the test's end: `e`'s traceback
    # is dropped (it held this frame, so `dl` and its workers, until a later garbage
    # collection: their shutdown's 10 s then fell on another test), and they check for it
    # often (fast_worker_shutdown).
    dataset = pqloader.torch.IterableDataset(pqloader.Loader(ds, **kw(num_epochs=1)))
    dataset.set_epoch(2**32 - 1)
    dl = pqloader.torch.DataLoader(dataset, num_workers=2, persistent_workers=persistent)
    assert sum(1 for _ in dl) == len(dl)
    with pytest.raises(pqloader.InvalidDataError, match="end of epoch 4294967295 .*the last one") as e:
        iter(dl)
    assert "worker process" not in str(e.value)
    del e
    dataset.set_epoch(0)  # then epoch 0, as fresh workers give it
    fresh = pqloader.torch.IterableDataset(pqloader.Loader(ds, **kw(num_epochs=1)))
    want = [as_numpy(b) for b in pqloader.torch.DataLoader(fresh, num_workers=2)]
    assert_batch_streams_equal([as_numpy(b) for b in dl], want)


@pytest.mark.parametrize("epoch,exc", [(-1, ValueError), (2**32, ValueError), (1.5, TypeError), (True, TypeError)])
def test_dataset_set_epoch_refuses_a_bad_epoch_in_the_main_process(ds, epoch, exc):
    # As Loader.set_epoch: refused where it is called, not in the workers (a mutant
    # accepting -1 survived); the epoch set before stays.
    dataset = pqloader.torch.IterableDataset(pqloader.Loader(ds, **kw(num_epochs=1)))
    dataset.set_epoch(1)
    with pytest.raises(exc, match="epoch"):
        dataset.set_epoch(epoch)
    want = pqloader.Loader(ds, **kw(num_epochs=1))
    want.set_epoch(1)
    assert_batch_streams_equal([{k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in b.items()}
                                for b in pqloader.torch.DataLoader(dataset, num_workers=0)], list(want))


def test_read_only_arrays_of_a_batch_transform_become_tensors_of_their_own(tmp_path):
    # np.frombuffer of bytes, np.broadcast_to: read-only. DLPack made writable tensors
    # over them, so an in-place op wrote into a bytes object (immutable in Python) or
    # into every row of a broadcast.
    import warnings

    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"x": np.arange(4, dtype=np.float32)}), tmp_path / "a.parquet")
    raw = np.arange(4, dtype=np.float32).tobytes()
    row = np.arange(3, dtype=np.float32)

    def transform(b):
        return {"x": b["x"], "raw": np.frombuffer(raw, dtype=np.float32), "rows": np.broadcast_to(row, (4, 3))}

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (from_numpy warns on read-only arrays)
        batch = next(iter(pqloader.Loader(tmp_path, batch_size=4, output="torch", batch_transform=transform)))
    batch["raw"] += 1
    batch["rows"][0] += 10
    assert np.frombuffer(raw, dtype=np.float32).tolist() == [0, 1, 2, 3]
    assert row.tolist() == [0, 1, 2] and batch["rows"][1].tolist() == [0, 1, 2]
