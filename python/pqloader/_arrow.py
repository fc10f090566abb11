"""Arrow objects that leave pqloader through the Arrow PyCapsule protocol.

pqloader carries its own Arrow C++ (the wheel vendors it under mangled sonames), so it
never hands out pyarrow objects made by its Arrow: what leaves is a C Data Interface
struct in a PyCapsule, which any Arrow implementation of any version imports (pyarrow
>= 14, polars, DuckDB, nanoarrow). pyarrow itself is imported only by `to_pyarrow`.
"""

from __future__ import annotations

from typing import Any, Callable


class ArrowSchema:
    """A schema exported through the Arrow C Data Interface (``__arrow_c_schema__``).

    Example:
        >>> import pyarrow as pa
        >>> pa.schema(loader.arrow_schema)     # pyarrow >= 15; or .to_pyarrow()
    """

    __slots__ = ("_export",)

    def __init__(self, export: Callable[[], Any]) -> None:
        self._export = export

    def __arrow_c_schema__(self) -> Any:
        """Return a new PyCapsule named "arrow_schema" holding a C ``ArrowSchema``."""
        return self._export()

    def to_pyarrow(self) -> Any:
        """Import the schema into the installed pyarrow (any version >= 14).

        Raises:
            ImportError: pyarrow is not installed (``pip install 'pqloader[arrow]'``).
        """
        try:
            import pyarrow as pa
        except ImportError as e:
            raise ImportError("ArrowSchema.to_pyarrow() needs pyarrow: pip install "
                              "'pqloader[arrow]' (any pyarrow >= 14)") from e
        return pa.Schema._import_from_c_capsule(self.__arrow_c_schema__())

    def __reduce__(self) -> Any:
        # It exports from a loader's engine, which cannot be pickled: pickled (a Loader's
        # options in a spawned DataLoader worker, copy.deepcopy), it holds pyarrow's copy.
        return _from_pyarrow, (self.to_pyarrow(),)

    def __repr__(self) -> str:
        return "pqloader.ArrowSchema(<__arrow_c_schema__>)"


def _from_pyarrow(schema: Any) -> ArrowSchema:
    """An ArrowSchema exporting a pyarrow schema (what an unpickled one holds)."""
    return ArrowSchema(schema.__arrow_c_schema__)
