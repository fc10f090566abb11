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
views of that copy (``Packing``).
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

from pqloader._errors import user_stacklevel
from pqloader._iteration import Item


def batch_to_torch(batch: dict[str, Any]) -> dict[str, Any]:
    """Wrap every NumPy column of `batch` as a torch.Tensor sharing its memory.

    Args:
        batch: A batch as the NumPy loader yields it.

    Returns:
        The same keys; numeric columns as CPU tensors (no copy; a read-only array, which
        the loader never yields, is copied: a tensor over it would be writable), lists
        unchanged.
    """
    return {k: _as_tensor(k, v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}


def _check_dtype(name: str, array: np.ndarray) -> None:
    if array.dtype.kind not in "biufc":
        # A batch_transform's array of str, object or datetime64: torch cannot hold it,
        # and its own message names neither the column nor the option.
        raise TypeError(f"output='torch': column {name!r} is a NumPy array of dtype {array.dtype}, which "
                        "torch cannot hold (numbers and bool only); return a list, or numbers, "
                        "from batch_transform")


def _as_tensor(name: str, array: np.ndarray) -> torch.Tensor:
    try:
        # torch.from_numpy costs a third of torch.from_dlpack per column (docs/design.md,
        # "Tensors from NumPy"). A read-only array (a batch_transform's np.broadcast_to,
        # np.frombuffer of bytes, pyarrow's zero-copy view) is copied: DLPack took it as a
        # writable tensor, and an in-place op wrote into memory that was not to change.
        return torch.from_numpy(array if array.flags.writeable else np.array(array))
    except (TypeError, ValueError, BufferError, RuntimeError):
        # Only when torch refuses (no check per column on the way every batch takes): a
        # dtype it cannot hold is named; reversed views (x[::-1], a flip in
        # batch_transform) and other byte orders become a native, contiguous copy.
        _check_dtype(name, array)
        return torch.from_numpy(np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("=")))


class Packing:
    """Where the NumPy columns of one kind of batch go in one packed byte buffer.

    Staging a batch on a GPU then costs one host allocation, one ``np.concatenate`` per
    run of columns of one dtype and shape and one copy to the device, whatever the number
    of columns; torch calls per column (the pinning and copy of each) made a wide table's
    staging cost several times the loader's own time per batch (docs/design.md, "Device
    staging, one buffer per batch"). Columns are packed by element size, largest first,
    so that each one starts at a multiple of its element size, and columns of one dtype
    and shape side by side (a run), so that a run is filled by one ``np.concatenate`` and
    cut into views by one ``unbind``. A layout is computed once per kind of batch
    (`signature`): every batch of an epoch but a shorter last one shares it.

    Args:
        batch: Column name -> NumPy array (or any other value, which is left out).
    """

    def __init__(self, batch: dict[str, Any]) -> None:
        arrays = {k: v for k, v in batch.items() if isinstance(v, np.ndarray)}
        for k, v in arrays.items():
            _check_dtype(k, v)
        names = sorted(arrays, key=lambda k: (-arrays[k].itemsize, arrays[k].dtype.str, arrays[k].shape))
        self.runs: list[tuple[list[str], int, int, torch.dtype, tuple[int, ...]]] = []
        offset = i = 0
        while i < len(names):
            first = arrays[names[i]]
            j = i + 1
            while j < len(names) and arrays[names[j]].dtype == first.dtype and arrays[names[j]].shape == first.shape:
                j += 1
            # (names, byte offset, bytes, torch dtype, shape of the run's view)
            self.runs.append((names[i:j], offset, (j - i) * first.nbytes,
                              torch.from_numpy(np.empty(0, first.dtype.newbyteorder("="))).dtype,
                              (j - i, *first.shape)))
            offset += (j - i) * first.nbytes
            i = j
        self.nbytes = offset

    @staticmethod
    def signature(batch: dict[str, Any]) -> tuple:
        """What a batch's layout depends on: its keys, and each array's dtype and shape."""
        return tuple((k, v.dtype, v.shape) if isinstance(v, np.ndarray) else k for k, v in batch.items())

    def pack(self, batch: dict[str, Any], pin_memory: bool) -> torch.Tensor:
        """The bytes of `batch`'s arrays in a new host buffer (pinned if asked)."""
        buffer = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=pin_memory)
        host = buffer.numpy()
        for names, offset, nbytes, _, shape in self.runs:
            run = [batch[k] for k in names]
            # Native byte order: concatenate swaps the bytes of another order's arrays.
            out = host[offset:offset + nbytes].view(run[0].dtype.newbyteorder("="))
            if len(shape) == 1:  # 0-d arrays: concatenate takes arrays of at least one axis
                out[:] = run
            else:
                np.concatenate(run, out=out.reshape(shape[0] * shape[1], *shape[2:]))
        return buffer

    def unpack(self, buffer: torch.Tensor, batch: dict[str, Any]) -> dict[str, Any]:
        """`batch` with each array replaced by its view of `buffer`, a copy of `pack`'s
        buffer (on any device); the other values and the key order kept."""
        out = dict(batch)
        for names, offset, nbytes, dtype, shape in self.runs:
            out.update(zip(names, buffer[offset:offset + nbytes].view(dtype).view(shape).unbind(0)))
        return out


def _check_device(device: Any) -> torch.device | None:
    """`device` as a torch.device; an argument torch refuses raises naming ``device``."""
    if device is None or isinstance(device, torch.device):
        return device
    if isinstance(device, bool) or not isinstance(device, (str, int)):
        raise TypeError(f"device must be a str (e.g. 'cuda:0'), an int or a torch.device, got "
                        f"{type(device).__name__}")
    try:
        return torch.device(device)
    except RuntimeError as e:
        if isinstance(device, int) and device >= 0:  # an accelerator's index, and torch has none
            raise RuntimeError(f"device={device!r} but torch has no accelerator ({e}); pass "
                               "device=None for CPU tensors") from None
        raise ValueError(f"device={device!r} is not a torch device (e.g. 'cuda', 'cuda:0', 'cpu'): {e}") from None


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
        self.device = _check_device(device)
        if self.device is not None and self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                f"device={str(device)!r} but CUDA is not available (torch {torch.__version__}, "
                "torch.cuda.is_available() is False); pass device=None for CPU tensors")
        if self.device is not None and self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device is not None and self.device.type == "cuda" and self.device.index >= torch.cuda.device_count():
            # (torch's own error came from the side stream's creation: "invalid device ordinal")
            raise ValueError(f"device={str(device)!r} but torch sees {torch.cuda.device_count()} CUDA "
                             "device(s), numbered from 0")
        self.cuda = self.device is not None and self.device.type == "cuda"
        if pin_memory is None:
            pin_memory = self.cuda
        if pin_memory and not torch.cuda.is_available():
            warnings.warn("pqloader: pin_memory=True is ignored because CUDA is not available "
                          "(pinned memory only speeds up copies to a GPU)", RuntimeWarning, stacklevel=user_stacklevel())
            pin_memory = False
        self.pin_memory = bool(pin_memory)
        self.depth = device_prefetch if (self.pin_memory or self.device is not None) else 0
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.packings: dict[tuple, Packing] = {}  # by Packing.signature

    def wrap(self, items: Iterator[Item]) -> Iterator[Item]:
        """Convert, and stage `depth` batches ahead of the consumer where asked to."""
        if self.depth == 0:
            for epoch, index, batch in items:
                yield epoch, index, batch_to_torch(batch)
            return
        ahead: collections.deque = collections.deque()
        try:
            try:
                for epoch, index, batch in items:
                    ahead.append((epoch, index, self._stage(batch)))
                    if len(ahead) > self.depth:
                        e, i, staged = ahead.popleft()
                        yield e, i, self._ready(staged)
            except Exception:
                # An error of a later batch (the engine's, batch_transform's, its staging)
                # comes after the batches staged before it, as without staging: dropping
                # them raised it device_prefetch batches early (docs/reliability.md: "the
                # batches before it are delivered"). A stale iterator's hand-out refuses them.
                while ahead:
                    e, i, staged = ahead.popleft()
                    yield e, i, self._ready(staged)
                raise
            while ahead:
                e, i, staged = ahead.popleft()
                yield e, i, self._ready(staged)
        finally:
            items.close()  # type: ignore[attr-defined]

    def _stage(self, batch: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
        """Start the copies of one NumPy batch; return it, as tensors, with the event
        that marks the copies' end and the device buffers they fill (None, () off CUDA)."""
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
        return out, None, ()

    def _stage_cuda(self, batch: dict[str, Any]) -> tuple[dict[str, Any], Any, Any]:
        """Pack the batch into one host buffer, copy it in one transfer, hand out views.
        Tensors a batch_transform returned elsewhere are copied on their own (as off CUDA:
        they stayed on the host)."""
        signature = Packing.signature(batch)
        packing = self.packings.get(signature)
        if packing is None:
            if len(self.packings) >= 8:  # kinds of batch: a full one and a shorter last one
                self.packings.clear()
            packing = self.packings[signature] = Packing(batch)
        tensors = [k for k, v in batch.items() if isinstance(v, torch.Tensor) and v.device != self.device]
        if not packing.runs and not tensors:  # nothing to copy
            return batch, None, ()
        host = packing.pack(batch, self.pin_memory) if packing.runs else None
        with torch.cuda.stream(self.stream):
            buffers = [host.to(self.device, non_blocking=True)] if host is not None else []
            out = packing.unpack(buffers[0], batch) if host is not None else dict(batch)
            for k in tensors:
                out[k] = batch[k].to(self.device, non_blocking=True)
                buffers.append(out[k])
            event = torch.cuda.Event()
            event.record(self.stream)
        return out, event, buffers

    def _ready(self, staged: tuple[dict[str, Any], Any, Any]) -> dict[str, Any]:
        """Make the consumer's stream wait for the batch's copies; hand the batch out."""
        batch, event, buffers = staged
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            # The buffers (every packed column is a view of the first) were allocated on the
            # side stream and are now used on `current`: tell the caching allocator, so
            # they are not reused before `current` is done with them.
            for buffer in buffers:
                buffer.record_stream(current)
        return batch
