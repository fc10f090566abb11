"""Exceptions raised by pqloader. Each subclasses the matching builtin."""

from __future__ import annotations

import builtins


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


__all__ = [
    "Error",
    "IOError",
    "DataNotFoundError",
    "InvalidDataError",
    "SchemaMismatchError",
    "UnsupportedTypeError",
    "ColumnNotFoundError",
]
