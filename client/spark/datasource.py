"""`MiniBrokerDataSource`: the one class Spark registers, under the format name "minibroker".

Does no I/O itself: it parses options (Spark passes them as a case-insensitive mapping of
strings) and hands out the readers and writers of `source` and `sink`. Spark re-creates it from
the class and options in whichever process needs it (docs/design.md §11).
"""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from minibroker.client.spark import FORMAT_NAME
from minibroker.client.spark.options import OptionError, parse_bool, parse_source_options
from minibroker.client.spark.sink import (
    MiniBrokerBatchWriter,
    MiniBrokerStreamWriter,
    parse_sink_options,
)
from minibroker.client.spark.source import (
    MiniBrokerBatchReader,
    MiniBrokerStreamReader,
    source_ddl,
)


class MiniBrokerDataSource(DataSource):
    """Spark's Kafka connector schema and options, on a minibroker cluster."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return source_ddl(parse_bool(self.options, "includeHeaders", False))

    # Spark calls reader/streamReader/streamWriter by keyword: the parameter names matter.
    def reader(self, schema: StructType) -> DataSourceReader:
        return MiniBrokerBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MiniBrokerStreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            # As Spark's Kafka sink: a topic cannot be emptied and rewritten by a save.
            raise OptionError(
                "save mode overwrite is not allowed for minibroker: records are appended to "
                "topics; use .mode('append')"
            )
        return MiniBrokerBatchWriter(parse_sink_options(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return MiniBrokerStreamWriter(parse_sink_options(self.options, schema))
