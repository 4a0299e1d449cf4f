"""The simulation's checker: the invariants of docs/design.md §8, checked as the run goes.

After every event (`check`): each live replica's local invariants (the core's own
`check_invariants`, I6, I8, I11), its log agrees with its core, leader epochs only grow (I7), and
(every 25 ms) every acknowledged batch is on every live member of the controller's ISR (I1).
On the way: bytes below any replica's HW never differ between replicas or from what consumers
read (I2, I3, I5); at most one broker appends as leader in an epoch (I10); an idempotent
producer is never told its retry is out of order or fenced (§8.5). On the controller's durable
records (§8.8, docs/protocol.md §17): epochs move forward, a new leader comes from the previous
ISR and holds every acknowledged batch, no unclean election happens; a session timeout fences
only a broker that went silent. At the end (`check_final`): the cluster converged (full ISRs,
preferred leaders, identical logs holding every acknowledged batch, each idempotent batch once,
every broker's metadata image equal to the controller's, no reassignment left running).
Moving replicas (KIP-455): each durable record keeps adding/removing disjoint subsets of the
replicas, a reassignment ends on its target (whole target in the ISR) or its original replicas,
and nothing else changes the replicas; a broker drops a replica only once its applied metadata
no longer names it and, once it has acted on that metadata, holds no log for it. I1 covers the
new replicas as soon as they are in the controller's ISR.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from scheduler import CONTROLLER

from minibroker.broker.replication.events import Role
from minibroker.broker.replication.invariants import (
    check_batches_contiguous,
    check_epoch_cache_matches_batches,
    check_epoch_entries,
)
from minibroker.client.batch import BatchHeader, iter_batches
from minibroker.client.common.invariant import invariant
from minibroker.client.errors import ErrorCode
from minibroker.client.types import NO_LEADER
from minibroker.controller.core.messages import Event
from minibroker.metadata.records import LogEntry, PartitionRecord

if TYPE_CHECKING:
    from memlog import MemLog
    from node import SimBroker
    from replsim import Simulation


class Checker:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        # (pid, base offset) -> batch bytes, once any replica's HW passed it (I2, I5).
        self.committed: dict[tuple[int, int], bytes] = {}
        self.writers: dict[tuple[int, int], int] = {}  # (pid, leader epoch) -> broker (I10)
        self.replica_epochs: dict[tuple[int, int], int] = {}  # (broker, pid) -> LE seen
        self.verified: dict[tuple[int, int], int] = {}  # (broker, pid) -> offset checked up to
        # I1, incrementally: acked offsets not yet seen on a broker's log, per (broker, pid).
        # An offset leaves the set once the broker holds the acked bytes and comes back when
        # the broker's log is cut below it (truncation, crash).
        self.unverified: dict[tuple[int, int], set[int]] = {}
        self.acked_offsets: dict[int, list[int]] = {}
        self.last_record: dict[tuple[str, int], PartitionRecord] = {}  # last durable ones
        # Brokers whose replicas an event may have changed (their engine was called); `check`
        # looks at those only, since a replica nothing touched still passes.
        self.touched: set[SimBroker] = set()

    def on_acked(self, pid: int, offset: int) -> None:
        self.acked_offsets.setdefault(pid, []).append(offset)
        for broker_id in self.sim.brokers:
            self.unverified.setdefault((broker_id, pid), set()).add(offset)

    def on_log_shortened(self, broker_id: int, pid: int, leo: int) -> None:
        pending = self.unverified.setdefault((broker_id, pid), set())
        pending.update(o for o in self.acked_offsets.get(pid, ()) if o >= leo)

    def on_truncated(self, broker: SimBroker, pid: int) -> None:
        key = (broker.broker_id, pid)
        leo = broker.logs[pid].leo
        self.verified[key] = min(self.verified.get(key, 0), leo)
        self.on_log_shortened(broker.broker_id, pid, leo)

    def on_controller_entries(self, entries: list[LogEntry]) -> None:
        """Every record the controller made durable (docs/design.md §8.8, docs/protocol.md §17)."""
        sim = self.sim
        for entry in entries:
            record = entry.record
            if not isinstance(record, PartitionRecord):
                continue
            pid = record.partition
            old = self.last_record.get((record.topic_id, pid))
            self.last_record[(record.topic_id, pid)] = record
            where = f"p{pid} record at {entry.offset} ({record.reason}): "
            self._check_reassignment(where, old, record)
            if old is None:
                continue
            invariant(
                record.partition_epoch == old.partition_epoch + 1,
                f"{where}partition epoch {old.partition_epoch} -> {record.partition_epoch}",
            )
            invariant(
                record.leader_epoch >= old.leader_epoch,
                f"{where}leader epoch went back {old.leader_epoch} -> {record.leader_epoch}",
            )
            if record.leader == old.leader:
                continue
            invariant(record.leader_epoch > old.leader_epoch, f"{where}leader moved, same epoch")
            if record.leader == NO_LEADER:
                sim.stats["offline_records"] += 1
                if any(self._live_out_of_sync(b, record) for b in record.replicas):
                    sim.stats["offline_with_live_out_of_sync_replica"] += 1
                continue
            # Unclean election is disabled: the new leader comes from the previous ISR ...
            invariant(
                record.leader in old.isr,
                f"{where}broker {record.leader} elected from outside the ISR {list(old.isr)}",
            )
            # ... and, if it is the process the controller thinks it is, holds every
            # acknowledged batch (I1 at election time).
            leader = sim.brokers[record.leader]
            reg = sim.controller.durable_image.brokers.get(record.leader)
            if leader.alive and reg is not None and reg.broker_epoch == leader.broker_epoch:
                log = leader.logs.get(pid)
                for (apid, offset), data in sim.acked.items():
                    if apid == pid and (log is None or offset >= log.log_start_offset):
                        invariant(
                            log is not None and log.batch_at(offset) == data,
                            f"{where}new leader {record.leader} lacks acked batch at {offset}",
                        )

    def _check_reassignment(
        self, where: str, old: PartitionRecord | None, new: PartitionRecord
    ) -> None:
        """KIP-455 on the durable records: adding and removing are disjoint subsets of the
        replicas (no duplicates); only a reassignment changes the replicas; a running one keeps
        its replicas, adding and removing; it ends completed (replicas == its target, in order)
        or cancelled (replicas == its original ones)."""
        replicas, adding, removing = new.replicas, new.adding_replicas, new.removing_replicas
        invariant(
            len(set(replicas)) == len(replicas)
            and set(adding) <= set(replicas)
            and set(removing) <= set(replicas)
            and not set(adding) & set(removing)
            and len(set(adding)) == len(adding)
            and len(set(removing)) == len(removing),
            f"{where}bad reassignment state: replicas {list(replicas)}, adding {list(adding)}, "
            f"removing {list(removing)}",
        )
        invariant(set(new.isr) <= set(replicas), f"{where}ISR {list(new.isr)} outside the replicas")
        if old is None:
            invariant(not new.is_reassigning, f"{where}created reassigning")
            return
        stats = self.sim.stats
        if old.is_reassigning and new.is_reassigning:
            invariant(
                (old.replicas, old.adding_replicas, old.removing_replicas)
                == (replicas, adding, removing),
                f"{where}a running reassignment changed: {list(old.replicas)} "
                f"+{list(old.adding_replicas)} -{list(old.removing_replicas)} -> "
                f"{list(replicas)} +{list(adding)} -{list(removing)}",
            )
        elif old.is_reassigning:
            if replicas == old.target_replicas:
                stats["reassignments_completed"] += 1
                # Completion waits for the whole target in the ISR.
                invariant(
                    set(new.isr) == set(replicas),
                    f"{where}completed with ISR {list(new.isr)} lacking target members",
                )
            else:
                invariant(
                    replicas == old.original_replicas,
                    f"{where}reassignment of {list(old.replicas)} +{list(old.adding_replicas)} "
                    f"-{list(old.removing_replicas)} ended with replicas {list(replicas)}: "
                    "neither its target nor its original replicas",
                )
                stats["reassignments_cancelled"] += 1
        elif new.is_reassigning:
            invariant(
                set(new.original_replicas) == set(old.replicas)
                and set(adding) == set(new.target_replicas) - set(old.replicas)
                and set(removing) == set(old.replicas) - set(new.target_replicas)
                and new.isr == old.isr
                and new.leader == old.leader,
                f"{where}reassignment start from {list(old.replicas)} wrote {list(replicas)} "
                f"+{list(adding)} -{list(removing)}, ISR {list(old.isr)} -> {list(new.isr)}",
            )
            stats["reassignments_started"] += 1
        elif replicas != old.replicas:
            # A reassignment started and completed in one record: a reorder (nothing to add
            # or remove), or a target already in the ISR.
            invariant(
                set(replicas) == set(old.replicas) or set(replicas) <= set(old.isr),
                f"{where}replicas changed {list(old.replicas)} -> {list(replicas)} without a "
                f"reassignment, or completed at once with target members out of the ISR "
                f"{list(old.isr)}",
            )
            stats["reassignments_completed_at_once"] += 1

    def on_replica_removed(self, broker: SimBroker, pid: int, delete: bool) -> None:
        """A broker drops its replica only once its applied metadata no longer lists it
        (docs/protocol.md §25); a deleted log is forgotten by the incremental checks."""
        sim = self.sim
        assert sim.topic_id is not None
        record = broker.image.partition(sim.topic_id, pid)
        invariant(
            record is None or broker.broker_id not in record.replicas,
            f"b{broker.broker_id} p{pid}: replica removed while its applied metadata lists it "
            f"({list(record.replicas) if record else None})",
        )
        if delete:
            key = (broker.broker_id, pid)
            self.verified[key] = 0
            self.on_log_shortened(broker.broker_id, pid, 0)

    def on_metadata_acted(self, broker: SimBroker) -> None:
        """Once a broker has acted on the metadata it applied, it hosts every partition naming
        it and holds no log of one that does not."""
        sim = self.sim
        if sim.topic_id is None:
            return
        for pid in range(sim.opt.partitions):
            record = broker.image.partition(sim.topic_id, pid)
            if record is None:
                continue
            hosts = broker.hosted(pid) is not None
            if broker.broker_id in record.replicas:
                invariant(hosts, f"b{broker.broker_id} p{pid}: a replica it does not host")
            else:
                invariant(
                    not hosts and pid not in broker.logs,
                    f"b{broker.broker_id} p{pid}: holds a log though not in the replicas "
                    f"{list(record.replicas)} it applied",
                )

    def on_controller_event(self, event: Event) -> None:
        """A session timeout fences only a broker that stopped heartbeating: dead, paused,
        re-registering, an older incarnation, or cut from the controller. A controller restart
        must not mass-fence live brokers (docs/protocol.md §16, KAFKA-18138)."""
        if event.name != "broker_fenced" or not event.fields["reason"].startswith("session"):
            return
        sim = self.sim
        broker = sim.brokers[event.fields["broker_id"]]
        quiet_since_ms = sim.now_ms - sim.opt.session_timeout_ms - 2 * sim.opt.heartbeat_interval_ms
        silent = (
            not broker.alive
            or not broker.registered
            or broker.broker_epoch != event.fields["broker_epoch"]
            or broker.paused_until_ms >= quiet_since_ms
        )
        if silent:
            return
        invariant(
            sim.net.cut_since(broker.broker_id, CONTROLLER, quiet_since_ms),
            f"b{broker.broker_id} fenced by the session timeout while heartbeating: {event}",
        )
        # The cut held its heartbeats (the coverage test wants some of these).
        sim.stats["running_brokers_fenced_across_a_cut"] += 1

    def _live_out_of_sync(self, broker_id: int, record: PartitionRecord) -> bool:
        broker = self.sim.brokers[broker_id]
        reg = self.sim.controller.durable_image.brokers.get(broker_id)
        return (
            broker_id not in record.isr
            and broker.alive
            and not broker.paused()
            and reg is not None
            and not reg.fenced
        )

    def on_produce_acked(self, leader: SimBroker, pid: int, base_offset: int, data: bytes) -> None:
        """A leader acknowledges an acks=all batch: at that moment at least min.insync.replicas
        replicas' logs hold it (what Kafka promises of acks=all; a zombie leader whose followers
        are cut away must not acknowledge on its own copy). Crashed brokers' logs count as they
        are now, so a crash budget that let an acknowledged batch rest on fewer copies fails
        here too."""
        sim = self.sim
        core = leader.engine.get(leader.tp(pid)).core if leader.engine is not None else None
        replicas = len(core.replicas) if core is not None else sim.opt.replication_factor
        needed = min(sim.opt.min_insync_replicas, replicas)
        holders = [
            b.broker_id
            for b in sim.brokers.values()
            if (log := b.logs.get(pid)) is not None and log.batch_at(base_offset) == data
        ]
        invariant(
            len(holders) >= needed,
            f"p{pid}: b{leader.broker_id} acknowledged the batch at {base_offset} held by "
            f"{holders} only (min.insync.replicas {needed})",
        )

    def on_producer_error(self, pid: int, error: ErrorCode) -> None:
        """The idempotent producer must never be told its retry is out of order or fenced:
        that would mean the dedupe state lost a committed batch (docs/design.md §8.5)."""
        invariant(
            error not in (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.INVALID_PRODUCER_EPOCH),
            f"p{pid}: idempotent producer got {error.name}",
        )

    def on_leader_append(self, broker: SimBroker, pid: int, leader_epoch: int) -> None:
        key = (pid, leader_epoch)
        writer = self.writers.setdefault(key, broker.broker_id)
        invariant(
            writer == broker.broker_id,
            f"p{pid}: brokers {writer} and {broker.broker_id} both wrote in epoch {leader_epoch}",
        )

    def on_high_watermark(self, broker: SimBroker, pid: int) -> None:
        """A replica's HW moved: the batches below it are committed (I2, I5), and a leader
        moves it only with at least min.insync.replicas in its ISR (strict min ISR, §8.7). A
        leader cut from every other member of its ISR (a zombie) hears nothing that could move
        its HW past what they held before the cut: it may still move it (a lagging follower
        outside the ISR stops holding it back), but only over batches that every other member
        which has not crashed since the cut holds, byte for byte."""
        hosted = broker.hosted(pid)
        assert hosted is not None
        core = hosted.core
        hw = core.high_watermark
        if core.role is Role.LEADER:
            min_isr = min(self.sim.opt.min_insync_replicas, len(core.replicas))
            if len(core.isr) < min_isr:
                invariant(
                    False,
                    f"b{broker.broker_id} p{pid}: HW moved to {hw} with ISR "
                    f"{sorted(core.isr)} below min.insync.replicas {min_isr}",
                )
            net = self.sim.net
            if net.cuts and len(core.isr) > 1:
                self._check_isolated_leader_hw(broker, pid, hosted.log, core.isr, hw)
        log = hosted.log
        key = (broker.broker_id, pid)
        # The log is what lies from its start on: batches below it (kept until retention, and
        # perhaps stale: a follower that copied its leader's log start never compared them)
        # are no longer part of it.
        start = log.index_of(max(self.verified.get(key, 0), log.log_start_offset))
        for i in range(start, len(log.headers)):
            header = log.headers[i]
            if header.next_offset > hw:
                break
            self.verified[key] = header.next_offset
            seen = self.committed.get((pid, header.base_offset))
            if seen is None:
                self.committed[(pid, header.base_offset)] = log.batches[i]
            else:
                invariant(
                    seen == log.batches[i],
                    f"p{pid}: broker {broker.broker_id} holds different bytes at "
                    f"{header.base_offset} below its HW {hw}",
                )

    def _check_isolated_leader_hw(
        self, broker: SimBroker, pid: int, log: MemLog, isr: frozenset[int], hw: int
    ) -> None:
        net, me = self.sim.net, broker.broker_id
        others = [b for b in isr if b != me]
        if not all(net.is_cut(me, b) for b in others):
            return
        last = log.index_of(hw) - 1  # the leader's last batch below the HW
        if last < 0 or log.headers[last].base_offset < log.log_start_offset:
            return
        base = log.headers[last].base_offset
        self.sim.stats["hw_moves_by_isolated_leaders"] += 1
        for b in others:
            other = self.sim.brokers[b]
            if other.crashed_at_ms >= net.cut_at_ms[frozenset((me, b))]:
                continue  # it may have lost what it held when the cut began
            theirs = other.logs.get(pid)
            invariant(
                theirs is not None
                and (base < theirs.log_start_offset or theirs.batch_at(base) == log.batches[last]),
                f"b{me} p{pid}: HW moved to {hw} while cut from every other member of its ISR "
                f"{sorted(isr)}, past what b{b} holds",
            )

    def check(self, full: bool = True) -> None:
        """After every event: each replica the event may have changed keeps its local
        invariants (I6, I8, I11), its log agrees with its core, and leader epochs only grow
        (I7). Messages are built only on failure: this runs thousands of times per seed."""
        epochs = self.replica_epochs
        touched, self.touched = self.touched, set()
        for broker in sorted(touched, key=lambda b: b.broker_id):
            engine = broker.engine
            if not broker.alive or engine is None:
                continue
            for hosted in engine.hosted().values():
                core, log, pid = hosted.core, hosted.log, hosted.tp.partition
                core.check_invariants()
                key = (broker.broker_id, pid)
                if core.leo != log.leo or core.log_start_offset != log.log_start_offset:
                    invariant(
                        False,
                        f"b{key[0]} p{pid}: core LEO {core.leo}, log start "
                        f"{core.log_start_offset} != log's {log.leo}, {log.log_start_offset}",
                    )
                entries = log.epoch_cache.entries
                for (e1, s1), (e2, s2) in itertools.pairwise(entries):
                    if e2 <= e1 or s2 <= s1:
                        check_epoch_entries(entries, f"b{key[0]} p{pid}: ")  # raises, says why
                seen = epochs.get(key, -1)
                if core.leader_epoch < 0:
                    continue  # a log hosted at process start, before any metadata reached it
                if core.leader_epoch < seen:
                    invariant(
                        False,
                        f"b{key[0]} p{pid}: leader epoch went back {seen} -> {core.leader_epoch}",
                    )
                epochs[key] = core.leader_epoch
        if full:
            self._check_acked_on_isr()

    def _check_acked_on_isr(self) -> None:
        """I1 (continuous form): every acked batch is held by every live, unfenced member of
        the controller's ISR, and by at least one live member. A member counts only while the
        controller's registration is this process's (a restarted broker that has not
        registered yet may have lost its tail; registering takes it out of every ISR)."""
        sim = self.sim
        registrations = sim.controller.image.brokers
        for pid in range(sim.opt.partitions):
            record = sim.partition(pid)
            if record is None:
                continue
            members: list[set[int]] = []
            for broker_id in record.isr:
                broker = sim.brokers[broker_id]
                reg = registrations.get(broker_id)
                if not broker.alive or reg is None or reg.broker_epoch != broker.broker_epoch:
                    continue
                pending = self.unverified.setdefault((broker_id, pid), set())
                log = broker.logs.get(pid)
                for offset in list(pending):
                    if log is not None and (
                        # Retention may delete what is below the HW, acknowledged or not.
                        offset < log.log_start_offset
                        or log.batch_at(offset) == sim.acked[(pid, offset)]
                    ):
                        pending.discard(offset)
                    else:
                        invariant(
                            reg.fenced,
                            f"p{pid}: acked batch at {offset} missing on ISR member {broker_id}",
                        )
                members.append(pending)
            if members:
                lost = set.intersection(*members)
                invariant(not lost, f"p{pid}: acked batches {sorted(lost)} on no live ISR member")

    def converged(self) -> bool:
        sim = self.sim
        ctl = sim.controller
        if not ctl.up or sim.topic_id is None or ctl.has_pending:
            return False
        registrations = ctl.image.brokers
        for broker in sim.brokers.values():
            reg = registrations.get(broker.broker_id)
            if not broker.alive or not broker.registered or reg is None or reg.fenced:
                return False
            if reg.broker_epoch != broker.broker_epoch:
                return False
            if broker.image.next_offset != ctl.durable_offset:
                return False
        if ctl.image.decommissioning:
            return False
        for pid in range(sim.opt.partitions):
            record = sim.partition(pid)
            if record is None or record.leader == NO_LEADER:
                return False
            # Every reassignment completed (KIP-455), replicas back to the replication factor.
            if record.is_reassigning or len(record.replicas) != sim.opt.replication_factor:
                return False
            if set(record.isr) != set(record.replicas):
                return False
            # I16: with every replica back in the ISR the rebalance restores preferred leaders.
            if record.leader != record.preferred_leader:
                return False
            leader = sim.brokers[record.leader].hosted(pid)
            if leader is None or leader.core.role is not Role.LEADER:
                return False
            for broker_id in record.replicas:
                rep = sim.brokers[broker_id].hosted(pid)
                if rep is None or rep.core.leader_epoch != record.leader_epoch:
                    return False
                if rep.core.high_watermark != leader.core.leo or rep.log.leo != leader.core.leo:
                    return False
        return True

    def check_final(self) -> None:
        sim = self.sim
        invariant(self.converged(), "the cluster did not converge after the faults healed")
        # Every broker follows the metadata log to the same image the controller holds.
        for broker in sim.brokers.values():
            invariant(
                broker.image == sim.controller.durable_image,
                f"b{broker.broker_id}'s metadata image differs from the controller's",
            )
        unclean = [e for e in sim.controller.events if e.name == "unclean_leader_elected"]
        invariant(
            not unclean, f"unclean election with unclean.leader.election.enable=false: {unclean}"
        )
        for pid in range(sim.opt.partitions):
            record = sim.partition(pid)
            assert record is not None
            for broker in sim.brokers.values():
                holds = pid in broker.logs
                invariant(
                    holds == (broker.broker_id in record.replicas),
                    f"p{pid}: broker {broker.broker_id} {'holds' if holds else 'lacks'} a log "
                    f"with replicas {list(record.replicas)}",
                )
            leader_log = sim.brokers[record.leader].logs[pid]
            # Each replica runs its own retention: the logs agree from the highest log start.
            start = max(sim.brokers[b].logs[pid].log_start_offset for b in record.replicas)
            for broker_id in record.replicas:
                log = sim.brokers[broker_id].logs[pid]
                invariant(
                    log.batches[log.index_of(start) :]
                    == leader_log.batches[leader_log.index_of(start) :],
                    f"p{pid}: broker {broker_id}'s log differs from the leader's",
                )
                check_batches_contiguous(log.triples(), log.log_start_offset, f"p{pid}: ")
                # The cache starts at the log start; batches below it wait for retention.
                kept = [b for b in log.triples() if b[1] >= log.log_start_offset]
                check_epoch_cache_matches_batches(
                    log.epoch_cache.entries, kept, f"b{broker_id} p{pid}: "
                )
            # docs/design.md §8.5: every idempotent batch is stored once, acked or not (what
            # retention deleted was committed, so it is in `committed`).
            producer_id = sim.workload.producers[pid].producer_id
            stored = {
                h.base_offset: h.base_sequence
                for h in self._committed_headers(pid)
                if h.producer_id == producer_id
            }
            stored.update(
                (h.base_offset, h.base_sequence)
                for h in leader_log.headers
                if h.producer_id == producer_id
            )
            sequences = list(stored.values())
            invariant(
                len(sequences) == len(set(sequences)),
                f"p{pid}: an idempotent batch was stored twice: {sorted(sequences)}",
            )
            invariant(
                set(range(len(sim.workload.producers[pid].acked_values))) <= set(sequences),
                f"p{pid}: an acknowledged idempotent batch is missing",
            )
            for (apid, offset), data in sim.acked.items():
                if apid != pid or offset < leader_log.log_start_offset:
                    continue
                invariant(
                    leader_log.batch_at(offset) == data,
                    f"p{pid}: acked batch at {offset} lost",
                )

    def _committed_headers(self, pid: int) -> list[BatchHeader]:
        return [
            next(iter_batches(data))[1] for (cpid, _), data in self.committed.items() if cpid == pid
        ]
