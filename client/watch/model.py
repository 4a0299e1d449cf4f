"""What `minibroker watch` knows about the cluster, and the timeline of what happened to it.

Pure: no I/O, no clock reads. The I/O loop (`minibroker.client.watch.live`) feeds it observations
and `render` turns it into a frame:

- metadata log entries and snapshots from the controller's `WatchMetadata` stream (`apply_entries`,
  `apply_snapshot`): the `MetadataImage` that holds leaders, epochs, ISRs and broker registrations,
  and the timeline events found by diffing each record against the image before applying it
  (a PartitionRecord is the full state of a partition, so a leader change is an election, a leader
  of -1 an offline partition, a smaller ISR a shrink, a larger one an expansion);
- each broker's `DescribeReplicas` answer or its failure (`observe_broker_replicas`,
  `observe_broker_failure`): LEOs, high watermarks and the leader's view of its followers;
- the controller's `DescribeCluster` answer or its failure (`observe_controller`);
- the local launcher's process states (`observe_processes`): running, paused (SIGSTOP), stopped;
- truncations, which only brokers know: each replica in a `DescribeReplicas` answer carries its
  truncation count and last truncation, which becomes an event the first time it is seen
  (`truncation_event`).

Times are wall-clock milliseconds (`now_ms` comes in from the caller), because timeline entries
from the controller's records and from the brokers' truncations carry wall-clock times too.
Not thread-safe: one owner (the event loop of `live`) mutates it.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from minibroker.client.metadata.image import BrokerRegistration, MetadataImage
from minibroker.client.metadata.records import (
    LEADER_RECOVERING,
    BrokerRegistrationChangeRecord,
    LogEntry,
    MetadataRecord,
    PartitionRecord,
    RegisterBrokerRecord,
    RemoveTopicRecord,
    TopicRecord,
    UnregisterBrokerRecord,
)
from minibroker.client.types import NO_LEADER

CONTROLLER = "controller"
DEFAULT_MAX_EVENTS = 500


class EventKind(StrEnum):
    ELECTION = "election"
    OFFLINE = "offline"
    ISR_SHRINK = "isr-shrink"
    ISR_EXPAND = "isr-expand"
    REASSIGNMENT = "reassignment"
    TRUNCATION = "truncation"
    REGISTERED = "registered"
    FENCED = "fenced"
    UNREGISTERED = "unregistered"
    UNFENCED = "unfenced"
    CONTROLLED_SHUTDOWN = "shutdown"
    TOPIC_CREATED = "topic-created"
    TOPIC_DELETED = "topic-deleted"
    UNREACHABLE = "unreachable"
    REACHABLE = "reachable"
    PROCESS = "process"


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    """One line of the timeline. `timestamp_ms` is the wall-clock time of the fact: the metadata
    record's timestamp, the broker's truncation time, or when `watch` observed it."""

    timestamp_ms: int
    kind: EventKind
    text: str
    topic: str | None = None
    partition: int | None = None
    broker_id: int | None = None


@dataclass(frozen=True, slots=True)
class FollowerReport:
    """The leader's view of one follower; `leo` is -1 until it fetched in this leader epoch."""

    replica_id: int
    leo: int
    last_caught_up_time_ms: int


@dataclass(frozen=True, slots=True)
class TruncationReport:
    """A replica's last follower truncation as its broker described it; `to_offset` is the new
    log start offset when `fully` (the whole log was dropped)."""

    timestamp_ms: int
    from_offset: int
    to_offset: int
    fully: bool = False
    reason: str = ""
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class ReplicaReport:
    """One replica as its broker described it (DescribeReplicas). hw <= leo."""

    topic: str
    partition: int
    is_leader: bool
    leader_id: int
    leader_epoch: int
    partition_epoch: int
    log_start_offset: int
    leo: int
    high_watermark: int
    isr: tuple[int, ...] = ()
    maximal_isr: tuple[int, ...] = ()
    followers: tuple[FollowerReport, ...] = ()
    size_bytes: int = 0
    truncations: int = 0  # since the broker process began hosting it
    last_truncation: TruncationReport | None = None


@dataclass(frozen=True, slots=True)
class BrokerAddress:
    """Where a broker listens, as the launcher's cluster.json or a Metadata answer says."""

    host: str
    port: int
    rack: str = ""


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """The controller's DescribeCluster answer, in the parts `watch` shows."""

    cluster_id: str
    controller_id: int
    metadata_offset: int
    heartbeat_ms_ago: Mapping[int, int] = field(default_factory=dict)  # -1: not since it started


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """A local process as the launcher's cluster.json and /proc say: running, paused, stopped."""

    state: str
    pid: int = 0


@dataclass(slots=True)
class Reachability:
    """Whether the last RPC to a process worked; `since_ms` is when that last changed."""

    reachable: bool | None = None  # None: not tried yet
    since_ms: int = 0
    error: str = ""


@dataclass(slots=True)
class BrokerProbe:
    reach: Reachability = field(default_factory=Reachability)
    reports: dict[tuple[str, int], ReplicaReport] = field(default_factory=dict)
    # Per replica, the truncation count and last truncation already on the timeline.
    truncations: dict[tuple[str, int], tuple[int, TruncationReport]] = field(default_factory=dict)


# -- rows the renderer draws --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BrokerRow:
    broker_id: int
    address: str
    rack: str
    registered: bool
    fenced: bool | None  # None: not registered (or the controller was never reached)
    in_controlled_shutdown: bool
    broker_epoch: int
    process: str | None  # running / paused / stopped; None when not a local launcher cluster
    reach: Reachability
    heartbeat_ms_ago: int | None
    leader_count: int
    status: str  # the one word that sums it up: alive, fenced, paused, stopped, unreachable, ...


@dataclass(frozen=True, slots=True)
class ReplicaCell:
    broker_id: int
    is_leader: bool
    in_isr: bool
    leo: int | None  # None: nobody who answered knows it
    lag: int | None  # leader LEO - this replica's LEO, never negative; None when unknown
    problem: str  # "" or why this replica is not serving: stopped, paused, fenced, unreachable


@dataclass(frozen=True, slots=True)
class PartitionRow:
    topic: str
    partition: int
    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    high_watermark: int | None
    cells: tuple[ReplicaCell, ...]
    offline: bool
    under_replicated: bool
    under_min_isr: bool
    leader_unreachable: bool
    unclean: bool  # led after an unclean election, still recovering (KIP-704)
    from_controller: bool  # False: the controller's image has no record of it yet; brokers say so

    @property
    def problems(self) -> tuple[str, ...]:
        out = []
        if self.offline:
            out.append("offline")
        if self.unclean:
            out.append("unclean")
        if self.under_min_isr:
            out.append("under-min-isr")
        if self.under_replicated:
            out.append("under-replicated")
        if self.leader_unreachable:
            out.append("leader-unreachable")
        return tuple(out)


# -- events from metadata records ---------------------------------------------------------------


def _leader(broker_id: int) -> str:
    return "none" if broker_id == NO_LEADER else str(broker_id)


def _ids(ids: Iterable[int]) -> str:
    return "[" + ",".join(str(i) for i in ids) + "]"


def _because(reason: str) -> str:
    return f" ({reason})" if reason else ""


def partition_events(
    topic: str, old: PartitionRecord, new: PartitionRecord, timestamp_ms: int
) -> list[ClusterEvent]:
    """The timeline events of one partition's change from `old` to `new` (both full states)."""
    tp = f"{topic}-{new.partition}"
    why = _because(new.reason)
    out: list[ClusterEvent] = []

    def event(kind: EventKind, text: str) -> None:
        out.append(ClusterEvent(timestamp_ms, kind, text, topic, new.partition))

    if new.leader != old.leader or new.leader_epoch != old.leader_epoch:
        epochs = f"epoch {old.leader_epoch} -> {new.leader_epoch}"
        if new.leader == NO_LEADER:
            event(
                EventKind.OFFLINE,
                f"{tp} offline: leader {_leader(old.leader)} -> none, {epochs}{why}",
            )
        else:
            unclean = " UNCLEAN" if new.leader_recovery_state == LEADER_RECOVERING else ""
            event(
                EventKind.ELECTION,
                f"{tp}{unclean} leader {_leader(old.leader)} -> {new.leader}, {epochs}{why}",
            )
    removed = [r for r in old.isr if r not in new.isr]
    added = [r for r in new.isr if r not in old.isr]
    if removed:
        event(
            EventKind.ISR_SHRINK,
            f"{tp} ISR {_ids(old.isr)} -> {_ids(new.isr)}, out {_ids(removed)}{why}",
        )
    if added:
        event(
            EventKind.ISR_EXPAND,
            f"{tp} ISR {_ids(old.isr)} -> {_ids(new.isr)}, in {_ids(added)}{why}",
        )
    if new.replicas != old.replicas:
        event(
            EventKind.REASSIGNMENT,
            f"{tp} replicas {_ids(old.replicas)} -> {_ids(new.replicas)}{why}",
        )
    return out


def broker_events(
    old: BrokerRegistration | None, new: BrokerRegistration, timestamp_ms: int
) -> list[ClusterEvent]:
    """Timeline events of a broker registration change (a new incarnation or a flag change)."""
    b = new.broker_id
    out: list[ClusterEvent] = []

    def event(kind: EventKind, text: str) -> None:
        out.append(ClusterEvent(timestamp_ms, kind, text, broker_id=b))

    if old is None or old.incarnation_id != new.incarnation_id:
        again = "" if old is None else "re-"
        rack = f", rack {new.rack}" if new.rack else ""
        event(
            EventKind.REGISTERED,
            f"broker {b} {again}registered at {new.host}:{new.port}, "
            f"broker epoch {new.broker_epoch}{rack}",
        )
        return out
    if new.fenced != old.fenced:
        if new.fenced:
            event(EventKind.FENCED, f"broker {b} fenced")
        else:
            event(EventKind.UNFENCED, f"broker {b} unfenced")
    if new.in_controlled_shutdown and not old.in_controlled_shutdown:
        event(EventKind.CONTROLLED_SHUTDOWN, f"broker {b} in controlled shutdown")
    return out


def truncation_event(report: ReplicaReport, broker_id: int, missed: int = 0) -> ClusterEvent | None:
    """The timeline event of `report`'s last truncation, or None when it has none or it removed
    nothing (the LEO was already at or below the target). `missed`: truncations of the replica
    since the last look that the broker no longer describes."""
    t = report.last_truncation
    if t is None:
        return None
    if t.fully:
        what = f"truncated fully at LEO {t.from_offset}, restarts at {t.to_offset}"
    elif t.to_offset >= t.from_offset:
        return None
    else:
        removed = t.from_offset - t.to_offset
        what = f"truncated {t.from_offset} -> {t.to_offset}, {removed} offsets removed"
    more = f", {missed} more since the last look" if missed > 0 else ""
    return ClusterEvent(
        t.timestamp_ms,
        EventKind.TRUNCATION,
        f"{report.topic}-{report.partition} on broker {broker_id} {what}{more}{_because(t.reason)}",
        report.topic,
        report.partition,
        broker_id,
    )


# -- the model ----------------------------------------------------------------------------------


class WatchModel:
    """The cluster as `watch` last saw it, plus a bounded, time-ordered event timeline."""

    def __init__(self, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        self.image = MetadataImage()
        self.max_events = max_events
        self._events: list[tuple[int, int, ClusterEvent]] = []  # (timestamp_ms, seq, event)
        self._seq = itertools.count()
        self.brokers: dict[int, BrokerProbe] = {}
        self.addresses: dict[int, BrokerAddress] = {}
        self.controller = Reachability()
        self.controller_address = ""
        self.discovery_error = ""  # why no bootstrap broker answered, while none has
        self.cluster: ClusterInfo | None = None
        self.high_offset = -1  # the controller's next metadata offset, as last told
        self.processes: dict[str, ProcessInfo] | None = None  # None: not a local cluster

    # -- timeline -----------------------------------------------------------------------------

    @property
    def events(self) -> list[ClusterEvent]:
        """Oldest first. Ties keep the order they were added in."""
        return [e for _, _, e in self._events]

    def add_event(self, event: ClusterEvent) -> None:
        """Insert in time order: a broker's truncation is seen later than the records around it."""
        bisect.insort(self._events, (event.timestamp_ms, next(self._seq), event))
        if len(self._events) > self.max_events:
            del self._events[: len(self._events) - self.max_events]

    def add_events(self, events: Iterable[ClusterEvent]) -> None:
        for event in events:
            self.add_event(event)

    # -- metadata -----------------------------------------------------------------------------

    def _topic_name(self, topic_id: str) -> str | None:
        topic = self.image.topics_by_id.get(topic_id)
        return None if topic is None else topic.name

    def _record_events(self, record: MetadataRecord, timestamp_ms: int) -> list[ClusterEvent]:
        """Events of `record` against the image before it is applied."""
        image = self.image
        if isinstance(record, PartitionRecord):
            topic = image.topics_by_id.get(record.topic_id)
            old = None if topic is None else topic.partitions.get(record.partition)
            if topic is None or old is None:
                return []  # creation: the topic's own event covers its partitions
            return partition_events(topic.name, old, record, timestamp_ms)
        if isinstance(record, RegisterBrokerRecord | BrokerRegistrationChangeRecord):
            old_reg = image.brokers.get(record.broker_id)
            probe = MetadataImage()
            if old_reg is not None:
                probe.brokers[record.broker_id] = old_reg
            probe.apply_record(record)
            new_reg = probe.brokers.get(record.broker_id)
            if new_reg is None or new_reg == old_reg:
                return []  # a change for an older incarnation: the image ignores it too
            return broker_events(old_reg, new_reg, timestamp_ms)
        if isinstance(record, UnregisterBrokerRecord):
            reg = image.brokers.get(record.broker_id)
            if reg is None or reg.broker_epoch != record.broker_epoch:
                return []
            return [
                ClusterEvent(
                    timestamp_ms,
                    EventKind.UNREGISTERED,
                    f"broker {record.broker_id} unregistered",
                    broker_id=record.broker_id,
                )
            ]
        if isinstance(record, TopicRecord):
            return [
                ClusterEvent(
                    timestamp_ms,
                    EventKind.TOPIC_CREATED,
                    f"topic {record.name} created",
                    topic=record.name,
                )
            ]
        if isinstance(record, RemoveTopicRecord):
            name = self._topic_name(record.topic_id)
            if name is None:
                return []
            return [
                ClusterEvent(
                    timestamp_ms, EventKind.TOPIC_DELETED, f"topic {name} deleted", topic=name
                )
            ]
        return []

    def apply_entries(self, entries: Iterable[LogEntry], high_offset: int = -1) -> None:
        """Apply live metadata log entries in offset order; entries already applied (a prefix
        resent after a reconnect) are skipped."""
        for entry in entries:
            if entry.offset < self.image.next_offset:
                continue
            self.add_events(self._record_events(entry.record, entry.timestamp_ms))
            self.image.apply(entry)
        self.high_offset = max(self.high_offset, high_offset)

    def apply_snapshot(
        self, records: Sequence[MetadataRecord], snapshot_offset: int, now_ms: int
    ) -> None:
        """Replace the image with a snapshot. When it replaces a non-empty image (the watch
        reconnected to a controller whose log no longer has our offset), what changed in between
        becomes timeline events stamped with `now_ms`: the records' own times are gone."""
        old = self.image
        new = MetadataImage()
        new.replace_with_snapshot(records, snapshot_offset)
        if old.next_offset > 0:
            self.add_events(_image_diff(old, new, now_ms))
        self.image = new
        self.high_offset = max(self.high_offset, snapshot_offset)

    # -- observations -------------------------------------------------------------------------

    def _reach_changed(
        self,
        reach: Reachability,
        ok: bool,
        who: str,
        error: str,
        now_ms: int,
        broker_id: int | None,
    ) -> None:
        if reach.reachable is ok:
            if not ok:
                reach.error = error
            return
        if ok and reach.reachable is False:
            down_s = (now_ms - reach.since_ms) / 1000
            self.add_event(
                ClusterEvent(
                    now_ms,
                    EventKind.REACHABLE,
                    f"{who} reachable again after {down_s:.1f}s",
                    broker_id=broker_id,
                )
            )
        elif not ok:
            self.add_event(
                ClusterEvent(
                    now_ms,
                    EventKind.UNREACHABLE,
                    f"{who} unreachable: {error}",
                    broker_id=broker_id,
                )
            )
        reach.reachable = ok
        reach.since_ms = now_ms
        reach.error = "" if ok else error

    def observe_controller(
        self, now_ms: int, cluster: ClusterInfo | None = None, error: str = ""
    ) -> None:
        """A DescribeCluster answer (`cluster`) or a failed call (`error`)."""
        ok = cluster is not None
        self._reach_changed(self.controller, ok, "controller", error, now_ms, None)
        if cluster is not None:
            self.cluster = cluster
            self.high_offset = max(self.high_offset, cluster.metadata_offset)

    def _probe(self, broker_id: int) -> BrokerProbe:
        probe = self.brokers.get(broker_id)
        if probe is None:
            probe = self.brokers[broker_id] = BrokerProbe()
        return probe

    def observe_broker_replicas(
        self, broker_id: int, reports: Iterable[ReplicaReport], now_ms: int
    ) -> None:
        probe = self._probe(broker_id)
        self._reach_changed(probe.reach, True, f"broker {broker_id}", "", now_ms, broker_id)
        probe.reports = {(r.topic, r.partition): r for r in reports}
        for key, report in probe.reports.items():
            last = report.last_truncation
            seen = probe.truncations.get(key)
            if last is None or (seen is not None and seen[1] == last):
                continue
            # A count below the one seen is a restarted broker counting from zero again.
            before = 0 if seen is None or report.truncations < seen[0] else seen[0]
            missed = max(0, report.truncations - before - 1) if seen is not None else 0
            probe.truncations[key] = (report.truncations, last)
            event = truncation_event(report, broker_id, missed)
            if event is not None:
                self.add_event(event)

    def observe_broker_failure(self, broker_id: int, error: str, now_ms: int) -> None:
        probe = self._probe(broker_id)
        self._reach_changed(probe.reach, False, f"broker {broker_id}", error, now_ms, broker_id)

    def note_broker_addresses(self, addresses: Mapping[int, BrokerAddress]) -> None:
        """Addresses of brokers the controller's image may not have (yet)."""
        self.addresses.update(addresses)

    def observe_processes(self, processes: Mapping[str, ProcessInfo], now_ms: int) -> None:
        """Local process states keyed by "controller" or the broker id as a string."""
        previous = self.processes
        self.processes = dict(processes)
        if previous is None:
            return
        for key, info in processes.items():
            before = previous.get(key)
            if before is None:
                continue
            # A restart between two looks shows only as a new PID.
            restarted = info.state != "stopped" and before.state != "stopped"
            restarted = restarted and before.pid != info.pid
            if before.state == info.state and not restarted:
                continue
            who = CONTROLLER if key == CONTROLLER else f"broker {key}"
            if restarted:
                verb = f"process restarted (pid {before.pid} -> {info.pid})"
            elif info.state == "stopped":
                verb = f"process exited (pid {before.pid})"
            elif before.state == "stopped":
                verb = f"process started (pid {info.pid})"
            elif info.state == "paused":
                verb = "process paused (SIGSTOP)"
            else:
                verb = "process resumed (SIGCONT)"
            self.add_event(
                ClusterEvent(
                    now_ms,
                    EventKind.PROCESS,
                    f"{who} {verb}",
                    broker_id=None if key == CONTROLLER else _int_or_none(key),
                )
            )

    # -- queries for the renderer -------------------------------------------------------------

    def broker_address(self, broker_id: int) -> BrokerAddress | None:
        reg = self.image.brokers.get(broker_id)
        if reg is not None:
            return BrokerAddress(reg.host, reg.port, reg.rack)
        return self.addresses.get(broker_id)

    def broker_ids(self) -> list[int]:
        ids = set(self.image.brokers) | set(self.addresses) | set(self.brokers)
        if self.processes:
            ids |= {i for k in self.processes if (i := _int_or_none(k)) is not None}
        return sorted(ids)

    def process_of(self, broker_id: int | str) -> ProcessInfo | None:
        if self.processes is None:
            return None
        return self.processes.get(str(broker_id))

    def replica_problem(self, broker_id: int) -> str:
        """Why a broker's replicas are not serving, or "" when nothing says so."""
        process = self.process_of(broker_id)
        if process is not None and process.state in ("stopped", "paused"):
            return process.state
        reg = self.image.brokers.get(broker_id)
        if reg is not None and reg.fenced:
            return "fenced"
        probe = self.brokers.get(broker_id)
        if probe is not None and probe.reach.reachable is False:
            return "unreachable"
        return ""

    def _reachable_report(self, broker_id: int, key: tuple[str, int]) -> ReplicaReport | None:
        probe = self.brokers.get(broker_id)
        if probe is None or not probe.reach.reachable:
            return None
        return probe.reports.get(key)

    def broker_rows(self) -> list[BrokerRow]:
        leaders: dict[int, int] = {}
        for _, p in self.image.partitions():
            if p.leader != NO_LEADER:
                leaders[p.leader] = leaders.get(p.leader, 0) + 1
        # Heartbeat ages are the controller's; while it is unreachable they would only age.
        fresh = self.cluster is not None and self.controller.reachable
        heartbeats = self.cluster.heartbeat_ms_ago if fresh and self.cluster else {}
        rows = []
        for broker_id in self.broker_ids():
            reg = self.image.brokers.get(broker_id)
            address = self.broker_address(broker_id)
            probe = self.brokers.get(broker_id)
            reach = probe.reach if probe is not None else Reachability()
            process = self.process_of(broker_id)
            rows.append(
                BrokerRow(
                    broker_id=broker_id,
                    address="?" if address is None else f"{address.host}:{address.port}",
                    rack="" if address is None else address.rack,
                    registered=reg is not None,
                    fenced=None if reg is None else reg.fenced,
                    in_controlled_shutdown=reg is not None and reg.in_controlled_shutdown,
                    broker_epoch=-1 if reg is None else reg.broker_epoch,
                    process=None if process is None else process.state,
                    reach=reach,
                    heartbeat_ms_ago=heartbeats.get(broker_id),
                    leader_count=leaders.get(broker_id, 0),
                    status=_broker_status(reg, process, reach),
                )
            )
        return rows

    def _partitions(self, topic: str | None) -> list[tuple[str, PartitionRecord, bool]]:
        """(topic name, partition state, from the controller?) for every partition known: the
        controller's image first; partitions only brokers report (the controller was never
        reached) get a state made from their leader's report."""
        out: list[tuple[str, PartitionRecord, bool]] = []
        known: set[tuple[str, int]] = set()
        for t, p in self.image.partitions():
            if topic is None or t.name == topic:
                out.append((t.name, p, True))
                known.add((t.name, p.partition))
        reported: dict[tuple[str, int], list[tuple[int, ReplicaReport]]] = {}
        for broker_id, probe in self.brokers.items():
            for key, report in probe.reports.items():
                if key not in known and (topic is None or key[0] == topic):
                    reported.setdefault(key, []).append((broker_id, report))
        for key, reports in reported.items():
            best = max(reports, key=lambda br: (br[1].leader_epoch, br[1].is_leader))[1]
            members = {b for b, _ in reports} | set(best.isr)
            members |= {f.replica_id for f in best.followers}
            record = PartitionRecord(
                topic_id="",
                partition=key[1],
                replicas=tuple(sorted(members)),
                isr=tuple(best.isr),
                leader=best.leader_id,
                leader_epoch=best.leader_epoch,
                partition_epoch=best.partition_epoch,
            )
            out.append((key[0], record, False))
        out.sort(key=lambda tpf: (tpf[0], tpf[1].partition))
        return out

    def partition_rows(self, topic: str | None = None) -> list[PartitionRow]:
        rows = []
        for name, p, from_controller in self._partitions(topic):
            key = (name, p.partition)
            leader_report = None
            if p.leader != NO_LEADER:
                r = self._reachable_report(p.leader, key)
                if r is not None and r.is_leader:
                    leader_report = r
            leader_leo = None if leader_report is None else leader_report.leo
            seen_by_leader = (
                {}
                if leader_report is None
                else {f.replica_id: f.leo for f in leader_report.followers}
            )
            cells = []
            for broker_id in p.replicas:
                own = self._reachable_report(broker_id, key)
                leo: int | None = None
                if own is not None:
                    leo = own.leo
                elif seen_by_leader.get(broker_id, -1) >= 0:
                    # The broker did not answer, but the leader knows how far it fetched.
                    leo = seen_by_leader[broker_id]
                lag = None
                if leo is not None and leader_leo is not None:
                    # Polls of different brokers are not simultaneous: a follower may look
                    # ahead of the leader for an instant. Lag is never negative.
                    lag = max(0, leader_leo - leo)
                cells.append(
                    ReplicaCell(
                        broker_id=broker_id,
                        is_leader=broker_id == p.leader,
                        in_isr=broker_id in p.isr,
                        leo=leo,
                        lag=lag,
                        problem=self.replica_problem(broker_id),
                    )
                )
            min_isr = self._min_insync_replicas(name)
            offline = p.leader == NO_LEADER
            rows.append(
                PartitionRow(
                    topic=name,
                    partition=p.partition,
                    leader=p.leader,
                    leader_epoch=p.leader_epoch,
                    partition_epoch=p.partition_epoch,
                    replicas=p.replicas,
                    isr=p.isr,
                    high_watermark=None if leader_report is None else leader_report.high_watermark,
                    cells=tuple(cells),
                    offline=offline,
                    under_replicated=not offline and len(p.isr) < len(p.replicas),
                    under_min_isr=not offline and min_isr is not None and len(p.isr) < min_isr,
                    leader_unreachable=not offline and self.replica_problem(p.leader) != "",
                    unclean=p.leader_recovery_state == LEADER_RECOVERING,
                    from_controller=from_controller,
                )
            )
        return rows

    def _min_insync_replicas(self, topic: str) -> int | None:
        """The topic's own min.insync.replicas; None when it uses the brokers' default, which
        the metadata log does not carry."""
        image = self.image.topic(topic)
        value = None if image is None else image.configs.get("min.insync.replicas")
        return _int_or_none(value) if value is not None else None


def _broker_status(
    reg: BrokerRegistration | None, process: ProcessInfo | None, reach: Reachability
) -> str:
    if process is not None and process.state in ("stopped", "paused"):
        return process.state
    if reach.reachable is False:
        return "unreachable"
    if reg is None:
        return "unregistered"
    if reg.in_controlled_shutdown:
        return "shutting-down"
    if reg.fenced:
        return "fenced"
    return "alive"


def _int_or_none(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _image_diff(old: MetadataImage, new: MetadataImage, now_ms: int) -> list[ClusterEvent]:
    """What changed between two images (a snapshot that skipped records we never saw)."""
    out: list[ClusterEvent] = []
    for broker_id in sorted(set(old.brokers) | set(new.brokers)):
        new_reg = new.brokers.get(broker_id)
        if new_reg is not None and new_reg != old.brokers.get(broker_id):
            out += broker_events(old.brokers.get(broker_id), new_reg, now_ms)
    for topic_id, topic in new.topics_by_id.items():
        old_topic = old.topics_by_id.get(topic_id)
        if old_topic is None:
            out.append(
                ClusterEvent(
                    now_ms,
                    EventKind.TOPIC_CREATED,
                    f"topic {topic.name} created",
                    topic=topic.name,
                )
            )
            continue
        for index in sorted(topic.partitions):
            before = old_topic.partitions.get(index)
            if before is not None:
                out += partition_events(topic.name, before, topic.partitions[index], now_ms)
    for topic_id, topic in old.topics_by_id.items():
        if topic_id not in new.topics_by_id:
            out.append(
                ClusterEvent(
                    now_ms,
                    EventKind.TOPIC_DELETED,
                    f"topic {topic.name} deleted",
                    topic=topic.name,
                )
            )
    return out


__all__ = [
    "CONTROLLER",
    "BrokerAddress",
    "BrokerProbe",
    "BrokerRow",
    "ClusterEvent",
    "ClusterInfo",
    "EventKind",
    "FollowerReport",
    "PartitionRow",
    "ProcessInfo",
    "Reachability",
    "ReplicaCell",
    "ReplicaReport",
    "TruncationReport",
    "WatchModel",
    "broker_events",
    "partition_events",
    "truncation_event",
]
