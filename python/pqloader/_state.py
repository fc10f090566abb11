"""Checkpoints: what ``state_dict()`` records and how ``load_state_dict()`` checks it.

A state is plain JSON-safe data::

    {"version": 2, "epoch": e, "batch": b, "iteration_end": end or None, "seed": s,
     "options": {fingerprint of the data-affecting options},
     "elastic": None or {"world_size": n, "batch_size": b, "batches": [k, ...],
                         "base": an earlier one or None},
     "rank_batches": [k per rank] (only in states merged by merge_states),
     "optional_keys": which of elastic and rank_batches the state holds}

``optional_keys`` is there for ``torch.distributed.checkpoint``, which loads a
``Stateful`` in place into the keys of its fresh ``state_dict()``: one whose fresh state
lacks ``elastic`` or ``rank_batches`` dropped them without a word, and the stream skipped
or repeated rows; now such a state is refused, naming what it lost.

``(epoch, batch)`` names the next batch to hand out; ``iteration_end`` the epoch the
interrupted iteration would have stopped before. A state loads only into a loader
that agrees on every data-affecting option (:data:`DATA_OPTIONS`), so the resumed
stream is the rest of the original one. :func:`parse_state` checks everything before
the loader changes anything: a refused state leaves the loader as it was.

Elastic resume: ``rank``, ``world_size`` and ``batch_size`` may differ
(:data:`RESIZABLE`). Ranks train in lockstep, so a single rank's state says every old
rank had consumed ``batch`` batches (a merged state says it per rank). If the world
size or batch size changed, the rest of the epoch is what the old ranks had not
consumed, dealt to the new ranks in equal shares (``elastic``: the old world and its
counts; ``batch`` then counts batches of that rest). The plan being a pure function,
this is all a state needs, whatever the dataset's size; later epochs are ordinary.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from pqloader._errors import Error, InvalidDataError
from pqloader._options import MAX_COUNT, MAX_EPOCH, SEED_LIMIT, LoaderOptions

STATE_VERSION = 2
# Version 1: states saved before each rank shuffled its windows with its own stream
# (2026-12-06); loaded but for a shuffled one of several ranks mid-epoch (see
# check_window_streams). The mark is the version, a key every state has: a
# torch.distributed.checkpoint load into a fresh loader's state_dict() keeps only the
# fresh state's keys, and would have kept a new key's fresh value.
STATE_VERSIONS = (1, 2)
# Options that change which rows land in which batch. A state can only be loaded into a
# loader that agrees on all of them.
DATA_OPTIONS = (
    "sources", "files", "columns", "batch_size", "drop_last", "shuffle", "seed",
    "shuffle_window", "rank", "world_size", "shard_policy", "fill_null", "transforms",
    "on_decode_error",
)
# Data options a state may differ in: the rest of the epoch is then dealt anew.
RESIZABLE = ("rank", "world_size", "batch_size")
# The most old ranks a state of ranks in lockstep (one count for all) is resumed from on
# another world size or batch size: the rest is dealt per old rank (a list of 2**31 of
# them, and hours, for a state whose world_size was damaged or huge).
MAX_ELASTIC_WORLD = 2**22


def fingerprint(sources: list[str], files: list[Any], columns: list[str], options: LoaderOptions,
                transforms: str, seed: int) -> dict[str, Any]:
    """The data-affecting options of a loader, as JSON-safe values.

    Args:
        sources: The normalised sources.
        files: ``plan_info()["files"]``: (path, size, rows, footer hash or None) per file.
        columns: Output column names, in order.
        options: The loader's (resolved) options.
        transforms: The engine's transform fingerprint.
        seed: The seed to record (the loader's, or one it would adopt).

    Returns:
        ``{name: value}`` for every name in :data:`DATA_OPTIONS`.
    """
    return {
        "sources": list(sources),
        # Each file's rows and footer hash follow its size (states without them still
        # load, see option_diff); a row-group selection joins its file's entry.
        "files": [[path, size, rows] + ([f"footer={footer}"] if footer else [])
                  + ([list(options.row_groups[path])]
                     if options.row_groups and path in options.row_groups else [])
                  for path, size, rows, *own in files for footer in [own[0] if own else None]],
        # Options that change how columns load ride with their names, so that states of
        # loaders without them keep their form.
        "columns": list(columns) + ([f"@decimals={options.decimals}"] if options.decimals != "float64" else [])
                   + ([f"@int96={options.coerce_int96_timestamp_unit}"]
                      if options.coerce_int96_timestamp_unit not in (None, "ns") else [])
                   + ([f"@schema={_schema_text(options.schema)}"] if options.schema is not None else [])
                   # by name: a dict's order changes no batch (each stack takes its first
                   # member's place), so it must not refuse a state either
                   + ([f"@stack={name}={','.join(_stack_member_text(c) for c in cols)}"
                       for name, cols in sorted(options.stack.items())]
                      if options.stack else []),
        "batch_size": options.batch_size,
        "drop_last": options.drop_last,
        "shuffle": options.shuffle,
        "seed": seed,
        "shuffle_window": options.shuffle_window,
        "rank": options.rank,
        "world_size": options.world_size,
        "shard_policy": options.shard_policy,
        "fill_null": _fill_null_text(options.fill_null),
        "transforms": transforms,  # (its filter's is_in sets sorted by the engine)
        "on_decode_error": options.on_decode_error,
    }


# An is_in of a plain column name over a value set as Arrow prints it in the transform
# fingerprint's filter: one value a line (strings quoted, unescaped: the fingerprint
# carries a hash of the expression where that is ambiguous, or where Arrow abbreviates
# the set with "...").
_IS_IN_VALUE_SET = re.compile(r'(?<![\w.])(is_in\([^(){}\[\]"\n,]*, \{value_set=[^:\[\n]*:\[\n)'
                              r'((?:  [^\n]*\n)+?)(\], null_matching_behavior=)')


def sorted_value_sets(transforms: Any) -> Any:
    """The transform fingerprint with the values of each ``is_in`` value set of its filter
    in sorted order, for states of pqloader before 2026-12-08, whose sets were in the
    order the caller's set iterated (``pc.field("lang").isin({"en", "de"})``: a Python
    set's, another per process for strings; the engine now sorts them, SortedValueSets).
    An ``is_in`` keeps the same rows in any order of its values (``index_in``, whose
    result depends on it, is left as it is)."""
    if not isinstance(transforms, str):
        return transforms
    at = min((i for m in _FILTER_MARKERS if (i := transforms.find(m)) >= 0), default=-1)
    if at < 0 or "value_set=" not in transforms:
        return transforms

    def sort(m: re.Match) -> str:
        lines = m.group(2)[:-1].split("\n")
        if any(line.strip() == "..." for line in lines):
            return m.group(0)
        values = sorted(line[:-1] if i < len(lines) - 1 else line for i, line in enumerate(lines))
        return m.group(1) + ",\n".join(values) + "\n" + m.group(3)

    return transforms[:at] + _IS_IN_VALUE_SET.sub(sort, transforms[at:])


def _stack_member_text(column: str) -> str:
    """A stacked column's name in a fingerprint's ``@stack=`` entry: ``\\`` and ``,``
    escaped, so that the joined names tell their columns apart (unescaped, ``["a,b", "c"]``
    and ``["a", "b,c"]`` both read "a,b,c", and a state of one loaded into the other); a
    name without either is as it was, so states of such stacks keep their form."""
    return column.replace("\\", "\\\\").replace(",", "\\,")


def _schema_text(schema: Any) -> str:
    """A declared schema as text, its metadata left out: pyarrow's ``to_string``. Another
    Arrow library's schema (``__arrow_c_schema__`` only, e.g. a loader's ``arrow_schema``)
    is read into pyarrow first, so that one schema declared either way gives one text;
    without pyarrow, its IPC bytes' hash stands in."""
    if not hasattr(schema, "to_string"):
        try:
            import pyarrow as pa
        except ImportError:
            import hashlib

            from pqloader._options import _schema_ipc
            return "ipc-sha256:" + hashlib.sha256(_schema_ipc(schema)).hexdigest()
        schema = pa.Schema._import_from_c_capsule(schema.__arrow_c_schema__())
    # A loader's arrow_schema marks its dotted columns with pqloader.leaf_path: the
    # schema it declares names what pa.schema([("s.x", ...)]) names (where the two would
    # read different columns, the unmarked one is refused as ambiguous), and states
    # taken with either (or before the mark existed) load into the other.
    if any(f.metadata and _LEAF_PATH in f.metadata for f in schema):
        import pyarrow as pa

        schema = pa.schema([_without_leaf_path(f) for f in schema])
    return schema.to_string(show_schema_metadata=False)


_LEAF_PATH = b"pqloader.leaf_path"  # (the engine's kLeafPathKey, columns.h)


def _without_leaf_path(field: Any) -> Any:
    if not field.metadata or _LEAF_PATH not in field.metadata:
        return field
    rest = {k: v for k, v in field.metadata.items() if k != _LEAF_PATH}
    return field.with_metadata(rest) if rest else field.remove_metadata()


def _fill_null_text(fill_null: Any) -> str:
    """fill_null as text; a mapping's keys sorted, so that equal mappings agree."""
    if isinstance(fill_null, Mapping):
        fill_null = dict(sorted(fill_null.items()))
    return repr(fill_null)


def _same_fill_null(theirs: Any, mine: Any) -> bool:
    """Whether two fingerprints' fill_null agree; a state of an older pqloader wrote a
    mapping's keys in the order given (its text is read back to compare)."""
    if _same(theirs, mine) or not isinstance(theirs, str):
        return _same(theirs, mine)
    try:
        value = _literal_with_floats(theirs)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False
    return _fill_null_text(value) == mine


_FLOAT_NAMES = {"nan": float("nan"), "inf": float("inf")}


def _literal_with_floats(text: str) -> Any:
    """ast.literal_eval that also reads repr's ``nan`` and ``inf`` (a fill of NaN)."""
    tree = ast.parse(text, mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id not in _FLOAT_NAMES:
                raise ValueError(f"not a literal: {node.id}")
            node.__class__ = ast.Constant  # in place: literal_eval takes constants only
            node.value = _FLOAT_NAMES[node.id]
    return ast.literal_eval(tree)


def _is_footer(e: Any) -> bool:
    return isinstance(e, str) and e.startswith("footer=")


def _without_rows(files: list[Any]) -> list[Any]:
    """A fingerprint's files without their row counts and footer hashes (a state of an
    older pqloader recorded [path, size] and the row-group selection only; a file read
    through a pyarrow ``_metadata`` has no hash of its own)."""
    return [[e for i, e in enumerate(f) if (i != 2 or isinstance(e, list)) and not _is_footer(e)]
            if isinstance(f, (list, tuple)) else f for f in files]


def _footer_of(f: Any) -> str | None:
    return next((e for e in f if _is_footer(e)), None) if isinstance(f, (list, tuple)) else None


def option_diff(key: str, theirs: Any, mine: Any, who: str = "loader") -> str | None:
    """What differs between a state's value of data option `key` and the loader's
    (None: they agree), as "state has ..., loader has ..." or naming the file whose
    rows differ."""
    if key == "fill_null":
        same = _same_fill_null(theirs, mine)
    elif key == "files" and isinstance(theirs, list) and isinstance(mine, list):
        # The usual case, the same files as the state's, compared at C speed: the checks
        # below copy every file's entry twice over (~50 us a file: seconds for 10^5 files).
        # Equal lists pass every one of them (tuples, never equal to lists, go on).
        if _equal(theirs, mine):
            return None
        same = _same(_without_rows(theirs), _without_rows(mine))
        if same:
            for a, b in zip(theirs, mine):
                rows = a[2] if isinstance(a, (list, tuple)) and len(a) > 2 and not isinstance(a[2], list) else None
                if rows is not None and not _same(rows, b[2]):
                    return f"file {b[0]!r} has {b[2]} rows, the state's had {rows!r:.50} (rewritten since)"
            for a, b in zip(theirs, mine):
                old, new = _footer_of(a), _footer_of(b)
                if old is not None and new is not None and old != new:
                    return (f"file {b[0]!r} has the same size and rows as the state's but another footer "
                            "(rewritten since)")
        else:
            changed = _files_diff(theirs, mine, who)
            if changed is not None:
                return changed
    elif key == "columns":  # a state of an older pqloader has its stacks in the dict's order
        same = _same(_stacks_sorted(theirs), _stacks_sorted(mine))
    elif key == "transforms":  # a state of an older pqloader has its value sets unsorted
        same = _same(theirs, mine) or _same(sorted_value_sets(theirs), sorted_value_sets(mine))
    else:
        same = _same(theirs, mine)
    return None if same else _shown_diff(theirs, mine, who)


def _shown_diff(theirs: Any, mine: Any, who: str, limit: int = 200) -> str:
    """ "state has ..., loader has ...", each cut to `limit` characters; two texts alike
    in those (a long filter's, whose value sets differ only in the hash after them) are
    shown from a little before where they first differ, not as the same two beginnings."""
    a, b = repr(theirs), repr(mine)
    if isinstance(theirs, str) and isinstance(mine, str) and a[:limit] == b[:limit]:
        i = next((k for k, (x, y) in enumerate(zip(theirs, mine)) if x != y), min(len(theirs), len(mine)))
        start = max(0, i - 40)
        a, b = (f"...{t[start:]!r:.{limit}}" for t in (theirs, mine))
        return f"state has {a}, {who} has {b} (alike for their first {i} characters)"
    return f"state has {a:.{limit}}, {who} has {b:.{limit}}"


# Where packing and the filter ride in the "transforms" fingerprint (bindings.cc,
# transform_fingerprint): after the transforms' own text, packing before the filter.
_FILTER_MARKERS = ("|filter=", "|predicate:")
_PACK_MARKER = "|pack("


def _option_label(key: str, theirs: Any, mine: Any) -> str:
    """The option a difference of data option `key` is about: the "transforms"
    fingerprint holds packing and the filter too (a changed filter was reported as
    "transforms: state has '...|filter=...'")."""
    if key != "transforms" or not isinstance(theirs, str) or not isinstance(mine, str):
        return key

    def parts(text: str) -> dict[str, str]:
        # The filter's text comes last and may hold anything (a literal 'a|pack(x' is not
        # packing): packing is looked for only before it.
        end = min((i for m in _FILTER_MARKERS if (i := text.find(m)) >= 0), default=len(text))
        pack = text.find(_PACK_MARKER, 0, end)
        pack = end if pack < 0 else pack
        return {"transforms": text[:pack], "pack": text[pack:end], "filter": text[end:]}

    a, b = parts(theirs), parts(mine)
    changed = [n for n in ("transforms", "pack", "filter") if a[n] != b[n]]
    return " and ".join(changed) or key


def _files_diff(theirs: list[Any], mine: list[Any], who: str) -> str | None:
    """Which files differ between a state's file list and the loader's, by name: added,
    gone, rewritten (another size, rows or row-group selection) or reordered (None: the
    state's list is malformed). The whole lists are too long to show: a dataset's one
    changed file would be cut off."""
    def entries(files: list[Any]) -> dict[str, Any] | None:
        out = {}
        for f in files:
            if not isinstance(f, (list, tuple)) or not f or not isinstance(f[0], str):
                return None
            out[f[0]] = f
        return out

    def describe(f: Any) -> str:
        rows = [f"{e!r:.20} rows" for e in f[2:3] if not isinstance(e, list)]
        groups = [f"row groups {e!r:.60}" for e in f[2:] if isinstance(e, list)]
        return ", ".join([f"{f[1]!r:.20} bytes" if len(f) > 1 else "no size"] + rows + groups)

    a, b = entries(theirs), entries(mine)
    if a is None or b is None:
        return None

    def named(paths: list[str]) -> str:
        shown = ", ".join(repr(p) for p in paths[:3])
        return shown + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")

    parts = []
    if added := [p for p in b if p not in a]:
        parts.append(f"{who} has {len(added)} file(s) the state has not: {named(added)}")
    if gone := [p for p in a if p not in b]:
        parts.append(f"the state has {len(gone)} file(s) the {who} has not: {named(gone)}")
    rewritten = [p for p in b if p in a and not _same(_without_rows([a[p]]), _without_rows([b[p]]))]
    def groups(f: Any) -> str:
        return next((f"row groups {e!r:.60}" for e in f[2:] if isinstance(e, list)), "every row group")

    def unselected(f: Any) -> Any:
        return _jsonish([e for e in f if not isinstance(e, list)])

    for p in rewritten[:3]:
        if _same(unselected(a[p]), unselected(b[p])):  # the same file, read in another selection
            parts.append(f"file {p!r} is read with {groups(b[p])}, the state's with {groups(a[p])} "
                         "(another row_groups=)")
        else:
            parts.append(f"file {p!r} has {describe(b[p])}, the state's had {describe(a[p])} (rewritten since)")
    if len(rewritten) > 3:
        parts.append(f"{len(rewritten) - 3} more file(s) rewritten")
    if not parts:
        parts.append("the same files in another order")
    return "; ".join(parts)


def _stacks_sorted(columns: Any) -> Any:
    """A fingerprint's columns with its ``@stack=`` entries sorted (they follow the rest)."""
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        return columns
    stacks = [c for c in columns if c.startswith("@stack=")]
    return [c for c in columns if not c.startswith("@stack=")] + sorted(stacks)


def make_state(epoch: int, batch: int, iteration_end: int | None, seed: int,
               options: Mapping[str, Any], elastic: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Assemble a state (see the module docstring)."""
    state = {
        "version": STATE_VERSION,
        "epoch": epoch,
        "batch": batch,
        # Where the interrupted `for batch in loader` would have stopped, so that a
        # resumed iteration yields exactly the rest of it (None: no iteration active).
        "iteration_end": iteration_end,
        "seed": seed,
        "options": dict(options),
    }
    if elastic is not None:
        state["elastic"] = _jsonish(dict(elastic))
    return stamp(state)


OPTIONAL_KEYS = ("elastic", "rank_batches")


def stamp(state: dict[str, Any]) -> dict[str, Any]:
    """Record in `state` which of :data:`OPTIONAL_KEYS` it holds (parse_state checks
    they are all still there); returns `state`."""
    state["optional_keys"] = [k for k in OPTIONAL_KEYS if k in state]
    return state


@dataclasses.dataclass(frozen=True)
class Restored:
    """What a checked state tells a loader to do."""

    epoch: int
    batch: int
    iteration_end: int | None
    seed: int
    elastic: dict[str, Any] | None = None


def _field_int(state: Mapping[str, Any], key: str, minimum: int, maximum: int,
               optional: bool = False, where: str = "state") -> int | None:
    if key not in state:
        if optional:
            return None
        raise InvalidDataError(f"not a pqloader state: {where}[{key!r}] is missing")
    value = state[key]
    if value is None and optional:
        return None
    if not is_state_int(value):
        raise InvalidDataError(f"{where}[{key!r}] must be an int in [{minimum}, {maximum}], "
                               f"got {type(value).__name__} {value!r:.100}")
    value = int(value)
    if not minimum <= value <= maximum:
        raise InvalidDataError(f"{where}[{key!r}] must be in [{minimum}, {maximum}], got {value}")
    return value


def is_version(value: Any) -> bool:
    """Whether a state's ``version`` is one this pqloader loads: an int (NumPy's too) of
    :data:`STATE_VERSIONS`, not a bool, float or array (``np.array([1, 2]) in (1, 2)`` was
    a bare ValueError, "truth value of an array", and ``np.True_`` or ``1.0`` version 1)."""
    return is_state_int(value) and int(value) in STATE_VERSIONS


def is_mix_state(state: Mapping[str, Any]) -> bool:
    """Whether `state` says it is a mixture's (its ``kind``; an array there compared
    element-wise, a bare ValueError)."""
    kind = state.get("kind")
    return isinstance(kind, str) and kind == "pqloader.mix"


def is_state_int(value: Any) -> bool:
    """Whether a state's field is a count: an int, or a NumPy int (a state rebuilt with
    NumPy holds the same count; they were refused, "must be an int ... got int64 0",
    where the options' NumPy ints are taken), not a bool or a float."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _jsonish(value: Any) -> Any:
    """Normalise tuples to lists so values compare equal after a JSON round trip."""
    if isinstance(value, (str, int, float)) or value is None:
        return value  # (first: Mapping's isinstance is an ABC check, per column name of a wide table)
    if isinstance(value, (list, tuple)):
        return [_jsonish(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _jsonish(v) for k, v in value.items()}
    return value


def _same(a: Any, b: Any) -> bool:
    """Whether two state values agree (tuples as lists): False, not an exception, for
    values whose ``==`` is no bool (a NumPy array or scalar against a list compares
    element-wise: "The truth value of an array ... is ambiguous", a ValueError, where a
    state's option held one)."""
    return _equal(_jsonish(a), _jsonish(b))


def _equal(a: Any, b: Any) -> bool:
    """``a == b`` as :func:`_same` takes it, without normalising tuples."""
    try:
        same = a == b
        return bool(same) if isinstance(same, (bool, np.bool_)) else False
    except (ValueError, TypeError, RuntimeError, OverflowError):  # (an element compared so
        # inside a list; np.True_ == 2**63 cannot convert the int)
        return False


def _check_counts(value: Any, what: str, size: int) -> list[int]:
    if (not isinstance(value, (list, tuple)) or len(value) != size
            or any(not is_state_int(k) or not 0 <= k <= MAX_COUNT for k in value)):
        raise InvalidDataError(f"{what} must be a list of {size} ints >= 0, got {value!r:.200}")
    return [int(k) for k in value]


def _check_elastic(value: Any, depth: int = 0) -> dict[str, Any] | None:
    """Check the shape of state['elastic'] (the engine checks it against the data)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or depth > 64:
        raise InvalidDataError(f"state['elastic'] must be None or a dict of world_size, batch_size, "
                               f"batches and base, got {value!r:.200}")
    world = _field_int(value, "world_size", 1, MAX_COUNT, where="state['elastic']")
    batch_size = _field_int(value, "batch_size", 1, MAX_COUNT, where="state['elastic']")
    assert world is not None and batch_size is not None
    return {"world_size": world, "batch_size": batch_size,
            "batches": _check_counts(value.get("batches"), "state['elastic']['batches']", world),
            "base": _check_elastic(value.get("base"), depth + 1)}


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge the states of every rank of one job, taken at the same step, into one.

    Ranks normally train in lockstep, so any rank's state describes all of them and
    this is not needed; a merged state also records each rank's own count, for ranks
    that stopped at different batches (and for ``torch.distributed.checkpoint``, which
    keeps one copy of values that all ranks save under the same key). The merged state
    loads on any world size (see :meth:`pqloader.Loader.load_state_dict`). States of a
    mixture's ranks (:func:`pqloader.mix`) merge into one of them: a mixture resumes
    every rank from one position, on the same world size.

    Args:
        states: One ``state_dict()`` per rank of the old world, in any order.

    Returns:
        A state with ``rank_batches``: each old rank's next batch.

    Raises:
        pqloader.InvalidDataError: A rank is missing or repeated, or the states differ
            in anything but rank and position.
    """
    states = list(states)
    if not states or not all(isinstance(s, Mapping) for s in states):
        raise InvalidDataError("merge_states needs a non-empty list of pqloader states")
    if any(is_mix_state(s) for s in states):
        from pqloader import _mix  # a mixture's ranks: one state (the module imports this one)

        return _mix.merge_states(states)
    for s in states:
        if not is_version(s.get("version")) or not isinstance(s.get("options"), Mapping):
            raise InvalidDataError(f"not a pqloader state: {s!r:.200}")
    if len({int(s["version"]) for s in states}) > 1:
        raise InvalidDataError("merge_states: the ranks' states were saved by pqloaders of other "
                               "state versions")
    world = states[0]["options"].get("world_size")
    ranks = [s["options"].get("rank") for s in states]
    # (NumPy ints as the states take them; a rank that is no int was a bare TypeError of
    # sorted(), a NumPy world size "needs one state per rank 0..?")
    if not is_state_int(world) or not all(is_state_int(r) for r in ranks) \
            or sorted(int(r) for r in ranks) != list(range(int(world))):
        last = int(world) - 1 if is_state_int(world) else "?"
        raise InvalidDataError(f"merge_states needs one state per rank 0..{last}, got ranks {ranks}")
    by_rank = sorted(states, key=lambda s: int(s["options"]["rank"]))
    first = by_rank[0]

    def raw(s: Mapping[str, Any]) -> Any:
        # (value sets sorted: a state of an older pqloader took a Python set's order,
        # another in each rank's process)
        options = {k: sorted_value_sets(v) if k == "transforms" else v
                   for k, v in s["options"].items() if k != "rank"}
        return [s.get("epoch"), s.get("seed"), options, s.get("elastic")]

    # A rank whose iterator has not taken a batch yet has no iteration end (an iterator
    # starts lazily): the others' end is its too.
    # (checked: a list or an array there was a bare TypeError, "unhashable type")
    ends = {_field_int(s, "iteration_end", 0, MAX_COUNT, optional=True,
                       where=f"rank {s['options']['rank']}'s state") for s in by_rank} - {None}
    # Rank 0's once, and the others' normalised only when they differ as given: an
    # elastic base holds a count per old rank, so normalising every rank's was
    # world x old world (18 s for 4,096 ranks resumed from 4,096).
    first_raw = raw(first)
    first_same = _jsonish(first_raw)
    for s in by_rank[1:]:
        mine = raw(s)
        if (not _equal(mine, first_raw) and not _equal(_jsonish(mine), first_same)) or len(ends) > 1:
            raise InvalidDataError(f"rank {s['options']['rank']}'s state differs from rank 0's in "
                                   "more than its position (epoch, iteration end, seed, options or "
                                   "elastic base)")
    merged = _jsonish(dict(first))
    merged["iteration_end"] = next(iter(ends), None)
    merged["rank_batches"] = [s.get("batch") for s in by_rank]
    return stamp(merged)


def check_window_streams(version: Any, shuffle: bool, world_size: int, epoch: Any) -> None:
    """Refuse a shuffled state of several ranks saved before each rank shuffled its
    windows with its own stream (version 1: every rank's window w took its rows at the
    same offsets; its rest would now skip and repeat rows on ranks past 0). Callers skip
    it for a state that consumed no row of its epoch (at an epoch's start: it resumes
    alike)."""
    if version != 1 or not shuffle or world_size <= 1:
        return
    raise InvalidDataError(
        f"this shuffled state of {world_size} ranks (pqloader.torch.DataLoader workers count as "
        "ranks) was saved by a pqloader from before "
        "2026-12-06, when every rank shuffled its windows alike; each rank now shuffles them "
        "with its own stream, so the rest of its epoch would skip and repeat rows on ranks past "
        f"0: start epoch {epoch!r} over (loader.set_epoch) or finish it with the pqloader that "
        "saved it (docs/determinism.md)")


def check_optional_keys(state: Mapping[str, Any]) -> None:
    """Refuse a state that lost keys its ``optional_keys`` lists (states saved before
    it was recorded have none to check)."""
    listed = state.get("optional_keys", [])
    if not isinstance(listed, (list, tuple)) or not all(isinstance(k, str) for k in listed):
        raise InvalidDataError(f"state['optional_keys'] must be a list of key names, got {listed!r:.100}")
    lost = [k for k in listed if k not in state]
    if lost:
        raise InvalidDataError(
            f"this state lost {', '.join(map(repr, lost))} (its 'optional_keys' lists them): "
            "torch.distributed.checkpoint loads a loader given to it directly into the keys of "
            "the fresh loader's own state_dict(), and drops the others; save and load "
            "pqloader.torch.Checkpoint(loader) instead (one JSON string)")


def parse_state(state: Any, *, num_batches: Callable[[int, Any], int], seed: int, adopt_seed: bool,
                fingerprint_for: Callable[[int], dict[str, Any]]) -> Restored:
    """Check a state completely, without changing anything.

    Args:
        state: What ``state_dict()`` returned, possibly after a JSON round trip.
        num_batches: Batches of an epoch of the loader that loads it ((epoch, elastic
            base or None) -> count; raises if the base does not fit its data).
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
    if is_mix_state(state):
        raise InvalidDataError("not a Loader's state: this is a mixture's (pqloader.mix); load it "
                               "with the Mixture's load_state_dict")
    if not is_version(state.get("version")):
        raise InvalidDataError(f"not a pqloader state: state['version'] must be 1 or {STATE_VERSION}, "
                               f"got {state.get('version')!r:.100}")
    check_optional_keys(state)
    epoch = _field_int(state, "epoch", 0, MAX_EPOCH)
    assert epoch is not None
    # (at most the last epoch's end: one past it was taken, and the next iteration refused)
    end = _field_int(state, "iteration_end", epoch, MAX_EPOCH + 1, optional=True)
    state_seed = _field_int(state, "seed", 0, SEED_LIMIT - 1)
    assert state_seed is not None
    theirs = state.get("options")
    if not isinstance(theirs, Mapping):
        raise InvalidDataError(f"state['options'] must be a dict of the loader's data options, "
                               f"got {type(theirs).__name__} {theirs!r:.100}")
    missing = [k for k in DATA_OPTIONS if k not in theirs]
    if missing:
        raise InvalidDataError(f"state['options'] lacks {', '.join(map(repr, missing))}")
    new_seed = state_seed if adopt_seed else seed
    mine = fingerprint_for(new_seed)
    diffs = [f"{_option_label(k, theirs[k], mine[k])}: {d}" for k in DATA_OPTIONS
             if k not in RESIZABLE and (d := option_diff(k, theirs[k], mine[k])) is not None]
    if state_seed != new_seed and _same(theirs["seed"], mine["seed"]):
        diffs.append(f"seed: state has {state_seed}, loader has {new_seed}")
    if diffs:
        raise InvalidDataError("cannot load a state taken with different options: " + "; ".join(diffs))
    old_world = _field_int(theirs, "world_size", 1, MAX_COUNT, where="state['options']")
    old_batch_size = _field_int(theirs, "batch_size", 1, MAX_COUNT, where="state['options']")
    assert old_world is not None and old_batch_size is not None
    base = _check_elastic(state.get("elastic"))
    resized = old_world != mine["world_size"] or old_batch_size != mine["batch_size"]
    if "rank_batches" in state:
        counts = _check_counts(state["rank_batches"], "state['rank_batches']", old_world)
        _field_int(state, "batch", 0, MAX_COUNT)
        low, high = min(counts), max(counts)
    else:  # ranks train in lockstep: every old rank at `batch` (a list of them, one per
        # rank, is made only for a resize: a loader of world_size=2**31 hung loading its
        # own state, making 2**31 of them)
        batch = _field_int(state, "batch", 0, MAX_COUNT)
        assert batch is not None
        counts, low, high = None, batch, batch
    # A state that consumed no row of its epoch, or (its world unchanged) every batch of
    # it, leaves no rest of the epoch to resume: any order resumes it.
    whole = base is None and not resized and low > 0 and low >= num_batches(epoch, None)
    if (base is not None or high > 0) and not whole:
        worlds = [old_world]
        level = base
        while level is not None:
            worlds.append(level["world_size"])
            level = level["base"]
        check_window_streams(state.get("version"), bool(theirs.get("shuffle")), max(worlds), epoch)
    if not resized:  # each rank continues its own stream
        batch = counts[mine["rank"]] if counts is not None else low
        count = num_batches(epoch, base)
        if batch > count:
            where = f"state['rank_batches'][{mine['rank']}]" if "rank_batches" in state else "state['batch']"
            # The options agree, so the rows do not: say so, not just the bound.
            raise InvalidDataError(
                f"{where} is {batch}, past the {count} batches this loader has in epoch "
                f"{epoch}: the state was taken over other rows (a filter's Predicate, whose code a "
                "state does not record, or files whose footers did not change, select others now)")
        return Restored(epoch=epoch, batch=batch, iteration_end=end, seed=new_seed, elastic=base)
    if counts is None:
        if old_world > MAX_ELASTIC_WORLD:  # (the rest is dealt per old rank: ~1 us each)
            raise InvalidDataError(
                f"cannot resume this state with world_size={mine['world_size']}, batch_size="
                f"{mine['batch_size']}: state['options']['world_size'] is {old_world}, past the "
                f"{MAX_ELASTIC_WORLD} old ranks an elastic resume deals the rest of an epoch from "
                "(resume it on its own world size and batch size)")
        counts = [low] * old_world
    # The engine checks the counts against what each old rank had (recursively).
    elastic = {"world_size": old_world, "batch_size": old_batch_size, "batches": counts, "base": base}
    try:
        num_batches(epoch, elastic)
    except Error as e:
        raise InvalidDataError(f"cannot resume this state with world_size={mine['world_size']}, "
                               f"batch_size={mine['batch_size']}: {e}") from None
    return Restored(epoch=epoch, batch=0, iteration_end=end, seed=new_seed, elastic=elastic)
