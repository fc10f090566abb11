"""Functions that look at datasets and cache directories without a Loader."""

from __future__ import annotations

import os
from typing import Any, Mapping

from pqloader import _core, _env
from pqloader._env import Source


def cache_stats(cache_dir: str | os.PathLike[str]) -> dict[str, int]:
    """Describe a cache directory.

    Args:
        cache_dir: A directory given as ``cache_dir`` to loaders.

    Returns:
        Entries, bytes and temp files, plus the hit/miss counts recorded by loaders
        that used it.
    """
    return dict(_core.cache_stats(os.path.abspath(os.fspath(cache_dir))))


def cache_clear(cache_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Delete the entries of a cache directory, and only what pqloader provably wrote.

    A cache directory carries a ``PQLOADER_CACHE`` marker file, written when a loader
    creates it (or finds it empty). Deleted: entry files whose header is an entry's
    (magic and own key), footers whose checksum verifies, temp files, shard locks and
    records. Anything else (files of other programs, directories pqloader did not make,
    symbolic links) is left alone and listed in ``foreign``. The directory and its
    marker stay.

    Args:
        cache_dir: A directory given as ``cache_dir`` to loaders.

    Returns:
        ``entries`` and ``bytes`` deleted, ``other_files`` (footers, temp files, locks,
        records) deleted, ``foreign`` (up to 10 paths left alone) and ``foreign_count``.

    Raises:
        pqloader.InvalidDataError: `cache_dir` is not empty and has no marker file (it is
            not a pqloader cache); nothing was deleted.
        pqloader.IOError: `cache_dir` is not a directory, or a file could not be deleted.

    Example:
        >>> pqloader.cache_clear("/tmp/pqcache")["entries"]
        12
    """
    return dict(_core.cache_clear(os.path.abspath(os.fspath(cache_dir))))


def inspect(source: Source, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Describe a dataset without reading its data pages.

    Args:
        source: As for :class:`pqloader.Loader`.
        storage_options: As for :class:`pqloader.Loader`.

    Returns:
        A dict with ``files`` (path, num_rows, num_row_groups, size_bytes, compression,
        created_by), ``schema`` (column -> Arrow type), ``loads_as`` (column -> what the
        loader yields, or "unsupported"), ``num_rows``, ``num_row_groups``, ``num_files``.

    Raises:
        TypeError, ValueError: `source` or `storage_options` is malformed.
        pqloader.Error: As for :class:`pqloader.Loader`.

    Example:
        >>> pqloader.inspect("data/train")["num_rows"]
        1000000
    """
    return _core.inspect(_env.normalize_sources(source), _env.normalize_storage_options(storage_options))
