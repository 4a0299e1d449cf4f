"""The rows `minibroker watch` draws: one per broker, one per partition with a cell per replica.

Pure: computed from a `WatchModel` on each frame. Lag is the leader's LEO minus the replica's
(never negative); a replica's LEO is its own broker's answer, else the leader's view of it;
a partition the controller's image does not have yet is made from the brokers' reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from minibroker.client.types import NO_LEADER
from minibroker.client.watch.observations import ProcessInfo, Reachability, ReplicaReport
from minibroker.metadata.image import BrokerRegistration
from minibroker.metadata.records import LEADER_RECOVERING, PartitionRecord

if TYPE_CHECKING:
    from minibroker.client.watch.model import WatchModel


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
    replica_count: int = 0
    decommissioning: bool = False  # marked by `brokers decommission` (BrokerDecommissionRecord)


@dataclass(frozen=True, slots=True)
class ReplicaCell:
    broker_id: int
    is_leader: bool
    in_isr: bool
    leo: int | None  # None: nobody who answered knows it
    lag: int | None  # leader LEO - this replica's LEO, never negative; None when unknown
    problem: str  # "" or why this replica is not serving: stopped, paused, fenced, unreachable
    adding: bool = False  # a reassignment is adding this replica (it catches up from zero)
    removing: bool = False  # a reassignment will drop this replica once the new ones are in sync


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
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()

    @property
    def reassigning(self) -> bool:
        return bool(self.adding_replicas or self.removing_replicas)

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


def _reachable_report(
    model: WatchModel, broker_id: int, key: tuple[str, int]
) -> ReplicaReport | None:
    probe = model.brokers.get(broker_id)
    if probe is None or not probe.reach.reachable:
        return None
    return probe.reports.get(key)


def broker_rows(model: WatchModel) -> list[BrokerRow]:
    """One row a broker, every broker any source knows of."""
    leaders: dict[int, int] = {}
    hosted: dict[int, int] = {}
    for _, p in model.image.partitions():
        if p.leader != NO_LEADER:
            leaders[p.leader] = leaders.get(p.leader, 0) + 1
        for r in p.replicas:
            hosted[r] = hosted.get(r, 0) + 1
    # Heartbeat ages are the controller's; while it is unreachable they would only age.
    fresh = model.cluster is not None and model.controller.reachable
    heartbeats = model.cluster.heartbeat_ms_ago if fresh and model.cluster else {}
    rows = []
    for broker_id in model.broker_ids():
        reg = model.image.brokers.get(broker_id)
        address = model.broker_address(broker_id)
        probe = model.brokers.get(broker_id)
        reach = probe.reach if probe is not None else Reachability()
        process = model.process_of(broker_id)
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
                status=_broker_status(
                    reg,
                    process,
                    reach,
                    broker_id in model.image.decommissioning,
                    hosted.get(broker_id, 0),
                ),
                replica_count=hosted.get(broker_id, 0),
                decommissioning=broker_id in model.image.decommissioning,
            )
        )
    return rows


def _partitions(model: WatchModel, topic: str | None) -> list[tuple[str, PartitionRecord, bool]]:
    """(topic name, partition state, from the controller?) for every partition known: the
    controller's image first; partitions only brokers report (the controller was never
    reached) get a state made from their leader's report."""
    out: list[tuple[str, PartitionRecord, bool]] = []
    known: set[tuple[str, int]] = set()
    for t, p in model.image.partitions():
        if topic is None or t.name == topic:
            out.append((t.name, p, True))
            known.add((t.name, p.partition))
    reported: dict[tuple[str, int], list[tuple[int, ReplicaReport]]] = {}
    for broker_id, probe in model.brokers.items():
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


def partition_rows(model: WatchModel, topic: str | None = None) -> list[PartitionRow]:
    """One row a partition (of `topic`, or of every topic), in topic and partition order."""
    rows = []
    for name, p, from_controller in _partitions(model, topic):
        key = (name, p.partition)
        leader_report = None
        if p.leader != NO_LEADER:
            r = _reachable_report(model, p.leader, key)
            if r is not None and r.is_leader:
                leader_report = r
        leader_leo = None if leader_report is None else leader_report.leo
        seen_by_leader = (
            {} if leader_report is None else {f.replica_id: f.leo for f in leader_report.followers}
        )
        cells = []
        for broker_id in p.replicas:
            own = _reachable_report(model, broker_id, key)
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
                    problem=model.replica_problem(broker_id),
                    adding=broker_id in p.adding_replicas,
                    removing=broker_id in p.removing_replicas,
                )
            )
        min_isr = _min_insync_replicas(model, name)
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
                # Kafka: during a reassignment the replication factor is the target's size.
                under_replicated=not offline and len(p.isr) < len(p.target_replicas),
                under_min_isr=not offline and min_isr is not None and len(p.isr) < min_isr,
                leader_unreachable=not offline and model.replica_problem(p.leader) != "",
                unclean=p.leader_recovery_state == LEADER_RECOVERING,
                from_controller=from_controller,
                adding_replicas=p.adding_replicas,
                removing_replicas=p.removing_replicas,
            )
        )
    return rows


def _min_insync_replicas(model: WatchModel, topic: str) -> int | None:
    """The topic's own min.insync.replicas; None when it uses the brokers' default, which
    the metadata log does not carry."""
    image = model.image.topic(topic)
    value = None if image is None else image.configs.get("min.insync.replicas")
    return int_or_none(value) if value is not None else None


def _broker_status(
    reg: BrokerRegistration | None,
    process: ProcessInfo | None,
    reach: Reachability,
    decommissioning: bool = False,
    replica_count: int = 0,
) -> str:
    if decommissioning and replica_count == 0:
        return "decommissioned"  # marked and hosts nothing: stopping it is safe
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
    return "decommissioning" if decommissioning else "alive"


def int_or_none(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


# -- consumer groups ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupRow:
    """One consumer group: state, members, and its total lag over the committed partitions
    (None: no committed partition whose high watermark is known)."""

    group_id: str
    state: str
    members: int
    protocol: str
    total_lag: int | None


def group_lag(
    committed: dict[tuple[str, int], int], high_watermarks: dict[tuple[str, int], int | None]
) -> int | None:
    """Sum over the committed partitions of max(0, HW - committed offset) (Kafka's LAG, which
    the log end of a read_uncommitted consumer is the HW); partitions without a known HW are
    left out, and None when none is left."""
    lags = [
        max(0, hw - offset)
        for tp, offset in committed.items()
        if (hw := high_watermarks.get(tp)) is not None
    ]
    return sum(lags) if lags else None
