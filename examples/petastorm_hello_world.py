"""Petastorm's hello_world example with only the import changed: ``petastorm`` → ``pqloader.petastorm``.

Petastorm's examples/hello_world/petastorm_dataset/{generate_petastorm_dataset,
python_hello_world,pytorch_hello_world}.py in one file: generate a dataset with
``materialize_dataset`` under pyspark, read it with ``make_reader``, then with
``make_reader`` + ``pytorch.DataLoader``. Needs pyspark and Java 17.

    python examples/petastorm_hello_world.py [file:///tmp/hello_world_dataset]

Spark's Python workers run this interpreter (PYSPARK_PYTHON, unless set already), so
that they import pqloader from the same environment.
"""

import argparse
import os
import sys

import numpy as np
from pyspark.sql import SparkSession
from pyspark.sql.types import IntegerType

from pqloader.petastorm import make_reader
from pqloader.petastorm.codecs import ScalarCodec, CompressedImageCodec, NdarrayCodec
from pqloader.petastorm.etl.dataset_metadata import materialize_dataset
from pqloader.petastorm.pytorch import DataLoader
from pqloader.petastorm.unischema import dict_to_spark_row, Unischema, UnischemaField

# The schema defines how the dataset schema looks like
HelloWorldSchema = Unischema('HelloWorldSchema', [
    UnischemaField('id', np.int32, (), ScalarCodec(IntegerType()), False),
    UnischemaField('image1', np.uint8, (128, 256, 3), CompressedImageCodec('png'), False),
    UnischemaField('array_4d', np.uint8, (None, 128, 30, None), NdarrayCodec(), False),
])


def row_generator(x):
    """Returns a single entry in the generated dataset. Return a bunch of random values as an example."""
    return {'id': x,
            'image1': np.random.randint(0, 255, dtype=np.uint8, size=(128, 256, 3)),
            'array_4d': np.random.randint(0, 255, dtype=np.uint8, size=(4, 128, 30, 3))}


def generate_petastorm_dataset(output_url='file:///tmp/hello_world_dataset'):
    rowgroup_size_mb = 256

    spark = SparkSession.builder.config('spark.driver.memory', '2g').master('local[2]').getOrCreate()
    sc = spark.sparkContext

    # Wrap dataset materialization portion. Will take care of setting up spark environment variables as
    # well as save petastorm specific metadata
    rows_count = 10
    with materialize_dataset(spark, output_url, HelloWorldSchema, rowgroup_size_mb):

        rows_rdd = sc.parallelize(range(rows_count))\
            .map(row_generator)\
            .map(lambda x: dict_to_spark_row(HelloWorldSchema, x))

        spark.createDataFrame(rows_rdd, HelloWorldSchema.as_spark_schema()) \
            .coalesce(10) \
            .write \
            .mode('overwrite') \
            .parquet(output_url)


def python_hello_world(dataset_url='file:///tmp/hello_world_dataset'):
    with make_reader(dataset_url) as reader:
        # Pure python
        for sample in reader:
            print(sample.id)


def pytorch_hello_world(dataset_url='file:///tmp/hello_world_dataset'):
    with DataLoader(make_reader(dataset_url)) as train_loader:
        sample = next(iter(train_loader))
        print(sample['id'])


if __name__ == '__main__':
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('url', nargs='?', default='file:///tmp/hello_world_dataset',
                        help='where to write and read the dataset (default: %(default)s)')
    url = parser.parse_args().url
    os.environ.setdefault('PYSPARK_PYTHON', sys.executable)
    generate_petastorm_dataset(url)
    python_hello_world(url)
    pytorch_hello_world(url)
