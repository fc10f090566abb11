"""``materialize_dataset``: write a Petastorm dataset with Spark, then its metadata.

As Petastorm's: inside the ``with`` block Spark writes Parquet with the requested row-group
size (and no summary files); on exit ``_common_metadata`` is written with the pickled
Unischema (Petastorm's class names, so Petastorm reads it too) and the row groups per file.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
from typing import Any, Iterator

from pqloader.petastorm import _dataset, _schema_io
from pqloader.petastorm.errors import PetastormMetadataError
from pqloader.petastorm.unischema import Unischema

_SPARK_KEYS = ("parquet.summary.metadata.level", "parquet.enable.summary-metadata",
               "parquet.summary.metadata.propagate-errors", "parquet.block.size.row.check.min",
               "parquet.row-group.size.row.check.min", "parquet.block.size")


@contextlib.contextmanager
def materialize_dataset(spark: Any, dataset_url: str, schema: Unischema, row_group_size_mb: int | None = None,
                        use_summary_metadata: bool = False, filesystem_factory: Any = None) -> Iterator[None]:
    """Set Spark up for a Petastorm dataset, run the block, then write its metadata.

    Args:
        spark: The SparkSession that writes the dataset.
        dataset_url: Where the block writes it (``file://``, ``s3://``, a path).
        schema: The dataset's Unischema.
        row_group_size_mb: Parquet row-group size.
        use_summary_metadata: Ignored (pqloader records row groups per file).
        filesystem_factory: Ignored: the metadata is written with pyarrow's filesystems.
    """
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    saved = {k: conf.get(k) for k in _SPARK_KEYS}
    conf.set("parquet.summary.metadata.level", "NONE")
    conf.setBoolean("parquet.summary.metadata.propagate-errors", True)
    conf.setInt("parquet.block.size.row.check.min", 3)
    conf.setInt("parquet.row-group.size.row.check.min", 3)
    if row_group_size_mb:
        conf.setInt("parquet.block.size", int(row_group_size_mb) * 1024 * 1024)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                conf.unset(k)
            else:
                conf.set(k, v)
    write_metadata(dataset_url, schema)


def write_metadata(dataset_url: str, schema: Unischema, storage_options: dict | None = None) -> None:
    """Write ``_common_metadata`` (Unischema + row groups per file) next to the Parquet files."""
    import pyarrow.parquet as pq

    ds = _dataset.open_dataset(dataset_url, _dataset.storage_options_from(storage_options, None))
    counts = {}
    first_schema = None
    for i, f in enumerate(ds.files):
        footer = ds.footer(i)
        counts[f.relative] = footer.num_row_groups
        if first_schema is None:
            first_schema = footer.schema.to_arrow_schema()
    md = dict(first_schema.metadata or {})
    md[_schema_io.UNISCHEMA_KEY] = _schema_io.dumps_unischema(schema)
    md[_schema_io.ROW_GROUPS_PER_FILE_KEY] = json.dumps(counts).encode()
    with ds.fs.open_output_stream(posixpath.join(ds.meta_dir, "_common_metadata")) as out:
        pq.write_metadata(first_schema.with_metadata(md), out)


def get_schema_from_dataset_url(dataset_url_or_urls: Any, hdfs_driver: str = "libhdfs3",
                                storage_options: dict | None = None, filesystem: Any = None) -> Unischema:
    """The Unischema stored with a dataset (read without executing its pickle).

    Raises:
        PetastormMetadataError: The dataset has none.
    """
    ds = _dataset.open_dataset(dataset_url_or_urls, _dataset.storage_options_from(storage_options, filesystem))
    if ds.unischema is None:
        raise PetastormMetadataError(f"Could not find _common_metadata with a Unischema in {ds.sources[0]}. "
                                     "Use materialize_dataset(..) to generate it.")
    return ds.unischema


__all__ = ["materialize_dataset", "get_schema_from_dataset_url", "write_metadata", "PetastormMetadataError"]
