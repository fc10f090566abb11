"""Petastorm's row predicates, evaluated on whole batches of the predicate columns.

Each predicate keeps Petastorm's ``get_fields()`` / ``do_include(values)`` interface (so
user subclasses of :class:`PredicateBase`, and Petastorm's own predicate objects, work
unchanged) and adds :meth:`PredicateBase.mask`, which takes ``{field: column}`` for a
whole batch and returns a boolean NumPy array. The built-ins vectorise where they can
(``in_set`` on numbers, ``in_reduce`` with ``all``/``any``, ``in_negate``); the others
call ``do_include`` once per row with that row's values, exactly as Petastorm does.
Results depend only on the values, so filtering is deterministic.
"""

from __future__ import annotations

import collections.abc
import hashlib
import sys
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np


def _row_dicts(columns: Mapping[str, Any], fields: Iterable[str]) -> Iterable[dict[str, Any]]:
    names = list(fields)
    cols = [columns[n] for n in names]
    n = len(cols[0]) if cols else 0
    for i in range(n):
        yield {name: col[i] for name, col in zip(names, cols)}


def batch_mask(predicate: Any, columns: Mapping[str, Any], num_rows: int) -> np.ndarray:
    """The rows of a batch that `predicate` keeps (any object with get_fields/do_include,
    or with a ``mask`` of whole batches)."""
    if callable(getattr(predicate, "mask", None)):
        mask = predicate.mask(columns)
    else:
        mask = np.fromiter((bool(predicate.do_include(r)) for r in _row_dicts(columns, predicate.get_fields())),
                           dtype=bool, count=num_rows)
    mask = np.asarray(mask, dtype=bool)
    if mask.shape != (num_rows,):
        raise ValueError(f"predicate {predicate!r} returned {mask.shape} values for {num_rows} rows")
    return mask


def isin_exact(column: np.ndarray, values: Sequence[Any]) -> np.ndarray:
    """``np.isin`` that compares integers exactly: NumPy turns a value list that mixes
    large ints with others (``[2**63 + 1, 4]``, ``[2**62 + 3, 0.5]``) into float64, where
    neighbouring integers are equal. For an integer or bool column, the values it cannot
    hold (fractions, out of its range, not numbers) are left out, the rest taken in its
    dtype."""
    values = list(values)
    if column.dtype.kind not in "iub":
        if not values:
            return np.zeros(len(column), dtype=bool)
        array = np.array(values)
        if column.dtype.kind == "f" and array.dtype.kind in "iuf":
            # Compared in the wider type, as Python's `in` compares (Petastorm's do_include):
            # NumPy 1 cast a short value list to a float32 column's type value by value
            # (float32(1/3) matched 1/3), a long one not, NumPy 2 never.
            common = np.promote_types(column.dtype, array.dtype)
            return np.isin(column.astype(common, copy=False), array.astype(common, copy=False))
        return np.isin(column, array)
    low, high = (0, 1) if column.dtype.kind == "b" else (np.iinfo(column.dtype).min, np.iinfo(column.dtype).max)
    held = []
    for v in values:
        if isinstance(v, (bool, np.bool_, int, np.integer)) or (
                isinstance(v, (float, np.floating)) and float(v).is_integer()):
            if low <= v <= high:
                held.append(int(v))
    return np.isin(column, np.array(held, dtype=column.dtype)) if held else np.zeros(len(column), dtype=bool)


class PredicateBase:
    """Base class of row predicates."""

    def get_fields(self) -> set[str]:
        raise NotImplementedError

    def do_include(self, values: Mapping[str, Any]) -> bool:
        raise NotImplementedError

    def mask(self, columns: Mapping[str, Any]) -> np.ndarray:
        """Whether each row of a batch is kept: ``columns`` maps each field to its column."""
        fields = sorted(self.get_fields())
        n = len(columns[fields[0]]) if fields else 0
        return np.fromiter((bool(self.do_include(r)) for r in _row_dicts(columns, fields)), dtype=bool, count=n)


def _string_to_bucket(string: str, bucket_num: int) -> int:
    return int(hashlib.md5(string.encode("utf-8")).hexdigest(), 16) % bucket_num


class in_set(PredicateBase):  # noqa: N801 - Petastorm's names
    """Keep rows whose `predicate_field` value is in `inclusion_values`."""

    def __init__(self, inclusion_values: Iterable[Any], predicate_field: str) -> None:
        self._inclusion_values = set(inclusion_values)
        self._predicate_field = predicate_field

    def get_fields(self) -> set[str]:
        return {self._predicate_field}

    def do_include(self, values: Mapping[str, Any]) -> bool:
        return values[self._predicate_field] in self._inclusion_values

    def mask(self, columns: Mapping[str, Any]) -> np.ndarray:
        col = columns[self._predicate_field]
        values = list(self._inclusion_values)
        if isinstance(col, np.ndarray) and col.ndim == 1 and col.dtype.kind in "biuf" and \
                all(isinstance(v, (int, float, np.number)) and not isinstance(v, bool) for v in values):
            return isin_exact(col, values)
        return super().mask(columns)


class in_intersection(PredicateBase):  # noqa: N801
    """Keep rows whose `predicate_field` (a list or array) holds one of `inclusion_values`."""

    def __init__(self, inclusion_values: Iterable[Any], _predicate_field: str) -> None:
        self._inclusion_values = list(inclusion_values)
        self._predicate_field = _predicate_field

    def get_fields(self) -> set[str]:
        return {self._predicate_field}

    def do_include(self, values: Mapping[str, Any]) -> bool:
        value = values[self._predicate_field]
        if not isinstance(value, collections.abc.Iterable):
            raise ValueError("Predicate field should have iterable type")
        return bool(np.isin(value, self._inclusion_values).any())

    def mask(self, columns: Mapping[str, Any]) -> np.ndarray:
        col = columns[self._predicate_field]
        if isinstance(col, np.ndarray) and col.ndim >= 2 and col.dtype.kind in "biuf":
            hit = np.isin(col, self._inclusion_values)
            return hit.reshape(len(col), -1).any(axis=1)
        return super().mask(columns)


class in_lambda(PredicateBase):  # noqa: N801
    """Keep rows for which ``predicate_func(*field values[, state_arg])`` is true."""

    def __init__(self, predicate_fields: list[str], predicate_func: Callable[..., bool],
                 state_arg: Any = None) -> None:
        if not isinstance(predicate_fields, list):
            raise ValueError("Predicate fields should be a list")
        self._predicate_fields = predicate_fields
        self._predicate_func = predicate_func
        self._state_arg = state_arg

    def get_fields(self) -> set[str]:
        return set(self._predicate_fields)

    def do_include(self, values: Mapping[str, Any]) -> bool:
        args = [values[f] for f in self._predicate_fields]
        if self._state_arg is not None:
            args.append(self._state_arg)
        return self._predicate_func(*args)


class in_negate(PredicateBase):  # noqa: N801
    """Keep the rows another predicate drops."""

    def __init__(self, predicate: PredicateBase) -> None:
        if not isinstance(predicate, PredicateBase):
            raise ValueError("Predicate is nor derived from PredicateBase")
        self._predicate = predicate

    def get_fields(self) -> set[str]:
        return self._predicate.get_fields()

    def do_include(self, values: Mapping[str, Any]) -> bool:
        return not self._predicate.do_include(values)

    def mask(self, columns: Mapping[str, Any]) -> np.ndarray:
        return ~self._predicate.mask(columns)


class in_reduce(PredicateBase):  # noqa: N801
    """Combine predicates with `reduce_func` over their results (``all``: and, ``any``: or)."""

    def __init__(self, predicate_list: Sequence[PredicateBase], reduce_func: Callable[[list], bool]) -> None:
        if not all(isinstance(p, PredicateBase) for p in predicate_list):
            raise ValueError("Predicate is nor derived from PredicateBase")
        self._predicate_list = list(predicate_list)
        self._reduce_func = reduce_func

    def get_fields(self) -> set[str]:
        fields: set[str] = set()
        for p in self._predicate_list:
            fields |= p.get_fields()
        return fields

    def do_include(self, values: Mapping[str, Any]) -> bool:
        return self._reduce_func([p.do_include(values) for p in self._predicate_list])

    def mask(self, columns: Mapping[str, Any]) -> np.ndarray:
        masks = [p.mask(columns) for p in self._predicate_list]
        if self._reduce_func is all:
            return np.logical_and.reduce(masks) if masks else np.ones(0, dtype=bool)
        if self._reduce_func is any:
            return np.logical_or.reduce(masks) if masks else np.zeros(0, dtype=bool)
        stacked = np.stack(masks, axis=1)
        return np.fromiter((bool(self._reduce_func(list(row))) for row in stacked), dtype=bool,
                           count=len(stacked))


class in_pseudorandom_split(PredicateBase):  # noqa: N801
    """Keep the `subset_index`-th of the fractions `fraction_list`, by an MD5 hash of
    ``str(value)`` of `predicate_field` (Petastorm's split, so the subsets are the same)."""

    def __init__(self, fraction_list: Sequence[float], subset_index: int, predicate_field: str) -> None:
        if subset_index >= len(fraction_list):
            raise ValueError("subset_index is out of range")
        self._predicate_field = predicate_field
        borders = [sum(fraction_list[:i + 1]) for i in range(len(fraction_list))]
        low = borders[subset_index - 1] if subset_index else 0
        self._bucket_low = low * (sys.maxsize - 1)
        self._bucket_high = borders[subset_index] * (sys.maxsize - 1)

    def get_fields(self) -> set[str]:
        return {self._predicate_field}

    def do_include(self, values: Mapping[str, Any]) -> bool:
        if self._predicate_field not in values.keys():
            raise ValueError(f"Tested values does not have split key: {self._predicate_field}")
        bucket = _string_to_bucket(str(values[self._predicate_field]), sys.maxsize)
        return self._bucket_low <= bucket < self._bucket_high

    def mask(self, columns: Mapping[str, Any]) -> np.ndarray:
        col = columns[self._predicate_field]
        return np.fromiter((self._bucket_low <= _string_to_bucket(str(v), sys.maxsize) < self._bucket_high
                            for v in col), dtype=bool, count=len(col))


__all__ = ["PredicateBase", "in_set", "in_intersection", "in_lambda", "in_negate", "in_reduce",
           "in_pseudorandom_split"]
