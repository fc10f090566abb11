"""``petastorm.pytorch.DataLoader`` / ``BatchedDataLoader`` over pqloader readers.

Petastorm's DataLoader pulls rows one by one from the reader and collates them in Python.
With the default ``collate_fn``, pqloader's asks the reader for whole batches of
``batch_size`` rows from the engine instead and turns each column into a tensor without
a copy (DLPack); the result is the same dict: tensors for numbers (``bool`` → uint8,
``uint16`` → int32, ``uint32`` → int64 as Petastorm promotes them), lists for strings.
A custom ``collate_fn`` still receives a list of row dicts. ``shuffling_queue_capacity``
> 0 shuffles rows across as many row groups as hold that many rows (the Loader's
``shuffle_window``), reproducibly from the reader's seed, instead of a random buffer.
"""

from __future__ import annotations

import collections.abc
import decimal
import logging
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.utils.data.dataloader import default_collate

from pqloader.petastorm.reader import Reader

logger = logging.getLogger(__name__)

_PARALLEL_ITER_ERROR = ("You must finish a full pass of Petastorm DataLoader before making another pass from the "
                        "beginning.If you do need to terminate early and restart from beginning, please re-create "
                        "the reader and the data loader.")


def decimal_friendly_collate(batch: list) -> Any:
    """``default_collate`` that leaves Decimals and strings as lists (Petastorm's)."""
    if isinstance(batch[0], decimal.Decimal):
        return batch
    if isinstance(batch[0], collections.abc.Mapping):
        return {key: decimal_friendly_collate([d[key] for d in batch]) for key in batch[0]}
    if isinstance(batch[0], (str, bytes)):
        return batch
    if isinstance(batch[0], collections.abc.Sequence):
        return [decimal_friendly_collate(samples) for samples in zip(*batch)]
    return default_collate(batch)


def _sanitize(name: str, value: Any) -> Any:
    """Petastorm's promotions of types torch lacks, for a row value or a whole column."""
    if isinstance(value, np.ndarray):
        if value.dtype == np.uint16:
            return value.astype(np.int32)
        if value.dtype == np.uint32:
            return value.astype(np.int64)
        if value.dtype == np.bool_:
            return value.astype(np.uint8)
    elif isinstance(value, np.bool_):
        return np.uint8(value)
    elif value is None:
        raise TypeError(f"Pytorch does not support nullable fields. Found None in {name}")
    return value


def _to_tensor(name: str, column: Any) -> Any:
    if isinstance(column, np.ndarray) and column.dtype.kind in "biufc":
        column = _sanitize(name, column)
        return torch.from_numpy(column) if column.flags.writeable else torch.as_tensor(column)
    if isinstance(column, np.ndarray):
        return list(column)
    return column


def _rebatch(batches: Iterator[dict], batch_size: int) -> Iterator[dict]:
    """Batches of exactly `batch_size` rows (the last may be smaller) from batches of any size.

    Passes a batch through untouched (no copy) when it already has the size.
    """
    pending: list[dict] = []
    count = 0
    for batch in batches:
        n = len(next(iter(batch.values()))) if batch else 0
        if n == 0:
            continue
        if not pending and n == batch_size:
            yield batch
            continue
        pending.append(batch)
        count += n
        while count >= batch_size:
            merged = _concat(pending)
            yield {k: v[:batch_size] for k, v in merged.items()}
            rest = {k: v[batch_size:] for k, v in merged.items()}
            count -= batch_size
            pending = [rest] if count else []
    if count:
        yield _concat(pending)


def _concat(batches: list[dict]) -> dict:
    if len(batches) == 1:
        return batches[0]
    out = {}
    for k in batches[0]:
        parts = [b[k] for b in batches]
        out[k] = np.concatenate(parts) if isinstance(parts[0], np.ndarray) else [x for p in parts for x in p]
    return out


class LoaderBase:
    """One pass at a time over the reader, as Petastorm's loaders."""

    def __init__(self) -> None:
        self._in_iter: bool | None = None
        self._error: BaseException | None = None

    def __iter__(self) -> Iterator[Any]:
        if self._error is not None:
            raise RuntimeError(f"Cannot start a new iteration because last time iteration failed with error "
                               f"{self._error!r}.")
        if self._in_iter:
            raise RuntimeError(_PARALLEL_ITER_ERROR)
        self._in_iter = True
        try:
            yield from self._iter_impl()
        except Exception as e:
            self._error = e
            logger.error("Iteration on Petastorm DataLoader raise error: %r", e)
            raise
        finally:
            self._in_iter = False

    def _iter_impl(self) -> Iterator[Any]:
        raise NotImplementedError

    def __enter__(self) -> LoaderBase:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.reader.stop()
        self.reader.join()


def _check_reader(reader: Any) -> Reader:
    if not isinstance(reader, Reader):
        raise TypeError("pqloader.petastorm.pytorch loaders take a reader from pqloader.petastorm.make_reader "
                        f"or make_batch_reader, got {type(reader).__name__}")
    return reader


class DataLoader(LoaderBase):
    """Batches of `batch_size` rows from a reader, as dicts of tensors (Petastorm's DataLoader).

    Args:
        reader: From :func:`pqloader.petastorm.make_reader` or ``make_batch_reader``.
        batch_size: Rows per batch; the last batch may be smaller.
        collate_fn: Turns a list of row dicts into a batch. The default takes whole
            batches from the engine (no per-row Python).
        shuffling_queue_capacity: > 0 shuffles rows across row groups holding about that
            many rows (see the module docstring).
    """

    def __init__(self, reader: Reader, batch_size: int = 1, collate_fn: Callable = decimal_friendly_collate,
                 shuffling_queue_capacity: int = 0) -> None:
        super().__init__()
        self.reader = _check_reader(reader)
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.shuffling_queue_capacity = shuffling_queue_capacity
        self._loader = reader.loader_for(batch_size, shuffling_queue_capacity)

    @property
    def loader(self) -> Any:
        """The pqloader Loader that produces the batches (``state_dict()``, ``stats()``)."""
        return self._loader

    def _iter_impl(self) -> Iterator[Any]:
        columns_iter = _rebatch(iter(self._loader), self.batch_size)
        if self.collate_fn is decimal_friendly_collate:
            for columns in columns_iter:
                yield {name: _to_tensor(name, col) for name, col in columns.items()}
            return
        for columns in columns_iter:
            names = list(columns)
            n = len(columns[names[0]]) if names else 0
            rows = [{name: _sanitize(name, columns[name][i]) for name in names} for i in range(n)]
            yield self.collate_fn(rows)


class BatchedDataLoader(LoaderBase):
    """Batches of `batch_size` rows, each column through `transform_fn` (default
    ``torch.as_tensor``), as Petastorm's BatchedDataLoader."""

    def __init__(self, reader: Reader, batch_size: int = 1, transform_fn: Callable | None = None,
                 shuffling_queue_capacity: int = 0) -> None:
        super().__init__()
        self.reader = _check_reader(reader)
        self.batch_size = batch_size
        self.transform_fn = transform_fn
        self.shuffling_queue_capacity = shuffling_queue_capacity
        self._loader = reader.loader_for(batch_size, shuffling_queue_capacity)

    @property
    def loader(self) -> Any:
        return self._loader

    def _iter_impl(self) -> Iterator[Any]:
        for columns in _rebatch(iter(self._loader), self.batch_size):
            if self.transform_fn is None:
                yield {name: _to_tensor(name, col) for name, col in columns.items()}
            else:
                yield {name: self.transform_fn(_sanitize(name, col)) for name, col in columns.items()}


__all__ = ["DataLoader", "BatchedDataLoader", "decimal_friendly_collate"]
