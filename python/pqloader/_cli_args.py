"""Command-line spellings of Loader arguments: ``--transform`` and ``--storage-option``.

``--transform COLUMN=OPS``: OPS are :mod:`pqloader.transforms` ops written as in Python,
comma-separated, e.g. ``image=DecodeImage(), Resize(256), CenterCrop(224)`` or
``x=Cast("float32")``. Only the ops' class names and literal arguments (numbers,
strings, lists, tuples, True/False/None) are accepted: the text is parsed, never run.
Repeat the option for more columns.

A column name with a comma, an ``=``, spaces at an end or a backtick (in ``--columns``
and ``--transform``) is written in backticks, as the filter writes one: ```a,b```,
```x=y`=Cast("float32")``; a backtick in it is written twice, and two backticks alone
name the column whose name is empty.

``--storage-option KEY=VALUE``: one entry of ``storage_options`` (the value as text; the
engine checks names and values). Repeat it for more.
"""

from __future__ import annotations

import ast
from typing import Iterable

from pqloader import _filter
from pqloader import transforms as _transforms


def _op_classes() -> dict[str, type]:
    return {name: getattr(_transforms, name) for name in _transforms.__all__ if name != "Op"}


def _literal(node: ast.AST, text: str) -> object:
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise ValueError(f"--transform: arguments must be literals, got "
                         f"{ast.get_source_segment(text, node)!r}") from None


def parse_transform(spec: str) -> tuple[str, list[_transforms.Op]]:
    """``"col=Op(...), Op(...)"`` -> ``("col", [ops])``.

    Raises:
        ValueError: No ``=``, no column, not Python syntax, an unknown op (the message
            lists the known ones), or a non-literal argument.
    """
    try:
        return _parse_transform(spec)
    except RecursionError:  # ast.parse or ast.literal_eval on deep nesting
        raise ValueError(f"--transform {_filter.shorten(spec)!r}: nested too deeply") from None


def _quoted_column(text: str, what: str) -> tuple[str, int]:
    """The `quoted` column name at the start of ``text`` (after spaces) and the index
    after it."""
    start = len(text) - len(text.lstrip())
    name, end = _filter.read_quoted_name(text, start)
    if name is None:
        raise ValueError(f"{what} {text!r}: a `quoted column name` is not closed")
    return name, end


def column_list(text: str) -> list[str]:
    """``--columns``' ``"a, b, `c,d`"`` -> ``["a", "b", "c,d"]``: names split at commas
    and stripped of spaces, or written in backticks (taken as they are)."""
    names: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i < n and text[i] == "`":
            name, end = _quoted_column(text[i:], "--columns")
            i += end
            while i < n and text[i].isspace():
                i += 1
            if i < n and text[i] != ",":
                raise ValueError(f"--columns {text!r}: a comma must follow the `quoted name` "
                                 f"{_filter.quote_name(name)}")
        else:
            j = text.find(",", i)
            j = n if j < 0 else j
            name, i = text[i:j].strip(), j
            if not name:
                raise ValueError(f"an empty column name in {text!r} (omit --columns for all; "
                                 "the column whose name is empty is written ``)")
        names.append(name)
        if i >= n:
            return names
        i += 1  # the comma


def _parse_transform(spec: str) -> tuple[str, list[_transforms.Op]]:
    if spec.lstrip().startswith("`"):  # `a column=with, odd name`=OPS
        column, end = _quoted_column(spec, "--transform")
        sep, ops_text = spec[end:].lstrip()[:1], spec[end:].lstrip()[1:]
        if sep != "=":
            raise ValueError(f"--transform {spec!r}: '=' must follow the `quoted column name` "
                             f"{_filter.quote_name(column)}")
    else:
        column, sep, ops_text = spec.partition("=")
        column = column.strip()
    if not sep or not column and not spec.lstrip().startswith("`") or not ops_text.strip():
        raise ValueError(f"--transform takes COLUMN=OP(...)[, OP(...)], got {spec!r} (a column "
                         "whose name has '=', ',' or spaces at an end is written in backticks: "
                         "`x=y`=OPS)")
    try:
        tree = ast.parse(ops_text.strip(), mode="eval").body
    except SyntaxError as e:
        raise ValueError(f"--transform {spec!r}: not a list of ops ({e.msg})") from None
    calls = list(tree.elts) if isinstance(tree, (ast.Tuple, ast.List)) else [tree]
    known = _op_classes()
    ops = []
    text = ops_text.strip()
    for call in calls:
        if isinstance(call, ast.Name):  # `ToCHW` for `ToCHW()`
            call = ast.Call(func=call, args=[], keywords=[])
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
            raise ValueError(f"--transform {spec!r}: each op is Name(args), got "
                             f"{ast.get_source_segment(text, call)!r}")
        cls = known.get(call.func.id)
        if cls is None:
            raise ValueError(f"--transform {spec!r}: unknown op {call.func.id!r}; known: "
                             f"{', '.join(sorted(known))}")
        if any(k.arg is None for k in call.keywords):
            raise ValueError(f"--transform {spec!r}: **kwargs are not accepted")
        names = [k.arg for k in call.keywords]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:  # Python refuses this; the dict below kept the last silently
            raise ValueError(f"--transform {spec!r}: {call.func.id}: keyword argument "
                             f"{repeated[0]!r} repeated")
        args = [_literal(a, text) for a in call.args]
        kwargs = {k.arg: _literal(k.value, text) for k in call.keywords}
        try:
            ops.append(cls(*args, **kwargs))
        except TypeError as e:
            raise ValueError(f"--transform {spec!r}: {call.func.id}: {e}") from None
    return column, ops


def parse_transforms(specs: Iterable[str] | None) -> dict[str, list[_transforms.Op]] | None:
    """Repeated ``--transform`` options -> Loader's ``transforms`` (None if none)."""
    out: dict[str, list[_transforms.Op]] = {}
    for spec in specs or ():
        column, ops = parse_transform(spec)
        if column in out:
            raise ValueError(f"--transform: column {column!r} given twice (list every op "
                             f"of a column in one option)")
        out[column] = ops
    return out or None


def parse_storage_options(items: Iterable[str] | None) -> dict[str, str] | None:
    """Repeated ``--storage-option KEY=VALUE`` -> ``storage_options`` (None if none)."""
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--storage-option takes KEY=VALUE, got {item!r}")
        if key.strip() in out:  # (the last one won, silently: a typo'd second region)
            raise ValueError(f"--storage-option: {key.strip()!r} given twice "
                             f"({out[key.strip()]!r} and {value!r})")
        out[key.strip()] = value
    return out or None
