"""The public Loader: argument checks and epoch bookkeeping over the C++ engine."""

from __future__ import annotations

import os
import queue
import threading
import warnings
import time
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, Union

from pqloader import _core, _process
from pqloader._errors import InvalidDataError

Source = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]

_STATE_VERSION = 1
# Options that change which rows land in which batch. A state can only be loaded into a
# loader that agrees on all of them.
_DATA_OPTIONS = (
    "sources", "files", "columns", "batch_size", "drop_last", "shuffle", "seed",
    "shuffle_window", "rank", "world_size", "shard_policy", "fill_null", "transforms",
    "on_decode_error",
)


def _normalize_sources(source: Source) -> list[str]:
    items = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    if not items:
        raise ValueError("source is empty: give a path, a directory, a glob or a list of them")
    out = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"source entries must be str or os.PathLike, got {type(item).__name__}")
        s = os.fspath(item)
        out.append(s if "://" in s else os.path.abspath(os.path.expanduser(s)))
    return out


def _transform_specs(transforms: Any) -> dict[str, list[tuple[str, dict[str, Any]]]] | None:
    """Turn {column: [pqloader.transforms.Op, ...]} into what the engine takes."""
    from pqloader.transforms import Op

    if transforms is None:
        return None
    if not isinstance(transforms, Mapping):
        raise TypeError("transforms must be a dict {column: [ops]} or a callable (dict -> dict)")
    out = {}
    for column, ops in transforms.items():
        if isinstance(ops, Op):
            ops = [ops]
        specs = []
        for op in ops:
            if not isinstance(op, Op):
                raise TypeError(f"transforms[{column!r}] must hold pqloader.transforms ops, got {op!r}")
            specs.append(op._spec())
        out[str(column)] = specs
    return out


_END = object()


def _threaded_map(fn: Callable[[dict], dict], items: Iterable[dict], depth: int) -> Iterator[dict]:
    """Apply `fn` to `items` in one background thread, keeping order; errors re-raise here.

    The engine releases the GIL while it works, so this thread overlaps with the
    consumer whenever `fn` spends time in code that releases the GIL too (NumPy, torch);
    pure-Python work in `fn` competes with the training loop for the GIL.
    """
    out: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def run() -> None:
        try:
            for item in items:
                result = fn(item)
                while not stop.is_set():
                    try:
                        out.put((True, result), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            out.put((True, _END))
        except BaseException as e:  # surfaces at the consumer
            out.put((False, e))

    thread = threading.Thread(target=run, name="pqloader-batch-transform", daemon=True)
    thread.start()
    try:
        while True:
            ok, value = out.get()
            if not ok:
                raise value
            if value is _END:
                return
            yield value
    finally:
        stop.set()
        thread.join()


def _storage_options(options: Mapping[str, Any] | None) -> dict[str, str]:
    """Storage options as text for the engine, which checks the keys and values.

    A ``retry_strategy`` given as a pyarrow ``S3RetryStrategy`` becomes its
    ``max_attempts`` (pqloader's backoff is used either way).
    """
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"storage_options must be a dict, got {type(options).__name__}")
    out = {}
    for key, value in options.items():
        if not isinstance(key, str):
            raise TypeError(f"storage_options keys must be str, got {key!r}")
        if key == "retry_strategy" and hasattr(value, "max_attempts"):
            key, value = "retry_max_attempts", value.max_attempts
        if value is None:
            continue
        if isinstance(value, bool):
            out[key] = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            out[key] = str(value)
        else:
            raise TypeError(f"storage_options[{key!r}] must be str, bool, int or float, "
                            f"got {type(value).__name__}")
    return out


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _check_fill(value: Any) -> Any:
    if value is not None and not isinstance(value, (int, float, str, bytes)):
        raise TypeError(f"fill_null values must be int, float, str or bytes, got {type(value).__name__}")
    return value


def _default_rank_world() -> tuple[int, int]:
    """Rank and world size of an initialised torch.distributed group, else RANK/WORLD_SIZE."""
    import sys

    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return _env_int("RANK") or 0, _env_int("WORLD_SIZE") or 1


class Loader:
    """Stream batches of NumPy arrays (or torch tensors) from Parquet files, deterministically.

    Every per-row step (read, decode, convert, shuffle, gather) runs in C++ worker
    threads with the GIL released. The batches are a pure function of the data, the
    data-affecting options, the seed, the epoch and the rank: they do not depend on
    ``num_workers``, timing or restarts (see docs/determinism.md).

    Args:
        source: A file, a directory (read recursively; names starting with ``.`` or
            ``_`` are skipped), a glob pattern, a ``file://`` or ``s3://bucket/prefix``
            URI (``gs://``, ``hdfs://`` where the Arrow build supports them), or a list
            of these. Directory and glob matches are sorted by path; list order is kept.
        columns: Columns to read (file columns or hive partition keys), in output
            order. ``None`` reads every column.
        batch_size: Rows per batch; batches span row-group and file boundaries.
        num_workers: C++ worker threads. ``None`` uses one per CPU.
        shuffle: Shuffle the order of row groups each epoch and rows within windows of
            ``shuffle_window`` consecutive row groups.
        seed: Seed of the shuffle. ``None`` with ``shuffle=True`` draws a fresh seed,
            exposed as ``loader.seed`` and recorded in ``state_dict()``.
        num_epochs: Epochs run by each ``iter(loader)``; ``None`` runs forever. Each new
            iteration continues the epoch count, so every epoch has a new order.
        drop_last: Drop the last, incomplete batch of each epoch.
        shuffle_window: Row groups whose rows are shuffled together. Larger windows
            shuffle better and hold more decoded data in memory.
        rank: This process's rank. Default: from an initialised ``torch.distributed``
            group, else the ``RANK`` environment variable, else 0.
        world_size: Number of ranks. Default: as for ``rank``, from ``WORLD_SIZE``, else 1.
        shard_policy: ``"drop"`` drops the last ``N % world_size`` rows of each epoch's
            order; ``"pad"`` repeats its first rows, so every rank gets the same count.
        fill_null: ``None`` makes nulls an error; a scalar replaces nulls in every column;
            a dict maps column names to their replacement.
        max_inflight_bytes: Soft bound on decoded data held ahead of the consumer.
        prefetch_batches: Batches assembled ahead of the consumer (default 2 per worker).
        verify_checksums: Verify Parquet page CRCs where the writer stored them.
        transforms: ``{column: [ops]}`` of :mod:`pqloader.transforms` ops, run per sample
            in the C++ workers; or a callable (dict -> dict), as for ``batch_transform``.
        batch_transform: A Python callable applied to every batch, in order, in one
            background thread. It holds the GIL while it runs Python code.
        cache_dir: Keep decoded, deterministically transformed row groups in this
            directory (shared by processes, kept across runs; see docs/cache_format.md),
            or ``":memory:"`` for this process only. Hits skip reading, decoding and
            those transforms; batches are bit-identical either way. If the directory is
            unusable or the disk fills up, a warning is issued and loading goes on uncached.
        cache_size_limit: Bytes the cache may hold (default: no limit).
        cache_policy: ``"keep"`` (default: fill until full, then stop inserting — best
            for reshuffled scans larger than the cache) or ``"lru"``.
        cache_shards: Fan-out directories, each with its own lock and
            ``cache_size_limit / cache_shards`` bytes.
        on_decode_error: ``"raise"`` (default): a failing transform (e.g. a corrupt
            image) raises, naming file, row group, row and column. ``"skip"``: the row is
            dropped from its batch (batches may be smaller; every rank still gets the
            same number of batches) and counted in ``stats()["skipped_rows"]``.
        storage_options: Options of ``s3://`` sources, named as the arguments of
            ``pyarrow.fs.S3FileSystem``: ``endpoint_override``, ``scheme``, ``region``,
            ``access_key``, ``secret_key``, ``session_token``, ``anonymous``,
            ``connect_timeout``, ``request_timeout``, ``tls_ca_file_path``,
            ``force_virtual_addressing``; retries: ``retry_max_attempts`` (default 3),
            ``retry_base_delay``, ``retry_max_delay`` (seconds). Unset ones come from the
            standard AWS sources (environment, ``AWS_ENDPOINT_URL``, profile).
        io_threads: Concurrent reads from storage (requests in flight), apart from the
            CPU workers.
        readahead: Row groups fetched ahead of decoding, in plan order (default:
            ``io_threads``); their compressed bytes stay within ``max_inflight_bytes``.
        output: ``"numpy"`` or ``"torch"``: numeric columns as ``torch.Tensor`` sharing
            the engine's memory (DLPack, no copy). torch is imported only then.
        pin_memory: Stage torch batches in pinned host memory. Default (``None``): when
            ``device`` is a CUDA device. Ignored, with a warning, without CUDA.
        device: Hand torch batches out on this device (e.g. ``"cuda:0"``), copied on a
            side CUDA stream ahead of use. Default: CPU, zero-copy.
        device_prefetch: Batches pinned/copied ahead of the consumer (with
            ``pin_memory`` or ``device``).

    Raises:
        pqloader.DataNotFoundError: The source holds no files (or bucket, key).
        pqloader.IOError: Storage failed (network, timeout, permission), naming the URL.
        pqloader.InvalidDataError: A file is not readable Parquet.
        pqloader.SchemaMismatchError: Files disagree on a selected column.
        pqloader.ColumnNotFoundError: A selected column does not exist.
        pqloader.UnsupportedTypeError: A selected column cannot become a tensor.

    Example:
        >>> loader = pqloader.Loader("data/train", batch_size=1024, shuffle=True, seed=7)
        >>> for batch in loader:
        ...     x, y = batch["features"], batch["label"]
    """

    def __init__(
        self,
        source: Source,
        columns: Sequence[str] | None = None,
        batch_size: int = 256,
        num_workers: int | None = None,
        shuffle: bool = False,
        seed: int | None = None,
        num_epochs: int | None = 1,
        drop_last: bool = False,
        *,
        shuffle_window: int = 4,
        rank: int | None = None,
        world_size: int | None = None,
        shard_policy: str = "drop",
        fill_null: Any = None,
        max_inflight_bytes: int = 256 << 20,
        prefetch_batches: int | None = None,
        verify_checksums: bool = False,
        transforms: Mapping[str, Sequence[Any]] | Callable[[dict], dict] | None = None,
        batch_transform: Callable[[dict], dict] | None = None,
        on_decode_error: str = "raise",
        cache_dir: str | os.PathLike[str] | None = None,
        cache_size_limit: int | None = None,
        cache_policy: str = "keep",
        cache_shards: int = 8,
        storage_options: Mapping[str, Any] | None = None,
        io_threads: int = 16,
        readahead: int | None = None,
        output: str = "numpy",
        pin_memory: bool | None = None,
        device: Any = None,
        device_prefetch: int = 2,
        _debug_delay_us: int = 0,
    ) -> None:
        self._init_kwargs = {k: v for k, v in locals().items() if k != "self"}
        sources = _normalize_sources(source)
        storage = _storage_options(storage_options)
        _check_int("io_threads", io_threads, 1)
        if readahead is not None:
            _check_int("readahead", readahead, 1)
        if columns is not None:
            if isinstance(columns, str):
                raise TypeError("columns must be a list of names, not a str")
            columns = [str(c) for c in columns]
        _check_int("batch_size", batch_size, 1)
        if num_workers is not None:
            _check_int("num_workers", num_workers, 1)
        if num_epochs is not None:
            _check_int("num_epochs", num_epochs, 0)
        _check_int("shuffle_window", shuffle_window, 1)
        _check_int("max_inflight_bytes", max_inflight_bytes, 1)
        if prefetch_batches is not None:
            _check_int("prefetch_batches", prefetch_batches, 1)
        if shard_policy not in ("drop", "pad"):
            raise ValueError(f"shard_policy must be 'drop' or 'pad', got {shard_policy!r}")
        self._output = _make_output(output, pin_memory, device, device_prefetch)
        default_rank, default_world = _default_rank_world()
        rank = default_rank if rank is None else rank
        world_size = default_world if world_size is None else world_size
        _check_int("world_size", world_size, 1)
        _check_int("rank", rank, 0)
        if rank >= world_size:
            raise ValueError(f"rank must be < world_size={world_size}, got {rank}")
        self._drawn_seed = seed is None and bool(shuffle)
        if seed is None:
            seed = _core.draw_seed() if shuffle else 0
        else:
            _check_int("seed", seed, 0)
        if callable(transforms) and not isinstance(transforms, Mapping):
            if batch_transform is not None:
                raise ValueError("give the per-batch callable once: transforms= or batch_transform=")
            transforms, batch_transform = None, transforms
        if batch_transform is not None and not callable(batch_transform):
            raise TypeError("batch_transform must be callable (dict -> dict)")
        if on_decode_error not in ("raise", "skip"):
            raise ValueError(f"on_decode_error must be 'raise' or 'skip', got {on_decode_error!r}")
        op_specs = _transform_specs(transforms)
        if cache_policy not in ("keep", "lru"):
            raise ValueError(f"cache_policy must be 'keep' or 'lru', got {cache_policy!r}")
        if cache_size_limit is not None:
            _check_int("cache_size_limit", cache_size_limit, 1)
        _check_int("cache_shards", cache_shards, 1)
        if cache_dir is not None:
            cache_dir = os.fspath(cache_dir)
            if cache_dir != ":memory:":
                cache_dir = os.path.abspath(os.path.expanduser(cache_dir))
        fills = None
        fill_default = None
        if isinstance(fill_null, Mapping):
            fills = {str(k): _check_fill(v) for k, v in fill_null.items()}
        else:
            fill_default = _check_fill(fill_null)

        self._options = {
            "columns": columns,
            "batch_size": batch_size,
            "drop_last": bool(drop_last),
            "shuffle": bool(shuffle),
            "seed": seed,
            "shuffle_window": shuffle_window,
            "rank": rank,
            "world_size": world_size,
            "shard_policy": shard_policy,
            "num_workers": num_workers,
            "max_inflight_bytes": max_inflight_bytes,
            "prefetch_batches": prefetch_batches,
            "verify_checksums": bool(verify_checksums),
            "debug_delay_us": _debug_delay_us,
            "storage_options": storage,
            "io_threads": io_threads,
            "readahead": readahead,
            "fill_default": fill_default,
            "fills": fills,
            "transforms": op_specs,
            "on_decode_error": on_decode_error,
            "cache_dir": cache_dir,
            "cache_size_limit": cache_size_limit,
            "cache_policy": cache_policy,
            "cache_shards": cache_shards,
        }
        self._sources = sources
        self._fill_null = fill_null
        self._num_epochs = num_epochs
        self._batch_transform = batch_transform
        self._core = _core._Loader(sources, self._options)
        self._plan = self._core.plan_info()
        self._columns = self._core.column_info()
        self._epoch = 0  # epoch of the next batch
        self._batch = 0  # index in that epoch of the next batch
        self._generation = 0
        self._first_iter_time: float | None = None
        self._active_end: int | None = None  # end epoch of the iteration in progress
        self._resume_end: int | None = None  # end epoch restored by load_state_dict
        self._next_seconds = 0.0  # consumer time inside next()
        self._worker_shard = False  # made by pqloader.torch.IterableDataset for one worker
        _process.track(self)

    # -- properties ------------------------------------------------------------------
    @property
    def seed(self) -> int:
        """The seed of every random choice (drawn when shuffling without one)."""
        return self._options["seed"]

    @property
    def epoch(self) -> int:
        """The epoch of the next batch."""
        return self._epoch

    @property
    def num_rows(self) -> int:
        """Rows per epoch for this rank (after the shard policy, before drop_last)."""
        return self._plan["num_rows"]

    @property
    def column_info(self) -> dict[str, dict[str, Any]]:
        """Per output column: NumPy dtype (or "str"/"bytes"), per-row shape, Arrow type.

        Columns made by transforms have dtype and shape None: they are known once data
        is transformed. A list column's variable dimension is -1.
        """
        return {
            c["name"]: {"dtype": c["dtype"],
                        "shape": None if c["dtype"] is None else tuple(c["shape"]),
                        "arrow_type": c["arrow_type"], "partition": c["partition"]}
            for c in self._columns
        }

    @property
    def shard_info(self) -> dict[str, int]:
        """Rows dropped or repeated per epoch (all ranks) to equalise ranks."""
        return {"rank": self._options["rank"], "world_size": self._options["world_size"],
                "dropped": self._plan["dropped"], "padded": self._plan["padded"],
                "drop_last_rows": self._plan["drop_last_rows"]}

    def __len__(self) -> int:
        """Batches per epoch for this rank."""
        return self._plan["num_batches"]

    # -- iteration -------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        _process.check_not_in_dataloader_worker(self)
        self._generation += 1
        end: list[int] = []
        items = self._read(self._generation, end)
        if self._batch_transform is not None:
            fn = self._batch_transform
            items = _threaded_map(lambda item: (item[0], item[1], fn(item[2])), items,
                                  self._options["prefetch_batches"] or 2)
        if self._output is not None:
            items = self._output.wrap(items)
        return self._hand_out(self._generation, items, end)

    def _read(self, generation: int, end: list[int]) -> Iterator[tuple[int, int, Any]]:
        """Yield (epoch, index, batch) from the position on; may run ahead of the consumer."""
        if self._first_iter_time is None:
            self._first_iter_time = time.perf_counter()
        num_batches = len(self)
        epoch, index = self._epoch, self._batch
        if index >= num_batches:  # positioned after an epoch's last batch
            epoch, index = epoch + 1, 0
        # The epoch this iteration stops before: restored from a state, or num_epochs on.
        if self._resume_end is not None:
            stop, self._resume_end = self._resume_end, None
        else:
            stop = None if self._num_epochs is None else epoch + self._num_epochs
        self._active_end = stop
        caching = self._options["cache_dir"] is not None
        try:
            while stop is None or epoch < stop:
                self._core.start_epoch(epoch, index)
                while True:
                    if generation != self._generation:  # never take a newer iterator's batch
                        raise RuntimeError(_STALE)
                    batch = self._core.next()
                    if generation != self._generation:
                        raise RuntimeError(_STALE)
                    if caching:
                        warning = self._core.take_warning()
                        if warning:
                            warnings.warn(f"pqloader cache: {warning}", RuntimeWarning, stacklevel=2)
                    if batch is None:
                        break
                    yield epoch, index, batch
                    index += 1
                epoch, index = epoch + 1, 0
            end[:] = [epoch, index]
        finally:
            if generation == self._generation:
                self._core.stop()

    def _hand_out(self, generation: int, items: Iterator[tuple[int, int, Any]],
                  end: list[int]) -> Iterator[dict[str, Any]]:
        """Yield batches; the position (what state_dict() saves) moves only here."""
        try:
            t0 = time.perf_counter()
            for epoch, index, batch in items:
                if generation != self._generation:
                    raise RuntimeError(_STALE)
                self._epoch, self._batch = epoch, index + 1
                self._next_seconds += time.perf_counter() - t0
                yield batch
                t0 = time.perf_counter()
            self._next_seconds += time.perf_counter() - t0
            if end and generation == self._generation:
                self._epoch, self._batch = end
                self._active_end = None  # the iteration is complete
        finally:
            items.close()  # type: ignore[attr-defined]

    def __getitem__(self, index: Any) -> Any:
        raise TypeError(
            "pqloader.Loader is iterable, not indexable: it yields whole batches and replaces "
            "torch.utils.data.DataLoader (iterate it directly). To use a DataLoader anyway, give it "
            "pqloader.torch.IterableDataset(loader) with batch_size=None.")

    def __reduce__(self) -> Any:
        raise TypeError(
            "a pqloader.Loader cannot be pickled (it owns C++ threads); for DataLoader worker "
            "processes use pqloader.torch.IterableDataset(loader), which rebuilds it in each worker")

    def _rebuild_kwargs(self) -> dict[str, Any]:
        """Arguments that make an equivalent loader (seed, rank and world size resolved)."""
        kw = dict(self._init_kwargs)
        kw.update(source=self._sources, seed=self.seed, rank=self._options["rank"],
                  world_size=self._options["world_size"])
        return kw

    # -- statistics ------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters since the loader was made.

        Returns:
            rows, batches, units_read (row-group slices), bytes_read (compressed
            Parquet bytes), bytes_decoded, decode_seconds and assemble_seconds (worker
            time, all threads), wait_seconds (time the consumer spent inside next():
            waiting for the engine, converting, staging to the device), of which
            engine_wait_seconds blocked on the engine, wall_seconds (since the first
            iteration), wait_fraction (wait_seconds / wall_seconds: the data stall),
            time_to_first_batch_seconds, skipped_rows, and cache_hits / cache_misses /
            cache_bytes_saved and the other cache_* counters.
        """
        s = dict(self._core.stats())
        wall = 0.0 if self._first_iter_time is None else time.perf_counter() - self._first_iter_time
        s["engine_wait_seconds"] = s["wait_seconds"]
        s["wait_seconds"] = max(self._next_seconds, s["wait_seconds"])
        s["wall_seconds"] = wall
        s["wait_fraction"] = s["wait_seconds"] / wall if wall > 0 else 0.0
        s.update({"dropped": self._plan["dropped"], "padded": self._plan["padded"],
                  "footers_from_cache": self._plan["footers_from_cache"]})
        return s

    # -- checkpointing ---------------------------------------------------------------
    def _fingerprint(self) -> dict[str, Any]:
        o = self._options
        return {
            "sources": self._sources,
            "files": [[path, size] for path, size, _ in self._plan["files"]],
            "columns": [c["name"] for c in self._columns],
            "batch_size": o["batch_size"],
            "drop_last": o["drop_last"],
            "shuffle": o["shuffle"],
            "seed": o["seed"],
            "shuffle_window": o["shuffle_window"],
            "rank": o["rank"],
            "world_size": o["world_size"],
            "shard_policy": o["shard_policy"],
            "fill_null": repr(self._fill_null),
            "transforms": self._core.transform_fingerprint(),
            "on_decode_error": o["on_decode_error"],
        }

    def state_dict(self) -> dict[str, Any]:
        """Return the position after the last batch handed out, as a JSON-safe dict."""
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "batch": self._batch,
            # Where the interrupted `for batch in loader` would have stopped, so that a
            # resumed iteration yields exactly the rest of it (None: no iteration active).
            "iteration_end": self._active_end,
            "seed": self.seed,
            "options": self._fingerprint(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue exactly after the last batch of the run that produced `state`.

        The next ``iter(loader)`` yields the rest of the interrupted iteration (up to the
        epoch where it would have stopped); later iterations run ``num_epochs`` each.

        A loader built with ``seed=None`` adopts the state's seed. Every other
        data-affecting option must match.

        Raises:
            ValueError: The state is malformed or was taken with other options.
        """
        if not isinstance(state, Mapping) or state.get("version") != _STATE_VERSION:
            raise InvalidDataError(f"not a pqloader state (version {_STATE_VERSION}): {state!r:.200}")
        theirs = dict(state["options"])
        if self._drawn_seed:
            self._options["seed"] = int(state["seed"])
            self._core.set_seed(int(state["seed"]))
        mine = self._fingerprint()
        diffs = [
            f"{k}: state has {theirs.get(k)!r}, loader has {mine.get(k)!r}"
            for k in _DATA_OPTIONS
            if _jsonish(theirs.get(k)) != _jsonish(mine.get(k))
        ]
        if diffs:
            raise InvalidDataError("cannot load a state taken with different options: " + "; ".join(diffs))
        epoch, batch = int(state["epoch"]), int(state["batch"])
        if epoch < 0 or not 0 <= batch <= len(self):
            raise InvalidDataError(f"state position (epoch {epoch}, batch {batch}) is out of range")
        self._generation += 1  # any running iterator stops
        self._core.stop()
        self._epoch, self._batch = epoch, batch
        end = state.get("iteration_end")
        self._resume_end = None if end is None else int(end)
        self._active_end = None

    def __repr__(self) -> str:
        o = self._options
        return (f"pqloader.Loader({len(self._sources)} source(s), {self._plan['num_files']} files, "
                f"{self._plan['dataset_rows']} rows, batch_size={o['batch_size']}, "
                f"shuffle={o['shuffle']}, seed={o['seed']}, rank={o['rank']}/{o['world_size']})")


_STALE = ("this loader was iterated again, loaded a state, or this process was forked; "
          "the older iterator stopped")


def _make_output(output: str, pin_memory: bool | None, device: Any, device_prefetch: int) -> Any:
    """Check the output options; return None for NumPy, else a _torch.TorchOutput."""
    if output not in ("numpy", "torch"):
        raise ValueError(f"output must be 'numpy' or 'torch', got {output!r}")
    _check_int("device_prefetch", device_prefetch, 1)
    if output == "numpy":
        if pin_memory or device is not None:
            raise ValueError("pin_memory and device need output='torch'")
        return None
    try:
        from pqloader import _torch
    except ImportError as e:
        if e.name is not None and e.name.split(".")[0] == "torch":
            raise ImportError("output='torch' needs PyTorch, which is not installed: "
                              "pip install torch (or pip install 'pqloader[torch]')", name="torch") from e
        raise
    return _torch.TorchOutput(pin_memory, device, device_prefetch)


def _jsonish(value: Any) -> Any:
    """Normalise tuples to lists so values compare equal after a JSON round trip."""
    if isinstance(value, (list, tuple)):
        return [_jsonish(v) for v in value]
    return value


def cache_stats(cache_dir: str | os.PathLike[str]) -> dict[str, int]:
    """Entries, bytes and temp files of a cache directory, plus hit/miss counts recorded
    by loaders that used it."""
    return dict(_core.cache_stats(os.path.abspath(os.fspath(cache_dir))))


def cache_clear(cache_dir: str | os.PathLike[str]) -> None:
    """Delete every entry of a cache directory (never anything else)."""
    _core.cache_clear(os.path.abspath(os.fspath(cache_dir)))


def inspect(source: Source, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Describe a dataset without reading its data pages.

    Args:
        source: As for :class:`Loader`.
        storage_options: As for :class:`Loader`.

    Returns:
        A dict with ``files`` (path, num_rows, num_row_groups, size_bytes, compression,
        created_by), ``schema`` (column -> Arrow type), ``loads_as`` (column -> what the
        loader yields, or "unsupported"), ``num_rows``, ``num_row_groups``, ``num_files``.

    Example:
        >>> pqloader.inspect("data/train")["num_rows"]
        1000000
    """
    return _core.inspect(_normalize_sources(source), _storage_options(storage_options))
