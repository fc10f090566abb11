"""Checkpoints: what ``state_dict()`` records and how ``load_state_dict()`` checks it.

A state is plain JSON-safe data::

    {"version": 1, "epoch": e, "batch": b, "iteration_end": end or None, "seed": s,
     "options": {fingerprint of the data-affecting options}}

``(epoch, batch)`` names the next batch to hand out; ``iteration_end`` the epoch the
interrupted iteration would have stopped before. A state loads only into a loader
that agrees on every data-affecting option (:data:`DATA_OPTIONS`), so the resumed
stream is the rest of the original one. :func:`parse_state` checks everything before
the loader changes anything: a refused state leaves the loader as it was.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from pqloader._errors import InvalidDataError
from pqloader._options import MAX_COUNT, SEED_LIMIT, LoaderOptions

STATE_VERSION = 1
# Options that change which rows land in which batch. A state can only be loaded into a
# loader that agrees on all of them.
DATA_OPTIONS = (
    "sources", "files", "columns", "batch_size", "drop_last", "shuffle", "seed",
    "shuffle_window", "rank", "world_size", "shard_policy", "fill_null", "transforms",
    "on_decode_error",
)


def fingerprint(sources: list[str], files: list[Any], columns: list[str], options: LoaderOptions,
                transforms: str, seed: int) -> dict[str, Any]:
    """The data-affecting options of a loader, as JSON-safe values.

    Args:
        sources: The normalised sources.
        files: ``plan_info()["files"]``: (path, size, rows) per file.
        columns: Output column names, in order.
        options: The loader's (resolved) options.
        transforms: The engine's transform fingerprint.
        seed: The seed to record (the loader's, or one it would adopt).

    Returns:
        ``{name: value}`` for every name in :data:`DATA_OPTIONS`.
    """
    return {
        "sources": list(sources),
        # A row-group selection joins its file's entry (states without one are unchanged).
        "files": [[path, size] + ([list(options.row_groups[path])]
                                  if options.row_groups and path in options.row_groups else [])
                  for path, size, *_ in files],
        "columns": list(columns),
        "batch_size": options.batch_size,
        "drop_last": options.drop_last,
        "shuffle": options.shuffle,
        "seed": seed,
        "shuffle_window": options.shuffle_window,
        "rank": options.rank,
        "world_size": options.world_size,
        "shard_policy": options.shard_policy,
        "fill_null": repr(options.fill_null),
        "transforms": transforms,
        "on_decode_error": options.on_decode_error,
    }


def make_state(epoch: int, batch: int, iteration_end: int | None, seed: int,
               options: Mapping[str, Any]) -> dict[str, Any]:
    """Assemble a state (see the module docstring)."""
    return {
        "version": STATE_VERSION,
        "epoch": epoch,
        "batch": batch,
        # Where the interrupted `for batch in loader` would have stopped, so that a
        # resumed iteration yields exactly the rest of it (None: no iteration active).
        "iteration_end": iteration_end,
        "seed": seed,
        "options": dict(options),
    }


@dataclasses.dataclass(frozen=True)
class Restored:
    """What a checked state tells a loader to do."""

    epoch: int
    batch: int
    iteration_end: int | None
    seed: int


def _field_int(state: Mapping[str, Any], key: str, minimum: int, maximum: int,
               optional: bool = False) -> int | None:
    if key not in state:
        if optional:
            return None
        raise InvalidDataError(f"not a pqloader state: state[{key!r}] is missing")
    value = state[key]
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidDataError(f"state[{key!r}] must be an int in [{minimum}, {maximum}], "
                               f"got {type(value).__name__} {value!r:.100}")
    if not minimum <= value <= maximum:
        raise InvalidDataError(f"state[{key!r}] must be in [{minimum}, {maximum}], got {value}")
    return value


def _jsonish(value: Any) -> Any:
    """Normalise tuples to lists so values compare equal after a JSON round trip."""
    if isinstance(value, (list, tuple)):
        return [_jsonish(v) for v in value]
    return value


def parse_state(state: Any, *, num_batches: Callable[[int], int], seed: int, adopt_seed: bool,
                fingerprint_for: Callable[[int], dict[str, Any]]) -> Restored:
    """Check a state completely, without changing anything.

    Args:
        state: What ``state_dict()`` returned, possibly after a JSON round trip.
        num_batches: Batches of an epoch (epoch -> count) of the loader that loads it.
        seed: The loader's seed.
        adopt_seed: Take the state's seed (a loader whose seed was drawn); otherwise
            the seeds must agree.
        fingerprint_for: The loader's fingerprint with a given seed.

    Returns:
        The position, iteration end and seed to apply.

    Raises:
        pqloader.InvalidDataError: The state is malformed (naming the bad field) or
            was taken with other data-affecting options (naming them).
    """
    if not isinstance(state, Mapping):
        raise InvalidDataError(f"not a pqloader state (a dict with version {STATE_VERSION}): "
                               f"got {type(state).__name__} {state!r:.200}")
    if state.get("version") != STATE_VERSION or isinstance(state.get("version"), bool):
        raise InvalidDataError(f"not a pqloader state: state['version'] must be {STATE_VERSION}, "
                               f"got {state.get('version')!r:.100}")
    epoch = _field_int(state, "epoch", 0, MAX_COUNT)
    batch = _field_int(state, "batch", 0, num_batches(epoch))
    end = _field_int(state, "iteration_end", epoch, MAX_COUNT, optional=True)
    state_seed = _field_int(state, "seed", 0, SEED_LIMIT - 1)
    theirs = state.get("options")
    if not isinstance(theirs, Mapping):
        raise InvalidDataError(f"state['options'] must be a dict of the loader's data options, "
                               f"got {type(theirs).__name__} {theirs!r:.100}")
    missing = [k for k in DATA_OPTIONS if k not in theirs]
    if missing:
        raise InvalidDataError(f"state['options'] lacks {', '.join(map(repr, missing))}")
    new_seed = state_seed if adopt_seed else seed
    mine = fingerprint_for(new_seed)
    diffs = [
        f"{k}: state has {theirs[k]!r:.200}, loader has {mine[k]!r:.200}"
        for k in DATA_OPTIONS
        if _jsonish(theirs[k]) != _jsonish(mine[k])
    ]
    if state_seed != new_seed and _jsonish(theirs["seed"]) == _jsonish(mine["seed"]):
        diffs.append(f"seed: state has {state_seed}, loader has {new_seed}")
    if diffs:
        raise InvalidDataError("cannot load a state taken with different options: " + "; ".join(diffs))
    return Restored(epoch=epoch, batch=batch, iteration_end=end, seed=new_seed)
