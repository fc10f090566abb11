"""Engines across process boundaries: fork safety, interpreter exit, DataLoader workers.

A Loader owns C++ worker threads through its :class:`Engine`. ``fork()`` copies the
process but only the calling thread: in the child the engine's workers do not exist,
and a mutex one of them held at the instant of the fork stays locked forever. Touching
the inherited engine there (``next()``, ``stop()``, even its destructor, which joins the
workers) could hang. So an at-fork handler marks every live Engine in the child: its
C++ engine is abandoned without being destroyed, a fresh one is opened on first use,
and the owner's ``on_fork`` callback runs (the Loader uses it to stop iterators started
before the fork). The position (epoch, batch), seed and options are the Loader's, so
``iter(loader)`` in the child continues where the parent's consumer was.

At interpreter exit every live engine is stopped and freed (an atexit handler), before
the extension module is torn down: a loader still referenced then, e.g. by a suspended
iterator in a spawned DataLoader worker, would otherwise outlive it. A daemon thread
still inside a pqloader call then never returns from it (it parks; the process exits
normally) rather than being ended by CPython in a way that aborts the process.

Nothing here imports torch: it is looked up in ``sys.modules`` only.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import weakref
from typing import Any, Callable

from pqloader import _core
from pqloader._errors import arrow_files_hint, utf8_paths

_live: "weakref.WeakSet[Engine]" = weakref.WeakSet()
_per_worker: "weakref.WeakSet[Any]" = weakref.WeakSet()


# How long a thread calling a released engine waits for finalization to begin before it
# goes on (as a parked call into the engine does: python/src/gil.h).
_PARK_ESCAPE_S = 5.0


_exiting_thread: int | None = None  # the thread running the atexit handlers


def _park() -> None:
    """On a thread other than the exiting one, wait until the interpreter finalizes (a
    daemon thread then ends here, in Python: no C++ frames to unwind) or _PARK_ESCAPE_S
    has passed (an atexit handler registered before pqloader's may be joining this
    thread: it goes on, and sees its stop flag). The exiting thread is never parked."""
    import time

    if threading.get_ident() != _exiting_thread:
        until = time.monotonic() + _PARK_ESCAPE_S
        while sys.is_finalizing() or time.monotonic() < until:
            time.sleep(0.01)


class _ClosedCore:
    """Stands in for an engine released at interpreter exit.

    A thread that calls it is parked, as a thread calling into the engine then is
    (python/src/gil.h), and then gets a stopped engine's answers: an epoch started now
    holds no batch. (It raised at once: a daemon thread between two calls when the exit
    handler released the engines died with a RuntimeError, where one inside a call went
    on and saw the stop flag its atexit handler set.) Anything else raises, after the park.
    """

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass

    def take_warning(self) -> str:
        return ""

    def start_epoch(self, *args: Any) -> int:
        if threading.get_ident() == _exiting_thread:  # (an atexit handler's iteration)
            raise self._released()
        _park()
        return -1

    def next(self, run: int = -1) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        _park()
        raise self._released()

    @staticmethod
    def _released() -> RuntimeError:
        return RuntimeError("the Python interpreter is shutting down; pqloader's engine was released")


class _Forward:
    """Calls `fn` until it is set to None (see ``Engine._open``)."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn: Callable[..., Any] | None = fn

    def __call__(self, *args: Any) -> Any:
        if self.fn is None:
            raise RuntimeError("pqloader: a filter's predicate was called after its Loader was made")
        return self.fn(*args)


class Engine:
    """The C++ engine of one Loader, replaced in forked children and released at exit.

    Thread-safety: as the engine's, one consumer thread at a time.

    Args:
        sources: Normalised sources (see ``_env.normalize_sources``).
        options: The engine's option dict (``LoaderOptions.to_engine()``).
        on_fork: Called in a forked child, after the engine was abandoned.

    Raises:
        pqloader.Error: The engine refused to open the sources (see ``Loader``).
    """

    def __init__(self, sources: list[str], options: dict[str, Any],
                 on_fork: Callable[[], None] | None = None) -> None:
        self._sources = list(sources)
        self._options = dict(options)
        self._on_fork = on_fork
        self._transform_fingerprint: str | None = None
        self._core: Any = self._open()
        _live.add(self)
        _defer_pyarrow_s3_finalize()

    def _open(self) -> Any:
        # A filter's predicate runs only while the engine is made. The engine keeps what
        # it was given, out of the garbage collector's sight: the predicate itself there
        # made a cycle through it (a predicate that refers to its Loader, such as a bound
        # method of an object holding the Loader) uncollectable, with the engine's threads
        # and memory. It gets a forwarder emptied once it is made instead.
        options = self._options
        slot = None
        if options.get("predicate") is not None:
            columns, call = options["predicate"]
            slot = _Forward(call)
            options = {**options, "predicate": (columns, slot)}
        try:
            with arrow_files_hint(self._sources):  # a Hugging Face save_to_disk directory
                return _core._Loader(self._sources, options)
        finally:
            if slot is not None:
                slot.fn = None

    def _engine(self) -> Any:
        if self._core is None:  # abandoned in a forked child: open a fresh one
            self._core = self._open()
        return self._core

    def core(self) -> Any:
        """The C++ engine object (``_core._Loader``), e.g. for a mixture's stream."""
        return self._engine()

    # -- what the Loader uses -----------------------------------------------------------
    def start_epoch(self, epoch: int, first_batch: int, then_next_epoch: bool = False,
                    elastic: dict[str, Any] | None = None) -> int:
        """Start delivering batches `first_batch`, `first_batch` + 1, ... of `epoch`;
        return the run's id (for :meth:`next`).

        With `then_next_epoch`, epoch + 1 follows from its first batch: the engine starts
        it while this one ends. With `elastic` (see ``_state``), `epoch` is the rest of
        the epoch after what an earlier world consumed.
        """
        return self._engine().start_epoch(epoch, first_batch, then_next_epoch, elastic)

    def next(self, run: int = -1) -> dict[str, Any] | None:
        """Return the next batch of the epoch, or None at its end. With `run` (a
        :meth:`start_epoch`'s id), an error, taking nothing, if a newer run replaced it
        (another thread's newer iteration)."""
        return self._engine().next(run)

    def stop(self) -> None:
        """Stop the workers; the next ``start_epoch`` starts afresh."""
        if self._core is not None:
            self._core.stop()

    def close(self) -> None:
        """Stop, and let go of the idle storage threads and the buffer pool's share kept
        for this engine; the next ``start_epoch`` takes them again."""
        if self._core is not None:
            self._core.close()

    def take_warning(self) -> str:
        """Return (and clear) the engine's pending cache warning, or ''."""
        return self._engine().take_warning()

    def set_seed(self, seed: int) -> None:
        """Replace the seed, also for an engine reopened after a fork."""
        self._options["seed"] = seed
        self._engine().set_seed(seed)

    def stats(self) -> dict[str, Any]:
        """The engine's counters (see ``Loader.stats``)."""
        return dict(self._engine().stats())

    def column_info(self, stacked: bool = True) -> list[dict[str, Any]]:
        """Per output column: name, dtype, shape, arrow_type, partition (the columns as
        they would be without ``stack`` when `stacked` is false)."""
        return list(self._engine().column_info(stacked))

    def arrow_schema_capsule(self) -> Any:
        """The output columns' Arrow schema, as a PyCapsule "arrow_schema"."""
        return self._engine().arrow_schema_capsule()

    def check_before_first_batch(self) -> None:
        """Refuse what the footers show would fail later (nulls, ragged lists, fills)."""
        self._engine().check_before_first_batch()

    def plan_info(self) -> dict[str, Any]:
        """Counts of the epoch plan and the dataset's files.

        Raises:
            pqloader.InvalidDataError: A file's name is not UTF-8 (it cannot be a str).
        """
        with utf8_paths():
            return dict(self._engine().plan_info())

    def transform_fingerprint(self) -> str:
        """A fingerprint of the transforms (part of a state's options). Made once: it
        follows the options only, and a filter's is read from its serialized expression
        (three passes over a large value set, at every ``state_dict()``)."""
        if self._transform_fingerprint is None:
            self._transform_fingerprint = self._engine().transform_fingerprint()
        return self._transform_fingerprint

    def num_batches(self, epoch: int, elastic: dict[str, Any] | None = None) -> int:
        """Batches of `epoch` for this rank (of its rest after `elastic`, if given)."""
        return self._engine().num_batches(epoch, elastic)

    # -- process boundaries -------------------------------------------------------------
    def _after_fork_in_child(self) -> None:
        if isinstance(self._core, _core._Loader):
            self._core.abandon_after_fork()
        self._core = None
        if self._on_fork is not None:
            self._on_fork()

    def _release(self) -> None:
        core, self._core = self._core, _ClosedCore()
        if isinstance(core, _core._Loader):
            # Its workers joined now: a daemon thread's call may still hold the engine
            # (that thread parks, see _core's gil.h), and threads must not outlive the
            # module's static objects.
            core.stop()


def _after_fork_in_child() -> None:
    # Objects the parent's other threads held are never freed in the child: not
    # reference-counting bugs for nanobind to report at its exit.
    _core._quiet_leak_warnings()
    for engine in list(_live):
        engine._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _release_at_exit() -> None:
    """Stop and free every engine while the interpreter is still whole.

    Loaders still referenced at exit (e.g. from a suspended iterator in a spawned
    DataLoader worker) would otherwise outlive the extension module's teardown.
    """
    for engine in list(_live):
        engine._release()
    if _deferred_exit_hooks:
        # pqloader's S3 shutdown first (its own hook, next in line, then does nothing): it
        # stops the retries of reads still running, which Arrow's shutdown waits for.
        try:
            _core._finalize_s3()
        finally:
            while _deferred_exit_hooks:
                _deferred_exit_hooks.pop()()


atexit.register(_release_at_exit)

# pyarrow.fs registers ensure_s3_finalized with atexit when it is imported. Imported after
# pqloader, it ran before _release_at_exit (atexit is last in, first out); where pqloader
# uses pyarrow's Arrow (a build against it), Arrow's S3 shutdown then waited for a read of
# a loader still alive that was retrying, for its whole retry_budget (an exit took ~60 s
# against a throttling server instead of at most one attempt). So when an engine is made
# that hook is taken out and run by _release_at_exit, after the engines stopped and
# pqloader's S3 shutdown stopped the retries (hooks registered in between now run while
# pyarrow's S3 is still up, as they could expect).
_PYARROW_FS_FIRST = "pyarrow.fs" in sys.modules
_deferred_exit_hooks: list[Callable[[], Any]] = []


def _defer_pyarrow_s3_finalize() -> None:
    if _PYARROW_FS_FIRST or _deferred_exit_hooks:
        return
    hook = getattr(sys.modules.get("pyarrow.fs"), "ensure_s3_finalized", None)
    if callable(hook):
        atexit.unregister(hook)
        _deferred_exit_hooks.append(hook)


# Runs before _release_at_exit (atexit is last in, first out): Loaders being built are
# cancelled and calls into the engine waited for; from then on, a thread other than the
# exiting one that would call into the engine or take the GIL back in a pqloader call
# parks (for good once finalization begins), instead of being ended by CPython's
# finalization in a way that aborts the process (see python/src/gil.h).
def _mark_interpreter_exiting() -> None:
    global _exiting_thread
    _exiting_thread = threading.get_ident()
    _core._mark_interpreter_exiting(threading.active_count() > 1)


atexit.register(_mark_interpreter_exiting)


def mark_sharded_per_worker(loader: Any) -> None:
    """Record that `loader` reads one DataLoader worker's shard (pqloader.torch does this).

    Such a loader may run in a worker process of a DataLoader with several workers.
    """
    _per_worker.add(loader)


def check_not_in_dataloader_worker(loader: Any, mixture: bool = False) -> None:
    """Refuse to run a plain Loader (or a Mixture) inside one of several DataLoader
    worker processes.

    Every worker would iterate the same copy and yield the same batches, so a
    ``DataLoader(num_workers=N)`` over it would repeat each batch N times.

    Args:
        loader: The loader about to be iterated.
        mixture: It is a ``pqloader.mix`` mixture (the message differs).

    Raises:
        RuntimeError: Called in a ``torch.utils.data`` worker process of a DataLoader
            with ``num_workers > 1`` for a loader not marked with
            :func:`mark_sharded_per_worker`.
    """
    data = sys.modules.get("torch.utils.data")
    if data is None or loader in _per_worker:
        return
    info = data.get_worker_info()
    if info is not None and info.num_workers > 1 and mixture:
        raise RuntimeError(
            f"a pqloader mixture iterated in DataLoader worker {info.id} of {info.num_workers}: every "
            "worker would yield the same batches. A mixture needs no worker processes: iterate it "
            "directly (pqloader.torch.IterableDataset shards Loaders, not mixtures).")
    if info is not None and info.num_workers > 1:
        raise RuntimeError(
            f"pqloader.Loader iterated in DataLoader worker {info.id} of {info.num_workers}: every worker "
            "would yield the same batches. pqloader needs no worker processes (iterate the Loader "
            "directly); to use DataLoader(num_workers>0) anyway, give it "
            "pqloader.torch.IterableDataset(loader) with batch_size=None, which shards per worker.")
