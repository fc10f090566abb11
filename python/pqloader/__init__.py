"""pqloader: stream Parquet datasets into deep-learning training, fast and deterministically.

The engine is C++ (``pqloader._core``); this package checks arguments and wires it up.

Example:
    >>> import pqloader
    >>> for batch in pqloader.Loader("data/train", batch_size=512, shuffle=True, seed=1):
    ...     features = batch["features"]  # numpy.ndarray, no copy
"""

from pqloader import _native  # loads the extension first (RTLD_DEEPBIND beside a global Arrow)
from pqloader._filter import Predicate, parse_filter
from pqloader._errors import (
    ColumnNotFoundError,
    DataNotFoundError,
    Error,
    InvalidDataError,
    IOError,
    SchemaMismatchError,
    UnsupportedTypeError,
)
from pqloader import transforms
from pqloader._arrow import ArrowSchema
from pqloader._env import available_cpus
from pqloader._inspect import cache_clear, cache_prune, cache_stats, inspect, write_index
from pqloader._lists import Pack, Pad, Ragged
from pqloader._loader import Loader
from pqloader._mix import Mixture, mix
from pqloader._options import LoaderOptions
from pqloader._state import merge_states
from pqloader._stats_table import diagnose, format_stats

__version__ = "0.1.0"

__all__ = [
    "ArrowSchema",
    "Loader",
    "Mixture",
    "mix",
    "LoaderOptions",
    "Pack",
    "Predicate",
    "parse_filter",
    "Pad",
    "Ragged",
    "inspect",
    "write_index",
    "merge_states",
    "format_stats",
    "diagnose",
    "available_cpus",
    "transforms",
    "cache_stats",
    "cache_clear",
    "cache_prune",
    "Error",
    "IOError",
    "DataNotFoundError",
    "InvalidDataError",
    "SchemaMismatchError",
    "UnsupportedTypeError",
    "ColumnNotFoundError",
    "__version__",
]
