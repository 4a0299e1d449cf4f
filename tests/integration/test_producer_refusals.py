"""What the producer does with a batch its leader refuses for good (issue 11 follow-ups).

Real processes on 127.0.0.1 (one controller, one broker; the refusals are the leader's alone),
the broker with a broker-wide `message.max.bytes` of 20000, which topic metadata does not carry.
- INVALID_TIMESTAMP (a record an hour past the broker's `message.timestamp.after.max.ms`) is
  not retriable, as in Kafka: the futures of that batch fail at once with InvalidTimestampError
  naming the limit, other partitions' batches are acknowledged, and the partition takes the next
  batch (the idempotent producer starts a new sequence) at the next offset. Both the blocking and
  the asyncio producer.
- INVALID_TOPIC_EXCEPTION in a Metadata answer (a name no topic can have) ends a metadata wait
  at once, as Kafka's clients do, instead of after max_block_ms; the clients refuse such names
  before asking (tests/unit/test_client_topic_names.py), so this asks through calls that leave
  the name check to the broker.
- MESSAGE_TOO_LARGE for a batch of several records (the producer built it to the 1 MiB default it
  knew): split in halves until each part fits, as Kafka's Sender does; every record is
  acknowledged once, in order, at consecutive offsets. A single record over the limit fails.
"""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import Iterator

import pytest
from cluster_harness import LocalCluster, local_cluster

from minibroker.client import Admin, AsyncProducer, Consumer, Producer, TopicPartition
from minibroker.client.errors import InvalidTimestampError, InvalidTopicError, MessageTooLargeError

pytestmark = pytest.mark.integration

TOPIC = "refusals"
SPLIT_TOPIC = "split"
BROKER_MAX_MESSAGE_BYTES = 20_000
HOUR_MS = 3_600_000
# Retriable errors are retried until delivery_timeout_ms: a wait much shorter than it ends
# only if the refusal is final.
DELIVERY_TIMEOUT_MS = 600_000
WAIT_S = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = pathlib.Path(tmp_path_factory.mktemp("refusals")) / "cluster"
    settings = {"message.max.bytes": str(BROKER_MAX_MESSAGE_BYTES)}
    with local_cluster(str(directory), brokers=1, settings=settings) as c:
        with Admin(c.bootstrap) as admin:
            admin.create_topic(TOPIC, 2, 1)
            admin.create_topic(SPLIT_TOPIC, 1, 1)
        yield c


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def test_a_future_timestamp_fails_its_batch_at_once_and_nothing_else(
    cluster: LocalCluster,
) -> None:
    with Producer(cluster.bootstrap, delivery_timeout_ms=DELIVERY_TIMEOUT_MS) as producer:
        first = producer.send(TOPIC, b"before", partition=0).result(WAIT_S)
        late = wall_ms() + 2 * HOUR_MS
        refused = [producer.send(TOPIC, b"late", partition=0, timestamp_ms=late) for _ in "ab"]
        other = producer.send(TOPIC, b"other partition", partition=1)
        for future in refused:
            err = future.exception(WAIT_S)
            assert isinstance(err, InvalidTimestampError), repr(err)
            assert "message.timestamp.after.max.ms" in str(err) and f"{TOPIC}-0" in str(err)
        assert other.result(WAIT_S).partition == 1
        after = producer.send(TOPIC, b"after", partition=0).result(WAIT_S)
        assert after.offset == first.offset + 1, "the refused batch took no offset"


def test_the_asyncio_producer_fails_the_refused_batch_at_once(cluster: LocalCluster) -> None:
    async def run() -> None:
        async with AsyncProducer(
            cluster.bootstrap, delivery_timeout_ms=DELIVERY_TIMEOUT_MS
        ) as producer:
            late = wall_ms() + 2 * HOUR_MS
            with pytest.raises(InvalidTimestampError, match="out of range"):
                await asyncio.wait_for(
                    producer.send_and_wait(TOPIC, b"late", partition=1, timestamp_ms=late), WAIT_S
                )
            ok = await asyncio.wait_for(producer.send_and_wait(TOPIC, b"x", partition=1), WAIT_S)
            assert ok.partition == 1 and ok.offset >= 0

    asyncio.run(run())


def test_an_invalid_topic_answer_ends_a_metadata_wait_at_once(cluster: LocalCluster) -> None:
    with Consumer(cluster.bootstrap, max_block_ms=10 * DELIVERY_TIMEOUT_MS) as consumer:
        inner = consumer._async
        with pytest.raises(
            InvalidTopicError, match=r"refused by the cluster: .*the maximum is 249"
        ):
            consumer._lt.run(
                inner.cluster.wait_for_topic("x" * 250, 10 * DELIVERY_TIMEOUT_MS), WAIT_S
            )
        assert "x" * 250 not in inner.cluster.metadata.interest, "not asked for again"
        with pytest.raises(InvalidTopicError, match="only ASCII letters"):
            consumer._lt.run(
                inner.cluster.wait_for_topic("bad\n", 10 * DELIVERY_TIMEOUT_MS), WAIT_S
            )
    with Admin(cluster.bootstrap) as admin, pytest.raises(InvalidTopicError, match="only ASCII"):
        admin.describe_topics(["bad\n"])


def test_a_batch_over_the_brokers_limit_is_split_until_it_fits(cluster: LocalCluster) -> None:
    values = [b"%04d" % i + bytes([i % 251]) * 996 for i in range(100)]  # 1000 B each
    with Producer(cluster.bootstrap, linger_ms=60_000) as producer:
        futures = [producer.send(SPLIT_TOPIC, value, partition=0) for value in values]
        producer.flush()  # one ~100 KB batch, five times the limit
        offsets = [future.result(WAIT_S).offset for future in futures]
        assert offsets == list(range(offsets[0], offsets[0] + len(values)))
        too_big = producer.send(SPLIT_TOPIC, bytes(BROKER_MAX_MESSAGE_BYTES), partition=0)
        producer.flush()
        with pytest.raises(MessageTooLargeError, match=r"max\.message\.bytes"):
            too_big.result(WAIT_S)
    tp = TopicPartition(SPLIT_TOPIC, 0)
    with Consumer(cluster.bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, offsets[0])
        records = []
        deadline = time.monotonic() + WAIT_S
        while len(records) < len(values) and time.monotonic() < deadline:
            records.extend(consumer.poll(timeout_ms=500))
        records.extend(consumer.poll(timeout_ms=200))
    assert [r.value for r in records] == values, "each record once, in order"
