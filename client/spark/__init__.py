"""minibroker.client.spark: read topics into DataFrames and write DataFrames to topics.

    from minibroker.client.spark import register
    register(spark)
    df = (spark.read.format("minibroker").option("bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "events").load())

Built on PySpark's Python Data Source API (pyspark 4.x) with the schema and options of Spark's
Kafka connector. Needs the `spark` extra (`pip install 'minibroker[spark]'`) on the driver and
on every executor. Importing `minibroker.client` never imports this package, so pyspark stays
optional for everyone else.
"""

from __future__ import annotations

from typing import Any

from minibroker.client.spark.cluster import DataLossError
from minibroker.client.spark.datasource import FORMAT_NAME, MiniBrokerDataSource
from minibroker.client.spark.options import OptionError


def register(spark: Any) -> None:
    """Make `format("minibroker")` available in this SparkSession (driver side, once)."""
    spark.dataSource.register(MiniBrokerDataSource)


__all__ = ["FORMAT_NAME", "DataLossError", "MiniBrokerDataSource", "OptionError", "register"]
