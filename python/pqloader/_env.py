"""What a Loader takes from its surroundings: sources, storage options, rank and world size,
the CPUs and memory it may use.

Everything here turns user input or the process environment into the plain values the
engine takes (absolute paths, text options, integers) and refuses what the engine would
misread. Nothing here imports torch: an initialised ``torch.distributed`` group is looked
up in ``sys.modules`` only.
"""

from __future__ import annotations

import errno
import numbers
import os
import re
import stat
import sys
import urllib.parse
from typing import Any, Mapping, Sequence, Union

from pqloader import _core

Source = Union[str, "os.PathLike[str]", Sequence[Union[str, "os.PathLike[str]"]]]

_FILE_SCHEME = "file://"


_SUMMARIES = ("_metadata", "_common_metadata")  # pyarrow's, Dask's, Spark's, pqloader's


def refuse_nul(what: str, text: str) -> None:
    """Refuse a NUL character in a path or option value: the engine's and the S3 client's
    C strings end there, so the rest was silently dropped (another path, another host).

    Raises:
        ValueError: Naming `what`.
    """
    if "\0" in text:
        raise ValueError(f"{what} holds a NUL character ('\\0'), which no path or option value may hold")


def normalize_sources(source: Source) -> list[str]:
    """Turn a source argument into the list of absolute paths and URIs the engine opens.

    Local paths are made absolute (``~`` expanded); URIs (``s3://...``) are kept as
    given, their scheme in lower case (``s3a://`` and ``s3n://`` as ``s3://``). A local path that exists must be a regular file or a directory: the engine
    would block forever opening a FIFO and cannot read a device.

    Args:
        source: A path, URI or glob, or a sequence of them.

    Returns:
        One entry per item of `source`, in its order.

    Raises:
        TypeError: `source` or an item is neither ``str`` nor ``os.PathLike`` (nor, for
            `source`, an iterable of them); `source` is ``bytes`` (decode it:
            ``os.fsdecode``), a set (it has no order: sort it) or a mapping (read as its
            keys: give its values or keys explicitly).
        ValueError: `source` is empty, an item is the empty string, holds a NUL character
            or is not UTF-8 (a name ``os.fsdecode`` made of other bytes), or an existing
            local path is neither a regular file nor a directory.
    """
    if isinstance(source, (bytes, bytearray)):  # else a list of ints, "got int"
        raise TypeError(f"source must be a text path, got bytes {bytes(source)!r}: decode it "
                        "(os.fsdecode)")
    if isinstance(source, (set, frozenset)):  # read in hash order: another per run
        raise TypeError("source must be a path or an ordered list of them, got a set: its "
                        "order changes from run to run; give sorted(...)")
    if isinstance(source, Mapping):  # iterated as its keys: {"train": path} read "train"
        raise TypeError("source must be a path, a URI, a glob or a list of them, got a "
                        f"{type(source).__name__}: give its values (list(d.values())) or its "
                        "keys (list(d)) explicitly")
    if isinstance(source, (str, os.PathLike)):
        items = [source]
    elif callable(getattr(source, "state_dict", None)):
        # A Loader or a mixture (anything that keeps a position): listing it iterated it,
        # a whole epoch read (forever with num_epochs=None) and its position moved, to fail
        # on its first batch ("got dict").
        raise TypeError("source must be a path, a URI, a glob or a list of them, got a "
                        f"{type(source).__module__.split('.')[0]}.{type(source).__name__}, which "
                        "keeps a position: listing it would read it")
    else:
        try:
            entries = iter(source)
        except TypeError:  # (a bare "'int' object is not iterable" named no argument)
            raise TypeError("source must be a path, a URI, a glob or a list of them, got "
                            f"{type(source).__name__} {source!r:.100}") from None
        items = list(entries)
    if not items:
        raise ValueError("source is empty: give a path, a directory, a glob or a list of them")
    out = []
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"source entries must be str or os.PathLike, got {type(item).__name__}")
        s = os.fspath(item)
        if not isinstance(s, str):
            raise TypeError(f"source entries must be text paths, got {type(s).__name__} {s!r}")
        if s == "":
            raise ValueError("source '' is empty: give a path, a directory, a glob or a URI "
                             "(use '.' for the current directory)")
        refuse_nul(f"source {s!r}", s)  # ('data/*\0x' read all of data/)
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:  # os.fsdecode of bytes that are not UTF-8 (surrogates)
            try:
                as_bytes = f" ({os.fsencode(s)!r} as bytes)"
            except UnicodeEncodeError:  # a lone surrogate no bytes decode to (e.g. '\ud800')
                as_bytes = ""
            raise ValueError(f"source {s!r} is not UTF-8{as_bytes}; "
                             "pqloader opens UTF-8 paths only: rename it") from None
        s = _local_file_uri(s)
        local = urllib.parse.unquote(s[len(_FILE_SCHEME):]) if s.startswith(_FILE_SCHEME) else s
        if local.rstrip("/").rsplit("/", 1)[-1] in _SUMMARIES:  # file://.../%5Fmetadata too
            # Named itself: read as data it was refused as corrupt (it holds no pages).
            from pqloader._errors import InvalidDataError
            raise InvalidDataError(f"source {s!r} is a summary (the row groups of the files beside it), "
                                   "not data: summaries are never read as data; give its directory")
        if "://" in s and not s.startswith(_FILE_SCHEME):
            out.append(_lower_scheme(s))
            continue
        _check_local_kind(local if s.startswith(_FILE_SCHEME) else os.path.expanduser(s))
        if s.startswith(_FILE_SCHEME):
            out.append(_file_uri_as_named(s))
            continue
        path = _absolute(os.path.expanduser(s))
        # A glob ending in '/' names directories only (`runs/run*/`, as fnmatch and a shell
        # take it): the '/' kept (abspath drops it).
        if s.endswith(("/", os.sep)) and any(c in s for c in "*?[") and path != "/":
            path += "/"
        out.append(path)
    return out


def local_dir(path: str, what: str = "cache_dir") -> str:
    """A local directory argument made absolute (``~`` expanded; ``file://`` taken off).

    Raises:
        TypeError: `path` is not a str (``bytes``: decode it with ``os.fsdecode``).
        ValueError: `path` is another URL (``s3://bucket/cache``): made absolute, it named
            a local directory ``./s3:/bucket/cache``, which a Loader created and used
            silently; or it holds a NUL character (the engine cut the path there and
            used another directory); or it is empty (made absolute, the current directory:
            ``cache clear ""``, an unset variable, cleared the cache one stood in).
    """
    if not isinstance(path, str):  # (the engine's bare "incompatible function arguments")
        raise TypeError(f"{what} must be a text path, got {type(path).__name__} {path!r}"
                        + (": decode it (os.fsdecode)" if isinstance(path, bytes) else ""))
    refuse_nul(f"{what} {path!r}", path)  # ('cache\0x' made and used 'cache')
    if path == "":  # (`pqloader cache clear "$UNSET"` cleared the current directory's cache)
        raise ValueError(f"{what} must be a directory path, got '' (write '.' for the "
                         "current directory)")
    path = _local_file_uri(path, what)
    if path.startswith(_FILE_SCHEME):
        path = urllib.parse.unquote(path[len(_FILE_SCHEME):])
    elif "://" in path:
        raise ValueError(f"{what} must be a local directory, got the URL {path!r} (the cache "
                         "is kept on local disk)")
    return _absolute(os.path.expanduser(path))


_FILE_URI = re.compile(r"(?i)file:(//([^/]*))?(?=/|$)")


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*(?=://)")


# Hadoop's names of S3 (Spark and Hive write them into tables and configs): the same
# buckets and keys as s3://, which Arrow alone knows ("Unrecognized filesystem type").
_S3_ALIASES = ("s3a", "s3n")


def _lower_scheme(uri: str) -> str:
    """`uri` with its scheme in lower case (RFC 3986: schemes are case-insensitive;
    ``S3://bucket/x`` was "Unrecognized filesystem type"), ``s3a://`` and ``s3n://`` as
    ``s3://``. Bucket and key keep their case."""
    m = _SCHEME.match(uri)
    if m is None:
        return uri
    scheme = m.group(0).lower()
    return ("s3" if scheme in _S3_ALIASES else scheme) + uri[m.end():]


def _local_file_uri(s: str, what: str = "source") -> str:
    """A ``file:`` URI spelled ``file:///path``, the one spelling the engine (Arrow) opens.

    RFC 8089 also writes a local file ``file://localhost/path`` (Arrow refused the host)
    and ``file:/path`` (Hadoop's and Spark's spelling: it was read as the relative path
    ``./file:/path``); the scheme is case-insensitive. Anything else is returned as given.

    Raises:
        ValueError: `s` names another host (``file://server/path``): a remote file read as
            the local ``/path`` would be another file.
    """
    m = _FILE_URI.match(s)
    if m is None:
        return s
    host = m.group(2)
    if host is not None and host != "" and host.lower() != "localhost":
        raise ValueError(f"{what} {s!r} names the host {host!r}: file: URIs name local files "
                         "only (file:///path or file://localhost/path); mount the share and "
                         "give its local path")
    return _FILE_SCHEME + s[m.end():]


def _file_uri_as_named(uri: str) -> str:
    """``file://`` + the path `uri` names, escaped so that Arrow opens that path.

    The text after ``file://`` is the path, percent-decoded, as :func:`local_dir` takes a
    ``cache_dir`` and the checks above take a source: Arrow parsed it as a URI, so that
    ``#`` and ``?`` ended the path (``file:///d/run#3`` read ``/d/run``, another dataset,
    without a word; ``file:///d/q?x`` was missing) and a space, a bracket or a non-ASCII
    letter (``file:///d/my ds``, Hadoop's unescaped ``file:/d/my ds``) could not be parsed.
    Only what a URI's path cannot hold is escaped (a ``%`` too where no two hex digits
    follow it): a URI Arrow parsed before keeps its spelling, in states and messages
    (``pathlib.Path.as_uri``'s ``k%3D1`` and a hand-written ``k=1`` alike).
    """
    return _FILE_SCHEME + _URI_PATH_UNSAFE.sub(
        lambda m: "".join(f"%{b:02X}" for b in m.group().encode("utf-8", "surrogateescape")),
        uri[len(_FILE_SCHEME):])


# What a URI's path cannot hold as it is (RFC 3986: unreserved, sub-delims, ':', '@', '/'
# and %-escapes of two hex digits may stand).
_URI_PATH_UNSAFE = re.compile(r"%(?![0-9A-Fa-f]{2})|[^A-Za-z0-9\-._~!$&'()*+,;=:@/%]")


def _absolute(path: str) -> str:
    """`path` made absolute, naming what the OS (and pyarrow) opens for it.

    ``os.path.abspath`` collapses ``..`` by the spelling: ``/p/link/../x`` became ``/p/x``,
    where the OS goes up from the link's target (another file, read without a word).
    The part up to the last ``..`` is resolved as the OS resolves it; ``.`` and repeated
    slashes are dropped.
    """
    path = os.path.join(os.getcwd(), path)  # the working directory is a physical path
    parts = path.split(os.sep)
    if os.pardir in parts:
        last = len(parts) - 1 - parts[::-1].index(os.pardir)
        path = os.path.join(os.path.realpath(os.sep.join(parts[:last + 1])), *parts[last + 1:])
    return os.path.normpath(path)  # no '..' left: only '.' and '//' go


def _check_local_kind(path: str) -> None:
    """Refuse an existing local path that is neither a regular file nor a directory."""
    try:
        mode = os.stat(path).st_mode
    except NotADirectoryError:
        # 'd/a.parquet/' (or 'd/a.parquet/*'): a file named as a directory. The OS refuses
        # it (ENOTDIR); the engine dropped the '/' and read the file.
        file = path
        for i, c in enumerate(path):
            if c == os.sep and i and os.path.isfile(path[:i]):
                file = path[:i]
                break
        hint = "drop the trailing '/' to read the file" if path.rstrip(os.sep + ".") == file \
            else "give the file, or its directory"
        raise ValueError(f"source {path!r} names the file {file!r} as a directory (the OS "
                         f"refuses it: not a directory); {hint}") from None
    except (OSError, ValueError):
        return  # missing, or a glob pattern: the engine reports what it finds
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
                else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "not a regular file")
        raise ValueError(f"source {path!r} is {kind}; give Parquet files, directories or globs "
                         "of regular files")


# The value types of the engine's storage options (``io/filesystem.cc``) besides text,
# which every key takes (the CLI passes text; the engine parses it): text-only keys take
# nothing else, a bool given for a number is a mistake, as is a non-integer attempt count.
_TEXT_KEYS = frozenset({"endpoint_override", "scheme", "region", "access_key", "secret_key",
                        "session_token", "tls_ca_file_path"})
_BOOL_KEYS = frozenset({"anonymous", "force_virtual_addressing"})
_SECONDS_KEYS = frozenset({"connect_timeout", "request_timeout", "retry_base_delay",
                           "retry_max_delay", "retry_budget"})
_INT_KEYS = frozenset({"retry_max_attempts"})


def _is_numpy_bool(value: Any) -> bool:
    """NumPy's bool scalar (``numpy.bool_``; ``numpy.bool`` in NumPy 2), not an Integral."""
    return type(value).__module__ == "numpy" and type(value).__name__ in ("bool_", "bool")


def _check_storage_value_type(key: str, value: Any) -> None:
    """Refuse a value whose type the key cannot take, naming the key and the types."""
    if isinstance(value, str):
        return
    if key in _TEXT_KEYS:
        accepted, ok = "str", False
    elif key in _BOOL_KEYS:  # 0/1 as pyarrow's S3FileSystem takes them
        accepted = "bool (or str)"
        ok = isinstance(value, numbers.Integral) or _is_numpy_bool(value)
    elif key in _SECONDS_KEYS:
        accepted = "a number of seconds: int or float (or str)"
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    elif key in _INT_KEYS:
        accepted = "int (or str)"
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    else:  # unknown keys: the engine refuses them naming the known ones
        accepted = "str, bool, int or float"
        ok = isinstance(value, (bool, int, float))
    if not ok:  # the type only: a value may be a secret
        raise TypeError(f"storage_options[{key!r}] must be {accepted}, got {type(value).__name__}")


def normalize_storage_options(options: Mapping[str, Any] | None) -> dict[str, str]:
    """Storage options as text for the engine, which checks the keys and values.

    A ``retry_strategy`` given as a pyarrow ``S3RetryStrategy`` becomes its
    ``max_attempts`` (pqloader's backoff is used either way). Entries whose value is
    ``None`` are dropped. Normalising the result again returns it unchanged.

    Args:
        options: ``{name: value}`` as for ``pyarrow.fs.S3FileSystem``, or None.

    Returns:
        ``{name: text}``; bools become ``"true"``/``"false"``.

    Raises:
        TypeError: `options` is not a mapping, a key is not str, or a value's type is
            not one its key takes: text for every key; only text for ``region``,
            ``endpoint_override``, ``scheme``, the credentials and ``tls_ca_file_path``;
            bool for ``anonymous`` and ``force_virtual_addressing``; int or float for
            the timeouts and retry delays; int for ``retry_max_attempts``.
        ValueError: A text value holds a NUL character.
    """
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"storage_options must be a dict, got {type(options).__name__}")
    out = {}
    for key, value in options.items():
        if not isinstance(key, str):
            raise TypeError(f"storage_options keys must be str, got {key!r}")
        if key == "retry_strategy" and hasattr(value, "max_attempts"):
            key, value = "retry_max_attempts", value.max_attempts
        if value is None:
            continue
        _check_storage_value_type(key, value)
        if isinstance(value, str):  # (the value not shown: it may be a secret)
            refuse_nul(f"storage_options[{key!r}]", value)  # (an endpoint 'h:1\0x' reached h:1)
        if isinstance(value, bool) or _is_numpy_bool(value):
            out[key] = "true" if value else "false"
        elif isinstance(value, numbers.Integral):
            out[key] = str(int(value))
        elif isinstance(value, numbers.Real):
            out[key] = repr(float(value))
        else:
            out[key] = value
    return out


def env_int(name: str) -> int | None:
    """Read an integer environment variable.

    Args:
        name: The variable, e.g. ``"RANK"``.

    Returns:
        Its value, or None when it is unset or empty.

    Raises:
        ValueError: It is set to something other than an integer.
    """
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return None
    # Decimal digits only: int() also takes "1_0" (10) and other scripts' digits.
    if not re.fullmatch(r"\s*[+-]?[0-9]+\s*", value):
        raise ValueError(f"environment variable {name}={value!r} is not an integer")
    return int(value)


def available_cpus() -> int:
    """The CPUs this process may use, the default ``num_workers``: those of its affinity
    mask (``taskset``, a cpuset), at most its cgroup's CPU quota rounded up (a container's
    CPU limit: v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``, its ancestors' too), at least 1.
    (``os.cpu_count()`` and ``std::thread::hardware_concurrency`` count the node's CPUs:
    a pod limited to 2 CPUs of a 64-core node started 64 workers.) The engine counts them
    (``util/container_limits.h``), for its own default too.
    """
    return _core.available_cpus()


def cgroup_memory_limit(proc: str = "/proc/self") -> int | None:
    """The smallest memory limit in bytes of the process's cgroups (a container's memory
    limit: v2 ``memory.max``, v1 ``memory.limit_in_bytes``) and their ancestors; None when
    there is none or it cannot be read. The engine reads it (``util/container_limits.h``,
    as it finds the CPU quota)."""
    return _core._cgroup_memory_limit(proc)


_MIB = 1 << 20


def _limit_text(limit: int) -> str:
    return (f"this process's cgroup memory limit of {limit} bytes ({limit / _MIB:.0f} MiB; a container's "
            f"memory limit)")


def inflight_bytes(given: int | None, proc: str = "/proc/self", share: int = 1) -> int:
    """The ``max_inflight_bytes`` the engine gets: `given`, or the default sized to the
    cgroup's memory limit (the engine's rule, ``DefaultInflightBytes`` in
    ``util/container_limits.h``: 256 MiB, at most an eighth of the limit, at least 16 MiB),
    its eighth divided among the `share` loaders that hold it at once (a torch
    ``DataLoader``'s workers, each its own process in the same container). A given one
    over half the limit is kept, with a warning.

    Warns:
        RuntimeWarning: `given` is over half the cgroup's memory limit (the measured peak
            is about the budget above the process's own memory, and up to twice it more
            in freed buffers kept for reuse: over the limit the kernel kills the process).
    """
    limit = cgroup_memory_limit(proc)
    if given is None:
        return _core._default_inflight_bytes(limit, share)
    if limit is not None and given > limit // 2:
        import warnings

        from pqloader._errors import user_stacklevel
        warnings.warn(f"max_inflight_bytes={given} ({given / _MIB:.0f} MiB) is over half {_limit_text(limit)}: "
                      f"the loader's peak memory is about max_inflight_bytes above the process's "
                      f"own, plus the row groups being decoded and up to twice it in freed buffers kept "
                      f"for reuse, and over the limit the kernel kills the process without an error; "
                      f"lower max_inflight_bytes, or leave it unset (its default is at most an eighth of "
                      f"the limit)", RuntimeWarning, stacklevel=user_stacklevel())
    return given


# The messages of the memory warnings above and below (warnings.filterwarnings' `message`):
# a loader rebuilt from one made already (a DataLoader worker's, a length probe) warned
# of its memory when it was made, and is not to warn once more in every worker.
MEMORY_WARNINGS = r"max_inflight_bytes=\d+ \(\d+ MiB\) is over half |shuffle_window=\d+: the largest "


# The measured peak of a shuffled loader (docs/design.md, "The memory limit"): the process
# (Python, NumPy, pqloader), 1.3x max_inflight_bytes, and its largest shuffle window about
# 4 times where windows are gathered whole (the window read and the next one, each decoded
# and its shuffled copy), 3 times else (decoded, and the rows batched from them).
PROCESS_BYTES = 58 * 10**6
WINDOW_COPIES = {True: 4, False: 3}


def check_shuffle_window(window_bytes: int, gathers: bool, shuffle_window: int, budget: int,
                         proc: str = "/proc/self", workers: int = 0) -> None:
    """Warn when a shuffled loader's shuffle window, which ``max_inflight_bytes`` does not
    bound, would take its peak memory over the cgroup's memory limit.

    Args:
        window_bytes: The largest window's decoded bytes (the engine's estimate, from the
            footers: ``plan_info()["max_window_bytes"]``; 0 when not shuffled).
        gathers: Whether the loader gathers whole windows (``plan_info()["gathers_windows"]``).
        shuffle_window: The option, to name it.
        budget: The ``max_inflight_bytes`` the engine got (each worker's, with `workers`).
        workers: 0: the loader in this process; W > 0: W DataLoader worker processes in
            the same container, each with its own loader, budget and window. The process's
            own memory is counted once: forked workers share its pages (the cgroup charges
            them once); spawned ones import anew, which this under-counts.

    Warns:
        RuntimeWarning: The estimated peak is over the limit, naming shuffle_window (and
            num_workers, with workers), the window's bytes, the estimate and the limit.
    """
    limit = None if window_bytes <= 0 else cgroup_memory_limit(proc)
    if limit is None:
        return
    copies = WINDOW_COPIES[bool(gathers)]
    loaders = max(1, workers)
    peak = PROCESS_BYTES + loaders * (budget * 13 // 10 + copies * window_bytes)
    if peak <= limit:
        return
    import warnings

    from pqloader._errors import user_stacklevel
    held = ("a shuffled loader holds" if workers == 0 else
            f"each of num_workers={workers} DataLoader worker processes holds its own loader's window,")
    what = ("with the process and max_inflight_bytes" if workers == 0 else
            "with the process and the workers' max_inflight_bytes")
    lower = "lower shuffle_window" if workers == 0 else "lower shuffle_window or num_workers"
    warnings.warn(f"shuffle_window={shuffle_window}: the largest shuffle window holds about {window_bytes} "
                  f"bytes ({window_bytes / _MIB:.0f} MiB) decoded, and {held} about {copies} "
                  f"times that whatever max_inflight_bytes is (max_inflight_bytes does not bound it): "
                  f"its peak memory is estimated at {peak} bytes ({peak / _MIB:.0f} MiB) {what}"
                  f"={budget}{'' if workers == 0 else ' each'}, over {_limit_text(limit)}, where the kernel "
                  f"kills the process without an error; {lower}, or write smaller row groups "
                  f"(pyarrow.parquet.write_table(..., row_group_size=...))",
                  RuntimeWarning, stacklevel=user_stacklevel())


def check_mixture_budgets(budgets: Sequence[int], defaults: int = 0, proc: str = "/proc/self") -> None:
    """Warn when a mixture's sources, built each with its own ``max_inflight_bytes``,
    together hold more than half the cgroup's memory limit: what one loader's given
    budget is held to (:func:`inflight_bytes`). Each source left without one took an
    eighth of the limit when it was built, not knowing it would be mixed: two to four of
    them stay within half (a warning there was one in every small container, for nothing
    the user did), five or more do not.

    Args:
        budgets: The engine budgets of the sources the mixture reads (weight > 0).
        defaults: How many of them are the default (no ``max_inflight_bytes`` given).

    Warns:
        RuntimeWarning: Naming the sum, the limit, how many are defaults, the option and
            a value for each source.
    """
    limit = cgroup_memory_limit(proc) if len(budgets) > 1 else None
    if limit is None:
        return
    total = sum(budgets)
    if total <= limit // 2:
        return
    import warnings

    from pqloader._errors import user_stacklevel
    n = len(budgets)
    whose = ("each the default (an eighth of the limit per Loader, which cannot know it will be mixed)"
             if defaults == n else "" if defaults == 0 else
             f"{defaults} of them the default (an eighth of the limit per Loader, which cannot know it will "
             f"be mixed)")
    warnings.warn(f"mix: its {n} sources' max_inflight_bytes add up to {total} bytes ({total / _MIB:.0f} MiB)"
                  f"{', ' + whose if whose else ''}, over half {_limit_text(limit)}: a mixture holds the "
                  f"sum of its sources' budgets, each fixed when its Loader was built, and its peak memory "
                  f"is up to about 3 times that; over the limit the kernel kills the process without an "
                  f"error; build the sources with max_inflight_bytes={_core._default_inflight_bytes(limit, n)} "
                  f"(one loader's default shared among the {n}, as DataLoader workers share it)",
                  RuntimeWarning, stacklevel=user_stacklevel())


def _ray_train_rank_world() -> tuple[int, int] | None:
    """Rank and world size of the Ray Train worker this runs in, if it is one.

    Only where the training function has imported ``ray.train`` already (pqloader never
    imports Ray); outside a worker ``get_context()`` raises, which means "not Ray Train".
    """
    train = sys.modules.get("ray.train")
    if train is None or not hasattr(train, "get_context"):
        return None
    try:
        context = train.get_context()
        if not type(context).__module__.startswith("ray.train.v2"):
            # Ray Train v1 (RAY_TRAIN_V2_ENABLED=0, older Ray): outside a worker its getters
            # warn (once) and answer rank 0 of 1 instead of raising; a worker has a session.
            session = sys.modules.get("ray.train._internal.session")
            if session is None or session.get_session() is None:
                return None
        return int(context.get_world_rank()), int(context.get_world_size())
    except Exception:  # noqa: BLE001 - the driver, or a process Ray Train did not launch
        return None


_ENV_SOURCE = "the environment (RANK/WORLD_SIZE)"


def _initialised_dist() -> Any:
    """``torch.distributed`` if it is imported and its process group initialised, else
    None. A module another thread is still importing has no group yet: asked for
    ``is_available`` it raised AttributeError ("partially initialized module
    'torch.distributed'") into a Loader built meanwhile."""
    dist = sys.modules.get("torch.distributed")
    try:
        return dist if dist is not None and dist.is_available() and dist.is_initialized() else None
    except AttributeError:
        return None


def discover_rank_world() -> tuple[int | None, int | None, str]:
    """Rank and world size as this process's surroundings give them, and where from.

    In order: an initialised torch.distributed group (torchrun, Ray Train's
    ``TorchTrainer``, Lightning, Accelerate), a Ray Train worker's context (any Ray Train
    trainer), else the ``RANK``/``WORLD_SIZE`` environment variables, each of which may
    be unset (None).

    Returns:
        ``(rank, world_size, where)``; `where` names the source for messages.

    Raises:
        ValueError: ``RANK`` or ``WORLD_SIZE`` is set but not an integer.
    """
    dist = _initialised_dist()
    if dist is not None:
        return dist.get_rank(), dist.get_world_size(), "the initialised torch.distributed process group"
    ray_train = _ray_train_rank_world()
    if ray_train is not None:
        return ray_train[0], ray_train[1], "the Ray Train worker's context (ray.train.get_context())"
    return env_int("RANK"), env_int("WORLD_SIZE"), _ENV_SOURCE


def resolve_rank_world(rank: int | None, world: int | None) -> tuple[int, int]:
    """Settle ``Loader(rank=..., world_size=...)`` with what the surroundings give.

    Given both, they are used as they are (an override: e.g. a data-parallel group's
    rank and size); ``world_size=1`` alone is rank 0 of 1. Given one, the other comes
    from :func:`discover_rank_world`, whose value for the given one must agree: a rank
    of one world taken with the size of another (``rank=LOCAL_RANK`` under a multi-node
    torchrun, ``world_size=`` a data-parallel size beside the global group's rank) would
    overlap shards and miss rows. Given neither, both come from there.

    Returns:
        ``(rank, world_size)``; ``(0, 1)`` when nothing says otherwise.

    Raises:
        ValueError: ``RANK`` or ``WORLD_SIZE`` is set but not an integer; only one of
            them is set (``WORLD_SIZE`` > 1 or ``RANK`` > 0); the given one disagrees
            with the source of the other, or is not a rank of the world size found there
            (naming where each came from); a ``world_size`` > 1 is given and no rank
            is found anywhere (every process would be rank 0).
    """
    if rank is not None and world is not None:
        return rank, world
    if world == 1:  # one process reading everything (e.g. evaluation on one rank of a job)
        return 0, 1
    found_rank, found_world, where = discover_rank_world()
    both = "pass both rank= and world_size=, or neither"
    if where == _ENV_SOURCE and rank is None and world is None:
        if found_rank is None and found_world is not None and found_world > 1:
            raise ValueError(f"environment variable WORLD_SIZE={found_world} is set but RANK is not: every "
                             f"process would be rank 0 and read the same shard; build the Loader "
                             f"once the process group exists (Lightning: in setup() or "
                             f"train_dataloader()), set RANK too (torchrun sets both), or {both}")
        if found_world is None and found_rank is not None and found_rank > 0:
            raise ValueError(f"environment variable RANK={found_rank} is set but WORLD_SIZE is not; set "
                             f"WORLD_SIZE too (torchrun sets both), or {both}")
    if where == _ENV_SOURCE:
        # (above 2**62, as the options take them: "world_size must be in [1, ...]" named
        # an argument never given)
        if found_world is not None and not 1 <= found_world <= 1 << 62:
            raise ValueError(f"environment variable WORLD_SIZE={found_world} is not a world size "
                             f"(1 <= WORLD_SIZE <= 2**62)")
        if found_rank is not None and not 0 <= found_rank < (found_world or 1 << 62):
            raise ValueError(f"environment variable RANK={found_rank} is not a rank of WORLD_SIZE="
                             f"{found_world} (0 <= RANK < WORLD_SIZE)")
    if rank is not None and found_rank is not None and rank != found_rank:
        raise ValueError(f"rank={rank} is given without world_size, which would come from {where}, "
                         f"where this process is rank {found_rank} of {found_world}: the shards of two "
                         f"worlds would overlap and miss rows; {both}")
    if world is not None and found_world is not None and world != found_world:
        raise ValueError(f"world_size={world} is given without rank, which would come from {where}, "
                         f"where the world size is {found_world} (this process rank {found_rank}): the "
                         f"shards of two worlds would overlap and miss rows; {both}")
    if world is not None and world > 1 and found_rank is None:
        raise ValueError(f"world_size={world} is given without rank, and no rank is found (no "
                         f"torch.distributed process group, Ray Train worker or RANK variable): every "
                         f"process would be rank 0 and read the same shard; {both}")
    given = "given" if rank is not None else f"from {where}"
    world_from = ("given" if world is not None else f"from {where}" if found_world is not None
                  else "none found anywhere: 1")
    rank = found_rank if rank is None else rank
    world = found_world if world is None else world
    rank, world = (0 if rank is None else rank), (1 if world is None else world)
    if rank >= world:  # one given, the other found (or no world size found)
        raise ValueError(f"rank {rank} ({given}) is not a rank of world size {world} ({world_from}): "
                         f"0 <= rank < world_size; {both}")
    return rank, world


def check_process_group_agrees(rank: int, world: int) -> None:
    """Refuse to iterate with a rank and world size discovered before the process group.

    A Loader built before ``torch.distributed.init_process_group`` (without ``RANK`` and
    ``WORLD_SIZE``, as ``mp.spawn`` leaves it) took rank 0 of 1 on every process: each
    would read every row, training each one world-size times per epoch, silently.

    Without a process group, a Ray Train worker's context is checked the same way: a
    ``pqloader.torch.IterableDataset`` made on the driver (rank 0 of 1) and passed into
    the workers of a trainer without torch (``DataParallelTrainer``).

    Raises:
        ValueError: An initialised process group, else a Ray Train worker's context,
            gives another rank or world size.
    """
    dist = _initialised_dist()
    if dist is None:
        ray_train = _ray_train_rank_world()
        if ray_train is not None and ray_train != (rank, world):
            raise ValueError(f"this Loader is rank {rank} of {world}, found when it was built, but "
                             f"the Ray Train worker's context (ray.train.get_context()) says rank "
                             f"{ray_train[0]} of {ray_train[1]}: it was built outside this worker "
                             f"(e.g. on the driver; its shard is not this rank's: rows would be "
                             f"repeated or missed across ranks); build it in the training "
                             f"function, or pass rank= and world_size= (world_size=1: every rank "
                             f"reads every row)")
        return
    group_rank, group_world = dist.get_rank(), dist.get_world_size()
    if (group_rank, group_world) != (rank, world):
        raise ValueError(f"this Loader is rank {rank} of {world}, found when it was built, but the "
                         f"initialised torch.distributed process group says rank {group_rank} of "
                         f"{group_world}: it was built before init_process_group (its shard is not "
                         f"this rank's: rows would be repeated or missed across ranks); build it "
                         f"after init_process_group, or pass rank= and world_size= (world_size=1: "
                         f"every rank reads every row)")
