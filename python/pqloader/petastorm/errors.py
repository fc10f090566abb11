"""Errors of pqloader.petastorm, each a subclass of the matching pqloader/builtin error."""

from __future__ import annotations

from pqloader._errors import DataNotFoundError, InvalidDataError


class UntrustedSchemaError(InvalidDataError):
    """The pickled Unischema (or row-group index) names something Petastorm never writes.

    pqloader does not execute pickles: it rebuilds only Petastorm's Unischema,
    UnischemaField, codecs, row-group indexers, NumPy dtypes and the Spark types they
    name, as plain objects. Anything else (another global, a persistent id, an extension
    code) is refused with this error and nothing of the pickle runs.
    """


class PetastormMetadataError(InvalidDataError):
    """The dataset has no (or unreadable) Petastorm metadata in ``_common_metadata``."""


class NoDataAvailableError(DataNotFoundError):
    """More shards than row groups, as Petastorm's error of the same name."""


__all__ = ["UntrustedSchemaError", "PetastormMetadataError", "NoDataAvailableError"]
