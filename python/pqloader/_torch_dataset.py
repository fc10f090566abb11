"""A Loader as a ``torch.utils.data.IterableDataset`` that shards per DataLoader worker.

Imported through the public ``pqloader.torch`` module only (it imports torch). It uses
the Loader's public surface: ``sources``, ``options``, ``epoch``, ``set_epoch`` and the
checkpoint methods; ``_process.mark_sharded_per_worker`` lets a per-worker loader run
inside a DataLoader worker process.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterator

import torch.utils.data

from pqloader import _process
from pqloader._loader import Loader
from pqloader._options import MAX_THREADS, LoaderOptions


@dataclasses.dataclass(frozen=True)
class _LoaderRecipe:
    """What rebuilds a Loader in another process (the Loader itself cannot be pickled)."""

    sources: list[str]
    options: LoaderOptions

    def build(self, **changes: Any) -> Loader:
        return Loader(self.sources, **self.options.replace(**changes).to_kwargs())


class IterableDataset(torch.utils.data.IterableDataset):
    """A Loader as a ``torch.utils.data.IterableDataset`` that shards per DataLoader worker.

    pqloader needs no worker processes: iterate the Loader itself. This wrapper exists for
    code that insists on a ``DataLoader``. Use ``batch_size=None`` (items are whole
    batches). With ``num_workers=0`` it iterates the wrapped loader itself (state_dict and
    device staging work as usual). With ``num_workers=W > 0``, worker ``i`` of rank ``r``
    reads shard ``r * W + i`` of ``world_size * W``, with the loader's seed and
    options; each worker gets the same number of batches (the loader's ``shard_policy``),
    DataLoader interleaves them in worker order, so the stream is deterministic and each
    epoch covers the data once. Workers hand out CPU batches: use DataLoader's
    ``pin_memory=True`` and move them to the GPU yourself. Worker processes are made
    anew for each DataLoader iteration unless ``persistent_workers=True``; like
    ``DistributedSampler``, call ``set_epoch(e)`` before each epoch so they start at
    epoch ``e`` (persistent workers continue their own epoch count). Resuming from a
    state is not supported across workers.

    Args:
        loader: The loader to wrap; its options, seed, rank and world size are used.

    Raises:
        TypeError: `loader` is not a ``pqloader.Loader``.

    Example:
        >>> ds = pqloader.torch.IterableDataset(pqloader.Loader("data/", batch_size=512, seed=1))
        >>> dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
        >>> for epoch in range(3):
        ...     ds.set_epoch(epoch)
        ...     for batch in dl: ...
    """

    def __init__(self, loader: Loader) -> None:
        if not isinstance(loader, Loader):
            raise TypeError(f"IterableDataset wraps a pqloader.Loader, got {type(loader).__name__}")
        self._loader: Loader | None = loader
        self._recipe = _LoaderRecipe(loader.sources, loader.options)
        self._epoch = loader.epoch
        self._epoch_set = False
        self._worker_loader: Loader | None = None

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at `epoch` (call it in the main process)."""
        self._epoch = int(epoch)
        self._epoch_set = True

    def state_dict(self) -> dict[str, Any]:
        """The wrapped loader's state (only meaningful with ``num_workers=0``)."""
        return self._main_loader().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a state into the wrapped loader (only meaningful with ``num_workers=0``)."""
        loader = self._main_loader()
        loader.load_state_dict(state)
        self._epoch = loader.epoch

    def _main_loader(self) -> Loader:
        if self._loader is None:  # unpickled (spawned worker context) and then used directly
            self._loader = self._recipe.build()
        return self._loader

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        if info is None:
            loader = self._main_loader()
            if self._epoch_set and loader.epoch != self._epoch:
                loader.set_epoch(self._epoch)
            self._epoch_set = False
            return iter(loader)
        if self._worker_loader is None:
            self._worker_loader = self._make_worker_loader(info)
        return iter(self._worker_loader)

    def _make_worker_loader(self, info: Any) -> Loader:
        o = self._recipe.options
        workers = info.num_workers
        threads = min(o.num_workers or os.cpu_count() or 1, MAX_THREADS)
        loader = self._recipe.build(rank=o.rank * workers + info.id, world_size=o.world_size * workers,
                                    num_workers=max(1, threads // workers), device=None, pin_memory=False)
        _process.mark_sharded_per_worker(loader)
        loader.set_epoch(self._epoch)
        return loader

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_loader"] = None  # the engine cannot be pickled; spawned workers rebuild it
        state["_worker_loader"] = None
        return state
