"""Loader arguments checked against the dataset's columns, once the footers are read.

``fill_null`` values against each column's type (and what a transform decodes), a pad or
eos value against the dtype that must hold it exactly, ``stack``'s columns against one
another's units. Kept apart from :mod:`pqloader._options`, whose checks need no data.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

import numpy as np

_TEXT_TYPES = ("string", "large_string", "utf8", "large_utf8")
_BYTES_TYPES = ("binary", "large_binary", "fixed_size_binary")


def _column_kind(info: Mapping[str, Any]) -> tuple[str, str | None]:
    """('number' | 'str' | 'bytes', NumPy dtype or None) of one column_info entry."""
    dtype = info.get("dtype")
    if not info.get("transformed"):
        if dtype in ("str", "bytes"):
            return dtype, None
        if dtype is not None:
            return "number", dtype
    # Made by transforms: the fill applies to the stored column, so go by its Arrow type.
    arrow_type = str(info.get("arrow_type", ""))
    if arrow_type.startswith("dictionary<values="):
        arrow_type = arrow_type[len("dictionary<values="):]
    if arrow_type.startswith(_TEXT_TYPES):
        return "str", None
    if arrow_type.startswith(_BYTES_TYPES):
        return "bytes", None
    # The stored numbers' dtype (a list's elements): the fill is cast to it before the
    # transform, so it must fit (2**31 in an int32 column cast to float32 was -2**31,
    # 1.5 was 1, 300 in a bool column True).
    # (A list's non-nullable elements print as "int16 not null"; times load as integers in
    # their unit. Decimals depend on `decimals`: the engine checks those.)
    element = _element_arrow_type(arrow_type).removesuffix(" not null")
    return "number", _STORED_DTYPES.get(element) or next(
        (dtype for prefix, dtype in _TIME_DTYPES if element.startswith(prefix)), None)


_STORED_DTYPES = {**{t: t for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                                     "uint64", "bool")},
                  "halffloat": "float16", "float": "float32", "double": "float64"}
_TIME_DTYPES = (("date32", "int32"), ("time32", "int32"), ("date64", "int64"), ("time64", "int64"),
                ("timestamp", "int64"), ("duration", "int64"))


def check_fill_types(fill_null: Any, columns: Mapping[str, Mapping[str, Any]]) -> None:
    """Check that each column's null replacement suits the column's type.

    A scalar ``fill_null`` applies to every column, so it must suit all of them; a
    dict only to the columns it names. Numeric columns take int, float or bool (an
    integer column only whole numbers in its dtype's range); string and bytes columns
    take str or bytes.

    Args:
        fill_null: The checked ``LoaderOptions.fill_null``.
        columns: ``Loader.column_info``: ``{name: {"dtype", "arrow_type", ...}}``.

    Raises:
        TypeError: A fill of the wrong kind, naming the column, its type and the value.
        ValueError: A numeric fill the column's dtype cannot hold, or a bytes fill of a
            str column that is not valid UTF-8.
    """
    if fill_null is None:
        return
    columns = {name: info for name, info in columns.items() if not info.get("mask")}  # never null
    if isinstance(fill_null, Mapping):
        pairs = [(name, value, f"fill_null[{name!r}]") for name, value in fill_null.items()
                 if name in columns]
    else:
        pairs = [(name, fill_null, "fill_null") for name in columns]
    pairs = [(name, value, where) for name, value, where in pairs if value is not None]
    scalar_hint = ("; a scalar fill_null applies to every column, a dict {column: value} only "
                   "to the ones it names")
    for name, value, where in pairs:  # kinds first, so a wrong kind is a TypeError
        kind, dtype = _column_kind(columns[name])
        type_name = dtype or columns[name].get("arrow_type")
        hint = scalar_hint if where == "fill_null" else ""
        if kind == "number" and isinstance(value, (str, bytes)):
            raise TypeError(f"{where}={value!r} is {type(value).__name__}, but column {name!r} is "
                            f"numeric ({type_name}): give an int or float{hint}")
        if kind != "number" and not isinstance(value, (str, bytes)):
            raise TypeError(f"{where}={value!r} is {type(value).__name__}, but column {name!r} holds "
                            f"{kind} ({type_name}): give a str or bytes{hint}")
    for name, value, where in pairs:
        kind, dtype = _column_kind(columns[name])
        if kind == "number" and dtype is not None:
            _check_numeric_fill(where, name, value, np.dtype(dtype))
        width = _fixed_width(columns[name])
        if width is not None and len(value.encode() if isinstance(value, str) else value) != width:
            # (pyarrow refuses such a scalar too: the column's values are all that long)
            raise ValueError(f"{where}={value!r} is not {width} bytes long, but column {name!r} "
                             f"is {columns[name].get('arrow_type')}: give a value of its width")
        if dtype is None and kind == "str" and isinstance(value, bytes) and \
                columns[name].get("dtype") == "str":
            # A str column's values are validated as UTF-8 when decoded: a bytes fill that
            # is not would be reported there as the file's data (naming a row that is null).
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                raise ValueError(f"{where}={value!r} is not valid UTF-8, but column {name!r} holds "
                                 "str: give a str, or pass strings=\"bytes\"") from None


# What the first bytes of a value each decode op takes must be (as the C++ decoders test
# them): a fill without them fails to decode on every null row it replaces.
_DECODE_INPUTS = {
    "DecodeNdarray": ((b"\x93NUMPY",), "a .npy array (np.save's bytes)"),
    "DecodeCompressedNdarray": ((b"PK\x03\x04",), "an .npz of one array (np.savez's bytes)"),
    "DecodeImage": ((b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n"), "a JPEG or PNG image"),
}


def valid_filter(name: str) -> str:
    """The filter, as text, that keeps the rows where column `name` is not null: a dotted
    name is a struct's field, which ``pc.field(name)`` does not find (filters name
    top-level columns: ``pc.field('image.bytes')`` is a ColumnNotFoundError), so its
    struct is read with ``struct_field``."""
    top, _, rest = name.partition(".")
    if not rest:
        return f"pc.field({name!r}).is_valid()"
    path = rest.split(".")
    field = repr(path[0]) if len(path) == 1 else repr(path)
    return f"pc.struct_field(pc.field({top!r}), {field}).is_valid()"


def check_decoded_fills(fill_null: Any, transforms: Any,
                        columns: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse a null row's replacement that a column's decode op cannot decode.

    A null row of a column whose ops start with ``DecodeImage``, ``DecodeNdarray`` or
    ``DecodeCompressedNdarray`` is decoded from its fill: ``fill_null``'s value for the
    column, else ``b""`` where ``null_mask`` masks it. A fill that is not what the op
    decodes made every null row fail as corrupt ("not a .npy array (bad magic)", naming
    a row that is null), or with ``on_decode_error="skip"`` be dropped and counted as a
    skipped corrupt row while its ``_valid`` flag, dropped with it, said nothing.

    Args:
        fill_null: The checked ``LoaderOptions.fill_null``.
        transforms: The checked ``LoaderOptions.transforms``.
        columns: ``Loader.column_info`` (``_valid`` masks included).

    Raises:
        ValueError: Naming the column, its op and the remedies: a fill of what the op
            decodes, or a filter dropping the null rows. Without a fill nothing is refused
            here (a masked column may hold no null): a null row fails when read, with an
            error saying the row is null (never skipped as a corrupt one).
    """
    if not isinstance(transforms, Mapping):
        return
    for name, ops in transforms.items():
        if not ops or name not in columns or getattr(ops[0], "name", None) not in _DECODE_INPUTS:
            continue
        starts, what = _DECODE_INPUTS[ops[0].name]
        remedy = (f"give fill_null={{{name!r}: <{what}>}} to decode in a null's place (its "
                  f"'{name}_valid' is False where null_mask= adds one), or drop the null rows "
                  f"with filter={valid_filter(name)}")
        if isinstance(fill_null, Mapping):
            fill, where = fill_null.get(name), f"fill_null[{name!r}]"
        else:
            fill, where = fill_null, "fill_null"
        if fill is not None:
            data = fill.encode() if isinstance(fill, str) else bytes(fill)
            if not data.startswith(starts):
                shown = repr(data[:16]) + ("..." if len(data) > 16 else "")
                raise ValueError(f"{where}={shown} ({len(data)} bytes) is not {what}, but column "
                                 f"{name!r} is decoded by {ops[0]!r}: each null row would fail to "
                                 f"decode (or be skipped as a corrupt row with on_decode_error="
                                 f"'skip'); {remedy}")
            continue


def explain_decoded_nulls(message: str, transforms: Any) -> str | None:
    """The engine's refusal of a column's nulls (from the footers), its remedy made right
    for a column whose first op decodes: the engine's hint gave the column's own fill
    (``fill_null={'image.bytes': ''}``), which ``check_decoded_fills`` then refuses, as
    every null row is decoded from its fill. For a ``<name>.bytes`` column it adds where
    Hugging Face ``datasets`` leaves such nulls: ``Dataset.to_parquet`` keeps an ``Image``
    or ``Audio`` made from a local file as its path alone (null bytes).

    Args:
        message: The text of the engine's ``InvalidDataError``.
        transforms: The checked ``LoaderOptions.transforms``.

    Returns:
        The message with the decode op's remedies, or None where it is not a null
        refusal of a decoded column (the message stands).
    """
    if not isinstance(transforms, Mapping):
        return None
    for name, ops in transforms.items():
        if not ops or getattr(ops[0], "name", None) not in _DECODE_INPUTS:
            continue
        head = f"column '{name}' ("
        if not message.startswith(head) or " null value(s): " not in message:
            continue
        fill = re.compile(r"pass fill_null=\{'" + re.escape(name) + r"': [^}]*\} to replace them")
        if not fill.search(message):
            continue
        what = _DECODE_INPUTS[ops[0].name][1]
        text = fill.sub(lambda _: f"pass fill_null={{'{name}': <{what}>}} to replace them", message, count=1)
        text = re.sub(r"\(nulls become [^)]*\)",
                      lambda _: f"(a null row is decoded from the fill, which {ops[0]!r} must "
                                f"take: {what}; without one a null row raises when read)", text, count=1)
        text = text.replace("or select other columns",
                            f"drop the null rows with filter={valid_filter(name)}, "
                            "or select other columns")
        if name.endswith(".bytes"):
            stem = name[: -len(".bytes")]
            text += (f" (a Hugging Face Image or Audio column that Dataset.to_parquet wrote from "
                     f"local files holds null bytes and the files' paths in '{stem}.path': "
                     f"embed the files before writing, ds.with_format('arrow').map("
                     f"datasets.table.embed_table_storage, batched=True), as push_to_hub does)")
        return text
    return None


def _fixed_width(info: Mapping[str, Any]) -> int | None:
    """The width of an untransformed fixed_size_binary column, else None."""
    arrow_type = str(info.get("arrow_type", "")).removeprefix("dictionary<values=")
    prefix = "fixed_size_binary["
    if info.get("transformed") or not arrow_type.startswith(prefix):
        return None
    return int(arrow_type[len(prefix):].rstrip("]"))


def _check_numeric_fill(where: str, name: str, value: Any, dtype: np.dtype) -> None:
    check_value_fits(f"{where}={value!r}", name, value, dtype)


def check_value_fits(what: str, name: str, value: int | float, dtype: np.dtype,
                     as_double: bool = False) -> None:
    """Refuse a number that column `name`'s `dtype` cannot hold exactly (it would be cast:
    ``300`` in int8 is 44, ``1e6`` in float16 inf, ``2`` in bool True, ``2**24 + 1`` in
    float32 2**24; a float is rounded to a float dtype as usual). `what` names the
    argument and its value; `as_double`: the engine takes the value as a double, so
    integers beyond 2**53 are refused too.

    Raises:
        ValueError: Naming `what`, the column and its dtype.
    """
    if dtype.kind in "iu":
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{what} is not a whole number, but column {name!r} is {dtype}")
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise ValueError(f"{what} does not fit column {name!r} ({dtype}: [{info.min}, {info.max}])")
        if as_double and abs(value) > 2**53:
            raise ValueError(f"{what}: values beyond 2**53 are not exact in column {name!r}")
    elif dtype.kind == "b":
        if value not in (0, 1):
            raise ValueError(f"{what} is not a bool (True, False, 1 or 0), but column {name!r} is bool")
    elif dtype.kind == "f":
        try:
            as_float = float(value)  # (an int beyond float64's range raises; np.isfinite refused ints beyond int64)
        except OverflowError:
            raise ValueError(f"{what} overflows column {name!r} ({dtype})") from None
        with np.errstate(over="ignore"):
            if math.isfinite(as_float) and not np.isfinite(dtype.type(as_float)):
                raise ValueError(f"{what} overflows column {name!r} ({dtype})")
        if isinstance(value, int) and not isinstance(value, bool) and int(dtype.type(value)) != value:
            # A whole number the float rounds (fill_null=2**24 + 1 in float32 was 2**24, a
            # value of the data; pyarrow's fill_null refuses it): integers load only exactly.
            raise ValueError(f"{what} is not exact in column {name!r} ({dtype}: it would be "
                             f"{int(dtype.type(value))})")


_PLAIN_INTEGER = re.compile(r"u?int(8|16|32|64)")
_TEMPORAL = ("timestamp", "date32", "date64", "time32", "time64", "duration")
_DECIMAL_SCALE = re.compile(r"decimal\d*\(\d+, (-?\d+)\)")
# A list type's text, its element's type in group 1 ("fixed_size_list<item: decimal128(10,
# 2)>[2]", "large_list<element: timestamp[ms]>").
_LIST_OF = re.compile(r"(?:large_|fixed_size_)?list<[^:<>]*: (.*)>(?:\[\d+\])?")


def _element_arrow_type(arrow_type: str) -> str:
    """The type of the numbers a column's ``arrow_type`` holds: itself, or its lists'
    elements at any depth (a stacked list column's elements are its integers too)."""
    while (m := _LIST_OF.fullmatch(arrow_type)) is not None:
        arrow_type = m.group(1)
    return arrow_type


def integer_unit(info: Mapping[str, Any], decimals: str) -> tuple[str, str] | None:
    """What a column's integers count beyond their dtype: ``("time", arrow type)`` for
    times (they load as integers in the stored unit, time zone and kind), ``("decimal",
    scale)`` for decimals with ``decimals="int64"`` (unscaled integers); None for other
    columns, masks and transformed ones (the user's to convert). Columns whose units
    differ cannot share one array (a stack, a mixture's column)."""
    if info.get("transformed") or info.get("mask"):
        return None
    element = _element_arrow_type(str(info.get("arrow_type") or ""))
    if element.startswith(_TEMPORAL):
        return "time", element
    if decimals == "int64" and (m := _DECIMAL_SCALE.match(element)):
        return "decimal", m.group(1)
    return None


def check_stack_units(stack: Mapping[str, Sequence[str]] | None, decimals: str,
                      columns: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse a stack whose members are integers of different units: times of different
    Arrow types (units, time zones or kinds: they load as integers in the stored unit) or,
    with ``decimals="int64"``, decimals of different scales (unscaled integers of two
    scales are different numbers). Files that disagree so are refused (SchemaMismatchError);
    one stacked tensor would mix them with nothing left to tell its columns apart (its
    ``column_info`` is the stack's). Members with transforms are the user's to convert.

    Args:
        stack: The checked ``LoaderOptions.stack``.
        decimals: ``LoaderOptions.decimals``.
        columns: The columns before stacking (``column_info(stacked=False)``).

    Raises:
        ValueError: Naming the stack, both columns and their types.
    """
    for name, members in (stack or {}).items():
        seen: dict[str, tuple[str, str]] = {}  # "time" / "decimal" -> (column, its unit)
        for column in members:
            info = columns.get(column)
            found = None if info is None else integer_unit(info, decimals)
            if found is None and info is not None and decimals == "int64" and \
                    not info.get("transformed") and not info.get("mask") and \
                    _PLAIN_INTEGER.fullmatch(_element_arrow_type(str(info.get("arrow_type") or ""))):
                # A plain integer is an unscaled integer of scale 0: beside decimal(9, 2)'s
                # 150 for 1.50 it was stacked (1 beside 150), where decimal(9, 0)'s was
                # refused (and a mixture refuses both).
                found = ("decimal", "0")
            if found is None:
                continue
            kind, unit = found
            arrow_type = str(info.get("arrow_type") or "")
            first = seen.setdefault(kind, (column, unit))
            if first[1] != unit:
                what = ("times of different units, time zones or kinds load as integers in "
                        "their own unit; one stacked tensor would mix them (write them in one "
                        "unit, or stack them apart)" if kind == "time" else
                        "with decimals='int64', unscaled integers of two scales are different "
                        "numbers; one stacked tensor would mix them (decimals='float64' loads "
                        "their values, or stack them apart)")
                raise ValueError(f"stack {name!r}: column {column!r} is {arrow_type}, column "
                                 f"{first[0]!r} {columns[first[0]]['arrow_type']}: {what}")
