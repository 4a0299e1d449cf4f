"""The blocking Producer shared by threads, and its buffer limit, against real brokers.

Real processes on 127.0.0.1 (a controller and three brokers; RF 3, min.insync.replicas 2,
acks=all, idempotent). Since issue 22 the Producer's caller threads append to the accumulator
themselves (no per-record hand-over to the loop thread), so these are the rules that must still
hold with several callers at once:
- four threads `send` (keyed, so each key keeps to one partition), a fifth `send_batch`; two of
  them `flush` while the others are still sending, and two threads `close` at once. Every record
  is stored exactly once, each key's records in send order, and every future's metadata names
  the offset where a consumer finds that very record;
- with `buffer_memory` used up (the leaders SIGSTOPped, so nothing is acknowledged) `send` blocks
  for `max_block_ms`, then raises, queueing nothing; once the brokers resume, everything
  acknowledged before is there.
"""

from __future__ import annotations

import pathlib
import threading
import time
from collections.abc import Iterator

import pytest
from cluster_harness import LocalCluster, local_cluster

from minibroker.client import Admin, Consumer, Producer, TopicPartition
from minibroker.client.errors import RequestTimedOutError

pytestmark = pytest.mark.integration

TOPIC = "threads"
PARTITIONS = 3
PER_THREAD = 3000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = pathlib.Path(tmp_path_factory.mktemp("threads")) / "cluster"
    with local_cluster(str(directory), brokers=3) as c:
        with Admin(c.bootstrap) as admin:
            admin.create_topic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
            admin.create_topic("pressure", 1, 3, {"min.insync.replicas": "2"})
        yield c


def read_all(bootstrap: str, topic: str, partitions: int, expected: int) -> dict:  # type: ignore[type-arg]
    """(partition, offset) -> value for every record, read until `expected` are in."""
    found: dict[tuple[int, int], bytes] = {}
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + 60
        while len(found) < expected and time.monotonic() < deadline:
            for record in consumer.poll(500):
                assert record.value is not None
                found[(record.partition, record.offset)] = record.value
    return found


def test_threads_share_one_producer_and_every_record_lands_once_in_order(
    cluster: LocalCluster,
) -> None:
    producer = Producer(cluster.bootstrap, linger_ms=2, batch_size=16_384)
    futures: dict[bytes, object] = {}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def sender(n: int) -> None:
        try:
            mine = {}
            for i in range(PER_THREAD):
                value = f"t{n}-{i}".encode()
                mine[value] = producer.send(TOPIC, value, key=f"key-{n}")
                if n < 2 and i == PER_THREAD // 2:
                    producer.flush()  # two flushes while the others go on sending
            with lock:
                futures.update(mine)
        except BaseException as err:  # reported below, with the thread's name
            errors.append(err)

    def batch_sender() -> None:
        try:
            values = [f"b-{i}".encode() for i in range(PER_THREAD)]
            sent = producer.send_batch(TOPIC, values, partition=1)
            with lock:
                futures.update({v: sent[i] for i, v in enumerate(values)})
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=sender, args=(n,)) for n in range(4)]
    threads.append(threading.Thread(target=batch_sender))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    closers = [threading.Thread(target=producer.close) for _ in range(2)]
    for t in closers:
        t.start()
    for t in closers:
        t.join(120)
    assert not any(t.is_alive() for t in threads + closers)

    total = 5 * PER_THREAD
    assert len(futures) == total
    where = {}
    for value, future in futures.items():
        meta = future.result(timeout=0)  # type: ignore[attr-defined]
        where[(meta.partition, meta.offset)] = value
    assert len(where) == total, "two records' futures name the same offset"

    found = read_all(cluster.bootstrap, TOPIC, PARTITIONS, total)
    assert len(found) == total, f"{total - len(found)} records missing (or duplicated)"
    assert found == where, "every future names the offset its record was stored at"
    last: dict[str, tuple[int, int]] = {}
    for (partition, _offset), value in sorted(found.items()):
        source, index = value.decode().rsplit("-", 1)
        if source in last:
            assert last[source][0] == partition, f"{source}'s records moved partition"
            assert int(index) > last[source][1], f"{source}'s records out of order"
        last[source] = (partition, int(index))


def test_a_full_buffer_blocks_send_for_max_block_ms_then_raises(cluster: LocalCluster) -> None:
    producer = Producer(
        cluster.bootstrap, buffer_memory=64 * 1024, max_block_ms=500, batch_size=16_384
    )
    try:
        acknowledged = producer.send("pressure", b"before").result(timeout=60)
        brokers = [spec.node_id for spec in cluster.state.brokers]
        for ident in brokers:
            cluster.pause(ident)
        try:
            pending = []
            started = time.monotonic()
            with pytest.raises(RequestTimedOutError, match="buffer_memory"):
                for _ in range(10_000):  # 10 MB against a 64 KiB buffer
                    pending.append(producer.send("pressure", b"x" * 1000))
            assert time.monotonic() - started >= 0.5, "send waited max_block_ms first"
            assert 0 < len(pending) < 100, "the buffer took about 64 records of 1 KB"
            queued = producer._async.accumulator.buffered_bytes
        finally:
            for ident in brokers:
                cluster.resume(ident)
        assert queued >= 64 * 1024
        producer.flush(timeout_ms=120_000)
        offsets = [f.result(timeout=0).offset for f in pending]
        assert offsets == list(
            range(acknowledged.offset + 1, acknowledged.offset + 1 + len(offsets))
        )
    finally:
        producer.close()
