"""Functions that look at datasets and cache directories without a Loader."""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Sequence

import numpy as np

from pqloader import _core, _env
from pqloader._env import Source
from pqloader._errors import arrow_files_hint, utf8_paths
from pqloader._options import INT96_UNITS, check_choice


def _dataset_sources(dataset: Source | None) -> list[str]:
    return [] if dataset is None else _env.normalize_sources(dataset)


def cache_stats(cache_dir: str | os.PathLike[str], dataset: Source | None = None,
                storage_options: Mapping[str, Any] | None = None) -> dict[str, int]:
    """Describe a cache directory, stale entries included.

    An entry is *stale* when the file it was decoded from has changed since (size,
    modification time or footer) or is gone: no loader asks for it again, it only takes
    room (``pqloader cache prune`` deletes such entries; a loader whose cache is full
    deletes those of its own files first). Each entry's header names its source file;
    every distinct file is checked once, as a Loader would open it now.

    Args:
        cache_dir: A directory given as ``cache_dir`` to loaders.
        dataset: Check only the entries of this dataset's files (as a Loader's
            ``source``); an entry of a file that was under one of its directories and is
            gone is stale, and entries of other files count as unverified. Default: each
            entry's own local file is looked up (a stat, and a footer read when size and
            mtime still match); entries of remote files count as unverified (checking
            them costs requests: give their dataset, e.g. ``"s3://bucket/train"``).
        storage_options: As for :class:`pqloader.Loader`, for remote sources.

    Returns:
        ``entries``, ``bytes``, ``temp_files``; ``stale_entries`` and ``stale_bytes``;
        ``unverified_entries`` (sources that could not be checked); ``selections`` and
        ``selection_bytes`` (filter selections), ``lengths`` and ``lengths_bytes``
        (documents' lengths that ``pack=`` read, one file per data file), ``footers`` and
        ``footer_bytes`` (remote footers): kept beside the entries, outside ``cache_size_limit``, deleted only by
        :func:`cache_clear`; plus the counts
        recorded by loaders that used it (``hits``, ``misses``, ``inserts``,
        ``evictions``, ``refused_full``, ``refused_later``, ... where they happened).

    Raises:
        pqloader.IOError: `cache_dir` is not a directory, or it or a shard of it cannot be
            listed, or `dataset` cannot be listed.
        pqloader.InvalidDataError: `cache_dir` is not empty and is not a cache (it has no
            ``PQLOADER_CACHE`` marker).

    Example:
        >>> pqloader.cache_stats("/tmp/pqcache")["stale_entries"]
        0
    """
    return dict(_core.cache_stats(_env.local_dir(os.fspath(cache_dir)), _dataset_sources(dataset),
                                  _env.normalize_storage_options(storage_options)))


def cache_prune(cache_dir: str | os.PathLike[str], dataset: Source | None = None,
                storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Delete the stale entries of a cache directory (see :func:`cache_stats`).

    Only files proven to be entries (as :func:`cache_clear` proves them) whose source is
    stale are deleted, each under its shard's lock, so loaders may use the directory
    meanwhile. Entries whose source cannot be checked (unreachable storage, or outside
    `dataset`) are kept.

    Args:
        cache_dir: A directory given as ``cache_dir`` to loaders.
        dataset: As for :func:`cache_stats`.
        storage_options: As for :class:`pqloader.Loader`, for remote sources.

    Returns:
        ``entries`` and ``bytes`` deleted, ``kept`` (entries left) and, of those,
        ``unverified_entries``; ``not_removed`` (up to 10 "PATH: reason" lines) and
        ``not_removed_count``: stale entries that could not be deleted (another user's, in
        a directory this one may not write), which the prune went on past.

    Raises:
        pqloader.InvalidDataError: `cache_dir` is not empty and has no valid marker file
            (none, or one empty or damaged: the message says which; it is
            not a pqloader cache); nothing was deleted.
        pqloader.IOError: `cache_dir` is not a directory, `dataset` or a shard cannot be
            listed, or a shard's lock could not be taken, or an entry could not be deleted
            for another reason than permissions (a read-only filesystem, an I/O error).

    Example:
        >>> pqloader.cache_prune("/tmp/pqcache", dataset="data/train")["entries"]
        3
    """
    return dict(_core.cache_prune(_env.local_dir(os.fspath(cache_dir)), _dataset_sources(dataset),
                                  _env.normalize_storage_options(storage_options)))


def cache_clear(cache_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Delete the entries of a cache directory, and only what pqloader provably wrote.

    A cache directory carries a ``PQLOADER_CACHE`` marker file, written when a loader
    creates it (or finds it empty). Deleted: entry files whose header is an entry's
    (magic and own key), footers whose checksum verifies, stored filter selections and
    row lengths, temp files, claim markers, usage files and records. Anything else (files of other
    programs, directories pqloader did not make, symbolic links) is left alone and listed
    in ``foreign``. The directory, its marker, its shard directories and their lock files
    stay, so loaders running meanwhile go on using the cache; each shard is cleared under
    its lock, as writers change it.

    Args:
        cache_dir: A directory given as ``cache_dir`` to loaders.

    Returns:
        ``entries`` and ``bytes`` deleted, ``other_files`` (footers, selections, lengths, temp
        files, markers, usage files, records) deleted, ``foreign`` (up to 10 paths left alone) and ``foreign_count``;
        ``not_removed`` (up to 10 "PATH: reason" lines) and ``not_removed_count``: files of
        pqloader's that could not be deleted (another user's, in a directory this one may
        not write), which the clear went on past.

    Raises:
        pqloader.InvalidDataError: `cache_dir` is not empty and has no valid marker file
            (none, or one empty or damaged: the message says which; it is
            not a pqloader cache); nothing was deleted.
        pqloader.IOError: `cache_dir` is not a directory, a file could not be deleted for
            another reason than permissions (a read-only filesystem, an I/O error), or
            another process or thread held a shard's lock for over 60 s.

    Example:
        >>> pqloader.cache_clear("/tmp/pqcache")["entries"]
        12
    """
    return dict(_core.cache_clear(_env.local_dir(os.fspath(cache_dir))))


def inspect(source: Source, storage_options: Mapping[str, Any] | None = None,
            lengths: bool | Sequence[str] = False, filter: Any = None,
            coerce_int96_timestamp_unit: str | None = None, _progress: Any = None) -> dict[str, Any]:
    """Describe a dataset without reading its data pages (unless ``lengths`` asks for them).

    Args:
        source: As for :class:`pqloader.Loader`.
        storage_options: As for :class:`pqloader.Loader`.
        lengths: Also read the row lengths of the ragged list columns (``True``: all of
            them; or a list of their names) and report their statistics. This reads every
            value of those columns once (Parquet stores lengths only as repetition levels),
            in parallel over row groups: one pass over each column, not a footer read.
            The lengths are of every row: a ``filter`` given beside does not apply to them.
        filter: A row filter as ``Loader(filter=...)`` takes it (an expression, a string
            such as ``"lang == 'en' and year >= 2020"``, a Predicate, or a list); then
            what each of its stages prunes is reported under ``filter``. This runs the
            filter's mask pass (reading the filter's columns of the row groups that
            statistics do not decide), as a Loader does when it is made.
        coerce_int96_timestamp_unit: As for :class:`pqloader.Loader`: the unit INT96
            timestamps are typed in (``schema``, ``loads_as``) and the filter's mask pass
            reads them in (``"us"`` for Spark's 9999-12-31).

    Returns:
        A dict with ``files`` (path, num_rows, num_row_groups, size_bytes, compression:
        the first row group's codecs, ``"+"``-joined where columns differ, created_by),
        ``skipped`` (files a directory listing or glob found that are not
        Parquet, by extension and magic, and that loaders leave out, as
        ``Loader.skipped_files``: ``path`` and ``reason`` each; empty when none),
        ``schema`` (column -> Arrow type), ``loads_as`` (column -> what the loader
        yields, or "unsupported: <why>"; then notes, each after ``"; "``: nulls
        the footers count, a pandas index column), ``ragged`` (the list columns whose rows may
        differ in length: they need ``Loader(lists=...)`` or ``pack=``), ``num_rows``,
        ``num_row_groups``, ``num_files``; with ``lengths``, also ``lengths``: column ->
        ``rows``, ``total`` (values of all rows), ``min``, ``median``, ``p99``, ``max``
        (row lengths in values; the median and p99 are the lower order statistics, i.e.
        lengths that occur), ``mean`` and ``nulls`` (null rows, and rows of files without
        the column: counted as empty lists, as ``fill_null`` loads them). A ragged column whose rows all turn out to have
        one length ``n`` loads as ``dtype(batch, n)`` without ``lists=``; its ``loads_as``
        then says so. With ``filter``, also ``filter``: ``expression`` (the filter as
        text), ``files`` / ``files_pruned`` (by hive partition keys), ``row_groups``,
        ``row_groups_pruned_partition`` / ``_pruned_statistics`` / ``_pruned_mask``,
        ``row_groups_all_rows`` (kept whole by partition keys), ``row_groups_masked`` (read
        for a row mask), ``rows`` / ``rows_kept``, ``mask_bytes_read`` (compressed
        bytes the mask pass read), ``bytes`` / ``bytes_pruned`` (compressed bytes of one
        loadable column, the first, and of it in pruned row groups: the share a Loader
        of any columns would not read, roughly) and ``from_store`` (the selection came
        from a cache; always False here, as no ``cache_dir`` is given). The
        ``Loader.stats()`` keys ``filter_*`` are the same counts.

    Raises:
        TypeError, ValueError: `source`, `storage_options`, `lengths`, `filter` or
            `coerce_int96_timestamp_unit` is malformed (a filter string that does not
            parse, or is nested too deeply), or
            `lengths` names a column that is not a ragged list column.
        pqloader.Error: As for :class:`pqloader.Loader`.

    Example:
        >>> pqloader.inspect("data/train")["num_rows"]
        1000000
        >>> pqloader.inspect("data/tokens", lengths=True)["lengths"]["tokens"]["p99"]
        812
    """
    sources = _env.normalize_sources(source)
    options = _env.normalize_storage_options(storage_options)
    _check_lengths(lengths)
    if coerce_int96_timestamp_unit is not None:
        check_choice("coerce_int96_timestamp_unit", coerce_int96_timestamp_unit, INT96_UNITS)
    # A file name that is not UTF-8: InvalidDataError naming it; .arrow files: a hint.
    with utf8_paths(), arrow_files_hint(sources):
        info = _core.inspect(sources, options, _progress,  # _progress: the CLI's _core.Progress
                             coerce_int96_timestamp_unit or "ns")
    _check_row_counts(info)
    columns = _length_columns(lengths, info["ragged"])
    if columns:
        info["lengths"] = _core.list_lengths(sources, options, columns)
        for name, stats in info["lengths"].items():
            # "ragged int32: ..." or "ragged float32 (n, 3): ..." (from the engine), then
            # notes, each after "; " (nulls, ...): kept
            description, sep, notes = info["loads_as"][name].partition("; ")
            m = re.match(r"ragged (\w+)(?: \(n, ([\d, ]+)\))?:", description)
            if m and stats["rows"] and stats["min"] == stats["max"] and not stats["nulls"]:
                inner = f", {m.group(2)}" if m.group(2) else ""
                info["loads_as"][name] = (f"{m.group(1)}(batch, {stats['max']}{inner}) (every row "
                                          f"has length {stats['max']})") + sep + notes
    elif not isinstance(lengths, (bool, np.bool_)) or lengths:
        info["lengths"] = {}
    if filter is not None:
        info["filter"] = _filter_stages(sources, options, filter, info, coerce_int96_timestamp_unit)
    return info


def _check_row_counts(info: dict[str, Any]) -> None:
    """Sum the files' row counts exactly: the engine's int64 total saturates (two footers
    claiming 2**62 rows each made "-9223372036854775808 rows"; a negative claim is refused
    by the engine). A claim too large to load is shown (inspect describes the footers; a
    Loader refuses it)."""
    info["num_rows"] = sum(f["num_rows"] for f in info["files"])


def _filter_stages(sources: list[str], storage_options: dict[str, str], flt: Any,
                   info: Mapping[str, Any], int96_unit: str | None = None) -> dict[str, Any]:
    """What each stage of `flt` prunes: an engine opened on one loadable column."""
    from pqloader import _filter, _process
    from pqloader._options import LoaderOptions

    loadable = [c for c, how in info["loads_as"].items() if not how.startswith("unsupported")]
    options = LoaderOptions(columns=loadable[:1] or None, filter=flt, storage_options=storage_options,
                            seed=0, rank=0, world_size=1, coerce_int96_timestamp_unit=int96_unit)
    engine = _process.Engine(sources, options.to_engine())
    out = dict(engine.plan_info()["filter"])
    out["expression"] = _filter.describe(options.filter)
    return out


def write_index(source: str | os.PathLike[str],
                storage_options: Mapping[str, Any] | None = None,
                _progress: Any = None) -> dict[str, Any]:
    """Write a summary of the Parquet files below directory `source`, so that loaders
    take every file's row-group layout from one object instead of each file's footer.

    Two files are written at the directory's root, each to a temporary name and moved into
    place: ``_metadata`` (the summary pyarrow, Dask and Spark write and read: the row
    groups of every file, each naming its file) and ``_pqloader_index`` (each file's size,
    modification time and footer hash when indexed). A loader uses the summary for every
    file it holds whose listed size and time are unchanged, and reads the footers of the
    others (written or rewritten since); ``stats()["footers_from_summary"]`` counts the
    former. Run it again after changing the dataset.

    Args:
        source: A local directory or ``s3://bucket/prefix``.
        storage_options: As for :class:`pqloader.Loader`.

    Returns:
        ``metadata_path``, ``files``, ``row_groups``, ``rows`` and ``bytes`` (of ``_metadata``).

    Raises:
        ValueError: `source` is not a directory.
        pqloader.SchemaMismatchError: The files' Parquet schemas differ (a summary holds one).
        pqloader.Error: As for :class:`pqloader.Loader` (unreadable files, storage).
    """
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"source must be a directory path or URI, got {type(source).__name__}")
    sources = _env.normalize_sources(source)
    return _core.write_index(sources[0], _env.normalize_storage_options(storage_options), _progress)


def _check_lengths(lengths: Any) -> None:
    """Check the type of ``inspect(lengths=...)`` before any I/O."""
    if isinstance(lengths, (bool, np.bool_)):  # (np.bool_ as the Loader's flags take it)
        return
    if isinstance(lengths, str) or not isinstance(lengths, Sequence):
        raise TypeError(f"lengths must be a bool or a list of column names, got {lengths!r}")
    for name in lengths:
        if not isinstance(name, str):
            raise TypeError(f"lengths must name columns (str), got {name!r}")


def _length_columns(lengths: bool | Sequence[str], ragged: list[str]) -> list[str]:
    """The columns ``inspect(lengths=...)`` reads the lengths of."""
    if isinstance(lengths, (bool, np.bool_)):
        return list(ragged) if lengths else []
    out = []
    for name in lengths:
        if name not in ragged:
            raise ValueError(f"lengths: {name!r} is not a ragged list column; the ragged ones are "
                             f"{ragged}")
        if name not in out:
            out.append(name)
    return out
