"""What `minibroker watch` knows about the cluster, and the timeline of what happened to it.

Pure: no I/O, no clock reads. The I/O loop (`minibroker.client.watch.live`) feeds it observations
and `render` draws the rows (`minibroker.client.watch.rows`) and the timeline it holds:

- metadata log entries and snapshots from the controller's `WatchMetadata` stream (`apply_entries`,
  `apply_snapshot`): the `MetadataImage` that holds leaders, epochs, ISRs and broker registrations,
  and the timeline events found by diffing each record against the image before applying it
  (`minibroker.client.watch.events`);
- each broker's `DescribeReplicas` answer or its failure (`observe_broker_replicas`,
  `observe_broker_failure`): LEOs, high watermarks, the leader's view of its followers, and each
  replica's truncation count and last truncation, and its log cleaner round count and last
  round, each of which becomes an event the first time it is seen;
- the controller's `DescribeCluster` answer or its failure (`observe_controller`);
- the controller quorum's DescribeQuorum answers, merged (`observe_quorum`): the leader and epoch
  for the header, and a controller election or resignation on the timeline when they change
  between two looks; a `LeaderChangeRecord` in the metadata log is the same election, with the
  time it was written (each (leader, epoch) is put on the timeline once, whichever comes first);
- the local launcher's process states (`observe_processes`): running, paused (SIGSTOP), stopped;
- the local launcher's network faults (`observe_faults`, from `faults.json`): each command that set
  one is an event at the time it was given ("broker 1 isolated from every other node"), and a
  table that had faults and has none is "network healed" at the look that saw it.

Times are wall-clock milliseconds (`now_ms` comes in from the caller), because timeline entries
from the controller's records and from the brokers' truncations carry wall-clock times too.
Not thread-safe: one owner (the event loop of `live`) mutates it.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping, Sequence

from minibroker.client.watch.events import (
    ClusterEvent,
    EventKind,
    cleaner_event,
    controller_election_event,
    controller_resigned_event,
    image_diff,
    record_events,
    truncation_event,
)
from minibroker.client.watch.observations import (
    NO_QUORUM_LEADER,
    BrokerAddress,
    BrokerProbe,
    ClusterInfo,
    FaultsInfo,
    ProcessInfo,
    QuorumInfo,
    Reachability,
    ReplicaReport,
    is_controller_key,
)
from minibroker.client.watch.rows import (
    BrokerRow,
    GroupRow,
    PartitionRow,
    broker_rows,
    group_lag,
    int_or_none,
    partition_rows,
)
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import LeaderChangeRecord, LogEntry, MetadataRecord

DEFAULT_MAX_EVENTS = 500


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
        self.quorum: QuorumInfo | None = None  # None: no voter answered DescribeQuorum (yet)
        # (leader, epoch) as last seen by DescribeQuorum, and every (leader, epoch) already on
        # the timeline (from a poll or a LeaderChangeRecord): each election shows once.
        self._quorum_seen: tuple[int, int] | None = None
        self._last_led: tuple[int, int] | None = None  # the last (leader, epoch) with a leader
        self._elections_shown: set[tuple[int, int]] = set()
        self.faults: FaultsInfo | None = None  # None: not a local cluster (or no look yet)
        # Consumer groups as last listed: (state, members, protocol) and committed offsets.
        self.groups: dict[str, tuple[str, int, str]] = {}
        self.group_offsets: dict[str, dict[tuple[str, int], int]] = {}
        self._fault_events_shown: set[tuple[int, str]] = set()

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

    def apply_entries(self, entries: Iterable[LogEntry], high_offset: int = -1) -> None:
        """Apply live metadata log entries in offset order; entries already applied (a prefix
        resent after a reconnect) are skipped."""
        for entry in entries:
            if entry.offset < self.image.next_offset:
                continue
            if isinstance(entry.record, LeaderChangeRecord):
                self._leader_change_record(entry.record, entry.timestamp_ms)
            self.add_events(record_events(self.image, entry.record, entry.timestamp_ms))
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
            self.add_events(image_diff(old, new, now_ms))
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

    def _leader_change_record(self, record: LeaderChangeRecord, timestamp_ms: int) -> None:
        key = (record.leader_id, record.leader_epoch)
        if key in self._elections_shown:
            return
        self._elections_shown.add(key)
        previous = self.image.quorum_leader
        self.add_event(
            controller_election_event(
                record.leader_id,
                record.leader_epoch,
                previous,
                timestamp_ms,
                tuple(record.granting_voters),
            )
        )

    def observe_quorum(self, now_ms: int, info: QuorumInfo | None) -> None:
        """The voters' merged DescribeQuorum answers (None: none answered). A change of leader or
        epoch since the last look is an election (or, with no leader now, a resignation); the
        first look only sets the scene."""
        if info is None:
            self.quorum = None
            return
        current = (info.leader_id, info.epoch)
        previous = self._quorum_seen
        if previous is not None and info.epoch < previous[1]:
            return  # a stale voter's answer (resumed after a pause): epochs never go back
        self.quorum = info
        if previous == current:
            return
        self._quorum_seen = current
        before = self._last_led
        if info.leader_id != NO_QUORUM_LEADER:
            self._last_led = current
        if previous is None:
            # Elections before the first look show from their LeaderChangeRecords, if any.
            return
        if info.leader_id == NO_QUORUM_LEADER:
            if previous[0] != NO_QUORUM_LEADER:
                self.add_event(
                    controller_resigned_event(previous, info.epoch, info.why_no_leader, now_ms)
                )
            return
        if current in self._elections_shown:
            return
        self._elections_shown.add(current)
        # The leader before: the last one seen leading (by a poll, else by the metadata log).
        before = before or self.image.quorum_leader
        self.add_event(controller_election_event(info.leader_id, info.epoch, before, now_ms))

    def quorum_leader(self) -> tuple[int, int] | None:
        """(leader id, epoch): DescribeQuorum's answer, else the metadata log's last
        LeaderChangeRecord; None when neither says."""
        if self.quorum is not None:
            if self.quorum.leader_id == NO_QUORUM_LEADER:
                return None
            return (self.quorum.leader_id, self.quorum.epoch)
        return self.image.quorum_leader

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
        for key, report in probe.reports.items():
            run = report.last_cleaner_run
            seen_run = probe.cleaner_runs.get(key)
            if run is None or (seen_run is not None and seen_run[1] == run):
                continue
            before = 0 if seen_run is None or report.cleaner_runs < seen_run[0] else seen_run[0]
            missed = max(0, report.cleaner_runs - before - 1) if seen_run is not None else 0
            probe.cleaner_runs[key] = (report.cleaner_runs, run)
            cleaned = cleaner_event(report, broker_id, missed)
            if cleaned is not None:
                self.add_event(cleaned)

    def observe_broker_failure(self, broker_id: int, error: str, now_ms: int) -> None:
        probe = self._probe(broker_id)
        self._reach_changed(probe.reach, False, f"broker {broker_id}", error, now_ms, broker_id)

    def note_broker_addresses(self, addresses: Mapping[int, BrokerAddress]) -> None:
        """Addresses of brokers the controller's image may not have (yet)."""
        self.addresses.update(addresses)

    def observe_processes(self, processes: Mapping[str, ProcessInfo], now_ms: int) -> None:
        """Local process states keyed by "controller" (or "controller-N" in a quorum) or the
        broker id as a string."""
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
            who = key if is_controller_key(key) else f"broker {key}"
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
                    broker_id=None if is_controller_key(key) else int_or_none(key),
                )
            )

    def observe_faults(self, current: FaultsInfo, now_ms: int) -> None:
        """The launcher's fault table as just read (no file: `FaultsInfo()`, no fault).
        Commands not shown yet become events at their own times; faults gone since the last
        look are "network healed"."""
        before = self.faults
        self.faults = current
        for at_ms, text in current.events:
            if (at_ms, text) in self._fault_events_shown:
                continue
            self._fault_events_shown.add((at_ms, text))
            self.add_event(ClusterEvent(at_ms, EventKind.NETWORK, text))
        if before is not None and before.active and not current.active:
            self.add_event(ClusterEvent(now_ms, EventKind.NETWORK, "network healed"))

    def fault_texts(self) -> list[str]:
        """The faults set now, in words (empty: none)."""
        if self.faults is None or not self.faults.active:
            return []
        return [text for _, text in self.faults.events] or ["network faults set"]

    # -- queries for the renderer -------------------------------------------------------------

    def broker_address(self, broker_id: int) -> BrokerAddress | None:
        reg = self.image.brokers.get(broker_id)
        if reg is not None:
            return BrokerAddress(reg.host, reg.port, reg.rack)
        return self.addresses.get(broker_id)

    def broker_ids(self) -> list[int]:
        ids = set(self.image.brokers) | set(self.addresses) | set(self.brokers)
        if self.processes:
            ids |= {i for k in self.processes if (i := int_or_none(k)) is not None}
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

    def broker_rows(self) -> list[BrokerRow]:
        return broker_rows(self)

    def observe_groups(
        self,
        groups: Mapping[str, tuple[str, int, str]],
        offsets: Mapping[str, dict[tuple[str, int], int]],
    ) -> None:
        """Replace the groups (from ListGroups, DescribeGroups and OffsetFetch)."""
        self.groups = dict(groups)
        self.group_offsets = {g: dict(o) for g, o in offsets.items()}

    def group_rows(self) -> list[GroupRow]:
        """Each group with its total lag against the partitions' HWs the brokers report."""
        hws = {(r.topic, r.partition): r.high_watermark for r in self.partition_rows()}
        return [
            GroupRow(g, state, members, protocol, group_lag(self.group_offsets.get(g, {}), hws))
            for g, (state, members, protocol) in sorted(self.groups.items())
        ]

    def partition_rows(self, topic: str | None = None) -> list[PartitionRow]:
        return partition_rows(self, topic)


__all__ = ["DEFAULT_MAX_EVENTS", "WatchModel"]
