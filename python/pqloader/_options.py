"""Every Loader argument in one place: defaults, checks, and the engine's option format.

:class:`LoaderOptions` is the single definition of the Loader's arguments. Building one
checks every argument (type, range, accepted values) and normalises it; a value that
would be misread by the C++ engine (a number that overflows its integer type, a
string where a bool is meant) is refused here with an error naming the argument, the
value and what is accepted. :meth:`LoaderOptions.to_engine` produces the dict that
``_core._Loader(sources, options)`` reads (see ``ToOptions`` in python/src/bindings.cc).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from pqloader import _env, _filter, _lists
from pqloader._errors import InvalidDataError

# Upper bounds that keep every value inside the engine's integer types (int for thread
# counts, int64 for sizes and counts, uint64 for the seed) with room for arithmetic.
MAX_THREADS = 1024  # num_workers, io_threads
MAX_COUNT = 2**62  # batch sizes, windows, byte counts, ranks
MAX_EPOCH = 2**32 - 1  # 32 bits of the epoch key the engine's shuffle
EPOCH_HINT = " (32 bits of the epoch key the shuffle: epoch 2**32 would repeat epoch 0)"
SEED_LIMIT = 2**64  # seeds are uint64
MAX_CACHE_SHARDS = 256  # the cache picks a shard from one byte of the entry key


def iteration_epochs(epoch: int, stop: int | None, what: str = "loader") -> int:
    """The epoch an iteration from `epoch` stops before: `stop` (None: endless), checked
    against the last epoch (MAX_EPOCH). An endless iteration ends after the last epoch;
    one that would start past it, or whose end lies beyond it, is refused before its
    first batch (it failed late, at the engine's start of epoch 2**32, with a bare
    "epoch must be below 2^32" after the epochs before it had run).

    Raises:
        InvalidDataError: `epoch` is past the last epoch, or `stop` beyond it.
    """
    if epoch > MAX_EPOCH:
        raise InvalidDataError(
            f"the {what} is at the end of epoch {MAX_EPOCH} (2^32 - 1), the last one: no epoch "
            f"follows it{EPOCH_HINT}; set_epoch() to run an earlier one")
    if stop is None:
        return MAX_EPOCH + 1
    if stop > MAX_EPOCH + 1:
        raise InvalidDataError(
            f"an iteration of this {what} would run epochs {epoch} to {stop - 1}, past the last one, "
            f"{MAX_EPOCH} (epochs must be below 2^32{EPOCH_HINT}); give num_epochs <= "
            f"{MAX_EPOCH + 1 - epoch}, or set_epoch() to an earlier epoch")
    return stop


_SHARD_POLICIES = ("drop", "pad")
_DECODE_ERROR_POLICIES = ("raise", "skip")
_CACHE_POLICIES = ("keep", "lru", "plan")
_OUTPUTS = ("numpy", "torch")
_DECIMALS = ("float64", "int64")
_STRINGS = ("str", "bytes")
INT96_UNITS = ("ns", "us", "ms", "s")
_INT64_MIN, _INT64_LIMIT = -(2**63), 2**63


def check_int(name: str, value: Any, minimum: int, maximum: int = MAX_COUNT,
              limit_hint: str = "") -> int:
    """Check that `value` is an int (not a bool) in ``[minimum, maximum]``.

    Args:
        name: The argument's name, for the message.
        value: What was given.
        minimum: The smallest accepted value.
        maximum: The largest accepted value.
        limit_hint: Why the maximum is what it is, appended to the message.

    Returns:
        `value`, as a plain int.

    Raises:
        TypeError: `value` is not an int.
        ValueError: `value` is out of range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    value = int(value)
    if not minimum <= value <= maximum:
        raise ValueError(f"{name} must be in [{minimum}, {maximum}]{limit_hint}, got {value}")
    return value


def check_bool(name: str, value: Any, allow_none: bool = False) -> bool | None:
    """Check that `value` is a bool (``None`` too where `allow_none`).

    Raises:
        TypeError: `value` is anything else, e.g. the string ``'no'`` or the int 1.
    """
    if value is None and allow_none:
        return None
    if not isinstance(value, (bool, np.bool_)):
        accepted = "True, False or None" if allow_none else "True or False"
        raise TypeError(f"{name} must be {accepted}, got {type(value).__name__} {value!r}")
    return bool(value)


def check_choice(name: str, value: Any, choices: Sequence[str]) -> str:
    """Check that `value` is one of `choices`.

    Raises:
        ValueError: It is not.
    """
    if not isinstance(value, str) or value not in choices:
        accepted = " or ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be {accepted}, got {value!r}")
    return value


def _check_seconds(name: str, value: Any, maximum: float = 7 * 24 * 3600.0) -> float:
    """Check a duration in seconds: a real number in [0, maximum].

    Raises:
        TypeError: It is not a number (bool included).
        ValueError: It is negative, not finite or above `maximum`.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__} {value!r}")
    seconds = float(value)
    if not (0 <= seconds <= maximum):
        raise ValueError(f"{name} must be between 0 and {maximum:g} seconds, got {value!r}")
    return seconds


def _optional_int(name: str, value: Any, minimum: int, maximum: int = MAX_COUNT,
                  limit_hint: str = "") -> int | None:
    return None if value is None else check_int(name, value, minimum, maximum, limit_hint)


def _check_columns(columns: Any) -> tuple[str, ...] | None:
    if columns is None:
        return None
    if isinstance(columns, (str, bytes)):
        raise TypeError(f"columns must be a list of names, not a {type(columns).__name__} ({columns!r})")
    try:
        names = list(columns)
    except TypeError:
        raise TypeError(f"columns must be a list of names or None, got {type(columns).__name__}") from None
    if not names:
        raise ValueError("columns=[] selects no column: give at least one name, or None for every column")
    seen: set[str] = set()
    for c in names:
        if not isinstance(c, str):
            raise TypeError(f"columns must hold str names, got {type(c).__name__} {c!r}")
        if c in seen:
            raise ValueError(f"columns lists {c!r} twice: each column may be selected once")
        seen.add(c)
    return tuple(str(c) for c in names)


def _check_fill_value(where: str, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        value = int(value)
        if not _INT64_MIN <= value < _INT64_LIMIT:
            hint = ""
            if _INT64_LIMIT <= value < 2**64:
                # (Floats from 2**63 on are 2048 apart: only such multiples can be given.)
                hint = (" (a uint64 column's fill above 2**63 - 1 is given as a float that holds it "
                        "exactly, a multiple of 2048: the engine takes integers as int64; "
                        + (f"{float(value):.17g}" if value % 2048 == 0 else
                           f"no float is {value}: the nearest below is {value & ~2047} = "
                           f"{float(value & ~2047):.17g}")
                        + ")")
            raise ValueError(f"{where} must fit in int64, got {value}{hint}")
        return value
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, (str, bytes)):
        return value
    raise TypeError(f"{where} must be int, float, str or bytes, got {type(value).__name__} {value!r}")


def _check_text(name: str, value: Any, show: bool = True) -> None:
    """Refuse a str inside an argument that is not UTF-8 (a lone surrogate, e.g. from
    ``os.fsdecode`` of other bytes): the engine takes UTF-8 text only, and read such a
    str as a bare ``RuntimeError: std::bad_cast`` naming nothing. ``show``: name the
    value (not for values that may be secrets)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            shown = f"holds {value!r}, which is" if show else "is"
            raise ValueError(f"{name} {shown} not UTF-8 text (it has a lone surrogate); "
                             "column names, fill values and paths must be UTF-8") from None
    elif isinstance(value, Mapping):
        for k, v in value.items():
            _check_text(name, k, show)
            _check_text(f"{name}[{k!r}]", v, show)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            _check_text(name, v, show)


def _check_fill_null(fill_null: Any) -> Any:
    if isinstance(fill_null, Mapping):
        out = {}
        for k, v in fill_null.items():
            if not isinstance(k, str):
                raise TypeError(f"fill_null keys must be column names (str), got {type(k).__name__} {k!r}")
            out[k] = _check_fill_value(f"fill_null[{k!r}]", v)
        return out
    return _check_fill_value("fill_null", fill_null)


def _check_null_mask(null_mask: Any) -> bool | tuple[str, ...] | None:
    if null_mask is None or isinstance(null_mask, (bool, np.bool_)):
        return None if null_mask is None or not null_mask else True
    if isinstance(null_mask, (str, bytes)) or not isinstance(null_mask, (Sequence, set, frozenset)):
        raise TypeError("null_mask must be True, False, None or a list of column names, "
                        f"got {type(null_mask).__name__} {null_mask!r}")
    names = tuple(null_mask)
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"null_mask must hold column names (str), got {type(n).__name__} {n!r}")
    return names or None


def _check_schema(schema: Any) -> Any:
    if schema is None:
        return None
    if type(schema).__module__.partition(".")[0] == "pyarrow":
        import pyarrow as pa  # already imported: the object comes from it

        if not isinstance(schema, pa.Schema):
            raise TypeError(f"schema must be a pyarrow.Schema or None, got {type(schema).__name__}")
    elif not hasattr(type(schema), "__arrow_c_schema__"):
        raise TypeError("schema must be a pyarrow.Schema, another Arrow schema (with "
                        f"__arrow_c_schema__) or None, got {type(schema).__name__}")
    return schema


def _schema_ipc(schema: Any) -> bytes:
    """The declared schema as Arrow IPC bytes, read through the Arrow PyCapsule protocol
    (pyarrow is never imported here; any pyarrow >= 14 or other Arrow library works)."""
    from pqloader import _core

    export = getattr(schema, "__arrow_c_schema__", None)
    if export is None:  # a pyarrow without the PyCapsule protocol
        return bytes(schema.serialize())
    return _core._schema_ipc(export())


def _check_transforms(transforms: Any) -> Any:
    from pqloader.transforms import Op

    if transforms is None or callable(transforms) and not isinstance(transforms, Mapping):
        return transforms
    if not isinstance(transforms, Mapping):
        raise TypeError("transforms must be a dict {column: [ops]} or a callable (dict -> dict), "
                        f"got {type(transforms).__name__}")
    out = {}
    for column, ops in transforms.items():
        if not isinstance(column, str):
            raise TypeError(f"transforms keys must be column names (str), got {column!r}")
        if isinstance(ops, Op):
            ops = [ops]
        elif isinstance(ops, (str, bytes)) or not isinstance(ops, Sequence):
            raise TypeError(f"transforms[{column!r}] must be a list of pqloader.transforms ops, got {ops!r}")
        for op in ops:
            if not isinstance(op, Op):
                raise TypeError(f"transforms[{column!r}] must hold pqloader.transforms ops, got {op!r}")
        out[column] = tuple(ops)
    return out


def _check_stack(stack: Any) -> dict[str, tuple[str, ...]] | None:
    if stack is None:
        return None
    if not isinstance(stack, Mapping):
        raise TypeError(f"stack must be a dict {{name: [columns]}}, got {type(stack).__name__}")
    out = {}
    for name, columns in stack.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"stack keys must be the stacked columns' names (non-empty str), got {name!r}")
        if isinstance(columns, (str, bytes)) or not isinstance(columns, Sequence):
            raise TypeError(f"stack[{name!r}] must be a list of column names, got {columns!r}")
        if not columns or not all(isinstance(c, str) for c in columns):
            raise ValueError(f"stack[{name!r}] must be a non-empty list of column names (str), got {columns!r}")
        out[name] = tuple(columns)
    return out


def _check_row_groups(row_groups: Any) -> dict[str, tuple[int, ...]] | None:
    if row_groups is None:
        return None
    if not isinstance(row_groups, Mapping):
        raise TypeError("row_groups must be a dict {file: [row-group indices]} or None, "
                        f"got {type(row_groups).__name__}")
    out = {}
    for path, groups in row_groups.items():
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"row_groups keys must be file paths or URLs, got {type(path).__name__} {path!r}")
        if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
            raise TypeError(f"row_groups[{path!r}] must be a list of row-group indices, got {groups!r}")
        key = _env.normalize_sources([path])[0]
        out[key] = tuple(sorted({check_int(f"row_groups[{path!r}] entries", g, 0, 2**31 - 1)
                                 for g in groups}))
    return out


def _check_use_summary(value: Any) -> bool | str:
    if isinstance(value, (bool, np.bool_)):  # (as check_bool takes the other flags)
        return bool(value)
    if isinstance(value, str) and value == "only":
        return value
    raise (TypeError if not isinstance(value, str) else ValueError)(
        f"use_summary must be True, False or 'only', got {value!r}")


def _check_cache_dir(cache_dir: Any) -> str | None:
    if cache_dir is None:
        return None
    if not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(f"cache_dir must be a path, ':memory:' or None, got {type(cache_dir).__name__}")
    path = os.fspath(cache_dir)
    if not isinstance(path, str) or path == "":
        raise ValueError(f"cache_dir must be a directory path, ':memory:' or None, got {path!r}")
    return path if path == ":memory:" else _env.local_dir(path)


# What each argument of Loader (and field of LoaderOptions) means, in the Google style
# of an Args section: one place beside the defaults below; Loader's docstring and
# LoaderOptions' include it.
ARGUMENT_DOCS = """\
        columns: Columns to read (file columns or hive partition keys), in output
            order, each once. A struct's field by dotted path (``"image.bytes"``); a whole
            struct is its fields (``"image.bytes"``, ``"image.path"``). ``None`` reads
            every column of every file (pandas index columns left out).
        batch_size: Rows per batch; batches span row-group and file boundaries.
        num_workers: C++ worker threads (at most 1024). ``None`` uses one per CPU this
            process may use: those of its affinity mask (``taskset``, a cpuset), at most
            its cgroup's CPU quota rounded up (a container's CPU limit: v2 ``cpu.max``,
            v1 ``cpu.cfs_quota_us``), as ``torch.get_num_threads()`` counts the first.
        shuffle: Shuffle the order of row groups each epoch and rows within windows of
            ``shuffle_window`` consecutive row groups.
        seed: Seed of the shuffle. ``None`` with ``shuffle=True`` draws a fresh seed,
            exposed as ``loader.seed`` and recorded in ``state_dict()``.
        num_epochs: Epochs run by each ``iter(loader)``; ``None`` runs forever. Each new
            iteration continues the epoch count, so every epoch has a new order.
        drop_last: Drop the last, incomplete batch of each epoch.
        shuffle_window: Row groups whose rows are shuffled together. Larger windows
            shuffle better and hold more decoded data in memory. A batch draws its rows
            from about ``shuffle_window`` row groups: if row groups (or files) are each
            sorted or of one class, raise it so that a batch sees many of them (see
            docs/determinism.md, "Shuffle quality"). ``max_inflight_bytes`` does not
            bound it: a shuffled loader holds about 4x its largest window's decoded bytes
            (3x with transforms, strings or lists); where that would take it over the
            cgroup's memory limit, a ``RuntimeWarning`` says so when it is made.
        rank: This process's rank. Default: from an initialised ``torch.distributed``
            group, else a Ray Train worker's context, else the ``RANK`` environment
            variable, else 0.
        world_size: Number of ranks. Default: as for ``rank``, from ``WORLD_SIZE``, else 1.
        shard_policy: ``"drop"`` drops the last ``N % world_size`` rows of each epoch's
            order; ``"pad"`` repeats its first rows, so every rank gets the same count.
        fill_null: ``None`` makes nulls an error (found from the footers' statistics when
            the loader is made, where the writer stored them); a scalar replaces nulls in
            every column (so it must suit all of them: a number for numeric columns, str or
            bytes for string and binary ones; an integer within int64, also for a uint64
            column; a number the column's type holds exactly: ``2**24 + 1`` in a float32
            column is refused); a dict maps column names to their replacement. In a list column it fills null elements too, and a null row is a list of fills
            as long as the other rows (an empty list when ragged). A column with
            ``transforms`` is filled before them, so its fill must suit the stored type
            (``2**31`` in an int32 column is refused, even before ``Cast("float32")``).
        filter: Which rows to load: a pyarrow compute expression
            (``pc.field("lang") == "en"``, ``pc.field("ts") >= t``, ``.isin([...])``), a
            string in Python syntax (``"lang == 'en' and year >= 2020"``), a
            :class:`pqloader.Predicate` (a Python function on whole record batches), or a
            list of these (all must hold). Pushed down in C++: hive partition keys prune
            files, row-group statistics prune row groups, the rest get a row mask from
            the filter's columns (read once, in parallel, before the first epoch; kept in
            ``cache_dir`` when there is one). Rows whose filter value is null are
            dropped, as pyarrow's ``dataset.to_table(filter=...)``. The epoch, shards,
            resume and random transforms are over the kept rows. Default: every row.
        null_mask: ``True`` adds a bool ``<column>_valid`` column after every column that
            can hold nulls (true where the row is not null); a list of names, after
            those only. Null rows of such columns become ``fill_null``, or 0 / ``""``.
            The mask is per row: a null inside a list (an element of a row that is not
            null) is an error unless ``fill_null`` gives that column a value, which then
            fills it.
        decimals: ``"float64"`` (default: as pyarrow's cast to float64, bit for bit,
            which may be one step from the nearest double) or
            ``"int64"`` (the exact unscaled integer, value x 10**scale; precision <= 18).
        coerce_int96_timestamp_unit: The unit INT96 timestamps (Spark's, Hive's and
            Impala's default) load in, as pyarrow's argument of that name: ``"ns"``
            (default, as ``None``: dates 1677-09-21 to 2262-04-11), ``"us"`` (years
            -290308 to 294247: Spark's 9999-12-31 and 0001-01-01), ``"ms"`` or ``"s"``.
            Their columns load as ``timestamp[unit]`` (int64 counts of the unit); a
            value the unit cannot hold raises ``InvalidDataError`` naming its row and
            date, never wraps into another date.
        schema: A ``pyarrow.Schema`` (any pyarrow >= 14) or any Arrow schema with
            ``__arrow_c_schema__`` to load the files as: each file's columns must
            convert to its types without loss (integers to floats too, each value exactly:
            one a float would round is a ``SchemaMismatchError``), columns it lacks
            are null. Default: the files' schemas unified (safe widening only).
        max_inflight_bytes: Bound on the data held ahead of the consumer: a quarter for
            column chunks read ahead, the rest for decoded row groups and batches, which
            every worker decodes ahead as far as it allows. Peak memory above the
            process's baseline is about this + the row groups of the batch the consumer
            waits for (one shuffle window) + one row group read ahead + ~3x a row group
            per worker decoding one + up to twice this + 32 MiB of freed buffers kept for reuse
            (tested in ``python/tests/test_memory.py``). Default: 256 MiB, at most an
            eighth of the process's cgroup memory limit (a container's, v2 ``memory.max``
            or v1 ``memory.limit_in_bytes``; shared by a ``pqloader.torch.IterableDataset``'s
            DataLoader workers: 1/W each), at least 16 MiB; one given over half that
            limit is kept, with a ``RuntimeWarning``. It never changes the batches. It
            does not bound the shuffle window (see ``shuffle_window``).
        prefetch_batches: Batches assembled ahead of the consumer (default 2 per worker).
            Shuffled loaders that gather whole windows also gather the next window ahead
            as soon as its copy fits ``max_inflight_bytes`` (about three windows' decoded
            bytes in its three-quarter share: then the consumer never waits for a
            window's gather).
        verify_checksums: Verify Parquet page CRCs where the writer stored them.
        transforms: ``{column: [ops]}`` of :mod:`pqloader.transforms` ops, run per sample
            in the C++ workers; or a callable (dict -> dict), as for ``batch_transform``.
        lists: How list columns whose rows differ in length are batched, by column:
            ``"ragged"`` (all values + ``<column>_offsets``) or :class:`pqloader.Pad`
            (``[batch, L]`` + ``<column>_length``; fixed L or each batch's longest row).
            Default: every row of a batch must have one length.
        pack: A :class:`pqloader.Pack`: batches of fixed-length blocks of tokens packed
            from a list column's documents (``batch_size`` blocks per batch).
        stack: ``{name: [columns]}``: each list of columns handed out as one column
            ``name`` of shape ``[batch, len(columns), *row_shape]``, as
            ``numpy.stack(columns, axis=1)`` would make it (a wide table's features as one
            matrix: one array or tensor per batch instead of one per column, and on a GPU
            one copy). The columns must be numbers of one dtype and row shape known before
            any data (after ``transforms`` and ``lists``; ``transforms.Cast`` makes dtypes
            agree; times of different units, and with ``decimals="int64"`` decimals of
            different scales, are refused); they leave the batch, and ``name`` takes the
            place of whichever of them comes first among the columns. Stacked in C++ where
            the batch is assembled; rows and order are unchanged (a state records the stacks and loads
            only with the same ones). Not with ``pack``, nor on a ``mix`` source.
        batch_transform: A Python callable applied to every batch, in order, in one
            background thread. It holds the GIL while it runs Python code.
        cache_dir: Keep decoded, deterministically transformed row groups in this
            local directory (a URL other than ``file://``, or a path holding a NUL
            character, is refused; shared by processes,
            kept across runs; see docs/cache_format.md),
            or ``":memory:"`` for this loader only (its later epochs; another loader has
            its own). Hits skip reading, decoding and
            those transforms; batches are bit-identical either way. If the directory is
            unusable or the disk fills up, a warning is issued and loading goes on uncached;
            the first insert the size limit refuses gives one warning too. Also kept
            there: a filter's selection, remote footers and, with ``pack``, every
            document's length (read once per node, not at every start).
        cache_size_limit: Bytes the cache may hold (default: no limit).
        cache_policy: What happens when the cache is full. ``"keep"`` (default): fill,
            then stop inserting (never thrashes on reshuffled scans larger than the cache).
            ``"lru"``: evict the least recently used. ``"plan"``: evict the row groups the
            plans of this epoch and the next (every rank's, in lockstep) read furthest in
            the future, and do not insert one read later than all the cache holds
            (Belady's rule; the most hits on reshuffled epochs, see docs/performance.md).
            Entries of source files that changed since are deleted first under every
            policy.
        cache_shards: Fan-out directories, each with its own lock and
            ``cache_size_limit / cache_shards`` bytes. A cache directory keeps the count
            it was made with: another count is replaced by it, with a RuntimeWarning.
        cache_wait_timeout: Processes sharing a cache directory (the ranks of a node)
            fetch each row group once: one claims it before fetching, and the others wait
            for its entry instead of fetching it too, at most this many seconds (then
            they fetch it themselves; a claim this old, or of a dead process, is
            broken). ``0``: no coordination. Default: 30.
        on_decode_error: ``"raise"`` (default): a failing transform (e.g. a corrupt
            image) raises, naming file, row group, row and column. ``"skip"``: the row is
            dropped from its batch (batches may be smaller; every rank still gets the
            same number of batches) and counted in ``stats()["skipped_rows"]``. A batch
            whose rows were all skipped comes with 0 rows: array columns empty, with the
            dtype and row shape the column's ops give (0 for sizes that depend on the
            data, e.g. an image's before a crop); string columns empty lists.
        strings: ``"str"`` (default): string columns come out as lists of ``str``
            (``list<string>`` columns as lists of lists of ``str``); a value that is not
            valid UTF-8 raises ``pqloader.InvalidDataError`` naming file, row group, row
            and column. ``"bytes"``: they come out as ``bytes`` (lists of lists of
            ``bytes``), unchecked (for data whose text may not be UTF-8).
        storage_options: Options of ``s3://`` sources, named as the arguments of
            ``pyarrow.fs.S3FileSystem``: ``endpoint_override``, ``scheme``, ``region``,
            ``access_key``, ``secret_key``, ``session_token``, ``anonymous``,
            ``connect_timeout``, ``request_timeout``, ``tls_ca_file_path``,
            ``force_virtual_addressing``; retries: ``retry_budget`` (seconds after a
            request's first failure within which retries may start; default 60),
            ``retry_max_attempts`` (default: no limit but the budget),
            ``retry_base_delay``, ``retry_max_delay`` (seconds; default 0.2, 5: retry n
            waits a random time in [d/2, d], d = min(max, base * 2**n)). Each attempt
            fails after ``request_timeout`` seconds without data (default 3). Unset ones
            come from the standard AWS sources (environment, ``AWS_ENDPOINT_URL``, profile).
            A text value holding a NUL character is refused.
        io_threads: Concurrent reads from storage (requests in flight), apart from the
            CPU workers.
        readahead: Row groups fetched ahead of decoding, in plan order (default:
            ``io_threads``); their compressed bytes stay within a quarter of
            ``max_inflight_bytes`` (one row group is always allowed).
        output: ``"numpy"`` or ``"torch"``: numeric columns as ``torch.Tensor`` sharing
            the engine's memory (``torch.from_numpy``, no copy). torch is imported only then.
        pin_memory: Stage torch batches in pinned host memory. Default (``None``): when
            ``device`` is a CUDA device. Ignored, with a warning, without CUDA.
        device: Hand torch batches out on this device (e.g. ``"cuda:0"``), copied on a
            side CUDA stream ahead of use. Default: CPU, zero-copy.
        device_prefetch: Batches pinned/copied ahead of the consumer (with
            ``pin_memory`` or ``device``).
        row_groups: Read only these row groups: ``{file: [indices]}``, a file named as in
            ``source`` (an explicit file path or URL); listed row groups are read in file
            order, files not listed whole. Samples are numbered (for random transforms)
            among the selected rows. Default: every row group.
        use_summary: Take the row-group layout of a directory's files from its summary
            (``_metadata`` at its root, as written by :func:`pqloader.write_index`,
            pyarrow, Dask or Spark) instead of reading every file's footer: one request
            instead of one per file. Files written or rewritten since the index (by size
            and modification time, where ``_pqloader_index`` records them) have their
            footers read. ``False``: read every footer, ignoring any summary.
            ``"only"``: take the files from ``_pqloader_index`` instead of listing the
            directory (no LIST requests: for 10^5 files and more); files added since the
            index are not seen, and each file's footer is checked against the index when
            this process first reads it (a changed file raises ``InvalidDataError``).

"""


@dataclasses.dataclass(frozen=True)
class LoaderOptions:
    """The arguments of :class:`pqloader.Loader` (all but ``source``), checked.

    The field names and defaults are those of ``Loader``'s keyword arguments, which
    take their defaults from here; what each one means is below (``ARGUMENT_DOCS``, also
    in ``Loader``'s docstring). Building
    an instance checks and normalises every field (``columns`` becomes a tuple,
    ``cache_dir`` an absolute path, ``storage_options`` text, a callable
    ``transforms`` moves to ``batch_transform``).

    ``seed``, ``rank`` and ``world_size`` may be None (drawn or discovered); the
    engine needs them settled: see :meth:`resolve`.

    Attributes:
        {arguments}

    Raises:
        TypeError: An argument has the wrong type (e.g. ``shuffle='no'``).
        ValueError: An argument has a value outside what is accepted; the message
            names the argument and the accepted values.
    """

    columns: Sequence[str] | None = None
    batch_size: int = 256
    num_workers: int | None = None
    shuffle: bool = False
    seed: int | None = None
    num_epochs: int | None = 1
    drop_last: bool = False
    shuffle_window: int = 4
    rank: int | None = None
    world_size: int | None = None
    shard_policy: str = "drop"
    fill_null: Any = None
    max_inflight_bytes: int | None = None
    prefetch_batches: int | None = None
    verify_checksums: bool = False
    transforms: Mapping[str, Sequence[Any]] | Callable[[dict], dict] | None = None
    lists: Mapping[str, Any] | None = None
    pack: Any = None
    stack: Mapping[str, Sequence[str]] | None = None
    batch_transform: Callable[[dict], dict] | None = None
    on_decode_error: str = "raise"
    strings: str = "str"
    cache_dir: str | os.PathLike[str] | None = None
    cache_size_limit: int | None = None
    cache_policy: str = "keep"
    cache_shards: int = 8
    cache_wait_timeout: float = 30.0
    storage_options: Mapping[str, Any] | None = dataclasses.field(default=None, repr=False)  # may hold secrets
    io_threads: int = 16
    readahead: int | None = None
    output: str = "numpy"
    pin_memory: bool | None = None
    device: Any = None
    device_prefetch: int = 2
    row_groups: Mapping[str, Sequence[int]] | None = None
    null_mask: bool | Sequence[str] | None = None
    decimals: str = "float64"
    coerce_int96_timestamp_unit: str | None = None
    schema: Any = None
    use_summary: bool | str = True
    filter: Any = None
    _debug_max_delay_us: int = 0

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return all(_filter.same_filter(getattr(self, f.name), getattr(other, f.name)) if f.name == "filter"
                   else getattr(self, f.name) == getattr(other, f.name) for f in dataclasses.fields(self))

    def __post_init__(self) -> None:
        threads_hint = f" (at most {MAX_THREADS} threads)"
        shards_hint = f" (at most {MAX_CACHE_SHARDS} shards)"
        transforms, batch_transform = self.transforms, self.batch_transform
        if callable(transforms) and not isinstance(transforms, Mapping):
            if batch_transform is not None:
                raise ValueError("give the per-batch callable once: transforms= or batch_transform=")
            transforms, batch_transform = None, transforms
        if batch_transform is not None and not callable(batch_transform):
            raise TypeError(f"batch_transform must be callable (dict -> dict), got {type(batch_transform).__name__}")
        checked = dict(
            columns=_check_columns(self.columns),
            batch_size=check_int("batch_size", self.batch_size, 1),
            num_workers=_optional_int("num_workers", self.num_workers, 1, MAX_THREADS, threads_hint),
            shuffle=check_bool("shuffle", self.shuffle),
            seed=_optional_int("seed", self.seed, 0, SEED_LIMIT - 1),
            num_epochs=_optional_int("num_epochs", self.num_epochs, 0),
            drop_last=check_bool("drop_last", self.drop_last),
            shuffle_window=check_int("shuffle_window", self.shuffle_window, 1),
            rank=_optional_int("rank", self.rank, 0),
            world_size=_optional_int("world_size", self.world_size, 1),
            shard_policy=check_choice("shard_policy", self.shard_policy, _SHARD_POLICIES),
            fill_null=_check_fill_null(self.fill_null),
            max_inflight_bytes=_optional_int("max_inflight_bytes", self.max_inflight_bytes, 1, 2**61),
            prefetch_batches=_optional_int("prefetch_batches", self.prefetch_batches, 1),
            verify_checksums=check_bool("verify_checksums", self.verify_checksums),
            transforms=_check_transforms(transforms),
            lists=_lists.check_lists(self.lists),
            pack=_lists.check_pack(self.pack),
            stack=_check_stack(self.stack),
            batch_transform=batch_transform,
            on_decode_error=check_choice("on_decode_error", self.on_decode_error, _DECODE_ERROR_POLICIES),
            strings=check_choice("strings", self.strings, _STRINGS),
            cache_dir=_check_cache_dir(self.cache_dir),
            cache_size_limit=_optional_int("cache_size_limit", self.cache_size_limit, 1),
            cache_policy=check_choice("cache_policy", self.cache_policy, _CACHE_POLICIES),
            cache_shards=check_int("cache_shards", self.cache_shards, 1, MAX_CACHE_SHARDS, shards_hint),
            cache_wait_timeout=_check_seconds("cache_wait_timeout", self.cache_wait_timeout),
            storage_options=_env.normalize_storage_options(self.storage_options),
            io_threads=check_int("io_threads", self.io_threads, 1, MAX_THREADS, threads_hint),
            readahead=_optional_int("readahead", self.readahead, 1),
            output=check_choice("output", self.output, _OUTPUTS),
            pin_memory=check_bool("pin_memory", self.pin_memory, allow_none=True),
            device_prefetch=check_int("device_prefetch", self.device_prefetch, 1),
            row_groups=_check_row_groups(self.row_groups),
            null_mask=_check_null_mask(self.null_mask),
            decimals=check_choice("decimals", self.decimals, _DECIMALS),
            coerce_int96_timestamp_unit=None if self.coerce_int96_timestamp_unit is None else
                check_choice("coerce_int96_timestamp_unit", self.coerce_int96_timestamp_unit, INT96_UNITS),
            schema=_check_schema(self.schema),
            use_summary=_check_use_summary(self.use_summary),
            filter=_filter.check_filter(self.filter),
            _debug_max_delay_us=check_int("_debug_max_delay_us", self._debug_max_delay_us, 0, 3_600_000_000),
        )
        if checked["output"] == "numpy" and (checked["pin_memory"] or self.device is not None):
            raise ValueError("pin_memory and device need output='torch'")
        if checked["pack"] is not None and (checked["lists"] or checked["transforms"]):
            # (the engine refused them too, as bad data, naming no argument)
            given = [n for n in ("lists", "transforms") if checked[n]]
            raise ValueError(f"pack= cannot be combined with {' or '.join(f'{n}=' for n in given)}: packing "
                             "writes the token column and copies the others per token; transform "
                             "whole batches with batch_transform= instead")
        if checked["pack"] is not None:
            _lists.check_packed_batch("pack", checked["batch_size"], checked["pack"].seq_len)
        rank, world = checked["rank"], checked["world_size"]
        if rank is not None and world is not None and rank >= world:
            raise ValueError(f"rank must be in [0, world_size={world}), got {rank}")
        for name, value in checked.items():
            _check_text(name, value, show=name != "storage_options")
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    # -- derived values ----------------------------------------------------------------
    @property
    def resolved(self) -> bool:
        """Whether seed, rank and world size are settled (see :meth:`resolve`)."""
        return self.seed is not None and self.rank is not None and self.world_size is not None

    def resolve(self, draw_seed: Callable[[], int]) -> LoaderOptions:
        """Settle what the user left open.

        Rank and world size come from an initialised ``torch.distributed`` group, else a
        Ray Train worker's context, else ``RANK``/``WORLD_SIZE``; a missing seed is drawn
        with `draw_seed` when shuffling (0 otherwise, where it only keys random transforms).

        Args:
            draw_seed: Returns a fresh random seed.

        Returns:
            A copy with ``seed``, ``rank`` and ``world_size`` set (checked again).

        Raises:
            ValueError: The environment gives a bad rank or world size, only one of
                ``rank``/``world_size`` is given and its source of the other disagrees
                (or, for ``world_size`` > 1, gives no rank), or a shuffled loader of
                several ranks has no seed.
        """
        rank, world = _env.resolve_rank_world(self.rank, self.world_size)
        seed = self.seed
        if seed is None and self.shuffle and world > 1:
            # Each rank would draw its own seed: their shards would overlap and miss rows.
            raise ValueError(f"shuffle=True with world_size={world} needs an explicit seed: every "
                             f"rank must shuffle the same way for the shards to be disjoint "
                             f"(each rank drawing its own seed would duplicate and miss rows); "
                             f"pass the same seed=... on every rank")
        if seed is None:
            seed = draw_seed() if self.shuffle else 0
        return self.replace(seed=seed, rank=rank, world_size=world)

    def replace(self, **changes: Any) -> LoaderOptions:
        """Return a copy with `changes` applied and checked.

        Raises:
            TypeError, ValueError: As for the constructor.
        """
        return dataclasses.replace(self, **changes)

    def to_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``Loader`` that rebuild these options."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_engine(self) -> dict[str, Any]:
        """The option dict ``_core._Loader(sources, options)`` reads.

        Raises:
            ValueError: Seed, rank or world size are not settled yet (call
                :meth:`resolve` first).
        """
        if not self.resolved:
            raise ValueError("LoaderOptions.to_engine needs seed, rank and world_size; call resolve() first")
        fills, fill_default = None, None
        if isinstance(self.fill_null, Mapping):
            fills = dict(self.fill_null)
        else:
            fill_default = self.fill_null
        transforms = None
        if self.transforms is not None:
            transforms = {column: [op._spec() for op in ops] for column, ops in self.transforms.items()}
        return {
            "columns": None if self.columns is None else list(self.columns),
            "batch_size": self.batch_size,
            "drop_last": self.drop_last,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "shuffle_window": self.shuffle_window,
            "rank": self.rank,
            "world_size": self.world_size,
            "shard_policy": self.shard_policy,
            "num_workers": self.num_workers or _env.available_cpus(),
            "max_inflight_bytes": _env.inflight_bytes(self.max_inflight_bytes),
            "prefetch_batches": self.prefetch_batches,
            "verify_checksums": self.verify_checksums,
            "debug_max_delay_us": self._debug_max_delay_us,
            "storage_options": dict(self.storage_options),
            "io_threads": self.io_threads,
            "readahead": self.readahead,
            "fill_default": fill_default,
            "fills": fills,
            "transforms": transforms,
            "lists": None if self.lists is None else {c: v._engine() for c, v in self.lists.items()},
            "pack": None if self.pack is None else self.pack._engine(),
            "stack": None if self.stack is None else [(name, list(cols)) for name, cols in self.stack.items()],
            "on_decode_error": self.on_decode_error,
            "defer_checks": True,  # the Loader checks fill_null first, then the footers
            "strings_as_bytes": self.strings == "bytes",
            "cache_dir": self.cache_dir,
            "cache_size_limit": self.cache_size_limit,
            "cache_policy": self.cache_policy,
            "cache_shards": self.cache_shards,
            "null_mask": None if self.null_mask is None else
                         (True if self.null_mask is True else list(self.null_mask)),
            "decimals": self.decimals,
            "int96_unit": self.coerce_int96_timestamp_unit or "ns",
            "schema": None if self.schema is None else _schema_ipc(self.schema),
            "cache_wait_timeout_ms": int(round(self.cache_wait_timeout * 1000)),
            "row_groups": {} if self.row_groups is None else
                          {path: list(groups) for path, groups in self.row_groups.items()},
            "use_summary": self.use_summary is not False,
            "summary_only": self.use_summary == "only",
            **_filter.to_engine(self.filter),
        }


if LoaderOptions.__doc__ is not None:  # None under python -OO
    LoaderOptions.__doc__ = LoaderOptions.__doc__.replace("        {arguments}\n", ARGUMENT_DOCS)
