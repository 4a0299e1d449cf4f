"""QuorumCore: one voter's KIP-595 Raft rules, sans-I/O (docs/design.md §6.1).

Pure: no sockets, asyncio, clock, disk or randomness of its own. Time comes in as `now_ms`,
randomness as a `random.Random`, the log as a read-only `RaftLogView`; decisions go out as a list
of effects (`messages.py`) that the shell applies in order. The shell (or the simulation) calls
one method at a time.

API (every method returns the effects to apply, in order; request handlers also return the
answer to send back, which the shell sends only after applying the effects):

    QuorumCore(settings, state, log, rng, now_ms)           state: the loaded quorum-state
    tick(now_ms) -> list[Effect]                            timers: election, fetch, check-quorum
    handle_vote(req, now_ms) -> (VoteResponse, effects)
    handle_vote_response(resp, now_ms) -> effects
    handle_begin_epoch(req, now_ms) -> (EpochReply, effects)
    handle_end_epoch(req, now_ms) -> (EpochReply, effects)
    handle_fetch(req, now_ms) -> (FetchDecision, effects)   leader side
    handle_fetch_response(resp, now_ms) -> (FetchResponseDecision, effects)   follower side
    follower_appended(leader_high_watermark, now_ms) -> effects
    leader_appended(now_ms) -> effects                      the leader's log end moved (durable)
    snapshot_loaded(now_ms) -> effects                      follower installed the leader's snapshot
    truncated(now_ms) -> effects                            follower truncated as told
    shutdown(now_ms) -> effects                             graceful stop: EndQuorumEpoch
    properties: role, epoch, leader_id, voted_for, high_watermark, state (QuorumState),
                is_leader, fetch_target (leader id to fetch from, or None), progress() -> list
Notes on the built API:
- The shell builds the initial `state` with `initial_state(loaded, log)`: a voter with no
  quorum-state file and an empty log starts with `catching_up_to=CATCH_UP_UNKNOWN`.
- `VoteResponse.pre_vote` must say which request the response answers (the shell copies it
  from the request it sent; `handle_vote` fills it in).
- `leader_id` is the persisted leader of the current epoch (this node's id when LEADER or
  RESIGNED; kept by a PROSPECTIVE that was a follower, as in KIP-996).
- `progress()` lists every voter on the leader (this node's last fetch is the latest `now_ms`
  seen) and is empty elsewhere.
- Requests whose sender is not a voter get INCONSISTENT_VOTER_SET and change nothing; responses
  from non-voters are ignored.
- After `shutdown()` the core starts no election of its own.
"""

from __future__ import annotations

from typing import Protocol

from minibroker.client.common.invariant import invariant
from minibroker.controller.quorum.messages import (
    CATCH_UP_UNKNOWN,
    CAUGHT_UP,
    NO_LEADER,
    NO_VOTE,
    AppendLeaderChange,
    BeginQuorumEpochRequest,
    Effect,
    EndQuorumEpochRequest,
    EpochReply,
    Event,
    FetchAction,
    FetchAnswer,
    FetchDecision,
    FetchRequest,
    FetchResponse,
    FetchResponseDecision,
    HighWatermark,
    OffsetAndEpoch,
    PersistState,
    QuorumSettings,
    QuorumState,
    RaftLogView,
    Role,
    RoleChanged,
    SendBeginQuorumEpoch,
    SendEndQuorumEpoch,
    SendVote,
    VoteRequest,
    VoteResponse,
    VoterProgress,
)

FENCED_LEADER_EPOCH = "FENCED_LEADER_EPOCH"
UNKNOWN_LEADER_EPOCH = "UNKNOWN_LEADER_EPOCH"
NOT_LEADER_OR_FOLLOWER = "NOT_LEADER_OR_FOLLOWER"
INCONSISTENT_VOTER_SET = "INCONSISTENT_VOTER_SET"

_NEVER = -1


class RandomSource(Protocol):
    """What the core needs of `random.Random` (election timeouts and backoffs)."""

    def randrange(self, stop: int, /) -> int: ...


def initial_state(loaded: QuorumState | None, log: RaftLogView) -> QuorumState:
    """The state to start from: the loaded quorum-state file, or (none) a fresh one; a voter
    with neither a file nor a record may have lost its disk (the wiped-voter rule)."""
    if loaded is not None:
        return loaded
    wiped = log.end_offset == 0 and log.start_offset == 0
    return QuorumState(catching_up_to=CATCH_UP_UNKNOWN if wiped else CAUGHT_UP)


class _ReplicaState:
    """The leader's view of one voter."""

    __slots__ = ("begin_sent_ms", "contact_ms", "end_offset", "last_caught_up_ms", "last_fetch_ms")

    def __init__(self, now_ms: int) -> None:
        self.end_offset = -1
        self.last_fetch_ms = _NEVER
        self.last_caught_up_ms = _NEVER
        self.contact_ms = now_ms  # check-quorum: the election counts as contact
        self.begin_sent_ms = now_ms  # BeginQuorumEpoch, re-sent until the voter fetches


class QuorumCore:
    """One voter's Raft rules (the module docstring, design.md §6.1, protocol.md §24)."""

    def __init__(
        self,
        settings: QuorumSettings,
        state: QuorumState,
        log: RaftLogView,
        rng: RandomSource,
        now_ms: int,
    ) -> None:
        invariant(settings.node_id in settings.voters, "this node must be a voter")
        invariant(settings.election_timeout_ms > 0, "election timeout must be > 0")
        self._settings = settings
        self._voters = tuple(sorted(settings.voters))
        self._others = tuple(v for v in self._voters if v != settings.node_id)
        self._log = log
        self._rng = rng
        self._now = now_ms
        self._state = state
        self._hw = log.start_offset
        self._shutting_down = False
        # timers (absolute ms)
        self._election_deadline = 0
        self._backoff_deadline: int | None = None
        self._fetch_deadline = 0
        # elections
        self._granted: set[int] = set()
        self._rejected: set[int] = set()
        # follower
        self._leader_contact_ms = _NEVER
        self._leader_lost = False  # the transport found the leader gone (leader_unreachable)
        self._leader_resigned = False
        # leader
        self._epoch_start_offset = -1
        self._replicas: dict[int, _ReplicaState] = {}
        if state.leader_id == settings.node_id:
            self._role = Role.RESIGNED  # the log must be rebuilt through an election
            self._reset_election_timer(now_ms)
        elif state.leader_id != NO_LEADER:
            self._role = Role.FOLLOWER
            self._fetch_deadline = now_ms + settings.fetch_timeout_ms
        else:
            self._role = Role.UNATTACHED
            self._reset_election_timer(now_ms)
        self._announced = (self._role, state.epoch, state.leader_id)

    # -- properties ------------------------------------------------------------------------

    @property
    def role(self) -> Role:
        return self._role

    @property
    def epoch(self) -> int:
        return self._state.epoch

    @property
    def leader_id(self) -> int:
        return self._state.leader_id

    @property
    def voted_for(self) -> int:
        return self._state.voted_for

    @property
    def high_watermark(self) -> int:
        return self._hw

    @property
    def reported_high_watermark(self) -> int:
        """The HW a leader tells its followers: -1 until the LeaderChange of its own epoch has
        committed (before that its HW is what it knew as a follower, possibly a stale 0 after
        a restart), as Kafka's leader does."""
        if self._role is Role.LEADER and self._hw > self._epoch_start_offset >= 0:
            return self._hw
        return -1

    @property
    def state(self) -> QuorumState:
        return self._state

    @property
    def is_leader(self) -> bool:
        return self._role is Role.LEADER

    @property
    def fetch_target(self) -> int | None:
        return self._state.leader_id if self._role is Role.FOLLOWER else None

    @property
    def epoch_start_offset(self) -> int:
        """The leader's LeaderChange offset in its epoch (-1 when not leader)."""
        return self._epoch_start_offset if self._role is Role.LEADER else -1

    def progress(self) -> list[VoterProgress]:
        if self._role is not Role.LEADER:
            return []
        out = []
        for v in self._voters:
            if v == self._settings.node_id:
                out.append(VoterProgress(v, self._log.end_offset, self._now, self._now))
            else:
                r = self._replicas[v]
                out.append(VoterProgress(v, r.end_offset, r.last_fetch_ms, r.last_caught_up_ms))
        return out

    # -- helpers ---------------------------------------------------------------------------

    @property
    def _majority(self) -> int:
        return len(self._voters) // 2 + 1

    def _reset_election_timer(self, now_ms: int) -> None:
        t = self._settings.election_timeout_ms
        self._election_deadline = now_ms + t + self._rng.randrange(t)

    def _persist(self, effects: list[Effect], state: QuorumState) -> None:
        if state != self._state:
            self._state = state
            effects.append(PersistState(state))

    def _announce(self, effects: list[Effect], reason: str) -> None:
        now = (self._role, self._state.epoch, self._state.leader_id)
        if now != self._announced:
            self._announced = now
            effects.append(
                RoleChanged(self._role, self._state.epoch, self._state.leader_id, reason)
            )

    def _log_is_up_to_date(self, last_offset_epoch: int, last_offset: int) -> bool:
        mine = (self._log.last_fetched_epoch(), self._log.end_offset)
        return (last_offset_epoch, last_offset) >= mine

    def _wiped_rule_allows(self, last_offset: int) -> bool:
        return self._state.catching_up_to == CAUGHT_UP or last_offset == 0

    def _done(self, effects: list[Effect]) -> list[Effect]:
        """Check the shell's contract: every PersistState comes before any send."""
        sent = False
        for e in effects:
            if isinstance(e, (SendVote, SendBeginQuorumEpoch, SendEndQuorumEpoch)):
                sent = True
            elif isinstance(e, PersistState):
                invariant(not sent, "PersistState after a send")
        return effects

    def _leave_leadership(self) -> None:
        self._replicas = {}
        self._epoch_start_offset = -1

    # -- transitions -----------------------------------------------------------------------

    def _adopt_epoch(
        self,
        effects: list[Effect],
        epoch: int,
        leader_id: int,
        now_ms: int,
        *,
        contact: bool = False,
    ) -> None:
        """A higher epoch arrived: UNATTACHED in it, or FOLLOWER of the leader it names.
        `contact`: the leader itself spoke (BeginQuorumEpoch, a Fetch answer), not a voter
        naming it."""
        invariant(epoch > self._state.epoch, "adopting an epoch that is not higher")
        was_leader = self._role is Role.LEADER
        if leader_id == self._settings.node_id:
            leader_id = NO_LEADER  # cannot be: we never led that epoch
        self._persist(
            effects,
            QuorumState(epoch, NO_VOTE, leader_id, self._state.catching_up_to),
        )
        self._leave_leadership()
        self._backoff_deadline = None
        if leader_id != NO_LEADER:
            self._become_follower_now(now_ms, contact=contact)
        else:
            self._role = Role.UNATTACHED
            self._reset_election_timer(now_ms)
        self._announce(effects, "higher_epoch")
        if was_leader:
            effects.append(Event("quorum_resigned", {"epoch": epoch - 1, "reason": "higher_epoch"}))

    def _become_follower_now(self, now_ms: int, *, contact: bool) -> None:
        """FOLLOWER with a fresh fetch timer. Only the leader's own word (`contact`) counts as
        hearing from it: a voter that merely named the leader (a refused pre-vote) must not
        make this node refuse pre-votes in turn, or two followers of a dead leader keep
        sending each other back to it and nobody is elected (found by the process tests)."""
        self._role = Role.FOLLOWER
        self._fetch_deadline = now_ms + self._settings.fetch_timeout_ms
        if contact:
            self._leader_contact_ms = now_ms
        self._leader_resigned = False
        self._leader_lost = False

    def _follow(
        self,
        effects: list[Effect],
        leader_id: int,
        now_ms: int,
        reason: str,
        *,
        contact: bool = False,
    ) -> None:
        """FOLLOWER of `leader_id` in the current epoch."""
        known = self._state.leader_id
        invariant(
            known in (NO_LEADER, leader_id),
            f"two leaders in epoch {self._state.epoch}: {known} and {leader_id}",
        )
        self._persist(
            effects,
            QuorumState(
                self._state.epoch, self._state.voted_for, leader_id, self._state.catching_up_to
            ),
        )
        self._backoff_deadline = None
        self._become_follower_now(now_ms, contact=contact)
        self._announce(effects, reason)

    def _become_prospective(self, effects: list[Effect], now_ms: int, reason: str) -> None:
        self._role = Role.PROSPECTIVE
        self._granted = {self._settings.node_id}
        self._rejected = set()
        self._backoff_deadline = None
        self._reset_election_timer(now_ms)
        self._announce(effects, reason)
        effects.append(Event("quorum_prevote_started", {"epoch": self._state.epoch}))
        req = VoteRequest(
            self._state.epoch + 1,
            self._settings.node_id,
            self._log.last_fetched_epoch(),
            self._log.end_offset,
            pre_vote=True,
        )
        effects.extend(SendVote(v, req) for v in self._others)
        self._maybe_count(effects, now_ms)

    def _become_candidate(self, effects: list[Effect], now_ms: int) -> None:
        me = self._settings.node_id
        self._persist(
            effects, QuorumState(self._state.epoch + 1, me, NO_LEADER, self._state.catching_up_to)
        )
        self._role = Role.CANDIDATE
        self._granted = {me}
        self._rejected = set()
        self._backoff_deadline = None
        self._reset_election_timer(now_ms)
        self._announce(effects, "prevote_won")
        effects.append(Event("quorum_election_started", {"epoch": self._state.epoch}))
        req = VoteRequest(
            self._state.epoch, me, self._log.last_fetched_epoch(), self._log.end_offset
        )
        effects.extend(SendVote(v, req) for v in self._others)
        self._maybe_count(effects, now_ms)

    def _become_leader(self, effects: list[Effect], now_ms: int) -> None:
        me = self._settings.node_id
        epoch = self._state.epoch
        self._persist(effects, QuorumState(epoch, me, me, CAUGHT_UP))
        self._role = Role.LEADER
        self._backoff_deadline = None
        self._epoch_start_offset = self._log.end_offset
        self._replicas = {v: _ReplicaState(now_ms) for v in self._others}
        granting = tuple(sorted(self._granted))
        self._announce(effects, "elected")
        effects.append(Event("quorum_election_won", {"epoch": epoch, "granting": granting}))
        effects.append(AppendLeaderChange(epoch, self._voters, granting))
        begin = BeginQuorumEpochRequest(epoch, me)
        effects.extend(SendBeginQuorumEpoch(v, begin) for v in self._others)

    def _maybe_count(self, effects: list[Effect], now_ms: int) -> None:
        """PROSPECTIVE/CANDIDATE: won with a majority; lost (no majority possible): back off."""
        if self._backoff_deadline is not None:
            return
        if len(self._granted) >= self._majority:
            if self._role is Role.PROSPECTIVE:
                self._become_candidate(effects, now_ms)
            else:
                self._become_leader(effects, now_ms)
        elif len(self._voters) - len(self._rejected) < self._majority:
            self._start_backoff(effects, now_ms, "rejected")

    def _start_backoff(self, effects: list[Effect], now_ms: int, why: str) -> None:
        cap = self._settings.election_backoff_max_ms
        self._backoff_deadline = now_ms + (self._rng.randrange(cap) if cap > 0 else 0)
        effects.append(
            Event(
                "quorum_election_lost",
                {"epoch": self._state.epoch, "role": self._role.value, "why": why},
            )
        )

    # -- timers ----------------------------------------------------------------------------

    def tick(self, now_ms: int) -> list[Effect]:
        self._now = max(self._now, now_ms)
        effects: list[Effect] = []
        role = self._role
        if self._shutting_down and role is not Role.LEADER:
            return effects
        if len(self._voters) == 1 and role is not Role.LEADER:
            self._become_prospective(effects, now_ms, "single_voter")
        elif role is Role.FOLLOWER:
            if now_ms >= self._fetch_deadline:
                reason = "leader_resigned" if self._leader_resigned else "fetch_timeout"
                self._become_prospective(effects, now_ms, reason)
        elif role in (Role.PROSPECTIVE, Role.CANDIDATE):
            if self._backoff_deadline is None and now_ms >= self._election_deadline:
                self._start_backoff(effects, now_ms, "election_timeout")
            if self._backoff_deadline is not None and now_ms >= self._backoff_deadline:
                self._become_prospective(effects, now_ms, "election_retry")
        elif role in (Role.UNATTACHED, Role.RESIGNED):
            if now_ms >= self._election_deadline:
                self._become_prospective(effects, now_ms, "election_timeout")
        elif role is Role.LEADER:
            self._check_quorum(effects, now_ms)
            if self._role is Role.LEADER:
                self._resend_begin_epoch(effects, now_ms)
        return self._done(effects)

    def _resend_begin_epoch(self, effects: list[Effect], now_ms: int) -> None:
        """Kafka's `maybeSendBeginQuorumEpochRequests`: a voter that has not fetched in this
        epoch is told again every fetch timeout / 2. Its BeginQuorumEpoch may have been lost,
        or it may sit in a higher epoch that nobody else heard of (a candidate whose every vote
        request was lost); its answer then carries that epoch (`handle_epoch_reply`)."""
        interval = max(1, self._settings.fetch_timeout_ms // 2)
        begin = BeginQuorumEpochRequest(self._state.epoch, self._settings.node_id)
        for voter, replica in self._replicas.items():
            if replica.last_fetch_ms == _NEVER and now_ms - replica.begin_sent_ms >= interval:
                replica.begin_sent_ms = now_ms
                effects.append(SendBeginQuorumEpoch(voter, begin))

    def handle_epoch_reply(self, voter_id: int, reply: EpochReply, now_ms: int) -> list[Effect]:
        """A voter's answer to BeginQuorumEpoch or EndQuorumEpoch: a higher epoch than ours
        moves this node to it (Raft's rule for every message), which also ends a leadership
        that a voter in a later epoch could never follow."""
        self._now = max(self._now, now_ms)
        effects: list[Effect] = []
        if voter_id in self._others and reply.leader_epoch > self._state.epoch:
            leader = reply.leader_id if reply.leader_id in self._voters else NO_LEADER
            self._adopt_epoch(effects, reply.leader_epoch, leader, now_ms)
        return self._done(effects)

    def leader_unreachable(self, now_ms: int) -> list[Effect]:
        """The transport could not reach the leader at all (connection refused or reset: its
        process is gone, as a SIGKILL leaves it). A follower stops counting the leader as heard
        from (so it grants pre-votes) and starts its own pre-vote after a random delay in
        [0, election timeout / 2) instead of waiting out the whole fetch timeout. The delay
        spreads the surviving followers so that one asks first: two candidates at once split
        the vote and cost an election timeout. Safety never depends on it: a pre-vote still
        needs a majority, and a voter that still hears from a live leader refuses it."""
        self._now = max(self._now, now_ms)
        if self._role is not Role.FOLLOWER or self._leader_resigned or self._leader_lost:
            return []
        self._leader_lost = True
        self._leader_contact_ms = _NEVER
        cap = max(1, self._settings.election_timeout_ms // 2)
        self._fetch_deadline = min(self._fetch_deadline, now_ms + self._rng.randrange(cap))
        return [Event("quorum_leader_unreachable", {"leader": self._state.leader_id})]

    def _check_quorum(self, effects: list[Effect], now_ms: int) -> None:
        if not self._others:
            return
        since = now_ms - self._settings.fetch_timeout_ms
        live = 1 + sum(1 for r in self._replicas.values() if r.contact_ms > since)
        if live < self._majority:
            self._resign(effects, now_ms, "check_quorum")

    def _resign(self, effects: list[Effect], now_ms: int, reason: str) -> None:
        self._role = Role.RESIGNED
        self._reset_election_timer(now_ms)
        self._announce(effects, reason)
        effects.append(Event("quorum_resigned", {"epoch": self._state.epoch, "reason": reason}))

    # -- Vote ------------------------------------------------------------------------------

    def handle_vote(self, req: VoteRequest, now_ms: int) -> tuple[VoteResponse, list[Effect]]:
        self._now = max(self._now, now_ms)
        effects: list[Effect] = []
        me = self._settings.node_id

        def answer(granted: bool, error: str = "") -> tuple[VoteResponse, list[Effect]]:
            # Name a leader only while it leads or is followed: a resigned or prospective
            # voter naming the epoch's old leader sends the asker to follow a node that does
            # not lead (found by the simulation: the quorum never elected again).
            leader = (
                self._state.leader_id if self._role in (Role.LEADER, Role.FOLLOWER) else NO_LEADER
            )
            resp = VoteResponse(me, self._state.epoch, leader, granted, error, req.pre_vote)
            return resp, self._done(effects)

        if req.candidate_id not in self._voters or req.candidate_id == me:
            return answer(False, INCONSISTENT_VOTER_SET)
        if req.candidate_epoch < self._state.epoch:
            return answer(False, FENCED_LEADER_EPOCH)
        up_to_date = self._log_is_up_to_date(req.last_offset_epoch, req.last_offset)
        wiped_ok = self._wiped_rule_allows(req.last_offset)
        if req.pre_vote:
            live_leader = self._role is Role.LEADER or (
                self._role is Role.FOLLOWER
                and not self._leader_resigned
                and self._leader_contact_ms != _NEVER
                and now_ms - self._leader_contact_ms < self._settings.fetch_timeout_ms
            )
            return answer(up_to_date and wiped_ok and not live_leader)
        if req.candidate_epoch > self._state.epoch:
            self._adopt_epoch(effects, req.candidate_epoch, NO_LEADER, now_ms)
        s = self._state
        grant = (
            s.voted_for in (NO_VOTE, req.candidate_id)
            and s.leader_id == NO_LEADER
            and self._role in (Role.UNATTACHED, Role.PROSPECTIVE)
            and up_to_date
            and wiped_ok
        )
        if grant:
            self._persist(
                effects, QuorumState(s.epoch, req.candidate_id, NO_LEADER, s.catching_up_to)
            )
            if self._role is Role.PROSPECTIVE:
                self._role = Role.UNATTACHED
                self._announce(effects, "voted")
            self._reset_election_timer(now_ms)
            effects.append(
                Event("quorum_vote_granted", {"epoch": s.epoch, "candidate": req.candidate_id})
            )
        return answer(grant)

    def handle_vote_response(self, resp: VoteResponse, now_ms: int) -> list[Effect]:
        self._now = max(self._now, now_ms)
        effects: list[Effect] = []
        if resp.voter_id not in self._others:
            return effects
        if resp.leader_epoch > self._state.epoch:
            self._adopt_epoch(effects, resp.leader_epoch, resp.leader_id, now_ms)
            return self._done(effects)
        if resp.pre_vote:
            if self._role is not Role.PROSPECTIVE:
                return effects
            if (
                resp.leader_epoch == self._state.epoch
                and resp.leader_id not in (NO_LEADER, self._settings.node_id)
                and not resp.vote_granted
                and self._state.leader_id in (NO_LEADER, resp.leader_id)
            ):
                # a voter still follows a live leader of our epoch: follow it again
                self._follow(effects, resp.leader_id, now_ms, "leader_discovered")
                return self._done(effects)
        elif self._role is not Role.CANDIDATE or resp.leader_epoch != self._state.epoch:
            return effects
        if resp.vote_granted and not resp.error:
            if resp.voter_id not in self._rejected:
                self._granted.add(resp.voter_id)
        elif resp.voter_id not in self._granted:
            self._rejected.add(resp.voter_id)
        self._maybe_count(effects, now_ms)
        return self._done(effects)

    # -- BeginQuorumEpoch / EndQuorumEpoch -------------------------------------------------

    def handle_begin_epoch(
        self, req: BeginQuorumEpochRequest, now_ms: int
    ) -> tuple[EpochReply, list[Effect]]:
        self._now = max(self._now, now_ms)
        effects: list[Effect] = []
        err = self._check_epoch_request(req.leader_epoch, req.leader_id)
        if not err:
            if req.leader_epoch > self._state.epoch:
                self._adopt_epoch(effects, req.leader_epoch, req.leader_id, now_ms, contact=True)
            elif self._role is Role.FOLLOWER and self._state.leader_id == req.leader_id:
                self._become_follower_now(now_ms, contact=True)  # same leader: fresh contact
            else:
                self._follow(effects, req.leader_id, now_ms, "begin_epoch", contact=True)
        reply = EpochReply(self._state.epoch, self._state.leader_id, err)
        return reply, self._done(effects)

    def _check_epoch_request(self, epoch: int, leader_id: int) -> str:
        if leader_id not in self._others:
            return INCONSISTENT_VOTER_SET
        if epoch < self._state.epoch:
            return FENCED_LEADER_EPOCH
        return ""

    def handle_end_epoch(
        self, req: EndQuorumEpochRequest, now_ms: int
    ) -> tuple[EpochReply, list[Effect]]:
        self._now = max(self._now, now_ms)
        effects: list[Effect] = []
        err = self._check_epoch_request(req.leader_epoch, req.leader_id)
        if not err:
            if req.leader_epoch > self._state.epoch:
                self._adopt_epoch(effects, req.leader_epoch, req.leader_id, now_ms)
            elif self._role is not Role.FOLLOWER and self._state.leader_id == NO_LEADER:
                self._follow(effects, req.leader_id, now_ms, "end_epoch")
            if self._role is Role.FOLLOWER and self._state.leader_id == req.leader_id:
                delay = self.successor_delay_ms(req.preferred_successors)
                self._leader_resigned = True
                self._fetch_deadline = now_ms + delay
                effects.append(
                    Event(
                        "quorum_leader_resigning",
                        {"epoch": req.leader_epoch, "leader": req.leader_id, "delay_ms": delay},
                    )
                )
                if delay == 0 and not self._shutting_down:
                    self._become_prospective(effects, now_ms, "leader_resigned")
        reply = EpochReply(self._state.epoch, self._state.leader_id, err)
        return reply, self._done(effects)

    def successor_delay_ms(self, successors: tuple[int, ...]) -> int:
        """How long to wait before a pre-vote round after the leader's EndQuorumEpoch: 0 for the
        first preferred successor, position * election timeout / n for the others (n for a node
        not listed)."""
        me = self._settings.node_id
        n = max(len(successors), 1)
        position = successors.index(me) if me in successors else n
        return position * self._settings.election_timeout_ms // n

    # -- Fetch (leader side) ---------------------------------------------------------------

    def handle_fetch(self, req: FetchRequest, now_ms: int) -> tuple[FetchDecision, list[Effect]]:
        self._now = max(self._now, now_ms)
        effects: list[Effect] = []
        log = self._log

        def decide(answer: FetchAnswer, **kw: object) -> tuple[FetchDecision, list[Effect]]:
            d = FetchDecision(
                answer,
                self._state.epoch,
                self._state.leader_id,
                self.reported_high_watermark,
                log.start_offset,
                **kw,  # type: ignore[arg-type]
            )
            return d, self._done(effects)

        if req.replica_id not in self._others:
            return decide(FetchAnswer.ERROR, error=INCONSISTENT_VOTER_SET)
        if req.current_leader_epoch < self._state.epoch:
            return decide(FetchAnswer.ERROR, error=FENCED_LEADER_EPOCH)
        if req.current_leader_epoch > self._state.epoch:
            return decide(FetchAnswer.ERROR, error=UNKNOWN_LEADER_EPOCH)
        if self._role is not Role.LEADER:
            return decide(FetchAnswer.ERROR, error=NOT_LEADER_OR_FOLLOWER)
        replica = self._replicas[req.replica_id]
        replica.contact_ms = now_ms
        # Kafka's validateOffsetAndEpoch
        start = log.start_offset
        if start > 0:
            snapshot = OffsetAndEpoch(start, log.epoch_of(start - 1))
            if (
                req.fetch_offset < start
                or (req.fetch_offset == start and req.last_fetched_epoch != snapshot.epoch)
                or req.last_fetched_epoch < snapshot.epoch
            ):
                return decide(FetchAnswer.SNAPSHOT, snapshot_id=snapshot)
        if req.fetch_offset > 0 or start > 0:
            end = log.end_offset_for_epoch(req.last_fetched_epoch)
            if end.epoch < 0:
                # The follower's last epoch is older than anything this log holds (and there is
                # no snapshot): its whole log diverges from the log start. Never answer (-1, -1),
                # which reads as "no divergence" on the wire (found by review).
                end = OffsetAndEpoch(start, 0)
            if end.epoch != req.last_fetched_epoch or end.offset < req.fetch_offset:
                return decide(FetchAnswer.DIVERGING, diverging=end)
        replica.end_offset = req.fetch_offset
        replica.last_fetch_ms = now_ms
        if req.fetch_offset >= log.end_offset:
            replica.last_caught_up_ms = now_ms
        self._maybe_advance_leader_hw(effects)
        return decide(FetchAnswer.RECORDS)

    def _maybe_advance_leader_hw(self, effects: list[Effect]) -> None:
        ends = sorted(
            [self._log.end_offset, *(r.end_offset for r in self._replicas.values())],
            reverse=True,
        )
        candidate = ends[len(self._voters) // 2]
        if candidate > self._epoch_start_offset and candidate > self._hw:
            self._set_hw(effects, candidate)

    def _set_hw(self, effects: list[Effect], offset: int) -> None:
        invariant(offset > self._hw, "the high watermark never goes backwards")
        self._hw = offset
        effects.append(HighWatermark(offset))

    def leader_appended(self, now_ms: int) -> list[Effect]:
        self._now = max(self._now, now_ms)
        effects: list[Effect] = []
        if self._role is Role.LEADER:
            self._maybe_advance_leader_hw(effects)
        return self._done(effects)

    # -- Fetch (follower side) -------------------------------------------------------------

    def handle_fetch_response(
        self, resp: FetchResponse, now_ms: int
    ) -> tuple[FetchResponseDecision, list[Effect]]:
        self._now = max(self._now, now_ms)
        effects: list[Effect] = []
        ignore = FetchResponseDecision(FetchAction.IGNORE)
        if resp.leader_epoch > self._state.epoch:
            self._adopt_epoch(effects, resp.leader_epoch, resp.leader_id, now_ms, contact=True)
            return ignore, self._done(effects)
        if (
            self._role is not Role.FOLLOWER
            or resp.error
            or resp.leader_epoch < self._state.epoch
            or resp.leader_id != self._state.leader_id
        ):
            return ignore, effects
        if not self._leader_resigned:
            self._become_follower_now(now_ms, contact=True)
        if self._state.catching_up_to == CATCH_UP_UNKNOWN and resp.high_watermark >= 0:
            # Only a leader whose own epoch has committed knows the HW (-1 before): a target
            # taken earlier could be the new leader's stale 0 and let a wiped voter count as
            # caught up with an empty log (found by the process tests).
            self._set_catching_up(effects, resp.high_watermark)
            self._maybe_caught_up(effects)
        if resp.diverging is not None:
            return self._truncate_decision(resp.diverging), self._done(effects)
        if resp.snapshot_id is not None:
            decision = FetchResponseDecision(
                FetchAction.FETCH_SNAPSHOT, snapshot_id=resp.snapshot_id
            )
            return decision, self._done(effects)
        return FetchResponseDecision(FetchAction.APPEND), self._done(effects)

    def _truncate_decision(self, diverging: OffsetAndEpoch) -> FetchResponseDecision:
        """Kafka's truncateToEndOffset."""
        log = self._log
        if diverging.epoch <= 0:
            offset = min(diverging.offset, log.end_offset)
        else:
            local = log.end_offset_for_epoch(diverging.epoch)
            if local.epoch == diverging.epoch:
                offset = min(local.offset, diverging.offset)
            else:
                offset = local.offset
        offset = max(offset, log.start_offset)
        return FetchResponseDecision(FetchAction.TRUNCATE, offset=offset)

    def _set_catching_up(self, effects: list[Effect], target: int) -> None:
        s = self._state
        self._persist(effects, QuorumState(s.epoch, s.voted_for, s.leader_id, target))
        effects.append(Event("quorum_catching_up", {"target": target}))

    def _maybe_caught_up(self, effects: list[Effect]) -> None:
        s = self._state
        if s.catching_up_to >= 0 and self._log.end_offset >= s.catching_up_to:
            self._persist(effects, QuorumState(s.epoch, s.voted_for, s.leader_id, CAUGHT_UP))
            effects.append(Event("quorum_caught_up", {"offset": self._log.end_offset}))

    def follower_appended(self, leader_high_watermark: int, now_ms: int) -> list[Effect]:
        self._now = max(self._now, now_ms)
        effects: list[Effect] = []
        if self._role is not Role.FOLLOWER:
            return effects
        hw = min(leader_high_watermark, self._log.end_offset)
        if hw > self._hw:
            self._set_hw(effects, hw)
        if (
            self._state.catching_up_to == CATCH_UP_UNKNOWN
            and leader_high_watermark < 0
            and self._log.last_fetched_epoch() == self._state.epoch
        ):
            # The leader's HW is not known yet (its LeaderChange has not committed), but this
            # log now holds that LeaderChange, appended where the leader's log ended when it was
            # elected: below it lies every record committed before this epoch, and nothing of
            # this epoch is committed yet. Reaching it is as good as reaching a known HW.
            before = self._log.end_offset_for_epoch(self._state.epoch - 1)
            start = before.offset if before.offset >= 0 else self._log.start_offset
            self._set_catching_up(effects, start + 1)
        self._maybe_caught_up(effects)
        return self._done(effects)

    def snapshot_loaded(self, now_ms: int) -> list[Effect]:
        self._now = max(self._now, now_ms)
        effects: list[Effect] = []
        if self._log.start_offset > self._hw:
            self._set_hw(effects, self._log.start_offset)
        self._maybe_caught_up(effects)
        return self._done(effects)

    def truncated(self, now_ms: int) -> list[Effect]:
        self._now = max(self._now, now_ms)
        invariant(
            self._log.end_offset >= self._hw,
            f"truncated to {self._log.end_offset}, below the high watermark {self._hw}",
        )
        return []

    # -- shutdown --------------------------------------------------------------------------

    def shutdown(self, now_ms: int) -> list[Effect]:
        self._now = max(self._now, now_ms)
        effects: list[Effect] = []
        self._shutting_down = True
        if self._role is not Role.LEADER:
            return effects
        successors = tuple(sorted(self._others, key=lambda v: (-self._replicas[v].end_offset, v)))
        self._resign(effects, now_ms, "shutdown")
        end = EndQuorumEpochRequest(self._state.epoch, self._settings.node_id, successors)
        effects.extend(SendEndQuorumEpoch(v, end) for v in self._others)
        return self._done(effects)
