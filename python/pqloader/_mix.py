"""Weighted, deterministic mixing of several Loaders into one stream: ``pqloader.mix``.

Each source is a :class:`pqloader.Loader` with its own columns, transforms and filter
(its output columns must match the others'). Position p of mixture epoch e draws its
source with a counter-based RNG (Philox keyed by seed, e, p; ``cpp/src/pqloader/mix/``),
so the stream is a pure function of (sources, weights, seed, epoch, rank): any worker
count, exact resume, every rank drawing the same source sequence from its own shards
(equal batches per rank). In mixture epoch e, source i reads its own epoch e; if it runs
out within the epoch, it reads epoch e again under the seeds WrapSeed(seed_i, 1),
WrapSeed(seed_i, 2), ... (``mix/mix_stream.h``): each a fresh shuffle (and fresh random transforms), never one
another mixture epoch reads. Batches are assembled in C++ (``mix/mix_stream.h``), off the
GIL, no Python per source batch: the sources write their rows in place where they can,
else the rows are copied once from the sources' batches.
"""

from __future__ import annotations

import math
import os
import threading
import warnings
import weakref
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from pqloader import _core, _env, _process, _state, _stats_table
from pqloader._iteration import ConsumerClock, clock, loaded_position_dropped
from pqloader._errors import InvalidDataError, user_stacklevel
from pqloader._lists import check_packed_batch
from pqloader._column_checks import integer_unit
from pqloader._options import EPOCH_HINT, MAX_EPOCH, check_bool, check_int, iteration_epochs
from pqloader._state import _jsonish, is_state_int, option_diff

STATE_VERSION = 2  # 1: before each rank shuffled its windows alone (_state.STATE_VERSIONS)
STATE_VERSIONS = (1, 2)
_STOPS = ("first", "last")
# Epochs ending at a source's end find their length by drawing their positions; up to
# this many positions, those draws are kept (a byte each) for the epoch's stream, which
# then does not draw them again.
_MAX_KEPT_DRAWS = 1 << 24
# Epochs' lengths remembered (the current one, the next, a few a state or len() asks for
# again); older ones are drawn again if asked. All of them grew the mixture ~60 bytes an
# epoch without bound (num_epochs=None over short epochs).
_KEPT_LENGTHS = 8
_STALE = ("this mixture iterator is stale: a newer iteration, set_epoch, load_state_dict or "
          "close() replaced it")


# Epochs of no batch in a row after which an endless mixture without samples_per_epoch
# raises (its epochs' lengths are draws: one may be empty between others).
_EMPTY_EPOCHS_IN_A_ROW = 1000


class Mixture:
    """One stream of batches drawn from several Loaders by weight; see :func:`mix`."""

    def __init__(self, sources: Mapping[str, Any] | Sequence[Any], weights: Mapping[str, float] | Sequence[float],
                 *, batch_size: int | None = None, seed: int | None = None,
                 samples_per_epoch: int | None = None, stop: str = "first", drop_last: bool = False,
                 num_epochs: int | None = 1, source_column: str | None = "source",
                 output: str = "numpy", batch_transform: Any = None) -> None:
        from pqloader._loader import Loader

        if isinstance(sources, (Loader, Mixture)):
            # Listing it iterated it: a whole epoch read (forever with num_epochs=None) and
            # its position moved, to fail on its first batch ("got dict").
            fix = ": wrap it in a list, mix([loader], [1])" if isinstance(sources, Loader) else ""
            raise TypeError("mix sources must be a list or dict of Loaders, got a "
                            f"pqloader.{type(sources).__name__}{fix}")
        for what, value in (("sources", sources), ("weights", weights)):
            if isinstance(value, (set, frozenset)):  # unordered: weights met other sources
                raise TypeError(f"mix {what} must be a list or a dict by name, got a set: its "
                                "order is not the one written")
            if not isinstance(value, Mapping) and not hasattr(value, "__iter__"):
                raise TypeError(f"mix {what} must be a list or a dict by name, got "
                                f"{type(value).__name__} {value!r:.100}")
        if isinstance(sources, Mapping):
            names = [str(k) for k in sources]
            loaders = list(sources.values())
        else:
            loaders = list(sources)
            names = [str(i) for i in range(len(loaders))]
        if len(loaders) < 1:
            raise ValueError("mix needs at least one source")
        if len(set(names)) != len(names):  # ({1: a, "1": b}: one name, one weight for both)
            raise ValueError(f"mix source names must differ as text, got {list(sources)}")
        for name, loader in zip(names, loaders):
            if not isinstance(loader, Loader):
                raise TypeError(f"mix source {name!r} must be a pqloader.Loader, got {type(loader).__name__}")
        if len({id(x) for x in loaders}) != len(loaders):
            raise ValueError("each mix source must be its own Loader (one Loader cannot be two streams)")
        if isinstance(weights, Mapping):
            unknown = set(map(str, weights)) - set(names)
            if unknown or len(weights) != len(names):
                raise ValueError(f"weights must name each source once ({names}), got {list(weights)}")
            wmap = {str(k): v for k, v in weights.items()}
            if len(wmap) != len(weights):  # ({0: 1, "0": 2}: a KeyError, or a weight lost)
                raise ValueError(f"weights must name each source once ({names}), got {list(weights)}")
            w = [wmap[n] for n in names]
        else:
            w = list(weights)
            if len(w) != len(loaders):
                raise ValueError(f"weights must give one weight per source ({len(loaders)}), got {len(w)}")
        for n, x in zip(names, w):
            # (NumPy numbers too, as check_int and the Loader's options take them: weights
            # computed with NumPy, np.array([3, 1]) or np.float32 shares)
            if isinstance(x, bool) or not isinstance(x, (int, float, np.integer, np.floating)) \
                    or not _finite_float(x) or x < 0:
                raise ValueError(f"the weight of source {n!r} must be a finite number >= 0, got {x!r}")
        total = sum(float(x) for x in w)
        if not math.isfinite(total):
            # The draws divide by the sum: [1e308, 1e308] drew source 1 alone, silently.
            raise ValueError(f"the weights sum beyond a double ({w!r}): scale them down (only their "
                             "ratios count)")
        if total <= 0:
            raise ValueError("at least one weight must be positive")
        if stop not in _STOPS:
            raise ValueError(f"stop must be one of {_STOPS}, got {stop!r}")
        if output not in ("numpy", "torch"):
            raise ValueError(f"output must be 'numpy' or 'torch', got {output!r}")
        first = loaders[0].options
        for n, l in zip(names, loaders):
            o = l.options
            if (o.rank, o.world_size) != (first.rank, first.world_size):
                raise ValueError(f"mix sources must share rank and world_size: {names[0]!r} has "
                                 f"{first.rank}/{first.world_size}, {n!r} {o.rank}/{o.world_size}")
            if o.output != "numpy":
                raise ValueError(f"mix source {n!r} has output={o.output!r}: give the sources "
                                 "output='numpy' and mix(..., output='torch')")
            if o.stack:
                raise ValueError(f"mix source {n!r} stacks columns (stack=): the mixture assembles its "
                                 "batches in C++ from the sources' columns; mixing stacked sources "
                                 "is not supported")
            if o.batch_transform is not None:
                raise ValueError(f"mix source {n!r} has a batch_transform: the mixture assembles its "
                                 "batches in C++ from the sources' own; give it to "
                                 "mix(..., batch_transform=...) to apply it to the mixed batches")
        packs = [(n, l.options.pack) for n, l in zip(names, loaders)]
        if any(p is not None for _, p in packs):
            # (before the columns' check, which named only the blocks' shapes: "column
            # 'tokens' is int32 (8,) in '0' but int32 (16,) in '1'")
            (n0, p0), *rest = packs
            for n, p in rest:
                if (p0 is None) != (p is None):
                    packing, other = (n0, n) if p is None else (n, n0)
                    raise ValueError(f"mix source {packing!r} packs documents (pack=) and {other!r} does "
                                     "not: mixture sources must all pack documents or none")
                if p is not None and p.seq_len != p0.seq_len:
                    raise ValueError(f"mix source {n!r} packs blocks of Pack(seq_len={p.seq_len}), "
                                     f"{n0!r} of seq_len={p0.seq_len}: packed sources must agree "
                                     "(they are mixed block by block)")
        self._check_columns(names, loaders)
        # (sources of weight 0 are never started)
        read = [l for l, x in zip(loaders, w) if float(x) > 0]
        _env.check_mixture_budgets([l._max_inflight_bytes for l in read],
                                   sum(l.options.max_inflight_bytes is None for l in read))
        self._names = names
        self._loaders = loaders
        self._weights = [float(x) for x in w]
        self._cumulative = _core.mix_cumulative(self._weights)
        self._batch_size = check_int("batch_size", batch_size if batch_size is not None else first.batch_size, 1)
        seq_len = max((l.options.pack.seq_len for l in loaders if l.options.pack is not None), default=0)
        check_packed_batch("mix", self._batch_size, seq_len)  # (its batches' cu_seqlens are made anew)
        self._seed = check_int("seed", seed if seed is not None else first.seed, 0, 2**64 - 1)
        # The first source's drawn seed: adopted from a state, as the sources' are.
        self._seed_drawn = seed is None and loaders[0]._seed_drawn
        self._samples = None if samples_per_epoch is None else check_int("samples_per_epoch", samples_per_epoch, 1)
        self._stop = stop
        self._drop_last = check_bool("drop_last", drop_last)  # (bool("False") was True)
        self._num_epochs = None if num_epochs is None else check_int("num_epochs", num_epochs, 0)
        if source_column is not None:
            # (b"src" was a bare std::bad_cast at the first batch; "" gave no column at all)
            if not isinstance(source_column, str):
                raise TypeError(f"source_column must be a column name (str) or None, got "
                                f"{type(source_column).__name__} {source_column!r}")
            if source_column == "":
                raise ValueError("source_column '' names no column: give a name, or None for no "
                                 "source column")
            try:
                source_column.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError(f"source_column {source_column!r} is not UTF-8 text (it has a "
                                 "lone surrogate)") from None
        if source_column is not None and source_column in loaders[0].column_info:
            raise ValueError(f"source_column {source_column!r} is a column of the sources; name it otherwise")
        self._source_column = source_column
        self._output = output
        if batch_transform is not None and not callable(batch_transform):
            raise TypeError("batch_transform must be callable")
        self._batch_transform = batch_transform
        self._rows = self._rows_of(0)  # for the draw limit
        self._lengths: dict[int, int] = {}
        self._kept: tuple[int, Any] | None = None  # (epoch, its draws) for its stream
        self._seeds_version = 0  # bumped when load_state_dict adopts seeds (see epoch_samples)
        self._epochs_in_place = 0  # epochs begun whose batches the sources wrote in place
        self._empty_warned: set[int] = set()  # sources warned of: no rows, so stop="first" epochs are empty
        # The consumer's time in next() (and of it, in the stream's next()), batches out.
        self._clock = ConsumerClock()
        self._engine_wait = 0.0
        self._batches_out = 0
        self._epoch, self._batch = 0, 0
        self._resume_end: int | None = None
        self._loaded = False  # the position is a loaded state's, no iteration started from it
        self._active_end: int | None = None  # where the running iteration stops
        self._generation = 0
        self._live = -1  # the generation of the iteration handing out batches, if any
        # The stream of the newest iteration. A newer iteration or close() stops it, so
        # an older iterator, finalised later (its stream stopped in `finally`), cannot
        # stop the sources under a newer one.
        self._stream: Any = None
        # Guards the generation, the position and the stream: an iterator checks that it
        # is still the newest and moves the position in one step (another thread may
        # call set_epoch, load_state_dict or close meanwhile). Reentrant: an old
        # iterator may be finalised (its `finally`) by a collection inside a locked step.
        self._lock = threading.RLock()
        _live.add(self)

    @staticmethod
    def _check_columns(names: list[str], loaders: list[Any]) -> None:
        base = loaders[0].column_info
        for n, l in zip(names[1:], loaders[1:]):
            info = l.column_info
            if list(info) != list(base):
                raise ValueError(f"mix sources must give the same columns in the same order: "
                                 f"{names[0]!r} gives {list(base)}, {n!r} gives {list(info)}")
            for c in base:
                a, b = base[c], info[c]
                if (a["dtype"], a["shape"]) != (b["dtype"], b["shape"]):
                    raise ValueError(f"column {c!r} is {a['dtype']} {a['shape']} in {names[0]!r} but "
                                     f"{b['dtype']} {b['shape']} in {n!r}: mix sources must agree")
                # Times load as integers in their own unit (and decimals="int64" as
                # unscaled integers): one int64 column would mix two units, as a stack.
                if integer_unit(a, loaders[0].options.decimals) != integer_unit(b, l.options.decimals):
                    raise ValueError(f"column {c!r} is {a['arrow_type']} in {names[0]!r} but "
                                     f"{b['arrow_type']} in {n!r}: they load as integers of different "
                                     "units (coerce_int96_timestamp_unit, decimals or the files' "
                                     "types), which mixed batches would not tell apart: mix sources "
                                     "must agree")

    def _rows_of(self, epoch: int) -> list[int]:
        """Each source's rows in `epoch` (after drop_last): a packing source's blocks
        differ between epochs when there are several ranks (epoch 0's were taken for
        all: a stop="last" epoch left blocks unread, or read some twice)."""
        return [loader._engine.core().batch_rows(epoch) for loader in self._loaders]

    # -- the plan of an epoch ----------------------------------------------------------
    def epoch_samples(self, epoch: int) -> int:
        """Samples this rank draws in `epoch` (before drop_last)."""
        with self._lock:
            n = self._lengths.get(epoch)
            # The seeds the length is drawn under: a load_state_dict from another thread
            # while it is drawn (off the GIL) adopts others, and the old seeds' length
            # and draws must not be remembered for the new ones.
            seed, seeds = self._seed, self._seeds_version
        if n is not None:
            return n
        draws = None
        if self._samples is not None:
            n = self._samples // self._loaders[0].options.world_size
        else:
            limit = self._draw_limit()
            n, draws = _core.mix_epoch_length_kept(seed, epoch, self._cumulative,
                                                   self._rows_of(epoch), self._stop == "last", limit,
                                                   _MAX_KEPT_DRAWS)
            if n >= limit:  # silently cut before: ~100 passes over the other sources
                warnings.warn(f"mix(stop={self._stop!r}): epoch {epoch} did not end within {limit} "
                              f"draws (a source's weight is far below its share of the rows, so "
                              f"it is drawn too rarely to run out); it ends there. Give "
                              f"samples_per_epoch, or weights nearer the sources' sizes",
                              RuntimeWarning, stacklevel=user_stacklevel())
        with self._lock:
            if seeds == self._seeds_version:
                if draws is not None:
                    self._kept = (epoch, draws)
                self._lengths[epoch] = n
                if len(self._lengths) > _KEPT_LENGTHS:  # a memo, not a record: the oldest goes
                    del self._lengths[next(iter(self._lengths))]
        return n

    def num_batches(self, epoch: int) -> int:
        return self._batches_of(self.epoch_samples(epoch))

    def _draw_limit(self) -> int:
        return sum(self._rows) * 64 + 1024  # a bound for weights far from the sizes

    def _batches_of(self, samples: int) -> int:
        return samples // self._batch_size if self._drop_last else -(-samples // self._batch_size)

    def _batches_with_seed(self, epoch: int, seed: int) -> int:
        """num_batches(epoch) were the mixture's seed `seed` (a state's, to be adopted):
        without samples_per_epoch, the seed's draws decide where the epoch ends."""
        if seed == self._seed or self._samples is not None:
            return self.num_batches(epoch)
        n, _ = _core.mix_epoch_length_kept(seed, epoch, self._cumulative, self._rows_of(epoch),
                                           self._stop == "last", self._draw_limit(), 0)
        return self._batches_of(n)

    def __len__(self) -> int:
        """Batches of the current epoch for this rank: inside a loop, of the epoch it is
        in; between loops, of the epoch the next loop starts in (after a loop left at its
        epoch's last batch, without reaching the end, the next epoch: epochs differ in
        length, and the ended one's count sized the next loop wrongly)."""
        for loader in self._loaders:  # sources built before the process group: as __iter__
            loader._check_rank_world()
        with self._lock:
            epoch, batch = self._epoch, self._batch
            between = self._live != self._generation and self._resume_end is None
        # (the test __iter__ makes to move past an ended epoch)
        if between and epoch < MAX_EPOCH and batch > 0 and batch >= self.num_batches(epoch):
            epoch += 1
        return self.num_batches(epoch)

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def sources(self) -> list[str]:
        return list(self._names)

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at the first batch of `epoch`.

        Running iterators stop (their next ``next()`` raises), and so does their stream:
        the sources read nothing more for it. As ``Loader.set_epoch``, also after
        ``load_state_dict``: the state's own epoch keeps the loaded position (the next
        iteration runs the rest of that epoch); another drops it, with a ``UserWarning``
        when the state was inside its epoch.
        """
        epoch = check_int("epoch", epoch, 0, MAX_EPOCH, EPOCH_HINT)
        dropped = None
        with self._lock:  # one step: an iteration another thread starts meanwhile keeps its stream
            if self._loaded and epoch == self._epoch:
                # the rest of the loaded epoch, as this set_epoch's iteration would run on
                self._resume_end = None if self._num_epochs is None else epoch + self._num_epochs
            else:
                if self._loaded and 0 < self._batch < self.num_batches(self._epoch):
                    dropped = self._epoch
                self._loaded = False
                self._epoch, self._batch = epoch, 0
                self._resume_end = None
            self._active_end = None
            self._generation += 1
            self._stop_stream()
        if dropped is not None:
            warnings.warn(loaded_position_dropped(epoch, dropped), UserWarning, stacklevel=user_stacklevel())

    # -- iteration ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        _process.check_not_in_dataloader_worker(self, mixture=True)
        for loader in self._loaders:  # sources built before the process group
            loader._check_rank_world()
        self._clock.start()
        with self._lock:
            self._generation += 1
            generation = self._generation
            epoch, batch = self._epoch, self._batch
            resume_end, self._resume_end = self._resume_end, None
            loaded, self._loaded = self._loaded, False  # (an iteration starts from it)
        if batch > 0 and batch >= self.num_batches(epoch):  # after an epoch's end
            epoch, batch = epoch + 1, 0
        if resume_end is not None:
            stop = resume_end
        else:
            stop = None if self._num_epochs is None else epoch + self._num_epochs
        # Past the last epoch (2**32 - 1): refused before the first batch, an endless
        # iteration ends after it (its half-way draw of epoch 2**32's length failed).
        endless = stop is None
        try:
            stop = iteration_epochs(epoch, stop, "mixture")
        except BaseException:
            with self._lock:  # a restored end stays for the next try
                if generation == self._generation and self._resume_end is None:
                    self._resume_end, self._loaded = resume_end, loaded
            raise
        with self._lock:
            if generation == self._generation:
                self._active_end = None if endless else stop
                self._live = generation
        to_torch = None
        if self._output == "torch":
            import torch

            def to_torch(b: dict[str, Any]) -> dict[str, Any]:
                return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) and v.dtype != object else v
                        for k, v in b.items()}
        completed = False
        empty_in_a_row = 0
        try:
            while epoch < stop:
                if endless and batch == 0 and self.num_batches(epoch) == 0:
                    # Endless epochs of no batch would spin here forever (as Loader's). With
                    # samples_per_epoch every epoch is as long; else an epoch's length is a
                    # draw, and a few may be empty between others.
                    empty_in_a_row += 1
                    if self._samples is not None or empty_in_a_row >= _EMPTY_EPOCHS_IN_A_ROW:
                        raise InvalidDataError(
                            f"mixture epoch {epoch} has no batch"
                            + ("" if self._samples is not None else
                               f", nor had the {empty_in_a_row - 1} epochs before it")
                            + " (samples_per_epoch below world_size, fewer samples than batch_size "
                            "with drop_last, or a source of weight > 0 without rows under "
                            "stop='first'): with num_epochs=None the iteration would never yield; "
                            "give num_epochs, or other options")
                else:
                    empty_in_a_row = 0
                then_next = epoch + 1 < stop
                yield from self._epoch_batches(epoch, batch, generation, to_torch, then_next)
                epoch, batch = epoch + 1, 0
            completed = True
        finally:
            with self._lock:
                if generation == self._generation:  # (else a newer one set the position)
                    if completed:
                        self._epoch, self._batch = epoch, 0
                        if epoch > MAX_EPOCH:
                            # The last epoch a mixture runs ended: stay at its end (a
                            # position load_state_dict takes), not at epoch 2**32.
                            self._epoch, self._batch = epoch - 1, self.num_batches(epoch - 1)
                    # Complete, or left (break, closed): the next iteration runs num_epochs.
                    self._active_end = None
                    self._live = -1

    def _epoch_batches(self, epoch: int, batch: int, generation: int, to_torch: Any,
                       then_next: bool) -> Iterator[dict[str, Any]]:
        # With then_next, the stream starts the sources' next epoch while this one ends
        # (MixStreamOptions::then_next_epoch), and the next epoch's length is drawn half
        # way, while the sources decode, not at the boundary.
        samples = self.epoch_samples(epoch)
        # The draws the stream makes: drop_last's partial batch is never drawn.
        drawn = min(samples, self.num_batches(epoch) * self._batch_size)
        if drawn > 0:
            self._check_sources_have_rows(epoch, drawn)
        elif samples == 0:
            self._warn_sources_without_rows(epoch)
        with self._lock:
            # A stale iterator (resumed after a newer one began) touches nothing.
            if generation != self._generation:
                raise RuntimeError(_STALE)
            for loader in self._loaders:
                loader._cursor.invalidate()  # the loaders' own iterators stop
            kept = None
            if self._kept is not None and self._kept[0] == epoch:
                kept, self._kept = self._kept[1], None  # the stream holds them now
            self._stop_stream()
            stream = _core.MixStream([l._engine.core() for l in self._loaders], [l.seed for l in self._loaders],
                                     self._cumulative, self._seed, self._batch_size, epoch, batch,
                                     samples, self.num_batches(epoch), self._source_column,
                                     then_next, kept, [str(n) for n in self._names])
            self._stream = stream
            self._epochs_in_place += int(stream.in_place)
        transform = self._batch_transform
        half = (batch + self.num_batches(epoch)) // 2 if then_next else -1
        try:
            for b in range(batch, self.num_batches(epoch)):
                t0 = clock()  # the consumer asked for the next batch
                if b == half:
                    # The next epoch's length (and draws): its sources, started early by
                    # this stream, then write it in place where they can.
                    nxt = self.epoch_samples(epoch + 1)
                    kept = self._kept  # (read once: another thread's load_state_dict clears it)
                    kept_next = kept[1] if kept is not None and kept[0] == epoch + 1 else None
                    stream.set_next_epoch(nxt, self.num_batches(epoch + 1), kept_next)
                if generation != self._generation:
                    raise RuntimeError(_STALE)
                t1 = clock()
                out = stream.next()
                self._engine_wait += clock() - t1
                if out is None:  # cannot happen: the stream holds num_batches batches
                    raise RuntimeError(f"mixture epoch {epoch} ended early at batch {b}")
                if generation != self._generation:  # replaced while next() ran
                    raise RuntimeError(_STALE)
                if transform is not None:
                    out = transform(out)
                if to_torch is not None:
                    out = to_torch(out)
                self._clock.next_seconds += clock() - t0
                before = None
                try:
                    with self._lock:
                        # Moved only once the batch is handed out (as Loader's cursor): a batch
                        # whose batch_transform or conversion raised (Ctrl-C in it included) is
                        # not consumed, and the next iteration or a state resumes at it.
                        if generation != self._generation:
                            raise RuntimeError(_STALE)
                        before = self._epoch, self._batch
                        self._epoch, self._batch = epoch, b + 1
                except BaseException:
                    # A signal handler's exception (Ctrl-C) raised as the move ended (the lock
                    # released): the batch is not handed out, so it stays the next one.
                    with self._lock:
                        if before is not None and generation == self._generation and \
                                (self._epoch, self._batch) == (epoch, b + 1):
                            self._epoch, self._batch = before
                    raise
                # Nothing between the move and the yield may raise: a Ctrl-C there lost the
                # batch (the position counted it as handed out).
                self._batches_out += 1
                yield out
        finally:
            with self._lock:
                stream.stop()  # a no-op if a newer iteration or close() stopped it
                if self._stream is stream:
                    self._stream = None

    def _check_sources_have_rows(self, epoch: int, samples: int) -> None:
        """Refuse, naming it, a source without rows in `epoch` (its filter, shard or
        drop_last leave it none) that the epoch's first `samples` draws (those its batches
        hold) pick, before its first batch: the
        stream raised only at the batch that first drew it, as "mixture source 0 has no
        rows". A packing source's wraps may hold blocks where its first read does not
        (the stream's own check counts them)."""
        empty = [i for i, (l, w, rows) in enumerate(zip(self._loaders, self._weights, self._rows_of(epoch)))
                 if w > 0 and rows == 0 and l.options.pack is None]
        if not empty:
            return
        wanted = [1 if i in empty else 0 for i in range(len(self._loaders))]
        first, i = _core.mix_first_draw(self._seed, epoch, samples, self._cumulative, wanted)
        if first < samples:
            o = self._loaders[i].options
            raise InvalidDataError(
                f"mixture source {self._names[i]!r} has no rows in epoch {epoch} on rank {o.rank} "
                f"of {o.world_size} (its filter, shard or drop_last leave it none), but its weight "
                f"{self._weights[i]:g} draws it at sample {first} of the epoch's {samples}; "
                "give it weight 0")

    def _warn_sources_without_rows(self, epoch: int) -> None:
        """Warn, once per source, that a source of weight > 0 without rows in `epoch` (its
        filter, shard or drop_last leave it none on this rank) ends a stop="first" epoch
        before its first draw: the epoch is empty (its loop ran no batch, with no word)."""
        if self._stop != "first" or self._samples is not None:
            return
        rows = self._rows_of(epoch)
        for i, (w, n) in enumerate(zip(self._weights, rows)):
            if w > 0 and n == 0 and i not in self._empty_warned:
                self._empty_warned.add(i)
                o = self._loaders[i].options
                warnings.warn(
                    f"mixture source {self._names[i]!r} has no rows in epoch {epoch} on rank {o.rank} "
                    f"of {o.world_size} (its filter, shard or drop_last leave it none): with its "
                    f"weight {w:g}, a stop='first' epoch ends at once, with no batch. Give it "
                    "weight 0, stop='last' or samples_per_epoch (warned once per source)",
                    RuntimeWarning, stacklevel=user_stacklevel())

    def _stop_stream(self) -> None:
        if self._stream is not None:
            self._stream.stop()
            self._stream = None

    def stats(self) -> dict[str, Any]:
        """Each source loader's ``stats()`` (under ``sources``); the sum over them of
        bytes_read, bytes_fetched, units_read, rows (rows the sources handed to the
        mixer) and of their worker stages (read_seconds, decode_seconds,
        transform_seconds, assemble_seconds: all threads); the mixture's own consumer
        side, as ``Loader.stats()`` has it: batches (handed out), wait_seconds (time in
        the mixture's ``next()``, batch_transform and torch conversion included), of which
        engine_wait_seconds waiting for the mixed batch, wall_seconds (since the first
        iteration) and wait_fraction; and ``epochs_in_place``: epochs (or rests of
        epochs) begun so far whose batches the sources wrote in place (see :func:`mix`)."""
        per = {n: l.stats() for n, l in zip(self._names, self._loaders)}
        summed = ("bytes_read", "bytes_fetched", "units_read", "rows", "read_seconds",
                  "decode_seconds", "transform_seconds", "assemble_seconds")
        out: dict[str, Any] = {k: sum(s.get(k, 0) for s in per.values()) for k in summed}
        out["batches"] = self._batches_out
        out["wait_seconds"] = self._engine_wait
        out = self._clock.stats(out)  # wait_seconds -> engine_wait_seconds, the rest
        out["epochs_in_place"] = self._epochs_in_place
        out["sources"] = per
        return out

    def stats_table(self) -> str:
        """:meth:`stats` as a per-stage table (the sources' worker time summed, and the
        mixture's consumer wait) and a one-line diagnosis; see :func:`pqloader.format_stats`."""
        return _stats_table.format_stats(self.stats())

    def close(self) -> None:
        """Stop the sources' worker threads and wait for them (``Loader.close()`` on each).

        A mixture iterated over several epochs starts its sources' next epoch before
        the current one ends; after ``close()`` returns nothing more is read, decoded
        or written to any source's ``cache_dir``. A running iterator stops (its next
        ``next()`` raises); the mixture stays usable: iterating again goes on from the
        current position (as a new ``for`` loop would). Also called on leaving
        ``with pqloader.mix(...) as m:``.
        """
        with self._lock:  # one step: an iteration another thread starts meanwhile keeps its stream
            self._generation += 1
            self._active_end = None  # (the stopped iteration's: a state now resumes as the next runs)
            self._stop_stream()
            for loader in self._loaders:
                loader.close()

    def __enter__(self) -> "Mixture":
        return self

    def __getitem__(self, index: Any) -> Any:
        # torch.utils.data.DataLoader takes an object that is not an IterableDataset for a
        # map-style dataset and indexes it ("'Mixture' object is not subscriptable").
        raise TypeError(
            "a pqloader mixture is iterable, not indexable: it yields whole batches and needs no "
            "torch.utils.data.DataLoader (nor its worker processes): iterate it directly")

    def __reduce__(self) -> Any:
        # A copy would share the sources (Loaders), whose streams one iteration at a time may read.
        raise TypeError(
            "a pqloader mixture cannot be pickled or copied (its sources own C++ threads); it needs no "
            "DataLoader worker processes: iterate it directly, or build another with pqloader.mix")

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- checkpointing -----------------------------------------------------------------
    def _config(self, seed: int | None = None, source_seeds: Sequence[int] | None = None) -> dict[str, Any]:
        seeds = source_seeds if source_seeds is not None else [l.seed for l in self._loaders]
        return {"sources": self._names, "weights": self._weights, "batch_size": self._batch_size,
                "seed": self._seed if seed is None else seed, "samples_per_epoch": self._samples,
                "stop": self._stop, "drop_last": self._drop_last,
                "source_fingerprints": [l._fingerprint(s) for l, s in zip(self._loaders, seeds)]}

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch handed out (JSON-safe). Every rank of a job
        (in lockstep) has the same one but for the sources' ranks: any rank's loads on
        every rank."""
        with self._lock:  # a running iteration's end, or one loaded for the next
            epoch, batch = self._epoch, self._batch
            end = self._active_end if self._active_end is not None else self._resume_end
        return {"kind": "pqloader.mix", "version": STATE_VERSION, "epoch": epoch,
                "batch": batch, "end": end, "config": self._config()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue exactly after the last batch of the run that produced `state`, which
        may be another rank's (or :func:`pqloader.merge_states`' of all ranks). Shuffled sources
        built with ``seed=None`` adopt the state's seeds (and the mixture its own, where it
        took the first source's), as a Loader does. Running iterators stop (their next
        ``next()`` raises), and so does their stream. As a Loader's, its counts may be
        NumPy ints and its lists tuples.

        Raises:
            pqloader.InvalidDataError: not a mixture state, or one of other sources,
                weights or options (named; another world size among them).
        """
        if not isinstance(state, Mapping) or not _state.is_mix_state(state) \
                or not _state.is_version(state.get("version")):
            if isinstance(state, Mapping) and "kind" not in state and "options" in state:
                raise InvalidDataError("not a pqloader.mix state: this is a Loader's; a mixture "
                                       "loads the state_dict() of a mixture")
            raise InvalidDataError(f"not a pqloader.mix state (version {STATE_VERSION})")
        theirs = state.get("config", {})
        if not isinstance(theirs, Mapping):
            raise InvalidDataError("not a pqloader.mix state: its config is not a mapping")
        seed, seeds = self._adoptable_seeds(theirs)
        mine = self._config(seed, seeds)
        diffs = _config_diffs(self._names, mine, theirs)
        if diffs:
            raise InvalidDataError("cannot load a mixture state taken with different " + "; ".join(diffs))
        epoch, batch = state.get("epoch"), state.get("batch")
        for key, value in (("epoch", epoch), ("batch", batch), ("end", state.get("end"))):
            # (a float or a str was "position (0, 3.0) is not one of this mixture", naming
            # no type; NumPy ints were refused so, and end np.int64(1) "not an epoch after 0")
            if not _is_int(value) and not (key == "end" and value is None):
                raise InvalidDataError(f"mixture state[{key!r}] must be an int"
                                       f"{' or None' if key == 'end' else ''}, got "
                                       f"{type(value).__name__} {value!r:.100}")
        epoch, batch = int(epoch), int(batch)
        # (bools are not positions; epochs past MAX_EPOCH are refused here, as a Loader's
        # state and set_epoch refuse them, not at the first batch or as the binding's TypeError)
        if not _is_int(epoch) or not _is_int(batch) or not 0 <= epoch <= MAX_EPOCH or \
                not 0 <= batch <= (batches := self._batches_with_seed(epoch, seed)):
            raise InvalidDataError(f"mixture state position ({epoch!r}, {batch!r}) is not one of this "
                                   f"mixture (epochs 0 to {MAX_EPOCH})")
        # At an epoch's start no row of it was consumed, and after its last batch none is
        # left (each source starts the next epoch over): any order resumes it.
        if 0 < batch < batches:
            for fp in mine["source_fingerprints"]:
                _state.check_window_streams(state.get("version"), bool(fp.get("shuffle")),
                                            int(fp.get("world_size") or 1), epoch)
        end = state.get("end")
        end = None if end is None else int(end)
        # (an end past the last epoch's was taken, and the next iteration refused instead)
        if end is not None and (not _is_int(end) or not epoch <= end <= MAX_EPOCH + 1):
            raise InvalidDataError(f"mixture state['end'] {end!r} is not an epoch after {epoch} "
                                   f"(at most {MAX_EPOCH + 1}, the end of the last one)")
        with self._lock:
            for loader, s in zip(self._loaders, seeds):
                if s != loader.seed:
                    loader._adopt_seed(s)
            self._seed = seed
            self._lengths.clear()  # drawn with the seed
            self._kept = None
            self._seeds_version += 1
            self._epoch, self._batch = epoch, batch
            # The rest of the interrupted iteration: up to where it would have stopped.
            self._resume_end, self._active_end = end, None
            self._loaded = True  # (set_epoch of its epoch keeps it)
            self._generation += 1
            self._stop_stream()  # running iterators stop, and their stream with them

    def _adoptable_seeds(self, theirs: Mapping[str, Any]) -> tuple[int, list[int]]:
        """The mixture's seed and the sources' that loading `theirs` would set: a drawn
        seed (``seed=None``) takes the state's, the others stay."""
        def valid(v: Any) -> bool:
            return _is_int(v) and 0 <= v < 2**64

        fps = theirs.get("source_fingerprints")
        fps = fps if isinstance(fps, (list, tuple)) and len(fps) == len(self._loaders) else [None] * len(self._loaders)
        seeds = []
        for loader, fp in zip(self._loaders, fps):
            s = fp.get("seed") if isinstance(fp, Mapping) else None
            seeds.append(int(s) if loader._seed_drawn and valid(s) else loader.seed)
        seed = theirs.get("seed")
        return (int(seed) if self._seed_drawn and valid(seed) else self._seed), seeds

    def __repr__(self) -> str:
        return (f"pqloader.Mixture({dict(zip(self._names, self._weights))}, batch_size={self._batch_size}, "
                f"seed={self._seed}, stop={self._stop!r}, samples_per_epoch={self._samples})")


def _finite_float(value: Any) -> bool:
    """Whether `value` is a finite double (10**400 raised OverflowError, naming no source)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _is_int(value: Any) -> bool:
    return _state.is_state_int(value)


def _without_rank(fingerprint: Any) -> Any:
    """A source's fingerprint without its rank: the ranks of a job mix the same sequence."""
    if not isinstance(fingerprint, Mapping):
        return fingerprint
    return {k: v for k, v in fingerprint.items() if k != "rank"}


def _config_diffs(names: Sequence[str], mine: Mapping[str, Any], theirs: Mapping[str, Any]) -> list[str]:
    """What differs between two mixture configs, the sources' ranks aside (named: the
    option of the source, e.g. "source 'web' world_size: state has 2, mixture has 4")."""
    diffs = []
    for k in mine:
        if k != "source_fingerprints":
            # (a tuple for a list: the same; a NumPy value against a list is no bool)
            if not _state._same(mine[k], theirs.get(k)):
                diffs.append(f"{k}: state has {theirs.get(k)!r:.200}, mixture has {mine[k]!r:.200}")
            continue
        a, b = mine[k], theirs.get(k)
        if not isinstance(b, (list, tuple)) or len(b) != len(a):
            diffs.append(f"{k}: state has {b!r:.200}")
            continue
        for name, fa, fb in zip(names, a, b):
            fa, fb = _without_rank(fa), _without_rank(fb)
            if not isinstance(fb, Mapping):
                diffs.append(f"source {name!r}: state has {fb!r:.200}")
                continue
            diffs += [f"source {name!r} {o}: {d}" for o in fa
                      if (d := option_diff(o, fb.get(o), fa[o], "mixture")) is not None]
    return diffs


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One state of a mixture's ranks (see :func:`pqloader.merge_states`): ranks mix in
    lockstep, so every rank's is the same but for the sources' ranks, and each loads on
    any rank; refused where they differ in more (another position among them)."""
    def rank(s: Mapping[str, Any]) -> Any:
        fps = s.get("config", {}).get("source_fingerprints") if isinstance(s.get("config"), Mapping) else None
        return fps[0].get("rank") if isinstance(fps, list) and fps and isinstance(fps[0], Mapping) else None

    for s in states:
        if not _state.is_mix_state(s) or not _state.is_version(s.get("version")) or rank(s) is None:
            raise InvalidDataError(f"not a pqloader.mix state: {s!r:.200}")
    if len({int(s["version"]) for s in states}) > 1:
        raise InvalidDataError("merge_states: the ranks' mixture states were saved by pqloaders of "
                               "other state versions")
    ranks = [rank(s) for s in states]
    world = states[0]["config"]["source_fingerprints"][0].get("world_size")
    # (NumPy ints as the states take them; a rank that is no int was a bare TypeError)
    if not is_state_int(world) or not all(is_state_int(r) for r in ranks) \
            or sorted(int(r) for r in ranks) != list(range(int(world))):
        last = int(world) - 1 if is_state_int(world) else "?"
        raise InvalidDataError(f"merge_states needs one mixture state per rank 0..{last}, got ranks {ranks}")
    by_rank = sorted(states, key=lambda s: int(rank(s)))
    first = by_rank[0]

    def same(s: Mapping[str, Any]) -> Any:
        config = dict(s["config"])
        config["source_fingerprints"] = [_without_rank(f) for f in config["source_fingerprints"]]
        return _jsonish([s.get("epoch"), s.get("batch"), s.get("end"), config])

    for s in by_rank[1:]:
        if not _state._equal(same(s), same(first)):  # (NumPy values compare element-wise)
            raise InvalidDataError(
                f"rank {rank(s)}'s mixture state differs from rank 0's (epoch {s.get('epoch')}, batch "
                f"{s.get('batch')} against {first.get('epoch')}, {first.get('batch')}, or options): a "
                "mixture resumes every rank from one position, so its ranks must be in step")
    return _jsonish(dict(first))


# A forked child gets a fresh lock for each live mixture (another thread may have held
# one at the fork); its streams made before the fork refuse to run there (bindings.cc).
_live: "weakref.WeakSet[Mixture]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for m in list(_live):
        m._lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def mix(sources: Mapping[str, Any] | Sequence[Any], weights: Mapping[str, float] | Sequence[float],
        **options: Any) -> Mixture:
    """Mix several Loaders into one stream, each position drawn by weight.

    Batch b holds the rows its positions draw, grouped by source inside the batch
    (source 0's first). When every output column has rows of one shape (numbers,
    fixed-size lists, transforms with a fixed output shape, lists padded to a fixed
    length), the sources write their rows of each batch straight into it — from their
    shuffle-window gathers, or as they assemble their own batches — as long as the
    epoch is read from its start and no source runs out within it; otherwise batches
    are copied in C++ from the sources' own (off the GIL), with the same bytes. Each
    source runs its own ``num_workers`` (a source ahead of the mixture waits, leaving
    the cores to those behind) and keeps its own ``max_inflight_bytes``: a mixture runs
    up to the sum of its sources' workers and holds up to the sum of their bounds
    (lower them for mixtures of many sources: in a container, when they add up to more
    than half its memory limit, a ``RuntimeWarning`` names the value; each source left
    without one holds an eighth of it, so from five such sources on), plus, with ``stop``, the draws that found an
    epoch's length (a byte per position, up to 16 MiB), which its batches then read
    instead of drawing them again. In an iteration of several epochs, the sources'
    next epoch starts while one ends (its batches are the same).

    Args:
        sources: ``{name: Loader}`` (names that differ as text: ``{1: a, "1": b}`` is
            refused) or a list of Loaders, each with its own columns,
            transforms and filter; their output columns (names, dtypes, shapes) must
            agree. They must share rank and world size (each is sharded by its own
            options); output='numpy' (convert with this ``output``). List columns
            batched ragged or padded to each batch's longest row (``lists=``) are
            collated again over each mixed batch's rows: give the sources the same
            ``lists=`` for them. Sources that pack documents (``pack=``) are mixed
            block by block when they all pack blocks of one ``seq_len`` (each block
            keeps its own documents; each mixed batch's ``cu_seqlens`` is made again
            over its blocks); packing and unpacked sources do not mix.
        weights: One finite weight >= 0 per source (a dict by name, or a list; NumPy
            numbers too), whose sum a double holds; normalised.
        batch_size: Rows per batch (default: the first source's).
        seed: Keys the draws (default: the first source's seed).
        samples_per_epoch: Samples per epoch over all ranks. Default: until a source
            runs out (``stop``).
        stop: Without samples_per_epoch: ``"first"`` (default) ends the epoch when the
            first source runs out of its epoch's rows, ``"last"`` when every source has
            been read whole at least once (the others restart, reshuffled). Under
            ``"first"``, a source of weight > 0 without rows on this rank (its filter,
            shard or drop_last leave it none) makes the epoch empty: a ``RuntimeWarning``
            names it, once per source.
        drop_last: Drop the epoch's last partial batch (a bool: ``"False"`` is refused).
        num_epochs: Epochs per iteration (None: forever). Default 1.
        source_column: Name (a non-empty str, not a column of the sources) of the int64
            column giving each row's source index (None: no such column). Default
            ``"source"``.
        output: ``"numpy"`` or ``"torch"`` (zero-copy ``torch.from_numpy``).
        batch_transform: A Python callable applied to each mixed batch (a dict of
            NumPy arrays and lists) before ``output``'s conversion. Sources may not
            have their own (their batches are mixed in C++).

    Returns:
        A :class:`Mixture`: iterable, with ``state_dict``/``load_state_dict``,
        ``set_epoch``, ``len`` and ``close()`` (also a context manager).
    """
    return Mixture(sources, weights, **options)
