"""PyTorch output: zero-copy tensors, pinned staging and copies to a device ahead of use.

Imported only when a Loader asks for ``output="torch"`` (or ``pin_memory``/``device``),
or through the public ``pqloader.torch`` module, so NumPy users never import torch.

Per batch, and only in Python-level wiring: each numeric column is wrapped with
``torch.from_dlpack`` (the tensor shares the C++ buffer, which it keeps alive); string
and bytes columns stay lists. With ``pin_memory`` or ``device``, batches are staged
``device_prefetch`` batches ahead of the consumer: copied into pinned (page-locked) host
memory and, for a CUDA device, copied to it on a side stream with ``non_blocking=True``.
A CUDA event recorded after the copies is waited on by the consumer's current stream
when the batch is handed out, so the copy of batch k+1 overlaps the compute on batch k
and the compute never reads a tensor before its copy is complete.
"""

from __future__ import annotations

import collections
import os
import warnings
from typing import Any, Iterator

import numpy as np
import torch
import torch.utils.data

# (epoch, index in epoch, batch) as produced by Loader._read.
Item = tuple[int, int, dict[str, Any]]


def batch_to_torch(batch: dict[str, Any]) -> dict[str, Any]:
    """Wrap every NumPy column of `batch` as a torch.Tensor sharing its memory.

    Args:
        batch: A batch as the NumPy loader yields it.

    Returns:
        The same keys; numeric columns as CPU tensors (no copy), lists unchanged.
    """
    return {k: torch.from_dlpack(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}


class TorchOutput:
    """How a Loader turns engine batches into torch batches on the requested device.

    Args:
        pin_memory: Stage batches in pinned host memory. ``None``: only when ``device``
            is a CUDA device. Without CUDA it is ignored with a warning (pinned memory
            exists only for a GPU to copy from), so one script runs on both.
        device: Where batches are handed out. ``None``: CPU, zero-copy. A CUDA device
            must be available, else RuntimeError.
        device_prefetch: Batches staged ahead of the consumer when pinning or copying
            (at least 1).
    """

    def __init__(self, pin_memory: bool | None, device: Any, device_prefetch: int) -> None:
        self.device = None if device is None else torch.device(device)
        if self.device is not None and self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                f"device={str(device)!r} but CUDA is not available (torch {torch.__version__}, "
                "torch.cuda.is_available() is False); pass device=None for CPU tensors")
        if self.device is not None and self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.cuda = self.device is not None and self.device.type == "cuda"
        if pin_memory is None:
            pin_memory = self.cuda
        if pin_memory and not torch.cuda.is_available():
            warnings.warn("pqloader: pin_memory=True is ignored because CUDA is not available "
                          "(pinned memory only speeds up copies to a GPU)", RuntimeWarning, stacklevel=4)
            pin_memory = False
        self.pin_memory = bool(pin_memory)
        self.depth = device_prefetch if (self.pin_memory or self.device is not None) else 0
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None

    def wrap(self, items: Iterator[Item]) -> Iterator[Item]:
        """Convert, and stage `depth` batches ahead of the consumer where asked to."""
        if self.depth == 0:
            for epoch, index, batch in items:
                yield epoch, index, batch_to_torch(batch)
            return
        ahead: collections.deque = collections.deque()
        try:
            for epoch, index, batch in items:
                ahead.append((epoch, index, self._stage(batch_to_torch(batch))))
                if len(ahead) > self.depth:
                    e, i, staged = ahead.popleft()
                    yield e, i, self._ready(staged)
            while ahead:
                e, i, staged = ahead.popleft()
                yield e, i, self._ready(staged)
        finally:
            items.close()  # type: ignore[attr-defined]

    def _stage(self, batch: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """Start the copies of one batch; return it with the event that marks their end."""
        if not self.cuda:
            out = {}
            for k, v in batch.items():
                if isinstance(v, torch.Tensor):
                    if self.pin_memory:
                        v = v.pin_memory()
                    if self.device is not None:
                        v = v.to(self.device)
                out[k] = v
            return out, None
        out = {}
        with torch.cuda.stream(self.stream):
            for k, v in batch.items():
                if isinstance(v, torch.Tensor):
                    if self.pin_memory:
                        v = v.pin_memory()
                    v = v.to(self.device, non_blocking=True)
                out[k] = v
            event = torch.cuda.Event()
            event.record(self.stream)
        return out, event

    def _ready(self, staged: tuple[dict[str, Any], Any]) -> dict[str, Any]:
        """Make the consumer's stream wait for the batch's copies; hand the batch out."""
        batch, event = staged
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            for v in batch.values():
                if isinstance(v, torch.Tensor) and v.is_cuda:
                    # Memory allocated on the side stream is now used on `current`: tell the
                    # caching allocator, so it is not reused before `current` is done with it.
                    v.record_stream(current)
        return batch


class IterableDataset(torch.utils.data.IterableDataset):
    """A Loader as a ``torch.utils.data.IterableDataset`` that shards per DataLoader worker.

    pqloader needs no worker processes: iterate the Loader itself. This wrapper exists for
    code that insists on a ``DataLoader``. Use ``batch_size=None`` (items are whole
    batches). With ``num_workers=0`` it iterates the wrapped loader itself (state_dict and
    device staging work as usual). With ``num_workers=W > 0``, worker ``i`` of rank ``r``
    reads shard ``r * W + i`` of ``world_size * W``, with the loader's seed and
    options; each worker gets the same number of batches (the loader's ``shard_policy``),
    DataLoader interleaves them in worker order, so the stream is deterministic and each
    epoch covers the data once. Workers hand out CPU batches: use DataLoader's
    ``pin_memory=True`` and move them to the GPU yourself. Worker processes are made
    anew for each DataLoader iteration unless ``persistent_workers=True``; like
    ``DistributedSampler``, call ``set_epoch(e)`` before each epoch so they start at
    epoch ``e`` (persistent workers continue their own epoch count). Resuming from a
    state is not supported across workers.

    Args:
        loader: The loader to wrap; its options, seed, rank and world size are used.

    Example:
        >>> ds = pqloader.torch.IterableDataset(pqloader.Loader("data/", batch_size=512, seed=1))
        >>> dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        >>> for epoch in range(3):
        ...     ds.set_epoch(epoch)
        ...     for batch in dl: ...
    """

    def __init__(self, loader: Any) -> None:
        from pqloader._loader import Loader

        if not isinstance(loader, Loader):
            raise TypeError(f"IterableDataset wraps a pqloader.Loader, got {type(loader).__name__}")
        self._loader: Any = loader
        self._kwargs = loader._rebuild_kwargs()
        self._epoch = loader.epoch
        self._epoch_set = False
        self._worker_loader: Any = None

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at `epoch` (call it in the main process)."""
        self._epoch = int(epoch)
        self._epoch_set = True

    def state_dict(self) -> dict[str, Any]:
        """The wrapped loader's state (only meaningful with ``num_workers=0``)."""
        return self._main_loader().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._main_loader().load_state_dict(state)
        self._epoch = self._main_loader().epoch

    def _main_loader(self) -> Any:
        from pqloader._loader import Loader

        if self._loader is None:  # unpickled (spawned worker context) and then used directly
            self._loader = Loader(**self._kwargs)
        return self._loader

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        if info is None:
            loader = self._main_loader()
            if self._epoch_set and loader.epoch != self._epoch:
                loader._epoch, loader._batch = self._epoch, 0
            self._epoch_set = False
            return iter(loader)
        if self._worker_loader is None:
            self._worker_loader = self._make_worker_loader(info)
        return iter(self._worker_loader)

    def _make_worker_loader(self, info: Any) -> Any:
        from pqloader._loader import Loader

        kw = dict(self._kwargs)
        workers = info.num_workers
        kw["rank"] = kw["rank"] * workers + info.id
        kw["world_size"] = kw["world_size"] * workers
        threads = kw.get("num_workers") or os.cpu_count() or 1
        kw["num_workers"] = max(1, threads // workers)
        kw["device"] = None
        kw["pin_memory"] = False
        loader = Loader(**kw)
        loader._worker_shard = True
        loader._epoch, loader._batch = self._epoch, 0
        return loader

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_loader"] = None  # the engine cannot be pickled; spawned workers rebuild it
        state["_worker_loader"] = None
        return state
