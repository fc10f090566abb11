"""Petastorm's pickled metadata, read without executing anything, and written back.

Petastorm keeps in ``_common_metadata`` (the Parquet key-value metadata of an empty file):

- ``dataset-toolkit.unischema.v1``: the pickled Unischema;
- ``dataset-toolkit.num_row_groups_per_file.v1``: JSON ``{relative path: row groups}``;
- ``dataset-toolkit.rowgroups_index.v1``: pickled row-group indexes (``build_rowgroup_index``).

A pickle is a program: ``pickle.loads`` on a dataset someone else wrote runs whatever it
says. :func:`loads` runs a restricted unpickler instead. Its opcodes are checked first
(persistent ids and extension codes are refused), and ``find_class`` hands out only inert
stand-ins for the classes Petastorm writes (Unischema, UnischemaField, the four codecs,
the row-group indexers, the ``pyspark.sql.types`` they name), NumPy scalar types, and
safe versions of the few helpers those pickles use (``numpy.dtype``,
``numpy.core.multiarray.scalar``, ``collections.OrderedDict``/``defaultdict``, ``set``,
``copyreg._reconstructor``). The stand-ins only record their arguments and state; the
result is then rebuilt into pqloader's plain objects, checking every type. Anything else
raises :class:`~pqloader.petastorm.errors.UntrustedSchemaError` and nothing runs.

:func:`dumps_unischema` writes a pickle that Petastorm reads (its class names, protocol 2)
without importing petastorm.
"""

from __future__ import annotations

import collections
import io
import pickle
import pickletools
import re
import struct
from decimal import Decimal
from typing import Any

import numpy as np

from pqloader.petastorm import codecs as C
from pqloader.petastorm.errors import UntrustedSchemaError
from pqloader.petastorm.unischema import Unischema, UnischemaField

UNISCHEMA_KEY = b"dataset-toolkit.unischema.v1"
ROW_GROUPS_PER_FILE_KEY = b"dataset-toolkit.num_row_groups_per_file.v1"
ROWGROUPS_INDEX_KEY = b"dataset-toolkit.rowgroups_index.v1"

_REFUSED_OPCODES = {"PERSID", "BINPERSID", "EXT1", "EXT2", "EXT4"}

# NumPy scalar types a UnischemaField may name (old aliases included: pickles from NumPy 1).
_NUMPY_TYPES = {
    "bool_": np.bool_, "bool": np.bool_, "int8": np.int8, "int16": np.int16, "int32": np.int32,
    "int64": np.int64, "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32,
    "uint64": np.uint64, "float16": np.float16, "float32": np.float32, "float64": np.float64,
    "complex64": np.complex64, "complex128": np.complex128,
    "str_": np.str_, "unicode_": np.str_, "bytes_": np.bytes_, "string_": np.bytes_,
    "datetime64": np.datetime64, "timedelta64": np.timedelta64,
}
_NUMPY_TYPE_NAMES = {np.str_: "str_", np.bytes_: "bytes_", np.bool_: "bool_"}

_SPARK_TYPES = (
    "BinaryType", "BooleanType", "ByteType", "ShortType", "IntegerType", "LongType", "FloatType",
    "DoubleType", "DecimalType", "StringType", "DateType", "TimestampType", "TimestampNTZType",
    "NullType",
)
_CODECS = ("ScalarCodec", "NdarrayCodec", "CompressedNdarrayCodec", "CompressedImageCodec")
_INDEXERS = ("SingleFieldIndexer", "FieldNotNullIndexer")


def _untrusted(what: str) -> UntrustedSchemaError:
    return UntrustedSchemaError(
        f"{what}; the schema was not trusted and nothing of it was run. pqloader never "
        "executes pickles: it rebuilds only Petastorm's Unischema, UnischemaField, codecs, "
        "row-group indexers, NumPy types and the Spark types they name. Regenerate the "
        "metadata with Petastorm's materialize_dataset if the dataset is yours")


# -- inert stand-ins ------------------------------------------------------------------
class _Stub:
    """Records how the pickle builds an object of class `kind`; runs nothing."""

    kind = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> _Stub:
        obj = object.__new__(cls)
        obj.args = args
        obj.state = None
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __reduce__(self) -> Any:
        raise TypeError("a stand-in of the restricted reader cannot be pickled")


def _stub_class(kind: str) -> type:
    return type(kind.rsplit(".", 1)[-1], (_Stub,), {"kind": kind})


_STUBS = {
    ("petastorm.unischema", "Unischema"): _stub_class("Unischema"),
    ("petastorm.unischema", "UnischemaField"): _stub_class("UnischemaField"),
    **{("petastorm.codecs", name): _stub_class(name) for name in _CODECS},
    **{("petastorm.etl.rowgroup_indexers", name): _stub_class(name) for name in _INDEXERS},
    **{("pyspark.sql.types", name): _stub_class("spark." + name) for name in _SPARK_TYPES},
}


class _DType(_Stub):
    """numpy.dtype(spec, align, copy) with its BUILD state (byte order)."""

    kind = "numpy.dtype"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.resolve()  # refuse object and structured dtypes as soon as they appear

    def resolve(self) -> np.dtype:
        spec = self.args[0] if self.args else None
        if not isinstance(spec, str) or not re.fullmatch(r"[<>|=]?[?bBhHiIlLqQefdgFDGSUaMm]\d*(\[\w+\])?", spec):
            raise _untrusted(f"numpy.dtype({spec!r}) is not a plain numeric, string or time type")
        dtype = np.dtype(spec)
        if dtype.kind in "OV" or dtype.fields:
            raise _untrusted(f"numpy.dtype({spec!r}) is not a plain type")
        if isinstance(self.state, tuple) and len(self.state) > 1 and self.state[1] in ("<", ">"):
            dtype = dtype.newbyteorder(self.state[1])
        return dtype


def _scalar(dtype: Any, data: Any = None) -> Any:
    """numpy.core.multiarray.scalar(dtype, bytes), for plain dtypes only."""
    if not isinstance(dtype, _DType) or not isinstance(data, bytes):
        raise _untrusted("numpy scalar of an unexpected form")
    resolved = dtype.resolve()
    if len(data) != resolved.itemsize:
        raise _untrusted(f"numpy scalar of {len(data)} bytes for {resolved}")
    return np.frombuffer(data, dtype=resolved)[0]


def _defaultdict(factory: Any = None, *rest: Any) -> Any:
    if factory is not set or rest:
        raise _untrusted("collections.defaultdict with a factory other than set")
    return collections.defaultdict(set)


def _reconstructor(cls: Any, base: Any, state: Any = None) -> Any:
    """copyreg._reconstructor of protocol 0/1 pickles, for the stand-ins only."""
    if not (isinstance(cls, type) and issubclass(cls, _Stub)) or base is not object or state is not None:
        raise _untrusted("copyreg._reconstructor of something else than a Petastorm class")
    return cls.__new__(cls)


_SAFE = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("collections", "defaultdict"): _defaultdict,
    ("builtins", "set"): set, ("__builtin__", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "object"): object, ("__builtin__", "object"): object,
    ("copyreg", "_reconstructor"): _reconstructor, ("copy_reg", "_reconstructor"): _reconstructor,
    ("numpy", "dtype"): _DType,
    ("numpy.core.multiarray", "scalar"): _scalar, ("numpy._core.multiarray", "scalar"): _scalar,
    ("decimal", "Decimal"): Decimal,
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _STUBS:
            return _STUBS[(module, name)]
        if (module, name) in _SAFE:
            return _SAFE[(module, name)]
        if module == "numpy" and name in _NUMPY_TYPES:
            return _NUMPY_TYPES[name]
        raise _untrusted(f"it refers to {module}.{name}, which Petastorm does not write")

    def persistent_load(self, pid: Any) -> Any:
        raise _untrusted("it holds a persistent id")


def loads(data: bytes, what: str = "pickle") -> Any:
    """Unpickle `data` with the restricted reader; the result holds stand-ins.

    Raises:
        UntrustedSchemaError: A refused opcode or global, or a pickle that does not parse.
    """
    if not isinstance(data, (bytes, bytearray)):
        raise _untrusted(f"the {what} is not bytes")
    try:
        for opcode, _, _ in pickletools.genops(data):
            if opcode.name in _REFUSED_OPCODES:
                raise _untrusted(f"the {what} uses the pickle opcode {opcode.name}")
    except UntrustedSchemaError:
        raise
    except Exception as e:
        raise _untrusted(f"the {what} is not a valid pickle ({e})") from None
    try:
        return _RestrictedUnpickler(io.BytesIO(bytes(data))).load()
    except UntrustedSchemaError:
        raise
    except Exception as e:
        raise _untrusted(f"the {what} could not be rebuilt ({type(e).__name__}: {e})") from None


# -- stand-ins → plain objects -----------------------------------------------------
def _state_dict(stub: _Stub, allowed: set[str]) -> dict[str, Any]:
    state = stub.state if stub.state is not None else {}
    if isinstance(state, tuple) and len(state) == 2 and state[1] is None:  # (dict, slots)
        state = state[0]
    if not isinstance(state, dict):
        raise _untrusted(f"{stub.kind} has state of type {type(state).__name__}")
    unknown = set(state) - allowed
    if unknown:
        raise _untrusted(f"{stub.kind} has unexpected attributes {sorted(map(str, unknown))}")
    return state


def _spark_type(obj: Any) -> C.SparkType:
    if not isinstance(obj, _Stub) or not obj.kind.startswith("spark."):
        raise _untrusted(f"ScalarCodec names {type(obj).__name__}, not a pyspark.sql.types type")
    state = _state_dict(obj, {"precision", "scale", "hasPrecisionInfo", "collation", "typeName"})
    params = {k: v for k, v in state.items() if isinstance(v, (int, bool, str)) or v is None}
    return C.SparkType(obj.kind[len("spark."):], params)


def _codec(obj: Any) -> C.DataframeColumnCodec | None:
    if obj is None:
        return None
    if not isinstance(obj, _Stub) or obj.kind not in _CODECS:
        raise _untrusted(f"a field's codec is {type(obj).__name__}")
    if obj.kind == "ScalarCodec":
        state = _state_dict(obj, {"_spark_type"})
        return C.ScalarCodec(_spark_type(state.get("_spark_type")))
    if obj.kind == "CompressedImageCodec":
        state = _state_dict(obj, {"_image_codec", "_quality"})
        image_codec, quality = state.get("_image_codec", ".png"), state.get("_quality", 80)
        if not isinstance(image_codec, str) or not isinstance(quality, int):
            raise _untrusted("CompressedImageCodec with unexpected parameters")
        return C.CompressedImageCodec(image_codec.lstrip("."), quality)
    _state_dict(obj, set())
    return C.NdarrayCodec() if obj.kind == "NdarrayCodec" else C.CompressedNdarrayCodec()


def _numpy_type(value: Any) -> Any:
    if isinstance(value, type) and (value in _NUMPY_TYPES.values() or value is Decimal):
        return value
    if isinstance(value, _DType):
        return value.resolve().type
    raise _untrusted(f"a field's numpy_dtype is {value!r}")


def _field(obj: Any) -> UnischemaField:
    if not isinstance(obj, _Stub) or obj.kind != "UnischemaField":
        raise _untrusted(f"a Unischema field is {type(obj).__name__}")
    args = obj.args
    if obj.state is not None and not args:  # protocol 0/1: fields in the state
        state = obj.state
        args = tuple(state) if isinstance(state, tuple) else ()
    if not 3 <= len(args) <= 5:
        raise _untrusted(f"UnischemaField with {len(args)} values")
    name, numpy_dtype, shape = args[0], args[1], args[2]
    codec = args[3] if len(args) > 3 else None
    nullable = args[4] if len(args) > 4 else False
    if not isinstance(name, str) or not isinstance(shape, tuple) or \
            not all(d is None or (isinstance(d, int) and not isinstance(d, bool)) for d in shape) or \
            not isinstance(nullable, (bool, type(None))):
        raise _untrusted(f"UnischemaField {name!r} with unexpected values")
    return UnischemaField(name, _numpy_type(numpy_dtype), shape, _codec(codec), bool(nullable))


def to_unischema(obj: Any) -> Unischema:
    """Rebuild a Unischema from the stand-ins :func:`loads` returned."""
    if not isinstance(obj, _Stub) or obj.kind != "Unischema":
        raise _untrusted(f"the pickle holds {type(obj).__name__}, not a Unischema")
    state = obj.state
    if not isinstance(state, dict) or not isinstance(state.get("_name"), str) or \
            not isinstance(state.get("_fields"), dict):
        raise _untrusted("the Unischema has no name or fields")
    fields = [_field(f) for f in state["_fields"].values()]
    for key, value in state.items():  # the rest: Petastorm's attribute per field name
        if key not in ("_name", "_fields") and not (isinstance(value, _Stub) and value.kind == "UnischemaField"):
            raise _untrusted(f"the Unischema has an unexpected attribute {key!r}")
    return Unischema(state["_name"], fields)


class SingleFieldIndexer:
    """A row-group index read from a dataset: value → set of row-group (piece) indices."""

    def __init__(self, index_name: str, index_field: str, index_data: dict | None = None) -> None:
        self._index_name = index_name
        self._column_name = index_field
        self._index_data = collections.defaultdict(set, index_data or {})

    @property
    def index_name(self) -> str:
        return self._index_name

    @property
    def column_names(self) -> list[str]:
        return [self._column_name]

    @property
    def indexed_values(self) -> list[Any]:
        return list(self._index_data.keys())

    def get_row_group_indexes(self, value_key: Any = None) -> set[int]:
        return set(self._index_data.get(value_key, set()))


class FieldNotNullIndexer(SingleFieldIndexer):
    """A row-group index of the row groups where a field is not null."""

    def __init__(self, index_name: str, index_field: str, index_data: set | None = None) -> None:
        super().__init__(index_name, index_field)
        self._not_null = set(index_data or ())

    @property
    def indexed_values(self) -> list[Any]:
        return ["Field is Not Null"]

    def get_row_group_indexes(self, value_key: Any = None) -> set[int]:
        return set(self._not_null)


def _int_set(value: Any, where: str) -> set[int]:
    if not isinstance(value, (set, frozenset)) or not all(isinstance(i, (int, np.integer)) for i in value):
        raise _untrusted(f"{where} is not a set of row-group numbers")
    return {int(i) for i in value}


def to_indexes(obj: Any) -> dict[str, SingleFieldIndexer]:
    """Rebuild ``{index name: indexer}`` from the stand-ins :func:`loads` returned."""
    if not isinstance(obj, dict):
        raise _untrusted("the row-group index is not a dict")
    out: dict[str, SingleFieldIndexer] = {}
    for name, stub in obj.items():
        if not isinstance(name, str) or not isinstance(stub, _Stub) or stub.kind not in _INDEXERS:
            raise _untrusted(f"row-group index {name!r} is not a Petastorm indexer")
        state = _state_dict(stub, {"_index_name", "_column_name", "_index_data"})
        index_name, column = state.get("_index_name"), state.get("_column_name")
        if not isinstance(index_name, str) or not isinstance(column, str):
            raise _untrusted(f"row-group index {name!r} has no name or column")
        data = state.get("_index_data")
        if stub.kind == "FieldNotNullIndexer":
            out[name] = FieldNotNullIndexer(index_name, column, _int_set(data, f"index {name!r}"))
            continue
        if not isinstance(data, dict):
            raise _untrusted(f"row-group index {name!r} has no value table")
        table = {}
        for value, pieces in data.items():
            if not isinstance(value, (str, bytes, int, float, np.generic, Decimal)):
                raise _untrusted(f"row-group index {name!r} has a key of type {type(value).__name__}")
            table[value] = _int_set(pieces, f"index {name!r}")
        out[name] = SingleFieldIndexer(index_name, column, table)
    return out


def load_unischema(data: bytes) -> Unischema:
    """Read a pickled Unischema without executing it (see the module docstring)."""
    return to_unischema(loads(data, "Unischema pickle"))


def load_indexes(data: bytes) -> dict[str, SingleFieldIndexer]:
    """Read pickled row-group indexes without executing them."""
    return to_indexes(loads(data, "row-group index pickle"))


# -- writing ---------------------------------------------------------------------------
class _Writer:
    """A protocol-2 pickle of plain values, Unischema objects and named globals."""

    def __init__(self) -> None:
        self.out = io.BytesIO()

    def write(self, b: bytes) -> None:
        self.out.write(b)

    def glob(self, module: str, name: str) -> None:
        self.write(pickle.GLOBAL + f"{module}\n{name}\n".encode())

    def obj(self, module: str, name: str, args: tuple, state: dict | None) -> None:
        self.glob(module, name)
        self.value(args)
        self.write(pickle.NEWOBJ)
        if state:
            self.value(state)
            self.write(pickle.BUILD)

    def value(self, v: Any) -> None:  # noqa: C901 - one branch per kind
        if v is None:
            self.write(pickle.NONE)
        elif v is True or v is False:
            self.write(pickle.NEWTRUE if v else pickle.NEWFALSE)
        elif isinstance(v, int):
            if -(2**31) <= v < 2**31:
                self.write(pickle.BININT + struct.pack("<i", v))
            else:
                b = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
                self.write(pickle.LONG1 + bytes([len(b)]) + b)
        elif isinstance(v, float):
            self.write(pickle.BINFLOAT + struct.pack(">d", v))
        elif isinstance(v, str):
            b = v.encode("utf-8")
            self.write(pickle.BINUNICODE + struct.pack("<I", len(b)) + b)
        elif isinstance(v, UnischemaField):
            self.glob("petastorm.unischema", "UnischemaField")
            self.write(pickle.MARK)
            self.value(v.name)
            self._numpy_type(v.numpy_dtype)
            self.value(tuple(v.shape))
            self.value(v.codec)
            self.value(bool(v.nullable))
            self.write(pickle.TUPLE + pickle.NEWOBJ)
        elif isinstance(v, tuple):
            self.write(pickle.MARK)
            for x in v:
                self.value(x)
            self.write(pickle.TUPLE)
        elif isinstance(v, collections.OrderedDict):
            self.glob("collections", "OrderedDict")
            self.write(pickle.EMPTY_TUPLE + pickle.REDUCE)
            self._items(v)
        elif isinstance(v, dict):
            self.write(pickle.EMPTY_DICT)
            self._items(v)
        elif isinstance(v, Unischema):
            state = {"_name": v._name, "_fields": collections.OrderedDict(v.fields)}
            state.update({name: f for name, f in v.fields.items() if name not in state})
            self.obj("petastorm.unischema", "Unischema", (), state)
        elif isinstance(v, C.DataframeColumnCodec):
            state = dict(vars(v))
            self.obj("petastorm.codecs", type(v).__name__, (), state)
        elif isinstance(v, C.SparkType) or type(v).__module__.startswith("pyspark.sql.types"):
            name = C.spark_type_name(v)
            state = v.params if isinstance(v, C.SparkType) else \
                {k: x for k, x in vars(v).items() if isinstance(x, (int, str, bool))}
            self.obj("pyspark.sql.types", name, (), state)
        else:
            raise TypeError(f"cannot write {type(v).__name__} into Petastorm metadata")

    def _items(self, d: dict) -> None:
        if not d:
            return
        self.write(pickle.MARK)
        for k, x in d.items():
            self.value(k)
            self.value(x)
        self.write(pickle.SETITEMS)

    def _numpy_type(self, t: Any) -> None:
        if t is Decimal:
            self.glob("decimal", "Decimal")
            return
        if not (isinstance(t, type) and issubclass(t, np.generic)):
            raise TypeError(f"numpy_dtype must be a NumPy scalar type (e.g. np.int32), got {t!r}")
        self.glob("numpy", _NUMPY_TYPE_NAMES.get(t, np.dtype(t).name if t not in (np.str_, np.bytes_) else ""))


def dumps_unischema(schema: Unischema) -> bytes:
    """Pickle `schema` as Petastorm does (its class names), without importing petastorm."""
    w = _Writer()
    w.write(pickle.PROTO + bytes([2]))
    w.value(schema)
    w.write(pickle.STOP)
    return w.out.getvalue()


__all__ = ["load_unischema", "load_indexes", "dumps_unischema", "loads", "SingleFieldIndexer",
           "FieldNotNullIndexer", "UNISCHEMA_KEY", "ROW_GROUPS_PER_FILE_KEY", "ROWGROUPS_INDEX_KEY"]

