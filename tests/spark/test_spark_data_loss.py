"""failOnDataLoss: records deleted by retention before they were read (Kafka's reportDataLoss).

Topics here roll tiny segments and keep only a few KiB, and the session cluster runs retention
every 200 ms, so old offsets disappear within a second. A batch read that starts below the log
start offset, and a streaming query restarted from a checkpoint that points below it, must fail
by default and, with failOnDataLoss=false, skip to the log start and read the rest exactly once.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
from cluster_harness import LocalCluster, wait_until
from pyspark.errors import StreamingQueryException

from minibroker.client import Admin, Consumer, Producer, TopicPartition

pytestmark = pytest.mark.spark

RETENTION = {"segment.bytes": "2048", "retention.bytes": "4096"}


def produce(bootstrap: str, topic: str, first: int, count: int) -> None:
    # Small batches (a flush every 5 records) so that segments roll at 2 KiB.
    with Producer(bootstrap, linger_ms=0) as producer:
        for i in range(first, first + count):
            producer.send(topic, f"v{i}:".encode() + b"x" * 200, partition=0)
            if i % 5 == 4:
                producer.flush()
        producer.flush()


def offsets(bootstrap: str, topic: str) -> tuple[int, int]:
    tp = TopicPartition(topic, 0)
    with Consumer(bootstrap) as consumer:
        return consumer.beginning_offsets([tp])[tp], consumer.end_offsets([tp])[tp]


def test_batch_read_below_the_log_start(spark: Any, cluster: LocalCluster) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("loss-b", 1, 3, RETENTION)
    produce(cluster.bootstrap, "loss-b", 0, 100)
    wait_until(lambda: offsets(cluster.bootstrap, "loss-b")[0] > 0, 30, "retention to run")
    log_start, high_watermark = offsets(cluster.bootstrap, "loss-b")

    def read(**extra: str) -> Any:
        r = (
            spark.read.format("minibroker")
            .option("bootstrap.servers", cluster.bootstrap)
            .option("subscribe", "loss-b")
            .option("startingOffsets", json.dumps({"loss-b": {"0": 0}}))
        )
        for key, value in extra.items():
            r = r.option(key, value)
        return r.load()

    with pytest.raises(Exception, match="failOnDataLoss"):
        read().collect()
    got = sorted(r.offset for r in read(failOnDataLoss="false").collect())
    assert got == list(range(got[0], high_watermark))
    assert got[0] >= log_start > 0


def test_restarted_stream_behind_retention(
    spark: Any, cluster: LocalCluster, tmp_path: pathlib.Path
) -> None:
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("loss-s", 1, 3, RETENTION)
    produce(cluster.bootstrap, "loss-s", 0, 20)
    checkpoint = str(tmp_path / "ckpt")

    seen: dict[str, list[int]] = {}

    def run(name: str, **extra: str) -> Any:
        r = (
            spark.readStream.format("minibroker")
            .option("bootstrap.servers", cluster.bootstrap)
            .option("subscribe", "loss-s")
            .option("startingOffsets", "earliest")
        )
        for key, value in extra.items():
            r = r.option(key, value)
        rows = seen.setdefault(name, [])

        def collect(batch: Any, _batch_id: int) -> None:
            rows.extend(row.offset for row in batch.collect())

        # foreachBatch (not the memory sink) because only it can restart from a checkpoint.
        query = (
            r.load()
            .select("offset")
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination(120)
        except StreamingQueryException:
            pass  # the caller checks query.exception()
        return query

    first = run("loss_first")
    assert first.exception() is None
    assert sorted(seen["loss_first"]) == list(range(20))

    # While the query is down, retention deletes offsets it has not read yet.
    produce(cluster.bootstrap, "loss-s", 20, 200)
    wait_until(lambda: offsets(cluster.bootstrap, "loss-s")[0] > 20, 30, "retention past 20")

    failed = run("loss_failed")
    assert failed.exception() is not None
    assert "failOnDataLoss" in str(failed.exception())

    skipped = run("loss_skipped", failOnDataLoss="false")
    assert skipped.exception() is None
    log_start, high_watermark = offsets(cluster.bootstrap, "loss-s")
    got = sorted(seen["loss_skipped"])
    # From wherever the log started when the batch was read, to the HW, each offset once.
    assert got and got == list(range(got[0], high_watermark))
    assert 20 < got[0] <= log_start
