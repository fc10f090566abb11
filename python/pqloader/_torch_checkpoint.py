"""Checkpoints across ranks with ``torch.distributed``.

Imported through the public ``pqloader.torch`` module only (it imports torch).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

import torch.distributed as dist

from pqloader._errors import InvalidDataError
from pqloader._loader import Loader
from pqloader._mix import Mixture
from pqloader._state import is_mix_state, merge_states, stamp
from pqloader._torch_dataset import IterableDataset


def gather_state_dict(loader: Any, group: Any = None) -> dict[str, Any]:
    """Every rank's loader state, merged into one (a collective: call it on all ranks).

    Ranks train in lockstep, so one rank's ``state_dict()`` describes them all; this
    records each rank's own count as well and returns the same value on every rank, as
    ``torch.distributed.checkpoint`` expects of a value saved under one key (it keeps
    one copy). The result loads on any world size: ``loader.load_state_dict(state)``.
    Each rank sends its position and a digest of the rest of its state (whose options
    list every file), not the whole state; whole states only where the digests differ.

    Args:
        loader: This rank's :class:`pqloader.Loader` (or :class:`pqloader.torch.DataLoader`).
        group: The process group (default: the world).

    Returns:
        The merged state (see :func:`pqloader.merge_states`).

    Raises:
        ValueError: The group's size is not the loader's world size (a data-parallel
            loader gathered over the whole world: pass its group), or the loader has
            several ranks and no process group is initialised.
    """
    mine = loader.state_dict()
    rank_world = _rank_world(loader)
    if not dist.is_available() or not dist.is_initialized():
        if "rank_batches" not in mine and rank_world is not None and rank_world[1] > 1:
            raise ValueError(
                f"gather_state_dict: this loader is rank {rank_world[0]} of {rank_world[1]}, but no "
                "torch.distributed process group is initialised to gather the other ranks' states "
                "over; call it after init_process_group (on every rank), or save this rank's "
                "loader.state_dict() (ranks in lockstep: any rank's resumes every rank) or "
                "pqloader.merge_states of every rank's")
        return mine if "rank_batches" in mine else merge_states([mine])
    states: list[Any] = [None] * dist.get_world_size(group)
    if rank_world is not None and rank_world[1] != len(states):
        # (each rank checks before the collective: none is left waiting in it)
        raise ValueError(
            f"gather_state_dict: this loader is rank {rank_world[0]} of {rank_world[1]}, but the "
            f"process group it gathers over has {len(states)} processes: pass group= the group of "
            f"the loader's {rank_world[1]} rank(s) (e.g. its data-parallel group), or, for a loader "
            "every process reads whole (world_size=1), save its own loader.state_dict()")
    dataset = getattr(loader, "dataset", loader)  # a DataLoader's IterableDataset
    if isinstance(dataset, IterableDataset) and dataset._position is not None:
        # A DataLoader counting its workers' batches: its state counts every rank's workers
        # as this rank's. Each rank gives its own workers' counts (and its rank: the state's
        # options are those of the workers' world).
        return _merge_worker_states(_gather_states(mine, group, len(states),
                                                   rank=dataset._recipe.options.rank))
    states = _gather_states(mine, group, len(states))
    if "rank_batches" in mine:  # a merged state, loaded and not iterated yet
        return mine
    return merge_states(states)


# What of a state differs between the ranks of one job in step: the rest (the options
# with every file of the dataset) is the same on all of them, so each rank sends only
# these and a digest of the rest. Gathering whole states moved world x state bytes to
# every rank (with NCCL onto its GPU): 10^5 files make a ~9 MB state, 1,024 ranks 9 GB.
def _positions(state: Mapping[str, Any], rank: int | None, world: int) -> tuple[Any, dict[str, Any]]:
    """(this rank's position fields, the state without them) of a Loader, mixture or
    DataLoader (``rank`` given: its own workers' counts in ``rank_batches``) state;
    (None, state) for one of another shape (gathered whole)."""
    rest = dict(state)
    if rank is not None:
        counts = rest.pop("rank_batches", None)
        if not isinstance(counts, list) or not counts or len(counts) % world or not 0 <= rank < world:
            return None, state
        workers = len(counts) // world
        rest.pop("batch", None)
        return (rank, state.get("batch"), counts[rank * workers:(rank + 1) * workers]), rest
    if is_mix_state(state) and isinstance(state.get("config"), Mapping):
        config = dict(state["config"])
        fps = config.get("source_fingerprints")
        if isinstance(fps, list) and all(isinstance(f, Mapping) for f in fps):
            config["source_fingerprints"] = [{k: v for k, v in f.items() if k != "rank"} for f in fps]
            rest["config"] = config
            return ("mix", [f.get("rank") for f in fps]), rest
        return None, state
    if isinstance(state.get("options"), Mapping):
        rest["options"] = {k: v for k, v in state["options"].items() if k != "rank"}
        return ("loader", state["options"].get("rank"),
                {k: rest.pop(k) for k in ("batch", "iteration_end") if k in rest}), rest
    return None, state


def _joined(mine: Mapping[str, Any], position: Any, rank: int | None) -> dict[str, Any]:
    """Another rank's state: this rank's with that rank's position fields."""
    state = dict(mine)
    if rank is not None:
        other, batch, own = position
        counts = list(state["rank_batches"])  # (only its own workers' are read: _merge_worker_states)
        counts[other * len(own):(other + 1) * len(own)] = own
        state["rank_batches"] = counts
        state.pop("batch", None)
        if batch is not None:
            state["batch"] = batch
        return state
    if position[0] == "mix":
        config = dict(state["config"])
        config["source_fingerprints"] = [dict(f, rank=r) for f, r in
                                         zip(config["source_fingerprints"], position[1])]
        state["config"] = config
        return state
    state.pop("batch", None)
    state.pop("iteration_end", None)
    state.update(position[2])
    state["options"] = dict(state["options"], rank=position[1])
    return state


def _gather_states(mine: dict[str, Any], group: Any, world: int, rank: int | None = None) -> list[Any]:
    """Every rank's state (``(rank, state)`` pairs with `rank`, a DataLoader's), gathering
    only their positions and a digest of the rest; whole states where the digests differ
    (all ranks see that: merging them then names the difference)."""
    position, rest = _positions(mine, rank, world)
    digest = None
    if position is not None:
        try:  # (a failure here on one rank would leave the others in the collective)
            digest = hashlib.sha256(json.dumps(rest, sort_keys=True, default=repr).encode()).hexdigest()
        except (TypeError, ValueError):
            position = None
    small: list[Any] = [None] * world
    dist.all_gather_object(small, (position, digest), group=group)
    if digest is None or any(d != digest or p is None for p, d in small):
        full: list[Any] = [None] * world
        dist.all_gather_object(full, mine if rank is None else (rank, mine), group=group)
        return full
    states = [_joined(mine, p, rank) for p, _ in small]
    return states if rank is None else [(p[0], s) for (p, _), s in zip(small, states)]


def _rank_world(loader: Any) -> tuple[int, int] | None:
    """The loader's own rank and world size (a DataLoader's dataset's, a mixture's
    sources'), as ``gather_state_dict`` gathers one state per rank of that world."""
    dataset = getattr(loader, "dataset", loader)
    if isinstance(dataset, IterableDataset):
        options = dataset._recipe.options
    elif isinstance(dataset, Loader):
        options = dataset.options
    elif isinstance(dataset, Mixture):
        options = dataset._loaders[0].options
    else:
        return None
    return options.rank, options.world_size


def _merge_worker_states(ranked: list[Any]) -> dict[str, Any]:
    """The states of every rank's ``pqloader.torch.DataLoader`` (with workers), as
    ``(rank, state)``, merged into one: each rank's workers with their own counts."""
    ranked = sorted(ranked, key=lambda rs: rs[0])
    first = ranked[0][1]
    world = len(ranked)
    workers = len(first["rank_batches"]) // world
    if [r for r, _ in ranked] != list(range(world)) or workers * world != len(first["rank_batches"]):
        raise InvalidDataError(f"gather_state_dict needs one DataLoader state per rank 0..{world - 1}, "
                               f"got ranks {[r for r, _ in ranked]}")

    def same(s: dict[str, Any]) -> Any:
        return [s.get(k) for k in ("epoch", "iteration_end", "seed", "options", "elastic")]

    for r, s in ranked[1:]:
        if same(s) != same(first):
            raise InvalidDataError(f"rank {r}'s DataLoader state differs from rank 0's in more than "
                                   "its position (epoch, iteration end, seed, options or elastic base)")
    merged = dict(first)
    merged["rank_batches"] = [k for r, s in ranked for k in s["rank_batches"][r * workers:(r + 1) * workers]]
    merged["batch"] = merged["rank_batches"][0]
    return stamp(merged)


class Checkpoint:
    """A loader as a value of a ``torch.distributed.checkpoint`` state dict.

    ``dcp.save({"model": ..., "loader": pqloader.torch.Checkpoint(loader)}, ...)`` saves
    every rank's position merged into one (:func:`gather_state_dict`), and ``dcp.load``
    with the same entry on any number of ranks resumes each loader from it (elastic
    resume when the world size changed). It implements DCP's ``Stateful`` protocol; the
    state travels as one JSON string, so that its keys do not depend on the world size.

    Args:
        loader: This rank's :class:`pqloader.Loader` (or :class:`pqloader.torch.DataLoader`).
        group: The process group (default: the world).
    """

    def __init__(self, loader: Any, group: Any = None) -> None:
        self.loader = loader
        self.group = group

    def state_dict(self) -> dict[str, Any]:
        """``{"pqloader_state": JSON of the merged state}`` (a collective)."""
        return {"pqloader_state": json.dumps(gather_state_dict(self.loader, self.group))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the loader from a saved entry.

        Raises:
            pqloader.InvalidDataError: The entry is not a ``state_dict()`` of a
                ``Checkpoint`` (its ``pqloader_state`` is missing or not JSON), or the
                loader refuses the state in it.
        """
        text = state.get("pqloader_state") if isinstance(state, Mapping) else None
        if not isinstance(text, str):
            own = isinstance(state, Mapping) and ("options" in state or is_mix_state(state))
            raise InvalidDataError(
                "not a pqloader.torch.Checkpoint entry (a dict of one JSON string, 'pqloader_state'): "
                + ("this is a loader's own state_dict(): load it with loader.load_state_dict"
                   if own else f"got {type(state).__name__} {state!r:.200}"))
        try:
            loaded = json.loads(text)
        except (ValueError, RecursionError) as e:  # (nested too deep: a bare RecursionError)
            raise InvalidDataError(f"pqloader.torch.Checkpoint entry: 'pqloader_state' is not JSON "
                                   f"({e}): {text!r:.100}") from None
        self.loader.load_state_dict(loaded)
