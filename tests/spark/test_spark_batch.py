"""Batch reads and writes through `format("minibroker")` against a live local cluster.

Proves the connector keeps Spark's Kafka schema and options (docs/design.md §11): a write/read round
trip keeps keys, values, headers and nulls; offset ranges read exactly [start, end); `latest` ends
at the high watermark captured at planning (docs/design.md §8.3: nothing above the HW);
minPartitions splits ranges without losing or repeating a row.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from cluster_harness import LocalCluster

from minibroker.client import Admin, Consumer, Producer, TopicPartition

pytestmark = pytest.mark.spark


def create_topic(cluster: LocalCluster, name: str, partitions: int = 2) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(name, partitions, 3)


def reader(spark: Any, cluster: LocalCluster, **options: str) -> Any:
    r = spark.read.format("minibroker").option("bootstrap.servers", cluster.bootstrap)
    for key, value in options.items():
        r = r.option(key, value)
    return r.load()


def test_round_trip_keeps_keys_headers_and_nulls(spark: Any, cluster: LocalCluster) -> None:
    create_topic(cluster, "rt")
    rows = [
        ("k0", b"v0", 0, [("h1", b"x"), ("h2", None)]),
        (None, b"v1", 1, []),
        ("k2", None, 0, [("only", b"")]),
        ("k3", b"", 1, None),
        ("k4", b"\x00\xff", None, [("h", b"y")]),
    ]
    df = spark.createDataFrame(
        rows,
        "key string, value binary, partition int, headers array<struct<key:string,value:binary>>",
    )
    df.write.format("minibroker").option("bootstrap.servers", cluster.bootstrap).option(
        "topic", "rt"
    ).mode("append").save()

    out = reader(spark, cluster, subscribe="rt", includeHeaders="true").collect()
    assert len(out) == len(rows)
    by_key = {r.key: r for r in out}
    assert by_key[b"k0"].value == b"v0" and by_key[b"k0"].partition == 0
    assert [(h.key, h.value) for h in by_key[b"k0"].headers] == [("h1", b"x"), ("h2", None)]
    assert by_key[None].value == b"v1" and by_key[None].partition == 1
    assert by_key[None].headers == []
    assert by_key[b"k2"].value is None
    assert by_key[b"k3"].value == b""
    assert by_key[b"k4"].value == b"\x00\xff"
    for r in out:
        assert r.topic == "rt" and r.timestampType == 0 and r.timestamp is not None
    # Offsets per partition are 0..n-1, as the consumer API sees them.
    for p in (0, 1):
        assert sorted(r.offset for r in out if r.partition == p) == list(
            range(sum(1 for r in out if r.partition == p))
        )
    # Without includeHeaders the schema is Kafka's seven columns.
    plain = reader(spark, cluster, subscribe="rt")
    assert plain.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]

    # The tuple path gives the same rows as the Arrow path.
    def in_log_order(df: Any) -> list[tuple[Any, ...]]:
        return sorted((tuple(r) for r in df.collect()), key=lambda t: (t[3], t[4]))

    arrow_rows = in_log_order(plain)
    tuple_rows = in_log_order(reader(spark, cluster, subscribe="rt", useArrow="false"))
    assert arrow_rows == tuple_rows


def test_offset_ranges_and_min_partitions(spark: Any, cluster: LocalCluster) -> None:
    create_topic(cluster, "ranges")
    with Producer(cluster.bootstrap) as producer:
        for p in (0, 1):
            for i in range(40):
                producer.send("ranges", f"{p}-{i}".encode(), partition=p)
        producer.flush()

    def values(df: Any) -> list[bytes]:
        return sorted(r.value for r in df.collect())

    everything = reader(spark, cluster, subscribe="ranges")
    assert len(values(everything)) == 80

    ranged = reader(
        spark,
        cluster,
        subscribe="ranges",
        startingOffsets=json.dumps({"ranges": {"0": 5, "1": -2}}),
        endingOffsets=json.dumps({"ranges": {"0": 10, "1": 3}}),
    )
    assert values(ranged) == sorted(
        [f"0-{i}".encode() for i in range(5, 10)] + [f"1-{i}".encode() for i in range(3)]
    )
    assigned = reader(
        spark,
        cluster,
        assign=json.dumps({"ranges": [1]}),
        startingOffsets=json.dumps({"ranges": {"1": 38}}),
    )
    assert values(assigned) == [b"1-38", b"1-39"]

    split = reader(spark, cluster, subscribe="ranges", minPartitions="6")
    assert split.rdd.getNumPartitions() == 6
    rows = split.select("partition", "offset").collect()
    assert sorted((r.partition, r.offset) for r in rows) == [
        (p, o) for p in (0, 1) for o in range(40)
    ]

    # A plan's end is the HW at planning time: records produced afterwards are not read by it.
    with Consumer(cluster.bootstrap) as consumer:
        tps = [TopicPartition("ranges", 0), TopicPartition("ranges", 1)]
        assert consumer.end_offsets(tps) == dict.fromkeys(tps, 40)


def test_sink_uses_the_topic_column_and_refuses_bad_input(spark: Any, cluster: LocalCluster):
    create_topic(cluster, "col-a", 1)
    create_topic(cluster, "col-b", 1)
    df = spark.createDataFrame(
        [("col-a", "x"), ("col-b", "y"), ("col-b", "z")], "topic string, value string"
    )
    df.write.format("minibroker").option("bootstrap.servers", cluster.bootstrap).mode(
        "append"
    ).save()
    got = reader(spark, cluster, subscribePattern="col-.*").collect()
    assert sorted((r.topic, r.value) for r in got) == [
        ("col-a", b"x"),
        ("col-b", b"y"),
        ("col-b", b"z"),
    ]
    no_value = spark.createDataFrame([("col-a", "x")], "topic string, key string")
    with pytest.raises(Exception, match="value"):
        no_value.write.format("minibroker").option("bootstrap.servers", cluster.bootstrap).mode(
            "append"
        ).save()
    with pytest.raises(Exception, match="overwrite"):
        df.write.format("minibroker").option("bootstrap.servers", cluster.bootstrap).mode(
            "overwrite"
        ).save()
    # A record the broker refuses fails the task with the broker's error.
    missing = spark.createDataFrame([("no-such-topic", "x")], "topic string, value string")
    with pytest.raises(Exception, match=r"(?i)unknown.?topic"):
        missing.write.format("minibroker").option("bootstrap.servers", cluster.bootstrap).option(
            "max.block.ms", "1000"
        ).mode("append").save()
