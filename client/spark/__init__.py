"""minibroker.client.spark: read topics into DataFrames and write DataFrames to topics.

    from minibroker.client.spark import register
    register(spark)
    df = (spark.read.format("minibroker").option("bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "events").load())

Built on PySpark's Python Data Source API (pyspark 4.x) with the schema and options of Spark's
Kafka connector. Needs the `spark` extra (`pip install 'minibroker[spark]'`) on the driver and
on every executor. Importing `minibroker.client` never imports this package, and this package
loads pyspark only when the data source itself is used, so the pure option parsing in
`options` works without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minibroker.client.spark.options import OptionError

if TYPE_CHECKING:
    from minibroker.client.spark.cluster import DataLossError
    from minibroker.client.spark.datasource import MiniBrokerDataSource

FORMAT_NAME = "minibroker"

_LAZY = {
    "MiniBrokerDataSource": "minibroker.client.spark.datasource",
    "DataLossError": "minibroker.client.spark.cluster",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'minibroker.client.spark' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def register(spark: Any) -> None:
    """Make `format("minibroker")` available in this SparkSession (driver side, once)."""
    from minibroker.client.spark.datasource import MiniBrokerDataSource

    spark.dataSource.register(MiniBrokerDataSource)


__all__ = ["FORMAT_NAME", "DataLossError", "MiniBrokerDataSource", "OptionError", "register"]
