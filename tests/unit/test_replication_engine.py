"""The replica engine's own rules (broker/replication/engine.py), over the simulation's MemLog.

Each test drives `BrokerReplicas` through its public entry points, as the broker's shell and the
simulation do, and checks the replies, the outputs the shell must carry out, and what reached
the storage: produce (acks, validation, duplicates parked for acks=all, a failed append),
follower and consumer fetches (HW cap, KIP-392's preferred read replica), the follower side
(only the answer to the pending position applies; the leader's log start goes through the
storage's own check; a failed append is a failed fetch), acting on partition records (host,
remove, re-create, delete), AlterPartition answers for a replaced replica, produce expiry, and
the log dir going offline (every partition answers KAFKA_STORAGE_ERROR, parked produces are
answered, fetching stops). No event loop, no files.
"""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from gapped_batches import cleaned_batch
from memlog import MemAppend, MemLog, MemRead

from minibroker.broker.replication.engine import BrokerReplicas
from minibroker.broker.replication.events import (
    AlterPartitionResult,
    CompleteProduce,
    FetchResponse,
    FollowerFetch,
    Role,
)
from minibroker.broker.replication.outputs import (
    Appended,
    CorruptProduce,
    EngineConfig,
    FetchBackoff,
    FollowerAppendFailed,
    HighWatermarkMoved,
    LogConfigChanged,
    LogDirFailed,
    Output,
    ReplicaRemoved,
    RoleChanged,
    SendAlterPartition,
    StartFollowing,
    StopFollowing,
    Truncated,
    WakeFetches,
    WakeFollowerFetches,
)
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.log import PartitionLog
from minibroker.client.batch import BatchHeader
from minibroker.client.errors import ErrorCode, InvalidRecordError, KafkaStorageError
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import (
    ConfigRecord,
    LogEntry,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
)

ME, B2, B3 = 1, 2, 3
TOPIC, TOPIC_ID = "events", "id-events"
TP = TopicPartition(TOPIC, 0)
NOW = 1_000_000


# ------------------------------------------------------------------------------------------
# The storage: the simulation's MemLog; ProbedLog where a test injects a fault or watches a call


class ProbedLog(MemLog):
    """A MemLog whose next call of a method named in `fail` raises that error, and which
    records the log starts it is asked for (`calls`)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail: dict[str, BaseException] = {}
        self.calls: list[tuple[str, int]] = []

    def _maybe_fail(self, name: str) -> None:
        err = self.fail.pop(name, None)
        if err is not None:
            raise err

    def append_as_leader(
        self,
        records: bytes,
        leader_epoch: int,
        now_ms: int,
        *,
        validated: list[tuple[int, BatchHeader]] | None = None,
    ) -> MemAppend:
        self._maybe_fail("append_as_leader")
        return super().append_as_leader(records, leader_epoch, now_ms, validated=validated)

    def maybe_assign_epoch_start_offset(self, leader_epoch: int, start_offset: int) -> bool:
        self._maybe_fail("maybe_assign_epoch_start_offset")
        return super().maybe_assign_epoch_start_offset(leader_epoch, start_offset)

    def append_as_follower(self, records: bytes) -> MemAppend:
        self._maybe_fail("append_as_follower")
        return super().append_as_follower(records)

    def read(self, offset: int, max_bytes: int, *, max_offset: int | None = None) -> MemRead:
        self._maybe_fail("read")
        return super().read(offset, max_bytes, max_offset=max_offset)

    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        self.calls.append(("log_start", offset))
        return super().maybe_increment_log_start_offset(offset)


# ------------------------------------------------------------------------------------------
# Helpers


class Broker:
    """One broker's engine with the metadata image it acts on."""

    def __init__(
        self, broker_id: int = ME, *, log_type: type[MemLog] = MemLog, **config: Any
    ) -> None:
        self.image = MetadataImage()
        self.engine: BrokerReplicas[MemLog] = BrokerReplicas(
            EngineConfig(broker_id=broker_id, log_dir="/data", **config), self.image
        )
        self.log_type = log_type
        self.logs: dict[TopicPartition, Any] = {}  # MemLogs (ProbedLogs with log_type)
        self.offset = 0

    def record(self, record: Any) -> None:
        self.image.apply(LogEntry(self.offset, 0, record))
        self.offset += 1

    def act(self) -> list[Output]:
        """What the shell does with a metadata batch: act, host the logs asked for, act on them."""
        new, out = self.engine.act_on_metadata(NOW)
        for topic, record in new:
            tp = TopicPartition(topic.name, record.partition)
            log = self.logs.setdefault(tp, self.log_type())
            self.engine.host(tp, topic.topic_id, log, dict(topic.configs), high_watermark=0)
            out += self.engine.act_on_partition(topic, record, NOW)
        return out


def cluster(
    leader: int = ME,
    isr: tuple[int, ...] = (ME, B2),
    replicas: tuple[int, ...] = (ME, B2),
    epoch: int = 1,
    racks: dict[int, str] | None = None,
    log_type: type[MemLog] = MemLog,
    topic_configs: dict[str, str] | None = None,
    **config: Any,
) -> Broker:
    broker = Broker(log_type=log_type, **config)
    for b in (ME, B2, B3):
        rack = (racks or {}).get(b, "")
        broker.record(RegisterBrokerRecord(b, f"inc-{b}", 100 + b, "h", 9000 + b, rack, False))
    broker.record(TopicRecord(TOPIC, TOPIC_ID, topic_configs or {}))
    broker.record(PartitionRecord(TOPIC_ID, 0, replicas, isr, leader, epoch, epoch))
    broker.act()
    return broker


def batch(value: bytes = b"v", *, producer_id: int = -1, sequence: int = -1) -> bytes:
    return encode_batch(
        [(NOW, None, value, ())],
        producer_id=producer_id,
        producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=sequence,
    )


def follower_fetch(broker: Broker, offset: int, epoch: int = 1, last_epoch: int = -1) -> Any:
    fetch = FollowerFetch(B2, 100 + B2, epoch, offset, last_epoch, 0)
    return broker.engine.follower_fetch(TP, fetch, 1 << 20, NOW)


def of(outputs: list[Output], kind: type) -> list[Any]:
    return [o for o in outputs if isinstance(o, kind)]


# ------------------------------------------------------------------------------------------
# Produce


def test_acks_1_appends_and_wakes_follower_fetches() -> None:
    broker = cluster()
    reply, out = broker.engine.produce(TP, 1, batch(), NOW, NOW + 5_000)
    assert (reply.error, reply.base_offset, reply.token) == (ErrorCode.NONE, 0, None)
    assert broker.logs[TP].leo == 1
    appended = of(out, Appended)
    assert [(a.as_leader, a.base_offset, a.next_offset, a.records) for a in appended] == [
        (True, 0, 1, 1)
    ]
    assert of(out, WakeFollowerFetches) == [WakeFollowerFetches(TP)]


def test_acks_all_waits_for_the_follower_then_completes_by_token() -> None:
    broker = cluster()
    reply, out = broker.engine.produce(TP, -1, batch(), NOW, NOW + 5_000)
    assert reply.error == ErrorCode.NONE and reply.token is not None
    assert of(out, CompleteProduce) == []
    # The follower fetches past the batch: the HW moves and the produce completes.
    fetched, _ = follower_fetch(broker, 0)
    assert fetched.records  # the batch is served to the follower
    _, out = follower_fetch(broker, 1)
    assert of(out, HighWatermarkMoved) == [HighWatermarkMoved(TP, 1)]
    (done,) = of(out, CompleteProduce)
    assert (done.token, done.error, done.base_offset) == (reply.token, ErrorCode.NONE, 0)


def test_an_idempotent_retry_answers_the_original_offsets_and_parks_for_acks_all() -> None:
    broker = cluster()
    first, _ = broker.engine.produce(TP, -1, batch(producer_id=7, sequence=0), NOW, NOW + 5_000)
    retry, out = broker.engine.produce(TP, -1, batch(producer_id=7, sequence=0), NOW, NOW + 5_000)
    assert broker.logs[TP].leo == 1  # not appended twice
    assert (retry.error, retry.base_offset) == (ErrorCode.NONE, first.base_offset)
    assert retry.token is not None and retry.token != first.token
    assert of(out, Appended) == [] and of(out, CompleteProduce) == []
    _, out = follower_fetch(broker, 1)
    assert sorted(c.token for c in of(out, CompleteProduce)) == sorted([first.token, retry.token])


def test_invalid_acks_and_partitions_not_hosted() -> None:
    broker = cluster()
    reply, _ = broker.engine.produce(TP, 2, batch(), NOW, NOW)
    assert reply.error == ErrorCode.INVALID_REQUIRED_ACKS
    reply, _ = broker.engine.produce(TopicPartition(TOPIC, 9), 1, batch(), NOW, NOW)
    assert reply.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    broker.record(PartitionRecord(TOPIC_ID, 1, (B2, B3), (B2, B3), B2, 3, 3))
    broker.act()
    reply, _ = broker.engine.produce(TopicPartition(TOPIC, 1), 1, batch(), NOW, NOW)
    assert (reply.error, reply.leader) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, (B2, 3))


def test_a_follower_refuses_produce_with_its_leader() -> None:
    broker = cluster(leader=B2)
    reply, _ = broker.engine.produce(TP, 1, batch(), NOW, NOW)
    assert (reply.error, reply.leader) == (ErrorCode.NOT_LEADER_OR_FOLLOWER, (B2, 1))
    assert broker.logs[TP].leo == 0


def test_a_corrupt_batch_is_refused_and_counted() -> None:
    broker = cluster()
    bad = bytearray(batch())
    bad[-1] ^= 0xFF
    reply, out = broker.engine.produce(TP, 1, bytes(bad), NOW, NOW)
    assert reply.error == ErrorCode.CORRUPT_MESSAGE
    assert of(out, CorruptProduce) == [CorruptProduce(TP)]
    assert broker.logs[TP].leo == 0


def test_parked_produces_expire_at_their_deadline() -> None:
    broker = cluster()
    reply, _ = broker.engine.produce(TP, -1, batch(), NOW, NOW + 100)
    assert broker.engine.expire_produces(TP, NOW + 99) == []
    (done,) = of(broker.engine.expire_produces(TP, NOW + 100), CompleteProduce)
    assert (done.token, done.error) == (reply.token, ErrorCode.REQUEST_TIMED_OUT)


# ------------------------------------------------------------------------------------------
# Consumer fetch and offsets


def test_a_consumer_reads_up_to_the_high_watermark_only() -> None:
    broker = cluster()
    broker.engine.produce(TP, 1, batch(b"a"), NOW, NOW)
    reply, _ = broker.engine.consumer_fetch(TP, 1, 0, 1 << 20)
    assert reply.error == ErrorCode.NONE and reply.records == b"" and reply.high_watermark == 0
    follower_fetch(broker, 1)  # the follower has it: HW 1
    reply, _ = broker.engine.consumer_fetch(TP, 1, 0, 1 << 20)
    assert reply.high_watermark == 1 and reply.records == broker.logs[TP].batches[0]


def test_kip_392_points_a_client_at_an_in_sync_follower_in_its_rack() -> None:
    racks = {ME: "r1", B2: "r2"}
    broker = cluster(racks=racks, rack="r1", rack_aware_selector=True)
    broker.engine.produce(TP, 1, batch(), NOW, NOW)
    reply, _ = broker.engine.consumer_fetch(TP, 1, 1, 1 << 20, rack_id="r2")
    assert reply.preferred_read_replica == -1  # the follower does not hold offset 1 yet
    follower_fetch(broker, 1)
    reply, _ = broker.engine.consumer_fetch(TP, 1, 1, 1 << 20, rack_id="r2")
    assert reply.preferred_read_replica == B2 and reply.records == b""
    # A client in the leader's rack reads here.
    reply, _ = broker.engine.consumer_fetch(TP, 1, 0, 1 << 20, rack_id="r1")
    assert reply.preferred_read_replica == -1 and reply.records


def test_a_follower_in_the_clients_rack_serves_it() -> None:
    broker = cluster(leader=B2, racks={ME: "r1"}, rack="r1", rack_aware_selector=True)
    reply, _ = broker.engine.consumer_fetch(TP, 1, 0, 1 << 20, rack_id="r1")
    assert reply.error == ErrorCode.NONE
    reply, _ = broker.engine.consumer_fetch(TP, 1, 0, 1 << 20, rack_id="r9")
    assert reply.error == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_list_offsets_looks_timestamps_up_in_the_storage() -> None:
    broker = cluster(isr=(ME,))
    broker.engine.produce(TP, 1, batch(), NOW, NOW)
    reply, _ = broker.engine.list_offsets(TP, 1, NOW - 5)
    assert (reply.error, reply.offset, reply.timestamp) == (ErrorCode.NONE, 0, NOW)
    reply, _ = broker.engine.list_offsets(TP, 1, -1)  # LATEST: the HW
    assert reply.offset == 1
    reply, _ = broker.engine.offset_for_leader_epoch(TP, 1, 1)
    assert (reply.leader_epoch, reply.end_offset) == (1, 1)


# ------------------------------------------------------------------------------------------
# The follower side


def test_only_the_answer_to_the_pending_position_applies() -> None:
    broker = cluster(leader=B2)
    engine = broker.engine
    older = engine.next_fetch(TP, B2, NOW)
    newer = engine.next_fetch(TP, B2, NOW)
    assert older is not None and newer is not None and older == newer
    data = encode_batch([(NOW, None, b"x", ())], partition_leader_epoch=1)
    answer = FetchResponse(ErrorCode.NONE, 1, 0, 1, None, data)
    assert engine.on_fetch_response(TP, B2, older, answer, NOW) == []
    assert engine.on_fetch_response(TP, B3, newer, answer, NOW) == []  # another leader
    assert broker.logs[TP].leo == 0
    out = engine.on_fetch_response(TP, B2, newer, answer, NOW)
    assert broker.logs[TP].leo == 1 and engine.pending_fetch(TP) is None
    assert [(a.as_leader, a.base_offset) for a in of(out, Appended)] == [(False, 0)]
    assert of(out, HighWatermarkMoved) == [HighWatermarkMoved(TP, 1)]


def test_the_leaders_log_start_goes_through_the_storages_check() -> None:
    """AdvanceLogStartOffset is `maybe_increment_log_start_offset`, never a field write."""
    broker = cluster(leader=B2, log_type=ProbedLog)
    engine = broker.engine
    data = encode_batch([(NOW, None, b"x", ())] * 3, partition_leader_epoch=1)
    position = engine.next_fetch(TP, B2, NOW)
    assert position is not None
    engine.on_fetch_response(
        TP, B2, position, FetchResponse(ErrorCode.NONE, 3, 2, 3, None, data), NOW
    )
    assert broker.logs[TP].calls == [("log_start", 2)]
    assert broker.logs[TP].log_start_offset == 2


def test_a_failed_follower_append_is_a_failed_fetch() -> None:
    broker = cluster(leader=B2, log_type=ProbedLog)
    engine = broker.engine
    broker.logs[TP].fail["append_as_follower"] = InvalidRecordError("bad batch")
    position = engine.next_fetch(TP, B2, NOW)
    assert position is not None
    data = encode_batch([(NOW, None, b"x", ())])
    out = engine.on_fetch_response(
        TP, B2, position, FetchResponse(ErrorCode.NONE, 1, 0, 1, None, data), NOW
    )
    assert [f.error for f in of(out, FollowerAppendFailed)] == ["bad batch"]
    assert len(of(out, FetchBackoff)) == 1
    assert broker.logs[TP].leo == 0 and engine.offline is None
    assert engine.next_fetch(TP, B2, NOW) is None  # backing off


def test_a_diverging_follower_truncates_and_reports_it() -> None:
    broker = cluster(leader=B2)
    engine = broker.engine
    log = broker.logs[TP]
    for offset in (0, 1):
        log.append_as_follower(
            encode_batch([(NOW, None, b"x", ())], base_offset=offset, partition_leader_epoch=0)
        )
    broker.engine.host(TP, TOPIC_ID, log, {}, high_watermark=0)  # re-read the log's LEO
    broker.act()
    position = engine.next_fetch(TP, B2, NOW)
    assert position is not None and position.fetch_offset == 2
    answer = FetchResponse(ErrorCode.NONE, 0, 0, 1, (0, 1))
    out = engine.on_fetch_response(TP, B2, position, answer, NOW)
    (truncated,) = of(out, Truncated)
    assert (truncated.from_offset, truncated.to_offset, truncated.fully) == (2, 1, False)
    assert log.leo == 1


def _follow_with_a_real_log(
    tmp_path: pathlib.Path, configs: dict[str, str], *, marked: bool = False
) -> tuple[Broker, PartitionLog, list[Output]]:
    """A follower hosting a PartitionLog under `configs`, answered with batches at 3 and 7
    while its LEO is 0 (a cleaned leader log)."""
    broker = cluster(leader=B2, topic_configs=configs)
    log = PartitionLog.open(tmp_path / "events-0", TP, LogConfig.from_configs(configs), now_ms=NOW)
    if marked:
        log.mark_may_have_gaps()
    broker.engine.host(TP, TOPIC_ID, log, configs, high_watermark=0)  # type: ignore[arg-type]
    broker.act()
    position = broker.engine.next_fetch(TP, B2, NOW)
    assert position is not None and position.fetch_offset == 0
    data = encode_batch([(NOW, b"k", b"x", ())], base_offset=3, partition_leader_epoch=1)
    data += encode_batch([(NOW, b"k", b"y", ())], base_offset=7, partition_leader_epoch=1)
    answer = FetchResponse(ErrorCode.NONE, 8, 0, 8, None, data)
    return broker, log, broker.engine.on_fetch_response(TP, B2, position, answer, NOW)


def test_a_compacted_follower_appends_past_the_gaps_of_its_leader(
    tmp_path: pathlib.Path,
) -> None:
    _, log, out = _follow_with_a_real_log(tmp_path, {"cleanup.policy": "compact"})
    assert [(a.as_leader, a.base_offset) for a in of(out, Appended)] == [(False, 0)]
    assert of(out, HighWatermarkMoved) == [HighWatermarkMoved(TP, 8)]
    assert log.leo == 8 and log.may_have_gaps
    log.close()


def test_a_delete_follower_refuses_a_gap_unless_its_log_has_gaps(tmp_path: pathlib.Path) -> None:
    _, log, out = _follow_with_a_real_log(tmp_path / "a", {"cleanup.policy": "delete"})
    assert [b.reason for b in of(out, FetchBackoff)] == ["leader sent offset 3, expected at 0"]
    assert log.leo == 0 and not log.may_have_gaps
    log.close()
    # A topic compacted before (its log has the marker) still follows its leader's gaps.
    _, log, out = _follow_with_a_real_log(tmp_path / "b", {}, marked=True)
    assert of(out, FetchBackoff) == []
    assert log.leo == 8
    log.close()


def test_a_compacted_topic_altered_to_delete_still_follows_its_leaders_gaps(
    tmp_path: pathlib.Path,
) -> None:
    """The leader's cleaner made gaps while the topic was compacted; altered to delete, the
    follower must still append past them (its log takes the gaps marker, as the shell applies
    the new config; the core keeps allowing gaps)."""
    configs = {"cleanup.policy": "compact"}
    broker = cluster(leader=B2, topic_configs=configs)
    log = PartitionLog.open(tmp_path / "events-0", TP, LogConfig.from_configs(configs), now_ms=NOW)
    broker.engine.host(TP, TOPIC_ID, log, configs, high_watermark=0)  # type: ignore[arg-type]
    broker.act()
    broker.record(ConfigRecord(TOPIC_ID, "cleanup.policy", "delete"))
    out = broker.act()
    (changed,) = of(out, LogConfigChanged)
    log.update_config(LogConfig.from_configs(changed.configs))  # what the shell does with it
    assert not log.config.compact and log.may_have_gaps
    position = broker.engine.next_fetch(TP, B2, NOW)
    assert position is not None
    data = encode_batch([(NOW, b"k", b"x", ())], base_offset=4, partition_leader_epoch=1)
    answer = FetchResponse(ErrorCode.NONE, 5, 0, 5, None, data)
    out = broker.engine.on_fetch_response(TP, B2, position, answer, NOW)
    assert of(out, FetchBackoff) == []
    assert log.leo == 5
    log.close()
    reopened = PartitionLog.open(tmp_path / "events-0", TP, LogConfig.from_configs({}), now_ms=NOW)
    assert reopened.may_have_gaps  # after a restart too
    reopened.close()


def test_a_leader_serves_a_follower_fetching_inside_a_gap_the_next_batch(
    tmp_path: pathlib.Path,
) -> None:
    """A cleaned leader log (gaps at 2..4 and 8..9): a follower fetch at an offset inside a gap
    is answered from the next batch on, not refused."""
    folder = tmp_path / "events-0"
    folder.mkdir()
    batches = [
        cleaned_batch(0, [(0, b"a", b"1")], 1),
        cleaned_batch(5, [(6, b"b", b"2")], 7),
        cleaned_batch(10, [(10, b"c", b"3")], 10),
    ]
    (folder / f"{0:020d}.log").write_bytes(b"".join(batches))
    (folder / ".may-have-gaps").touch()
    configs = {"cleanup.policy": "compact"}
    broker = cluster(leader=ME, topic_configs=configs)
    log = PartitionLog.open(folder, TP, LogConfig.from_configs(configs), now_ms=NOW)
    assert log.may_have_gaps and log.leo == 11
    broker.engine.host(TP, TOPIC_ID, log, configs, high_watermark=0)  # type: ignore[arg-type]
    broker.act()
    reply, _ = follower_fetch(broker, 3, epoch=1, last_epoch=0)
    assert reply.error == ErrorCode.NONE and reply.diverging_epoch is None
    assert bytes(reply.records) == batches[1] + batches[2]
    reply, _ = follower_fetch(broker, 8, epoch=1, last_epoch=0)
    assert bytes(reply.records) == batches[2]
    log.close()


# ------------------------------------------------------------------------------------------
# Metadata, AlterPartition


def test_records_host_change_role_and_remove() -> None:
    broker = Broker()
    broker.record(RegisterBrokerRecord(ME, "i", 100, "h", 1, "", False))
    broker.record(TopicRecord(TOPIC, TOPIC_ID))
    broker.record(PartitionRecord(TOPIC_ID, 0, (ME, B2), (ME, B2), B2, 1, 1))
    out = broker.act()
    assert broker.engine.role(TP) is Role.FOLLOWER
    assert of(out, StartFollowing) == [StartFollowing(TP, B2)]
    assert [r.role for r in of(out, RoleChanged)] == [Role.FOLLOWER]
    broker.record(PartitionRecord(TOPIC_ID, 0, (ME, B2), (ME, B2), ME, 2, 2))
    out = broker.act()
    assert broker.engine.role(TP) is Role.LEADER and WakeFetches(TP) in out
    reply, _ = broker.engine.produce(TP, -1, batch(), NOW, NOW + 5_000)
    broker.record(PartitionRecord(TOPIC_ID, 0, (B2, B3), (B2, B3), B2, 3, 3))
    out = broker.act()
    assert TP not in broker.engine
    assert [(c.token, c.error) for c in of(out, CompleteProduce)] == [
        (reply.token, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    ]
    assert of(out, ReplicaRemoved) == [ReplicaRemoved(TP, True, "no longer a replica")]


def test_a_deleted_topic_is_removed_and_a_recreated_one_gets_a_new_log() -> None:
    broker = cluster()
    reply, _ = broker.engine.produce(TP, -1, batch(), NOW, NOW + 5_000)
    broker.record(RemoveTopicRecord(TOPIC_ID))
    out = broker.act()
    assert TP not in broker.engine
    assert [r.delete for r in of(out, ReplicaRemoved)] == [True]
    assert reply.token in [c.token for c in of(out, CompleteProduce)]
    broker.record(TopicRecord(TOPIC, "id-2"))
    broker.record(PartitionRecord("id-2", 0, (ME,), (ME,), ME, 1, 1))
    new, _ = broker.engine.act_on_metadata(NOW)
    assert [(t.topic_id, r.partition) for t, r in new] == [("id-2", 0)]


def test_a_log_loaded_without_a_topic_id_is_replaced_and_strays_go() -> None:
    broker = Broker()
    broker.engine.host(TP, "", MemLog(), None, high_watermark=0)
    other = TopicPartition("gone", 0)
    broker.engine.host(other, "old-id", MemLog(), None, high_watermark=0)
    broker.record(TopicRecord(TOPIC, TOPIC_ID))
    broker.record(PartitionRecord(TOPIC_ID, 0, (ME,), (ME,), ME, 1, 1))
    new, out = broker.engine.act_on_metadata(NOW)
    assert [r.reason for r in of(out, ReplicaRemoved)] == ["topic re-created"]
    assert len(new) == 1 and other in broker.engine  # not a stray before the catch-up
    out = broker.engine.remove_strays()
    assert [r.tp for r in of(out, ReplicaRemoved)] == [other]


def test_an_alter_partition_answer_for_a_replaced_replica_is_dropped() -> None:
    broker = cluster(isr=(ME,))
    proposals = []
    for _ in range(2):  # B2 caught up: the leader proposes adding it, once
        _, out = follower_fetch(broker, 0)
        proposals += of(out, SendAlterPartition)
    (send,) = proposals
    assert send.proposal.new_isr == {ME, B2}
    result = AlterPartitionResult(
        send.proposal.proposal_id, ErrorCode.NONE, 1, 2, frozenset({ME, B2})
    )
    assert broker.engine.on_alter_partition_result(TP, send.generation + 1, result, NOW) == []
    out = broker.engine.on_alter_partition_result(TP, send.generation, result, NOW)
    assert out and broker.engine.describe()[0].isr == (ME, B2)


# ------------------------------------------------------------------------------------------
# Views: gauges, followed leaders, describe


def test_gauges_followed_leaders_and_describe_read_the_hosted_replicas() -> None:
    broker = cluster()  # partition 0: led here, ISR {ME, B2} of (ME, B2)
    broker.record(PartitionRecord(TOPIC_ID, 1, (ME, B2), (ME,), ME, 1, 1))  # led, ISR shrunk
    broker.record(PartitionRecord(TOPIC_ID, 2, (ME, B2), (ME, B2), B2, 1, 1))  # followed
    broker.act()
    parked, _ = broker.engine.produce(TP, -1, batch(), NOW, NOW + 5_000)
    assert parked.token is not None
    followed = TopicPartition(TOPIC, 2)
    assert list(broker.engine.followed_leaders()) == [(followed, B2)]
    # Only among the partitions given (a metadata batch's): led, unknown or followed.
    among = [TP, TopicPartition(TOPIC, 9), followed]
    assert list(broker.engine.followed_leaders(among)) == [(followed, B2)]
    assert list(broker.engine.followed_leaders([TP])) == []
    # The leader of partition 2 is at HW 5; this follower holds nothing yet: it lags by 5.
    position = broker.engine.next_fetch(followed, B2, NOW)
    assert position is not None
    broker.engine.on_fetch_response(
        followed, B2, position, FetchResponse(ErrorCode.NONE, 5, 0, 5, None, b""), NOW
    )
    gauges = broker.engine.gauges()
    # (under-replicated, under min ISR, at min ISR (min.insync.replicas 1), leaders,
    # partitions, max follower lag, parked produces)
    assert (
        gauges.under_replicated,
        gauges.under_min_isr,
        gauges.at_min_isr,
        gauges.leaders,
        gauges.partitions,
        gauges.max_lag,
        gauges.pending_produces,
    ) == (1, 0, 1, 2, 3, 5, 1)
    follower_fetch(broker, 1)  # B2 reaches the LEO of partition 0
    described = broker.engine.describe([TOPIC])[0]  # sorted: partition 0 first
    assert (described.tp, described.is_leader, described.high_watermark) == (TP, True, 1)
    assert [(f.replica_id, f.log_end_offset) for f in described.followers] == [(B2, 1)]
    assert broker.engine.describe(["other"]) == []


# ------------------------------------------------------------------------------------------
# The log dir going offline


def test_a_failed_append_takes_the_dir_offline_everywhere() -> None:
    broker = cluster(log_type=ProbedLog)
    other = TopicPartition(TOPIC, 1)
    broker.record(PartitionRecord(TOPIC_ID, 1, (ME, B2), (ME, B2), ME, 1, 1))
    broker.act()
    parked, _ = broker.engine.produce(other, -1, batch(), NOW, NOW + 5_000)
    broker.logs[TP].fail["append_as_leader"] = KafkaStorageError("disk gone")
    reply, out = broker.engine.produce(TP, 1, batch(), NOW, NOW)
    assert reply.error == ErrorCode.KAFKA_STORAGE_ERROR
    (failed,) = of(out, LogDirFailed)
    assert failed.operation == f"produce to {TP}"
    assert failed.serving_error.startswith("the broker's log dir /data is offline")
    assert [(c.token, c.error) for c in of(out, CompleteProduce)] == [
        (parked.token, ErrorCode.KAFKA_STORAGE_ERROR)
    ]
    assert {s.tp for s in of(out, StopFollowing)} == {TP, other}
    # From now on every partition answers the storage error, and nothing fetches.
    for tp in (TP, other):
        assert (
            broker.engine.produce(tp, 1, batch(), NOW, NOW)[0].error
            == ErrorCode.KAFKA_STORAGE_ERROR
        )
        assert broker.engine.consumer_fetch(tp, 1, 0, 100)[0].error == ErrorCode.KAFKA_STORAGE_ERROR
        assert broker.engine.list_offsets(tp, 1, -2)[0].error == ErrorCode.KAFKA_STORAGE_ERROR
        assert broker.engine.next_fetch(tp, B2, NOW) is None
    assert broker.engine.storage_failed(OSError("again"), "x") == (True, [])


def test_a_read_failure_takes_the_dir_offline_and_other_errors_raise() -> None:
    broker = cluster(isr=(ME,), log_type=ProbedLog)
    broker.engine.produce(TP, 1, batch(), NOW, NOW)
    broker.logs[TP].fail["read"] = ValueError("a bug, not the disk")
    with pytest.raises(ValueError):
        broker.engine.consumer_fetch(TP, 1, 0, 100)
    assert broker.engine.offline is None
    broker.logs[TP].fail["read"] = OSError(5, "EIO")
    reply, out = broker.engine.consumer_fetch(TP, 1, 0, 100)
    assert reply.error == ErrorCode.KAFKA_STORAGE_ERROR
    assert [f.operation for f in of(out, LogDirFailed)] == [f"read from {TP}"]


def test_a_produce_the_core_completes_after_a_failed_storage_effect_is_still_answered() -> None:
    # Found in review: the core hands a parked produce over in its CompleteProduce effect; when
    # an earlier effect of the same list failed on the disk (here the new epoch's entry), the
    # rest of the list was dropped, so that produce was answered by no one, and its timeout hit
    # an invariant inside the produce call.
    broker = cluster(log_type=ProbedLog)
    reply, out = broker.engine.produce(TP, -1, batch(), NOW, NOW + 5_000)
    assert reply.token is not None and not of(out, CompleteProduce)
    broker.logs[TP].fail["maybe_assign_epoch_start_offset"] = KafkaStorageError("disk gone")
    # Re-elected at epoch 2 with an ISR of this broker alone: the HW passes the batch.
    broker.record(PartitionRecord(TOPIC_ID, 0, (ME, B2), (ME,), ME, 2, 2))
    out = broker.act()
    assert [c.token for c in of(out, CompleteProduce)] == [reply.token]
    assert of(out, LogDirFailed)


def test_no_replica_follows_a_leader_once_the_log_dir_is_offline() -> None:
    # Found in review: every metadata batch re-started the fetchers the failed dir had stopped.
    broker = cluster(leader=B2)
    assert list(broker.engine.followed_leaders()) == [(TP, B2)]
    offline, _ = broker.engine.storage_failed(KafkaStorageError("disk gone"), "checkpoint")
    assert offline
    assert list(broker.engine.followed_leaders()) == []
