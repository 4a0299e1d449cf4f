"""A deterministic, seeded simulation of the controller quorum (issue 13; docs/design.md §6, §8):
N real `QuorumCore`s (1, 3 or 5 voters, drawn per seed), each over an in-memory log
(quorum_log.py) with a state machine (the applied sequence of committed records), driven by a
model of the shell (controller/quorum/shell.py's duties) on a virtual clock and network.

The shell model: effects applied in order (PersistState is durable before the sends that
follow it), AppendLeaderChange appended then `leader_appended`, Fetch answered per its
FetchDecision with records from `fetch_offset`, a follower applying its FetchResponseDecision
(APPEND then `follower_appended(hw)`, TRUNCATE then `truncated`, FETCH_SNAPSHOT then a
FetchSnapshot round trip, `install` and `snapshot_loaded`), one fetch in flight per follower,
snapshots of the committed state taken now and then, a client proposing values to whoever
says it leads (acknowledged once that leader's HW passes the value) and retrying the rest.

Faults (safety phase): the network delays, drops, duplicates and reorders every message
(Vote, BeginQuorumEpoch, EndQuorumEpoch, Fetch and its answers, FetchSnapshot); partitions
(a random split, the leader cut from everyone, one link); process pauses (nothing runs, the
messages wait, timers go stale); disk-intact restarts (a new core from the persisted
QuorumState and the log) and graceful shutdowns (`shutdown()`, then stop, restart later).
Each fault kind is off for some seeds (swarm testing). The liveness phase heals everything and
must converge within a bound: one leader followed by all, identical logs, HW at the log end on
every voter, every proposed value acknowledged.

The checker (`QuorumChecker`) runs after every event: at most one leader per epoch, ever; log
matching; leader completeness; state machine safety; committed records never lost (a majority
holds the committed prefix, no truncation below it); the HW never decreases within a process
run and stays within the log; no voter grants two votes in one epoch (across restarts too) or
grants one it has not persisted; a leader without a majority's fetches within the fetch
timeout stops leading (check quorum).

`MINIBROKER_QUORUM_CORE=/path/to/core.py` runs the simulation against another copy of the core
(mutation testing: tests/sim/test_quorum_sim.py's docstring).
"""

from __future__ import annotations

import importlib.util
import os
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

from quorum_log import MemRaftLog, PrefixTable, Snapshot
from scheduler import Scheduler

from minibroker.controller.quorum.messages import (
    NO_VOTE,
    AppendLeaderChange,
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    EpochReply,
    Event,
    FetchAction,
    FetchAnswer,
    FetchRequest,
    FetchResponse,
    HighWatermark,
    OffsetAndEpoch,
    PersistState,
    QuorumSettings,
    QuorumState,
    Role,
    RoleChanged,
    SendBeginQuorumEpoch,
    SendEndQuorumEpoch,
    SendVote,
    VoteRequest,
    VoteResponse,
)


def _load_core() -> Any:
    path = os.environ.get("MINIBROKER_QUORUM_CORE")
    if not path:
        from minibroker.controller.quorum import core

        return core
    spec = importlib.util.spec_from_file_location("quorum_core_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


core_module = _load_core()
QuorumCore = core_module.QuorumCore


def initial_state(loaded: QuorumState | None, log: MemRaftLog) -> QuorumState:
    fn = getattr(core_module, "initial_state", None)
    if fn is not None:
        return fn(loaded, log)  # type: ignore[no-any-return]
    return loaded or QuorumState()


class SimViolation(AssertionError):
    """A safety or liveness property of the quorum failed."""


# -- options ---------------------------------------------------------------------------------


@dataclass
class QuorumSimOptions:
    voters: int = 3
    election_timeout_ms: int = 200
    fetch_timeout_ms: int = 400
    election_backoff_max_ms: int = 200
    tick_ms: int = 10
    fetch_interval_ms: int = 15
    request_timeout_ms: int = 150
    max_batch: int = 8
    safety_ms: int = 5_000
    liveness_ms: int = 15_000  # the bound on convergence after healing
    drop_rate: float = 0.05
    dup_rate: float = 0.02
    delay_ms_max: int = 25
    # Fault rates: the chance per nemesis step (every 50 virtual ms) that the fault starts.
    pause_rate: float = 0.03
    restart_rate: float = 0.03
    shutdown_rate: float = 0.015
    partition_rate: float = 0.02
    isolate_leader_rate: float = 0.02
    # The chance that a newly elected leader is cut off (or crashed) right after its election,
    # before its LeaderChange is replicated: chains of short epochs leave uncommitted tails of
    # several epochs at the same offsets (Raft's figure 8).
    chase_leader_rate: float = 0.15
    link_cut_rate: float = 0.02
    snapshot_rate: float = 0.05  # per node and nemesis step, when enough is applied
    snapshot_min_records: int = 10
    propose_interval_ms: int = 20

    @classmethod
    def from_seed(cls, seed: int) -> QuorumSimOptions:
        rng = random.Random(f"minibroker-quorum-sim-options-{seed}")
        base = cls()

        def rate(default: float) -> float:
            return 0.0 if rng.random() < 0.2 else default * rng.uniform(0.5, 2.0)

        election = rng.randint(100, 300)
        return replace(
            base,
            voters=rng.choice((1, 3, 3, 3, 5, 5)),
            safety_ms=rng.randint(4_000, 10_000),
            election_timeout_ms=election,
            fetch_timeout_ms=2 * election,
            election_backoff_max_ms=rng.randint(election // 2, election),
            fetch_interval_ms=rng.randint(5, 30),
            max_batch=rng.choice((1, 1, 2, 4, 16)),
            drop_rate=rng.choice((0.0, rng.uniform(0.01, 0.15), rng.uniform(0.01, 0.15))),
            dup_rate=rng.choice((0.0, rng.uniform(0.01, 0.1))),
            delay_ms_max=rng.randint(2, 60),
            pause_rate=rate(base.pause_rate),
            restart_rate=rate(base.restart_rate),
            shutdown_rate=rate(base.shutdown_rate),
            partition_rate=rate(base.partition_rate),
            isolate_leader_rate=rate(base.isolate_leader_rate),
            chase_leader_rate=rng.choice((0.0, rng.uniform(0.05, 0.5), rng.uniform(0.5, 0.9))),
            link_cut_rate=rate(base.link_cut_rate),
            snapshot_rate=rate(base.snapshot_rate),
            snapshot_min_records=rng.randint(3, 30),
            propose_interval_ms=rng.randint(5, 40),
        )

    def describe(self) -> str:
        base = QuorumSimOptions()
        changed = []
        for f in fields(self):
            value = getattr(self, f.name)
            if value != getattr(base, f.name):
                shown = f"{value:.4g}" if isinstance(value, float) else str(value)
                changed.append(f"{f.name}={shown}")
        return ", ".join(changed) or "the defaults"


# -- one voter: its process, its shell, its disk ---------------------------------------------


class SimVoter:
    def __init__(self, sim: QuorumSim, node_id: int) -> None:
        self.sim = sim
        self.id = node_id
        self.log = MemRaftLog(sim.prefixes)  # the disk: survives restarts
        self.persisted: QuorumState | None = None  # the quorum-state file
        self.up = False
        self.paused = False
        self.inbox: list[Callable[[SimVoter], None]] = []
        self.incarnation = 0
        self.running_since = 0
        self.core: Any = None
        self.applied: list[object] = []  # the state machine: committed values, in order
        self.last_hw = 0
        self.outstanding: int | None = None  # the fetch (or FetchSnapshot) in flight
        self.outstanding_sent = 0
        self.fetch_ids = 0
        self.pending: dict[int, int] = {}  # leader: offset -> proposal id awaiting the HW
        self.contact: dict[int, int] = {}  # leader: voter -> last fetch handled (the sim's view)
        self.wiped = False  # lost its disk and does not hold the committed prefix again yet

    @property
    def running(self) -> bool:
        return self.up and not self.paused

    def start(self) -> None:
        sim = self.sim
        self.incarnation += 1
        self.up, self.paused, self.inbox = True, False, []
        self.running_since = sim.now_ms
        self.outstanding = None
        self.pending = {}
        self.contact = {}
        state = initial_state(self.persisted, self.log)
        self.core = QuorumCore(
            sim.settings[self.id],
            state,
            self.log,
            random.Random(sim.rng.getrandbits(64)),
            sim.now_ms,
        )
        snap = self.log.snapshot
        self.applied = list(snap.values) if snap is not None else []
        self.last_hw = self.core.high_watermark
        sim.checker.on_start(self)
        self._tick_loop(self.incarnation)

    def stop(self) -> None:
        self.up = False
        self.paused = False
        self.inbox = []
        self.core = None
        self.pending = {}

    def _tick_loop(self, incarnation: int) -> None:
        if not self.up or self.incarnation != incarnation:
            return
        if not self.paused:
            self.apply(self.core.tick(self.sim.now_ms))
            self.maybe_fetch()
        self.sim.at(self.sim.opt.tick_ms, lambda: self._tick_loop(incarnation))

    # -- effects -----------------------------------------------------------------------------

    def apply(self, effects: list[Any]) -> None:
        sim = self.sim
        for e in effects:
            if isinstance(e, PersistState):
                sim.checker.on_persist(self, e.state)
                self.persisted = e.state
            elif isinstance(e, SendVote):
                self.send_vote(e.to, e.request)
            elif isinstance(e, SendBeginQuorumEpoch):
                sim.stats["begin_epoch_sent"] += 1
                self.send_epoch_request(e.to, e.request)
            elif isinstance(e, SendEndQuorumEpoch):
                sim.stats["end_epoch_sent"] += 1
                self.send_epoch_request(e.to, e.request)
            elif isinstance(e, AppendLeaderChange):
                sim.checker.before_leader_append(self, e.epoch)
                offset = self.log.append(e.epoch, ("LeaderChange", e.epoch, self.id))
                sim.checker.on_append(self, offset)
                self.apply(self.core.leader_appended(sim.now_ms))
            elif isinstance(e, RoleChanged):
                sim.note(
                    f"n{self.id} {e.role.value} epoch={e.epoch} leader={e.leader_id} ({e.reason})"
                )
                sim.stats[f"role_{e.role.value}"] += 1
                if e.role is Role.LEADER:
                    self.contact = {v: sim.now_ms for v in sim.voter_ids if v != self.id}
                    sim.checker.on_leader(self, e.epoch)
                    sim.on_elected(self)
                else:
                    self.pending = {}
            elif isinstance(e, HighWatermark):
                self.on_high_watermark(e.offset)
            elif isinstance(e, Event):
                sim.stats[e.name] += 1

    def on_high_watermark(self, hw: int) -> None:
        sim = self.sim
        sim.checker.on_high_watermark(self, hw)
        self.last_hw = hw
        log = self.log
        for offset in range(len(self.applied), hw):
            value = log.records[offset - log.start_offset][1]
            sim.checker.on_apply(self, offset)
            self.applied.append(value)
        if self.pending:
            for offset in [o for o in self.pending if o < hw]:
                pid = self.pending.pop(offset)
                assert log.records[offset - log.start_offset][1] == ("value", pid)
                sim.client_acked(pid, offset)

    # -- Vote --------------------------------------------------------------------------------

    def send_vote(self, to: int, req: VoteRequest) -> None:
        sim = self.sim
        sim.stats["prevote_sent" if req.pre_vote else "vote_sent"] += 1
        inc = self.incarnation

        def deliver(voter: SimVoter) -> None:
            resp, effects = voter.core.handle_vote(req, sim.now_ms)
            voter.apply(effects)
            sim.checker.on_vote_answer(voter, req, resp)
            sim.send(voter.id, self.id, lambda me: me.on_vote_response(resp, inc))

        sim.send(self.id, to, deliver)

    def on_vote_response(self, resp: VoteResponse, inc: int) -> None:
        if inc != self.incarnation:
            return
        self.apply(self.core.handle_vote_response(resp, self.sim.now_ms))

    # -- BeginQuorumEpoch / EndQuorumEpoch ---------------------------------------------------

    def send_epoch_request(
        self, to: int, req: BeginQuorumEpochRequest | EndQuorumEpochRequest
    ) -> None:
        sim = self.sim
        inc = self.incarnation

        def deliver(voter: SimVoter) -> None:
            if isinstance(req, BeginQuorumEpochRequest):
                reply, effects = voter.core.handle_begin_epoch(req, sim.now_ms)
            else:
                reply, effects = voter.core.handle_end_epoch(req, sim.now_ms)
            voter.apply(effects)
            voter.maybe_fetch()
            sim.send(voter.id, self.id, lambda me: me.on_epoch_reply(voter.id, reply, inc))

        sim.send(self.id, to, deliver)

    def on_epoch_reply(self, voter_id: int, reply: EpochReply, inc: int) -> None:
        """The shell hands a Begin/EndQuorumEpoch answer to the core (a later epoch moves the
        asker there: the simulation's F2)."""
        if inc != self.incarnation:
            return
        self.apply(self.core.handle_epoch_reply(voter_id, reply, self.sim.now_ms))

    # -- Fetch -------------------------------------------------------------------------------

    def maybe_fetch(self) -> None:
        sim = self.sim
        target = self.core.fetch_target
        if target is None or target == self.id:
            return
        if (
            self.outstanding is not None
            and sim.now_ms - self.outstanding_sent < sim.opt.request_timeout_ms
        ):
            return
        if (
            self.outstanding is None
            and sim.now_ms - self.outstanding_sent < sim.opt.fetch_interval_ms
        ):
            return
        if not sim.voters[target].up and sim.linked(self.id, target):
            # A crashed process's port refuses at once (the shell sees UNAVAILABLE); a partition
            # or a pause is silence and waits out the fetch timeout.
            sim.stats["leader_unreachable"] += 1
            self.apply(self.core.leader_unreachable(sim.now_ms))
        self.fetch_ids += 1
        fetch_id = self.outstanding = self.fetch_ids
        self.outstanding_sent = sim.now_ms
        log = self.log
        req = FetchRequest(self.id, self.core.epoch, log.end_offset, log.last_fetched_epoch())
        inc = self.incarnation
        sim.stats["fetch_sent"] += 1
        sim.send(self.id, target, lambda leader: leader.on_fetch(self.id, req, fetch_id, inc))

    def on_fetch(self, src: int, req: FetchRequest, fetch_id: int, inc: int) -> None:
        sim = self.sim
        decision, effects = self.core.handle_fetch(req, sim.now_ms)
        self.apply(effects)
        records: tuple[tuple[int, object], ...] = ()
        if decision.answer is not FetchAnswer.ERROR:
            self.contact[src] = sim.now_ms
        if decision.answer is FetchAnswer.RECORDS:
            log = self.log
            if not log.start_offset <= req.fetch_offset <= log.end_offset:
                sim.checker.fail(
                    f"n{self.id} answers RECORDS to {req} outside its log "
                    f"[{log.start_offset}, {log.end_offset})"
                )
            i = req.fetch_offset - log.start_offset
            records = tuple(log.records[i : i + sim.opt.max_batch])
        sim.stats[f"fetch_{decision.answer.value}"] += 1
        resp = FetchResponse(
            decision.leader_epoch,
            decision.leader_id,
            decision.high_watermark,
            decision.log_start_offset,
            decision.diverging,
            decision.snapshot_id,
            has_records=bool(records),
            error=decision.error,
        )
        sim.send(self.id, src, lambda f: f.on_fetch_response(self.id, resp, records, fetch_id, inc))

    def on_fetch_response(
        self,
        src: int,
        resp: FetchResponse,
        records: tuple[tuple[int, object], ...],
        fetch_id: int,
        inc: int,
    ) -> None:
        sim = self.sim
        if inc != self.incarnation or fetch_id != self.outstanding:
            return  # an old or duplicated answer: the shell has one fetch in flight
        self.outstanding = None
        decision, effects = self.core.handle_fetch_response(resp, sim.now_ms)
        self.apply(effects)
        if decision.action is FetchAction.APPEND:
            for epoch, value in records:
                assert epoch <= resp.leader_epoch
                offset = self.log.append(epoch, value)
                sim.checker.on_append(self, offset)
            self.apply(self.core.follower_appended(resp.high_watermark, sim.now_ms))
            if records:
                self.outstanding_sent = -(10**9)  # fetch again at once
        elif decision.action is FetchAction.TRUNCATE:
            sim.stats["truncations"] += 1
            sim.checker.before_truncate(self, decision.offset)
            self.log.truncate(decision.offset)
            self.apply(self.core.truncated(sim.now_ms))
            self.outstanding_sent = -(10**9)
        elif decision.action is FetchAction.FETCH_SNAPSHOT:
            self.fetch_snapshot(src, decision.snapshot_id)
            return
        self.maybe_fetch()

    def fetch_snapshot(self, leader: int, snapshot_id: OffsetAndEpoch | None) -> None:
        sim = self.sim
        sim.stats["fetch_snapshot_sent"] += 1
        self.fetch_ids += 1
        fetch_id = self.outstanding = self.fetch_ids
        self.outstanding_sent = sim.now_ms
        epoch, inc = self.core.epoch, self.incarnation

        def serve(voter: SimVoter) -> None:
            snap = voter.log.snapshot
            ok = (
                voter.core.is_leader
                and voter.core.epoch == epoch
                and snap is not None
                and snap.id == snapshot_id
            )
            answer = snap if ok else None
            sim.send(
                voter.id, self.id, lambda f: f.on_snapshot(leader, epoch, answer, fetch_id, inc)
            )

        sim.send(self.id, leader, serve)

    def on_snapshot(
        self, leader: int, epoch: int, snap: Snapshot | None, fetch_id: int, inc: int
    ) -> None:
        sim = self.sim
        if inc != self.incarnation or fetch_id != self.outstanding:
            return
        self.outstanding = None
        core = self.core
        if (
            snap is None
            or core.fetch_target != leader
            or core.epoch != epoch
            or snap.offset < core.high_watermark
        ):
            sim.stats["fetch_snapshot_refused"] += 1
            return
        sim.stats["snapshot_installed"] += 1
        sim.checker.before_install(self, snap)
        self.log.install(snap)
        self.applied = list(snap.values)
        self.apply(core.snapshot_loaded(sim.now_ms))
        self.maybe_fetch()

    # -- the leader's duties for the client and the snapshotter ------------------------------

    def propose(self, pid: int) -> None:
        core = self.core
        if not core.is_leader:
            return
        offset = self.log.append(core.epoch, ("value", pid))
        self.sim.checker.on_append(self, offset)
        self.pending[offset] = pid
        self.apply(core.leader_appended(self.sim.now_ms))

    def maybe_snapshot(self) -> None:
        hw = len(self.applied)
        if (
            hw - self.log.start_offset >= self.sim.opt.snapshot_min_records
            and hw <= self.log.end_offset
        ):
            self.sim.stats["snapshots_taken"] += 1
            self.log.take_snapshot(hw, tuple(self.applied))


# -- the checker -----------------------------------------------------------------------------


class QuorumChecker:
    def __init__(self, sim: QuorumSim) -> None:
        self.sim = sim
        self.leaders: dict[int, int] = {}  # epoch -> the one node that led it
        self.votes: dict[tuple[int, int], int] = {}  # (voter, epoch) -> candidate (granted)
        self.persisted_votes: dict[tuple[int, int], int] = {}
        self.entry_prefix: dict[tuple[int, int], int] = {}  # (offset, epoch) -> prefix id
        self.committed: list[int] = []  # prefix id at every committed offset
        self.committed_by_epoch: dict[int, int] = {}  # epoch -> committed end seen in it
        self.majority = len(sim.voter_ids) // 2 + 1

    def fail(self, what: str) -> None:
        raise SimViolation(what)

    def on_start(self, node: SimVoter) -> None:
        core = node.core
        if core.high_watermark > node.log.end_offset:
            self.fail(f"n{node.id} starts with HW {core.high_watermark} > log end")

    def on_persist(self, node: SimVoter, state: QuorumState) -> None:
        old = node.persisted
        if old is not None and state.epoch < old.epoch:
            self.fail(f"n{node.id} persisted epoch {state.epoch} after {old.epoch}")
        if state.voted_for != NO_VOTE:
            key = (node.id, state.epoch)
            prev = self.persisted_votes.setdefault(key, state.voted_for)
            if prev != state.voted_for:
                self.fail(
                    f"n{node.id} persisted two votes in epoch {state.epoch}: "
                    f"{prev} then {state.voted_for}"
                )

    def on_vote_answer(self, node: SimVoter, req: VoteRequest, resp: VoteResponse) -> None:
        if req.pre_vote or not resp.vote_granted:
            return
        key = (node.id, req.candidate_epoch)
        prev = self.votes.setdefault(key, req.candidate_id)
        if prev != req.candidate_id:
            self.fail(
                f"n{node.id} granted two votes in epoch {req.candidate_epoch}: "
                f"to {prev} and to {req.candidate_id}"
            )
        state = node.persisted
        if (
            state is None
            or state.epoch != req.candidate_epoch
            or state.voted_for != req.candidate_id
        ):
            self.fail(
                f"n{node.id} granted its vote to {req.candidate_id} in epoch {req.candidate_epoch} "
                f"without persisting it (persisted: {state})"
            )

    def forget_votes(self, node: SimVoter) -> None:
        """A voter that lost its disk lost its votes too: voting again in an epoch it voted in
        is the disk loss, not the protocol (what must hold is that it never helps elect a
        leader missing committed records: leader completeness)."""
        for table in (self.votes, self.persisted_votes):
            for key in [k for k in table if k[0] == node.id]:
                del table[key]

    def on_leader(self, node: SimVoter, epoch: int) -> None:
        prev = self.leaders.setdefault(epoch, node.id)
        if prev != node.id:
            self.fail(f"two leaders in epoch {epoch}: n{prev} and n{node.id}")

    def required_end(self, epoch: int) -> int:
        return max((end for e, end in self.committed_by_epoch.items() if e <= epoch), default=0)

    def before_leader_append(self, node: SimVoter, epoch: int) -> None:
        self.check_completeness(node, epoch)

    def check_completeness(self, node: SimVoter, epoch: int) -> None:
        end = self.required_end(epoch)
        if end and node.log.prefix_at(end) != self.committed[end - 1]:
            self.fail(
                f"leader completeness: n{node.id} leads epoch {epoch} without the committed "
                f"prefix up to {end} (its log end {node.log.end_offset})"
            )

    def on_append(self, node: SimVoter, offset: int) -> None:
        log = node.log
        epoch = log.epoch_of(offset)
        pid = log.prefix[offset]
        prev = self.entry_prefix.setdefault((offset, epoch), pid)
        if prev != pid:
            self.fail(
                f"log matching: n{node.id} holds a record of epoch {epoch} at offset {offset} "
                f"whose log prefix differs from another log's with the same (offset, epoch)"
            )

    def before_install(self, node: SimVoter, snap: Snapshot) -> None:
        end = min(snap.offset, len(self.committed))
        if end and snap.prefix[end - 1] != self.committed[end - 1]:
            self.fail(
                f"n{node.id} installs a snapshot at {snap.offset} that is not the committed prefix"
            )
        if snap.offset > len(self.committed):
            self.fail(
                f"n{node.id} installs a snapshot at {snap.offset} beyond the committed "
                f"offset {len(self.committed)}"
            )

    def before_truncate(self, node: SimVoter, offset: int) -> None:
        # Records committed in an epoch <= this voter's are in its leader's log (leader
        # completeness), so a truncation it is told to do never cuts them. (A voter of an
        # older epoch may drop records committed later by a newer leader: a minority copy.)
        log = node.log
        if not log.start_offset <= offset <= log.end_offset:
            self.fail(
                f"n{node.id} told to truncate to {offset}, outside its log "
                f"[{log.start_offset}, {log.end_offset}]"
            )
        end = min(self.required_end(node.core.epoch), node.log.end_offset)
        if offset < end and node.log.prefix_at(end) == self.committed[end - 1]:
            self.fail(
                f"n{node.id} (epoch {node.core.epoch}) truncates to {offset}, cutting committed "
                f"records it holds (committed up to {end})"
            )

    def on_high_watermark(self, node: SimVoter, hw: int) -> None:
        if hw <= node.last_hw:
            self.fail(f"n{node.id} HW went from {node.last_hw} to {hw}")
        if hw > node.log.end_offset:
            self.fail(f"n{node.id} HW {hw} beyond its log end {node.log.end_offset}")
        epoch = node.core.epoch
        if hw > self.committed_by_epoch.get(epoch, 0):
            self.committed_by_epoch[epoch] = hw

    def on_apply(self, node: SimVoter, offset: int) -> None:
        pid = node.log.prefix[offset]
        if offset < len(self.committed):
            if self.committed[offset] != pid:
                self.fail(
                    f"state machine safety: n{node.id} applies at offset {offset} a record "
                    f"another voter applied differently"
                )
        else:
            assert offset == len(self.committed)
            self.committed.append(pid)

    def after_event(self) -> None:
        sim = self.sim
        now = sim.now_ms
        committed_end = len(self.committed)
        committed_pid = self.committed[-1] if committed_end else 0
        holding = 0
        for node in sim.voters.values():
            log = node.log
            if log.prefix_at(committed_end) == committed_pid:
                holding += 1
                node.wiped = False
            elif node.wiped:
                holding += 1  # the disk-loss budget: its copy is gone, not lost by the protocol
            core = node.core
            if core is None:
                continue
            hw = core.high_watermark
            if hw != node.last_hw:
                self.fail(f"n{node.id} core HW {hw} but its last HighWatermark was {node.last_hw}")
            if hw > log.end_offset:
                self.fail(f"n{node.id} HW {hw} beyond its log end {log.end_offset}")
            if core.role is Role.LEADER:
                epoch = core.epoch
                if self.leaders.setdefault(epoch, node.id) != node.id:
                    self.fail(
                        f"two leaders in epoch {epoch}: n{self.leaders[epoch]} and n{node.id}"
                    )
                self.check_completeness(node, epoch)
                if (
                    node.running
                    and now - node.running_since > 3 * sim.opt.tick_ms
                    and len(sim.voter_ids) > 1
                ):
                    recent = sorted(node.contact.values(), reverse=True)
                    kth = (
                        recent[self.majority - 2] if len(recent) >= self.majority - 1 else -(10**9)
                    )
                    if now - kth > sim.opt.fetch_timeout_ms + 3 * sim.opt.tick_ms:
                        self.fail(
                            f"check quorum: n{node.id} still leads epoch {epoch} {now - kth} ms "
                            f"after a majority last fetched "
                            f"(fetch timeout {sim.opt.fetch_timeout_ms})"
                        )
        if holding < self.majority:
            self.fail(
                f"committed records lost: only {holding} voters hold the committed prefix up to "
                f"{committed_end}"
            )


# -- the run ---------------------------------------------------------------------------------


class QuorumSim:
    def __init__(self, seed: int, options: QuorumSimOptions | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.opt = opt = options or QuorumSimOptions.from_seed(seed)
        self.scheduler = Scheduler()
        self.prefixes = PrefixTable()
        self.voter_ids = tuple(range(1, opt.voters + 1))
        self.settings = {
            v: QuorumSettings(
                node_id=v,
                voters=self.voter_ids,
                election_timeout_ms=opt.election_timeout_ms,
                fetch_timeout_ms=opt.fetch_timeout_ms,
                election_backoff_max_ms=opt.election_backoff_max_ms,
            )
            for v in self.voter_ids
        }
        self.voters = {v: SimVoter(self, v) for v in self.voter_ids}
        self.checker = QuorumChecker(self)
        self.stats: Counter[str] = Counter()
        self.trace: list[str] = []
        self.faults = True
        self.cuts: Counter[frozenset[int]] = Counter()
        # the client
        self.next_pid = 0
        self.proposed: dict[int, int] = {}  # proposal id -> last sent (ms)
        self.acked: dict[int, int] = {}  # proposal id -> offset
        self.proposing = True
        self.watchers: list[tuple[Callable[[], bool], Callable[[], None]]] = []

    @property
    def now_ms(self) -> int:
        return self.scheduler.now_ms

    def at(self, delay_ms: int, action: Callable[[], None]) -> None:
        self.scheduler.at(delay_ms, action)

    def note(self, text: str) -> None:
        self.trace.append(f"{self.now_ms:>6} {text}")
        if len(self.trace) > 300:
            del self.trace[:100]

    # -- network -----------------------------------------------------------------------------

    def linked(self, a: int, b: int) -> bool:
        return not self.cuts or frozenset((a, b)) not in self.cuts

    def send(self, src: int, dst: int, deliver: Callable[[SimVoter], None]) -> None:
        if not self.linked(src, dst):
            return
        rng = self.rng
        if self.faults and rng.random() < self.opt.drop_rate:
            self.stats["dropped"] += 1
            return
        copies = 2 if self.faults and rng.random() < self.opt.dup_rate else 1
        self.stats["duplicated"] += copies - 1
        for _ in range(copies):
            delay = rng.randint(1, self.opt.delay_ms_max if self.faults else 3)
            self.at(delay, lambda: self._arrive(src, dst, deliver))

    def _arrive(self, src: int, dst: int, deliver: Callable[[SimVoter], None]) -> None:
        node = self.voters[dst]
        if not node.up or not self.linked(src, dst):
            return
        if node.paused:
            node.inbox.append(deliver)
            return
        deliver(node)

    # -- the client --------------------------------------------------------------------------

    def leaders_now(self) -> list[SimVoter]:
        return [n for n in self.voters.values() if n.running and n.core.is_leader]

    def client_step(self) -> None:
        now = self.now_ms
        leaders = self.leaders_now()
        if self.proposing and len(self.proposed) - len(self.acked) < 50:
            self.next_pid += 1
            self.proposed[self.next_pid] = -(10**9)
        retry = 2 * self.opt.election_timeout_ms
        if leaders:
            for pid, sent in self.proposed.items():
                if pid not in self.acked and now - sent >= retry:
                    self.proposed[pid] = now
                    target = self.rng.choice(leaders).id
                    self.stats["proposals_sent"] += 1
                    self.send_proposal(target, pid)
        self.at(self.opt.propose_interval_ms, self.client_step)

    def send_proposal(self, target: int, pid: int) -> None:
        # The client is outside the quorum: its requests are not cut by the partitions.
        delay = self.rng.randint(1, self.opt.delay_ms_max if self.faults else 3)

        def arrive() -> None:
            node = self.voters[target]
            if node.running:
                node.propose(pid)

        self.at(delay, arrive)

    def client_acked(self, pid: int, offset: int) -> None:
        self.acked.setdefault(pid, offset)
        self.stats["acked"] += 1

    # -- the nemesis -------------------------------------------------------------------------

    def nemesis_step(self) -> None:
        if not self.faults:
            return
        opt, rng, now = self.opt, self.rng, self.now_ms
        live = [n for n in self.voters.values() if n.running]
        if live and rng.random() < opt.pause_rate:
            node = rng.choice(live)
            node.paused = True
            dur = rng.randint(opt.tick_ms, 3 * opt.fetch_timeout_ms)
            self.note(f"n{node.id} paused {dur} ms")
            self.stats["pauses"] += 1
            self.at(dur, lambda: self.resume(node))
        if live and rng.random() < opt.restart_rate:
            node = rng.choice(live)
            self.note(f"n{node.id} crashed (disk intact)")
            self.stats["restarts"] += 1
            node.stop()
            self.at(rng.randint(0, 3 * opt.election_timeout_ms), lambda: self.restart(node))
        if live and rng.random() < opt.shutdown_rate:
            node = rng.choice(live)
            if node.running:
                self.note(f"n{node.id} graceful shutdown ({node.core.role.value})")
                self.stats["shutdowns"] += 1
                self.stats["shutdowns_of_leader"] += node.core.is_leader
                node.apply(node.core.shutdown(now))
                node.stop()
                self.at(
                    rng.randint(opt.tick_ms, 3 * opt.election_timeout_ms),
                    lambda: self.restart(node),
                )
        ids = list(self.voter_ids)
        if len(ids) > 1:
            if rng.random() < opt.partition_rate:
                rng.shuffle(ids)
                k = rng.randint(1, len(ids) - 1)
                self.cut(ids[:k], ids[k:], "split")
            if rng.random() < opt.isolate_leader_rate:
                leaders = self.leaders_now()
                if leaders:
                    leader = leaders[0].id
                    self.cut([leader], [v for v in ids if v != leader], "leader isolated")
            if rng.random() < opt.link_cut_rate:
                a, b = rng.sample(ids, 2)
                self.cut([a], [b], "link cut")
        for node in live:
            if node.running and rng.random() < opt.snapshot_rate:
                node.maybe_snapshot()
        self.at(50, self.nemesis_step)

    def on_elected(self, node: SimVoter) -> None:
        if not self.faults or len(self.voter_ids) == 1:
            return
        rng = self.rng
        if rng.random() >= self.opt.chase_leader_rate:
            return
        delay = rng.choice((0, rng.randint(1, 3 * self.opt.fetch_interval_ms)))
        incarnation = node.incarnation

        def chase() -> None:
            if not self.faults or not node.running or node.incarnation != incarnation:
                return
            self.stats["leader_chased"] += 1
            if rng.random() < 0.5:
                others = [v for v in self.voter_ids if v != node.id]
                self.cut([node.id], others, "new leader isolated")
            else:
                self.note(f"n{node.id} crashed just after its election")
                node.stop()
                self.at(
                    rng.randint(0, 3 * self.opt.election_timeout_ms), lambda: self.restart(node)
                )

        self.at(delay, chase)

    def cut(
        self, side_a: list[int], side_b: list[int], why: str, heal_after: bool = True
    ) -> Callable[[], None]:
        """Cut every link between the two sides (both ways); healed after a random time, or
        (`heal_after=False`, scripted scenarios) by calling the returned function."""
        pairs = [frozenset((a, b)) for a in side_a for b in side_b]
        dur = self.rng.randint(100, 4 * self.opt.fetch_timeout_ms)
        self.note(f"partition ({why}) {sorted(side_a)} | {sorted(side_b)} for {dur} ms")
        self.stats[f"partition_{why.replace(' ', '_')}"] += 1
        self.cuts.update(pairs)
        healed = [False]

        def heal() -> None:
            if healed[0]:
                return
            healed[0] = True
            self.note(f"healed {sorted(side_a)} | {sorted(side_b)}")
            self.cuts.subtract(pairs)
            self.cuts = Counter({p: c for p, c in self.cuts.items() if c > 0})

        if heal_after:
            self.at(dur, heal)
        return heal

    def when(self, predicate: Callable[[], bool], action: Callable[[], None]) -> None:
        """Scripted scenarios: run `action` after the first event after which `predicate`
        holds (checked after every event)."""
        self.watchers.append((predicate, action))

    def _after_event(self, _now: int) -> None:
        self.checker.after_event()
        if self.watchers:
            for watcher in list(self.watchers):
                if watcher in self.watchers and watcher[0]():
                    self.watchers.remove(watcher)
                    watcher[1]()

    def resume(self, node: SimVoter) -> None:
        if not node.up or not node.paused:
            return
        node.paused = False
        node.running_since = self.now_ms
        self.note(f"n{node.id} resumed")
        inbox, node.inbox = node.inbox, []
        for deliver in inbox:
            if node.running:
                deliver(node)
                self.checker.after_event()

    def wipe(self, node: SimVoter) -> None:
        """The voter loses its disk: it restarts with an empty log and no quorum-state file."""
        self.note(f"n{node.id} lost its disk")
        self.stats["wipes"] += 1
        node.stop()
        node.log = MemRaftLog(self.prefixes)
        node.persisted = None
        node.wiped = True
        self.checker.forget_votes(node)
        node.start()

    def restart(self, node: SimVoter) -> None:
        if node.up:
            return
        self.note(f"n{node.id} restarted")
        node.start()

    # -- the run -----------------------------------------------------------------------------

    def converged(self) -> str:
        """'' once the quorum has converged; else what is missing."""
        leaders = self.leaders_now()
        if len(leaders) != 1:
            return f"{len(leaders)} leaders"
        leader = leaders[0]
        core = leader.core
        if core.high_watermark <= leader.log.epoch_start(core.epoch):
            return "the leader's LeaderChange is not committed"
        end = leader.log.end_offset
        pid = leader.log.prefix_at(end)
        for node in self.voters.values():
            c = node.core
            if node is leader:
                continue
            if (
                not node.running
                or c.role is not Role.FOLLOWER
                or c.leader_id != leader.id
                or c.epoch != core.epoch
            ):
                return f"n{node.id} does not follow n{leader.id} in epoch {core.epoch}"
            if node.log.prefix_at(end) != pid or node.log.end_offset != end:
                return f"n{node.id}'s log differs from the leader's"
        if any(n.core.high_watermark != end for n in self.voters.values()):
            return "some HW is below the log end"
        missing = len(self.proposed) - len(self.acked)
        if missing:
            return f"{missing} proposed values not acknowledged"
        return ""

    def run(self) -> None:
        opt = self.opt
        for node in self.voters.values():
            node.start()
        self.at(opt.propose_interval_ms, self.client_step)
        self.at(50, self.nemesis_step)
        self.scheduler.run_until(opt.safety_ms, self._after_event)
        # Liveness: heal everything, stop proposing new values; the quorum must converge.
        self.note("-- liveness: every fault healed")
        self.faults = False
        self.proposing = False
        self.cuts = Counter()
        for node in self.voters.values():
            if not node.up:
                node.start()
            elif node.paused:
                self.resume(node)
        deadline = opt.safety_ms + opt.liveness_ms
        last_check = [0]

        def stop(now: int) -> bool:
            if now - last_check[0] < 20:
                return False
            last_check[0] = now
            return not self.converged()

        self.scheduler.run_until(deadline, self._after_event, stop)
        why = self.converged()
        if why:
            raise SimViolation(f"liveness: not converged {opt.liveness_ms} ms after healing: {why}")
        self.stats["converged_after_ms"] = self.now_ms - opt.safety_ms
        leader = self.leaders_now()[0]
        for pid, offset in self.acked.items():
            if leader.applied[offset] != ("value", pid):
                raise SimViolation(
                    f"acknowledged value {pid} at offset {offset} is not applied there"
                )
