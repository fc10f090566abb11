"""Loaders across process boundaries: fork safety and DataLoader worker processes.

A Loader owns C++ worker threads. ``fork()`` copies the process but only the calling
thread: in the child the engine's workers do not exist, and a mutex one of them held at
the instant of the fork stays locked forever. Touching the inherited engine there
(``next()``, ``stop()``, even its destructor, which joins the workers) could hang. So
an at-fork handler marks every live Loader in the child: its engine is abandoned
without being destroyed and a fresh one is opened on first use; iterators started
before the fork refuse to continue. The position (epoch, batch), seed and options carry
over, so ``iter(loader)`` in the child continues where the parent's consumer was.

At interpreter exit every live engine is stopped and freed (an atexit handler), before
the extension module is torn down: a loader still referenced then, e.g. by a suspended
iterator in a spawned DataLoader worker, would otherwise outlive it.

Nothing here imports torch: it is looked up in ``sys.modules`` only.
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from typing import Any

from pqloader import _core

_live: "weakref.WeakSet[Any]" = weakref.WeakSet()


def track(loader: Any) -> None:
    """Register a Loader whose engine must be replaced in forked children."""
    _live.add(loader)


class _ReopenedCore:
    """Stands in for a Loader's engine in a forked child; opens a fresh one on first use."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def __getattr__(self, name: str) -> Any:
        loader = self._loader
        core = _core._Loader(loader._sources, loader._options)
        loader._core = core
        return getattr(core, name)


def _after_fork_in_child() -> None:
    for loader in list(_live):
        core = loader.__dict__.get("_core")
        if isinstance(core, _core._Loader):
            core.abandon_after_fork()
        loader._core = _ReopenedCore(loader)
        loader._generation += 1  # iterators made before the fork stop


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class _ClosedCore:
    """Stands in for an engine released at interpreter exit."""

    def stop(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("the Python interpreter is shutting down; pqloader's engine was released")


def _release_at_exit() -> None:
    """Stop and free every engine while the interpreter is still whole.

    Loaders still referenced at exit (e.g. from a suspended iterator in a spawned
    DataLoader worker) would otherwise outlive the extension module's teardown.
    """
    for loader in list(_live):
        loader._core = _ClosedCore()


atexit.register(_release_at_exit)


def check_not_in_dataloader_worker(loader: Any) -> None:
    """Refuse to run a plain Loader inside one of several DataLoader worker processes.

    Every worker would iterate the same copy and yield the same batches, so a
    ``DataLoader(num_workers=N)`` over it would repeat each batch N times.

    Raises:
        RuntimeError: Called in a ``torch.utils.data`` worker process of a DataLoader
            with ``num_workers > 1`` for a loader that is not sharded per worker.
    """
    data = sys.modules.get("torch.utils.data")
    if data is None or getattr(loader, "_worker_shard", False):
        return
    info = data.get_worker_info()
    if info is not None and info.num_workers > 1:
        raise RuntimeError(
            f"pqloader.Loader iterated in DataLoader worker {info.id} of {info.num_workers}: every worker "
            "would yield the same batches. pqloader needs no worker processes (iterate the Loader "
            "directly); to use DataLoader(num_workers>0) anyway, give it "
            "pqloader.torch.IterableDataset(loader) with batch_size=None, which shards per worker.")
