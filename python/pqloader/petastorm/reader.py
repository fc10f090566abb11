"""``make_reader`` / ``make_batch_reader`` with Petastorm's parameters, on pqloader's engine.

A :class:`Reader` is a recipe for a :class:`pqloader.Loader`: the dataset's files, the
columns to load (the schema view plus predicate fields), the C++ ops that decode each
codec, a row-group selection (``rowgroup_selector``, and row groups where the predicate
keeps nothing), and the Loader options Petastorm's parameters map to. Iterating it
yields rows as namedtuples (``make_reader``) or batches as namedtuples of arrays
(``make_batch_reader``); ``pqloader.petastorm.pytorch.DataLoader`` asks it for whole
batches of the size it wants instead, with no per-row Python.

Per batch, in order, in the Loader's batch_transform thread: gray images lose their
channel axis, scalars take their field's NumPy type, strings become ``np.str_`` arrays
(``make_batch_reader``) or lists of ``np.str_`` (``make_reader``), the predicate filters
rows, ``TransformSpec.func`` runs (per row for ``make_reader``, on a pandas DataFrame for
``make_batch_reader``), removed and selected fields apply.
"""

from __future__ import annotations

import datetime
import functools
import math
import warnings
import weakref
from decimal import Decimal
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from pqloader import _env, _errors
from pqloader.petastorm import _dataset
from pqloader.petastorm.codecs import CompressedImageCodec
from pqloader.petastorm.errors import NoDataAvailableError
from pqloader.petastorm.predicates import batch_mask, isin_exact
from pqloader.petastorm.transform import TransformSpec, transform_schema
from pqloader.petastorm.unischema import Unischema, UnischemaField, is_numpy_scalar_type

LOCAL_DISK_CACHE = "local-disk"
NULL_CACHE = "null"
ROWS_PER_READ = 128        # make_reader: rows decoded per engine batch
BATCH_READER_ROWS = 1024   # make_batch_reader: rows per yielded batch

_warned: set[str] = set()


def _warn_once(function: str, name: str, advice: str) -> None:
    """Warn, once per process and parameter, that a parameter is not mapped."""
    if name in _warned:
        return
    _warned.add(name)
    warnings.warn(f"pqloader.petastorm.{function}({name}=...) has no pqloader equivalent and is "
                  f"ignored: {advice}", UserWarning, stacklevel=_errors.user_stacklevel())


# Petastorm parameters without an equivalent: (is it set to something else than the
# default?, what to do instead).
_UNMAPPED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "reader_pool_type": (lambda v: v not in ("thread", "dummy"),
                         "pqloader decodes in C++ threads without the GIL, so processes are not "
                         "needed; workers_count sets the threads"),
    "pyarrow_serialize": (bool, "nothing is serialized between workers"),
    "shuffle_row_drop_partitions": (lambda v: v != 1,
                                    "use DataLoader(shuffling_queue_capacity=...) or "
                                    "loader_options={'shuffle_window': k} (rows of k row groups "
                                    "are shuffled together, each row group read once)"),
    "shard_seed": (lambda v: v is not None,
                   "shards are equal row ranges of each epoch's order, which follows seed"),
    "cache_row_size_estimate": (lambda v: v is not None,
                                "not needed: the cache keeps whole decoded row groups at their size"),
    "cache_extra_settings": (bool, "use loader_options={'cache_policy': 'lru', 'cache_shards': n}"),
    "hdfs_driver": (lambda v: v != "libhdfs3",
                    "hdfs:// URLs are opened by Arrow's HDFS filesystem (libhdfs)"),
    "zmq_copy_buffers": (lambda v: v is not True, "there are no worker processes"),
    "convert_early_to_numpy": (bool, "batches are NumPy arrays from the start"),
}


def _check_unmapped(function: str, given: Mapping[str, Any]) -> None:
    for name, (is_set, advice) in _UNMAPPED.items():
        if name in given and is_set(given[name]):
            _warn_once(function, name, advice)


class _FiltersPredicate:
    """pyarrow-style DNF ``filters`` ([(col, op, value)] or [[...], [...]]) as a row predicate."""

    _OPS = {"=": np.equal, "==": np.equal, "!=": np.not_equal, "<": np.less, ">": np.greater,
            "<=": np.less_equal, ">=": np.greater_equal}

    def __init__(self, filters: Sequence[Any]) -> None:
        def term(t: Any) -> bool:
            return isinstance(t, Sequence) and not isinstance(t, (str, bytes))

        if not term(filters) or not filters:
            raise ValueError(f"filters must be a non-empty list of (column, op, value) tuples, got {filters!r:.100}")
        # One conjunction where its first item is a term, as pyarrow reads filters (its
        # filters_to_expression: filters[0][0] a column name): [["id", "<", 3]] is
        # [("id", "<", 3)], not a group of three terms ("'int' object is not iterable"),
        # and [(("a", "<", 1),), (("b", ">", 2),)] two groups (OR), not one term.
        first = filters[0]
        groups = [filters] if term(first) and first and isinstance(first[0], str) else list(filters)
        for g in groups:
            if not term(g) or not g or not all(term(t) for t in g):
                raise ValueError(f"filters must be a list of (column, op, value) tuples, or a list of such "
                                 f"lists (OR of ANDs), got {filters!r:.200}")
        self._groups = [[tuple(t) for t in g] for g in groups]
        # Columns the files store in a type other than a date (set by the Reader): a date
        # value compared with one is refused, not taken as a count of days.
        self.not_dates: frozenset[str] = frozenset()
        for group in self._groups:
            for t in group:
                if len(t) != 3 or (t[1] not in self._OPS and t[1] not in ("in", "not in")):
                    raise ValueError(f"filter {t!r} is not (column, op, value) with op one of "
                                     f"{sorted(self._OPS) + ['in', 'not in']}")

    def get_fields(self) -> set[str]:
        return {t[0] for g in self._groups for t in g}

    def mask(self, columns: Mapping[str, Any]) -> np.ndarray:
        out = None
        for group in self._groups:
            m = None
            for col, op, value in group:
                data = np.asarray(columns[col])
                # The row-group pre-pass hands a column holding nulls over as objects with
                # None; a null matches no comparison but `not in`, as in pyarrow (the engine then
                # refuses the nulls of the row groups kept, naming the column).
                valid = (np.fromiter((v is not None for v in data), bool, len(data))
                         if data.dtype == object else None)
                if valid is not None and not valid.all():
                    data = np.asarray(data[valid].tolist()) if valid.any() else data[:0]
                if op in ("in", "not in"):
                    values = [_as_column_value(data, v, col, col not in self.not_dates) for v in value]
                    if data.dtype.kind == "f" and values and all(
                            isinstance(v, (int, float, np.number)) and not isinstance(v, (bool, np.bool_))
                            for v in values):
                        # pyarrow casts the value set to the column's type (0.1 → float32(0.1)).
                        with np.errstate(over="ignore"):
                            hit = np.isin(data, np.array(values, dtype=data.dtype))
                    else:
                        hit = isin_exact(data, values)
                    hit = hit if op == "in" else ~hit
                else:
                    value = _as_column_value(data, value, col, col not in self.not_dates)
                    if data.dtype.kind == "f" and data.dtype.itemsize < 8 and isinstance(value, float):
                        # pyarrow compares a float32 column with a Python float as doubles;
                        # NumPy would round the literal to float32 (float32(0.1) == 0.1).
                        data = data.astype(np.float64)
                    try:
                        hit = self._OPS[op](data, value)
                    except TypeError as e:  # NumPy's UFuncTypeError: str column vs int, ...
                        raise TypeError(f"filter {(col, op, value)!r} compares column {col!r} ({data.dtype}) "
                                        f"with a {type(value).__name__}, which cannot be compared") from e
                if valid is not None and not valid.all():
                    # pyarrow: a null is in no set, so `not in` keeps it (~is_in).
                    full = np.full(len(valid), op == "not in", dtype=bool)
                    full[valid] = hit
                    hit = full
                m = hit if m is None else m & hit
            out = m if out is None else out | m
        return np.asarray(out, dtype=bool)

    def do_include(self, values: Mapping[str, Any]) -> bool:
        return bool(self.mask({k: [v] for k, v in values.items()})[0])


def pa_types_plain_number(arrow_type: Any) -> bool:
    """Whether a pyarrow type is an integer, float or bool column (read as its NumPy dtype)."""
    import pyarrow as pa
    return pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or pa.types.is_boolean(arrow_type)


def _as_loaded(column: Any, decimals: str = "float64") -> Any:
    """A pyarrow column in the type the engine loads it as, so that the row-group pre-pass
    sees the values the batches hold: dates, times, timestamps and durations as their
    int32 / int64 counts, decimals as float64, or with ``decimals="int64"`` as their
    unscaled int64 (not datetime or Decimal objects, which an ``in_set`` of counts or a
    float ``filters`` value never equals)."""
    import pyarrow as pa

    t = column.type
    if pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_duration(t):
        return column.cast(pa.int32() if t.bit_width == 32 else pa.int64())
    if pa.types.is_decimal(t):
        if decimals == "int64" and t.precision <= 18 and t.scale >= 0:  # value x 10**scale, exactly
            import pyarrow.compute as pc
            return pc.multiply(column, pa.scalar(10 ** t.scale, pa.int64())).cast(pa.int64())
        return column.cast(pa.float64())
    return column


def _as_column_value(data: np.ndarray, value: Any, column: str = "", date: bool = True) -> Any:
    """A filter's date literal as the column holds it: pqloader hands dates out as int32
    days since 1970 (pyarrow compares a date32 column with a ``datetime.date``). `date`:
    whether `column` may be a date column (False: the files store it as another type, such
    as a time of day or an int32, which a date is not compared with, as in pyarrow)."""
    if isinstance(value, datetime.datetime):
        if data.dtype.kind in "iu":
            raise TypeError(f"filters compare {value!r} with an integer column: timestamps are "
                            f"int64 counts of the column's unit since 1970 here; give the count")
        return value
    if isinstance(value, datetime.date) and data.dtype == np.int32:
        if not date:
            raise TypeError(f"filters compare {value!r} with column {column!r}, which is not a date "
                            f"column (pyarrow has no such comparison)")
        return (value - datetime.date(1970, 1, 1)).days
    return value


def _take(column: Any, mask: np.ndarray) -> Any:
    if isinstance(column, np.ndarray):
        return column[mask]
    return [v for v, keep in zip(column, mask) if keep]


def _stack(values: list, field: UnischemaField | None, text_array: bool = True) -> Any:
    """Rows' values of one field back into a column: an array when they stack, else a list
    (strings: a ``np.str_`` array, or with `text_array` False the list itself)."""
    if not values:
        dtype = None
        if field is not None and isinstance(field.numpy_dtype, type) and issubclass(field.numpy_dtype, np.generic):
            dtype = field.numpy_dtype
        shape = tuple(d or 0 for d in (field.shape if field is not None else ()))
        return np.empty((0,) + shape, dtype=dtype)
    if text_array and all(isinstance(v, str) for v in values):
        return np.array(values, dtype=np.str_)
    first = values[0]
    if isinstance(first, (np.ndarray, np.generic, int, float, bool)) and not isinstance(first, Decimal):
        arrays = [np.asarray(v) for v in values]
        if all(a.shape == arrays[0].shape and a.dtype == arrays[0].dtype for a in arrays) and \
                arrays[0].dtype.kind not in "OSU":
            return np.stack(arrays)
    return values


class Reader:
    """Rows or batches of a Petastorm dataset, read by a pqloader Loader.

    Made by :func:`make_reader` / :func:`make_batch_reader`; iterate it, or hand it to
    ``pqloader.petastorm.pytorch.DataLoader``. Attributes follow Petastorm's Reader:
    ``schema`` (the output Unischema), ``batched_output``, ``last_row_consumed``,
    ``num_epochs``; ``seed`` is the shuffle seed (drawn when None was given).
    """

    def __init__(self, ds: _dataset.PetastormDataset, storage_schema: Unischema, *, batched: bool,
                 decode_codecs: bool, predicate: Any, rowgroup_selector: Any, transform_spec: TransformSpec | None,
                 loader_kwargs: dict[str, Any], num_epochs: int | None) -> None:
        from pqloader import Loader

        self.dataset = ds
        self.is_batched_reader = batched
        self.num_epochs = num_epochs
        self._storage_schema = storage_schema
        self._predicate = predicate
        self._predicate_description = describe_predicate(predicate)
        self._transform_spec = transform_spec
        self._transform_description = describe_transform_spec(transform_spec)
        self.schema = transform_schema(storage_schema, transform_spec) if transform_spec else storage_schema
        self.ngram = None
        names = list(storage_schema.fields)
        self._predicate_only: list[str] = []
        if predicate is not None:
            fields = sorted(predicate.get_fields())
            if not fields:
                raise ValueError("At least one field name must be returned by predicate's get_field() method")
            self._predicate_only = [f for f in fields if f not in names]
        self._columns = names + self._predicate_only
        self._transforms: dict[str, list] = {}
        self._squeeze: set[str] = set()
        self._casts: dict[str, Any] = {}
        all_fields = self._all_fields()
        for name in self._columns:
            field = all_fields.get(name)
            if field is None:
                continue
            if decode_codecs and field.numpy_dtype is Decimal:
                # The engine reads decimals as float64 (the nearest double), where Petastorm
                # returns Decimal objects: refused rather than rounded silently.
                raise _errors.UnsupportedTypeError(
                    f"field {name!r} of '{ds.sources[0]}' is a Decimal ({field.codec}): pqloader.petastorm "
                    "does not return Decimal objects (the engine reads decimals as float64, the nearest "
                    "double); leave it out of schema_fields and predicates, or read it as float64 with "
                    "make_batch_reader")
            if decode_codecs and field.codec is not None:
                try:
                    ops = field.codec.engine_ops(field)
                except _errors.UnsupportedTypeError as e:  # (named the field, not the dataset)
                    raise _errors.UnsupportedTypeError(f"'{ds.sources[0]}': {e}") from None
                if ops:
                    self._transforms[name] = ops
                if isinstance(field.codec, CompressedImageCodec) and len(field.shape) == 2:
                    self._squeeze.add(name)
            if (field.codec is None or not self._transforms.get(name)) and field.shape == () and \
                    is_numpy_scalar_type(field.numpy_dtype) and field.numpy_dtype is not Decimal and \
                    np.dtype(field.numpy_dtype).kind in "biuf":
                self._casts[name] = np.dtype(field.numpy_dtype)
        # The pre-pass reads INT96 timestamps in the unit the Loader loads them in.
        self._int96_unit = loader_kwargs.get("coerce_int96_timestamp_unit") or "ns"
        filters = predicate if isinstance(predicate, _FiltersPredicate) else \
            predicate._b if isinstance(predicate, _BothPredicates) else None
        if filters is not None and ds.files:
            # (a date compared with a time32 or int32 column was taken as days, silently)
            # Every file's footer: a column the first file lacks (or stores otherwise) may
            # be an int32 in a later one.
            import pyarrow as pa
            wanted = filters.get_fields()
            not_dates: set[str] = set()
            for i in range(len(ds.files)):
                stored = ds.footer(i).schema.to_arrow_schema()
                not_dates.update(f.name for f in stored if f.name in wanted and not pa.types.is_date(f.type))
            filters.not_dates = frozenset(not_dates)
        # And decimals as it does (``decimals="int64"``: unscaled integers, not float64).
        self._decimals = loader_kwargs.get("decimals") or "float64"
        self._row_groups = self._select_row_groups(rowgroup_selector)
        options = dict(loader_kwargs)
        options.setdefault("batch_size", BATCH_READER_ROWS if batched else ROWS_PER_READ)
        try:
            self._loader = Loader(self.dataset.sources, columns=self._columns,
                                  transforms=self._transforms or None, row_groups=self._row_groups,
                                  storage_options=ds.storage or None, num_epochs=num_epochs,
                                  batch_transform=self._process, **options)
        except _errors.InvalidDataError as e:
            # The engine's hint names Loader arguments; here they go in loader_options.
            import re

            text = re.sub(r"pass fill_null=(\{.*?\}) to replace them, null_mask=(\[.*?\]) to add",
                          r"pass loader_options={'fill_null': \1} to replace them, "
                          r"loader_options={'null_mask': \2} to add", str(e))
            if text == str(e):
                raise
            raise type(e)(text) from None
        o, plan = self._loader.options, self._loader._plan
        self._add_null_masks(transform_spec)
        if o.world_size > 1 and plan["num_rows"] == 0 and plan["dataset_rows"] > 0:
            # Petastorm raises when a shard gets nothing (more shards than row groups).
            raise NoDataAvailableError(
                f"shard {o.rank} of {o.world_size} has no rows: the dataset's "
                f"{plan['dataset_rows']} rows in equal shares leave none for it; use fewer shards")
        if o.world_size > 1 and plan.get("dropped"):
            # Petastorm's shards read every row; equal shares leave some out of each epoch
            # (the same ones every epoch when nothing is shuffled): said, not silent.
            warnings.warn(
                f"cur_shard/shard_count: equal shards of the {plan['dataset_rows']} rows leave {plan['dropped']} "
                f"row(s) out of each epoch (shard_policy='drop'; "
                f"{'other rows each epoch' if o.shuffle else 'the same rows every epoch, as nothing is shuffled'}); "
                "Petastorm's shards read every row, in shares of unequal sizes. "
                "Pass loader_options={'shard_policy': 'pad'} to repeat rows instead", stacklevel=3)
        # The DataLoaders' Loaders (loader_for), for stop(); weakly: one of a DataLoader
        # that is gone is freed with it (held for good, each kept its threads, footers
        # and read-ahead until the reader stopped: a DataLoader per epoch grew without bound).
        self._loaders: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._iterator: Iterator[Any] | None = None
        # The batch the Loader last handed out, while its rows (or, batched, itself) are
        # handed out here: [make one item (index -> item), next index, count]. It outlives
        # an iterator that an error or Ctrl-C ended (see __next__), so that the next call
        # yields the rest of it (the Loader's position is already after it).
        self._held: list[Any] | None = None
        # The epoch the running iteration stops before, and one for the iteration that an
        # error in next() left to the next call (see __next__).
        self._iteration_end: int | None = None
        self._resume_end: int | None = None
        self.last_row_consumed = False
        self.stopped = False

    # -- set-up ------------------------------------------------------------------------
    def _add_null_masks(self, transform_spec: TransformSpec | None) -> None:
        """The ``<name>_valid`` columns that ``loader_options={"null_mask": ...}`` adds, as
        fields after theirs (bool, true where the row is not null): left out, the nulls
        had come out as 0 / "" with nothing to tell them from real values."""
        info = self._loader.column_info
        masked = {name for name in self._storage_schema.fields
                  if info.get(f"{name}_valid", {}).get("mask") and f"{name}_valid" not in self._storage_schema.fields}
        if not masked:
            return
        fields = []
        for name, field in self._storage_schema.fields.items():
            fields.append(field)
            if name in masked:
                fields.append(UnischemaField(f"{name}_valid", np.bool_, (), None, False))
        self._storage_schema = Unischema(self._storage_schema._name, fields)
        self.schema = transform_schema(self._storage_schema, transform_spec) if transform_spec else \
            self._storage_schema
        self._columns = list(self._storage_schema.fields) + self._predicate_only

    def _all_fields(self) -> dict[str, UnischemaField]:
        fields = dict(self._storage_schema.fields)
        if self.dataset.unischema is not None:
            for name in self._predicate_only:
                if name in self.dataset.unischema.fields:
                    fields[name] = self.dataset.unischema.fields[name]
        return fields

    def _select_row_groups(self, selector: Any) -> dict[str, list[int]] | None:
        """Row groups to read: those the selector picks, less those the predicate empties.

        The predicate's pre-pass reads only the predicate columns (pyarrow, one row group
        at a time), decodes them with the fields' codecs and evaluates the predicate on
        the whole row group; rows of the row groups kept are filtered again per batch.
        """
        if selector is None and self._predicate is None:
            return None
        pieces = self.dataset.pieces()
        keep = set(range(len(pieces)))
        if selector is not None:
            from pqloader.petastorm.selectors import RowGroupSelectorBase

            if not isinstance(selector, RowGroupSelectorBase) and not hasattr(selector, "select_row_groups"):
                raise ValueError("rowgroup_selector parameter is expected to be derived from RowGroupSelectorBase")
            indexes = self.dataset.indexes()
            missing = set(selector.get_index_names()) - set(indexes)
            if missing:
                raise ValueError(f"Some of required indexes {sorted(missing)} are not available in {sorted(indexes)}")
            keep &= {int(i) for i in selector.select_row_groups(indexes)}
        if self._predicate is not None:
            keep = {p for p in keep if self._piece_matches(*pieces[p])}
        selected: dict[str, list[int]] = {f.name: [] for f in self.dataset.files}
        for p in sorted(keep):
            i, rg = pieces[p]
            selected[self.dataset.files[i].name].append(rg)
        if not keep:
            warnings.warn("No matching data is available for loading after rowgroup selector "
                          "and predicate were applied.")
        return selected

    def _piece_matches(self, i: int, rg: int) -> bool:
        fields = sorted(self._predicate.get_fields())
        try:
            table = self.dataset.read_row_group(i, rg, fields, self._int96_unit)
        except _errors.InvalidDataError:  # a value the Loader's unit cannot hold
            raise
        except (KeyError, ValueError):
            return True
        # A field the file does not hold (pyarrow leaves a column it cannot find out of the
        # table, silently): a partition key (in the path only) is decided per batch only;
        # any other is null in every row of the file, as the engine reads it.
        parts = self.dataset.files[i].relative.split("/")
        if any(name not in table.column_names and any(p.startswith(name + "=") for p in parts)
               for name in fields):
            return True
        all_fields = self._all_fields()
        columns: dict[str, Any] = {}
        for name in fields:
            if name not in table.column_names:
                columns[name] = np.full(table.num_rows, None, dtype=object)
                continue
            column = _as_loaded(table.column(name), self._decimals)
            if pa_types_plain_number(column.type) and column.null_count == 0:
                # In its own dtype: a list of large ints became float64, where neighbours are equal.
                columns[name] = self._fix(name, column.to_numpy())
                continue
            values = column.to_pylist()
            if pa_types_plain_number(column.type):
                # Nulls: objects, but each value a scalar of the column's dtype, so that
                # mask() compares it as it does a batch's (float32 `in` in float32, ...).
                dtype = self._casts.get(name, np.dtype(column.type.to_pandas_dtype()))
                columns[name] = np.array([None if v is None else dtype.type(v) for v in values], dtype=object)
                continue
            field = all_fields.get(name)
            if field is not None and field.codec is not None and self._transforms.get(name) is not None:
                values = [None if v is None else field.codec.decode(field, v) for v in values]
                columns[name] = _stack(values, field)
            else:
                columns[name] = self._fix(name, _stack(values, field, False) if values else np.empty(0))
        return bool(batch_mask(self._predicate, columns, table.num_rows).any())

    # -- per batch ----------------------------------------------------------------------
    def _fix(self, name: str, column: Any) -> Any:
        if name in self._squeeze and isinstance(column, np.ndarray) and column.ndim == 4 and column.shape[-1] == 1:
            column = column.reshape(column.shape[:-1])
        elif name in self._casts and isinstance(column, np.ndarray) and column.dtype != self._casts[name]:
            column = column.astype(self._casts[name])
        elif isinstance(column, list) and column and isinstance(column[0], str):
            # make_reader: one np.str_ per row, as Petastorm's decode gives: an array is as
            # wide as the batch's longest string (one 2 MB text made each batch of 128 rows
            # a 1 GB array) and drops trailing NULs.
            column = np.array(column, dtype=np.str_) if self.is_batched_reader else [np.str_(v) for v in column]
        return column

    def _rows_of(self, batch: Mapping[str, Any], name: str) -> Any:
        """A column of a batch; a ragged list (``lists={name: 'ragged'}``: values and
        ``<name>_offsets``) as one array per row, as pyarrow's ``to_numpy`` gives a list
        column (an object array), not its values of all rows run together."""
        offsets = batch.get(f"{name}_offsets")
        if offsets is None or f"{name}_offsets" in self._columns:
            return batch[name]
        values = batch[name]
        rows = np.empty(len(offsets) - 1, dtype=object)
        for i in range(len(rows)):
            rows[i] = values[offsets[i]:offsets[i + 1]]
        return rows

    def _process(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Engine batch → output columns (see the module docstring)."""
        columns = {name: self._fix(name, self._rows_of(batch, name)) for name in self._columns}
        n = len(next(iter(columns.values()))) if columns else 0
        if self._predicate is not None:
            mask = batch_mask(self._predicate, columns, n)
            if not mask.all():
                columns = {k: _take(v, mask) for k, v in columns.items()}
        for name in self._predicate_only:
            del columns[name]
        spec = self._transform_spec
        if spec is not None:
            if self.is_batched_reader and columns and not len(next(iter(columns.values()))):
                # The predicate kept no row: Petastorm publishes nothing and never calls
                # func (with an empty DataFrame); the empty batch keeps the output schema.
                return {name: _stack([], field) for name, field in self.schema.fields.items()}
            columns = self._transform_batch(columns) if self.is_batched_reader else self._transform_rows(columns)
        return columns

    def _transform_rows(self, columns: dict[str, Any]) -> dict[str, Any]:
        spec = self._transform_spec
        n = len(next(iter(columns.values()))) if columns else 0
        rows = []
        for i in range(n):
            row = {k: (v[i].copy() if isinstance(v, np.ndarray) and v.ndim > 1 else v[i]) for k, v in columns.items()}
            if spec.func is not None:
                row = spec.func(row)
                if not isinstance(row, Mapping):
                    raise TypeError(f"TransformSpec func {_func_name(spec.func)} returned "
                                    f"{type(row).__name__}, not the row (a dict of field values)")
            for name in spec.removed_fields:
                row.pop(name, None)
            rows.append(row)
        fields = self.schema.fields
        for row in rows:
            missing = [name for name in fields if name not in row]
            if missing and spec.func is None:
                raise TypeError(f"TransformSpec without a func: its edit_fields declare field(s) {missing} "
                                "that no func adds")
            if missing:
                # (a bare KeyError naming the field had said neither what nor where)
                raise TypeError(f"TransformSpec func {_func_name(spec.func)} returned a row without "
                                f"field(s) {missing} of the transformed schema {list(fields)}: return them, "
                                "or list them in removed_fields")
        return {name: _stack([r[name] for r in rows], fields[name], False) for name in fields}

    def _transform_batch(self, columns: dict[str, Any]) -> dict[str, Any]:
        import pandas as pd

        spec = self._transform_spec
        frame = pd.DataFrame({k: (list(v) if isinstance(v, np.ndarray) and v.ndim > 1 else v)
                              for k, v in columns.items()})
        if spec.func is not None:
            frame = spec.func(frame)
        for name in set(frame.columns) & set(spec.removed_fields):
            del frame[name]
        fields = self.schema.fields
        missing = set(fields) - set(frame.columns)
        if missing:
            raise ValueError(f"Transformed result columns ({','.join(frame.columns)}) do not match "
                             f"required schema columns({','.join(fields)})")
        out = {}
        for name, field in fields.items():
            values = frame[name].to_numpy()
            if values.dtype == object:
                values = _stack(list(values), field)
            if isinstance(values, np.ndarray) and values.dtype.kind in "biuf" and \
                    is_numpy_scalar_type(field.numpy_dtype) and field.numpy_dtype is not Decimal and \
                    np.dtype(field.numpy_dtype).kind in "biuf" and values.dtype != field.numpy_dtype:
                # A column comes out in its declared type, when that type holds its values
                # (Petastorm's from_pandas keeps the func's type: an int64 for an int32 field,
                # a float64 for an int32 one). A cast that would change values (10.5 → 10,
                # 300 → 44 in a uint8, 1e300 → inf in a float32) had done so silently.
                values = _cast_exactly(values, np.dtype(field.numpy_dtype), name, spec.func)
            out[name] = values
        return out

    # -- loaders ----------------------------------------------------------------------
    def _rows_per_row_group(self) -> float:
        plan = self._loader._plan
        return max(1.0, plan["dataset_rows"] / max(1, plan["num_row_groups"]))

    def loader_for(self, batch_size: int, shuffling_queue_capacity: int = 0, num_epochs: Any = ...) -> Any:
        """A Loader of this reader's data in batches of `batch_size` (for the DataLoaders).

        ``shuffling_queue_capacity`` > 0 shuffles rows across enough row groups to hold
        that many rows (``shuffle_window``), with the reader's seed.
        """
        from pqloader import Loader

        changes: dict[str, Any] = {"batch_size": batch_size}
        if shuffling_queue_capacity > 0:
            changes["shuffle"] = True
            changes["shuffle_window"] = max(self._loader.options.shuffle_window if self._loader.options.shuffle else 1,
                                            math.ceil(shuffling_queue_capacity / self._rows_per_row_group()))
        if num_epochs is not ...:
            changes["num_epochs"] = num_epochs
        loader = Loader(self._loader.sources, **self._loader.options.replace(**changes).to_kwargs())
        self._loaders.add(loader)
        return loader

    @property
    def loader(self) -> Any:
        """The pqloader Loader behind plain iteration."""
        return self._loader

    @property
    def seed(self) -> int:
        return self._loader.seed

    @property
    def batched_output(self) -> bool:
        return self.is_batched_reader

    @property
    def diagnostics(self) -> dict[str, Any]:
        return self._loader.stats()

    # -- iteration ----------------------------------------------------------------------
    def _items(self) -> Iterator[Any]:
        schema = self.schema
        names = list(schema.fields)
        make = schema._get_namedtuple()
        wrap = {n: f.numpy_dtype for n, f in schema.fields.items() if f.numpy_dtype in (np.bytes_,)}
        cursor = self._loader._cursor
        # First the rest of a batch an error or Ctrl-C in next() interrupted: the Loader
        # counted it as handed out, so it is nowhere else (its rows were dropped).
        yield from self._held_items()
        self._iteration_end = self._resume_end  # (None: num_epochs from the position, or known at the first batch)
        if self._resume_end is not None:  # after an error in next(): the rest of that iteration
            with cursor.lock:
                cursor.resume_end, self._resume_end = self._resume_end, None
        for columns in self._loader:
            self._iteration_end = cursor.active_end
            if self.is_batched_reader:
                if names and not len(columns[names[0]]):
                    continue  # every row filtered out: Petastorm yields no empty batch
                self._held = [lambda _, c=columns: make(**{n: c[n] for n in names}), 0, 1]
            else:
                cols = [columns[n] for n in names]

                def row(i: int, cols: list = cols) -> Any:
                    values = [c[i] for c in cols]
                    if wrap:
                        values = [wrap[n](v) if n in wrap else v for n, v in zip(names, values)]
                    return make(*values)

                self._held = [row, 0, len(cols[0]) if cols else 0]
            yield from self._held_items()

    def _held_items(self) -> Iterator[Any]:
        """The items of the held batch not yet handed out; each counts as handed out
        once made (a Ctrl-C while one is made leaves it to the next call)."""
        held = self._held
        while held is not None and held[1] < held[2]:
            item = held[0](held[1])
            held[1] += 1
            yield item
        self._held = None

    def __iter__(self) -> Reader:
        return self

    _STOPPED = ("Trying to read a sample after a reader created by make_reader/make_batch_reader "
                "has stopped. This may happen if the make_reader/make_batch_reader context "
                "manager has exited but you try to fetch a sample from it anyway")

    def __next__(self) -> Any:
        if self.stopped:
            raise RuntimeError(self._STOPPED)
        if self._iterator is None:
            self._iterator = self._items()
        try:
            return next(self._iterator)
        except StopIteration:
            self.last_row_consumed = True
            raise
        except BaseException as e:
            if isinstance(e, RuntimeError) and self.stopped:  # stop() from another thread, while this one read
                raise RuntimeError(self._STOPPED) from None
            # An error or Ctrl-C in next() ended the generator, not the reading: the next
            # call goes on after the last batch handed out, up to where this iteration
            # would have stopped (as Petastorm's reader reads on), not StopIteration.
            self._iterator = None
            self._resume_end = self._iteration_end
            raise

    next = __next__

    def reset(self) -> None:
        """Read again from the start (the next epochs, in a new order when shuffling).

        Raises:
            NotImplementedError: Called before the last row was read (as Petastorm).
        """
        if not self.last_row_consumed:
            raise NotImplementedError("Currently do not support resetting a reader while in the middle of "
                                      "iteration. You can call reset only after all samples were consumed.")
        self.last_row_consumed = False
        self._iterator = None
        self._held = None

    def stop(self) -> None:
        """Stop reading (the engine's threads stop). From another thread while one reads,
        that one's next read raises, as after stop()."""
        self.stopped = True
        if self._iterator is not None:
            try:
                self._iterator.close()  # type: ignore[attr-defined]
            except ValueError:  # "generator already executing": another thread is reading
                pass
        # Every Loader, the DataLoaders' (loader_for) too: leaving `with DataLoader(...)`
        # stops the reader, and with it, as in Petastorm, the reading; a running iterator
        # stops (the reader raises, see __next__).
        for loader in [self._loader, *self._loaders]:
            loader.close()

    def join(self) -> None:
        """Nothing to join: stop() already stopped the engine's threads."""

    def cleanup_cache(self) -> None:
        """Kept for Petastorm compatibility: pqloader's cache is meant to outlive a reader
        (``pqloader cache clear DIR`` empties it)."""

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        self.join()

    def __reduce__(self) -> Any:
        # (the Loader's own refusal pointed to pqloader.torch.IterableDataset(loader): a
        # Loader the reader's user never made)
        raise TypeError(
            "a pqloader.petastorm Reader cannot be pickled or copied (its Loader owns C++ threads): "
            "make the reader in the process that reads it (make_reader/make_batch_reader), and "
            "iterate it there, or with pqloader.petastorm.pytorch.DataLoader, which needs no workers")


# -- construction -----------------------------------------------------------------------
def _loader_kwargs(function: str, *, workers_count: int, reader_pool_type: str, results_queue_size: int,
                   seed: int | None, shuffle_rows: bool, shuffle_row_groups: bool, cur_shard: int | None,
                   shard_count: int | None, cache_type: str | None, cache_location: str | None,
                   cache_size_limit: int | None, loader_options: Mapping[str, Any] | None) -> dict[str, Any]:
    if reader_pool_type not in ("thread", "process", "dummy"):
        raise ValueError(f"Unknown reader_pool_type: {reader_pool_type}")
    from pqloader._options import MAX_COUNT, check_bool, check_int

    # Checked as the Loader checks its own (NumPy ints and bools taken, a bool or float
    # refused): int(2.7) had been 2 workers, bool("False") a shuffle, np.int64 shards
    # "must be ints".
    workers_count = check_int(f"{function}(workers_count=...)", workers_count, 1, MAX_COUNT)
    results_queue_size = check_int(f"{function}(results_queue_size=...)", results_queue_size, 0, MAX_COUNT)
    shuffle_rows = check_bool(f"{function}(shuffle_rows=...)", shuffle_rows)
    shuffle_row_groups = check_bool(f"{function}(shuffle_row_groups=...)", shuffle_row_groups)
    kw: dict[str, Any] = {}
    kw["num_workers"] = 1 if reader_pool_type == "dummy" else min(workers_count, _env.available_cpus())
    if results_queue_size:
        kw["prefetch_batches"] = results_queue_size
    kw["shuffle"] = shuffle_row_groups or shuffle_rows
    kw["shuffle_window"] = 1  # rows permuted within each row group, row groups in a new order
    kw["seed"] = seed
    if cur_shard is not None or shard_count is not None:
        if cur_shard is None or shard_count is None:
            raise ValueError("partition and num_partitions must be ints and both specified to use partitioning")
        shard_count = check_int(f"{function}(shard_count=...)", shard_count, 1, MAX_COUNT)
        cur_shard = check_int(f"{function}(cur_shard=...)", cur_shard, 0, shard_count - 1)
        kw["rank"], kw["world_size"] = cur_shard, shard_count
        if seed is None and kw["shuffle"] and shard_count > 1:
            # Petastorm deals row groups to shards by index, so its shards are disjoint
            # whatever each process draws; here a shard is a range of one shuffled order,
            # which every shard must share: without a seed given, seed 0.
            kw["seed"] = 0
    else:
        kw["rank"], kw["world_size"] = 0, 1
    if cache_type is None or cache_type == NULL_CACHE:
        pass
    elif cache_type == LOCAL_DISK_CACHE:
        if not cache_location:
            raise ValueError("cache_type='local-disk' needs cache_location (a directory)")
        kw["cache_dir"] = cache_location
        kw["cache_size_limit"] = cache_size_limit
    else:
        raise ValueError(f"Unknown cache_type: {cache_type}")
    kw.update(loader_options or {})
    return kw


def _storage_view(stored: Unischema, schema_fields: Any, ds: _dataset.PetastormDataset) -> Unischema:
    from collections.abc import Iterable

    if schema_fields is None:
        return stored
    if type(schema_fields).__name__ == "NGram":
        raise NotImplementedError("NGram schema_fields are not supported by pqloader.petastorm: read the "
                                  "fields and build sequences in a TransformSpec or the training loop")
    if not isinstance(schema_fields, Iterable) or isinstance(schema_fields, str):
        raise ValueError("Fields must be either None, an iterable collection of Unischema fields or an NGram object.")
    view = stored.create_schema_view(list(schema_fields))
    if not view.fields:
        raise RuntimeError(f"No fields matching the criteria '{schema_fields}' were found in the dataset "
                           f"{ds.sources[0]}.")
    return view


def make_reader(dataset_url: str | Sequence[str], schema_fields: Any = None, reader_pool_type: str = "thread",
                workers_count: int = 10, pyarrow_serialize: bool = False, results_queue_size: int = 50,
                seed: int | None = None, shuffle_rows: bool = False, shuffle_row_groups: bool = True,
                shuffle_row_drop_partitions: int = 1, predicate: Any = None, rowgroup_selector: Any = None,
                num_epochs: int | None = 1, cur_shard: int | None = None, shard_count: int | None = None,
                shard_seed: int | None = None, cache_type: str | None = NULL_CACHE,
                cache_location: str | None = None, cache_size_limit: int | None = None,
                cache_row_size_estimate: int | None = None, cache_extra_settings: dict | None = None,
                hdfs_driver: str = "libhdfs3", transform_spec: TransformSpec | None = None,
                filters: Any = None, storage_options: dict | None = None, zmq_copy_buffers: bool = True,
                filesystem: Any = None, convert_early_to_numpy: bool = False,
                loader_options: Mapping[str, Any] | None = None) -> Reader:
    """Read a Petastorm dataset row by row, decoding its codecs in pqloader's C++ workers.

    Petastorm's ``make_reader`` with the same parameters; each maps onto the Loader:
    ``workers_count`` → ``num_workers`` (at most one per core), ``results_queue_size`` →
    ``prefetch_batches``, ``shuffle_row_groups``/``shuffle_rows`` → ``shuffle`` (row
    groups in a new order each epoch, rows permuted within each), ``seed`` → ``seed``,
    ``cur_shard``/``shard_count`` → ``rank``/``world_size`` (equal row shares of each
    epoch), ``cache_type='local-disk'``/``cache_location``/``cache_size_limit`` →
    ``cache_dir``/``cache_size_limit``, ``storage_options`` (s3fs names) or a pyarrow
    ``filesystem`` → ``storage_options``. ``predicate``, ``rowgroup_selector``,
    ``filters`` and ``transform_spec`` are applied as in Petastorm (see the module
    docstring). Parameters with no equivalent warn once and are ignored.
    ``loader_options`` passes further :class:`pqloader.Loader` arguments.

    Returns:
        A :class:`Reader`: iterate it for namedtuple rows, or give it to
        ``pqloader.petastorm.pytorch.DataLoader``.

    Raises:
        UntrustedSchemaError: The dataset's pickled Unischema was refused.
        PetastormMetadataError: The dataset has no Unischema (use make_batch_reader).
        TypeError, ValueError: An argument is checked as the Loader checks its own
            (``workers_count`` an int >= 1, ``results_queue_size`` an int >= 0,
            ``shuffle_rows``/``shuffle_row_groups`` bools, ``0 <= cur_shard <
            shard_count``); the message names it.
    """
    given = dict(locals())
    _check_unmapped("make_reader", given)
    # (before the dataset is opened: a bad argument is refused without listing it)
    kw = _loader_kwargs("make_reader", workers_count=workers_count, reader_pool_type=reader_pool_type,
                        results_queue_size=results_queue_size, seed=seed, shuffle_rows=shuffle_rows,
                        shuffle_row_groups=shuffle_row_groups, cur_shard=cur_shard, shard_count=shard_count,
                        cache_type=cache_type, cache_location=cache_location, cache_size_limit=cache_size_limit,
                        loader_options=loader_options)
    storage = _dataset.storage_options_from(storage_options, filesystem)
    ds = _dataset.open_dataset(dataset_url, storage)
    if ds.unischema is None:
        from pqloader.petastorm.errors import PetastormMetadataError

        raise PetastormMetadataError(
            f"make_reader has failed: '{ds.sources[0]}' has no Petastorm Unischema in _common_metadata. "
            "If you were trying to open a Parquet store that was not created using Petastorm "
            "materialize_dataset, use make_batch_reader to read it.")
    view = _storage_view(ds.unischema, schema_fields, ds)
    predicate = _combine(predicate, filters)
    return Reader(ds, view, batched=False, decode_codecs=True, predicate=predicate,
                  rowgroup_selector=rowgroup_selector, transform_spec=transform_spec, loader_kwargs=kw,
                  num_epochs=num_epochs)


def make_batch_reader(dataset_url_or_urls: str | Sequence[str], schema_fields: Any = None,
                      reader_pool_type: str = "thread", workers_count: int = 10, results_queue_size: int = 50,
                      seed: int | None = None, shuffle_rows: bool = False, shuffle_row_groups: bool = True,
                      shuffle_row_drop_partitions: int = 1, predicate: Any = None, rowgroup_selector: Any = None,
                      num_epochs: int | None = 1, cur_shard: int | None = None, shard_count: int | None = None,
                      shard_seed: int | None = None, cache_type: str | None = NULL_CACHE,
                      cache_location: str | None = None, cache_size_limit: int | None = None,
                      cache_row_size_estimate: int | None = None, cache_extra_settings: dict | None = None,
                      hdfs_driver: str = "libhdfs3", transform_spec: TransformSpec | None = None,
                      filters: Any = None, storage_options: dict | None = None, zmq_copy_buffers: bool = True,
                      filesystem: Any = None, convert_early_to_numpy: bool = False,
                      loader_options: Mapping[str, Any] | None = None) -> Reader:
    """Read batches of a plain Parquet store (columns as they are stored), like Petastorm's.

    Parameters map, and are checked, as for :func:`make_reader`. ``schema_fields`` are regex patterns (or
    field names) matched against whole column names. Each item is a namedtuple of arrays
    (strings as ``np.str_`` arrays) of up to 1,024 rows, batches crossing row-group
    boundaries (Petastorm yields one batch per row group). The predicate gets each batch
    as a pandas DataFrame of its fields (Petastorm's contract), and ``TransformSpec.func``
    a DataFrame of the batch. Codecs are not applied, as in Petastorm.
    """
    given = dict(locals())
    _check_unmapped("make_batch_reader", given)
    # (before the dataset is opened: a bad argument is refused without listing it)
    kw = _loader_kwargs("make_batch_reader", workers_count=workers_count, reader_pool_type=reader_pool_type,
                        results_queue_size=results_queue_size, seed=seed, shuffle_rows=shuffle_rows,
                        shuffle_row_groups=shuffle_row_groups, cur_shard=cur_shard, shard_count=shard_count,
                        cache_type=cache_type, cache_location=cache_location, cache_size_limit=cache_size_limit,
                        loader_options=loader_options)
    from pqloader import inspect

    storage = _dataset.storage_options_from(storage_options, filesystem)
    ds = _dataset.open_dataset(dataset_url_or_urls, storage)
    if ds.unischema is not None:
        warnings.warn("Please use make_reader (instead of 'make_batch_dataset' function to read this dataset. "
                      "You may get unexpected results. Currently make_batch_reader supports reading only "
                      "Parquet stores that contain standard Parquet data types and do not require petastorm "
                      "decoding.")
    info = inspect(ds.sources, storage_options=ds.storage or None)
    stored = _infer_schema(ds, info)
    view = _storage_view(stored, schema_fields, ds)
    if predicate is not None and _takes_a_dataframe(predicate):
        predicate = _DataFramePredicate(predicate)
    predicate = _combine(predicate, filters)
    return Reader(ds, view, batched=True, decode_codecs=False, predicate=predicate,
                  rowgroup_selector=rowgroup_selector, transform_spec=transform_spec, loader_kwargs=kw,
                  num_epochs=num_epochs)


def _takes_a_dataframe(predicate: Any) -> bool:
    """Whether make_batch_reader hands `predicate` each batch as a DataFrame, as Petastorm's
    does (its do_include returns a boolean Series; an in_lambda's function gets Series):
    every predicate but pqloader's built-in row predicates (in_set, in_intersection, ...,
    which Petastorm's batch reader cannot run: they are evaluated row by row here)."""
    from pqloader.petastorm import predicates as builtin

    if isinstance(predicate, builtin.in_lambda):
        return True
    return not (isinstance(predicate, builtin.PredicateBase) and type(predicate).__module__ == builtin.__name__)


class _DataFramePredicate:
    """A user predicate of make_batch_reader: do_include(DataFrame) -> boolean Series."""

    def __init__(self, predicate: Any) -> None:
        self._predicate = predicate

    def get_fields(self) -> set[str]:
        return set(self._predicate.get_fields())

    def mask(self, columns: Mapping[str, Any]) -> np.ndarray:
        import pandas as pd

        frame = pd.DataFrame({k: (list(v) if isinstance(v, np.ndarray) and v.ndim > 1 else v)
                              for k, v in columns.items() if k in self.get_fields()})
        return np.asarray(self._predicate.do_include(frame), dtype=bool)


class _BothPredicates:
    def __init__(self, a: Any, b: Any) -> None:
        self._a, self._b = a, b

    def get_fields(self) -> set[str]:
        return set(self._a.get_fields()) | set(self._b.get_fields())

    def mask(self, columns: Mapping[str, Any]) -> np.ndarray:
        n = len(next(iter(columns.values())))
        return batch_mask(self._a, columns, n) & batch_mask(self._b, columns, n)


def _canon(value: Any, depth: int = 0, partials: bool = False) -> str:
    """`value` as stable text: plain data as itself (sets sorted, not in hash order), a
    function or class by its module and qualified name, another object by its class and
    attributes (a Reader's not_dates aside: set from the files, not given). `partials`:
    a functools.partial by its function and arguments, a NumPy dtype by its code (a
    predicate's description, which states record, keeps its text of earlier versions)."""
    if depth > 20:
        return "..."
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return repr(value)
    if isinstance(value, np.generic):
        return repr(value.item())
    if partials and isinstance(value, np.dtype):
        return f"dtype({value.str})"
    if isinstance(value, np.ndarray):
        return f"ndarray({value.dtype.str}, {value.shape}, {_canon(value.tolist(), depth + 1, partials)})"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(_canon(v, depth + 1, partials) for v in value)) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_canon(v, depth + 1, partials) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(sorted(f"{_canon(k, depth + 1, partials)}: {_canon(v, depth + 1, partials)}"
                                      for k, v in value.items())) + "}"
    if partials and isinstance(value, functools.partial):
        return (f"partial({_canon(value.func, depth + 1, partials)}, {_canon(value.args, depth + 1, partials)}, "
                f"{_canon(value.keywords, depth + 1, partials)})")
    if isinstance(value, type) or (callable(value) and not hasattr(value, "get_fields")
                                   and hasattr(value, "__qualname__")):
        return f"callable {getattr(value, '__module__', '?')}.{value.__qualname__}"
    kind = type(value)
    name = f"{kind.__module__}.{kind.__qualname__}"
    attrs = getattr(value, "__dict__", None)
    if attrs is None:
        return name
    return name + "(" + ", ".join(f"{k}={_canon(v, depth + 1, partials)}" for k, v in sorted(attrs.items())
                                  if k != "not_dates") + ")"


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode("utf-8", "backslashreplace")).hexdigest()[:16]


def describe_predicate(predicate: Any) -> str | None:
    """A stable description of `predicate` for a loader's state (None: no predicate).

    The predicate's class, fields and plain-data arguments (values, fractions, filters,
    nested predicates), digested; a function is described by its module and qualified
    name only (two lambdas read the same: code cannot be compared). Equal for equal
    predicates from run to run (sets are sorted, not in hash order).
    """
    if predicate is None:
        return None
    text = _canon(predicate)
    try:
        fields = sorted(predicate.get_fields())
    except Exception:  # noqa: BLE001 - the Reader refuses a predicate without fields
        fields = []
    kind = type(predicate._predicate if isinstance(predicate, _DataFramePredicate) else predicate)
    return f"{kind.__qualname__} on {fields} ({_digest(text)})"


def describe_transform_spec(spec: TransformSpec | None) -> str | None:
    """A stable description of a TransformSpec for a loader's state (None: none, or one
    that changes nothing).

    Its function by module and qualified name (code cannot be compared: two lambdas read
    the same), and its edit_fields (names, types, shapes, nullability), removed_fields and
    selected_fields, digested: a state counts rows and columns of the transformed stream
    (a batch function may drop rows), which another spec does not give.
    """
    if spec is None:
        return None
    func = spec.func
    edits = [list(e) if not hasattr(e, "nullable") else [e[0], e[1], e[2], e.nullable] for e in spec.edit_fields]
    if func is None and not edits and not spec.removed_fields and spec.selected_fields is None:
        return None  # TransformSpec(): the stream of no spec
    text = _canon([func, edits, list(spec.removed_fields), spec.selected_fields], partials=True)
    name = "None" if func is None else _canon(func, partials=True).removeprefix("callable ")
    parts = [f"func={name}"]
    if edits:
        parts.append(f"edit_fields={[e[0] for e in edits]}")
    if spec.removed_fields:
        parts.append(f"removed_fields={list(spec.removed_fields)}")
    if spec.selected_fields is not None:
        parts.append(f"selected_fields={list(spec.selected_fields)}")
    return f"TransformSpec({', '.join(parts)}) ({_digest(text)})"


def _func_name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or repr(func)


def _cast_exactly(values: np.ndarray, dtype: np.dtype, name: str, func: Any) -> np.ndarray:
    """`values` (a TransformSpec result column) in the field's declared `dtype`, or a
    TypeError naming the field when that type cannot hold them."""
    with np.errstate(invalid="ignore", over="ignore"):
        cast = values.astype(dtype)
        if dtype.kind == "f" and values.dtype.kind == "f":
            # (a narrower float rounds, as NumPy's astype does; past its range is inf)
            changed = np.isinf(cast) & ~np.isinf(values)
        elif dtype.kind == "f":
            # An integer the float holds exactly, or none: 70000 in a float16 became inf,
            # 16777217 in a float32 16777216.
            finite = np.isfinite(cast)
            changed = ~finite | (np.where(finite, cast, 0).astype(values.dtype) != values)
        else:
            back = cast.astype(values.dtype)
            changed = back != values
            if values.dtype.kind == "f":
                changed |= np.isnan(values)
    if changed.any():
        bad = values[np.argmax(changed.reshape(len(values), -1).any(axis=1))]
        raise TypeError(f"TransformSpec func {_func_name(func)} returned {values.dtype} values for field "
                        f"{name!r}, declared {dtype}, which cannot hold them (e.g. {bad.tolist()!r}): declare "
                        "the field's new type in edit_fields")
    return cast


def _combine(predicate: Any, filters: Any) -> Any:
    if filters is None:
        return predicate
    f = _FiltersPredicate(filters)
    return f if predicate is None else _BothPredicates(predicate, f)


def _infer_schema(ds: _dataset.PetastormDataset, info: Mapping[str, Any]) -> Unischema:
    """A codec-less Unischema of the columns the engine can load (others are skipped, with a
    warning, as Petastorm skips unsupported columns)."""
    import re

    fields = []
    for name, described in info["loads_as"].items():
        loads_as = described.split("; ", 1)[0]  # the notes after "; " (nulls, ...) aside
        # A hive partition key (a string or an integer column from the path).
        loads_as = loads_as.removesuffix(" (partition key)")
        m = re.fullmatch(r"(\w+)\(batch((?:, *\w+)*)\)", loads_as)
        # A ragged list column: "ragged int32: ..." or "ragged float32 (n, 3): ..."
        ragged = re.match(r"ragged (\w+)(?: \(n((?:, *\d+)*)\))?:", loads_as)
        if ragged:
            m = re.fullmatch(r"(\w+)\(batch((?:, *\w+)*)\)",
                             f"{ragged.group(1)}(batch, n{ragged.group(2) or ''})")
        if loads_as == "list[str]":
            fields.append(UnischemaField(name, np.str_, (), None, True))
        elif loads_as == "list[bytes]":
            fields.append(UnischemaField(name, np.bytes_, (), None, True))
        elif m:
            dims = [d.strip() for d in m.group(2).split(",") if d.strip()]
            shape = tuple(int(d) if d.isdigit() else None for d in dims)
            fields.append(UnischemaField(name, np.dtype(m.group(1)).type, shape, None, True))
        else:
            warnings.warn(f"Column {name!r} has an unsupported field {info['schema'].get(name)!r} "
                          f"({described}). Ignoring...")
    if not fields:
        raise _errors.UnsupportedTypeError(f"no column of '{ds.sources[0]}' can be loaded")
    # Hive partition keys first, as Petastorm infers them (a batch unpacked by position
    # had its columns under other names).
    keys = {name for name, described in info["loads_as"].items()
            if described.split("; ", 1)[0].endswith(" (partition key)")}
    return Unischema("inferred_schema", sorted(fields, key=lambda f: f.name not in keys))


__all__ = ["make_reader", "make_batch_reader", "Reader"]
