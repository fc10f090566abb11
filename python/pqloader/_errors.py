"""Exceptions raised by pqloader (each subclasses the matching builtin), and where its
warnings point."""

from __future__ import annotations

import builtins
import contextlib
import os
import sys
from typing import Iterator


class Error(Exception):
    """Base class of every pqloader error."""


class IOError(Error, builtins.OSError):  # noqa: A001 - deliberate, mirrors the builtin
    """Reading from storage failed."""


class DataNotFoundError(IOError, builtins.FileNotFoundError):
    """A path, directory or glob holds no data files, or a listed file is gone."""


class InvalidDataError(Error, ValueError):
    """A file is not Parquet, is truncated or corrupt, or holds values the loader refuses."""


class SchemaMismatchError(InvalidDataError):
    """Files disagree on the type (or presence) of a selected column."""


class UnsupportedTypeError(Error, TypeError):
    """A selected column has a type that cannot become a tensor."""


class ColumnNotFoundError(Error, KeyError):
    """A selected column does not exist."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def _not_utf8_path(e: UnicodeDecodeError) -> InvalidDataError:
    """The error for a path the engine found (a directory listing, a glob) whose name is
    not UTF-8: the engine's paths become ``str`` as UTF-8 where they cross into Python, so
    such a name fails there as a bare UnicodeDecodeError. Names the directory and the
    first component that is not UTF-8 (its bytes)."""
    raw = e.object if isinstance(e.object, bytes) else bytes(e.object)
    start = raw.rfind(b"/", 0, e.start) + 1
    end = raw.find(b"/", e.start)
    name = raw[start:] if end < 0 else raw[start:end]
    directory = os.fsdecode(raw[:start].rstrip(b"/") or raw[:start]) or "."
    return InvalidDataError(
        f"{directory!r} holds a file or directory whose name is not UTF-8: {name!r} "
        f"(shown as bytes); pqloader reads UTF-8 names only: rename or move it")


@contextlib.contextmanager
def utf8_paths() -> Iterator[None]:
    """Turn the UnicodeDecodeError of an engine call returning a path that is not UTF-8
    into a :class:`InvalidDataError` naming it."""
    try:
        yield
    except UnicodeDecodeError as e:
        raise _not_utf8_path(e) from None


def _arrow_file_under(sources: list[str], limit: int = 10000) -> bool:
    """Whether a local source is, or a local directory source holds, an ``.arrow`` file
    (its hidden entries left out, as the engine's listing leaves them; at most `limit`
    entries looked at)."""
    seen = 0
    for source in sources:
        if "://" in source:
            continue
        if source.endswith(".arrow") and os.path.isfile(source):
            return True
        if not os.path.isdir(source):
            continue
        for root, dirs, files in os.walk(source):
            dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
            if any(f.endswith(".arrow") for f in files):
                return True
            seen += len(files) + len(dirs)
            if seen > limit:
                break
    return False


def explain_arrow_files(message: str, sources: list[str]) -> str | None:
    """The engine's "not Parquet" refusal, with where ``.arrow`` files come from: Hugging
    Face ``datasets`` keeps a dataset as Arrow IPC streams (``save_to_disk``, its cache
    under ``~/.cache/huggingface/datasets``), which are not Parquet: the engine said only
    that no file was Parquet, or that one was "truncated, corrupt, or another format".

    Args:
        message: The text of the engine's ``DataNotFoundError`` or ``InvalidDataError``.
        sources: The normalised sources (see ``_env.normalize_sources``).

    Returns:
        The message with the hint, or None where no ``.arrow`` file is named or found.
    """
    if "is not a readable Parquet file" in message:  # names the file
        if ".arrow' is not a readable Parquet file" not in message:
            return None
    elif "no Parquet files found" not in message:
        return None
    elif ".arrow'" not in message and not _arrow_file_under(sources):  # 5 files named
        return None
    return (message + " ('.arrow' files are Arrow IPC, as Hugging Face datasets' save_to_disk and "
            "its cache write them, not Parquet: write Parquet with "
            "datasets.load_from_disk(dir).to_parquet(path), or ds.to_parquet(path) per shard)")


@contextlib.contextmanager
def arrow_files_hint(sources: list[str]) -> Iterator[None]:
    """Add :func:`explain_arrow_files`'s hint to an engine call's "not Parquet" error."""
    try:
        yield
    except (DataNotFoundError, InvalidDataError) as e:
        text = explain_arrow_files(str(e), sources)
        if text is None:
            raise
        raise type(e)(text) from None


__all__ = [
    "Error",
    "IOError",
    "DataNotFoundError",
    "InvalidDataError",
    "SchemaMismatchError",
    "UnsupportedTypeError",
    "ColumnNotFoundError",
]


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_stacklevel() -> int:
    """``warnings.warn``'s stacklevel, called from the function that warns, for the first
    frame outside pqloader: the user's line. (Fixed stacklevels named pqloader's own
    frames for the usual callers: ``len(mixture)`` and ``for`` loops named ``_mix.py``.)"""
    frame = sys._getframe(2)  # the caller of the function that warns (stacklevel 2)
    level = 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level
