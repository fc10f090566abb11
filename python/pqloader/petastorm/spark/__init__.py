"""Petastorm's Spark converter (``make_spark_converter``) on pqloader."""

from pqloader.petastorm.spark.spark_dataset_converter import SparkDatasetConverter, make_spark_converter

__all__ = ["SparkDatasetConverter", "make_spark_converter"]
