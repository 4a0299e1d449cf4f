"""The leader refuses a batch whose CRC is right but whose records are not, and changes nothing.

Kafka's leader runs LogValidator over every produce before it assigns offsets: records must
parse to the end of the batch, match the header's count, carry offset deltas 0..n-1, use a codec
that exists and decompresses, and have timestamps inside message.timestamp.before/after.max.ms.
A CRC covers only what the producer wrote, so a batch built wrong (or on purpose) passes the CRC
check and, stored, makes every consumer fail at its offset. Here each batch of
`bad_batches.CASES` goes through a real ReplicaManager (BrokerConfig, LogManager on tmp_path,
BrokerMetrics) that leads two partitions of one topic, in one produce request with a good batch
for the other partition:
- the bad partition gets the case's error code and a message, no offset, and its log is as it
  was (same LEO, same bytes);
- the other partition's batch is appended and acknowledged as usual;
- the topic configs message.timestamp.before.max.ms / after.max.ms and message.timestamp.type
  reach the check (LogAppendTime skips it, as in Kafka).

asyncio on one event loop, no sockets: the replica set is this broker alone (acks=all needs only
this replica), so no fetcher or controller call is involved.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from bad_batches import CASES, DAY_MS, HOUR_MS, good_batch
from structlog.testing import capture_logs

from minibroker.broker import wire
from minibroker.broker.config import build_config
from minibroker.broker.metrics import BrokerMetrics
from minibroker.broker.replicas.manager import ReplicaManager
from minibroker.broker.replication.events import Role
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.data_dir import DataDir
from minibroker.broker.storage.log_manager import LogManager
from minibroker.client.batch import Compression
from minibroker.client.errors import ErrorCode
from minibroker.client.records import encode_batch, iter_records
from minibroker.client.types import TopicPartition
from minibroker.metadata.records import (
    CONFIG_RESOURCE_TOPIC,
    ConfigRecord,
    LogEntry,
    PartitionRecord,
    RegisterBrokerRecord,
    TopicRecord,
)
from minibroker.metadata.wire import batch_to_pb

ME = 1
TOPIC = "events"
TOPIC_ID = "topic-id-events"
BAD = TopicPartition(TOPIC, 0)
GOOD = TopicPartition(TOPIC, 1)

MakeLeader = Callable[..., Awaitable[ReplicaManager]]


def now_ms() -> int:
    return int(time.time() * 1000)


@pytest.fixture
async def make_leader(tmp_path: Path) -> AsyncIterator[MakeLeader]:
    """Builds replica managers on broker ME leading both partitions of TOPIC (as broker/app.py
    builds one, then made leader by the controller's metadata records; with `leader` another
    broker, ME follows it); stops them all after. The other broker is never registered, so no
    fetcher runs: a test hands the follower its leader's answers."""
    opened: list[tuple[ReplicaManager, LogManager, DataDir]] = []

    async def make(
        topic_configs: dict[str, str] | None = None,
        leader: int = ME,
        broker_configs: dict[str, object] | None = None,
    ) -> ReplicaManager:
        directory = tmp_path / f"broker-{len(opened)}"
        config = build_config({"node.id": ME, "log.dirs": str(directory), **(broker_configs or {})})
        data_dir = DataDir.open(config.data_dir, config.node_id)
        defaults = LogConfig.from_configs(defaults=config.topic_defaults)
        log_manager = LogManager.open(data_dir, defaults)
        rm = ReplicaManager(config, log_manager, BrokerMetrics(), config.controller)
        opened.append((rm, log_manager, data_dir))
        rm.load_existing_logs()
        entries = [
            LogEntry(0, 0, RegisterBrokerRecord(ME, "incarnation-1", 0, "127.0.0.1", 1)),
            LogEntry(1, 0, TopicRecord(TOPIC, TOPIC_ID, dict(topic_configs or {}))),
        ]
        for tp in (BAD, GOOD):
            record = PartitionRecord(
                topic_id=TOPIC_ID,
                partition=tp.partition,
                replicas=tuple(sorted({ME, leader})),
                isr=tuple(sorted({ME, leader})),
                leader=leader,
                leader_epoch=1,
                partition_epoch=1,
            )
            entries.append(LogEntry(len(entries), 0, record))
        await rm.apply_metadata_batch(batch_to_pb(entries, high_offset=len(entries)))
        role = Role.LEADER if leader == ME else Role.FOLLOWER
        assert rm.partitions[BAD].core.role is rm.partitions[GOOD].core.role is role
        return rm

    try:
        yield make
    finally:
        for rm, log_manager, data_dir in opened:
            await rm.stop()
            log_manager.close()
            data_dir.close()


def log_bytes(rm: ReplicaManager, tp: TopicPartition) -> bytes:
    return bytes(rm.partitions[tp].log.read(0, 1 << 24).records)


async def produce(
    rm: ReplicaManager, bad: bytes, good: bytes
) -> tuple[wire.ProduceResult, wire.ProduceResult]:
    """One acks=all produce request with `bad` for partition 0 and `good` for partition 1."""
    results = await rm.produce(
        -1, 5_000, [wire.ProducePartition(TOPIC, 0, bad), wire.ProducePartition(TOPIC, 1, good)]
    )
    return results[0], results[1]


async def produce_one(rm: ReplicaManager, batch: bytes) -> wire.ProduceResult:
    (result,) = await rm.produce(-1, 5_000, [wire.ProducePartition(TOPIC, 0, batch)])
    return result


@pytest.mark.parametrize("case", sorted(CASES))
async def test_bad_batch_is_refused_and_changes_nothing(make_leader: MakeLeader, case: str) -> None:
    rm = await make_leader()
    now = now_ms()
    first_bad, first_good = await produce(rm, good_batch(now, 2), good_batch(now, 2))
    assert first_bad.error == first_good.error == ErrorCode.NONE
    before = log_bytes(rm, BAD)
    leo = rm.partitions[BAD].log.leo

    build, code = CASES[case]
    bad_result, good_result = await produce(rm, build(now_ms()), good_batch(now_ms(), 3))

    assert bad_result.error == code, bad_result.message
    assert bad_result.message
    assert bad_result.base_offset == -1
    assert rm.partitions[BAD].log.leo == leo
    assert rm.partitions[BAD].core.leo == leo
    assert log_bytes(rm, BAD) == before
    # The other partition of the same request is appended as usual.
    assert good_result.error == ErrorCode.NONE, good_result.message
    assert good_result.base_offset == 2
    assert [r.offset for r in iter_records(log_bytes(rm, GOOD))] == [0, 1, 2, 3, 4]


async def test_timestamp_bounds_come_from_topic_configs(make_leader: MakeLeader) -> None:
    now = now_ms()
    default = await make_leader()
    # Kafka 4's defaults: up to an hour ahead, any time in the past.
    assert (await produce_one(default, good_batch(now + HOUR_MS // 2))).error == ErrorCode.NONE
    assert (await produce_one(default, good_batch(now - 400 * DAY_MS))).error == ErrorCode.NONE
    ahead = await produce_one(default, good_batch(now + 2 * HOUR_MS))
    assert ahead.error == ErrorCode.INVALID_TIMESTAMP
    assert "out of range" in ahead.message

    strict = await make_leader(
        {"message.timestamp.before.max.ms": str(DAY_MS), "message.timestamp.after.max.ms": "0"}
    )
    old = await produce_one(strict, good_batch(now_ms() - 2 * DAY_MS))
    assert old.error == ErrorCode.INVALID_TIMESTAMP
    future = await produce_one(strict, good_batch(now_ms() + 60_000))
    assert future.error == ErrorCode.INVALID_TIMESTAMP
    assert (await produce_one(strict, good_batch(now_ms() - HOUR_MS))).error == ErrorCode.NONE

    # LogAppendTime: the broker's clock replaces the producer's, so there is nothing to check.
    append_time = await make_leader({"message.timestamp.type": "LogAppendTime"})
    result = await produce_one(append_time, good_batch(now + 8 * DAY_MS))
    assert result.error == ErrorCode.NONE, result.message


async def test_the_follower_path_stores_the_leaders_bytes_unchecked(
    make_leader: MakeLeader,
) -> None:
    """Followers append what their leader stored, as Kafka's do: a batch this leader would refuse
    (a timestamp 8 days ahead, e.g. written under a laxer config) is still replicated."""
    rm = await make_leader(leader=ME + 1)
    sent = rm.follower_fetch_state(BAD, ME + 1)
    assert sent is not None
    records = good_batch(
        now_ms() + 8 * DAY_MS,
        2,
        base_offset=sent.fetch_offset,
        partition_leader_epoch=sent.current_leader_epoch,
    )
    answer = wire.FetchPartitionResult(
        topic=TOPIC,
        partition=BAD.partition,
        high_watermark=2,
        log_start_offset=0,
        log_end_offset=2,
        records=records,
    )
    await rm.apply_follower_fetch(ME + 1, sent, answer)
    assert rm.partitions[BAD].log.leo == 2
    assert log_bytes(rm, BAD)[61:] == records[61:]


# ---------------------------------------------------------------------------------------------
# Compacted topics (issue 21): a record without a key is refused with INVALID_RECORD, the whole
# batch, nothing appended (Kafka's LogValidator: "Compacted topic cannot accept message without
# key"); the policy reaches the check at creation and when it is altered.


def keyed(now: int, keys: list[bytes | None], compression: Compression = Compression.NONE) -> bytes:
    return encode_batch(
        [(now + i, key, b"value-%d" % i, ()) for i, key in enumerate(keys)],
        compression=compression,
    )


@pytest.mark.parametrize("compression", list(Compression))
async def test_a_compacted_topic_refuses_a_batch_with_a_keyless_record(
    make_leader: MakeLeader, compression: Compression
) -> None:
    with capture_logs() as logs:
        rm = await make_leader({"cleanup.policy": "compact"})
    # The log cleaner runs (log.cleaner.enable defaults to true): no warning.
    assert [e for e in logs if e["event"].startswith("compaction_")] == []

    first = await produce_one(rm, keyed(now_ms(), [b"a", b"b"], compression))
    assert (first.error, first.base_offset) == (ErrorCode.NONE, 0), first.message
    before, leo = log_bytes(rm, BAD), rm.partitions[BAD].log.leo
    # A keyless record first, in the middle or last: the whole batch is refused.
    for keys in ([None, b"k"], [b"k", None, b"j"], [b"k"] * 5 + [None]):
        bad, good = await produce(rm, keyed(now_ms(), keys, compression), good_batch(now_ms()))
        assert bad.error == ErrorCode.INVALID_RECORD, (keys, bad.message)
        assert f"record {keys.index(None)} has no key" in bad.message
        assert "compacted topic" in bad.message
        assert bad.base_offset == -1
        assert (rm.partitions[BAD].log.leo, rm.partitions[BAD].core.leo) == (leo, leo)
        assert log_bytes(rm, BAD) == before
        assert good.error == ErrorCode.NONE, good.message  # keyed: the other partition's goes in
    # An empty key is a key (Kafka checks for null only).
    empty = await produce_one(rm, keyed(now_ms(), [b""], compression))
    assert (empty.error, empty.base_offset) == (ErrorCode.NONE, 2), empty.message


async def test_the_policy_reaches_the_check_when_altered(make_leader: MakeLeader) -> None:
    rm = await make_leader()  # cleanup.policy=delete: keyless records are fine
    assert (await produce_one(rm, keyed(now_ms(), [None, None]))).error == ErrorCode.NONE

    async def alter(offset: int, value: str | None) -> None:
        record = ConfigRecord(TOPIC_ID, "cleanup.policy", value, CONFIG_RESOURCE_TOPIC)
        await rm.apply_metadata_batch(
            batch_to_pb([LogEntry(offset, 0, record)], high_offset=offset + 1)
        )

    with capture_logs() as logs:
        await alter(4, "compact,delete")
    assert [e for e in logs if e["event"].startswith("compaction_")] == []
    refused = await produce_one(rm, keyed(now_ms(), [b"k", None]))
    assert refused.error == ErrorCode.INVALID_RECORD, refused.message
    assert rm.partitions[BAD].log.leo == 2
    assert (await produce_one(rm, keyed(now_ms(), [b"k"]))).error == ErrorCode.NONE
    await alter(5, None)  # back to the default, delete
    assert (await produce_one(rm, keyed(now_ms(), [None]))).error == ErrorCode.NONE
    assert rm.partitions[BAD].log.leo == 4


@pytest.mark.parametrize(
    "cleaner_off", [{"log.cleaner.enable": "false"}, {"log.cleaner.threads": "0"}]
)
async def test_a_broker_whose_cleaner_is_off_warns_once_per_compacted_topic(
    make_leader: MakeLeader, cleaner_off: dict[str, object]
) -> None:
    with capture_logs() as logs:
        rm = await make_leader({"cleanup.policy": "compact"}, broker_configs=cleaner_off)
    warnings = [e for e in logs if e["event"] == "compaction_disabled"]
    assert [(e["topic"], e["log_level"]) for e in warnings] == [(TOPIC, "warning")]
    assert "NOT compacted" in warnings[0]["message"]
    assert not rm.cleaner.settings.active


async def test_truncation_and_deletion_reach_the_log_cleaner(make_leader: MakeLeader) -> None:
    """A follower truncation lowers the partition's cleaner checkpoint (a full one drops it), a
    deleted log's entry is dropped; describe reports the cleaner point of compacted logs."""
    from minibroker.broker.replication.outputs import ReplicaRemoved, Truncated

    rm = await make_leader({"cleanup.policy": "compact"})
    for _ in range(3):
        assert (await produce_one(rm, keyed(now_ms(), [b"a", b"b"]))).error == ErrorCode.NONE
    # What the cleaner looks at: every hosted log with its HW (read through the engine's views).
    looked = sorted((log.topic_partition, hw) for log, hw in rm._cleanable_logs())
    assert looked == [(BAD, 6), (GOOD, 0)]
    book = rm.cleaner.book
    # The book is the broker's own, in its data dir.
    assert Path(book.path).name == "cleaner-offset-checkpoint"
    book._checkpoints.update({BAD: 6, GOOD: 4})  # as two cleaned rounds would leave them
    states = {(s.topic, s.partition): s for s in rm.describe_replicas({TOPIC})}
    bad = states[(TOPIC, 0)]
    assert bad.compacted and bad.cleaner_point == 6 and bad.dirty_ratio == 0.0
    # On the wire, as `topics describe` reads it.
    from minibroker.client import wire as client_wire

    answer = wire.encode_replicas(ME, list(states.values()))
    decoded = {r.partition: r for r in client_wire.replica_offsets(answer)}
    assert (decoded[0].cleaner_point, decoded[0].dirty_ratio) == (6, 0.0)
    # GOOD's checkpoint (4) lies past its log end (0): not valid, the clean part ends at the
    # log start (Kafka's rule; the next look rewrites it).
    assert (decoded[1].cleaner_point, decoded[1].dirty_ratio) == (0, 0.0)
    rm.run([Truncated(BAD, False, 6, 2, "diverging epoch", 1)])
    assert book.checkpoint(BAD) == 2 and not book.paused(BAD)
    rm.run([Truncated(GOOD, True, 4, 9, "below the leader's log start", 1)])
    assert book.checkpoint(GOOD) is None
    assert Path(book.path).read_text() == "0\n1\nevents 0 2\n"
    rm.run([ReplicaRemoved(BAD, True, "topic deleted")])
    assert book.checkpoint(BAD) is None
    assert Path(book.path).read_text() == "0\n0\n"


async def test_a_failed_data_dir_aborts_every_cleaning_round(make_leader: MakeLeader) -> None:
    from minibroker.broker.cleaner.manager import log_facts
    from minibroker.broker.replication.outputs import LogDirFailed

    rm = await make_leader({"cleanup.policy": "compact", "segment.bytes": "200"})
    for _ in range(6):
        assert (await produce_one(rm, keyed(now_ms(), [b"a", b"b"]))).error == ErrorCode.NONE
    log = rm.partitions[BAD].log
    chosen, _ = rm.cleaner.book.grab([log_facts(log, log.leo, None)], now_ms())
    assert chosen is not None and not rm.cleaner.book.aborted(BAD)
    rm.run([LogDirFailed("test", OSError(5, "I/O error"), "storage failed", 2, 2)])
    assert rm.cleaner.book.aborted(BAD)
    assert rm._cleanable_logs() == []
