"""``make_spark_converter``: a Spark DataFrame, materialised as Parquet by Spark, loaded by pqloader.

As Petastorm's ``SparkDatasetConverter``: the DataFrame is written **by Spark itself**
(``df.write.parquet``, so no data goes through the driver's Python) under the parent
cache URL set in the Spark conf ``petastorm.spark.converter.parentCacheDirUrl``, with
row groups of ``parquet_row_group_size_bytes`` (32 MiB: large sequential reads, and
several per file so the engine can shuffle and shard them). Float and double columns
(and arrays of them, and ML vectors) become ``dtype``. The cache key is the DataFrame's
analysed logical plan plus those options: converting the same DataFrame again in this
process (Catalyst's ``sameResult``) reuses the files while they exist. ``make_torch_dataloader`` returns a context
manager around a ``BatchedDataLoader`` over a pqloader Loader; ``delete()`` removes the
files.
"""

from __future__ import annotations

import datetime
import logging
import threading
import uuid
from typing import Any, Callable

logger = logging.getLogger(__name__)

DEFAULT_ROW_GROUP_SIZE_BYTES = 32 * 1024 * 1024
# (analysed plan (a JVM object), options, converter) of this process's conversions.
_CACHE: list[tuple[Any, tuple, "SparkDatasetConverter"]] = []
_CACHE_LOCK = threading.Lock()


class SparkDatasetConverter:
    """Parquet files written from a DataFrame, with loaders over them (Petastorm's API).

    Attributes:
        cache_dir_url: Where the files are.
        file_urls: The Parquet files, sorted.
        dataset_size: Rows.
    """

    PARENT_CACHE_DIR_URL_CONF = "petastorm.spark.converter.parentCacheDirUrl"

    def __init__(self, cache_dir_url: str, file_urls: list[str], dataset_size: int) -> None:
        self.cache_dir_url = cache_dir_url
        self.file_urls = file_urls
        self.dataset_size = dataset_size

    def __len__(self) -> int:
        return self.dataset_size

    def make_torch_dataloader(self, batch_size: int = 32, num_epochs: int | None = None,
                              workers_count: int | None = None, shuffling_queue_capacity: int = 0,
                              data_loader_fn: Callable | None = None, **petastorm_reader_kwargs: Any) -> Any:
        """A context manager whose ``__enter__`` returns a loader of batches (dicts of tensors).

        Args:
            batch_size: Rows per batch.
            num_epochs: Epochs; None (Petastorm's default here) runs forever.
            workers_count: C++ worker threads (default: one per core).
            shuffling_queue_capacity: > 0 shuffles rows (see pqloader.petastorm.pytorch).
            data_loader_fn: Petastorm's loader class to use (default ``BatchedDataLoader``).
            **petastorm_reader_kwargs: ``make_batch_reader`` parameters (seed,
                cur_shard/shard_count, shuffle_row_groups, ...), with its defaults, as in
                Petastorm: row groups are shuffled unless ``shuffle_row_groups=False``.
        """
        from pqloader.petastorm.pytorch import BatchedDataLoader
        from pqloader.petastorm.reader import make_batch_reader

        kw = dict(petastorm_reader_kwargs)
        if workers_count is not None:
            kw["workers_count"] = workers_count
        else:
            from pqloader import _env

            kw["workers_count"] = _env.available_cpus()
        reader = make_batch_reader(self.cache_dir_url, num_epochs=num_epochs, **kw)
        loader_fn = data_loader_fn or BatchedDataLoader
        return TorchDatasetContextManager(reader, loader_fn(reader, batch_size=batch_size,
                                                            shuffling_queue_capacity=shuffling_queue_capacity))

    def make_tf_dataset(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("pqloader.petastorm has no TensorFlow support: use make_torch_dataloader")

    def delete(self) -> None:
        """Delete the Parquet files (and forget them)."""
        import pyarrow.fs as pafs

        fs, path = pafs.FileSystem.from_uri(self.cache_dir_url)
        fs.delete_dir(path)
        with _CACHE_LOCK:
            _CACHE[:] = [entry for entry in _CACHE if entry[2] is not self]


class TorchDatasetContextManager:
    """``with converter.make_torch_dataloader(...) as loader:``; stops the reader on exit."""

    def __init__(self, reader: Any, loader: Any) -> None:
        self.reader = reader
        self.loader = loader

    def __enter__(self) -> Any:
        return self.loader

    def __exit__(self, *exc: Any) -> None:
        self.reader.stop()
        self.reader.join()


def _parent_cache_dir_url(spark: Any) -> str:
    url = spark.conf.get(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, None)
    if not url:
        raise ValueError("Please set the spark config petastorm.spark.converter.parentCacheDirUrl "
                         "(e.g. spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, "
                         "'file:///tmp/converter_cache'))")
    if "://" not in url:
        raise ValueError(f"parentCacheDirUrl must be a URL with a scheme (file:///..., s3://...), got {url!r}")
    return url.rstrip("/")


def _convert_precision(df: Any, dtype: str | None) -> Any:
    """Float/double columns, arrays of them and ML vectors as `dtype` ('float32'/'float64')."""
    if dtype is None:
        return df
    if dtype not in ("float32", "float64"):
        raise ValueError(f"dtype {dtype} is not supported. Use 'float32' or 'float64'")
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    target = T.FloatType() if dtype == "float32" else T.DoubleType()
    columns = []
    for field in df.schema.fields:
        col = F.col(f"`{field.name}`")
        t = field.dataType
        if isinstance(t, (T.FloatType, T.DoubleType)):
            col = col.cast(target)
        elif isinstance(t, T.ArrayType) and isinstance(t.elementType, (T.FloatType, T.DoubleType)):
            col = col.cast(T.ArrayType(target, t.containsNull))
        elif type(t).__name__ == "VectorUDT":
            from pyspark.ml.functions import vector_to_array

            col = vector_to_array(col, dtype)
        columns.append(col.alias(field.name))
    return df.select(*columns)


def _cached(plan: Any, options: tuple, parent: str) -> SparkDatasetConverter | None:
    """A conversion of a plan with the same result (Catalyst's ``sameResult``: equal after
    canonicalising expression ids) and options, whose files still exist."""
    with _CACHE_LOCK:
        entries = list(_CACHE)
    for cached_plan, cached_options, converter in entries:
        if cached_options == options and converter.cache_dir_url.startswith(parent + "/") and \
                plan.sameResult(cached_plan) and _exists(converter.cache_dir_url):
            return converter
    return None


def _exists(url: str) -> bool:
    import pyarrow.fs as pafs

    fs, path = pafs.FileSystem.from_uri(url)
    return fs.get_file_info(path).type == pafs.FileType.Directory


def make_spark_converter(df: Any, parquet_row_group_size_bytes: int = DEFAULT_ROW_GROUP_SIZE_BYTES,
                         compression_codec: str | None = None, dtype: str | None = "float32") -> SparkDatasetConverter:
    """Materialise `df` as Parquet (written by Spark) and return a converter over the files.

    Args:
        df: A Spark DataFrame.
        parquet_row_group_size_bytes: Row-group size Spark writes.
        compression_codec: Parquet compression (Spark's default when None).
        dtype: Float precision of float columns: 'float32' (default), 'float64' or None (as is).

    Returns:
        A :class:`SparkDatasetConverter`; the same DataFrame (same analysed plan and
        options) converted again in this process returns the files already written.
    """
    import pqloader

    spark = df.sparkSession
    parent = _parent_cache_dir_url(spark)
    plan = df._jdf.queryExecution().analyzed()
    options = (int(parquet_row_group_size_bytes), compression_codec, dtype)
    cached = _cached(plan, options, parent)
    if cached is not None:
        logger.info("reusing %s for the same DataFrame plan", cached.cache_dir_url)
        return cached
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d%H%M%S")
    url = f"{parent}/{stamp}-appid-{spark.sparkContext.applicationId}-{uuid.uuid4().hex}"
    writer = _convert_precision(df, dtype).write.option("parquet.block.size", int(parquet_row_group_size_bytes))
    if compression_codec is not None:
        writer = writer.option("compression", compression_codec)
    writer.parquet(url)
    info = pqloader.inspect(url)
    files = sorted(f["path"] for f in info["files"])
    converter = SparkDatasetConverter(url, files, int(info["num_rows"]))
    with _CACHE_LOCK:
        _CACHE.append((plan, options, converter))
    return converter


__all__ = ["SparkDatasetConverter", "make_spark_converter", "TorchDatasetContextManager"]
