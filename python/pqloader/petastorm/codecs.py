"""Petastorm's codecs, as plain objects that pqloader maps onto its C++ transforms.

The class and attribute names (``_spark_type``, ``_image_codec``, ``_quality``) are
Petastorm's, because datasets store them pickled; pqloader reads those pickles with a
restricted reader (:mod:`pqloader.petastorm._schema_io`) and never imports petastorm.

Reading: :meth:`DataframeColumnCodec.engine_ops` gives the ops the C++ workers run for a
field (``CompressedImageCodec`` → ``DecodeImage`` in the field's channel count,
``NdarrayCodec`` → ``DecodeNdarray``, ``CompressedNdarrayCodec`` →
``DecodeCompressedNdarray``, ``ScalarCodec`` → none: the stored value, cast to the field's
NumPy type per batch). Writing (``materialize_dataset``, ``dict_to_spark_row``):
:meth:`encode` produces what Petastorm's encoder stores — ``np.save`` / ``np.savez_compressed``
bytes, PNG or JPEG (with Pillow, where Petastorm uses OpenCV: PNG pixels are identical,
JPEG bytes differ as any two encoders do).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from pqloader import transforms as T


class SparkType:
    """A Spark SQL type named in a pickled Unischema, without pyspark.

    Attributes:
        name: The class name in ``pyspark.sql.types`` (e.g. ``"IntegerType"``).
        params: Its pickled state (e.g. ``{"precision": 10, "scale": 2}`` for DecimalType).
    """

    def __init__(self, name: str, params: dict[str, Any] | None = None) -> None:
        self.name = name
        self.params = dict(params or {})

    def typeName(self) -> str:  # noqa: N802 - pyspark's spelling
        return self.name[:-len("Type")].lower() if self.name.endswith("Type") else self.name.lower()

    def to_pyspark(self) -> Any:
        """The pyspark type (imports pyspark)."""
        import pyspark.sql.types as sql_types

        cls = getattr(sql_types, self.name)
        if self.name == "DecimalType":
            return cls(self.params.get("precision", 10), self.params.get("scale", 0))
        return cls()

    def __eq__(self, other: object) -> bool:
        return spark_type_name(other) == self.name and (
            not isinstance(other, SparkType) or other.params == self.params)

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"{self.name}()"


def spark_type_name(spark_type: Any) -> str:
    """``"IntegerType"`` for a pyspark ``IntegerType()`` or a :class:`SparkType` alike."""
    return spark_type.name if isinstance(spark_type, SparkType) else type(spark_type).__name__


class DataframeColumnCodec:
    """The base of codecs: encode for writing, engine ops (and a Python decode) for reading."""

    def encode(self, unischema_field: Any, value: Any) -> Any:
        raise NotImplementedError

    def decode(self, unischema_field: Any, value: Any) -> Any:
        raise NotImplementedError

    def spark_dtype(self) -> Any:
        import pyspark.sql.types as sql_types

        return sql_types.BinaryType()

    def engine_ops(self, unischema_field: Any) -> list[T.Op]:
        """The pqloader transforms that decode this field in the C++ workers."""
        return []

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash(type(self).__name__)

    def __repr__(self) -> str:
        return str(self)


def _check_array(field: Any, value: Any) -> None:
    if not isinstance(value, np.ndarray):
        raise ValueError(f"Unexpected type of {field.name} feature. Expected ndarray of "
                         f"{field.numpy_dtype}. Got {type(value)}")
    if np.dtype(field.numpy_dtype) != value.dtype:
        raise ValueError(f"Unexpected type of {field.name} feature. Expected {field.numpy_dtype}. "
                         f"Got {value.dtype}")
    if not is_compliant_shape(value.shape, field.shape):
        raise ValueError(f"Unexpected dimensions of {field.name} feature. Expected {field.shape}. "
                         f"Got {value.shape}")


class CompressedImageCodec(DataframeColumnCodec):
    """PNG or JPEG images: (H, W) gray or (H, W, 3) RGB uint8 arrays.

    Read: ``DecodeImage`` in C++ (libpng / libjpeg-turbo), gray fields as (H, W) like
    Petastorm's OpenCV decode, RGB as (H, W, 3).
    """

    def __init__(self, image_codec: str = "png", quality: int = 80) -> None:
        self._image_codec = "." + image_codec
        self._quality = quality

    @property
    def image_codec(self) -> str:
        return self._image_codec[1:]

    def encode(self, unischema_field: Any, value: Any) -> bytearray:
        from PIL import Image

        _check_array(unischema_field, value)
        if value.dtype != np.uint8:
            raise ValueError(f"{unischema_field.name}: pqloader encodes uint8 images only, got {value.dtype}")
        if value.ndim == 2:
            image = Image.fromarray(value, mode="L")
        elif value.ndim == 3 and value.shape[2] == 3:
            image = Image.fromarray(value, mode="RGB")
        else:
            raise ValueError("Unexpected image dimensions. Supported dimensions are (H, W) or (H, W, 3). "
                             f"Got {value.shape}")
        out = io.BytesIO()
        if self.image_codec in ("jpeg", "jpg"):
            image.save(out, format="JPEG", quality=int(self._quality))
        elif self.image_codec == "png":
            image.save(out, format="PNG")
        else:
            raise ValueError(f"pqloader encodes 'png' and 'jpeg' images, not {self.image_codec!r}")
        return bytearray(out.getvalue())

    def decode(self, unischema_field: Any, value: Any) -> np.ndarray:
        from PIL import Image

        image = Image.open(io.BytesIO(bytes(value)))
        gray = len(unischema_field.shape) == 2
        return np.asarray(image.convert("L" if gray else "RGB"))

    def engine_ops(self, unischema_field: Any) -> list[T.Op]:
        shape = tuple(unischema_field.shape or ())
        if np.dtype(unischema_field.numpy_dtype) != np.uint8:
            from pqloader._errors import UnsupportedTypeError

            raise UnsupportedTypeError(
                f"field {unischema_field.name!r} holds {np.dtype(unischema_field.numpy_dtype)} images "
                "(CompressedImageCodec); pqloader decodes 8-bit images only: read the column raw "
                "(make_batch_reader) and decode it in a TransformSpec")
        return [T.DecodeImage(mode="gray" if len(shape) == 2 else "rgb")]

    def __str__(self) -> str:
        return f"{type(self).__name__}('{self.image_codec}', {self._quality})"


def _check_engine_array_dtype(field: Any, codec: str) -> None:
    """Refuse, when the reader is made, an array field the engine's decoders cannot return
    (they decode numeric and bool ``.npy`` arrays only): Petastorm's writer takes complex,
    string and datetime arrays, which had failed only at the first row, in a worker."""
    try:
        kind = np.dtype(field.numpy_dtype).kind
    except TypeError:
        kind = "O"
    if kind not in "biuf":
        from pqloader._errors import UnsupportedTypeError

        raise UnsupportedTypeError(
            f"field {field.name!r} holds {getattr(field.numpy_dtype, '__name__', field.numpy_dtype)} arrays "
            f"({codec}); pqloader decodes numeric and bool arrays only: leave it out of schema_fields, or read "
            "the column raw (make_batch_reader) and decode it with the codec in a TransformSpec")


class NdarrayCodec(DataframeColumnCodec):
    """``np.save`` bytes of an array (read with ``DecodeNdarray``)."""

    def encode(self, unischema_field: Any, value: Any) -> bytearray:
        _check_array(unischema_field, value)
        out = io.BytesIO()
        np.save(out, value)
        return bytearray(out.getvalue())

    def decode(self, unischema_field: Any, value: Any) -> np.ndarray:
        return np.load(io.BytesIO(bytes(value)), allow_pickle=False)

    def engine_ops(self, unischema_field: Any) -> list[T.Op]:
        _check_engine_array_dtype(unischema_field, type(self).__name__)
        return [T.DecodeNdarray()]

    def __str__(self) -> str:
        return f"{type(self).__name__}()"


class CompressedNdarrayCodec(DataframeColumnCodec):
    """``np.savez_compressed(arr=...)`` bytes (read with ``DecodeCompressedNdarray``)."""

    def encode(self, unischema_field: Any, value: Any) -> bytearray:
        _check_array(unischema_field, value)
        out = io.BytesIO()
        np.savez_compressed(out, arr=value)
        return bytearray(out.getvalue())

    def decode(self, unischema_field: Any, value: Any) -> np.ndarray:
        return np.load(io.BytesIO(bytes(value)), allow_pickle=False)["arr"]

    def engine_ops(self, unischema_field: Any) -> list[T.Op]:
        _check_engine_array_dtype(unischema_field, type(self).__name__)
        return [T.DecodeCompressedNdarray()]

    def __str__(self) -> str:
        return f"{type(self).__name__}()"


_INTEGER_TYPES = ("ByteType", "ShortType", "IntegerType", "LongType")
_FLOAT_TYPES = ("FloatType", "DoubleType")


class ScalarCodec(DataframeColumnCodec):
    """A scalar stored as its Spark type; read as it is, as the field's NumPy type."""

    def __init__(self, spark_type: Any) -> None:
        self._spark_type = spark_type

    def encode(self, unischema_field: Any, value: Any) -> Any:
        unsized = isinstance(value, np.ndarray) and value.shape == ()
        if not unsized and hasattr(value, "__len__") and not isinstance(value, str):
            raise TypeError(f"Expected a scalar as a value for field '{unischema_field.name}'. "
                            f"Got a non-numpy type'{type(value)}'")
        if unischema_field.shape:
            raise ValueError(f"The shape field of unischema_field '{unischema_field.name}' must be an "
                             f"empty tuple (i.e. '()' to indicate a scalar. However, the actual shape "
                             f"is {unischema_field.shape}")
        name = spark_type_name(self._spark_type)
        if name in _INTEGER_TYPES:
            return int(value)
        if name in _FLOAT_TYPES:
            return float(value)
        if name == "BooleanType":
            return bool(value)
        if name == "StringType":
            if not isinstance(value, str):
                raise ValueError(f"Expected a string value for field {unischema_field.name}. "
                                 f"Got type {type(value)}")
            return str(value)
        return value

    def decode(self, unischema_field: Any, value: Any) -> Any:
        return unischema_field.numpy_dtype(value)

    def spark_dtype(self) -> Any:
        if isinstance(self._spark_type, SparkType):
            return self._spark_type.to_pyspark()
        return self._spark_type

    def engine_ops(self, unischema_field: Any) -> list[T.Op]:
        return []

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ScalarCodec) and \
            spark_type_name(other._spark_type) == spark_type_name(self._spark_type)

    def __hash__(self) -> int:
        return hash(("ScalarCodec", spark_type_name(self._spark_type)))

    def __str__(self) -> str:
        return f"{type(self).__name__}({spark_type_name(self._spark_type)}())"


def is_compliant_shape(a: tuple, b: tuple) -> bool:
    """Whether shape `a` fits `b`, where None in either matches any size (Petastorm's rule)."""
    if len(a) != len(b):
        return False
    return all(not (x and y) or x == y for x, y in zip(a, b))


__all__ = ["DataframeColumnCodec", "CompressedImageCodec", "NdarrayCodec", "CompressedNdarrayCodec",
           "ScalarCodec", "SparkType"]
