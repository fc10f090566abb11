"""Open a Petastorm dataset: its files, its metadata, and where the engine reads them.

Files are listed once with pyarrow's filesystems (names starting with ``.`` or ``_`` are
skipped, as Petastorm and the engine skip them) and sorted by path, which is both
Petastorm's piece order and the engine's canonical order. ``_common_metadata`` gives the
Unischema (read by the restricted reader), the row groups per file (so piece numbers,
which ``rowgroup_selector`` indexes use, need no footer reads) and the row-group indexes.
"""

from __future__ import annotations

import json
import os
import posixpath
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pqloader import _env, _errors
from pqloader.petastorm import _schema_io
from pqloader.petastorm.errors import PetastormMetadataError, UntrustedSchemaError
from pqloader.petastorm.unischema import Unischema, UnischemaField

# fsspec/s3fs argument names (what Petastorm's storage_options take) → pqloader's.
_S3FS_KEYS = {"key": "access_key", "secret": "secret_key", "token": "session_token",
              "anon": "anonymous", "region_name": "region"}
_PQLOADER_KEYS = {"endpoint_override", "scheme", "region", "access_key", "secret_key",
                  "session_token", "anonymous", "connect_timeout", "request_timeout",
                  "tls_ca_file_path", "force_virtual_addressing", "retry_max_attempts",
                  "retry_base_delay", "retry_max_delay"}


def storage_options_from(storage_options: Mapping[str, Any] | None, filesystem: Any) -> dict[str, Any]:
    """pqloader storage options from Petastorm's ``storage_options`` (fsspec/s3fs names) or
    a pyarrow ``filesystem``.

    Raises:
        ValueError: An option has no pqloader equivalent (the message lists those that do).
        TypeError: `filesystem` is not a pyarrow LocalFileSystem or S3FileSystem.
    """
    out: dict[str, Any] = {}
    if filesystem is not None:
        import pyarrow.fs as pafs

        if isinstance(filesystem, pafs.S3FileSystem):
            _, args = filesystem.__reduce__()
            kwargs = args[0] if args and isinstance(args[0], dict) else {}
            # pyarrow writes what was left unset as None, "" or a timeout of -1.
            out.update({k: v for k, v in kwargs.items() if k in _PQLOADER_KEYS and v not in (None, "")
                        and not (k.endswith("_timeout") and isinstance(v, (int, float)) and v < 0)})
        elif not isinstance(filesystem, pafs.LocalFileSystem):
            raise TypeError(f"filesystem={type(filesystem).__name__}: pqloader reads through its own "
                            "Arrow filesystems; give a pyarrow LocalFileSystem or S3FileSystem, or "
                            "storage_options (endpoint_override, access_key, ...) instead")
        return out
    for key, value in (storage_options or {}).items():
        if key in _PQLOADER_KEYS:
            out[key] = value
        elif key in _S3FS_KEYS:
            out[_S3FS_KEYS[key]] = value
        elif key in ("client_kwargs", "endpoint_url"):
            kw = value if key == "client_kwargs" else {"endpoint_url": value}
            if "endpoint_url" in kw:
                parsed = urllib.parse.urlparse(kw["endpoint_url"])
                out["endpoint_override"] = parsed.netloc or parsed.path
                if parsed.scheme:
                    out["scheme"] = parsed.scheme
            if "region_name" in kw:
                out["region"] = kw["region_name"]
        else:
            raise ValueError(f"storage_options[{key!r}] has no pqloader equivalent; accepted: "
                             f"{sorted(_PQLOADER_KEYS | set(_S3FS_KEYS) | {'client_kwargs', 'endpoint_url'})}")
    return out


def _pyarrow_fs(url: str, storage: Mapping[str, Any]) -> tuple[Any, str, str]:
    """(pyarrow filesystem, path in it, prefix the engine puts before such paths)."""
    import pyarrow.fs as pafs

    parsed = urllib.parse.urlparse(url)
    if parsed.scheme in ("", "file"):
        # As the Loader takes a source: a file: URL's text after the scheme is its path,
        # percent-decoded (Petastorm's urlparse ended it at '#' or '?': file:///d/run#3 read
        # /d/run, another dataset); file://server/ds (read as the local /ds) is refused.
        path = _env._local_file_uri(url, "dataset_url")
        if path.startswith(_env._FILE_SCHEME):
            path = urllib.parse.unquote(path[len(_env._FILE_SCHEME):])
        return pafs.LocalFileSystem(), _env._absolute(os.path.expanduser(path)), ""
    if parsed.scheme in ("s3", "s3a", "s3n"):
        kw = {k: v for k, v in storage.items() if not k.startswith("retry_")}
        return pafs.S3FileSystem(**kw), parsed.netloc + parsed.path, "s3://"
    fs, path = pafs.FileSystem.from_uri(url)
    return fs, path, parsed.scheme + "://"


def _hidden(rel: str) -> bool:
    return any(part.startswith((".", "_")) for part in rel.split("/"))


@dataclass
class DataFile:
    """One Parquet file: its engine name, its path relative to the dataset, its row groups."""

    name: str
    relative: str
    num_row_groups: int | None


@dataclass
class PetastormDataset:
    """What ``make_reader`` / ``make_batch_reader`` know before reading any data."""

    sources: list[str]
    files: list[DataFile]
    metadata: dict[bytes, bytes]
    unischema: Unischema | None
    storage: dict[str, Any]
    fs: Any = field(repr=False, default=None)
    fs_paths: list[str] = field(default_factory=list, repr=False)
    meta_dir: str = ""  # where _common_metadata is (or would be), in `fs`

    @property
    def is_petastorm(self) -> bool:
        return self.unischema is not None

    def pieces(self) -> list[tuple[int, int]]:
        """(file index, row group) of every row group, in Petastorm's piece order.

        Uses the row-group counts stored in ``_common_metadata`` when there are; reads a
        file's footer otherwise.
        """
        out = []
        for i, f in enumerate(self.files):
            if f.num_row_groups is None:
                f.num_row_groups = self.footer(i).num_row_groups
            out.extend((i, rg) for rg in range(f.num_row_groups))
        return out

    def footer(self, i: int) -> Any:
        import pyarrow.parquet as pq

        with self.fs.open_input_file(self.fs_paths[i]) as fh:
            return pq.ParquetFile(fh).metadata

    def read_row_group(self, i: int, rg: int, columns: Sequence[str], int96_unit: str = "ns") -> Any:
        """Columns of one row group as a pyarrow Table (for predicates), INT96 timestamps in
        `int96_unit` as the Loader's ``coerce_int96_timestamp_unit`` reads them."""
        import pyarrow.parquet as pq

        with self.fs.open_input_file(self.fs_paths[i]) as fh:
            pf = pq.ParquetFile(fh, coerce_int96_timestamp_unit=int96_unit)
            table = pf.read_row_group(rg, columns=list(columns))
            if int96_unit in ("ns", "us"):
                # pyarrow wraps an INT96 date its unit cannot hold into another date
                # (9999-12-31 as nanoseconds reads as 1816-03-30), silently: a predicate
                # then saw that date and dropped the row group, where the engine refuses
                # the value. Seconds hold every INT96 date: a value whose whole seconds
                # differ from them was wrapped.
                int96 = sorted({c.path.split(".")[0] for c in pf.schema if c.physical_type == "INT96"}
                               & set(table.column_names))
                if int96:
                    seconds = pq.ParquetFile(fh, coerce_int96_timestamp_unit="s").read_row_group(
                        rg, columns=int96)
                    for name in int96:
                        _check_int96(self.files[i].name, rg, name, table.column(name),
                                     seconds.column(name), int96_unit)
            return table

    def indexes(self) -> dict[str, Any]:
        """The row-group indexes (``build_rowgroup_index``), read by the restricted reader."""
        data = self.metadata.get(_schema_io.ROWGROUPS_INDEX_KEY)
        if data is None:
            raise ValueError("Row groups index is not available in the dataset metadata file. "
                             "Build one with petastorm.etl.rowgroup_indexing.build_rowgroup_index")
        return _schema_io.load_indexes(data)


def open_dataset(url_or_urls: str | Sequence[str], storage: Mapping[str, Any]) -> PetastormDataset:
    """List the files of a dataset URL (or take a list of file URLs) and read its metadata.

    Raises:
        pqloader.DataNotFoundError: Nothing there, or no Parquet file.
        UntrustedSchemaError: The pickled Unischema is refused (see ``_schema_io``).
    """
    try:
        import pyarrow.fs as pafs
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError("pqloader.petastorm reads Petastorm's metadata with pyarrow, which is "
                          "not installed: pip install 'pqloader[petastorm]' (any pyarrow >= 14; "
                          "pqloader.Loader itself needs none)") from e

    urls = [url_or_urls] if isinstance(url_or_urls, (str, os.PathLike)) else list(url_or_urls)
    if not urls:
        raise ValueError("dataset url list must be non-empty.")
    urls = [os.fspath(u).rstrip("/") for u in urls]
    fs, root, prefix = _pyarrow_fs(urls[0], storage)
    fs_paths: list[str] = []
    if len(urls) == 1:
        info = fs.get_file_info(root)
        if info.type == pafs.FileType.NotFound:
            raise _errors.DataNotFoundError(f"dataset '{urls[0]}' does not exist")
        if info.type == pafs.FileType.Directory:
            listed = fs.get_file_info(pafs.FileSelector(root, recursive=True))
            for entry in sorted(listed, key=lambda e: e.path):
                rel = posixpath.relpath(entry.path, root)
                if entry.type == pafs.FileType.File and not _hidden(rel):
                    fs_paths.append(entry.path)
            meta_dir = root
        else:
            fs_paths = [root]
            meta_dir = posixpath.dirname(root)
    else:
        for u in urls:
            fs_paths.append(_pyarrow_fs(u, storage)[1])
        meta_dir = posixpath.commonpath([posixpath.dirname(p) for p in fs_paths])
    if not fs_paths:
        raise _errors.DataNotFoundError(f"dataset '{urls[0]}' contains no data files")

    metadata: dict[bytes, bytes] = {}
    meta_path = posixpath.join(meta_dir, "_common_metadata")
    if fs.get_file_info(meta_path).type == pafs.FileType.File:
        with fs.open_input_file(meta_path) as fh:
            metadata = dict(pq.read_schema(fh).metadata or {})
    unischema = None
    if _schema_io.UNISCHEMA_KEY in metadata:
        try:
            unischema = _schema_io.load_unischema(metadata[_schema_io.UNISCHEMA_KEY])
        except UntrustedSchemaError as e:
            raise UntrustedSchemaError(f"'{prefix + meta_path}': {e}") from None
    counts: dict[str, int] = {}
    if _schema_io.ROW_GROUPS_PER_FILE_KEY in metadata:
        try:
            counts = json.loads(metadata[_schema_io.ROW_GROUPS_PER_FILE_KEY].decode())
        except ValueError as e:
            raise PetastormMetadataError(f"'{meta_path}': unreadable row groups per file ({e})") from None
    files = []
    for p in fs_paths:
        rel = posixpath.relpath(p, meta_dir)
        n = counts.get(rel)
        files.append(DataFile(name=prefix + p, relative=rel, num_row_groups=int(n) if n is not None else None))
    # A single directory keeps hive partition keys (key=value/ directories) for the engine.
    sources = [prefix + root] if len(urls) == 1 else [f.name for f in files]
    return PetastormDataset(sources=sources, files=files, metadata=metadata, unischema=unischema,
                            storage=dict(storage), fs=fs, fs_paths=fs_paths, meta_dir=meta_dir)


def infer_unischema(ds: PetastormDataset, column_info: Mapping[str, Mapping[str, Any]]) -> Unischema:
    """A Unischema of plain columns (no codecs) from the engine's column info."""
    import numpy as np

    fields = []
    for name, info in column_info.items():
        dtype = info.get("dtype")
        if dtype == "str":
            numpy_type = np.str_
        elif dtype == "bytes":
            numpy_type = np.bytes_
        elif dtype is None:
            numpy_type = None
        else:
            numpy_type = np.dtype(dtype).type
        shape = tuple(None if d == -1 else d for d in (info.get("shape") or ()))
        fields.append(UnischemaField(name, numpy_type, shape, None, False))
    return Unischema("inferred_schema", fields)


def _check_int96(file: str, rg: int, name: str, values: Any, seconds: Any, unit: str) -> None:
    """Refuse an INT96 column read in `unit` (``"ns"`` or ``"us"``) whose value pyarrow
    wrapped: `seconds` is the same column read as seconds (which hold every INT96 date);
    an unwrapped value's whole seconds are those."""
    import numpy as np
    import pyarrow as pa

    def flat(column: Any) -> Any:
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        while pa.types.is_list(array.type) or pa.types.is_large_list(array.type) or \
                pa.types.is_fixed_size_list(array.type) or pa.types.is_map(array.type):
            array = array.flatten() if not pa.types.is_map(array.type) else array.items
        return array

    fine, coarse = flat(values), flat(seconds)
    if not pa.types.is_timestamp(fine.type) or len(fine) != len(coarse):
        return  # (a struct: the engine checks it when it decodes it)
    per_second = 10**9 if unit == "ns" else 10**6
    fine_s = np.floor_divide(fine.cast(pa.int64()).fill_null(0).to_numpy(), per_second)
    coarse_s = coarse.cast(pa.int64()).fill_null(0).to_numpy()
    bad = np.flatnonzero(fine_s != coarse_s)
    if len(bad) == 0:
        return
    k = int(bad[0])
    day = np.datetime64(int(coarse_s[k]), "s").astype("datetime64[D]")
    held = ("nanoseconds hold (1677-09-21 to 2262-04-11)" if unit == "ns" else
            "microseconds hold (years -290308 to 294247)")
    advice = ("; pass loader_options={'coerce_int96_timestamp_unit': 'us'} to read them as "
              "microseconds" if unit == "ns" else "")
    raise _errors.InvalidDataError(
        f"cannot decode '{file}', row group {rg}, column '{name}': an INT96 timestamp ({day}) is "
        f"outside the dates int64 {held}; pqloader does not wrap it into another date (the "
        f"predicate's row-group pass would have judged the wrapped one){advice}")
