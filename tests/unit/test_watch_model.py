"""`minibroker watch`'s model and rendering, without a cluster.

Events come from diffing consecutive full PartitionRecords and broker records (docs/protocol.md §17:
every leader change bumps the leader epoch, a leader of -1 is an offline partition, fencing removes
a broker from ISRs), truncations from the brokers' DescribeReplicas answers (docs/design.md §7.2),
lag is the leader's LEO minus the replica's. The rendered frame names problems in words and colours
them.
"""

from __future__ import annotations

import json
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from minibroker.client.types import NO_LEADER
from minibroker.client.watch.events import ClusterEvent, EventKind
from minibroker.client.watch.live import replica_reports_from_pb
from minibroker.client.watch.model import WatchModel
from minibroker.client.watch.observations import (
    ClusterInfo,
    FollowerReport,
    ProcessInfo,
    QuorumAnswer,
    QuorumInfo,
    ReplicaReport,
    merge_quorum_answers,
)
from minibroker.client.watch.render import format_time, render
from minibroker.metadata.records import (
    LEADER_RECOVERING,
    BrokerRegistrationChangeRecord,
    LeaderChangeRecord,
    LogEntry,
    MetadataRecord,
    NoOpRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnregisterBrokerRecord,
)
from minibroker.proto import minibroker_pb2 as pb

T0 = 1_763_000_000_000
TOPIC_ID = "tid-orders"


class Log:
    """Builds metadata log entries at consecutive offsets, one millisecond apart."""

    def __init__(self) -> None:
        self.entries: list[LogEntry] = []

    def add(self, record: MetadataRecord, at_ms: int | None = None) -> LogEntry:
        offset = len(self.entries)
        entry = LogEntry(offset, T0 + offset if at_ms is None else at_ms, record)
        self.entries.append(entry)
        return entry


def part(
    partition: int,
    isr: tuple[int, ...],
    leader: int,
    leader_epoch: int,
    partition_epoch: int,
    reason: str = "",
    replicas: tuple[int, ...] = (1, 2, 3),
    recovery: int = 0,
) -> PartitionRecord:
    return PartitionRecord(
        TOPIC_ID, partition, replicas, isr, leader, leader_epoch, partition_epoch, recovery, reason
    )


def three_brokers_one_topic() -> tuple[WatchModel, Log]:
    """Brokers 1-3 registered and unfenced, topic `orders` with partitions 0 (led by 1) and
    1 (led by 2), all replicas in sync."""
    log = Log()
    for b in (1, 2, 3):
        log.add(RegisterBrokerRecord(b, f"inc-{b}", b - 1, "127.0.0.1", 9091 + b, f"rack-{b}"))
    for b in (1, 2, 3):
        log.add(BrokerRegistrationChangeRecord(b, b - 1, fenced=False))
    log.add(TopicRecord("orders", TOPIC_ID, {}))
    log.add(part(0, (1, 2, 3), 1, 0, 0, "topic created"))
    log.add(part(1, (2, 3, 1), 2, 0, 0, "topic created", replicas=(2, 3, 1)))
    model = WatchModel()
    model.apply_entries(log.entries)
    return model, log


def last_of(model: WatchModel, kind: EventKind) -> ClusterEvent:
    matching = [e for e in model.events if e.kind is kind]
    assert matching, f"no {kind} event in {model.events}"
    return matching[-1]


def kinds(model: WatchModel) -> list[EventKind]:
    return [e.kind for e in model.events]


def frame_text(model: WatchModel, now_ms: int, **kw: object) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(render(model, now_ms, **kw))  # type: ignore[arg-type]
    return console.export_text()


def frame_ansi(model: WatchModel, now_ms: int) -> str:
    console = Console(record=True, width=200, force_terminal=True, color_system="standard")
    console.print(render(model, now_ms))
    return console.export_text(styles=True)


def line_with(text: str, needle: str) -> str:
    lines = [line for line in text.splitlines() if needle in line]
    assert lines, f"no line with {needle!r} in:\n{text}"
    return lines[0]


# -- events from metadata records ---------------------------------------------------------------


def test_creation_gives_registration_unfence_and_topic_events_not_per_partition_noise() -> None:
    model, _ = three_brokers_one_topic()
    assert kinds(model) == [EventKind.REGISTERED] * 3 + [EventKind.UNFENCED] * 3 + [
        EventKind.TOPIC_CREATED
    ]
    assert (
        model.events[0].text == "broker 1 registered at 127.0.0.1:9092, broker epoch 0, rack rack-1"
    )
    assert model.events[0].timestamp_ms == T0


def test_leader_change_is_an_election_with_epochs_reason_and_the_record_time() -> None:
    model, log = three_brokers_one_topic()
    at = T0 + 60_000
    model.apply_entries([log.add(part(0, (2, 3), 2, 1, 1, "broker 1 fenced: stream closed"), at)])
    election = [e for e in model.events if e.kind is EventKind.ELECTION]
    assert len(election) == 1
    assert election[0].timestamp_ms == at
    assert (election[0].topic, election[0].partition) == ("orders", 0)
    assert (
        election[0].text == "orders-0 leader 1 -> 2, epoch 0 -> 1 (broker 1 fenced: stream closed)"
    )
    # The same record also shrank the ISR: both facts are on the timeline.
    shrink = [e for e in model.events if e.kind is EventKind.ISR_SHRINK]
    assert [e.text for e in shrink] == [
        "orders-0 ISR [1,2,3] -> [2,3], out [1] (broker 1 fenced: stream closed)"
    ]


def test_unclean_election_is_marked() -> None:
    model, log = three_brokers_one_topic()
    model.apply_entries([log.add(part(0, (1,), NO_LEADER, 1, 1))])
    model.apply_entries([log.add(part(0, (3,), 3, 2, 2, "unclean leader election", recovery=1))])
    assert "UNCLEAN leader none -> 3" in last_of(model, EventKind.ELECTION).text
    row = model.partition_rows()[0]
    assert row.unclean and "unclean" in row.problems
    assert LEADER_RECOVERING == 1


def test_leader_minus_one_is_offline_and_coming_back_is_an_election() -> None:
    model, log = three_brokers_one_topic()
    model.apply_entries([log.add(part(0, (1,), NO_LEADER, 3, 5, "broker 1 fenced"))])
    offline = last_of(model, EventKind.OFFLINE)
    assert offline.text == "orders-0 offline: leader 1 -> none, epoch 0 -> 3 (broker 1 fenced)"
    assert model.partition_rows()[0].offline
    model.apply_entries([log.add(part(0, (1,), 1, 4, 6, "broker 1 unfenced"))])
    assert model.events[-1].kind is EventKind.ELECTION
    assert "leader none -> 1, epoch 3 -> 4" in model.events[-1].text
    assert model.events[-1].text.endswith("(broker 1 unfenced)")
    assert not model.partition_rows()[0].offline


def test_isr_shrink_and_expand() -> None:
    model, log = three_brokers_one_topic()
    model.apply_entries([log.add(part(0, (1, 2), 1, 0, 1, "AlterPartition from leader 1"))])
    model.apply_entries([log.add(part(0, (1, 2, 3), 1, 0, 2, "AlterPartition from leader 1"))])
    assert kinds(model)[-2:] == [EventKind.ISR_SHRINK, EventKind.ISR_EXPAND]
    assert model.events[-1].text == (
        "orders-0 ISR [1,2] -> [1,2,3], in [3] (AlterPartition from leader 1)"
    )
    # An ISR change alone is not an election.
    assert EventKind.ELECTION not in kinds(model)


def test_reassignment_and_topic_deletion() -> None:
    model, log = three_brokers_one_topic()
    model.apply_entries([log.add(part(0, (1, 2, 3), 1, 0, 1, replicas=(1, 3, 2)))])
    assert model.events[-1].kind is EventKind.REASSIGNMENT
    model.apply_entries([log.add(RemoveTopicRecord(TOPIC_ID))])
    assert model.events[-1].kind is EventKind.TOPIC_DELETED
    assert model.events[-1].text == "topic orders deleted"
    assert model.partition_rows() == []


def test_fencing_unfencing_controlled_shutdown_and_restart() -> None:
    model, log = three_brokers_one_topic()
    model.apply_entries([log.add(BrokerRegistrationChangeRecord(2, 1, fenced=True))])
    assert model.events[-1].kind is EventKind.FENCED
    assert model.events[-1].broker_id == 2
    assert model.broker_rows()[1].status == "fenced"
    model.apply_entries([log.add(BrokerRegistrationChangeRecord(2, 1, fenced=False))])
    assert model.events[-1].kind is EventKind.UNFENCED
    model.apply_entries(
        [log.add(BrokerRegistrationChangeRecord(3, 2, in_controlled_shutdown=True))]
    )
    assert model.events[-1].kind is EventKind.CONTROLLED_SHUTDOWN
    assert model.broker_rows()[2].status == "shutting-down"
    # A new incarnation: re-registered, and a late change for the old epoch is ignored.
    restart = log.add(RegisterBrokerRecord(3, "inc-3b", 99, "127.0.0.1", 9094))
    model.apply_entries([restart])
    assert model.events[-1].kind is EventKind.REGISTERED
    assert "broker 3 re-registered" in model.events[-1].text
    count = len(model.events)
    model.apply_entries([log.add(BrokerRegistrationChangeRecord(3, 2, fenced=False))])
    assert len(model.events) == count


def test_unregistration_is_an_event_and_the_broker_shows_as_unregistered() -> None:
    model, log = three_brokers_one_topic()
    model.apply_entries([log.add(BrokerRegistrationChangeRecord(3, 2, fenced=True))])
    model.apply_entries([log.add(UnregisterBrokerRecord(3, 1))])  # an older epoch: ignored
    assert model.events[-1].kind is EventKind.FENCED
    model.apply_entries([log.add(UnregisterBrokerRecord(3, 2))])
    event = model.events[-1]
    assert (event.kind, event.broker_id, event.text) == (
        EventKind.UNREGISTERED,
        3,
        "broker 3 unregistered",
    )
    # Gone for good: no row for it (replica lists still name it as an offline replica).
    assert [r.broker_id for r in model.broker_rows()] == [1, 2]
    assert 3 in model.image.topic("orders").partitions[0].replicas


def test_resent_prefix_after_reconnect_adds_no_duplicate_events() -> None:
    model, log = three_brokers_one_topic()
    shrink = log.add(part(0, (1, 2), 1, 0, 1))
    model.apply_entries([shrink])
    before = list(model.events)
    model.apply_entries(log.entries)  # the stream resent everything
    assert model.events == before
    assert model.image.next_offset == len(log.entries)


def test_snapshot_after_reconnect_turns_the_difference_into_events_at_now() -> None:
    model, log = three_brokers_one_topic()
    # The controller's log moved on without us: build the image it would send.
    later = WatchModel()
    later.apply_entries(log.entries)
    later.apply_entries([log.add(BrokerRegistrationChangeRecord(1, 0, fenced=True))])
    later.apply_entries([log.add(part(0, (2, 3), 2, 1, 1))])
    snapshot = later.image.to_records()
    now = T0 + 99_000
    model.apply_snapshot(snapshot, later.image.next_offset, now)
    new = [e for e in model.events if e.timestamp_ms == now]
    assert {e.kind for e in new} == {EventKind.FENCED, EventKind.ELECTION, EventKind.ISR_SHRINK}
    assert model.image.next_offset == later.image.next_offset
    assert model.partition_rows()[0].leader == 2


def test_first_snapshot_is_state_not_history() -> None:
    model, _ = three_brokers_one_topic()
    fresh = WatchModel()
    fresh.apply_snapshot(model.image.to_records(), model.image.next_offset, T0)
    assert fresh.events == []
    assert len(fresh.partition_rows()) == 2


def test_noop_records_change_nothing() -> None:
    model, log = three_brokers_one_topic()
    count = len(model.events)
    model.apply_entries([log.add(NoOpRecord())], high_offset=len(log.entries))
    assert len(model.events) == count
    assert model.high_offset == len(log.entries)


# -- lag, HW and replica state ------------------------------------------------------------------


def leader_report(leo: int, hw: int, followers: dict[int, int]) -> ReplicaReport:
    return ReplicaReport(
        "orders",
        0,
        True,
        1,
        0,
        0,
        0,
        leo,
        hw,
        (1, 2, 3),
        (1, 2, 3),
        tuple(FollowerReport(r, f_leo, T0) for r, f_leo in followers.items()),
    )


def follower_report(leo: int, hw: int) -> ReplicaReport:
    return ReplicaReport("orders", 0, False, 1, 0, 0, 0, leo, hw)


def test_lag_is_leader_leo_minus_replica_leo_from_the_freshest_source() -> None:
    model, _ = three_brokers_one_topic()
    model.observe_broker_replicas(1, [leader_report(100, 90, {2: 80, 3: -1})], T0)
    model.observe_broker_replicas(2, [follower_report(95, 90)], T0)
    model.observe_broker_failure(3, "UNAVAILABLE", T0)
    row = model.partition_rows()[0]
    cells = {c.broker_id: c for c in row.cells}
    assert row.high_watermark == 90
    assert (cells[1].leo, cells[1].lag, cells[1].is_leader) == (100, 0, True)
    # Broker 2 answered itself: its own LEO (95) beats the leader's older view (80).
    assert (cells[2].leo, cells[2].lag) == (95, 5)
    # Broker 3 is unreachable and the leader has not seen it fetch in this epoch: unknown.
    assert (cells[3].leo, cells[3].lag, cells[3].problem) == (None, None, "unreachable")


def test_lag_falls_back_to_the_leaders_view_and_is_never_negative() -> None:
    model, _ = three_brokers_one_topic()
    model.observe_broker_replicas(1, [leader_report(100, 90, {2: 70, 3: 60})], T0)
    model.observe_broker_failure(2, "DEADLINE_EXCEEDED", T0)
    model.observe_broker_replicas(3, [follower_report(104, 90)], T0)  # polled a moment later
    cells = {c.broker_id: c for c in model.partition_rows()[0].cells}
    assert (cells[2].leo, cells[2].lag) == (70, 30)
    assert (cells[3].leo, cells[3].lag) == (104, 0)


def test_unreachable_leader_means_no_hw_and_no_lag() -> None:
    model, _ = three_brokers_one_topic()
    model.observe_broker_replicas(1, [leader_report(100, 90, {2: 100, 3: 100})], T0)
    model.observe_broker_failure(1, "UNAVAILABLE", T0 + 1000)
    model.observe_broker_replicas(2, [follower_report(100, 90)], T0 + 1000)
    row = model.partition_rows()[0]
    assert row.high_watermark is None
    assert [c.lag for c in row.cells] == [None, None, None]
    assert row.leader_unreachable and "leader-unreachable" in row.problems


def test_under_replicated_and_under_min_isr() -> None:
    model, log = three_brokers_one_topic()
    model.apply_entries([log.add(part(1, (2,), 2, 0, 1, replicas=(2, 3, 1)))])
    row = model.partition_rows()[1]
    assert row.under_replicated and not row.under_min_isr  # min.insync.replicas not on topic
    from minibroker.metadata.records import ConfigRecord

    model.apply_entries([log.add(ConfigRecord(TOPIC_ID, "min.insync.replicas", "2"))])
    row = model.partition_rows()[1]
    assert row.problems == ("under-min-isr", "under-replicated")


def test_process_states_beat_rpc_state_and_transitions_are_events() -> None:
    model, _ = three_brokers_one_topic()
    running = {"controller": ProcessInfo("running", 10), "1": ProcessInfo("running", 11)}
    model.observe_processes(running, T0)
    assert model.events[-1].kind is EventKind.TOPIC_CREATED  # the first look is no event
    model.observe_processes({**running, "1": ProcessInfo("paused", 11)}, T0 + 1)
    model.observe_processes({**running, "1": ProcessInfo("running", 11)}, T0 + 2)
    model.observe_processes({**running, "1": ProcessInfo("stopped", 0)}, T0 + 3)
    model.observe_processes({**running, "1": ProcessInfo("running", 12)}, T0 + 4)
    model.observe_processes({**running, "1": ProcessInfo("running", 13)}, T0 + 4)
    texts = [e.text for e in model.events if e.kind is EventKind.PROCESS]
    assert texts == [
        "broker 1 process paused (SIGSTOP)",
        "broker 1 process resumed (SIGCONT)",
        "broker 1 process exited (pid 11)",
        "broker 1 process started (pid 12)",
        "broker 1 process restarted (pid 12 -> 13)",
    ]
    model.observe_processes({**running, "1": ProcessInfo("paused", 13)}, T0 + 5)
    model.observe_broker_failure(1, "DEADLINE_EXCEEDED", T0 + 5)
    assert model.broker_rows()[0].status == "paused"
    assert model.partition_rows()[0].cells[0].problem == "paused"


def test_reachability_changes_are_events_once() -> None:
    model = WatchModel()
    model.observe_controller(T0, cluster=ClusterInfo("c1", 1000, 5))
    model.observe_controller(T0 + 100, error="UNAVAILABLE")
    model.observe_controller(T0 + 200, error="UNAVAILABLE")
    model.observe_controller(T0 + 2600, cluster=ClusterInfo("c1", 1000, 7))
    assert [e.text for e in model.events] == [
        "controller unreachable: UNAVAILABLE",
        "controller reachable again after 2.5s",
    ]
    assert model.high_offset == 7


def test_partitions_known_only_from_brokers_when_the_controller_was_never_reached() -> None:
    model = WatchModel()
    model.observe_broker_replicas(1, [leader_report(10, 10, {2: 10, 3: 9})], T0)
    model.observe_broker_replicas(2, [follower_report(10, 10)], T0)
    rows = model.partition_rows()
    assert len(rows) == 1
    assert (rows[0].leader, rows[0].replicas, rows[0].from_controller) == (1, (1, 2, 3), False)
    assert "(from brokers)" in line_with(frame_text(model, T0), "orders")


# -- truncations the brokers describe ----------------------------------------------------------

TRUNCATED_AT_MS = 1_795_306_200_250  # 2026-11-22T00:10:00.250Z


def truncated_replica(
    count: int,
    from_offset: int,
    to_offset: int,
    fully: bool = False,
    reason: str = "",
    at_ms: int = TRUNCATED_AT_MS,
    partition: int = 0,
) -> pb.DescribeReplicasResponse:
    """A follower's DescribeReplicas answer carrying its truncation count and last truncation."""
    return pb.DescribeReplicasResponse(
        broker_id=1,
        replicas=[
            pb.ReplicaDescription(
                topic="orders",
                partition=partition,
                leader_id=2,
                leader_epoch=4,
                log_end_offset=to_offset,
                high_watermark=to_offset,
                truncations=count,
                last_truncation=pb.TruncationDescription(
                    timestamp_ms=at_ms,
                    from_offset=from_offset,
                    to_offset=to_offset,
                    fully=fully,
                    reason=reason,
                    leader_epoch=4,
                ),
            )
        ],
    )


def truncations(model: WatchModel) -> list[ClusterEvent]:
    return [e for e in model.events if e.kind is EventKind.TRUNCATION]


def test_truncation_from_the_brokers_replica_description() -> None:
    # No log file is read: a watch of a remote cluster sees truncations too.
    model = WatchModel()
    msg = truncated_replica(1, 120, 100, reason="diverging epoch 3 ends at 100")
    model.observe_broker_replicas(1, replica_reports_from_pb(msg), T0)
    (event,) = truncations(model)
    assert event.kind is EventKind.TRUNCATION
    assert (event.topic, event.partition, event.broker_id) == ("orders", 0, 1)
    assert event.text == (
        "orders-0 on broker 1 truncated 120 -> 100, 20 offsets removed "
        "(diverging epoch 3 ends at 100)"
    )
    assert format_time(event.timestamp_ms) == "00:10:00.250"


def test_truncations_that_do_not_count() -> None:
    # A replica that never truncated, a no-op truncation, the same truncation described again.
    model = WatchModel()
    never = pb.DescribeReplicasResponse(
        broker_id=1, replicas=[pb.ReplicaDescription(topic="t", partition=0, log_end_offset=5)]
    )
    model.observe_broker_replicas(1, replica_reports_from_pb(never), T0)
    model.observe_broker_replicas(1, replica_reports_from_pb(truncated_replica(1, 5, 5)), T0)
    assert truncations(model) == []
    again = truncated_replica(2, 9, 5)
    for now in (T0, T0 + 100):
        model.observe_broker_replicas(1, replica_reports_from_pb(again), now)
    assert len(truncations(model)) == 1
    fully = truncated_replica(
        3, 50, 70, fully=True, reason="fetch offset below log start", partition=2
    )
    model.observe_broker_replicas(2, replica_reports_from_pb(fully), T0)
    event = truncations(model)[-1]
    assert event is not None and "truncated fully at LEO 50, restarts at 70" in event.text


def test_a_truncation_time_out_of_range_is_drawn_not_fatal() -> None:
    # DescribeReplicas is network input: a time no calendar holds must not stop the frame.
    model = WatchModel()
    for at_ms in (-(1 << 63), (1 << 63) - 1):
        msg = truncated_replica(1, 20, 10, at_ms=at_ms)
        model.observe_broker_replicas(1, replica_reports_from_pb(msg), T0)
    assert len(truncations(model)) == 2
    assert line_with(frame_text(model, T0), "truncated 20 -> 10").count("??:??:??") == 1


def test_truncations_between_two_looks_are_counted() -> None:
    # The broker keeps only its last truncation; the counter says how many the watch missed.
    model = WatchModel()
    model.observe_broker_replicas(1, replica_reports_from_pb(truncated_replica(1, 20, 10)), T0)
    later = truncated_replica(4, 30, 25, at_ms=TRUNCATED_AT_MS + 10)
    model.observe_broker_replicas(1, replica_reports_from_pb(later), T0 + 100)
    first, last = truncations(model)
    assert "truncated 20 -> 10" in first.text
    assert last.text == (
        "orders-0 on broker 1 truncated 30 -> 25, 5 offsets removed, 2 more since the last look"
    )
    # A restarted broker counts from zero again: its first truncation is news, nothing missed.
    restarted = truncated_replica(1, 40, 35, at_ms=TRUNCATED_AT_MS + 20)
    model.observe_broker_replicas(1, replica_reports_from_pb(restarted), T0 + 200)
    assert truncations(model)[-1].text.endswith("5 offsets removed")


# -- timeline -----------------------------------------------------------------------------------


def test_timeline_is_time_ordered_even_when_broker_events_arrive_late() -> None:
    model, log = three_brokers_one_topic()
    model.apply_entries([log.add(part(0, (2, 3), 2, 1, 1), T0 + 5000)])
    late = ClusterEvent(T0 + 4000, EventKind.TRUNCATION, "late truncation")
    model.add_event(late)
    stamps = [e.timestamp_ms for e in model.events]
    assert stamps == sorted(stamps)
    assert model.events.index(late) < [e.kind for e in model.events].index(EventKind.ELECTION)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10_000), max_size=80), st.integers(1, 30))
def test_timeline_stays_sorted_and_bounded(stamps: list[int], bound: int) -> None:
    model = WatchModel(max_events=bound)
    for i, ts in enumerate(stamps):
        model.add_event(ClusterEvent(ts, EventKind.PROCESS, str(i)))
    got = [e.timestamp_ms for e in model.events]
    assert got == sorted(got)
    assert len(got) == min(bound, len(stamps))
    # The newest events are the ones kept.
    assert got == sorted(stamps)[len(stamps) - len(got) :]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32))
def test_isr_events_replay_to_the_final_isr(seed: int) -> None:
    """Applying each ISR shrink/expand event's delta to the first ISR gives the last one."""
    rng = random.Random(seed)
    model, log = three_brokers_one_topic()
    isr = {1, 2, 3}
    for epoch in range(1, rng.randint(2, 13)):
        new = set(rng.sample([1, 2, 3], rng.randint(1, 3)))
        leader = min(new)
        model.apply_entries([log.add(part(0, tuple(sorted(new)), leader, epoch, epoch))])
        isr = new
    replayed = {1, 2, 3}
    for e in model.events:
        if e.partition == 0 and e.kind in (EventKind.ISR_SHRINK, EventKind.ISR_EXPAND):
            ids = e.text.split(", out " if e.kind is EventKind.ISR_SHRINK else ", in ")[1]
            members = {int(x) for x in ids.split("]")[0].strip("[").split(",")}
            replayed = replayed - members if e.kind is EventKind.ISR_SHRINK else replayed | members
    assert replayed == isr


# -- the rendered frame -------------------------------------------------------------------------


def degraded_model() -> WatchModel:
    """Broker 1 killed: partition 0 offline (ISR kept its last member), partition 1 under-
    replicated, broker 3 healthy."""
    model, log = three_brokers_one_topic()
    model.apply_entries([log.add(part(0, (1,), 1, 0, 1))])
    model.apply_entries([log.add(BrokerRegistrationChangeRecord(1, 0, fenced=True))])
    model.apply_entries([log.add(part(0, (1,), NO_LEADER, 1, 2, "broker 1 fenced"))])
    model.apply_entries([log.add(part(1, (2, 3), 2, 0, 1, "broker 1 fenced", (2, 3, 1)))])
    model.controller_address = "127.0.0.1:9192"
    model.observe_controller(T0, cluster=ClusterInfo("c-1", 1000, len(log.entries), {2: 40}))
    model.observe_processes(
        {
            "controller": ProcessInfo("running", 5),
            "1": ProcessInfo("stopped"),
            "2": ProcessInfo("running", 7),
            "3": ProcessInfo("running", 8),
        },
        T0,
    )
    model.observe_broker_failure(1, "UNAVAILABLE", T0)
    two = ReplicaReport(
        "orders",
        1,
        True,
        2,
        0,
        1,
        0,
        40,
        37,
        (2, 3),
        (2, 3),
        (FollowerReport(3, 37, T0), FollowerReport(1, 30, T0)),
    )
    model.observe_broker_replicas(2, [two], T0)
    model.observe_broker_replicas(3, [follower_report(37, 37)], T0)
    return model


def test_frame_shows_brokers_partitions_and_timeline_in_words() -> None:
    text = frame_text(degraded_model(), T0 + 3000)
    assert "cluster c-1" in text
    assert "controller 127.0.0.1:9192 ok" in text
    assert "2 partitions: 1 offline, 1 under-replicated" in text
    broker1 = line_with(text, "127.0.0.1:9092")
    assert "stopped" in broker1 and "yes" in broker1 and "UNREACHABLE 3.0s: UNAVAILABLE" in broker1
    assert "rack-1" in broker1
    broker2 = line_with(text, "127.0.0.1:9093")
    assert "alive" in broker2 and "0.0s" in broker2
    p0 = line_with(text, "offline ")
    assert "none" in p0 and "[1]" in p0 and "1:? stopped" in p0
    p1 = line_with(text, "2*:40")
    assert "under-replicated" in p1
    assert "2*:40" in p1 and "3:37 lag 3" in p1 and "1:30 lag 10 !isr stopped" in p1
    assert " 37 " in p1  # the HW, from the leader
    events = text.split("events (UTC)")[1]
    assert "orders-0 offline: leader 1 -> none, epoch 0 -> 1 (broker 1 fenced)" in events
    assert "broker 1 fenced" in events
    assert "broker 1 unreachable: UNAVAILABLE" in events


def test_offline_and_under_replicated_rows_are_highlighted() -> None:
    ansi = frame_ansi(degraded_model(), T0)
    offline_row = line_with(ansi, "offline\x1b")
    assert "\x1b[1;31m" in offline_row  # bold red
    under_row = line_with(ansi, "under-replicated\x1b")
    assert "\x1b[33m" in under_row  # yellow
    healthy, _ = three_brokers_one_topic()
    for line in frame_ansi(healthy, T0).splitlines():
        if "orders" in line:
            assert "\x1b[1;31m" not in line and "\x1b[33m" not in line


def test_topic_filter_keeps_its_partitions_and_broker_wide_events() -> None:
    model = degraded_model()
    model.add_event(ClusterEvent(T0, EventKind.TOPIC_CREATED, "topic other created", "other"))
    text = frame_text(model, T0, topic="orders")
    assert "topic other created" not in text
    assert "broker 1 fenced" in text
    assert frame_text(model, T0, topic="missing").count("orders-") == 0


def test_limited_frame_keeps_problem_rows_and_says_what_it_left_out() -> None:
    model, log = three_brokers_one_topic()
    for p in range(2, 12):
        model.apply_entries([log.add(part(p, (1, 2, 3), 1, 0, 0))])
    model.apply_entries([log.add(part(11, (1,), NO_LEADER, 1, 1))])
    text = frame_text(model, T0, max_partition_rows=4)
    assert "offline" in line_with(text, " 11 ")
    assert "8 healthy partitions not shown" in text


def test_replica_reports_from_pb() -> None:
    msg = pb.DescribeReplicasResponse(
        broker_id=1,
        replicas=[
            pb.ReplicaDescription(
                topic="orders",
                partition=3,
                is_leader=True,
                leader_id=1,
                leader_epoch=2,
                partition_epoch=5,
                log_start_offset=0,
                log_end_offset=12,
                high_watermark=10,
                isr=[1, 2],
                maximal_isr=[1, 2, 3],
                followers=[pb.FollowerDescription(replica_id=2, log_end_offset=10)],
            )
        ],
    )
    (report,) = replica_reports_from_pb(msg)
    assert (report.topic, report.partition, report.leo, report.high_watermark) == (
        "orders",
        3,
        12,
        10,
    )
    assert report.maximal_isr == (1, 2, 3)
    assert report.followers == (FollowerReport(2, 10, 0),)


# -- the command --------------------------------------------------------------------------------


def test_command_is_registered_and_reads_the_local_cluster_only_when_it_is_the_watched_one(
    tmp_path,
    monkeypatch,  # type: ignore[no-untyped-def]
) -> None:
    import argparse

    import pytest

    from minibroker.client.cli import watch as watch_cli
    from minibroker.deploy.cli import build_parser

    args = build_parser().parse_args(["watch", "--once", "--topic", "orders"])
    assert args.once and args.topic == "orders" and callable(args.func)

    local = tmp_path / ".minibroker"
    local.mkdir()
    (local / "cluster.json").write_text(json.dumps({"bootstrap_servers": "127.0.0.1:19092"}))
    monkeypatch.chdir(tmp_path)
    ns = argparse.Namespace(cluster_dir=None)
    assert watch_cli._cluster_dir(ns, "127.0.0.1:19092") == ".minibroker"
    assert watch_cli._cluster_dir(ns, "10.0.0.7:9092") is None  # another cluster: no local view
    with pytest.raises(ValueError, match=r"no readable cluster\.json"):
        watch_cli._cluster_dir(argparse.Namespace(cluster_dir=str(tmp_path / "nope")), "x:1")


# -- the controller quorum ----------------------------------------------------------------------


def quorum_events(model: WatchModel) -> list[str]:
    kinds = (EventKind.CONTROLLER_ELECTION, EventKind.CONTROLLER_RESIGNED)
    return [e.text for e in model.events if e.kind in kinds]


def test_merge_quorum_answers() -> None:
    leader = QuorumAnswer(1001, "leader", 1001, 4, "h:2", 50)
    follower = QuorumAnswer(1000, "follower", 1001, 4, "h:2")
    stale = QuorumAnswer(1002, "leader", 1002, 3, "h:3", 40)  # resumed after a pause
    info = merge_quorum_answers([follower, stale, leader], 3)
    assert info == QuorumInfo(1001, 4, "h:2", 50, "", 3, 3)
    # The leader did not answer, a follower names it.
    assert merge_quorum_answers([follower], 3) == QuorumInfo(1001, 4, "h:2", -1, "", 3, 1)
    # Nobody leads: the voters' reasons, and no majority answering.
    lost = QuorumAnswer(1000, "prospective", -1, 5, why_no_leader="pre-vote refused")
    info = merge_quorum_answers([lost], 3)
    assert info is not None and info.leader_id == -1 and info.epoch == 5
    assert info.why_no_leader == "no majority: 2 of 3 voters not answering; pre-vote refused"
    assert merge_quorum_answers([], 3) is None


def test_controller_election_and_resignation_between_polls() -> None:
    model = WatchModel()
    model.observe_quorum(T0, QuorumInfo(1000, 3, "h:1", 10, "", 3, 3))
    assert quorum_events(model) == []  # the first look only sets the scene
    assert model.quorum_leader() == (1000, 3)
    model.observe_quorum(T0 + 100, QuorumInfo(1000, 3, "h:1", 12, "", 3, 3))
    assert quorum_events(model) == []
    model.observe_quorum(T0 + 200, QuorumInfo(-1, 4, "", -1, "election in progress", 3, 2))
    model.observe_quorum(T0 + 900, QuorumInfo(1002, 4, "h:3", 12, "", 3, 2))
    # A stale answer from an older epoch is no news.
    model.observe_quorum(T0 + 950, QuorumInfo(1000, 3, "h:1", 12, "", 3, 1))
    assert quorum_events(model) == [
        "controller 1000 no longer leads (epoch 3, now 4): no leader (election in progress)",
        "controller 1002 leads the quorum, epoch 3 -> 4, replacing controller 1000",
    ]
    assert model.quorum_leader() == (1002, 4)
    # A direct hand-over (EndQuorumEpoch) seen in one look.
    model.observe_quorum(T0 + 1500, QuorumInfo(1001, 5, "h:2", 13, "", 3, 3))
    assert quorum_events(model)[-1] == (
        "controller 1001 leads the quorum, epoch 4 -> 5, replacing controller 1002"
    )


def test_leader_change_records_and_polls_show_each_election_once() -> None:
    model = WatchModel()
    log = Log()
    model.apply_entries([log.add(LeaderChangeRecord(1000, 1, (1000, 1001, 1002), (1000, 1001)))])
    assert model.image.quorum_leader == (1000, 1)
    model.observe_quorum(T0 + 10, QuorumInfo(1000, 1, "h:1", 1, "", 3, 3))
    # Seen by a poll first, then its record arrives on the metadata stream: once.
    model.observe_quorum(T0 + 500, QuorumInfo(1001, 2, "h:2", 1, "", 3, 3))
    model.apply_entries([log.add(LeaderChangeRecord(1001, 2, (1000, 1001, 1002), (1001, 1002)))])
    # Only in the metadata stream (between two polls): from the record, with its time.
    model.apply_entries([log.add(LeaderChangeRecord(1002, 3, (), (1002, 1000)), at_ms=T0 + 700)])
    model.observe_quorum(T0 + 800, QuorumInfo(1002, 3, "h:3", 3, "", 3, 3))
    assert quorum_events(model) == [
        "controller 1000 leads the quorum, epoch 1, votes from [1000,1001]",
        "controller 1001 leads the quorum, epoch 1 -> 2, replacing controller 1000",
        "controller 1002 leads the quorum, epoch 2 -> 3, replacing controller 1001, "
        "votes from [1002,1000]",
    ]


def test_header_shows_the_quorum() -> None:
    model = WatchModel()
    model.controller_address = "127.0.0.1:9193"
    model.observe_processes(
        {
            "controller-1": ProcessInfo("stopped"),
            "controller-2": ProcessInfo("running", 5),
            "controller-3": ProcessInfo("paused", 6),
        },
        T0,
    )
    model.observe_quorum(T0, QuorumInfo(1001, 7, "127.0.0.1:9193", 42, "", 3, 1))
    text = frame_text(model, T0)
    line = line_with(text, "quorum leader")
    assert "quorum leader 1001 epoch 7 HW 42" in line and "1/3 voters answering" in line
    assert "controller-1 stopped" in line and "controller-3 paused" in line
    model.observe_quorum(T0 + 10, QuorumInfo(-1, 8, "", -1, "no majority: 2 of 3", 3, 1))
    text = frame_text(model, T0 + 10)
    assert "quorum NO LEADER: no majority: 2 of 3" in text
    assert "controller 1001 no longer leads (epoch 7, now 8)" in text


def test_process_events_of_quorum_voters() -> None:
    model = WatchModel()
    model.observe_processes({"controller-2": ProcessInfo("running", 5)}, T0)
    model.observe_processes({"controller-2": ProcessInfo("stopped")}, T0 + 1)
    assert [e.text for e in model.events] == ["controller-2 process exited (pid 5)"]
    assert model.events[0].broker_id is None
    assert model.broker_ids() == []


def test_no_quorum_line_for_a_controller_without_a_quorum() -> None:
    model = WatchModel()
    model.controller_address = "127.0.0.1:9192"
    model.observe_quorum(T0, None)
    assert "quorum" not in frame_text(model, T0)


# -- log cleaner rounds the brokers describe (issue 21) -----------------------------------------


def cleaned_replica(count: int, run: pb.CleanerRunDescription) -> pb.DescribeReplicasResponse:
    return pb.DescribeReplicasResponse(
        broker_id=3,
        replicas=[
            pb.ReplicaDescription(
                topic="changelog",
                partition=1,
                log_end_offset=900,
                compacted=True,
                cleaner_point=run.end_offset,
                dirty_ratio=0.1,
                cleaner_runs=count,
                last_cleaner_run=run,
            )
        ],
    )


def cleaner_events(model: WatchModel) -> list[ClusterEvent]:
    return [e for e in model.events if e.kind is EventKind.CLEANER]


def test_cleaner_rounds_are_timeline_events_once_each() -> None:
    model = WatchModel()
    cleaned = pb.CleanerRunDescription(
        timestamp_ms=TRUNCATED_AT_MS,
        outcome="cleaned",
        first_dirty_offset=0,
        end_offset=800,
        bytes_read=3 * 1024 * 1024,
        bytes_written=512 * 1024,
        records_read=4000,
        records_written=100,
        elapsed_ms=420,
    )
    for now in (T0, T0 + 100):  # the same round described twice is one event
        model.observe_broker_replicas(3, replica_reports_from_pb(cleaned_replica(1, cleaned)), now)
    (event,) = cleaner_events(model)
    assert (event.topic, event.partition, event.broker_id) == ("changelog", 1, 3)
    assert event.text == (
        "changelog-1 on broker 3 cleaned offsets 0..799: 3.0 MiB -> 512.0 KiB, "
        "records 4000 -> 100 in 420 ms"
    )
    assert format_time(event.timestamp_ms) == "00:10:00.250"
    failed = pb.CleanerRunDescription(
        timestamp_ms=TRUNCATED_AT_MS + 5,
        outcome="failed",
        first_dirty_offset=800,
        end_offset=800,
        error="bad batch",
    )
    model.observe_broker_replicas(3, replica_reports_from_pb(cleaned_replica(4, failed)), T0 + 200)
    last = cleaner_events(model)[-1]
    assert last.text == (
        "changelog-1 on broker 3 cleaning from 800 FAILED, log uncleanable (bad batch), "
        "2 more since the last look"
    )
    assert "cleaning from 800 FAILED" in line_with(frame_text(model, T0 + 200), "FAILED")
