"""Row filters: ``Loader(filter=...)``.

A filter is a pyarrow compute expression (``pc.field("lang") == "en"``), a string in a
small Python-like syntax (``"lang == 'en' and ts >= timestamp('2024-01-01')"``, the
CLI's ``--filter``), a
:class:`Predicate` (a Python function on whole Arrow record batches), or a list of these
(all must hold). The engine pushes it down in C++ (``cpp/src/pqloader/filter/``): hive
partition keys prune files, row-group statistics prune row groups, the remaining row
groups are read (the filter's columns only) for a row mask, once, before the first epoch.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Callable, Sequence

from . import _temporal


class Predicate:
    """A row filter in Python, run on whole record batches (Petastorm's ``in_lambda``).

    Args:
        columns: The columns ``fn`` reads (top-level columns or partition keys).
        fn: Called with a ``pyarrow.RecordBatch`` of those columns (one row group;
            a number column whose files store it in other types, or that ``schema=``
            declares, in the type the loader loads it as, as an expression compares it;
            float16 as float32; strings and bytes of a dictionary, view or fixed-size
            layout as plain string or binary),
            returns one bool per row (a pyarrow or NumPy array of booleans, or a
            list of bools; any other type is an error); null counts as False. Called
            from the engine's threads, once per row group that statistics do not
            decide, with the GIL held: calls run one at a time unless ``fn`` releases
            the GIL (NumPy, pyarrow compute), so it must be thread-safe. An exception
            it raises becomes a :class:`pqloader.Error` naming the row group, but
            ``KeyboardInterrupt`` and ``SystemExit`` (``sys.exit``) come out of the
            Loader's construction as themselves, the same objects.

    Cost: one Python call per row group, on vectorised batches (not per row); with an
    expression as well, the expression prunes first. Its selection is not kept in
    ``cache_dir`` (a function has no identity to key it by): it runs on every start.
    """

    def __init__(self, columns: Sequence[str], fn: Callable[[Any], Any]) -> None:
        try:  # once: a generator's names were used up by the check below (columns [])
            names = None if isinstance(columns, str) else list(columns)
        except TypeError:  # not iterable (an int)
            names = None
        if names is None or not all(isinstance(c, str) for c in names):
            raise TypeError(f"Predicate columns must be a list of column names, got {columns!r}")
        columns = names
        if not columns:
            raise ValueError("Predicate needs the columns it reads")
        if not callable(fn):
            raise TypeError(f"Predicate fn must be callable, got {type(fn).__name__}")
        self.columns = list(dict.fromkeys(columns))
        self.fn = fn

    def __repr__(self) -> str:
        return f"Predicate({self.columns!r}, {getattr(self.fn, '__name__', self.fn)!r})"


def _compute() -> Any:
    try:
        import pyarrow.compute as pc
    except ImportError as e:  # pragma: no cover - filters are built with pyarrow
        raise ImportError("filters are pyarrow compute expressions: pip install pyarrow") from e
    return pc


_COMPARE = {ast.Eq: "__eq__", ast.NotEq: "__ne__", ast.Lt: "__lt__", ast.LtE: "__le__",
            ast.Gt: "__gt__", ast.GtE: "__ge__"}


def parse_filter(text: str) -> Any:
    """Parse ``text`` into a pyarrow compute expression.

    The syntax is Python's for comparisons (``==``, ``!=``, ``<``, ``<=``, ``>``,
    ``>=``, chained too), ``in`` / ``not in`` a list, ``and``, ``or``, ``not``,
    ``is None`` / ``is not None``; names are columns, literals are numbers, strings,
    True/False, and typed literals for temporal columns (pyarrow scalars, compared as
    pyarrow compares the same ``datetime``, ``date``, ``time`` and ``timedelta``):

    - ``timestamp('2024-01-01 12:00[:00[.fraction]]')``: naive, for a column without a
      time zone (``T`` may stand for the space, the time may be left out);
      ``timestamp('2024-01-01T12:00+02:00')`` or ``...Z``: that instant, a
      ``timestamp[us, tz=UTC]``; ``timestamp('2024-01-01 12:00', 'Europe/Paris')``: that
      wall-clock time in that zone (a named zone or ``+HH:MM``; the literal has that zone,
      so it compares with a column of that zone at any unit; its rules are Python's
      ``zoneinfo``, the system's tz database: every rank's must agree). Microseconds,
      or nanoseconds where the fraction has 7 to 9 digits. As in pyarrow, a naive one
      with a column that has a time zone (or the reverse) is refused, and an aware one
      with a column of another zone is compared only where their units agree.
    - ``date('2024-01-01')`` (date32), ``time('12:00[:00[.fraction]]')`` (time64 us or
      ns), ``duration(90, 's')`` (a count and a unit: s, ms, us or ns).

    A column whose name is no Python name (``my-col``, a keyword) is
    written in backticks: ``"`my-col` > 3"``. E.g.
    ``"lang == 'en' and 2020 <= year < 2024"``,
    ``"ts >= timestamp('2024-01-01') and day in [date('2024-01-01'), date('2024-02-01')]"``.

    Raises:
        TypeError: ``text`` is not a str.
        ValueError: ``text`` is not such an expression (with what is not accepted).
    """
    if not isinstance(text, str):  # ("object of type 'int' has no len()"; bytes: the reverse)
        raise TypeError(f"parse_filter takes the filter's text (str), got {type(text).__name__} "
                        f"{text!r}")
    try:
        return _parse_filter(text)
    except RecursionError:  # ast.parse, ast.literal_eval or convert() below on deep nesting
        raise ValueError(f"filter {shorten(text)!r} is nested too deeply") from None


def shorten(text: str, limit: int = 80) -> str:
    """`text`, cut to `limit` characters and "..." when longer (for error messages)."""
    return text if len(text) <= limit else f"{text[:limit]}..."


def read_quoted_name(text: str, i: int) -> tuple[str | None, int]:
    """The quoted name that starts at ``text[i]`` (a backtick) and the index after its
    closing backtick; (None, len(text)) when it is not closed. A backtick in the name is
    written twice, as Spark SQL writes it (a`b as three backticks around a, two, b), and
    two backticks alone name the column whose name is empty."""
    parts: list[str] = []
    j, n = i + 1, len(text)
    while j < n:
        end = text.find("`", j)
        if end < 0:
            break
        parts.append(text[j:end])
        if text.startswith("``", end):
            parts.append("`")
            j = end + 2
            continue
        return "".join(parts), end + 1
    return None, n


def quote_name(name: str) -> str:
    """``name`` as a `quoted name` (backticks in it doubled)."""
    return "`" + name.replace("`", "``") + "`"


def _quoted_names(source: str, shown: str) -> tuple[str, dict[str, str]]:
    """`source` with each `quoted name` (a column that is no Python name) replaced by an
    identifier the text does not use; returns the text and {identifier: name}."""
    if "`" not in source:
        return source, {}
    out: list[str] = []
    names: dict[str, str] = {}
    i, n = 0, len(source)
    while i < n:
        c = source[i]
        if c in "'\"":  # a string literal: copied as it is, backticks and all
            quote = source[i:i + 3] if source[i:i + 3] in ("'''", '"""') else c
            j = i + len(quote)
            while j < n and not source.startswith(quote, j):
                j += 2 if source[j] == "\\" else 1
            out.append(source[i:j + len(quote)])
            i = j + len(quote)
        elif c == "`":
            name, i = read_quoted_name(source, i)
            if name is None:
                raise ValueError(f"filter {shown!r}: a `quoted column name` is not closed")
            k = len(names)
            while f"_pq_column_{k}" in source or f"_pq_column_{k}" in names:  # (both: unique)
                k += 1
            ident = f"_pq_column_{k}"
            names[ident] = name
            out.append(ident)
        else:
            out.append(c)
            i += 1
    return "".join(out), names


def _parse_filter(text: str) -> Any:
    pc = _compute()
    import pyarrow as pa  # imported with pyarrow.compute
    shown = shorten(text, 200)  # in messages (a 1 MB filter made a 1 MB message)
    source, quoted = _quoted_names(text.strip(), shown)
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"filter {shown!r} is not an expression: {e.msg}") from None
    except UnicodeEncodeError:  # a lone surrogate: not UTF-8, no column's name or value
        raise ValueError(f"filter {shown!r} is not UTF-8 text (it has a lone surrogate)") from None

    def written(node: ast.AST) -> str:  # as the text names its `quoted` columns, not by their stand-ins
        text = ast.unparse(node)
        return re.sub(r"\b_pq_column_\d+\b", lambda m: quote_name(quoted[m[0]]) if m[0] in quoted else m[0],
                      text) if quoted else text

    def literal(node: ast.AST) -> Any:
        try:
            return ast.literal_eval(node)
        except ValueError:
            hint = ("; the typed literals are " + ", ".join(form for _, _, form in _temporal.TYPED.values())
                    if isinstance(node, ast.Call) else "")
            raise ValueError(f"filter {shown!r}: {written(node)!r} is neither a column nor a literal "
                             f"(a column whose name is no Python name is written in backticks: `my-col`{hint})"
                             ) from None

    def typed(node: ast.AST) -> _temporal.Typed | None:
        """A typed literal (``timestamp('...')``), or None where ``node`` is no such call."""
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _temporal.TYPED):
            return None
        make, (least, most), form = _temporal.TYPED[node.func.id]
        if node.keywords or not least <= len(node.args) <= most:
            raise ValueError(f"filter {shown!r}: {written(node)!r}: write {form}")
        args = []
        for a in node.args:
            try:
                args.append(ast.literal_eval(a))
            except ValueError:
                raise ValueError(f"filter {shown!r}: {written(node)!r}: its arguments are literals, "
                                 f"not {written(a)!r} (write {form})") from None
        if node.func.id != "duration" and not all(isinstance(a, str) for a in args):
            raise ValueError(f"filter {shown!r}: {written(node)!r}: its arguments are text (write {form})")
        try:
            return make(*args)
        except (ValueError, OverflowError) as e:  # (datetime's: "month must be in 1..12")
            raise ValueError(f"filter {shown!r}: {written(node)!r}: {e}") from None

    def values_of(node: ast.AST) -> Any:
        """The values of an 'in' list: Python values, or an array of typed literals."""
        items = node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else None
        if isinstance(node, ast.Set) and not any(isinstance(e, ast.Call) for e in items):
            # As written: a set's order follows its strings' hashes, another per process
            # (PYTHONHASHSEED), so a state saved in one was refused in the next as "another filter".
            return list(dict.fromkeys(literal(ast.List(elts=node.elts, ctx=ast.Load()))))
        if items is None or not any(isinstance(e, ast.Call) for e in items):
            return literal(node)
        out: list[_temporal.Typed | None] = []
        for e in items:
            t = typed(e)
            if t is None:
                v = literal(e)
                if v is not None:
                    raise ValueError(f"filter {shown!r}: {written(node)!r} mixes {written(e)!r} with "
                                     "typed literals")
            out.append(t)
        present = [t for t in out if t is not None]
        try:
            present = _temporal.same_type(present)
        except ValueError as e:
            raise ValueError(f"filter {shown!r}: {written(node)!r}: {e}") from None
        kept = iter(present)
        return pa.array([None if t is None else next(kept).value for t in out], present[0].arrow_type())

    lines: list[bytes] = []

    def column(node: ast.Name) -> Any:
        # As written: Python folds identifiers to NFKC ("µs" to "μs", "ﬁle" to "file"),
        # which would name another column, or none. Not by ast.get_source_segment, which
        # splits the whole text per name (a filter of 10,000 comparisons took minutes).
        if node.id in quoted:
            return pc.field(quoted[node.id])
        if source.isascii():  # nothing to fold
            return pc.field(node.id)
        if not lines:  # the lines as Python's tokenizer ends them; offsets in UTF-8 bytes
            lines.extend(line.encode() for line in re.split(r"\r\n|\r|\n", source))
        return pc.field(lines[node.lineno - 1][node.col_offset:node.end_col_offset].decode())

    def term(node: ast.AST) -> Any:
        if isinstance(node, ast.Name):
            return column(node)
        t = typed(node)
        if t is not None:
            return pc.scalar(t.scalar())
        value = literal(node)
        if value is None:  # "x == None" kept no row (a comparison with null is null)
            raise ValueError(f"filter {shown!r}: compare with None by 'is None' or 'is not None'")
        if isinstance(value, int) and not isinstance(value, bool) and 2**63 <= value < 2**64:
            return pc.scalar(pa.scalar(value, pa.uint64()))  # pc.scalar takes int64 only
        return pc.scalar(value)

    def convert(node: ast.AST) -> Any:
        if isinstance(node, ast.BoolOp):
            parts = [convert(v) for v in node.values]
            out = parts[0]
            for p in parts[1:]:
                out = (out & p) if isinstance(node.op, ast.And) else (out | p)
            return out
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return ~convert(node.operand)
        if isinstance(node, ast.Compare):
            out, left = None, node.left
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)):
                    if isinstance(right, ast.Name):  # `1 in i`: a column, not values
                        raise ValueError(f"filter {shown!r}: 'in' needs a list of values, "
                                         f"not the column {quoted.get(right.id, right.id)!r}")
                    values = values_of(right)
                    if isinstance(values, (list, tuple, set)):
                        values = list(values)
                        if any(isinstance(v, int) and not isinstance(v, bool) and v >= 2**63 for v in values):
                            values = pa.array(values, pa.uint64())  # pyarrow infers int64 only
                    elif not isinstance(values, pa.Array):  # (an array: of typed literals)
                        raise ValueError(f"filter {shown!r}: 'in' needs a list of values")
                    e = term(left).isin(values)
                    e = ~e if isinstance(op, ast.NotIn) else e
                elif isinstance(op, (ast.Is, ast.IsNot)):
                    if not (isinstance(right, ast.Constant) and right.value is None):
                        raise ValueError(f"filter {shown!r}: 'is' is only for 'is None'")
                    e = term(left).is_null()
                    e = ~e if isinstance(op, ast.IsNot) else e
                elif type(op) in _COMPARE:
                    e = getattr(term(left), _COMPARE[type(op)])(term(right))
                else:  # pragma: no cover - every ast.cmpop is handled above
                    raise ValueError(f"filter {shown!r}: {type(op).__name__} is not accepted")
                out = e if out is None else (out & e)
                left = right
            return out
        if isinstance(node, ast.Name):
            return column(node)  # a bool column
        raise ValueError(f"filter {shown!r}: {written(node)!r} is not a comparison, "
                         "'in', 'is None', and/or/not")

    try:
        return convert(tree.body)
    except (OverflowError, TypeError, pa.ArrowInvalid) as e:  # a literal pyarrow cannot hold
        raise ValueError(f"filter {shown!r}: {e}") from None


def check_filter(value: Any) -> Any:
    """Check a ``filter=`` argument; return it normalised (strings parsed).

    Returns:
        None, an expression, a :class:`Predicate`, or a tuple of them (all must hold).

    Raises:
        TypeError: not an expression, string, Predicate or list of them.
        ValueError: a string that does not parse.
    """
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        if not value:
            return None
        parts = tuple(check_filter(v) for v in value)
        flat: list[Any] = []
        for p in parts:
            flat.extend(p if isinstance(p, tuple) else [p])
        return tuple(p for p in flat if p is not None)
    if isinstance(value, str):
        return parse_filter(value)
    if isinstance(value, Predicate):
        return value
    if type(value).__name__ == "Expression" and type(value).__module__.startswith("pyarrow"):
        return value
    if callable(value):
        raise TypeError("filter= takes a function as pqloader.Predicate(columns, fn), naming the "
                        "columns it reads")
    raise TypeError("filter must be a pyarrow.compute expression, a string such as "
                    f"\"lang == 'en'\", a pqloader.Predicate or a list of them, got {type(value).__name__}")


def same_filter(a: Any, b: Any) -> bool:
    """Whether two checked ``filter=`` values are the same filter (expressions compared
    with ``Expression.equals``, which ``==`` would build into a new expression)."""
    a, b = (v[0] if isinstance(v, tuple) and len(v) == 1 else v for v in (a, b))
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)
                and all(same_filter(x, y) for x, y in zip(a, b)))
    if a is None or b is None or isinstance(a, Predicate) or isinstance(b, Predicate):
        return a is b
    return type(a) is type(b) and bool(a.equals(b))


def _parts(value: Any) -> tuple[list[Any], list[Predicate]]:
    items = value if isinstance(value, tuple) else (value,)
    exprs = [v for v in items if v is not None and not isinstance(v, Predicate)]
    preds = [v for v in items if isinstance(v, Predicate)]
    return exprs, preds


def _call(predicates: list[Predicate]) -> Callable[[Any, Any], tuple[Any, Any]]:
    """The engine's callable: (schema capsule, array capsule) -> (schema, array) capsules."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def call(schema_capsule: Any, array_capsule: Any) -> tuple[Any, Any]:
        batch = pa.RecordBatch._import_from_c_capsule(schema_capsule, array_capsule)
        keep = None
        for p in predicates:
            result = p.fn(batch.select(p.columns))
            if isinstance(result, pa.ChunkedArray):
                result = result.combine_chunks()
            if not isinstance(result, pa.Array):
                try:  # NumPy arrays, lists, pandas (nullable) booleans
                    result = pa.array(result)
                except (pa.ArrowException, TypeError, ValueError) as e:
                    raise TypeError(f"{p!r} returned {type(result).__name__}, not one bool per row "
                                    f"({e})") from None
            if result.type == pa.null():  # [] for an empty row group, [None] * n: nulls count as False
                result = result.cast(pa.bool_())
            # Only booleans: a mask of floats (NaN, 0.3) or of strings ("False") taken
            # as truth values would keep rows silently.
            if result.type != pa.bool_():
                raise TypeError(f"{p!r} returned values of {result.type}, not bool")
            if len(result) != batch.num_rows:
                raise ValueError(f"{p!r} returned {len(result)} values for {batch.num_rows} rows")
            keep = result if keep is None else pc.and_kleene(keep, result)
        return keep.__arrow_c_array__()

    return call


# Options fields the engine's Arrow (25) reads that an older pyarrow does not write, with
# the value that keeps the older pyarrow's behaviour (Arrow's deserializer refuses an
# options struct that lacks a field: "Cannot deserialize field lean_left_on_odd_padding of
# options type PadOptions", for every utf8_center/lpad/rpad filter of pyarrow < 19).
_ADDED_OPTION_FIELDS = {b"PadOptions": [("lean_left_on_odd_padding", True)]}


def _for_engine_arrow(data: bytes) -> bytes:
    """`data` (arrow::compute::Serialize's bytes, an Arrow IPC file of one row whose
    struct columns are the calls' options) with the fields of _ADDED_OPTION_FIELDS that
    an older pyarrow left out added, at the value its own kernels used; else unchanged."""
    if not any(name in data for name in _ADDED_OPTION_FIELDS):  # (most filters: no parse)
        return data
    import pyarrow as pa
    reader = pa.ipc.open_file(pa.py_buffer(data))
    if reader.num_record_batches != 1:
        return data
    batch = reader.get_batch(0)
    schema, columns, changed = reader.schema, list(batch.columns), False
    for i, array in enumerate(columns):
        t = array.type
        if not pa.types.is_struct(t) or t.get_field_index("_type_name") < 0:
            continue
        name = array.field("_type_name")[0].as_py()
        added = [(f, v) for f, v in _ADDED_OPTION_FIELDS.get(name, []) if t.get_field_index(f) < 0]
        if not added:
            continue
        fields = [t.field(k) for k in range(t.num_fields)]
        arrays = [array.field(k) for k in range(t.num_fields)]
        for f, v in added:
            fields.append(pa.field(f, pa.bool_()))
            arrays.append(pa.array([v] * len(array), pa.bool_()))
        columns[i] = pa.StructArray.from_arrays(arrays, fields=fields)
        schema = schema.set(i, schema.field(i).with_type(columns[i].type))
        changed = True
    if not changed:
        return data
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:  # (the schema's metadata, the calls, kept)
        writer.write_batch(pa.record_batch(columns, schema=schema))
    return sink.getvalue().to_pybytes()


def to_engine(value: Any) -> dict[str, Any]:
    """The engine's ``filter`` (serialized expression) and ``predicate`` options."""
    if value is None:
        return {"filter": None, "predicate": None}
    exprs, preds = _parts(value)
    out: dict[str, Any] = {"filter": None, "predicate": None}
    if exprs:
        e = exprs[0]
        for x in exprs[1:]:
            e = e & x
        # What pyarrow pickles: arrow::compute::Serialize's bytes, read by the engine's Arrow.
        out["filter"] = _for_engine_arrow(e.__reduce__()[1][0].to_pybytes())
    if preds:
        columns = list(dict.fromkeys(c for p in preds for c in p.columns))
        out["predicate"] = (columns, _call(preds))
    return out


def describe(value: Any) -> str:
    """The filter as text (for messages and ``inspect``)."""
    exprs, preds = _parts(value)
    return " and ".join([str(e) for e in exprs] + [repr(p) for p in preds])
