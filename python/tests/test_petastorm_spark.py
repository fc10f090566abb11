"""pqloader.petastorm with pyspark (local mode, on the machine's Java 17): Petastorm's
hello_world run with only the import changed, and make_spark_converter."""

from __future__ import annotations

import os
import runpy
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JAVA_PACKAGE = "openjdk-17-jre-headless"


def _require_java() -> None:
    java = shutil.which("java")
    ok = java is not None and subprocess.run([java, "-version"], capture_output=True).returncode == 0
    if not ok:
        pytest.fail(f"pyspark needs Java, which is missing: install the Debian package {JAVA_PACKAGE} "
                    f"(apt-get install -y {JAVA_PACKAGE})", pytrace=False)


@pytest.fixture(scope="module")
def spark():
    _require_java()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    # A SparkContext sets its own SIGINT handler, left after stop(): it called the stopped
    # context, so a later test's Ctrl-C in this process raised AttributeError, not KeyboardInterrupt.
    sigint = signal.getsignal(signal.SIGINT)
    session = (SparkSession.builder.master("local[1]").appName("pqloader-petastorm-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "1")
               .config("spark.driver.memory", "1g").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    signal.signal(signal.SIGINT, sigint)


def test_petastorms_hello_world_runs_with_only_the_import_changed(spark, tmp_path, monkeypatch, capsys):
    # The example script runs as `python examples/petastorm_hello_world.py URL` would run it
    # (as __main__, its own argv), in this process: its getOrCreate() gets the module's
    # session instead of starting a second JVM in a second interpreter.
    url = "file://" + str(tmp_path / "hello_world_dataset")
    example = os.path.join(ROOT, "examples", "petastorm_hello_world.py")
    monkeypatch.setattr(sys, "argv", [example, url])
    runpy.run_path(example, run_name="__main__")
    stdout = capsys.readouterr().out
    lines = stdout.split()
    assert sorted(int(x) for x in lines[:10]) == list(range(10))  # python_hello_world: every id once
    assert "tensor([" in stdout and "dtype=torch.int32" in stdout  # pytorch_hello_world
    from pqloader.petastorm import make_reader

    with make_reader(url, shuffle_row_groups=False) as reader:
        rows = list(reader)
    assert [int(r.id) for r in rows] == list(range(10))
    assert rows[0].image1.shape == (128, 256, 3) and rows[0].array_4d.shape == (4, 128, 30, 3)


def test_materialize_dataset_writes_metadata_petastorm_layout(spark, tmp_path):
    from pyspark.sql.types import IntegerType

    from pqloader.petastorm import make_reader
    from pqloader.petastorm.codecs import CompressedImageCodec, CompressedNdarrayCodec, ScalarCodec
    from pqloader.petastorm.etl.dataset_metadata import get_schema_from_dataset_url, materialize_dataset
    from pqloader.petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row

    schema = Unischema("Small", [
        UnischemaField("id", np.int32, (), ScalarCodec(IntegerType()), False),
        UnischemaField("gray", np.uint8, (8, 6), CompressedImageCodec("png"), False),
        UnischemaField("arr", np.float64, (2, 2), CompressedNdarrayCodec(), False),
    ])
    rng = np.random.default_rng(0)
    data = [{"id": i, "gray": rng.integers(0, 255, (8, 6), dtype=np.uint8), "arr": rng.standard_normal((2, 2))}
            for i in range(12)]
    url = "file://" + str(tmp_path / "small")
    with materialize_dataset(spark, url, schema, row_group_size_mb=1):
        rdd = spark.sparkContext.parallelize(data, 3).map(lambda r: dict_to_spark_row(schema, r))
        spark.createDataFrame(rdd, schema.as_spark_schema()).write.parquet(url)
    assert get_schema_from_dataset_url(url) == schema
    with make_reader(url, shuffle_row_groups=False) as reader:
        rows = list(reader)
    assert [int(r.id) for r in rows] == list(range(12))
    for r, d in zip(rows, data):
        np.testing.assert_array_equal(r.gray, d["gray"])  # PNG: lossless, (H, W) gray
        np.testing.assert_array_equal(r.arr, d["arr"])


def _converter_df(spark, n=100):
    from pyspark.ml.linalg import Vectors

    return spark.createDataFrame([(i, i / 3, [float(i), 2.0], Vectors.dense([i, i + 0.5])) for i in range(n)],
                                 ["id", "x", "arr", "vec"])


def test_spark_converter_writes_with_spark_and_loads_batches(spark, tmp_path):
    from pqloader.petastorm.spark import SparkDatasetConverter, make_spark_converter

    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, "file://" + str(tmp_path / "cache"))
    df = _converter_df(spark)
    converter = make_spark_converter(df)
    assert len(converter) == 100
    assert converter.cache_dir_url.startswith("file://" + str(tmp_path / "cache") + "/")
    written = os.listdir(converter.cache_dir_url[len("file://"):])
    assert "_SUCCESS" in written  # Spark's own writer made the files
    with converter.make_torch_dataloader(batch_size=32, num_epochs=1) as loader:
        batches = list(loader)
    assert [len(b["id"]) for b in batches] == [32, 32, 32, 4]
    ids = np.concatenate([b["id"].numpy() for b in batches])
    assert sorted(ids.tolist()) == list(range(100))
    x = np.concatenate([b["x"].numpy() for b in batches])
    assert x.dtype == np.float32  # dtype='float32' by default
    np.testing.assert_allclose(x, ids / 3, rtol=1e-6)
    vec = np.concatenate([b["vec"].numpy() for b in batches])
    np.testing.assert_allclose(vec, np.stack([ids, ids + 0.5], axis=1))
    with converter.make_torch_dataloader(batch_size=10, num_epochs=2, seed=4, shuffling_queue_capacity=50) as loader:
        twice = [int(i) for b in loader for i in b["id"]]
    assert sorted(twice) == sorted(list(range(100)) * 2) and twice[:100] != list(range(100))


def test_spark_converter_reuses_the_same_plan_and_delete_removes_it(spark, tmp_path):
    from pqloader.petastorm.spark import SparkDatasetConverter, make_spark_converter

    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, "file://" + str(tmp_path / "cache"))
    def frame(n):  # built anew each call: a new plan with the same result
        return spark.range(n).selectExpr("id", "id / 3 AS x", "array(id * 1.0, 2.0) AS arr")

    df = frame(40)
    first = make_spark_converter(df)
    again = make_spark_converter(frame(40))
    assert again is first
    other = make_spark_converter(frame(41))
    assert other.cache_dir_url != first.cache_dir_url
    f64 = make_spark_converter(df, dtype="float64")
    assert f64.cache_dir_url != first.cache_dir_url
    first.delete()
    assert not os.path.exists(first.cache_dir_url[len("file://"):])
    rewritten = make_spark_converter(df)
    assert rewritten.cache_dir_url != first.cache_dir_url and len(rewritten) == 40


def test_spark_converter_needs_the_parent_cache_url(spark):
    from pqloader.petastorm.spark import SparkDatasetConverter, make_spark_converter

    spark.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)
    with pytest.raises(ValueError, match="parentCacheDirUrl"):
        make_spark_converter(_converter_df(spark, 3))
