"""Records written by a Kafka client (confluent-kafka, librdkafka, through the Kafka port) read
by the Spark source (`format("minibroker")`, gRPC): keys, values, headers, partitions and
offsets as written; and the other way round, what the Spark sink wrote read by a librdkafka
consumer group. Reuses the session's cluster and SparkSession (tests/spark/conftest.py)."""

from __future__ import annotations

import time
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


def test_confluent_kafka_reads_what_the_spark_sink_wrote(spark: Any, cluster: LocalCluster) -> None:
    """The other way round: the Spark sink (gRPC) writes; a librdkafka consumer in a group reads
    through the Kafka port, subscribing (the group coordinator assigns it both partitions)."""
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("from-spark", 2, 3)
    rows = [(f"k{i}", f"v{i}".encode(), i % 2, [("n", str(i).encode())]) for i in range(40)]
    df = spark.createDataFrame(
        rows,
        "key string, value binary, partition int, headers array<struct<key:string,value:binary>>",
    )
    df.write.format("minibroker").option("bootstrap.servers", cluster.bootstrap).option(
        "topic", "from-spark"
    ).mode("append").save()
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "group.id": "reads-spark",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    got: list[Any] = []
    try:
        consumer.subscribe(["from-spark"])
        deadline = time.monotonic() + 60
        while len(got) < len(rows):
            assert time.monotonic() < deadline, f"read {len(got)} of {len(rows)}"
            message = consumer.poll(0.5)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(
                (
                    message.key().decode(),
                    message.value(),
                    message.partition(),
                    list(message.headers() or []),
                )
            )
    finally:
        consumer.close()
    assert sorted(got) == sorted(rows)
