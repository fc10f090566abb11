"""Checkpoints across ranks with ``torch.distributed``.

Imported through the public ``pqloader.torch`` module only (it imports torch).
"""

from __future__ import annotations

import json
from typing import Any

import torch.distributed as dist

from pqloader._state import merge_states


def gather_state_dict(loader: Any, group: Any = None) -> dict[str, Any]:
    """Every rank's loader state, merged into one (a collective: call it on all ranks).

    Ranks train in lockstep, so one rank's ``state_dict()`` describes them all; this
    records each rank's own count as well and returns the same value on every rank, as
    ``torch.distributed.checkpoint`` expects of a value saved under one key (it keeps
    one copy). The result loads on any world size: ``loader.load_state_dict(state)``.

    Args:
        loader: This rank's :class:`pqloader.Loader` (or :class:`pqloader.torch.DataLoader`).
        group: The process group (default: the world).

    Returns:
        The merged state (see :func:`pqloader.merge_states`).
    """
    mine = loader.state_dict()
    if not dist.is_available() or not dist.is_initialized():
        return merge_states([mine])
    states: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(states, mine, group=group)
    if "rank_batches" in mine:  # a DataLoader's state covers its workers already
        return mine
    return merge_states(states)


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
        """Resume the loader from a saved entry."""
        self.loader.load_state_dict(json.loads(state["pqloader_state"]))
