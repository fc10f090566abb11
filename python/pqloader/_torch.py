"""PyTorch output: zero-copy tensors, pinned staging and copies to a device ahead of use.

Imported only when a Loader asks for ``output="torch"`` (or ``pin_memory``/``device``),
or through the public ``pqloader.torch`` module, so NumPy users never import torch. It
knows nothing of the Loader: ``_loader`` imports it, never the other way round.

Per batch, and only in Python-level wiring: each numeric column is wrapped with
``torch.from_numpy`` (the tensor shares the C++ buffer, which it keeps alive); string
and bytes columns stay lists. With ``pin_memory`` or ``device``, batches are staged
``device_prefetch`` batches ahead of the consumer. For a CUDA device, a batch's tensors
are packed into one pinned (page-locked) host buffer, copied to the
device in one transfer on a side stream with ``non_blocking=True`` and handed out as
views of that copy (``pack_arrays``, ``unpack_arrays``).
A CUDA event recorded after the copies is waited on by the consumer's current stream
when the batch is handed out, so the copy of batch k+1 overlaps the compute on batch k
and the compute never reads a tensor before its copy is complete.
"""

from __future__ import annotations

import collections
import warnings
from typing import Any, Iterator

import numpy as np
import torch

from pqloader._iteration import Item


def batch_to_torch(batch: dict[str, Any]) -> dict[str, Any]:
    """Wrap every NumPy column of `batch` as a torch.Tensor sharing its memory.

    Args:
        batch: A batch as the NumPy loader yields it.

    Returns:
        The same keys; numeric columns as CPU tensors (no copy), lists unchanged.
    """
    return {k: _as_tensor(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    # torch.from_numpy costs a third of torch.from_dlpack per column (docs/design.md,
    # "Tensors from NumPy"); it warns on read-only arrays, which DLPack takes silently.
    return torch.from_numpy(array) if array.flags.writeable else torch.from_dlpack(array)


def pack_arrays(batch: dict[str, Any], pin_memory: bool) -> tuple[torch.Tensor, list[str]] | None:
    """The bytes of every NumPy column of `batch` in one new host buffer.

    Staging a batch on a GPU then costs one host allocation, one ``np.concatenate`` and
    one copy to the device whatever its number of columns; torch calls per column (the
    pinning and copy of each, or even a view of each) made a wide table's staging cost
    several times the loader's own time per batch (docs/design.md, "Device staging, one
    buffer per batch"). Columns are packed by element size, largest first, so that each
    one starts at a multiple of its element size, and columns of one dtype and shape side
    by side.

    Args:
        batch: Column name -> NumPy array (or any other value, which is left out).
        pin_memory: Allocate the buffer in pinned (page-locked) memory.

    Returns:
        (buffer, the packed columns' names in order) for `unpack_arrays`; None when the
        batch holds no array.
    """
    names = sorted((k for k, v in batch.items() if isinstance(v, np.ndarray)),
                   key=lambda k: (-batch[k].itemsize, batch[k].dtype.str, batch[k].shape))
    if not names:
        return None
    buffer = torch.empty(sum(batch[k].nbytes for k in names), dtype=torch.uint8, pin_memory=pin_memory)
    np.concatenate([batch[k].reshape(-1).view(np.uint8) for k in names], out=buffer.numpy())
    return buffer, names


def unpack_arrays(buffer: torch.Tensor, batch: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """`batch` with each NumPy column replaced by its tensor view of `buffer`, a copy of
    `pack_arrays`' buffer (on any device). Columns of one dtype and shape are cut from
    their run in one ``unbind``."""
    views: dict[str, torch.Tensor] = {}
    offset = i = 0
    while i < len(names):
        first = batch[names[i]]
        j = i + 1
        while j < len(names) and batch[names[j]].dtype == first.dtype and batch[names[j]].shape == first.shape:
            j += 1
        run = buffer[offset:offset + (j - i) * first.nbytes]
        views.update(zip(names[i:j], run.view(_as_tensor(first[:0]).dtype).view(j - i, *first.shape).unbind(0)))
        offset += (j - i) * first.nbytes
        i = j
    return {k: views[k] if isinstance(v, np.ndarray) else v for k, v in batch.items()}


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
                ahead.append((epoch, index, self._stage(batch)))
                if len(ahead) > self.depth:
                    e, i, staged = ahead.popleft()
                    yield e, i, self._ready(staged)
            while ahead:
                e, i, staged = ahead.popleft()
                yield e, i, self._ready(staged)
        finally:
            items.close()  # type: ignore[attr-defined]

    def _stage(self, batch: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
        """Start the copies of one NumPy batch; return it, as tensors, with the event
        that marks the copies' end and the device buffer they fill (None, None off CUDA)."""
        if self.cuda:
            return self._stage_cuda(batch)
        out = {}
        for k, v in batch_to_torch(batch).items():
            if isinstance(v, torch.Tensor):
                if self.pin_memory:
                    v = v.pin_memory()
                if self.device is not None:
                    v = v.to(self.device)
            out[k] = v
        return out, None, None

    def _stage_cuda(self, batch: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
        """Pack the batch into one host buffer, copy it in one transfer, hand out views."""
        packed = pack_arrays(batch, self.pin_memory)
        if packed is None:
            return batch, None, None
        host, names = packed
        with torch.cuda.stream(self.stream):
            device = host.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        return unpack_arrays(device, batch, names), event, device

    def _ready(self, staged: tuple[dict[str, Any], Any, Any]) -> dict[str, Any]:
        """Make the consumer's stream wait for the batch's copies; hand the batch out."""
        batch, event, device = staged
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            # The buffer (every column is a view of it) was allocated on the side stream and
            # is now used on `current`: tell the caching allocator, so it is not reused
            # before `current` is done with it.
            device.record_stream(current)
        return batch
