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


def cache_clear(cache_dir: str | os.PathLike[str]) -> None:
    """Delete every entry of a cache directory (never anything else).

    Args:
        cache_dir: A directory given as ``cache_dir`` to loaders.
    """
    _core.cache_clear(os.path.abspath(os.fspath(cache_dir)))


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
