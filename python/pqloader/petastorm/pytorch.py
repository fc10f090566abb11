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

from pqloader._torch import _as_tensor
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
        # (torch.as_tensor of a read-only column warned "The given NumPy array is not
        # writable" from here; the Loader's own output takes it through DLPack)
        return _as_tensor(name, column)
    if isinstance(column, np.ndarray):
        return list(column)
    return column


_STATE_KIND = "pqloader.petastorm.DataLoader"
# A Loader state's keys that say nothing of a position but its epoch and batch: a state
# with other keys (an elastic rest, ranks' batches) is not moved back to a held batch.
_PLAIN_STATE_KEYS = {"version", "epoch", "batch", "iteration_end", "seed", "options", "optional_keys"}


def _rows(batch: dict) -> int:
    return len(next(iter(batch.values()))) if batch else 0


def _cut(batch: dict, lo: int, hi: int) -> dict:
    return {k: v[lo:hi] for k, v in batch.items()}


class _Rebatcher:
    """Batches of exactly `batch_size` rows (the last may be smaller) from a Loader's
    batches of any size (an epoch's last one, one a predicate cut down), a batch of the
    right size passed through untouched (no copy).

    Rows it holds were counted by the Loader as handed out: they outlive an iteration
    (a `break`, an error) and the next one yields them first, and `state_dict()` records
    the Loader's position before the batch they came from and how many of its rows were
    handed out, so that a resume neither loses nor repeats them.
    """

    def __init__(self, loader: Any, batch_size: int) -> None:
        self.loader = loader
        self.batch_size = batch_size
        self.held: list[list[Any]] = []  # [(epoch, batch) before the Loader batch, its rows, offset]
        self.count = 0
        self.skip = 0  # rows of the next Loader batch handed out before a loaded state

    def _position_before(self) -> tuple[int, int]:
        c = self.loader._cursor  # moved past a batch once the Loader handed it out
        with c.lock:
            return c.epoch, c.batch - 1

    def _stop_from(self, epoch: int) -> None:
        num_epochs = self.loader._options.num_epochs
        c = self.loader._cursor
        with c.lock:
            if num_epochs is not None and c.resume_end is None:
                c.resume_end = epoch + num_epochs

    def _take(self, m: int) -> dict:
        parts = []
        while m > 0:
            entry = self.held[0]
            rows = entry[1]
            n = _rows(rows)
            k = min(m, n)
            if k == n:
                parts.append(rows)
                self.held.pop(0)
            else:
                parts.append(_cut(rows, 0, k))
                entry[1], entry[2] = _cut(rows, k, n), entry[2] + k
            m -= k
            self.count -= k
        return _concat(parts)

    def __iter__(self) -> Iterator[dict]:
        bs = self.batch_size
        while self.count >= bs:  # what an earlier iteration left
            yield self._take(bs)
        if self.held:
            # The position is the held rows', not past the Loader batch they came from:
            # this iteration runs num_epochs from their epoch (as a state taken now resumes),
            # not from the Loader's (after a `break` that left an epoch's last rows here,
            # it ran one more epoch, which a resumed state did not).
            self._stop_from(self.held[0][0][0])
        for batch in self.loader:
            n = _rows(batch)
            offset = 0
            if self.skip:
                offset = min(self.skip, n)
                self.skip -= offset
                batch, n = _cut(batch, offset, n), n - offset
            if n == 0:
                continue
            if not self.held and n == bs and offset == 0:
                yield batch
                continue
            self.held.append([self._position_before(), batch, offset])
            self.count += n
            while self.count >= bs:
                yield self._take(bs)
        if self.count:
            yield self._take(self.count)

    def state_dict(self) -> dict[str, Any]:
        state = self.loader.state_dict()
        skip = self.skip
        if self.held:
            (epoch, batch), _, skip = self.held[0]
            if not set(state) <= _PLAIN_STATE_KEYS or state.get("optional_keys"):
                raise ValueError("cannot take a state while rows of the Loader's batches are held to "
                                 "re-cut them into batch_size rows, on a resumed elastic run; take it "
                                 "when the loop has handed out every row it holds")
            state = dict(state, epoch=epoch, batch=batch)
        out = {"kind": _STATE_KIND, "version": 1, "loader": state, "skip_rows": skip}
        if self.held or skip:
            # A position inside this rank's stream of rows (after a predicate, another
            # rank's Loader batches hold other counts): only this rank and world resume it.
            o = self.loader._options
            out["rank"] = [o.rank, o.world_size]
        return out

    def load_state_dict(self, state: Any) -> None:
        if not isinstance(state, collections.abc.Mapping) or state.get("kind") != _STATE_KIND:
            raise ValueError(f"not a state of a pqloader.petastorm.pytorch loader (its state_dict()): "
                             f"{type(state).__name__}" + (f" of kind {state.get('kind')!r}"
                                                          if isinstance(state, collections.abc.Mapping) else ""))
        skip, version = state.get("skip_rows"), state.get("version")
        # NumPy ints (a state rebuilt with NumPy, np.load) are the counts they hold; a bool
        # is no version (True == 1 was taken) and a float no count of rows.
        if not _is_count(version) or version != 1 or not _is_count(skip):
            raise ValueError(f"malformed pqloader.petastorm.pytorch loader state: version must be 1 and "
                             f"skip_rows an int >= 0, got version {version!r}, skip_rows {skip!r}")
        skip = int(skip)
        if "loader" not in state:
            raise ValueError("malformed pqloader.petastorm.pytorch loader state: no 'loader' entry")
        rank = state.get("rank")
        if rank is not None and (isinstance(rank, (str, bytes)) or not isinstance(rank, collections.abc.Sequence)
                                 or len(rank) != 2 or not all(map(_is_count, rank)) or not rank[0] < rank[1]):
            # (an int was "'int' object is not iterable", [0] an IndexError, "01" "taken by rank
            # 0 of 1 ... this loader (rank 0 of 1) cannot resume")
            raise ValueError(f"malformed pqloader.petastorm.pytorch loader state: rank must be "
                             f"[cur_shard, shard_count] (ints, 0 <= cur_shard < shard_count), got {rank!r:.100}")
        o = self.loader._options
        if rank is not None and [int(r) for r in rank] != [o.rank, o.world_size]:
            raise ValueError(
                f"this state was taken by rank {rank[0]} of {rank[1]} (cur_shard/shard_count) while it held "
                f"rows of a Loader batch re-cut into batch_size rows: a position in that rank's own rows, "
                f"which this loader (rank {o.rank} of {o.world_size}) cannot resume without losing or "
                f"repeating rows; load each rank's own state, or take it at a batch the Loader handed "
                f"out whole")
        self.loader.load_state_dict(state["loader"])
        self.held, self.count, self.skip = [], 0, skip


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
            if self.reader.stopped:
                # Left `with DataLoader(...)` (the reader stopped): Petastorm's reader raises
                # here; the Loader, usable after close(), read the data once more.
                raise RuntimeError(Reader._STOPPED)
            yield from self._iter_impl()
        except Exception as e:
            self._error = e
            logger.error("Iteration on Petastorm DataLoader raise error: %r", e)
            raise
        finally:
            self._in_iter = False

    def _iter_impl(self) -> Iterator[Any]:
        raise NotImplementedError

    @property
    def loader(self) -> Any:
        """The pqloader Loader that produces the batches (``stats()``). Checkpoint with
        this object's ``state_dict()``, not the Loader's: rows of the Loader's batches
        held to re-cut them into ``batch_size`` rows are in the Loader's past."""
        return self._batches.loader

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch handed out (the Loader's, and the rows of its
        batches held here), for ``load_state_dict`` on a loader made the same way.
        Plain data (``torch.save``, JSON). It records the reader's predicate and
        TransformSpec (see ``load_state_dict``)."""
        return dict(self._batches.state_dict(), predicate=self.reader._predicate_description,
                    transform_spec=self.reader._transform_description)

    def load_state_dict(self, state: Any) -> None:
        """Continue after the last batch of the run whose ``state_dict()`` gave `state`.

        Raises:
            ValueError: The state was taken under another predicate or TransformSpec (or
                none, or one where this reader has none): its position counts rows of
                another stream, or its batches hold other columns. A function in a
                predicate or TransformSpec is compared by its name only.
        """
        if self._in_iter:
            raise RuntimeError("cannot load a state while an iteration of this loader runs")
        if isinstance(state, collections.abc.Mapping) and state.get("kind") == _STATE_KIND:
            # (states taken before each was recorded have no key for it)
            for key, mine, consequence, remedy in (
                    ("predicate", self.reader._predicate_description,
                     "(rows would be lost or repeated)", "the same predicate"),
                    ("transform_spec", self.reader._transform_description,
                     "(a function may drop rows) and its batches other columns",
                     "the same TransformSpec")):
                if key in state and state[key] != mine:
                    raise ValueError(
                        f"this state was taken with {key} {state[key] or 'None'}, but this reader "
                        f"has {mine or 'no ' + key}: its position counts the rows of another "
                        f"stream {consequence}; make the reader with {remedy}")
        self._batches.load_state_dict(state)

    def __enter__(self) -> LoaderBase:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.reader.stop()
        self.reader.join()


def _check_queue_capacity(cls: str, capacity: Any) -> int:
    # (None or "1000" was a bare "'>' not supported between 'NoneType' and 'int'")
    from pqloader._options import MAX_COUNT, check_int

    return check_int(f"{cls}(shuffling_queue_capacity=...)", capacity, 0, MAX_COUNT)


def _check_function(cls: str, name: str, fn: Any) -> None:
    # (collate_fn=None was "'NoneType' object is not callable" at the first batch)
    if not callable(fn):
        raise TypeError(f"{cls}({name}=...) must be callable, got {type(fn).__name__} {fn!r:.100}")


def _is_count(value: Any) -> bool:
    from pqloader._state import is_state_int  # (the Loader's states take counts so)

    return is_state_int(value) and value >= 0


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
        collate_fn: Turns a list of row dicts into a batch (a callable: refused when
            the DataLoader is made otherwise). The default takes whole batches from the
            engine (no per-row Python).
        shuffling_queue_capacity: An int; > 0 shuffles rows across row groups holding
            about that many rows (see the module docstring).
    """

    def __init__(self, reader: Reader, batch_size: int = 1, collate_fn: Callable = decimal_friendly_collate,
                 shuffling_queue_capacity: int = 0) -> None:
        super().__init__()
        self.reader = _check_reader(reader)
        _check_function("DataLoader", "collate_fn", collate_fn)
        shuffling_queue_capacity = _check_queue_capacity("DataLoader", shuffling_queue_capacity)
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.shuffling_queue_capacity = shuffling_queue_capacity
        self._batches = _Rebatcher(reader.loader_for(batch_size, shuffling_queue_capacity), batch_size)

    def _iter_impl(self) -> Iterator[Any]:
        columns_iter = iter(self._batches)
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
    ``torch.as_tensor``), as Petastorm's BatchedDataLoader. `transform_fn` must be
    callable or None and `shuffling_queue_capacity` an int >= 0 (checked when made)."""

    def __init__(self, reader: Reader, batch_size: int = 1, transform_fn: Callable | None = None,
                 shuffling_queue_capacity: int = 0) -> None:
        super().__init__()
        self.reader = _check_reader(reader)
        if transform_fn is not None:
            _check_function("BatchedDataLoader", "transform_fn", transform_fn)
        shuffling_queue_capacity = _check_queue_capacity("BatchedDataLoader", shuffling_queue_capacity)
        self.batch_size = batch_size
        self.transform_fn = transform_fn
        self.shuffling_queue_capacity = shuffling_queue_capacity
        self._batches = _Rebatcher(reader.loader_for(batch_size, shuffling_queue_capacity), batch_size)

    def _iter_impl(self) -> Iterator[Any]:
        for columns in self._batches:
            if self.transform_fn is None:
                yield {name: _to_tensor(name, col) for name, col in columns.items()}
            else:
                yield {name: self.transform_fn(_sanitize(name, col)) for name, col in columns.items()}


__all__ = ["DataLoader", "BatchedDataLoader", "decimal_friendly_collate"]
