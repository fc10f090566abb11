"""Petastorm's TransformSpec: a user function on rows (make_reader) or DataFrames
(make_batch_reader), and the schema edits it makes.

pqloader runs ``func`` per batch, in order, in the loader's batch_transform thread: for
``make_reader`` on each row of the batch (a dict of that row's decoded values), for
``make_batch_reader`` once on the batch as a pandas DataFrame. ``removed_fields`` are
dropped afterwards when ``func`` left them; ``edit_fields`` declare new or changed fields
and ``selected_fields`` pick and order the output, as in Petastorm.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

from pqloader.petastorm.unischema import Unischema, UnischemaField


def edit_field(name: str, numpy_dtype: Any, shape: tuple, nullable: bool = False) -> tuple:
    """The 4-tuple ``(name, numpy_dtype, shape, nullable)`` of ``TransformSpec.edit_fields``."""
    return name, numpy_dtype, shape, nullable


class TransformSpec:
    """A transform of loaded rows and the resulting schema change (Petastorm's API)."""

    def __init__(self, func: Callable[[Any], Any] | None = None, edit_fields: Sequence[tuple] | None = None,
                 removed_fields: Sequence[str] | None = None, selected_fields: Sequence[str] | None = None) -> None:
        self.func = func
        self.edit_fields = list(edit_fields or [])
        if removed_fields is not None and selected_fields is not None:
            raise ValueError("User can only specify one of removed_fields and selected_fields in TransformSpec.")
        self.removed_fields = list(removed_fields or [])
        self.selected_fields = None if selected_fields is None else list(selected_fields)


def transform_schema(schema: Unischema, spec: TransformSpec) -> Unischema:
    """The schema after `spec` (Petastorm's rules: edited fields go last, codec None)."""
    removed = set(spec.removed_fields)
    unknown = removed - set(schema.fields)
    if unknown:
        warnings.warn("remove_fields specified some field names that are not part of the schema. "
                      f'These field names will be ignored "{", ".join(sorted(unknown))}". ')
    exclude = {f[0] for f in spec.edit_fields} | removed
    fields = [f for name, f in schema.fields.items() if name not in exclude]
    for e in spec.edit_fields:
        # (name, numpy_dtype, shape, nullable), or a UnischemaField (Petastorm indexes the
        # entry, so one is accepted there too).
        nullable = e.nullable if hasattr(e, "nullable") else e[3]
        fields.append(UnischemaField(e[0], e[1], tuple(e[2]), None, nullable))
    if spec.selected_fields is not None:
        unknown = set(spec.selected_fields) - {f.name for f in fields}
        if unknown:
            warnings.warn("selected_fields specified some field names that are not part of the schema. "
                          f'These field names will be ignored "{", ".join(sorted(unknown))}". ')
        fields = sorted((f for f in fields if f.name in spec.selected_fields),
                        key=lambda f: spec.selected_fields.index(f.name))
    return Unischema(schema._name + "_transformed", fields)


__all__ = ["TransformSpec", "edit_field", "transform_schema"]
