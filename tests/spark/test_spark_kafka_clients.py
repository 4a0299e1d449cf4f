"""Records written by a Kafka client (confluent-kafka, librdkafka, through the Kafka port) read
by the Spark source (`format("minibroker")`, gRPC): keys, values, headers, partitions and
offsets as written. Reuses the session's cluster and SparkSession (tests/spark/conftest.py)."""

from __future__ import annotations

from typing import Any

import confluent_kafka
import pytest
from cluster_harness import LocalCluster

from minibroker.client import Admin

pytestmark = pytest.mark.spark


def test_spark_reads_what_confluent_kafka_wrote(spark: Any, cluster: LocalCluster) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("from-librdkafka", 2, 3)
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "enable.idempotence": True,
            "compression.type": "lz4",
        }
    )
    for i in range(40):
        producer.produce(
            "from-librdkafka",
            value=f"v{i}".encode(),
            key=f"k{i}".encode(),
            partition=i % 2,
            headers=[("n", str(i).encode())],
        )
    assert producer.flush(60) == 0
    rows = (
        spark.read.format("minibroker")
        .option("bootstrap.servers", cluster.bootstrap)
        .option("subscribe", "from-librdkafka")
        .option("includeHeaders", "true")
        .load()
        .collect()
    )
    got = sorted(
        (r.partition, r.offset, r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in rows
    )
    expected = sorted(
        (i % 2, i // 2, f"k{i}".encode(), f"v{i}".encode(), [("n", str(i).encode())])
        for i in range(40)
    )
    assert got == expected
