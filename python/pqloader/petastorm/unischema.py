"""Petastorm's Unischema and UnischemaField, as plain objects (no petastorm, no pyspark).

A :class:`Unischema` is what ``make_reader`` reads from a dataset's ``_common_metadata``
(through the restricted reader of :mod:`pqloader.petastorm._schema_io`) or what a user
defines to write one (``materialize_dataset``, ``dict_to_spark_row``, ``as_spark_schema``
import pyspark only when called).
"""

from __future__ import annotations

import copy
import re
import warnings
from collections import OrderedDict, namedtuple
from decimal import Decimal
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np

_NAMEDTUPLES: dict[str, type] = {}


class UnischemaField(NamedTuple):
    """One field: name, NumPy type, shape (None for a variable dimension), codec, nullable.

    Equality and hashing ignore the codec, as Petastorm's do.
    """

    name: str
    numpy_dtype: Any
    shape: tuple[Optional[int], ...]
    codec: Optional[Any] = None
    nullable: Optional[bool] = False

    def _key(self) -> tuple:
        return (self.name, self.numpy_dtype, self.shape, self.nullable)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, tuple) and hasattr(other, "_fields") and \
            (other.name, other.numpy_dtype, other.shape, other.nullable) == self._key()  # type: ignore[attr-defined]

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash(self._key())


class Unischema:
    """An ordered set of :class:`UnischemaField`, also reachable as attributes by name."""

    def __init__(self, name: str, fields: Sequence[UnischemaField]) -> None:
        self._name = name
        self._fields = OrderedDict((f.name, f) for f in fields)
        for f in fields:
            if not hasattr(self, f.name):
                setattr(self, f.name, f)
            else:
                warnings.warn(f"Can not create dynamic property {f.name} because it conflicts with an "
                              "existing property of Unischema")

    @property
    def fields(self) -> OrderedDict:
        return self._fields

    def create_schema_view(self, fields: Sequence[Any]) -> Unischema:
        """A Unischema of the given fields (UnischemaField objects and/or regex patterns that
        must match a whole field name), in this schema's order.

        Raises:
            ValueError: A field is not of this schema, or an entry is neither kind.
        """
        patterns = [f for f in fields if isinstance(f, str)]
        objects = [f for f in fields if isinstance(f, tuple)]
        if len(patterns) + len(objects) != len(fields):
            raise ValueError('Elements of "fields" must be either a string (regular expressions) or '
                             "an instance of UnischemaField class.")
        unknown = {f.name for f in objects} - set(self._fields)
        if unknown:
            raise ValueError(f"field {unknown} does not belong to the schema {self}")
        wanted = {f.name for f in objects} | {f.name for f in match_unischema_fields(self, patterns)}
        return Unischema(f"{self._name}_view", [f for n, f in self._fields.items() if n in wanted])

    def _get_namedtuple(self) -> type:
        key = " ".join([self._name, *self._fields])
        if key not in _NAMEDTUPLES:
            _NAMEDTUPLES[key] = namedtuple(f"{self._name}_view", list(self._fields))
        return _NAMEDTUPLES[key]

    def make_namedtuple(self, **kwargs: Any) -> Any:
        """A row of this schema as a namedtuple (the type is shared per schema and fields)."""
        return self._get_namedtuple()(**kwargs)

    def make_namedtuple_tf(self, *args: Any, **kwargs: Any) -> Any:
        return self._get_namedtuple()(*args, **kwargs)

    def as_spark_schema(self) -> Any:
        """The pyspark ``StructType`` of this schema (imports pyspark)."""
        import pyspark.sql.types as sql_types

        return sql_types.StructType([
            sql_types.StructField(f.name, _field_spark_dtype(f), bool(f.nullable))
            for f in self._fields.values()])

    def __str__(self) -> str:
        lines = "".join(f"  {type(f).__name__}('{f.name}', {getattr(f.numpy_dtype, '__name__', f.numpy_dtype)}, "
                        f"{f.shape}, {f.codec}, {f.nullable}),\n" for f in self._fields.values())
        return f"{type(self).__name__}({self._name}, [\n{lines}])"

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Unischema) and self._name == other._name and \
            list(self._fields.values()) == list(other._fields.values())

    def __hash__(self) -> int:
        return hash((self._name, tuple(self._fields)))


_NUMPY_TO_SPARK = {
    np.int8: "ByteType", np.uint8: "ShortType", np.int16: "ShortType", np.uint16: "IntegerType",
    np.int32: "IntegerType", np.int64: "LongType", np.float32: "FloatType", np.float64: "DoubleType",
    np.bytes_: "StringType", np.str_: "StringType", np.bool_: "BooleanType",
}


def _field_spark_dtype(field: UnischemaField) -> Any:
    import pyspark.sql.types as sql_types

    if field.codec is not None:
        return field.codec.spark_dtype()
    if field.shape != ():
        raise ValueError(f"An instance of non-scalar UnischemaField '{field.name}' has codec set to None. "
                         "Don't know how to guess a Spark type for it")
    name = _NUMPY_TO_SPARK.get(field.numpy_dtype)
    if name is None:
        raise ValueError(f"Was not able to map type {field.numpy_dtype} to a spark type.")
    return getattr(sql_types, name)()


def match_unischema_fields(schema: Unischema, field_regex: Sequence[str]) -> list[UnischemaField]:
    """The fields whose whole name matches one of the patterns, in schema order."""
    return [f for name, f in schema.fields.items()
            if any(re.fullmatch(p, name) for p in field_regex)]


def insert_explicit_nulls(unischema: Unischema, row_dict: dict) -> None:
    """Add None for missing nullable fields (in place); a missing non-nullable one is an error."""
    for name, field in unischema.fields.items():
        if name not in row_dict:
            if field.nullable:
                row_dict[name] = None
            else:
                raise ValueError(f"Field {name} is not found in the row_dict, but is not nullable.")


def encode_row(unischema: Unischema, row_dict: dict) -> dict:
    """Encode one row with the fields' codecs (what ``dict_to_spark_row`` stores)."""
    row = copy.copy(row_dict)
    insert_explicit_nulls(unischema, row)
    if set(row) != set(unischema.fields):
        raise ValueError("Dictionary fields \n{}\n do not match schema fields \n{}".format(
            "\n".join(sorted(row)), "\n".join(unischema.fields)))
    encoded = {}
    for name, value in row.items():
        field = unischema.fields[name]
        if value is None:
            if not field.nullable:
                raise ValueError(f'Field {name} is not "nullable", but got passes a None value')
            encoded[name] = None
        elif field.codec is not None:
            encoded[name] = field.codec.encode(field, value)
        elif isinstance(value, np.generic):
            encoded[name] = value.tolist()
        else:
            encoded[name] = value
    return encoded


def dict_to_spark_row(unischema: Unischema, row_dict: dict) -> Any:
    """Encode one row (a dict) into a ``pyspark.Row`` in the schema's field order."""
    import pyspark

    encoded = encode_row(unischema, row_dict)
    names = list(unischema.fields)
    row = pyspark.Row(*[encoded[n] for n in names])
    row.__fields__ = names
    return row


def is_numpy_scalar_type(numpy_dtype: Any) -> bool:
    """Whether values of the type are cast with ``numpy_dtype(value)`` (Petastorm's decode_row)."""
    return isinstance(numpy_dtype, type) and issubclass(numpy_dtype, (np.generic, Decimal))


__all__ = ["Unischema", "UnischemaField", "dict_to_spark_row", "insert_explicit_nulls",
           "match_unischema_fields"]
