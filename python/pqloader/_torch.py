"""PyTorch output: zero-copy tensors, pinned staging and copies to a device ahead of use.

Imported only when a Loader asks for ``output="torch"`` (or ``pin_memory``/``device``),
or through the public ``pqloader.torch`` module, so NumPy users never import torch. It
knows nothing of the Loader: ``_loader`` imports it, never the other way round.

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
