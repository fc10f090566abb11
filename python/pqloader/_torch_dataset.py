"""A Loader as a ``torch.utils.data.IterableDataset`` that shards per DataLoader worker.

Imported through the public ``pqloader.torch`` module only (it imports torch). It uses
the Loader's public surface: ``sources``, ``options``, ``epoch``, ``set_epoch`` and the
checkpoint methods; ``_process.mark_sharded_per_worker`` lets a per-worker loader run
inside a DataLoader worker process.
"""

from __future__ import annotations

import copy
import dataclasses
import multiprocessing.context
import pickle
import warnings
from typing import Any, Iterator, Mapping

import torch.utils.data

from pqloader import _env, _iteration, _process, _state
from pqloader._errors import DataNotFoundError, InvalidDataError, user_stacklevel
from pqloader._loader import Loader
from pqloader._options import EPOCH_HINT, MAX_EPOCH, MAX_THREADS, LoaderOptions, check_int, iteration_epochs


@dataclasses.dataclass(frozen=True)
class _LoaderRecipe:
    """What rebuilds a Loader in another process (the Loader itself cannot be pickled)."""

    sources: list[str]
    options: LoaderOptions
    files: list[Any]  # the wrapped loader's plan_info()["files"]: (path, size, rows, footer hash)
    cls: type = Loader  # a subclass of Loader is rebuilt as itself (with Loader's arguments)

    def build(self, **changes: Any) -> Loader:
        """The loader again, from its sources: the data must be the wrapped loader's (a
        DataLoader worker that listed a directory anew read what it now held, silently:
        without the rows of a file deleted since, or with those of a file added)."""
        with warnings.catch_warnings():
            # (the wrapped loader warned of its memory when it was made: W workers, each
            # its own process, repeated it every epoch)
            warnings.filterwarnings("ignore", _env.MEMORY_WARNINGS, RuntimeWarning)
            loader = self.cls(self.sources, **self.options.replace(**changes).to_kwargs())
        _check_same_files(self.files, loader._plan["files"])
        return loader


def _check_sendable(recipe: _LoaderRecipe) -> None:
    """Raise naming the option (or the loader's class) that a worker being spawned cannot
    get: pickle's own error named no option ("Can't pickle <function <lambda> ...>:
    attribute lookup <lambda> on __main__ failed")."""
    from multiprocessing.reduction import ForkingPickler

    o = recipe.options
    for what, value in [(f"{f.name}=", getattr(o, f.name)) for f in dataclasses.fields(o)] + [
            ("the loader's class ", recipe.cls)]:
        try:
            ForkingPickler.dumps(value)
        except Exception as e:  # (PicklingError, AttributeError, TypeError: as pickle has it)
            shown = getattr(value, "__qualname__", None) or type(value).__name__
            raise pickle.PicklingError(
                f"{what}{shown} cannot be sent to the DataLoader's worker processes, which "
                f"start by spawn or forkserver and get it pickled ({type(e).__name__}: {e}): "
                "define it at module level (not a lambda, nor inside a function), or use "
                "multiprocessing_context='fork'") from e


def _check_same_files(before: list[Any], now: list[Any]) -> None:
    """Raise naming the first file that is gone, changed or new between two plans."""
    if before == now:
        return
    old, new = {f[0]: tuple(f) for f in before}, {f[0]: tuple(f) for f in now}
    gone = [p for p in old if p not in new]
    changed = [p for p in new if old.get(p) != new[p]]
    if gone:
        what = f"{gone[0]!r} is gone"
    elif changed and changed[0] not in old:
        what = f"{changed[0]!r} is new"
    elif changed:
        p = changed[0]
        what = f"{p!r} changed (size {old[p][1]} -> {new[p][1]} bytes, rows {old[p][2]} -> {new[p][2]})"
    else:
        what = "its files are listed in another order"
    raise (DataNotFoundError if gone else InvalidDataError)(
        f"the data changed since the loader was wrapped: {what}; a DataLoader worker rebuilds the "
        "loader from its sources and would read other rows than the loader's: make a new Loader "
        "and IterableDataset to read the data as it is now")


@dataclasses.dataclass
class _Position:
    """Where the DataLoader is in an epoch read by worker loaders (main process).

    The workers' loaders are shards ``rank * W + w`` of ``world_size * W``. DataLoader
    takes their batches in turn, so after ``before + yielded`` batches worker ``w`` had
    handed out ``ceil((before + yielded - w) / W)``; ``base`` is the elastic base of
    the epoch (None: an ordinary one) and ``shift`` the old worker that DataLoader's
    worker 0 continues (so that the turns continue where they were).
    """

    epoch: int
    workers: int
    base: dict[str, Any] | None = None
    before: int = 0
    yielded: int = 0
    complete: bool = False
    left: bool = False  # its loop ended without reaching the end (break, an exception)

    def counts(self) -> list[int]:
        n = self.before + self.yielded
        return [max(0, -(-(n - w) // self.workers)) for w in range(self.workers)]


def _in_turns(counts: list[int], workers: int) -> bool:
    """Whether per-worker batch counts (rank-major, `workers` per rank) are those of ranks
    that each handed out the same number of batches, taken from their workers in turns."""
    ranks = [counts[r:r + workers] for r in range(0, len(counts), workers)]
    return (len({sum(c) for c in ranks}) == 1
            and all(c == _Position(0, workers, before=sum(c)).counts() for c in ranks))


def _consumed_nothing(state: dict[str, Any]) -> bool:
    """`state` is at the start of its epoch, no rank having handed out a batch of it (a
    state taken before the first batch, e.g. the wrapped loader's, of one rank): the
    workers run that epoch as an ordinary one, as without the state. (Resumed, it was the
    rest of an epoch of the state's world dealt anew: another order, and refused for a
    packed loader.)"""
    counts = state.get("rank_batches") or [state.get("batch")]
    return state.get("elastic") is None and not any(counts)


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
    epoch ``e`` (without it, an iteration after a whole epoch runs the next epoch under
    :class:`pqloader.torch.DataLoader`, with or without persistent workers). After a
    loop left early (``break``), the next iteration runs the rest of that epoch without
    workers (as the loader itself does), and the epoch from its start with workers (what
    they had fetched ahead is gone with the old iterator); ``state_dict()`` taken after
    the ``break`` resumes the rest. (A plain torch DataLoader's persistent workers left
    near an epoch's end may mix two epochs: a worker that had already read its whole
    share goes on with the next epoch while the others start theirs over;
    :class:`pqloader.torch.DataLoader` restarts them.)

    Checkpoints: iterate it with :class:`pqloader.torch.DataLoader` (a
    ``torch.utils.data.DataLoader`` that counts the batches it hands out) and use that
    DataLoader's ``state_dict()``/``load_state_dict()``: the resumed stream is exactly
    the rest of the interrupted one, also with another number of workers, ranks or
    batch size (elastic resume, see docs/determinism.md). With worker processes the
    DataLoader counts the position of one epoch per iteration: the loader's
    ``num_epochs`` must be 1 (the default) for ``state_dict()`` (a ``ValueError`` else).
    A loader wrapped mid-epoch (a state loaded, or batches taken from it first) continues
    from its position, with or without workers, as iterating it would: batches already
    taken are not handed out again in that epoch (``loader.set_epoch(loader.epoch)``
    first starts the epoch over, except after ``load_state_dict``, whose position it
    keeps: build the loader anew to start that epoch over). A packed loader continues so only with the ranks and
    workers its position was taken in (else ``InvalidDataError``). A copy of the dataset
    (``copy.copy``, ``copy.deepcopy``, pickle, as frameworks make them) holds the position
    at the time it was made: its ``state_dict()`` is the one taken then, whatever the
    original does next (a checkpoint from it resumes exactly there).

    Memory: each worker holds its own loader, with its share of the default
    ``max_inflight_bytes`` and its own shuffle window; :class:`pqloader.torch.DataLoader`
    warns once (``RuntimeWarning``) when its workers' windows would take the container
    over its memory limit, naming ``shuffle_window`` and ``num_workers``.

    ``len(dataset)`` is the batches of an iteration without workers (``len(loader)``);
    ``len()`` of :class:`pqloader.torch.DataLoader` counts those of its workers.

    Args:
        loader: The loader to wrap; its options, seed, rank and world size are used. The
            workers' loaders are of its class (a subclass is built with Loader's arguments).

    Raises:
        TypeError: `loader` is not a ``pqloader.Loader``.

    Example:
        >>> ds = pqloader.torch.IterableDataset(pqloader.Loader("data/", batch_size=512, seed=1))
        >>> dl = pqloader.torch.DataLoader(ds, num_workers=2)
        >>> for epoch in range(3):
        ...     ds.set_epoch(epoch)
        ...     for batch in dl: ...
    """

    def __init__(self, loader: Loader) -> None:
        if not isinstance(loader, Loader):
            raise TypeError(f"IterableDataset wraps a pqloader.Loader, got {type(loader).__name__}")
        self._loader: Loader | None = loader
        # A copy's (see __getstate__): the copied loader's state and whether it was a loaded
        # one, for the loader rebuilt from the recipe.
        self._loader_state: tuple[dict[str, Any], bool] | None = None
        self._recipe = _LoaderRecipe(loader.sources, loader.options, loader._plan["files"], type(loader))
        self._epoch = loader.epoch
        self._epoch_set = False
        self._set_since_begin = False  # set_epoch called since the last iteration began
        self._restart = False  # set_epoch kept no loaded state: the loader starts its epoch over
        # set_epoch(e) kept a pending state of e: the next iteration runs the rest of e only
        # (num_epochs from e), as Loader.set_epoch of a loaded state's epoch does.
        self._keep_rest = False
        self._worker_loader: Loader | None = None
        # Main process: a state loaded for the next iteration, and the position of the
        # current one (with workers). Sent to the workers: the state and the shift.
        self._pending: dict[str, Any] | None = None
        self._position: _Position | None = None
        self._worker_state: dict[str, Any] | None = None
        self._worker_shift = 0
        self._worker_epochs = 0
        self._unloaded = False  # the pending state was not loaded into the main loader
        # Rank and world size found when the loader was built (none given): checked against
        # the process group when iterated, as the loader itself checks them.
        self._rank_world_found = loader._rank_world_found
        self._refusal: str | None = None  # that check's error, for spawned workers
        self._lengths: dict[tuple[int, int | None], int] = {}  # (workers, epoch): batches
        self._probes: dict[int, Loader] = {}  # workers: worker 0's loader, for len()
        # The wrapped loader's largest shuffle window (decoded bytes, gathered whole), and
        # the numbers of workers whose memory was checked (warned once each).
        self._window = (loader._plan["max_window_bytes"], loader._plan["gathers_windows"])
        self._memory_checked: frozenset[int] = frozenset()
        state = loader.state_dict()
        if state.get("batch") or state.get("elastic") is not None:
            # The loader is mid-epoch (a state was loaded, or it was partly iterated): worker
            # loaders continue from there too, as the loader itself does without workers
            # (they restarted the epoch, repeating the batches already handed out).
            self._pending = state
        self._pending_loaded = loader._cursor.loaded  # the pending state is a loaded one

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at `epoch` (call it in the main process).

        A state loaded for this same epoch stays, and the next iteration runs the rest of
        that epoch only (nothing of it for a state at its end, as ``Loader.set_epoch``);
        one for another epoch is dropped (with a ``UserWarning`` when the state was inside
        its epoch, as ``Loader.set_epoch``).
        """
        # (checked here, as Loader.set_epoch checks it: 2**32, -1 or 2.5 failed only in
        # the workers, or were truncated by int())
        self._epoch = check_int("epoch", epoch, 0, MAX_EPOCH, EPOCH_HINT)
        self._epoch_set = True
        self._set_since_begin = True
        if self._pending is not None and self._pending["epoch"] != self._epoch:
            if self._pending_loaded and self._pending_within_epoch():
                warnings.warn(_iteration.loaded_position_dropped(self._epoch, self._pending["epoch"]),
                              UserWarning, stacklevel=user_stacklevel())
            self._pending = None
        self._restart = self._pending is None
        self._keep_rest = self._pending is not None

    def _pending_within_epoch(self) -> bool:
        """The pending state had handed out some of its epoch, not all (a state of
        another world: some of it, as far as this process can tell)."""
        p = self._pending
        assert p is not None
        if _consumed_nothing(p):
            return False
        theirs, o = p["options"], self._recipe.options
        engine = self._main_loader()._engine
        if (theirs["world_size"], theirs["batch_size"]) != (o.world_size, o.batch_size):
            # Its rest, dealt to this loader's world (as load_state_dict deals it), has a
            # batch. (Every such state was taken for one inside its epoch: a DataLoader's
            # workers' state taken after the epoch's last batch, inside the loop, warned that
            # set_epoch(e + 1) dropped a position "in the middle of epoch e".)
            counts = p.get("rank_batches") or [p["batch"]] * int(theirs["world_size"])
            base = {"world_size": int(theirs["world_size"]), "batch_size": int(theirs["batch_size"]),
                    "batches": [int(k) for k in counts], "base": p.get("elastic")}
            try:
                return engine.num_batches(p["epoch"], base) > 0
            except Exception:  # (a packed loader's workers' state: the main loader cannot deal it)
                return True
        return not _iteration.position_ended(engine, p["epoch"], p["batch"], p.get("elastic"))

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch handed out.

        With worker processes, only :class:`pqloader.torch.DataLoader` knows it (it
        counts the batches); without, it is the wrapped loader's state. After
        ``set_epoch(e)`` (no state loaded since), the first batch of ``e``, as
        ``Loader.set_epoch`` moves a loader's state. A copy of the dataset returns the
        state of the time it was copied; the dict returned is the caller's own.
        """
        if self._set_since_begin and self._pending is None:
            # The next iteration starts at epoch e's first batch (_begin, __iter__). The
            # loader's position, or the last iteration's, named another epoch: a checkpoint
            # taken at an epoch's start resumed into it (the epoch before, or the next).
            template = self._main_loader().state_dict()
            return _state.make_state(self._epoch, 0, None, template["seed"], template["options"])
        if self._position is None:
            if self._pending is not None:
                # (a copy: its options, counts and elastic base were the pending state's own,
                # and a caller changing them changed what the next iteration resumes)
                return _state._jsonish(self._pending)
            return self._main_loader().state_dict()
        return self._worker_level_state(self._position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a state at the next iteration (see :meth:`state_dict`).

        It is checked here against the wrapped loader (with the worker layout it was
        taken with); the workers load it when they start.

        Raises:
            pqloader.InvalidDataError: The state is malformed or was taken with other
                data options.
        """
        loader = self._main_loader()
        if self._worker_level_packed(state):
            # A packed loader refuses another world size, so the main loader (one rank)
            # cannot load its workers' state: its options and position are checked as
            # the worker loaders' (rank 0 of the state's world), which load it.
            loader._check_state(state, as_world=int(state["options"]["world_size"]))
            self._unloaded = True
        else:
            loader.load_state_dict(state)  # checks it; the worker loaders load it again
            self._unloaded = False
        if loader.seed != self._recipe.options.seed:
            # A loader built with seed=None took the state's seed: so do the workers'
            # (built from the recipe, they ran another order, or refused the state).
            self._recipe = dataclasses.replace(
                self._recipe, options=self._recipe.options.replace(seed=loader.seed))
            self._probes, self._lengths = {}, {}  # (len()'s, of the old seed's order)
        self._epoch = state["epoch"]  # the state's (even at its epoch's end: _begin resumes it)
        self._epoch_set = True
        self._restart = self._keep_rest = False
        # A plain copy: the dataset is pickled for spawned workers, and a state's options
        # as a MappingProxy (or another Mapping pickle refuses) failed there.
        self._pending = _state._jsonish(state)
        self._pending_loaded = True
        self._position = None

    def _load_unloaded(self) -> None:
        """Run in this process, a packed workers' state that was only checked is loaded
        into the main loader (which refuses it for its world), not dropped."""
        if self._pending is not None and self._unloaded:
            self._main_loader().load_state_dict(self._pending)
            self._unloaded = False

    def _worker_level_packed(self, state: Any) -> bool:
        """`state` is of a packed loader's DataLoader workers (a world of world_size * W)."""
        # (any Mapping, and a NumPy int world_size, as the loader's own checks take them: a
        # state rebuilt so fell through to the main loader, which refused the resize)
        theirs = state.get("options") if isinstance(state, Mapping) else None
        world = theirs.get("world_size") if isinstance(theirs, Mapping) else None
        o = self._recipe.options
        return (o.pack is not None and _state.is_state_int(world)
                and world != o.world_size and world % o.world_size == 0)

    def __len__(self) -> int:
        """Batches one iteration without worker processes hands out: ``len(loader)`` of
        the wrapped loader (times ``num_epochs``). With workers, their shards hold their
        own partial batches: ``len()`` of :class:`pqloader.torch.DataLoader` counts them
        (a plain torch DataLoader with workers takes this length and warns when more
        batches come)."""
        self._check_rank_world()
        return self._batches_per_iteration(0)

    def _first_epoch(self, workers: int, persistent: bool) -> int:
        """The epoch the next iteration with `workers` starts in, as :meth:`_begin` and
        :meth:`__iter__` decide it (`persistent`: persistent workers that ran before)."""
        p = self._position
        if workers == 0:
            loader = self._main_loader()
            if self._epoch_set and (loader.epoch != self._epoch or self._restart):
                return self._epoch  # (__iter__ sets it)
            return loader._next_iteration_epoch()  # the loader goes on from its position
        if p is not None and self._pending is None and not self._set_since_begin:
            if self._ran_whole(p):
                return p.epoch + self._epochs_per_iteration()  # (as persistent workers go on)
            if persistent:
                return p.epoch  # (DataLoader.__iter__ starts them anew at it)
        return self._epoch

    def _batches_per_iteration(self, workers: int, persistent: bool = False) -> int:
        """Batches an iteration hands out with `workers` DataLoader workers (the whole of
        its epochs: a resumed one hands out the rest only).

        With workers, every worker loader (shard ``rank * W + w`` of ``world_size * W``)
        has the same number of batches (both shard policies equalise the shards), so the
        count is W times that of worker 0's loader, built here once per W (footers read
        again; a packed one reads the documents' lengths once) and kept, closed.
        """
        n_epochs = self._recipe.options.num_epochs
        if n_epochs is None:
            raise TypeError("the loader runs forever (num_epochs=None): an iteration has no len()")
        first = self._first_epoch(workers, persistent)
        epochs = range(first, first + n_epochs)
        if workers == 0:
            loader = self._main_loader()
            return sum(loader._batches_in_epoch(e) for e in epochs)
        return sum(self._workers_batches(workers, e) for e in epochs)

    def _workers_batches(self, workers: int, epoch: int, base: dict[str, Any] | None = None) -> int:
        """Batches `workers` DataLoader workers hand out in `epoch` (its rest after the
        elastic `base`, if given), from worker 0's loader (built once per W, kept closed)."""
        per_epoch = self._recipe.options.pack is not None  # (else every epoch counts the same)
        key = (workers, epoch if per_epoch else None)
        if base is None and key in self._lengths:
            return self._lengths[key]
        probe = self._probes.get(workers)
        if probe is None:
            o = self._recipe.options
            probe = self._probes[workers] = self._recipe.build(
                rank=o.rank * workers, world_size=o.world_size * workers, num_workers=1,
                device=None, pin_memory=False)
        try:
            n = workers * probe._engine.num_batches(epoch, base)
        finally:
            probe.close()  # (its threads; it stays usable)
        if base is None:
            self._lengths[key] = n
        return n

    def _ran_whole(self, p: _Position) -> bool:
        """The iteration at `p` handed out all its batches: also a loop that took them all
        without reaching the end (``len(dl)`` batches, then no ``next``). The next iteration
        then runs the next epoch, as after a loop that ended (and as the loader itself does)."""
        if p.complete:
            return True
        if self._recipe.options.num_epochs is None:
            return False
        total = sum(self._workers_batches(p.workers, e, p.base if e == p.epoch else None)
                    for e in range(p.epoch, p.epoch + self._epochs_per_iteration()))
        return p.before + p.yielded >= total

    def _main_loader(self) -> Loader:
        if self._loader is None:  # a copy, or unpickled in a spawned worker and used directly
            loader = self._recipe.build()
            if self._loader_state is not None:  # the copied loader's position (__getstate__)
                state, loaded = self._loader_state
                loader.load_state_dict(state)
                loader._cursor.loaded = loaded  # (set_epoch keeps a loaded position only)
                self._loader_state = None
            self._loader = loader
        return self._loader

    def _check_rank_world(self) -> None:
        """Refuse a rank and world size found before the process group was (the wrapped
        loader's check): the workers' loaders are given theirs, and would not refuse."""
        if self._rank_world_found:
            o = self._recipe.options
            _env.check_process_group_agrees(o.rank, o.world_size)

    def _worker_budget(self, workers: int) -> int:
        """Each of `workers` workers' max_inflight_bytes: the given one, else the default's
        eighth of the memory limit divided among them (they share the container's limit as
        they share the threads; batches unchanged)."""
        o = self._recipe.options
        return o.max_inflight_bytes if o.max_inflight_bytes is not None else \
            _env.inflight_bytes(None, share=workers)

    # -- main process, driven by pqloader.torch.DataLoader ----------------------------
    def _check_workers_memory(self, workers: int) -> None:
        """Warn (once per number of workers) when `workers` worker processes, each with its
        own loader and shuffle window, would take the container over its memory limit: the
        wrapped loader's own check counted one loader, and the workers' are silenced."""
        if workers <= 0 or workers in self._memory_checked:
            return
        self._memory_checked = self._memory_checked | {workers}
        window, gathers = self._window
        _env.check_shuffle_window(window, gathers, self._recipe.options.shuffle_window,
                                  self._worker_budget(workers), workers=workers)

    def _begin(self, workers: int, persistent_again: bool) -> None:
        """Fix the epoch, resume state and worker shift before DataLoader starts workers."""
        self._check_rank_world()
        set_since, self._set_since_begin = self._set_since_begin, False
        keep_rest, self._keep_rest = self._keep_rest and self._pending is not None, False
        if workers == 0:
            self._position = None
            self._load_unloaded()
            if keep_rest:
                self._run_rest_only(self._main_loader())
            self._pending = None  # loaded into the main loader already
            return
        if persistent_again and self._position is not None:
            # Persistent workers continue with the next epoch on their own. After the last
            # epoch (2**32 - 1) none follows: said here, as below (the workers' loaders
            # refused it late, at the first batch, as a worker's traceback).
            epoch = self._position.epoch + self._epochs_per_iteration()
            iteration_epochs(epoch, epoch + self._epochs_per_iteration())
            self._position = _Position(epoch, workers)
            return
        if not set_since and self._pending is None and self._position is not None \
                and self._ran_whole(self._position):
            # No set_epoch since an epoch ran whole: the next one, as persistent workers and
            # the loader itself (num_workers=0) go on, and as state_dict() names it (workers
            # made anew reran the set epoch: another stream, and a resume ran the next).
            self._epoch = self._position.epoch + self._epochs_per_iteration()
        epoch = self._epoch
        # After the last epoch (2**32 - 1) none follows: said here, not in each worker.
        iteration_epochs(epoch, epoch + self._epochs_per_iteration())
        state, self._pending = self._pending, None
        if state is not None and not keep_rest and state["epoch"] == epoch and self._ended_state(state, workers):
            # A state at its epoch's end (a loop left at its last batch): resumed, the
            # loader runs the next epoch, as Loader does. The workers ran it while the
            # position counted the state's epoch: the next iteration ran it again, and
            # state_dict() named a batch of the state's epoch.
            epoch = self._epoch = epoch + 1
            iteration_epochs(epoch, epoch + self._epochs_per_iteration())
            state = None
        position = _Position(epoch, workers)
        self._worker_state, self._worker_shift = None, 0
        if state is not None and state["epoch"] == epoch and not _consumed_nothing(state):
            position, self._worker_state = self._resumed_position(state, workers)
            self._worker_shift = position.before % workers
            if self._worker_state.get("iteration_end") is None and self._recipe.options.num_epochs is not None:
                # The workers end with the epoch the position counts (as _run_rest_only). A
                # state at its epoch's end kept by set_epoch ran the next epoch here, which
                # set_epoch of it then ran again; a worker whose rank had handed out all of
                # its epoch (ranks of a merged state that stopped at other batches) ran the
                # next one in this loop, counted as the state's, and the next loop again.
                self._worker_state = dict(self._worker_state,
                                          iteration_end=epoch + self._epochs_per_iteration())
        self._position = position

    def _ended_state(self, state: dict[str, Any], workers: int) -> bool:
        """`state`, with no iteration end recorded, is at its epoch's end for the `workers`
        worker loaders that would load it (a loop left at its last batch, without reaching
        the end; or a rest dealt anew that gives them no batch): they would run the next
        epoch. (Only a state of the ranks' own world was told: from one of another world,
        the workers' or merged, they ran it counted as the state's epoch.)"""
        if state.get("iteration_end") is not None or _consumed_nothing(state):
            return False
        theirs, o = state["options"], self._recipe.options
        if state.get("rank_batches") is None and (theirs["world_size"], theirs["batch_size"]) == \
                (o.world_size, o.batch_size) and _iteration.position_ended(
                    self._main_loader()._engine, state["epoch"], state["batch"], state.get("elastic")):
            return True  # (a packed loader's too, whose workers could not deal its rest anew)
        position, _ = self._resumed_position(state, workers)
        consumed = position.before > 0 or _iteration.elastic_consumed(position.base)
        return consumed and position.before >= self._workers_batches(workers, position.epoch, position.base)

    def _run_rest_only(self, loader: Loader) -> None:
        """set_epoch(e) kept the pending state of e, which `loader` holds: its next
        iteration runs the rest of e (num_epochs from e), as ``Loader.set_epoch(e)`` after
        ``load_state_dict`` does. Without it a state at e's end (no iteration end recorded:
        taken after a loop left at its last batch) ran epoch e + 1 in the loop of e, and
        the resume loop's set_epoch(e + 1) then ran e + 1 again."""
        if loader.epoch == self._epoch:
            loader._set_epoch(self._epoch, warn=False, kept=True)

    def _epochs_per_iteration(self) -> int:
        n = self._recipe.options.num_epochs
        return 1 if n is None else n

    def _resumed_position(self, state: dict[str, Any], workers: int) -> tuple[_Position, dict[str, Any]]:
        """Where the workers start, and the state they load (as ``_state.parse_state``
        reads it)."""
        o = self._recipe.options
        theirs = state["options"]
        world = o.world_size * workers
        counts = state.get("rank_batches") or [state["batch"]] * theirs["world_size"]
        if theirs["world_size"] == world and theirs["batch_size"] == o.batch_size:
            mine = counts[o.rank * workers:(o.rank + 1) * workers]
            position = _Position(state["epoch"], workers, base=state.get("elastic"), before=sum(mine))
            if _in_turns(counts, workers):
                return position, state
            if o.pack is not None:  # cannot be dealt anew (see below)
                raise InvalidDataError(
                    f"cannot resume this state of a packed loader (pack=...) on {o.world_size} "
                    f"rank(s) x {workers} DataLoader workers: it was taken on another split of "
                    f"its world of {world} worker loaders (batches per worker {counts}), whose "
                    "ranks would get unequal rests (a collective per step would wait forever on "
                    "the rank that ran out); packed loaders resume with the same ranks, workers "
                    "and batch size")
            # The counts are not those of ranks in lockstep, each taking its workers'
            # batches in turns (the state of another split of the world, e.g. 2 ranks x 2
            # workers resumed as 1 x 4): DataLoader's turns would not continue them (the
            # next state would count the workers wrongly) and the ranks would get unequal
            # rests. As after a resize, the rest of the epoch is dealt anew (on every
            # rank: each decides from all the counts).
        if o.pack is not None:  # the workers would refuse it, each in its own process
            raise InvalidDataError(
                f"cannot resume this state of a packed loader (pack=...) with {workers} DataLoader "
                f"workers on {o.world_size} rank(s) (a world of {world}, batch_size {o.batch_size}): "
                f"it was taken on a world of {theirs['world_size']} (batch_size {theirs['batch_size']}); "
                "packed loaders resume with the same ranks, workers and batch size (to start "
                "the epoch over instead: a loader iterated into it, loader.set_epoch(loader.epoch) "
                "before wrapping it; one that loaded this state, build it anew, with its seed)")
        base = {"world_size": theirs["world_size"], "batch_size": theirs["batch_size"],
                "batches": list(counts), "base": state.get("elastic")}
        if theirs["world_size"] == world and theirs["batch_size"] == o.batch_size:
            dealt = _state.make_state(state["epoch"], 0, state.get("iteration_end"), state["seed"],
                                      theirs, base)
            return _Position(state["epoch"], workers, base=base), dealt
        return _Position(state["epoch"], workers, base=base), state

    def _worker_level_state(self, p: _Position) -> dict[str, Any]:
        """A state of the worker loaders' world (rank * W + w of world_size * W).

        Mid-epoch, the interrupted iteration ends with the epoch (``iteration_end``): a
        worker that had handed out all its batches of it yields nothing more, rather
        than its next epoch.
        """
        o = self._recipe.options
        if o.num_epochs != 1:
            # The position counts batches of one epoch: DataLoader takes the workers'
            # batches in turns, and which epoch each is of is not known here.
            raise ValueError(
                "pqloader.torch.DataLoader with worker processes counts the position of one "
                f"epoch per iteration: give the loader num_epochs=1 (it has {o.num_epochs}) "
                "and call set_epoch(e) before each epoch")
        end = None
        if p.complete:
            p = _Position(p.epoch + 1, p.workers)
        elif not (p.left and self._ran_whole(p)):
            end = p.epoch + 1
        # A loop left after its last batch, without reaching the end, is at the end of its
        # epoch with no iteration end, as the loader's own state is then (num_workers=0): the
        # next iteration runs the next epoch (_begin, _ended_state), and set_epoch of this
        # epoch keeps the position, whose rest is empty. (It named the next epoch's start:
        # the resume loop's set_epoch(e), e the loop's epoch, dropped it and ran epoch e
        # again whole, where the loader without workers ran nothing of it.)
        template = self._main_loader().state_dict()
        state = _state.make_state(p.epoch, p.counts()[0], end, template["seed"],
                                  dict(template["options"], rank=0,
                                       world_size=o.world_size * p.workers), p.base)
        state["rank_batches"] = p.counts() * o.world_size  # ranks run in lockstep
        return _state.stamp(state)

    def _yielded(self, position: _Position | None) -> None:
        """A batch of the iteration at `position` was handed out: that iteration's is the
        position (another one may have begun since, e.g. a ``next(iter(dl))`` inside a loop:
        its Position was the dataset's, and this loop's batches were counted in it)."""
        if position is not None and self._position is not None:  # (None: a state loaded since)
            position.yielded += 1
            self._position = position

    def _left(self, position: _Position | None) -> None:
        """The loop of the iteration at `position` ended before its end (break, an error)."""
        if position is not None:
            position.left = True

    def _completed(self, position: _Position | None) -> None:
        if position is not None and self._position is not None:
            position.complete = True
            self._position = position

    # -- worker processes -------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        if info is None:
            loader = self._main_loader()
            self._load_unloaded()
            if self._keep_rest and self._pending is not None:
                self._run_rest_only(loader)
            if self._epoch_set and self._pending is None and (loader.epoch != self._epoch or self._restart):
                # (also the epoch the loader is in: a loop of it left early continued its
                # rest; a loaded position its set_epoch dropped is dropped, as it warned)
                loader._set_epoch(self._epoch, warn=False, keep=False)
            self._epoch_set = self._restart = self._set_since_begin = self._keep_rest = False
            self._pending = None
            return iter(loader)
        if self._worker_loader is not None and self._worker_shift:
            # A resumed epoch is over: later ones are ordinary (persistent workers).
            epoch = self._worker_loader.epoch
            self._worker_loader, self._worker_state, self._worker_shift = None, None, 0
            self._epoch = epoch
        elif self._worker_loader is not None:
            # A persistent worker's next iteration (a plain torch DataLoader's) after one
            # left early: the batches it had fetched ahead went with the old iterator, so
            # its rest lost them (2 of 8 batches came). The epoch starts over, as without
            # persistent workers and under pqloader.torch.DataLoader.
            loader = self._worker_loader
            if loader._next_iteration_epoch() == loader.epoch:
                loader._set_epoch(loader.epoch, warn=False, keep=False)
        if self._worker_loader is None:
            if self._refusal is not None:  # found when a plain DataLoader spawned this worker
                raise ValueError(self._refusal)
            self._check_rank_world()  # a plain DataLoader's forked workers see the group
            self._worker_loader = self._make_worker_loader(info)
        return iter(self._worker_loader)

    def _make_worker_loader(self, info: Any) -> Loader:
        o = self._recipe.options
        workers = info.num_workers
        if self._worker_state is None and self._pending is not None and self._pending["epoch"] == self._epoch \
                and not _consumed_nothing(self._pending):
            # A plain torch DataLoader: pqloader.torch.DataLoader hands a loaded state (or
            # the wrapped loader's position) to the workers in _begin; here every worker
            # derives the same from it (the workers restarted the epoch, repeating what
            # the state had consumed).
            position, self._worker_state = self._resumed_position(self._pending, workers)
            self._worker_shift = position.before % workers
            if self._keep_rest and self._worker_state.get("iteration_end") is None and o.num_epochs is not None:
                # (kept by set_epoch: the rest of its epoch only, as _begin gives it)
                self._worker_state = dict(self._worker_state, iteration_end=self._epoch + o.num_epochs)
        threads = min(o.num_workers or _env.available_cpus(), MAX_THREADS)
        slot = (info.id + self._worker_shift) % workers
        loader = self._recipe.build(rank=o.rank * workers + slot, world_size=o.world_size * workers,
                                    num_workers=max(1, threads // workers),
                                    max_inflight_bytes=self._worker_budget(workers),
                                    device=None, pin_memory=False)
        _process.mark_sharded_per_worker(loader)
        if self._worker_state is not None:
            loader.load_state_dict(self._worker_state)
        else:
            loader.set_epoch(self._epoch)
        return loader

    def __getstate__(self) -> dict[str, Any]:
        # A copy (copy.copy, copy.deepcopy, pickle) is the dataset at the time it was made,
        # position included: its state_dict() is the one taken then. (It named the rebuilt loader's start, or the position of no iteration: a
        # checkpoint taken from a copy mid-epoch silently resumed at the epoch's start.)
        state = dict(self.__dict__)
        state["_loader"] = None  # the engine cannot be pickled; it is rebuilt from the recipe
        if self._loader is not None:  # ... at the wrapped loader's position
            state["_loader_state"] = (self._loader.state_dict(), self._loader._cursor.loaded)
        # The iteration's count, copied: the original's DataLoader goes on counting its own.
        state["_position"] = copy.deepcopy(self._position)
        state["_worker_loader"] = None
        state["_probes"] = {}
        try:  # a spawned worker does not see the process group: the check is made here
            self._check_rank_world()
        except ValueError as e:
            state["_refusal"] = str(e)
        if multiprocessing.context.get_spawning_popen() is not None:  # (not for a copy)
            _check_sendable(self._recipe)
        return state


class DataLoader(torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader`` over a :class:`IterableDataset`, with checkpoints.

    It counts the batches it hands out, so ``state_dict()`` names the position after the
    last one even with worker processes, and ``load_state_dict()`` resumes exactly there:
    the same workers (their number unchanged) continue their own streams, in the same
    turns; another number of workers, ranks or another batch size gets the rest of the
    epoch dealt anew (elastic resume), also where ranks x workers is the same world. ``batch_size`` must stay None (items are whole
    batches) and ``in_order`` True (the turns); every other argument is DataLoader's.
    The count lives in the dataset: a DataLoader made anew over it with the same arguments
    (as Lightning re-creates loaders) goes on from the same position.

    Args:
        dataset: A :class:`pqloader.torch.IterableDataset`.
        **kwargs: ``torch.utils.data.DataLoader`` arguments.

    Raises:
        TypeError: `dataset` is not a pqloader IterableDataset.
        ValueError: ``batch_size`` is not None, or ``in_order=False`` with worker processes.
    """

    def __init__(self, dataset: IterableDataset, **kwargs: Any) -> None:
        if not isinstance(dataset, IterableDataset):
            raise TypeError(f"pqloader.torch.DataLoader needs a pqloader.torch.IterableDataset, "
                            f"got {type(dataset).__name__}")
        if kwargs.setdefault("batch_size", None) is not None:
            raise ValueError("pqloader.torch.DataLoader: batch_size must be None (the loader batches)")
        super().__init__(dataset, **kwargs)
        if self.num_workers > 0 and not getattr(self, "in_order", True):
            raise ValueError(
                "pqloader.torch.DataLoader: in_order=False hands out the workers' batches as they "
                "come, not in turns: the stream would not be deterministic and state_dict() could "
                "not tell how many batches each worker had handed out (a resume would repeat some "
                "rows and skip others); leave in_order=True")
        self._iterated = False
        dataset._check_workers_memory(self.num_workers)

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        ds = self.dataset
        assert isinstance(ds, IterableDataset)
        again = self.persistent_workers and self._iterated
        p = ds._position
        elsewhere = (p is not None and p.complete and ds._set_since_begin
                     and ds._epoch != p.epoch + ds._epochs_per_iteration())
        if again and self.num_workers > 0 and (not (p is not None and p.complete) or elsewhere):
            # The last iteration was left early (or a state was loaded), or set_epoch named
            # another epoch than the next: persistent workers would go on with the rest or
            # the next epoch (their loaders are theirs). Start them anew, as non-persistent
            # ones would.
            if self._iterator is not None:
                self._iterator._shutdown_workers()
                self._iterator._pqloader_stopped = True  # a loop still on it is told, below
                self._iterator = None
            again = False
            if ds._position is not None and not ds._set_since_begin:
                # No set_epoch since: the epoch the workers had reached on their own is
                # the one to run again from its start (as a non-persistent loader reruns
                # its epoch), not the one set before they went on.
                ds._epoch = ds._position.epoch
        ds._check_workers_memory(self.num_workers)  # (num_workers changed since it was made)
        ds._begin(self.num_workers, again)
        self._iterated = True
        batches = super().__iter__()
        position = ds._position  # this iteration's (a later iteration makes its own)

        def stopped() -> bool:
            return getattr(batches, "_pqloader_stopped", False)

        def count() -> Iterator[dict[str, Any]]:
            # Its workers stopped by a new iteration (a persistent one's): said before the
            # next batch is asked for, as the iterator may still hold some it had fetched
            # (handed out, they hid the stop now and then); without the check the loop
            # ended silently, as if its epoch had.
            completed = False
            try:
                while not stopped():
                    try:
                        batch = next(batches)
                    except StopIteration:
                        break
                    ds._yielded(position)
                    yield batch
                if stopped():
                    raise RuntimeError(
                        "pqloader.torch.DataLoader was iterated again while this loop ran: its persistent "
                        "workers serve one iteration at a time, so this loop's stopped before the end of "
                        "its epoch (take a batch to look at before the loop, or from another DataLoader)")
                ds._completed(position)
                completed = True
            finally:
                if not completed:
                    ds._left(position)

        return count()

    def __len__(self) -> int:
        """Batches an iteration hands out with this DataLoader's ``num_workers``: all of
        the epoch's (``num_epochs`` epochs'), also for an iteration that resumes mid-epoch
        (it hands out the rest only), as torch's DataLoader counts a sampler's.

        Raises:
            TypeError: The loader has ``num_epochs=None`` (it runs forever).
            ValueError: The loader's rank and world size were found before the process
                group was initialised and it says otherwise.
        """
        self.dataset._check_rank_world()  # type: ignore[attr-defined]
        return self.dataset._batches_per_iteration(  # type: ignore[attr-defined]
            self.num_workers, self.persistent_workers and self._iterated)

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch handed out (a pqloader state).

        Raises:
            ValueError: With worker processes, the loader's ``num_epochs`` is not 1.
        """
        return self.dataset.state_dict()  # type: ignore[attr-defined]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the next iteration from a state of ``state_dict()`` (or a Loader's).

        Call ``set_epoch`` with the state's epoch (or not at all) before iterating.
        """
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]
