"""The public Loader: a façade that wires options, engine, iteration and checkpoints.

The parts live in private modules: ``_options`` (every argument, its default, what it
means — ``ARGUMENT_DOCS``, filled into this class's docstring — and its checks; the
engine's option format), ``_env`` (sources, storage options, rank and world
size), ``_process`` (the engine across fork and exit), ``_iteration`` (epochs, the
batch_transform thread, the hand-out that moves the position) and ``_state``
(checkpoints). torch is imported only for ``output="torch"`` (``_iteration.make_output``).
"""

from __future__ import annotations

import collections
import os
import threading
import warnings
from typing import Any, Callable, Iterator, Mapping, Sequence

from pqloader import _core, _env, _iteration, _lists, _process, _state, _stats_table
from pqloader._arrow import ArrowSchema
from pqloader._env import Source
from pqloader._errors import InvalidDataError, user_stacklevel
from pqloader._column_checks import (check_decoded_fills, check_fill_types, check_stack_units,
                                     explain_decoded_nulls)
from pqloader._options import ARGUMENT_DOCS, EPOCH_HINT, MAX_EPOCH, LoaderOptions, check_int

_D = LoaderOptions  # the defaults of every argument are LoaderOptions' field defaults


def _column_infos(infos: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The engine's column_info list as ``Loader.column_info``'s dict."""
    return {c["name"]: {"dtype": c["dtype"], "shape": None if c["shape"] is None else tuple(c["shape"]),
                        "arrow_type": c["arrow_type"], "partition": c["partition"], "mask": c["mask"],
                        "transformed": c["transformed"]}
            for c in infos}


class Loader:
    """Stream batches of NumPy arrays (or torch tensors) from Parquet files, deterministically.

    Every per-row step (read, decode, convert, shuffle, gather) runs in C++ worker
    threads with the GIL released. The batches are a pure function of the data, the
    data-affecting options, the seed, the epoch and the rank: they do not depend on
    ``num_workers``, timing or restarts (see docs/determinism.md).

    Args:
        source: A file, a directory (read recursively; names starting with ``.`` or
            ``_`` are skipped), a glob pattern, a ``file://`` (the path after it,
            percent-decoded: ``#`` and ``?`` are part of it) or ``s3://bucket/prefix``
            URI (``gs://``, ``hdfs://`` where the Arrow build supports them), or a list
            of these. Directory and glob matches are sorted by path (a directory a glob
            matches is read recursively); list order is kept (a set, which has none, is
            a ``TypeError``; a path holding a NUL character, a ``ValueError``). A file
            listed twice, or also under a listed directory, is read twice, as
            ``pyarrow.dataset.dataset`` reads a list.
        {arguments}
    Raises:
        TypeError: An argument has the wrong type (e.g. ``shuffle="no"``), or a
            ``fill_null`` value does not suit its column's type.
        ValueError: An argument is out of range or not among the accepted values; the
            message names it and what is accepted.
        pqloader.DataNotFoundError: The source holds no files (or bucket, key).
        pqloader.IOError: Storage failed (network, timeout, permission), naming the URL.
        pqloader.InvalidDataError: A file is not readable Parquet, or holds values the
            loader refuses; also options the engine checks against the data or the
            storage (``storage_options`` values, ``stack=``, a filter, a state). It is a
            ``ValueError``: ``except ValueError`` catches every refused argument.
        pqloader.SchemaMismatchError: Files disagree on a selected column.
        pqloader.ColumnNotFoundError: A selected column does not exist.
        pqloader.UnsupportedTypeError: A selected column cannot become a tensor.
        RuntimeError: ``device`` names a CUDA device and torch has no CUDA.

    Example:
        >>> loader = pqloader.Loader("data/train", batch_size=1024, shuffle=True, seed=7)
        >>> for batch in loader:
        ...     x, y = batch["features"], batch["label"]
    """

    def __init__(
        self,
        source: Source,
        columns: Sequence[str] | None = _D.columns,
        batch_size: int = _D.batch_size,
        num_workers: int | None = _D.num_workers,
        shuffle: bool = _D.shuffle,
        seed: int | None = _D.seed,
        num_epochs: int | None = _D.num_epochs,
        drop_last: bool = _D.drop_last,
        *,
        shuffle_window: int = _D.shuffle_window,
        rank: int | None = _D.rank,
        world_size: int | None = _D.world_size,
        shard_policy: str = _D.shard_policy,
        fill_null: Any = _D.fill_null,
        max_inflight_bytes: int | None = _D.max_inflight_bytes,
        prefetch_batches: int | None = _D.prefetch_batches,
        verify_checksums: bool = _D.verify_checksums,
        transforms: Mapping[str, Sequence[Any]] | Callable[[dict], dict] | None = _D.transforms,
        lists: Mapping[str, Any] | None = _D.lists,
        pack: Any = _D.pack,
        stack: Mapping[str, Sequence[str]] | None = _D.stack,
        batch_transform: Callable[[dict], dict] | None = _D.batch_transform,
        on_decode_error: str = _D.on_decode_error,
        strings: str = _D.strings,
        cache_dir: str | os.PathLike[str] | None = _D.cache_dir,
        cache_size_limit: int | None = _D.cache_size_limit,
        cache_policy: str = _D.cache_policy,
        cache_shards: int = _D.cache_shards,
        cache_wait_timeout: float = _D.cache_wait_timeout,
        storage_options: Mapping[str, Any] | None = _D.storage_options,
        io_threads: int = _D.io_threads,
        readahead: int | None = _D.readahead,
        output: str = _D.output,
        pin_memory: bool | None = _D.pin_memory,
        device: Any = _D.device,
        device_prefetch: int = _D.device_prefetch,
        row_groups: Mapping[str, Sequence[int]] | None = _D.row_groups,
        null_mask: bool | Sequence[str] | None = _D.null_mask,
        decimals: str = _D.decimals,
        coerce_int96_timestamp_unit: str | None = _D.coerce_int96_timestamp_unit,
        schema: Any = _D.schema,
        use_summary: bool | str = _D.use_summary,
        filter: Any = _D.filter,
        _debug_max_delay_us: int = _D._debug_max_delay_us,
    ) -> None:
        arguments = {k: v for k, v in locals().items() if k not in ("self", "source")}
        sources = _env.normalize_sources(source)
        options = LoaderOptions(**arguments)
        self._seed_drawn = options.seed is None and options.shuffle
        # Rank and world size found rather than given: checked again when iterating.
        self._rank_world_found = options.rank is None and options.world_size is None
        options = options.resolve(_core.draw_seed)
        self._output = _iteration.make_output(options)
        self._cursor = _iteration.Cursor()
        engine_options = options.to_engine()
        self._engine = _process.Engine(sources, engine_options, on_fork=self._cursor.invalidate_after_fork)
        self._max_inflight_bytes = engine_options["max_inflight_bytes"]  # what the engine got
        self._columns = _column_infos(self._engine.column_info())
        if not self._columns:
            # (schema=pa.schema([]) without partition keys: len() counted the rows' batches
            # and iterating handed out none, where columns=[] is refused)
            raise ValueError("schema= declares no column and the sources have no partition key: "
                             "nothing to load; declare at least one field, or schema=None for "
                             "every column")
        # Before any data is read; stacked columns by their members.
        unstacked = self._columns if options.stack is None else \
            _column_infos(self._engine.column_info(stacked=False))
        made = _lists.made_columns(options.lists, options.pack, options.transforms)
        check_fill_types(options.fill_null, {k: v for k, v in unstacked.items() if k not in made})
        check_decoded_fills(options.fill_null, options.transforms, unstacked)
        check_stack_units(options.stack, options.decimals, unstacked)
        _lists.check_values_fit(options.lists, options.pack, options.transforms, self._columns)
        try:
            self._engine.check_before_first_batch()  # nulls, ragged lists: from the footers
        except InvalidDataError as e:
            text = explain_decoded_nulls(str(e), options.transforms)
            if text is None:
                raise
            raise type(e)(text) from None
        self._sources = sources
        self._options = options
        self._plan = self._engine.plan_info()
        _env.check_shuffle_window(self._plan["max_window_bytes"], self._plan["gathers_windows"],
                                  options.shuffle_window, self._max_inflight_bytes)
        self._clock = _iteration.ConsumerClock()

    # -- properties ------------------------------------------------------------------
    @property
    def seed(self) -> int:
        """The seed of every random choice (drawn when shuffling without one)."""
        return self._options.seed

    @property
    def epoch(self) -> int:
        """The epoch of the batch last handed out, or of the next one before any (after
        an epoch's last batch it stays that epoch until the next batch, or the end of the
        ``for`` loop, moves it on): what a training loop logs with each batch."""
        return self._cursor.epoch

    @property
    def sources(self) -> list[str]:
        """The sources, as opened: absolute local paths and URIs."""
        return list(self._sources)

    @property
    def options(self) -> LoaderOptions:
        """Every argument but ``source``, checked, with seed, rank and world size settled.

        ``Loader(loader.sources, **loader.options.to_kwargs())`` makes a loader that
        yields the same batches.
        """
        return self._options

    @property
    def skipped_files(self) -> list[tuple[str, str]]:
        """Files found under the sources that are not Parquet, with why: (path, reason)."""
        return [tuple(f) for f in self._plan["skipped_files"]]

    @property
    def num_rows(self) -> int:
        """Rows per epoch for this rank (after the shard policy, before drop_last)."""
        return self._plan["num_rows"]

    @property
    def column_info(self) -> dict[str, dict[str, Any]]:
        """Per output column: NumPy dtype (or "str"/"bytes"), per-row shape, Arrow type.

        A list column's variable dimension is -1. A column with transforms
        (``"transformed": True``) has the dtype and shape its ops declare before any data:
        e.g. ``DecodeImage(), RandomResizedCrop(224), Normalize(...), ToCHW()`` gives
        float32 ``(3, 224, 224)``; a dimension that depends on the data is -1 (an image's
        height and width without a crop or resize to a fixed size), and dtype or shape is
        None where even that depends on the data (``DecodeNdarray()`` without ``Cast``).
        A final ``PadOrTruncate`` lays the batch out as ``lists=`` does: alone, it leaves
        the column untransformed (the stored dtype, its length in the shape).
        ``arrow_type`` stays the stored column's.
        """
        return {name: dict(info) for name, info in self._columns.items()}

    @property
    def arrow_schema(self) -> ArrowSchema:
        """The Arrow schema of the columns the loader reads, as stored (the files' types
        unified, or the declared ``schema``; struct fields by dotted path; partition keys
        int64 or string; ``_valid`` masks bool): before ``lists=`` padding, transforms and
        ``stack=``, so a list column stays a list and stacked columns stay apart
        (``column_info`` describes the batches' arrays). Exported through the Arrow
        PyCapsule protocol: ``pa.schema(loader.arrow_schema)``,
        ``loader.arrow_schema.to_pyarrow()``, or any other Arrow library. Works with any
        pyarrow >= 14 installed, whatever Arrow pqloader carries.
        """
        return ArrowSchema(self._engine.arrow_schema_capsule)

    @property
    def shard_info(self) -> dict[str, int]:
        """Rows dropped or repeated per epoch (all ranks) to equalise ranks. With ``pack``,
        0 and 0: each rank packs its own documents once, and the blocks are equalised
        instead (``len()``: a rank's last blocks dropped, or blocks of padding added)."""
        return {"rank": self._options.rank, "world_size": self._options.world_size,
                "dropped": self._plan["dropped"], "padded": self._plan["padded"],
                "drop_last_rows": self._plan["drop_last_rows"]}

    def __len__(self) -> int:
        """Batches per epoch for this rank (of the current epoch: with ``pack`` and several
        ranks, the equalised number of blocks can differ between epochs). Inside a loop,
        of the epoch it is in; between loops, of the epoch the next loop starts in (after
        a loop left at its epoch's last batch, without reaching the end, the next epoch,
        as for ``pqloader.torch.DataLoader``). A resumed epoch counts whole, as its batches
        are numbered, but for an elastic resume (another world size or batch size), whose
        rest of the epoch is dealt anew: its batches, counted from 0.

        Raises:
            ValueError: The rank and world size were found before the process group was
                initialised and it says otherwise (as iterating raises).
        """
        self._check_rank_world()  # (a count of rank 0 of 1: a scheduler sized world-size times too long)
        c = self._cursor
        with c.lock:  # (one position: a load_state_dict from another thread moves it)
            epoch, batch, elastic = c.epoch, c.batch, c.elastic_for(c.epoch)
            # No loop in progress, and none restored to end with this epoch: the next
            # loop starts in the next epoch once this one ended (a loop that took
            # len() batches and stopped without reaching the end). Counting the ended
            # epoch sized the next loop with another epoch's count (pack, an elastic rest).
            between = c.live != c.generation and c.resume_end is None
        if between and epoch < MAX_EPOCH and _iteration.position_ended(self._engine, epoch, batch, elastic):
            epoch, elastic = epoch + 1, None
        return self._engine.num_batches(epoch, elastic)

    def _batches_in_epoch(self, epoch: int) -> int:
        """Batches of `epoch` for this rank, run from its start (no elastic rest)."""
        return self._engine.num_batches(epoch, None)

    def _next_iteration_epoch(self) -> int:
        """The epoch the next ``iter(loader)`` starts in (the one after the position's
        when that epoch has ended, as :func:`_iteration.read_batches` moves on)."""
        c = self._cursor
        with c.lock:
            epoch, batch, elastic = c.epoch, c.batch, c.elastic_for(c.epoch)
        return epoch + 1 if _iteration.position_ended(self._engine, epoch, batch, elastic) else epoch

    # -- iteration -------------------------------------------------------------------
    def _reads_ahead(self) -> bool:
        """Whether iterations read batches ahead of the consumer (a batch_transform's
        thread, the output's staging): their batches are then counted as handed out."""
        return self._options.batch_transform is not None or self._output is not None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        _process.check_not_in_dataloader_worker(self)
        self._check_rank_world()
        generation = self._cursor.invalidate()  # an older iterator stops
        end: list[int] = []
        o = self._options
        left = threading.Event()  # (set by wake: see read_batches)
        # (only where batches are read ahead of the consumer: a stats() call per batch)
        taken: collections.deque[int] | None = collections.deque() if self._reads_ahead() else None
        items = _iteration.read_batches(self._engine, self._cursor, generation,
                                        num_epochs=o.num_epochs, warn_cache=o.cache_dir is not None,
                                        end=end, left=left, taken=taken)
        if o.batch_transform is not None:
            def wake() -> None:  # the consumer left: its thread's next() stops waiting
                cursor = self._cursor
                with cursor.lock:
                    left.set()  # and no next epoch starts after the stop
                    if generation == cursor.generation:  # (else a newer run is not ours to stop)
                        self._engine.stop()

            cursor = self._cursor  # (the thread holds the cursor, not the loader)
            items = _iteration.threaded_map(o.batch_transform, items, o.prefetch_batches or 2, wake,
                                            self._clock, stale=lambda: cursor.generation != generation)
        if self._output is not None:
            items = self._output.wrap(items)
        return _iteration.hand_out(self._cursor, generation, items, end, self._clock, taken)

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at the first batch of `epoch`.

        Running iterators stop. Like ``DistributedSampler.set_epoch``; not needed when
        one loader runs all epochs (each iteration continues the epoch count).

        After ``load_state_dict`` (before iterating), ``set_epoch`` of the state's own
        epoch keeps the loaded position: the next iteration runs the rest of that epoch
        (nothing of it when the state was taken at its end), as the usual resume loop
        ``for e in range(start, n): loader.set_epoch(e); for batch in loader: ...``
        expects (it started the epoch over, handing out again what the state had
        consumed). Another epoch drops the loaded position, with a ``UserWarning`` when the
        state was inside its epoch (the rest of it is not run). To start a loaded state's
        epoch over, build the loader anew (with the state's ``seed``) without loading it.

        Args:
            epoch: The epoch, at least 0.

        Raises:
            TypeError, ValueError: `epoch` is not an int >= 0.
        """
        self._set_epoch(check_int("epoch", epoch, 0, MAX_EPOCH, EPOCH_HINT))

    def _set_epoch(self, epoch: int, warn: bool = True, keep: bool = True, kept: bool = False) -> None:
        """:meth:`set_epoch` of a checked `epoch`; `warn`: say when it drops a loaded
        position inside its epoch; `keep`: keep a loaded position of `epoch`
        (``IterableDataset`` decided both when its own set_epoch ran); `kept`: keep the
        position of `epoch`, loaded or not (``IterableDataset`` kept it as its state)."""
        def stop() -> None:
            if self._cursor.running:  # wake an iterator blocked in another thread
                self._engine.stop()

        c = self._cursor
        dropped = None
        # The engine stops in the same step as the iterators: a newer iteration that
        # another thread starts meanwhile keeps its run.
        with c.lock:
            elastic = c.elastic_for(c.epoch)
            if (kept or (keep and c.loaded)) and epoch == c.epoch:  # the rest of the loaded epoch, as set_epoch's iteration
                n = self._options.num_epochs
                c.seek(epoch, c.batch, None if n is None else epoch + n, elastic, stop=stop, loaded=c.loaded)
                return
            if c.loaded and _iteration.position_within(self._engine, c.epoch, c.batch, elastic):
                dropped = c.epoch
            c.seek(epoch, 0, stop=stop)
        if dropped is not None and warn:
            warnings.warn(_iteration.loaded_position_dropped(epoch, dropped), UserWarning, stacklevel=user_stacklevel())

    def close(self) -> None:
        """Stop the worker threads and wait for them.

        Iteration keeps reading ahead after an epoch ends (the next epoch's first
        units, for the next ``for`` loop). After ``close()`` returns nothing more is
        read, decoded or written to ``cache_dir`` (which may then be deleted); the
        read-ahead is dropped and running iterators stop (their next ``next()``
        raises), and its idle storage threads and its share of the buffer pool's
        cache of freed blocks (2 x ``max_inflight_bytes``) are let go. The loader stays
        usable: iterating again starts reading anew from the current position. Also
        called on leaving ``with Loader(...) as loader:``. (An object-store request in
        flight ends after its current attempt: no retry, its bytes unread.)
        """
        self._cursor.invalidate(stop=self._engine.close)  # one step: see set_epoch

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getitem__(self, index: Any) -> Any:
        raise TypeError(
            "pqloader.Loader is iterable, not indexable: it yields whole batches and replaces "
            "torch.utils.data.DataLoader (iterate it directly). To use a DataLoader anyway, give it "
            "pqloader.torch.IterableDataset(loader) with batch_size=None.")

    def __reduce__(self) -> Any:
        raise TypeError(
            "a pqloader.Loader cannot be pickled (it owns C++ threads); for DataLoader worker "
            "processes use pqloader.torch.IterableDataset(loader), which rebuilds it in each worker")

    # -- statistics ------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters since the loader was made.

        Returns:
            rows, batches, units_read (row-group slices), bytes_read (compressed
            Parquet bytes), bytes_decoded, read_seconds, decode_seconds,
            transform_seconds and assemble_seconds (worker time, all threads; unit_seconds:
            producing units, reading, decoding, caching and transforms), wait_seconds (time the
            consumer spent inside next(): waiting for the engine, converting, staging
            to the device), of which engine_wait_seconds blocked on the engine (with a
            ``batch_transform``: waiting for its thread, which reads the engine ahead),
            wall_seconds (since the first iteration), wait_fraction (wait_seconds /
            wall_seconds: the data stall), time_to_first_batch_seconds, skipped_rows,
            batches_by_consumer (assembled on the consumer's thread, all workers busy),
            dropped / padded (rows ``shard_policy`` drops or repeats in each epoch),
            peak_inflight_bytes, the buffer pool's pool_allocations / pool_recycled /
            pool_cached_bytes / pool_fresh_bytes (fresh pages: see docs/performance.md),
            and cache_hits / cache_misses / cache_bytes_saved and the other cache_*
            counters: inserts refused by reason (cache_refused_full, _later,
            _too_large, _stale; cache_skipped_full is their sum but _stale),
            cache_evictions (of which cache_evicted_stale), cache_corrupt (entries
            damaged, dropped), cache_read_errors (entries the OS could not read, kept;
            their row groups read from the source), cache_waits /
            cache_wait_seconds / cache_wait_timeouts (waits for another process's
            fetch). bytes_fetched: compressed bytes of the row groups requested from
            storage since the loader was made, decoded or not (what it cost the
            storage; read-ahead included). The next epoch is read while one ends (also between two
            ``for`` loops with ``num_epochs=1``): epochs_started_ahead counts those
            begun so, and their work counts only once their epoch begins;
            units_dropped_ahead counts units read ahead for the next epoch and dropped
            unused: another epoch followed (``set_epoch``), none did (the end of
            training, ``close()``), or the iteration was left (``break``, a new
            ``iter()``, ``load_state_dict``) before its epoch ended, whose next
            iteration reads them again. rows and batches count those handed out.
            footers_from_cache / footers_from_summary: files whose footers came from
            the footer cache / whose row-group layout came from a summary (``_metadata``)
            instead of their own footers. With ``pack``: pack_lengths_from_cache /
            pack_lengths_stored: files whose documents' lengths came from ``cache_dir``
            / were read and kept there by this loader. With a ``filter``: filter_files,
            filter_files_pruned (by partition keys), filter_row_groups,
            filter_row_groups_pruned_partition / _pruned_statistics / _pruned_mask,
            filter_row_groups_all_rows (kept whole by partition keys), filter_row_groups_masked
            (read for a row mask), filter_rows / filter_rows_kept, filter_bytes /
            filter_bytes_pruned (compressed bytes of the selected columns, and of those in
            pruned row groups), filter_mask_bytes_read (read by the mask pass),
            filter_from_store (the selection came from ``cache_dir``).
        """
        s = self._clock.stats(self._engine.stats(), threaded=self._options.batch_transform is not None)
        if self._reads_ahead():
            # Handed out: the engine counts also those a batch_transform's thread or the
            # output holds ahead of the consumer, those an iteration left early dropped
            # (and again when re-read), and one a stale check dropped as it was taken.
            # (the cursor's: a forked child's engine counts from 0, and so do they)
            s["batches"], s["rows"] = self._cursor.handed
        if self._options.filter is not None:
            s.update({f"filter_{k}": v for k, v in self._plan["filter"].items()})
        s.update({"dropped": self._plan["dropped"], "padded": self._plan["padded"],
                  "footers_from_cache": self._plan["footers_from_cache"],
                  "footers_from_summary": self._plan["footers_from_summary"]})
        if self._options.pack is not None:
            s.update({"pack_lengths_from_cache": self._plan["pack_lengths_from_cache"],
                      "pack_lengths_stored": self._plan["pack_lengths_stored"]})
        return s

    def stats_table(self) -> str:
        """:meth:`stats` as a per-stage table (read, decode, transform, gather, wait:
        seconds and share) and a one-line diagnosis; see :func:`pqloader.format_stats`."""
        return _stats_table.format_stats(self.stats())

    # -- checkpointing ---------------------------------------------------------------
    def _fingerprint(self, seed: int) -> dict[str, Any]:
        return _state.fingerprint(self._sources, self._plan["files"], list(self._columns),
                                  self._options, self._engine.transform_fingerprint(), seed)

    def state_dict(self) -> dict[str, Any]:
        """Return the position after the last batch handed out, as a JSON-safe dict."""
        c = self._cursor
        with c.lock:  # one consistent position, whichever thread is iterating
            epoch, batch, elastic = c.epoch, c.batch, c.elastic_for(c.epoch)
            # The running iteration's end, or one loaded for the next iteration.
            end = c.active_end if c.active_end is not None else c.resume_end
        return _state.make_state(epoch, batch, end, self.seed, self._fingerprint(self.seed), elastic)

    def _check_rank_world(self) -> None:
        """Refuse to iterate a rank and world size found before the process group was
        (``_env.check_process_group_agrees``); given ones are the caller's."""
        if self._rank_world_found:
            _env.check_process_group_agrees(self._options.rank, self._options.world_size)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue exactly after the last batch of the run that produced `state`.

        The next ``iter(loader)`` yields the rest of the interrupted iteration (up to the
        epoch where it would have stopped); later iterations run ``num_epochs`` each.

        A loader whose seed was drawn (``seed=None`` with ``shuffle=True``) adopts the
        state's seed (an unshuffled one's ``seed=None`` is 0). Every other
        data-affecting option must match. The state is checked completely first: a
        refused state leaves the loader (seed, position, running iterators) unchanged.
        Its counts may be NumPy ints (a state rebuilt with NumPy), not bools or floats.

        Raises:
            pqloader.InvalidDataError: The state is malformed (the message names the bad
                field) or was taken with other options (it names them).
        """
        restored = self._check_state(state)
        self._cursor.seek(restored.epoch, restored.batch, restored.iteration_end,
                          restored.elastic, stop=self._engine.stop, loaded=True)  # iterators stop

    def _check_state(self, state: Mapping[str, Any], as_world: int | None = None) -> Any:
        """Check `state` against this loader's options and adopt its seed (a loader built
        with ``seed=None``); return what it restores (``_state.parse_state``). With
        `as_world`, the options are compared as rank 0 of that many ranks' (the state of
        a packed loader's DataLoader workers, which this loader checks but cannot load).
        """
        fingerprint_for = self._fingerprint if as_world is None else (
            lambda seed: dict(self._fingerprint(seed), rank=0, world_size=as_world))
        restored = _state.parse_state(state, num_batches=self._engine.num_batches, seed=self.seed,
                                      adopt_seed=self._seed_drawn, fingerprint_for=fingerprint_for)
        if restored.seed != self.seed:
            self._adopt_seed(restored.seed)
        return restored

    def _adopt_seed(self, seed: int) -> None:
        """Take a state's seed (a loader built with ``seed=None``; also a mixture's source)."""
        self._options = self._options.replace(seed=seed)
        self._engine.set_seed(seed)

    def __repr__(self) -> str:
        o = self._options
        return (f"pqloader.Loader({len(self._sources)} source(s), {self._plan['num_files']} files, "
                f"{self._plan['dataset_rows']} rows, batch_size={o.batch_size}, "
                f"shuffle={o.shuffle}, seed={o.seed}, rank={o.rank}/{o.world_size})")


if Loader.__doc__ is not None:  # None under python -OO
    Loader.__doc__ = Loader.__doc__.replace("        {arguments}\n", ARGUMENT_DOCS)

