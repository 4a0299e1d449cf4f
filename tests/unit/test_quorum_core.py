"""The quorum core's Raft rules (controller/quorum/core.py, docs/protocol.md §24), table-tested
over a tiny in-memory RaftLogView, plus hypothesis properties over a small
random message exchange between three cores (HW never decreases, at most one leader per epoch,
committed prefixes agree)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.controller.quorum.core import (
    FENCED_LEADER_EPOCH,
    INCONSISTENT_VOTER_SET,
    NOT_LEADER_OR_FOLLOWER,
    UNKNOWN_LEADER_EPOCH,
    QuorumCore,
    initial_state,
)
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

T = 1000  # election timeout
F = 2000  # fetch timeout
B = 1000  # election backoff max


class MemLog:
    """A RaftLogView over a list of record epochs (offset = start_offset + index)."""

    def __init__(self, epochs: list[int] | None = None, start: int = 0, snap_epoch: int = 0):
        self.epochs = list(epochs or [])
        self.start = start
        self.snap_epoch = snap_epoch

    @property
    def start_offset(self) -> int:
        return self.start

    @property
    def end_offset(self) -> int:
        return self.start + len(self.epochs)

    def last_fetched_epoch(self) -> int:
        return self.epochs[-1] if self.epochs else self.snap_epoch

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        held = [e for e in self.epochs if e <= epoch]
        if not held:
            if self.start > 0 and self.snap_epoch <= epoch:
                return OffsetAndEpoch(self.start, self.snap_epoch)
            return OffsetAndEpoch(-1, -1)
        e = max(held)
        later = [i for i, x in enumerate(self.epochs) if x > e]
        return OffsetAndEpoch(self.start + (later[0] if later else len(self.epochs)), e)

    def epoch_of(self, offset: int) -> int:
        if offset == self.start - 1:
            return self.snap_epoch
        if self.start <= offset < self.end_offset:
            return self.epochs[offset - self.start]
        return -1

    def truncate(self, offset: int) -> None:
        del self.epochs[offset - self.start :]


def core(
    node: int = 1,
    voters: tuple[int, ...] = (1, 2, 3),
    state: QuorumState | None = None,
    log: MemLog | None = None,
    now: int = 0,
    seed: int = 0,
) -> QuorumCore:
    return QuorumCore(
        QuorumSettings(node, voters, T, F, B),
        state if state is not None else QuorumState(),
        log if log is not None else MemLog(),
        random.Random(seed),
        now,
    )


def of(effects: list[Effect], kind: type) -> list:
    return [e for e in effects if isinstance(e, kind)]


def persisted(effects: list[Effect]) -> QuorumState | None:
    states = of(effects, PersistState)
    return states[-1].state if states else None


def event_names(effects: list[Effect]) -> list[str]:
    return [e.name for e in of(effects, Event)]


def follower_of(leader: int, epoch: int, node: int = 2, log: MemLog | None = None, now: int = 0):
    c = core(node, state=QuorumState(epoch, NO_VOTE, leader), log=log, now=now)
    assert c.role is Role.FOLLOWER and c.fetch_target == leader
    return c


def elect(c: QuorumCore, now: int = 0) -> list[Effect]:
    """Drive `c` (unattached) through a pre-vote round and an election won with every vote."""
    out = c.tick(now + 2 * T)
    assert c.role is Role.PROSPECTIVE or c.is_leader
    for v in c._others:
        out += c.handle_vote_response(VoteResponse(v, c.epoch, NO_LEADER, True, pre_vote=True), now)
    for v in c._others:
        out += c.handle_vote_response(VoteResponse(v, c.epoch, NO_LEADER, True), now)
    assert c.is_leader
    return out


def leader_with(epochs: list[int], voters=(1, 2, 3), start: int = 0, snap_epoch: int = 0):
    """Node 1 leader of epoch max(epochs)+1 over a log of `epochs`, LeaderChange appended."""
    log = MemLog(epochs, start, snap_epoch)
    last = max([*epochs, snap_epoch, 0])
    c = core(1, voters, QuorumState(last, NO_VOTE, NO_LEADER), log)
    out = elect(c)
    (append,) = of(out, AppendLeaderChange)
    log.epochs.append(append.epoch)
    c.leader_appended(0)
    return c, log


# -- Vote (real) --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("my_state", "my_log", "req", "granted", "why"),
    [
        (QuorumState(5), [1, 2], VoteRequest(4, 2, 9, 99), False, "lower epoch"),
        (QuorumState(5), [1, 2], VoteRequest(6, 2, 2, 2), True, "higher epoch, same log"),
        (QuorumState(5), [1, 2], VoteRequest(5, 2, 2, 2), True, "same epoch, equal log"),
        (QuorumState(5), [1, 2], VoteRequest(5, 2, 2, 1), False, "shorter log, same last epoch"),
        (QuorumState(5), [1, 2], VoteRequest(5, 2, 1, 9), False, "lower last epoch, longer"),
        (QuorumState(5), [1, 2], VoteRequest(5, 2, 3, 1), True, "higher last epoch, shorter"),
        (QuorumState(5, 3), [], VoteRequest(5, 2, 0, 0), False, "voted for 3 in epoch 5"),
        (QuorumState(5, 2), [], VoteRequest(5, 2, 0, 0), True, "voted for 2 already: again"),
        (QuorumState(5, 3), [], VoteRequest(6, 2, 0, 0), True, "the vote was in epoch 5"),
        (QuorumState(5, NO_VOTE, 3), [], VoteRequest(5, 2, 0, 0), False, "follows 3 in 5"),
        (QuorumState(5, NO_VOTE, 3), [], VoteRequest(6, 2, 0, 0), True, "3 led epoch 5 only"),
        (QuorumState(5), [], VoteRequest(6, 9, 0, 0), False, "9 is not a voter"),
        (QuorumState(5), [1], VoteRequest(6, 2, 0, 0), False, "empty candidate, I hold one"),
        (QuorumState(0, catching_up_to=CATCH_UP_UNKNOWN), [], VoteRequest(1, 2, 1, 3), False, "w"),
        (QuorumState(0, catching_up_to=CATCH_UP_UNKNOWN), [], VoteRequest(1, 2, 0, 0), True, "w0"),
        (QuorumState(0, catching_up_to=7), [], VoteRequest(1, 2, 1, 3), False, "catching up"),
    ],
)
def test_vote_granting_matrix(my_state, my_log, req, granted, why) -> None:
    c = core(1, state=my_state, log=MemLog(my_log))
    resp, effects = c.handle_vote(req, 10)
    assert resp.vote_granted is granted, why
    assert resp.voter_id == 1 and resp.leader_epoch == c.epoch and not resp.pre_vote
    if granted:
        expected = replace(
            my_state, epoch=req.candidate_epoch, voted_for=req.candidate_id, leader_id=NO_LEADER
        )
        assert c.state == expected
        assert persisted(effects) == (expected if expected != my_state else None)
        assert "quorum_vote_granted" in event_names(effects)
    if req.candidate_epoch < my_state.epoch or req.candidate_id == 9:
        assert effects == [] and c.state == my_state
        assert resp.error == (
            INCONSISTENT_VOTER_SET if req.candidate_id == 9 else FENCED_LEADER_EPOCH
        )


def test_a_higher_epoch_vote_moves_to_unattached_before_deciding() -> None:
    c = core(1, state=QuorumState(5, 3), log=MemLog([1, 2, 2]))
    resp, effects = c.handle_vote(VoteRequest(7, 2, 1, 1), 0)  # out of date: refused
    assert not resp.vote_granted
    assert persisted(effects) == QuorumState(7, NO_VOTE, NO_LEADER)
    assert c.role is Role.UNATTACHED and c.epoch == 7 and resp.leader_epoch == 7


def test_candidate_and_leader_refuse_other_candidates_in_their_epoch() -> None:
    c = core(1)
    c.tick(2 * T)
    c.handle_vote_response(VoteResponse(2, 0, NO_LEADER, True, pre_vote=True), 0)
    assert c.role is Role.CANDIDATE and c.epoch == 1
    resp, effects = c.handle_vote(VoteRequest(1, 2, 0, 0), 0)
    assert not resp.vote_granted and effects == []
    c.handle_vote_response(VoteResponse(2, 1, NO_LEADER, True), 0)
    assert c.is_leader
    resp, _ = c.handle_vote(VoteRequest(1, 3, 9, 9), 0)
    assert not resp.vote_granted


def test_one_vote_per_epoch_survives_a_restart() -> None:
    log = MemLog([1])
    a = core(1, state=QuorumState(1, NO_VOTE, NO_LEADER), log=log)
    resp, effects = a.handle_vote(VoteRequest(2, 2, 1, 1), 0)
    assert resp.vote_granted
    saved = persisted(effects)
    assert saved == QuorumState(2, 2, NO_LEADER)
    b = core(1, state=saved, log=log)  # the restart
    assert b.role is Role.UNATTACHED and b.voted_for == 2
    resp, effects = b.handle_vote(VoteRequest(2, 3, 1, 1), 0)
    assert not resp.vote_granted and effects == []


# -- Pre-vote -----------------------------------------------------------------------------------


def test_pre_vote_never_changes_state() -> None:
    c = core(1, state=QuorumState(5, 3), log=MemLog([1]))
    resp, effects = c.handle_vote(VoteRequest(9, 2, 1, 1, pre_vote=True), 0)
    assert resp.vote_granted and resp.pre_vote
    assert effects == [] and c.state == QuorumState(5, 3) and c.role is Role.UNATTACHED


@pytest.mark.parametrize(
    ("req", "granted", "why"),
    [
        (VoteRequest(5, 2, 1, 1, pre_vote=True), True, "epoch + 1 == mine + 0 is fine"),
        (VoteRequest(4, 2, 1, 1, pre_vote=True), False, "below my epoch"),
        (VoteRequest(6, 2, 1, 0, pre_vote=True), False, "log behind"),
        (VoteRequest(6, 2, 0, 5, pre_vote=True), False, "older last epoch"),
    ],
)
def test_pre_vote_matrix(req, granted, why) -> None:
    c = core(1, state=QuorumState(5), log=MemLog([1]))
    resp, effects = c.handle_vote(req, 0)
    assert resp.vote_granted is granted, why
    assert effects == []


def test_pre_vote_refused_while_the_leader_is_live_granted_after_fetch_timeout() -> None:
    c = follower_of(3, 4, node=1, log=MemLog([4]))
    c.handle_begin_epoch(BeginQuorumEpochRequest(4, 3), 100)
    pre = VoteRequest(5, 2, 4, 1, pre_vote=True)
    assert not c.handle_vote(pre, 100 + F - 1)[0].vote_granted
    c.handle_fetch_response(FetchResponse(4, 3, 1, 0), 1500)  # a live leader answers
    assert not c.handle_vote(pre, 1500 + F - 1)[0].vote_granted
    assert c.handle_vote(pre, 1500 + F)[0].vote_granted
    assert c.role is Role.FOLLOWER and c.epoch == 4


def test_leader_refuses_pre_votes() -> None:
    c, _ = leader_with([])
    resp, effects = c.handle_vote(VoteRequest(c.epoch + 1, 2, 99, 99, pre_vote=True), 0)
    assert not resp.vote_granted and effects == [] and c.is_leader


# -- Elections ----------------------------------------------------------------------------------


def test_election_through_pre_vote_vote_and_leader_change() -> None:
    log = MemLog([1, 1])
    c = core(1, state=QuorumState(1), log=log)
    assert c.tick(T - 1) == []  # the election timeout is at least T
    out = c.tick(2 * T)  # ... and below 2T
    assert c.role is Role.PROSPECTIVE and c.epoch == 1
    assert of(out, PersistState) == []  # a pre-vote round persists nothing
    assert {s.to for s in of(out, SendVote)} == {2, 3}
    assert all(s.request == VoteRequest(2, 1, 1, 2, pre_vote=True) for s in of(out, SendVote))
    out = c.handle_vote_response(VoteResponse(3, 1, NO_LEADER, True, pre_vote=True), 0)
    assert c.role is Role.CANDIDATE and c.epoch == 2 and c.voted_for == 1
    assert isinstance(out[0], PersistState) and out[0].state == QuorumState(2, 1, NO_LEADER)
    assert [s.request for s in of(out, SendVote)] == [VoteRequest(2, 1, 1, 2)] * 2
    out = c.handle_vote_response(VoteResponse(2, 2, NO_LEADER, True), 0)
    assert c.is_leader and c.leader_id == 1
    assert persisted(out) == QuorumState(2, 1, 1)
    assert of(out, AppendLeaderChange) == [AppendLeaderChange(2, (1, 2, 3), (1, 2))]
    assert [b.to for b in of(out, SendBeginQuorumEpoch)] == [2, 3]
    kinds = [type(e) for e in out]
    assert kinds.index(AppendLeaderChange) < kinds.index(SendBeginQuorumEpoch)
    assert of(out, RoleChanged)[-1] == RoleChanged(Role.LEADER, 2, 1, "elected")
    assert "quorum_election_won" in event_names(out)


def test_a_late_pre_vote_grant_is_not_a_vote() -> None:
    c = core(1, voters=(1, 2, 3, 4, 5))
    c.tick(2 * T)
    for v in (2, 3):
        c.handle_vote_response(VoteResponse(v, 0, NO_LEADER, True, pre_vote=True), 0)
    assert c.role is Role.CANDIDATE and c.epoch == 1
    c.handle_vote_response(VoteResponse(4, 1, NO_LEADER, True, pre_vote=True), 0)
    c.handle_vote_response(VoteResponse(5, 1, NO_LEADER, True, pre_vote=True), 0)
    assert c.role is Role.CANDIDATE
    c.handle_vote_response(VoteResponse(2, 1, NO_LEADER, True), 0)
    assert c.role is Role.CANDIDATE
    c.handle_vote_response(VoteResponse(3, 1, NO_LEADER, True), 0)
    assert c.is_leader


def test_votes_from_another_epoch_or_a_non_voter_do_not_count() -> None:
    c = core(1)
    c.tick(2 * T)
    c.handle_vote_response(VoteResponse(9, 0, NO_LEADER, True, pre_vote=True), 0)
    assert c.role is Role.PROSPECTIVE
    c.handle_vote_response(VoteResponse(2, 0, NO_LEADER, True, pre_vote=True), 0)
    assert c.role is Role.CANDIDATE and c.epoch == 1
    c.handle_vote_response(VoteResponse(2, 0, NO_LEADER, True), 0)  # stale epoch
    assert c.role is Role.CANDIDATE


@pytest.mark.parametrize("seed", range(20))
def test_election_timeout_is_randomised_in_t_2t(seed: int) -> None:
    c = core(1, seed=seed)
    assert c.tick(T - 1) == []
    fired = next(t for t in range(T, 2 * T + 1) if c.tick(t))
    assert T <= fired < 2 * T


def test_rejections_or_timeout_back_off_then_a_new_pre_vote_round() -> None:
    c = core(1, seed=3)
    c.tick(2 * T)
    c.handle_vote_response(VoteResponse(2, 0, NO_LEADER, False, pre_vote=True), 2 * T)
    out = c.handle_vote_response(VoteResponse(3, 0, NO_LEADER, False, pre_vote=True), 2 * T)
    assert "quorum_election_lost" in event_names(out)
    resend = next(t for t in range(2 * T, 2 * T + B + 1) if of(c.tick(t), SendVote))
    assert resend < 2 * T + B and c.role is Role.PROSPECTIVE and c.epoch == 0
    # a candidate whose election times out backs off and starts over with a pre-vote
    c.handle_vote_response(VoteResponse(2, 0, NO_LEADER, True, pre_vote=True), resend)
    assert c.role is Role.CANDIDATE and c.epoch == 1
    later = next(t for t in range(resend, resend + 2 * T + B + 2) if of(c.tick(t), SendVote))
    assert resend + T <= later < resend + 2 * T + B
    assert c.role is Role.PROSPECTIVE and c.epoch == 1 and c.voted_for == 1


def test_a_quorum_of_one_elects_itself_on_the_first_tick() -> None:
    log = MemLog()
    c = core(1, voters=(1,), log=log)
    out = c.tick(0)
    assert c.is_leader and c.epoch == 1
    assert of(out, AppendLeaderChange) == [AppendLeaderChange(1, (1,), (1,))]
    assert of(out, SendVote) == [] and of(out, SendBeginQuorumEpoch) == []
    log.epochs.append(1)
    assert c.leader_appended(1) == [HighWatermark(1)]
    assert c.tick(10 * F) == []  # no check-quorum for a quorum of one


def test_prospective_rejoins_a_live_leader_named_by_a_pre_vote_answer() -> None:
    c = follower_of(2, 3, node=1)
    c.tick(F)
    assert c.role is Role.PROSPECTIVE
    out = c.handle_vote_response(VoteResponse(3, 3, 2, False, pre_vote=True), F)
    assert c.role is Role.FOLLOWER and c.fetch_target == 2
    assert of(out, RoleChanged)[-1].reason == "leader_discovered"


# -- Restart ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("saved", "role", "target"),
    [
        (QuorumState(4, 1, 1), Role.RESIGNED, None),
        (QuorumState(4, 2, 2), Role.FOLLOWER, 2),
        (QuorumState(4, 3, NO_LEADER), Role.UNATTACHED, None),
        (QuorumState(), Role.UNATTACHED, None),
    ],
)
def test_restart_roles(saved, role, target) -> None:
    c = core(1, state=saved)
    assert (c.role, c.epoch, c.voted_for, c.fetch_target) == (
        role,
        saved.epoch,
        saved.voted_for,
        target,
    )
    assert not c.is_leader and c.state == saved


def test_a_restarted_leader_needs_a_new_epoch() -> None:
    c = core(1, voters=(1,), state=QuorumState(4, 1, 1), log=MemLog([4, 4]))
    assert c.role is Role.RESIGNED
    c.tick(0)
    assert c.is_leader and c.epoch == 5


# -- Begin/EndQuorumEpoch -----------------------------------------------------------------------


def test_begin_quorum_epoch_makes_a_follower() -> None:
    c = core(1, state=QuorumState(3, 2))
    reply, out = c.handle_begin_epoch(BeginQuorumEpochRequest(3, 2), 0)
    assert c.role is Role.FOLLOWER and c.fetch_target == 2 and reply.leader_id == 2
    assert persisted(out) == QuorumState(3, 2, 2)
    reply, out = c.handle_begin_epoch(BeginQuorumEpochRequest(2, 3), 0)
    assert reply.error == FENCED_LEADER_EPOCH and reply.leader_epoch == 3 and out == []
    reply, out = c.handle_begin_epoch(BeginQuorumEpochRequest(9, 7), 0)
    assert reply.error == INCONSISTENT_VOTER_SET and out == [] and c.epoch == 3


def test_candidate_that_lost_follows_the_winner() -> None:
    c = core(1)
    c.tick(2 * T)
    c.handle_vote_response(VoteResponse(2, 0, NO_LEADER, True, pre_vote=True), 0)
    assert c.role is Role.CANDIDATE and c.epoch == 1
    c.handle_begin_epoch(BeginQuorumEpochRequest(1, 3), 0)
    assert c.role is Role.FOLLOWER and c.fetch_target == 3 and c.voted_for == 1


@pytest.mark.parametrize(
    ("node", "successors", "delay"),
    [(3, (3, 2, 4, 5), 0), (2, (3, 2, 4, 5), T // 4), (5, (3, 2, 4, 5), 3 * T // 4)],
)
def test_end_quorum_epoch_successor_delays(node, successors, delay) -> None:
    c = core(node, voters=(1, 2, 3, 4, 5), state=QuorumState(6, 1, 1))
    assert c.successor_delay_ms(successors) == delay
    _, out = c.handle_end_epoch(EndQuorumEpochRequest(6, 1, successors), 100)
    if delay == 0:
        assert c.role is Role.PROSPECTIVE and of(out, SendVote)
        return
    assert c.role is Role.FOLLOWER
    assert c.tick(100 + delay - 1) == []
    assert of(c.tick(100 + delay), SendVote) and c.role is Role.PROSPECTIVE
    assert of(c.tick(100 + delay), RoleChanged) == []


def test_after_end_quorum_epoch_followers_grant_pre_votes_at_once() -> None:
    c = follower_of(1, 6, node=2)
    c.handle_fetch_response(FetchResponse(6, 1, 0, 0), 50)
    c.handle_end_epoch(EndQuorumEpochRequest(6, 1, (3, 2)), 100)
    assert c.role is Role.FOLLOWER
    assert c.handle_vote(VoteRequest(7, 3, 0, 0, pre_vote=True), 101)[0].vote_granted


def test_end_quorum_epoch_from_an_old_leader_is_fenced() -> None:
    c = follower_of(3, 6, node=2)
    reply, out = c.handle_end_epoch(EndQuorumEpochRequest(5, 1, (2,)), 0)
    assert reply.error == FENCED_LEADER_EPOCH and out == [] and c.role is Role.FOLLOWER


# -- Higher epochs ------------------------------------------------------------------------------


HIGHER = [
    ("vote", lambda c: c.handle_vote(VoteRequest(9, 2, 0, 0), 0)[1], NO_LEADER),
    ("vote_resp", lambda c: c.handle_vote_response(VoteResponse(2, 9, 3, False), 0), 3),
    ("vote_resp0", lambda c: c.handle_vote_response(VoteResponse(2, 9, -1, False), 0), NO_LEADER),
    ("begin", lambda c: c.handle_begin_epoch(BeginQuorumEpochRequest(9, 3), 0)[1], 3),
    ("end", lambda c: c.handle_end_epoch(EndQuorumEpochRequest(9, 3, (2,)), 0)[1], 3),
    ("fetch_resp", lambda c: c.handle_fetch_response(FetchResponse(9, 3, 0, 0), 0)[1], 3),
    (
        "fetch_err",
        lambda c: c.handle_fetch_response(FetchResponse(9, 2, 0, 0, error=FENCED_LEADER_EPOCH), 0)[
            1
        ],
        2,
    ),
]


@pytest.mark.parametrize("start", ["unattached", "follower", "candidate", "leader"])
@pytest.mark.parametrize(("name", "deliver", "leader"), HIGHER, ids=[h[0] for h in HIGHER])
def test_higher_epoch_adoption_from_every_message(start, name, deliver, leader) -> None:
    if start == "leader":
        c, _ = leader_with([])
    elif start == "candidate":
        c = core(1)
        c.tick(2 * T)
        c.handle_vote_response(VoteResponse(2, 0, NO_LEADER, True, pre_vote=True), 0)
    elif start == "follower":
        c = follower_of(2, 1, node=1)
    else:
        c = core(1)
    out = deliver(c)
    assert c.epoch == 9 and c.leader_id == leader
    assert isinstance(out[0], PersistState) and out[0].state.epoch == 9
    if leader == NO_LEADER:
        assert c.role is Role.UNATTACHED or (name == "vote" and c.voted_for == 2)
    else:
        assert c.role in (Role.FOLLOWER, Role.PROSPECTIVE) and c.state.leader_id == leader
    assert of(out, RoleChanged) and not c.is_leader and c.progress() == []


# -- Leader Fetch -------------------------------------------------------------------------------


def test_fetch_errors() -> None:
    c, _ = leader_with([])
    e = c.epoch
    cases = [
        (FetchRequest(2, e - 1, 0, 0), FENCED_LEADER_EPOCH),
        (FetchRequest(2, e + 1, 0, 0), UNKNOWN_LEADER_EPOCH),
        (FetchRequest(9, e, 0, 0), INCONSISTENT_VOTER_SET),
    ]
    for req, err in cases:
        d, out = c.handle_fetch(req, 0)
        assert (d.answer, d.error, d.leader_epoch, d.leader_id) == (FetchAnswer.ERROR, err, e, 1)
        assert out == []
    f = follower_of(1, e, node=2)
    d, _ = f.handle_fetch(FetchRequest(3, e, 0, 0), 0)
    assert (d.answer, d.error, d.leader_id) == (FetchAnswer.ERROR, NOT_LEADER_OR_FOLLOWER, 1)


def test_fetch_below_the_log_start_answers_the_snapshot() -> None:
    c, _ = leader_with([3, 3], start=10, snap_epoch=2)
    for offset, epoch in [(5, 1), (9, 2), (10, 1), (11, 1)]:
        d, _ = c.handle_fetch(FetchRequest(2, c.epoch, offset, epoch), 0)
        assert d.answer is FetchAnswer.SNAPSHOT and d.snapshot_id == OffsetAndEpoch(10, 2)
        assert d.log_start_offset == 10
    d, _ = c.handle_fetch(FetchRequest(2, c.epoch, 10, 2), 0)
    assert d.answer is FetchAnswer.RECORDS


@pytest.mark.parametrize(
    ("leader_log", "fetch_offset", "last_epoch", "diverging"),
    [
        ([1, 1, 1, 3, 3], 5, 2, OffsetAndEpoch(3, 1)),  # epoch 2 never existed here
        ([1, 1, 1, 3, 3], 4, 1, OffsetAndEpoch(3, 1)),  # epoch 1 ended at 3
        ([1, 1, 1, 3, 3], 7, 3, OffsetAndEpoch(5, 3)),  # beyond the log end in epoch 3
        ([2, 2], 1, 1, OffsetAndEpoch(0, 0)),  # below the first epoch, no snapshot: from 0
        ([1, 1, 1, 3, 3], 3, 1, None),
        ([1, 1, 1, 3, 3], 5, 3, None),
        ([1, 1, 1, 3, 3], 0, 0, None),
    ],
)
def test_fetch_diverging(leader_log, fetch_offset, last_epoch, diverging) -> None:
    c, _ = leader_with(leader_log, voters=(1, 2, 3, 4, 5))
    d, _ = c.handle_fetch(FetchRequest(2, c.epoch, fetch_offset, last_epoch), 0)
    if diverging is None:
        assert d.answer is FetchAnswer.RECORDS
    else:
        assert d.answer is FetchAnswer.DIVERGING and d.diverging == diverging
        assert c.progress()[1].log_end_offset == -1  # a diverging fetch records no progress


@pytest.mark.parametrize(
    ("follower_log", "diverging", "target"),
    [
        ([1, 1, 1, 2, 2, 2], OffsetAndEpoch(3, 1), 3),
        ([1, 1, 1, 1, 1], OffsetAndEpoch(3, 1), 3),  # min(leader's end of 1, mine)
        ([1, 1], OffsetAndEpoch(3, 1), 2),
        ([1, 1, 4, 4], OffsetAndEpoch(6, 3), 2),  # I never had epoch 3: my end of epoch 1
        ([2, 2, 2], OffsetAndEpoch(-1, -1), 0),
    ],
)
def test_follower_truncation_targets(follower_log, diverging, target) -> None:
    c = follower_of(1, 5, node=2, log=MemLog(follower_log))
    d, _ = c.handle_fetch_response(FetchResponse(5, 1, 0, 0, diverging=diverging), 0)
    assert d.action is FetchAction.TRUNCATE and d.offset == target


# -- High watermark -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("voters", "fetched", "hw"),
    [
        ((1,), {}, 3),
        ((1, 2, 3), {}, None),
        ((1, 2, 3), {2: 3}, 3),
        ((1, 2, 3), {2: 2, 3: 1}, None),  # 2 is the epoch start: not past it
        ((1, 2, 3), {2: 3, 3: 3}, 3),
        ((1, 2, 3, 4, 5), {2: 3}, None),
        ((1, 2, 3, 4, 5), {2: 3, 3: 3}, 3),
        ((1, 2, 3, 4, 5), {2: 3, 3: 3, 4: 3, 5: 3}, 3),
    ],
)
def test_hw_is_the_majority_offset_past_the_epoch_start(voters, fetched, hw) -> None:
    c, log = leader_with([1, 1], voters=voters)  # LeaderChange at 2, log end 3
    assert c.epoch_start_offset == 2 and log.end_offset == 3
    out: list[Effect] = []
    for v, offset in fetched.items():
        out += c.handle_fetch(FetchRequest(v, c.epoch, offset, log.epoch_of(offset - 1)), 5)[1]
    expected = hw if hw is not None else 0
    assert c.high_watermark == expected
    if hw is not None:
        assert HighWatermark(hw) in out or (voters == (1,))


def test_hw_never_moves_backwards_and_counts_the_leaders_durable_end() -> None:
    c, log = leader_with([1, 1])
    c.handle_fetch(FetchRequest(2, c.epoch, 3, c.epoch), 0)
    assert c.high_watermark == 3
    _, out = c.handle_fetch(FetchRequest(2, c.epoch, 2, 1), 0)  # the follower went back
    assert c.high_watermark == 3 and of(out, HighWatermark) == []
    log.epochs += [c.epoch, c.epoch]
    assert c.leader_appended(0) == []  # 2 is at 2: the majority holds 3
    _, out = c.handle_fetch(FetchRequest(3, c.epoch, 5, c.epoch), 0)
    assert of(out, HighWatermark) == [HighWatermark(5)]
    d, _ = c.handle_fetch(FetchRequest(2, c.epoch, 5, c.epoch), 0)
    assert d.high_watermark == 5


def test_progress_on_the_leader() -> None:
    c, _ = leader_with([1])
    c.handle_fetch(FetchRequest(2, c.epoch, 2, c.epoch), 3070)
    c.handle_fetch(FetchRequest(3, c.epoch, 1, 1), 3080)
    p = {v.voter_id: v for v in c.progress()}
    assert (p[1].log_end_offset, p[1].last_fetch_ms) == (2, 3080)
    assert (p[2].log_end_offset, p[2].last_fetch_ms, p[2].last_caught_up_ms) == (2, 3070, 3070)
    assert (p[3].log_end_offset, p[3].last_fetch_ms, p[3].last_caught_up_ms) == (1, 3080, -1)


# -- Follower side ------------------------------------------------------------------------------


def test_follower_fetch_responses() -> None:
    log = MemLog([1, 1])
    c = follower_of(3, 4, node=1, log=log)
    ignore = [
        FetchResponse(3, 3, 9, 0),  # an older leader
        FetchResponse(4, 3, 9, 0, error=NOT_LEADER_OR_FOLLOWER),
    ]
    for resp in ignore:
        d, out = c.handle_fetch_response(resp, 0)
        assert d.action is FetchAction.IGNORE and out == []
    d, _ = c.handle_fetch_response(FetchResponse(4, 3, 0, 5, snapshot_id=OffsetAndEpoch(5, 2)), 0)
    assert d.action is FetchAction.FETCH_SNAPSHOT and d.snapshot_id == OffsetAndEpoch(5, 2)
    d, _ = c.handle_fetch_response(FetchResponse(4, 3, 9, 0, has_records=True), 0)
    assert d.action is FetchAction.APPEND
    log.epochs += [4, 4]
    assert c.follower_appended(9, 0) == [HighWatermark(4)]  # min(leader hw, my end)
    assert c.follower_appended(3, 0) == []  # never backwards
    log.epochs += [4] * 6
    assert c.follower_appended(9, 0) == [HighWatermark(9)]


def test_follower_fetch_timeout_starts_a_pre_vote_round() -> None:
    c = follower_of(3, 4, node=1, now=0)
    c.handle_fetch_response(FetchResponse(4, 3, 0, 0), 500)
    assert c.tick(500 + F - 1) == []
    out = c.tick(500 + F)
    assert c.role is Role.PROSPECTIVE and of(out, RoleChanged)[0].reason == "fetch_timeout"
    assert all(s.request.pre_vote and s.request.candidate_epoch == 5 for s in of(out, SendVote))


def test_snapshot_loaded_moves_the_hw_to_the_snapshot() -> None:
    log = MemLog()
    c = follower_of(3, 4, node=1, log=log)
    log.start, log.snap_epoch = 7, 3
    assert c.snapshot_loaded(0) == [HighWatermark(7)]


# -- Check quorum, shutdown ---------------------------------------------------------------------


def unprompted(effects: list[Effect]) -> list[Effect]:
    return [e for e in effects if not isinstance(e, SendBeginQuorumEpoch)]


def test_check_quorum_resigns_without_a_majority_of_fetches() -> None:
    c, _ = leader_with([], voters=(1, 2, 3, 4, 5))
    c.handle_fetch(FetchRequest(2, c.epoch, 1, c.epoch), F - 10)
    c.handle_fetch(FetchRequest(3, c.epoch, 1, c.epoch), F - 10)
    # (4 and 5 never fetch: they are told BeginQuorumEpoch again, nothing else happens)
    assert unprompted(c.tick(F - 1)) == [] and c.is_leader  # the election counts until F
    assert unprompted(c.tick(F)) == [] and c.is_leader  # 1, 2, 3 within F
    c.handle_fetch(FetchRequest(3, c.epoch, 1, c.epoch), F + 100)
    assert unprompted(c.tick(2 * F - 20)) == [] and c.is_leader
    out = c.tick(2 * F)  # 2 has not fetched for F: only 1 and 3 left
    assert c.role is Role.RESIGNED and c.epoch == 1
    assert of(out, RoleChanged) == [RoleChanged(Role.RESIGNED, 1, 1, "check_quorum")]
    assert "quorum_resigned" in event_names(out) and of(out, PersistState) == []
    d, _ = c.handle_fetch(FetchRequest(2, c.epoch, 1, c.epoch), 2 * F)
    assert d.error == NOT_LEADER_OR_FOLLOWER
    later = next(t for t in range(2 * F, 2 * F + 2 * T + 1) if c.tick(t))
    assert c.role is Role.PROSPECTIVE and 2 * F + T <= later < 2 * F + 2 * T


def test_shutdown_of_a_leader_ends_its_epoch_with_successors_by_log_end() -> None:
    c, _ = leader_with([1, 1, 1], voters=(1, 2, 3, 4))
    c.handle_fetch(FetchRequest(2, c.epoch, 2, 1), 0)
    c.handle_fetch(FetchRequest(3, c.epoch, 4, c.epoch), 0)
    out = c.shutdown(10)
    assert c.role is Role.RESIGNED
    sends = of(out, SendEndQuorumEpoch)
    assert [s.to for s in sends] == [2, 3, 4]
    assert {s.request for s in sends} == {EndQuorumEpochRequest(c.epoch, 1, (3, 2, 4))}
    assert of(out, RoleChanged) == [RoleChanged(Role.RESIGNED, c.epoch, 1, "shutdown")]
    assert c.tick(100 * T) == []  # a stopping node starts no election


def test_shutdown_of_a_follower_does_nothing() -> None:
    c = follower_of(3, 4, node=1)
    assert c.shutdown(0) == [] and c.role is Role.FOLLOWER


# -- Wiped voter --------------------------------------------------------------------------------


def test_initial_state_marks_a_possibly_wiped_voter() -> None:
    assert initial_state(None, MemLog()).catching_up_to == CATCH_UP_UNKNOWN
    assert initial_state(None, MemLog([1])).catching_up_to == CAUGHT_UP
    saved = QuorumState(3, 2, 2)
    assert initial_state(saved, MemLog()) is saved


def test_wiped_voter_catches_up_to_the_leader_hw_before_voting_by_raft() -> None:
    log = MemLog()
    c = core(1, state=initial_state(None, log), log=log)
    non_empty = VoteRequest(3, 2, 2, 5)
    assert not c.handle_vote(non_empty, 0)[0].vote_granted
    assert not c.handle_vote(replace(non_empty, pre_vote=True), 0)[0].vote_granted
    c.handle_begin_epoch(BeginQuorumEpochRequest(3, 2), 0)
    d, out = c.handle_fetch_response(FetchResponse(3, 2, 5, 0), 0)
    assert d.action is FetchAction.APPEND
    assert persisted(out) == QuorumState(3, NO_VOTE, 2, 5)
    log.epochs += [2, 2, 3]
    out = c.follower_appended(5, 0)
    assert persisted(out) is None and c.state.catching_up_to == 5
    log.epochs += [3, 3]
    out = c.follower_appended(5, 0)
    assert persisted(out) == QuorumState(3, NO_VOTE, 2, CAUGHT_UP)
    assert "quorum_caught_up" in event_names(out)
    assert c.handle_vote(VoteRequest(4, 3, 3, 5), 0)[0].vote_granted
    # the caught-up state survives a restart
    assert core(1, state=c.state, log=log).state.catching_up_to == CAUGHT_UP


def test_brand_new_cluster_of_wiped_voters_still_elects() -> None:
    logs = {i: MemLog() for i in (1, 2, 3)}
    cs = {i: core(i, state=initial_state(None, logs[i]), log=logs[i]) for i in (1, 2, 3)}
    out = cs[1].tick(2 * T)
    for s in of(out, SendVote):
        resp, _ = cs[s.to].handle_vote(s.request, 0)
        out2 = cs[1].handle_vote_response(resp, 0)
        for s2 in of(out2, SendVote):
            r2, _ = cs[s2.to].handle_vote(s2.request, 0)
            cs[1].handle_vote_response(r2, 0)
    assert cs[1].is_leader and cs[1].state.catching_up_to == CAUGHT_UP


# -- Properties: a small random exchange --------------------------------------------------------


class _Cluster:
    """Three cores exchanging messages through a bag the test draws from."""

    def __init__(self, seed: int, voters: tuple[int, ...] = (1, 2, 3)) -> None:
        self.now = 0
        self.logs = {v: MemLog() for v in voters}
        self.cores = {
            v: core(v, voters, initial_state(None, self.logs[v]), self.logs[v], 0, seed + v)
            for v in voters
        }
        self.bag: list[tuple[str, int, int, object]] = []  # (kind, to, sender, message)
        self.leaders: dict[int, set[int]] = {}
        self.hws = {v: 0 for v in voters}
        self.committed: list[int] = []  # epochs of the committed prefix, as seen so far

    def apply(self, v: int, effects: list[Effect]) -> None:
        c, log = self.cores[v], self.logs[v]
        for e in effects:
            if isinstance(e, SendVote):
                self.bag.append(("vote", e.to, v, e.request))
            elif isinstance(e, SendBeginQuorumEpoch):
                self.bag.append(("begin", e.to, v, e.request))
            elif isinstance(e, SendEndQuorumEpoch):
                self.bag.append(("end", e.to, v, e.request))
            elif isinstance(e, AppendLeaderChange):
                log.epochs.append(e.epoch)
                self.apply(v, c.leader_appended(self.now))
            elif isinstance(e, HighWatermark):
                assert e.offset > self.hws[v]
                self.hws[v] = e.offset
                prefix = log.epochs[: e.offset]
                n = min(len(prefix), len(self.committed))
                assert prefix[:n] == self.committed[:n], "committed prefixes differ"
                if len(prefix) > len(self.committed):
                    self.committed = prefix
        if c.is_leader:
            self.leaders.setdefault(c.epoch, set()).add(v)
            assert len(self.leaders[c.epoch]) == 1, f"two leaders in epoch {c.epoch}"

    def step(self, action: int, pick: int) -> None:
        voters = sorted(self.cores)
        v = voters[pick % len(voters)]
        c = self.cores[v]
        if action == 0:  # time passes
            self.now += 150
            for u in voters:
                self.apply(u, self.cores[u].tick(self.now))
        elif action == 1 and self.bag:  # deliver one message
            kind, to, sender, msg = self.bag.pop(pick % len(self.bag))
            target = self.cores[to]
            if kind == "vote":
                resp, eff = target.handle_vote(msg, self.now)  # type: ignore[arg-type]
                self.apply(to, eff)
                self.bag.append(("vote_resp", sender, to, resp))
            elif kind == "vote_resp":
                self.apply(to, target.handle_vote_response(msg, self.now))  # type: ignore[arg-type]
            elif kind == "begin":
                self.apply(to, target.handle_begin_epoch(msg, self.now)[1])  # type: ignore[arg-type]
            elif kind == "end":
                self.apply(to, target.handle_end_epoch(msg, self.now)[1])  # type: ignore[arg-type]
        elif action == 2 and self.bag:  # drop one message
            self.bag.pop(pick % len(self.bag))
        elif action == 3 and c.is_leader:  # the leader appends a command
            self.logs[v].epochs.append(c.epoch)
            self.apply(v, c.leader_appended(self.now))
        elif action == 4 and c.fetch_target is not None:  # one fetch round trip
            self.fetch(v, c.fetch_target)

    def fetch(self, v: int, leader: int) -> None:
        c, log, lc, llog = self.cores[v], self.logs[v], self.cores[leader], self.logs[leader]
        req = FetchRequest(v, c.epoch, log.end_offset, log.last_fetched_epoch())
        d, eff = lc.handle_fetch(req, self.now)
        self.apply(leader, eff)
        resp = FetchResponse(
            d.leader_epoch,
            d.leader_id,
            d.high_watermark,
            d.log_start_offset,
            d.diverging,
            d.snapshot_id,
            d.answer is FetchAnswer.RECORDS,
            d.error,
        )
        rd, eff = c.handle_fetch_response(resp, self.now)
        self.apply(v, eff)
        if rd.action is FetchAction.TRUNCATE:
            log.truncate(rd.offset)
            self.apply(v, c.truncated(self.now))
        elif rd.action is FetchAction.APPEND:
            log.epochs += llog.epochs[req.fetch_offset :]
            self.apply(v, c.follower_appended(d.high_watermark, self.now))


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 1000),
    steps=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 50)), max_size=250),
)
def test_random_exchange_keeps_raft_safety(seed, steps) -> None:
    """At most one leader per epoch, HWs never decrease (asserted as effects arrive), committed
    prefixes agree across nodes, and persisted votes never change within an epoch."""
    cl = _Cluster(seed)
    votes: dict[tuple[int, int], int] = {}
    for action, pick in steps:
        cl.step(action, pick)
        for v, c in cl.cores.items():
            if c.voted_for != NO_VOTE:
                assert votes.setdefault((v, c.epoch), c.voted_for) == c.voted_for


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 1000))
def test_a_fair_exchange_elects_and_commits(seed) -> None:
    """Liveness sanity: delivering everything and fetching regularly elects a leader that
    commits its LeaderChange on every node."""
    cl = _Cluster(seed)
    for _ in range(60):
        cl.step(0, 0)
        while cl.bag:
            cl.step(1, 0)
        for v in sorted(cl.cores):
            cl.step(4, v - 1)
    leaders = [c for c in cl.cores.values() if c.is_leader]
    assert len(leaders) == 1
    assert all(c.high_watermark >= 1 for c in cl.cores.values())


def test_a_leader_named_by_a_voter_is_not_contact_so_pre_votes_are_still_granted() -> None:
    # Two followers of a dead leader 2 (node 1 timed out first and went back to following 2
    # because node 3 still named it): node 1 never heard from 2 since, so when node 3 times
    # out and asks, node 1 must grant, or the two send each other back to 2 forever.
    c = follower_of(2, 3, node=1)
    c.tick(F)
    c.handle_vote_response(VoteResponse(3, 3, 2, False, pre_vote=True), F)
    assert c.role is Role.FOLLOWER
    resp, _ = c.handle_vote(VoteRequest(4, 3, 3, c._log.end_offset, pre_vote=True), F + 1)
    assert resp.vote_granted


def test_an_unreachable_leader_starts_a_pre_vote_within_half_an_election_timeout() -> None:
    c = follower_of(2, 3, node=1)
    out = c.leader_unreachable(10)
    assert of(out, Event)[0].name == "quorum_leader_unreachable"
    assert c.role is Role.FOLLOWER
    # A voter that only lost its transport to the leader grants pre-votes at once.
    resp, _ = c.handle_vote(VoteRequest(4, 3, 3, c._log.end_offset, pre_vote=True), 11)
    assert resp.vote_granted
    c.tick(10 + T // 2)
    assert c.role is Role.PROSPECTIVE
    # Told again later it changes nothing; a leader or a prospective ignores it.
    assert c.leader_unreachable(10 + T) == []


def test_an_unreachable_leader_is_forgotten_once_it_answers_again() -> None:
    c = follower_of(2, 3, node=1)
    c.leader_unreachable(10)
    c.handle_begin_epoch(BeginQuorumEpochRequest(3, 2), 12)
    assert c.role is Role.FOLLOWER
    c.tick(12 + T // 2)
    assert c.role is Role.FOLLOWER, "the leader spoke: the full fetch timeout applies again"


def test_the_leader_resends_begin_epoch_to_a_voter_that_never_fetched() -> None:
    c = core(1)
    elect(c)
    for v in c._others:
        if v != 3:
            c.handle_fetch(
                FetchRequest(v, c.epoch, c._log.end_offset, c._log.last_fetched_epoch()), 10
            )
    out = c.tick(F // 2)
    assert [e.to for e in of(out, SendBeginQuorumEpoch)] == [3]
    assert of(c.tick(F // 2 + 1), SendBeginQuorumEpoch) == []


def test_an_epoch_reply_from_a_later_epoch_ends_the_leadership() -> None:
    c = core(1)
    elect(c)
    epoch = c.epoch
    out = c.handle_epoch_reply(3, EpochReply(epoch + 1, NO_LEADER, "FENCED_LEADER_EPOCH"), 5)
    assert c.role is Role.UNATTACHED and c.epoch == epoch + 1
    assert of(out, PersistState)[0].state.epoch == epoch + 1
    # An older or equal epoch changes nothing.
    d = core(1)
    elect(d)
    assert d.handle_epoch_reply(3, EpochReply(d.epoch, 1, ""), 5) == []
    assert d.is_leader


def test_a_leader_reports_no_high_watermark_until_its_own_epoch_commits() -> None:
    c, _log = leader_with([1, 1, 1, 1, 1])  # five records of epoch 1, LeaderChange at 5
    d, _ = c.handle_fetch(FetchRequest(2, c.epoch, 0, 0), 1)
    assert d.high_watermark == -1 and c.reported_high_watermark == -1
    # Voter 3 holds everything: a majority has the LeaderChange, the HW is known.
    c.handle_fetch(FetchRequest(3, c.epoch, 6, c.epoch), 2)
    d, _ = c.handle_fetch(FetchRequest(2, c.epoch, 0, 0), 3)
    assert d.high_watermark == 6 == c.reported_high_watermark


def test_a_wiped_follower_takes_no_catch_up_target_from_an_unknown_high_watermark() -> None:
    c = core(2, state=initial_state(None, MemLog()), log=MemLog())
    c.handle_begin_epoch(BeginQuorumEpochRequest(3, 1), 0)
    assert c.state.catching_up_to == CATCH_UP_UNKNOWN
    c.handle_fetch_response(FetchResponse(3, 1, -1, 0), 1)
    assert c.state.catching_up_to == CATCH_UP_UNKNOWN, "-1 is no target"
    c.handle_fetch_response(FetchResponse(3, 1, 6, 0), 2)
    assert c.state.catching_up_to == 6


def test_a_wiped_follower_that_holds_the_leaders_leader_change_is_caught_up() -> None:
    # The leader's HW is unknown (its LeaderChange at offset 3 has not committed): the follower
    # that has appended records 0..3 (3 being the LeaderChange of epoch 4) holds everything
    # committed before epoch 4, and nothing of epoch 4 is committed yet.
    log = MemLog()
    c = core(2, state=initial_state(None, log), log=log)
    c.handle_begin_epoch(BeginQuorumEpochRequest(4, 1), 0)
    c.handle_fetch_response(FetchResponse(4, 1, -1, 0, has_records=True), 1)
    log.epochs.extend([1, 1, 2])
    c.follower_appended(-1, 2)
    assert c.state.catching_up_to == CATCH_UP_UNKNOWN, "no record of epoch 4 yet"
    log.epochs.append(4)
    c.follower_appended(-1, 3)
    assert c.state.catching_up_to == CAUGHT_UP


def test_a_follower_whose_whole_log_predates_the_leaders_diverges_from_the_start() -> None:
    # The leader's log begins with epoch 2 (no snapshot); the follower holds one record of
    # epoch 1: everything it has diverges, and the answer must say where (0), never (-1, -1).
    c, _log = leader_with([2, 2], voters=(1, 2, 3))
    d, _ = c.handle_fetch(FetchRequest(2, c.epoch, 1, 1), 1)
    assert d.answer is FetchAnswer.DIVERGING
    assert d.diverging == OffsetAndEpoch(0, 0)
    follower = follower_of(1, c.epoch, node=2, log=MemLog([1]))
    decision, _ = follower.handle_fetch_response(
        FetchResponse(c.epoch, 1, -1, 0, diverging=d.diverging), 2
    )
    assert decision.action is FetchAction.TRUNCATE and decision.offset == 0
