"""The public Loader: argument checks and epoch bookkeeping over the C++ engine."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any, Iterator, Mapping, Sequence, Union

from pqloader import _core, _process
from pqloader._errors import InvalidDataError

Source = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]

_STATE_VERSION = 1
# Options that change which rows land in which batch. A state can only be loaded into a
# loader that agrees on all of them.
_DATA_OPTIONS = (
    "sources", "files", "columns", "batch_size", "drop_last", "shuffle", "seed",
    "shuffle_window", "rank", "world_size", "shard_policy", "fill_null",
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
            ``_`` are skipped), a glob pattern, a ``file://`` URI, or a list of these.
            Directory and glob matches are sorted by path; list order is kept.
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
        output: ``"numpy"`` or ``"torch"``: numeric columns as ``torch.Tensor`` sharing
            the engine's memory (DLPack, no copy). torch is imported only then.
        pin_memory: Stage torch batches in pinned host memory. Default (``None``): when
            ``device`` is a CUDA device. Ignored, with a warning, without CUDA.
        device: Hand torch batches out on this device (e.g. ``"cuda:0"``), copied on a
            side CUDA stream ahead of use. Default: CPU, zero-copy.
        device_prefetch: Batches pinned/copied ahead of the consumer (with
            ``pin_memory`` or ``device``).

    Raises:
        pqloader.DataNotFoundError: The source holds no files.
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
        output: str = "numpy",
        pin_memory: bool | None = None,
        device: Any = None,
        device_prefetch: int = 2,
        _debug_delay_us: int = 0,
    ) -> None:
        self._init_kwargs = {k: v for k, v in locals().items() if k != "self"}
        sources = _normalize_sources(source)
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
            "fill_default": fill_default,
            "fills": fills,
        }
        self._sources = sources
        self._fill_null = fill_null
        self._num_epochs = num_epochs
        self._core = _core._Loader(sources, self._options)
        self._plan = self._core.plan_info()
        self._columns = self._core.column_info()
        self._epoch = 0  # epoch of the next batch
        self._batch = 0  # index in that epoch of the next batch
        self._generation = 0
        self._first_iter_time: float | None = None
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
        """Per output column: NumPy dtype (or "str"/"bytes"), per-row shape, Arrow type."""
        return {
            c["name"]: {"dtype": c["dtype"], "shape": tuple(c["shape"]),
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
        if self._output is not None:
            items = self._output.wrap(items)
        return self._hand_out(self._generation, items, end)

    def _read(self, generation: int, end: list[int]) -> Iterator[tuple[int, int, Any]]:
        """Yield (epoch, index, batch) from the position on; may run ahead of the consumer."""
        if self._first_iter_time is None:
            self._first_iter_time = time.perf_counter()
        epochs = itertools.count() if self._num_epochs is None else range(self._num_epochs)
        num_batches = len(self)
        epoch, index = self._epoch, self._batch
        try:
            for _ in epochs:
                if index >= num_batches:  # a state taken after an epoch's last batch
                    epoch, index = epoch + 1, 0
                self._core.start_epoch(epoch, index)
                while True:
                    if generation != self._generation:  # never take a newer iterator's batch
                        raise RuntimeError(_STALE)
                    batch = self._core.next()
                    if generation != self._generation:
                        raise RuntimeError(_STALE)
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
            and time_to_first_batch_seconds.
        """
        s = dict(self._core.stats())
        wall = 0.0 if self._first_iter_time is None else time.perf_counter() - self._first_iter_time
        s["engine_wait_seconds"] = s["wait_seconds"]
        s["wait_seconds"] = max(self._next_seconds, s["wait_seconds"])
        s["wall_seconds"] = wall
        s["wait_fraction"] = s["wait_seconds"] / wall if wall > 0 else 0.0
        s.update({"dropped": self._plan["dropped"], "padded": self._plan["padded"]})
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
        }

    def state_dict(self) -> dict[str, Any]:
        """Return the position after the last batch handed out, as a JSON-safe dict."""
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "batch": self._batch,
            "seed": self.seed,
            "options": self._fingerprint(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue exactly after the last batch of the run that produced `state`.

        A loader built with ``seed=None`` adopts the state's seed. Every other
        data-affecting option must match.

        Raises:
            ValueError: The state is malformed or was taken with other options.
        """
        if not isinstance(state, Mapping) or state.get("version") != _STATE_VERSION:
            raise InvalidDataError(f"not a pqloader state (version {_STATE_VERSION}): {state!r:.200}")
        theirs = dict(state["options"])
        if self._options["shuffle"] and self._seed_was_drawn():
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

    def _seed_was_drawn(self) -> bool:
        return getattr(self, "_drawn_seed", False)

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


def inspect(source: Source) -> dict[str, Any]:
    """Describe a dataset without reading its data pages.

    Args:
        source: As for :class:`Loader`.

    Returns:
        A dict with ``files`` (path, num_rows, num_row_groups, size_bytes, compression,
        created_by), ``schema`` (column -> Arrow type), ``loads_as`` (column -> what the
        loader yields, or "unsupported"), ``num_rows``, ``num_row_groups``, ``num_files``.

    Example:
        >>> pqloader.inspect("data/train")["num_rows"]
        1000000
    """
    return _core.inspect(_normalize_sources(source))
