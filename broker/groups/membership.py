"""Kafka's classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups).

Two parts:
- `ClassicGroups`, the pure core: Kafka's ClassicGroup plus GroupMetadataManager's classic
  join/sync/heartbeat/leave rules (group-coordinator/.../classic/ClassicGroup.java,
  GroupMetadataManager.java). No I/O, no asyncio: every call takes the time in ms; answers that
  cannot be given at once (a JoinGroup waiting for the rebalance, a SyncGroup waiting for the
  leader) are named by an opaque waiter and come out later as `Reply` effects; a group record to
  persist comes out as a `Store` effect whose outcome the shell hands back (`stored`). Timers
  are deadlines: `next_deadline()` and `tick(now)`.
- `Membership`, the shell (event-loop thread): futures for the waiters, one `call_later` for the
  earliest deadline, `coordinator.store_group` for the stores. G1's coordinator builds it.
"""

from __future__ import annotations

import asyncio
import enum
import heapq
import itertools
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from minibroker.broker.groups.records import GroupMetadataValue, MemberMetadata

if TYPE_CHECKING:
    from minibroker.broker.groups.coordinator import GroupCoordinator

log = logging.getLogger(__name__)

# The kinds of deadline, in the order they fire when due at the same time.
_PENDING_JOIN, _HEARTBEAT, _JOIN, _SYNC = range(4)
# At most this many deadlines fire per tick (the shell ticks again at once for the rest).
_FIRES_PER_TICK = 10_000


class Code(enum.IntEnum):
    """Kafka's error codes the group protocol answers (the same numbers as Kafka's Errors)."""

    NONE = 0
    UNKNOWN_SERVER_ERROR = -1
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26
    REBALANCE_IN_PROGRESS = 27
    GROUP_AUTHORIZATION_FAILED = 30
    INVALID_REQUEST = 42
    NON_EMPTY_GROUP = 68
    GROUP_ID_NOT_FOUND = 69
    MEMBER_ID_REQUIRED = 79
    GROUP_MAX_SIZE_REACHED = 81
    FENCED_INSTANCE_ID = 82


class State(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


# ClassicGroupState's valid previous states.
_VALID_PREVIOUS: dict[State, frozenset[State]] = {
    State.EMPTY: frozenset({State.PREPARING_REBALANCE}),
    State.PREPARING_REBALANCE: frozenset({State.STABLE, State.COMPLETING_REBALANCE, State.EMPTY}),
    State.COMPLETING_REBALANCE: frozenset({State.PREPARING_REBALANCE}),
    State.STABLE: frozenset({State.COMPLETING_REBALANCE}),
    State.DEAD: frozenset(State),
}

UNKNOWN_MEMBER = ""
NO_LEADER = ""
# The longest string the group record holds (a classic STRING: int16 length, UTF-8 bytes).
MAX_STRING_BYTES = 32767
# What a generated member id keeps of its prefix (the client id or group instance id).
_MAX_MEMBER_ID_PREFIX_BYTES = 255


def _too_long(text: str | None) -> bool:
    if text is None or len(text) <= MAX_STRING_BYTES // 4:
        return False  # at most 4 UTF-8 bytes a character: short enough without encoding
    return len(text.encode("utf-8", "surrogatepass")) > MAX_STRING_BYTES


def _cap(prefix: str, limit: int = _MAX_MEMBER_ID_PREFIX_BYTES) -> str:
    raw = prefix.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return prefix
    return raw[:limit].decode("utf-8", "ignore")  # cut at a character boundary


@dataclass(frozen=True)
class GroupConfig:
    """Kafka's group.* broker configs (the classic protocol's)."""

    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1800000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    max_size: int = 2147483647  # group.max.size
    # Kafka's classicGroupNewMemberJoinTimeoutMs: how long a new member may take to rejoin.
    new_member_join_timeout_ms: int = 300000


@dataclass(frozen=True)
class JoinRequest:
    group_id: str
    member_id: str
    instance_id: str | None
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]  # (name, metadata), in the member's preference
    session_timeout: int
    rebalance_timeout: int
    client_id: str = ""
    client_host: str = ""
    requires_known_member_id: bool = True  # JoinGroup v4+ (KIP-394)
    supports_skip_assignment: bool = True  # JoinGroup v9+


@dataclass(frozen=True)
class JoinMember:
    member_id: str
    instance_id: str | None
    metadata: bytes


@dataclass(frozen=True)
class JoinResult:
    error: int
    member_id: str
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = NO_LEADER
    members: tuple[JoinMember, ...] = ()
    skip_assignment: bool = False


@dataclass(frozen=True)
class SyncResult:
    error: int
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


@dataclass(frozen=True)
class DescribedMember:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class Described:
    error: int
    state: str
    protocol_type: str
    protocol: str
    members: tuple[DescribedMember, ...]


@dataclass(frozen=True)
class Reply:
    waiter: Any
    result: JoinResult | SyncResult


@dataclass(frozen=True)
class Store:
    """Persist `value` (the group's record) and hand the outcome to `stored(token, ...)`."""

    group_id: str
    value: GroupMetadataValue
    token: Any


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""
    join_waiter: Any = None
    sync_waiter: Any = None
    is_new: bool = False
    heartbeat_deadline: int | None = None

    def metadata(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def vote(self, candidates: set[str]) -> str:
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError("member supports none of the candidate protocols")

    def satisfied_heartbeat(self) -> bool:
        if self.is_new:
            return False
        return self.join_waiter is not None or self.sync_waiter is not None


@dataclass
class Group:
    group_id: str
    now: int
    state: State = State.EMPTY
    previous_state: State | None = None
    state_timestamp: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation: int = 0
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending_join: dict[str, int] = field(default_factory=dict)  # member id -> deadline
    pending_sync: set[str] = field(default_factory=set)
    new_member_added: bool = False
    # the join timer: (deadline, delay, remaining) for InitialDelayedJoin, delay -1 otherwise
    join_deadline: tuple[int, int, int] | None = None
    sync_deadline: tuple[int, int] | None = None  # (deadline, generation)

    def transition(self, to: State, now: int) -> None:
        if self.state not in _VALID_PREVIOUS[to]:
            raise AssertionError(f"group {self.group_id}: {self.state} -> {to} is not valid")
        self.previous_state = self.state
        self.state = to
        self.state_timestamp = now

    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS[State.PREPARING_REBALANCE]

    def awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.join_waiter is not None)

    def all_joined(self) -> bool:
        return len(self.members) == self.awaiting_join() and not self.pending_join

    def rebalance_timeout(self) -> int:
        return max((m.rebalance_timeout for m in self.members.values()), default=0)

    def supported_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for m in self.members.values():
            for name in {n for n, _ in m.protocols}:
                counts[name] = counts.get(name, 0) + 1
        return counts

    def supports(self, protocol_type: str, protocols: Iterable[str]) -> bool:
        names = set(protocols)
        if self.state is State.EMPTY:
            return bool(protocol_type) and bool(names)
        counts = self.supported_counts()
        return self.protocol_type == protocol_type and any(
            counts.get(n, 0) == len(self.members) for n in names
        )

    def select_protocol(self) -> str:
        counts = self.supported_counts()
        candidates = {n for n, c in counts.items() if c == len(self.members)}
        votes: dict[str, int] = {}
        for m in self.members.values():  # ties: the first voted, in member order
            name = m.vote(candidates)
            votes[name] = votes.get(name, 0) + 1
        return max(votes, key=lambda n: votes[n])

    def validate_member(self, member_id: str, instance_id: str | None) -> int:
        if instance_id is not None:
            existing = self.static_members.get(instance_id)
            if existing is None:
                return Code.UNKNOWN_MEMBER_ID
            if existing != member_id:
                return Code.FENCED_INSTANCE_ID
        if member_id not in self.members:
            return Code.UNKNOWN_MEMBER_ID
        return Code.NONE

    def add(self, member: Member) -> None:
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.pending_join.pop(member.member_id, None)

    def remove(self, member_id: str) -> None:
        removed = self.members.pop(member_id, None)
        if removed is not None and removed.instance_id is not None:
            self.static_members.pop(removed.instance_id, None)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_join.pop(member_id, None)
        self.pending_sync.discard(member_id)

    def join_members(self) -> tuple[JoinMember, ...]:
        return tuple(
            JoinMember(m.member_id, m.instance_id, m.metadata(self.protocol_name))
            for m in self.members.values()
        )

    def value(self, assignment: dict[str, bytes] | None = None) -> GroupMetadataValue:
        return GroupMetadataValue(
            protocol_type=self.protocol_type or "",
            generation=self.generation,
            protocol=self.protocol_name,
            leader=self.leader_id,
            current_state_timestamp=self.state_timestamp,
            members=tuple(
                MemberMetadata(
                    member_id=m.member_id,
                    group_instance_id=m.instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    rebalance_timeout=m.rebalance_timeout,
                    session_timeout=m.session_timeout,
                    subscription=m.metadata(self.protocol_name),
                    assignment=(
                        assignment.get(m.member_id, b"") if assignment is not None else m.assignment
                    ),
                )
                for m in self.members.values()
            ),
        )


def _new_member_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4()}"


class ClassicGroups:
    """The pure core. Every public call appends its delayed answers and stores to the effects
    that `drain()` hands out."""

    def __init__(self, config: GroupConfig, new_id: Callable[[str], str] = _new_member_id) -> None:
        self.config = config
        self.groups: dict[str, Group] = {}
        self._new_id = new_id
        self._effects: list[Reply | Store] = []
        # (deadline, kind, seq, group, member id): every deadline set, stale ones dropped when
        # they reach the top (lazy deletion), so setting one costs O(log n).
        self._deadlines: list[tuple[int, int, int, Group, str]] = []
        self._seq = itertools.count()
        self._compact_at = 1024

    def _watch(self, deadline: int, kind: int, group: Group, member_id: str = "") -> None:
        heapq.heappush(self._deadlines, (deadline, kind, next(self._seq), group, member_id))
        if len(self._deadlines) > 2 * self._compact_at:
            # Stale entries (each heartbeat leaves one) are dropped in one pass, amortized O(1).
            self._deadlines = [e for e in self._deadlines if self._live(e)]
            heapq.heapify(self._deadlines)
            self._compact_at = max(len(self._deadlines), 1024)

    def _live(self, entry: tuple[int, int, int, Group, str]) -> bool:
        deadline, kind, _, group, member_id = entry
        if self.groups.get(group.group_id) is not group:
            return False
        if kind == _PENDING_JOIN:
            return group.pending_join.get(member_id) == deadline
        if kind == _HEARTBEAT:
            member = group.members.get(member_id)
            return member is not None and member.heartbeat_deadline == deadline
        if kind == _JOIN:
            return group.join_deadline is not None and group.join_deadline[0] == deadline
        return group.sync_deadline is not None and group.sync_deadline[0] == deadline

    def _set_join_deadline(self, group: Group, deadline: tuple[int, int, int]) -> None:
        group.join_deadline = deadline
        self._watch(deadline[0], _JOIN, group)

    def _set_sync_deadline(self, group: Group, deadline: tuple[int, int]) -> None:
        group.sync_deadline = deadline
        self._watch(deadline[0], _SYNC, group)

    def drain(self) -> list[Reply | Store]:
        out, self._effects = self._effects, []
        return out

    # -- answering waiters ----------------------------------------------------------------

    def _complete_join(self, member: Member, result: JoinResult) -> None:
        if member.join_waiter is not None:
            self._effects.append(Reply(member.join_waiter, result))
            member.join_waiter = None

    def _complete_sync(self, member: Member, result: SyncResult) -> bool:
        if member.sync_waiter is not None:
            self._effects.append(Reply(member.sync_waiter, result))
            member.sync_waiter = None
            return True
        return False

    def _reschedule(
        self, group: Group, member: Member, now: int, timeout: int | None = None
    ) -> None:
        member.heartbeat_deadline = now + (member.session_timeout if timeout is None else timeout)
        self._watch(member.heartbeat_deadline, _HEARTBEAT, group, member.member_id)

    # -- JoinGroup ------------------------------------------------------------------------

    def join(self, req: JoinRequest, now: int, waiter: Any) -> JoinResult | None:
        """The answer now, or None: it comes later as a Reply to `waiter`."""
        if not req.group_id:
            return JoinResult(Code.INVALID_GROUP_ID, req.member_id)
        if (
            any(_too_long(t) for t in (req.group_id, req.member_id, req.instance_id))
            or any(_too_long(t) for t in (req.protocol_type, req.client_id, req.client_host))
            or any(_too_long(name) for name, _ in req.protocols)
        ):
            # The group's record could not be written: refused before anything changes.
            return JoinResult(Code.INVALID_REQUEST, UNKNOWN_MEMBER)
        if not (
            self.config.min_session_timeout_ms
            <= req.session_timeout
            <= self.config.max_session_timeout_ms
        ):
            return JoinResult(Code.INVALID_SESSION_TIMEOUT, req.member_id)
        unknown = req.member_id == UNKNOWN_MEMBER
        group = self.groups.get(req.group_id)
        if group is None:
            if not unknown:
                return JoinResult(Code.UNKNOWN_MEMBER_ID, req.member_id)
            group = self.groups[req.group_id] = Group(req.group_id, now, state_timestamp=now)
        if not self._accept(group, req.member_id):
            group.remove(req.member_id)
            self._forget_if_unused(group)
            return JoinResult(Code.GROUP_MAX_SIZE_REACHED, UNKNOWN_MEMBER)
        names = [n for n, _ in req.protocols]
        if group.state is State.DEAD:
            return JoinResult(Code.COORDINATOR_NOT_AVAILABLE, req.member_id)
        if not group.supports(req.protocol_type, names):
            self._forget_if_unused(group)
            return JoinResult(Code.INCONSISTENT_GROUP_PROTOCOL, req.member_id)
        if unknown:
            return self._join_new(group, req, now, waiter)
        return self._join_existing(group, req, now, waiter)

    def _forget_if_unused(self, group: Group) -> None:
        # A group created by a refused join is not kept (Kafka reverts its creation).
        fresh = group.generation == 0 and group.protocol_type is None
        if group.state is State.EMPTY and not group.members and not group.pending_join and fresh:
            self.groups.pop(group.group_id, None)

    def _accept(self, group: Group, member_id: str) -> bool:
        limit = self.config.max_size
        if group.state in (State.EMPTY, State.DEAD):
            return True
        member = group.members.get(member_id)
        if group.state is State.PREPARING_REBALANCE:
            return (member is not None and member.join_waiter is not None) or (
                group.awaiting_join() < limit
            )
        return member is not None or len(group.members) < limit

    def _join_new(self, group: Group, req: JoinRequest, now: int, waiter: Any) -> JoinResult | None:
        new_id = self._new_id(
            _cap(req.instance_id if req.instance_id is not None else req.client_id)
        )
        if req.instance_id is not None:
            existing = group.static_members.get(req.instance_id)
            if existing is not None:
                return self._replace_static(group, req, existing, new_id, now, waiter)
            return self._add_member(group, req, new_id, now, waiter)
        if req.requires_known_member_id:
            group.pending_join[new_id] = now + req.session_timeout
            self._watch(now + req.session_timeout, _PENDING_JOIN, group, new_id)
            return JoinResult(Code.MEMBER_ID_REQUIRED, new_id)
        return self._add_member(group, req, new_id, now, waiter)

    def _join_existing(
        self, group: Group, req: JoinRequest, now: int, waiter: Any
    ) -> JoinResult | None:
        member_id = req.member_id
        if member_id in group.pending_join:
            return self._add_member(group, req, member_id, now, waiter)
        error = group.validate_member(member_id, req.instance_id)
        if error != Code.NONE:
            return JoinResult(error, member_id)
        member = group.members[member_id]
        if group.state is State.PREPARING_REBALANCE:
            return self._update_member(group, member, req, now, waiter)
        if group.state is State.COMPLETING_REBALANCE:
            if member.protocols == req.protocols:
                return self._current_generation(group, member_id, leader_members=True)
            return self._update_member(group, member, req, now, waiter)
        if group.state is State.STABLE:
            if group.leader_id == member_id or member.protocols != req.protocols:
                return self._update_member(group, member, req, now, waiter)
            return self._current_generation(group, member_id, leader_members=False)
        return JoinResult(Code.UNKNOWN_MEMBER_ID, member_id)  # Empty: rejoin from scratch

    def _current_generation(self, group: Group, member_id: str, leader_members: bool) -> JoinResult:
        is_leader = group.leader_id == member_id
        return JoinResult(
            Code.NONE,
            member_id,
            generation=group.generation,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader=group.leader_id or NO_LEADER,
            members=group.join_members() if (leader_members and is_leader) else (),
        )

    def _add_member(
        self, group: Group, req: JoinRequest, member_id: str, now: int, waiter: Any
    ) -> JoinResult | None:
        member = Member(
            member_id=member_id,
            instance_id=req.instance_id,
            client_id=req.client_id,
            client_host=req.client_host,
            rebalance_timeout=req.rebalance_timeout,
            session_timeout=req.session_timeout,
            protocol_type=req.protocol_type,
            protocols=req.protocols,
            join_waiter=waiter,
            is_new=True,
        )
        if group.state is State.PREPARING_REBALANCE and group.previous_state is State.EMPTY:
            group.new_member_added = True
        group.add(member)
        self._reschedule(group, member, now, self.config.new_member_join_timeout_ms)
        self._rebalance_or_complete(group, now)
        return None

    def _update_member(
        self, group: Group, member: Member, req: JoinRequest, now: int, waiter: Any
    ) -> JoinResult | None:
        member.protocols = req.protocols
        member.rebalance_timeout = req.rebalance_timeout
        member.session_timeout = req.session_timeout
        if member.join_waiter is not None and member.join_waiter is not waiter:
            # Kafka's updateMember replaces the future; the old request gets no answer there,
            # here it is told to rejoin (a client has at most one JoinGroup in flight anyway).
            self._complete_join(member, JoinResult(Code.REBALANCE_IN_PROGRESS, member.member_id))
        member.join_waiter = waiter
        self._rebalance_or_complete(group, now)
        return None

    def _replace_static(
        self,
        group: Group,
        req: JoinRequest,
        old_id: str,
        new_id: str,
        now: int,
        waiter: Any,
    ) -> JoinResult | None:
        """KIP-345: a static member rejoining with an empty member id takes its old place; the
        old id is fenced. In Stable with the same selected protocol there is no rebalance."""
        old = group.members.pop(old_id)
        self._complete_join(old, JoinResult(Code.FENCED_INSTANCE_ID, old_id, leader=NO_LEADER))
        self._complete_sync(old, SyncResult(Code.FENCED_INSTANCE_ID))
        member = Member(
            member_id=new_id,
            instance_id=old.instance_id,
            client_id=old.client_id,
            client_host=old.client_host,
            rebalance_timeout=req.rebalance_timeout,
            session_timeout=req.session_timeout,
            protocol_type=old.protocol_type,
            protocols=req.protocols,
            assignment=old.assignment,
            join_waiter=waiter,
        )
        group.members[new_id] = member
        assert req.instance_id is not None
        group.static_members[req.instance_id] = new_id
        if group.leader_id == old_id:
            group.leader_id = new_id
        if old_id in group.pending_sync:
            group.pending_sync.discard(old_id)
            group.pending_sync.add(new_id)
        self._reschedule(group, member, now)
        if group.state is State.STABLE:
            if group.protocol_name == group.select_protocol():
                token = ("static", group.group_id, group.generation, new_id, old, req)
                self._effects.append(Store(group.group_id, group.value(), token))
                return None
            self._rebalance_or_complete(group, now)
            return None
        if group.state is State.COMPLETING_REBALANCE:
            self._prepare_rebalance(group, now)
            return None
        self._maybe_complete_join_phase(group, now)
        return None

    def _static_stored(self, token: tuple[Any, ...], error: int, now: int) -> None:
        _, group_id, _generation, new_id, old, req = token
        group = self.groups.get(group_id)
        if group is None or new_id not in group.members:
            return
        member = group.members[new_id]
        if error != Code.NONE:
            # Revert to the old member id; the rejoining member is told the store's error.
            waiter = member.join_waiter
            member.join_waiter = None
            del group.members[new_id]
            old.join_waiter = None
            old.sync_waiter = None
            group.members[old.member_id] = old
            group.static_members[req.instance_id] = old.member_id
            if group.leader_id == new_id:
                group.leader_id = old.member_id
            self._reschedule(group, old, now)
            self._effects.append(
                Reply(
                    waiter,
                    JoinResult(
                        error,
                        UNKNOWN_MEMBER,
                        generation=group.generation,
                        protocol_type=group.protocol_type,
                        protocol_name=group.protocol_name,
                        leader=group.leader_id or NO_LEADER,
                    ),
                )
            )
            return
        is_leader = group.leader_id == new_id
        skip = req.supports_skip_assignment and is_leader
        self._complete_join(
            member,
            JoinResult(
                Code.NONE,
                new_id,
                generation=group.generation,
                protocol_type=group.protocol_type,
                protocol_name=group.protocol_name,
                leader=group.leader_id or NO_LEADER,
                members=group.join_members() if skip else (),
                skip_assignment=skip,
            ),
        )

    # -- rebalance ------------------------------------------------------------------------

    def _rebalance_or_complete(self, group: Group, now: int) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group, now)
        else:
            self._maybe_complete_join_phase(group, now)

    def _maybe_complete_join_phase(self, group: Group, now: int) -> None:
        if group.state is not State.PREPARING_REBALANCE:
            return
        if group.previous_state is State.EMPTY:
            return  # the initial rebalance completes on its delayed join
        if group.all_joined():
            self._complete_join_phase(group, now)

    def _prepare_rebalance(self, group: Group, now: int) -> None:
        if group.state is State.COMPLETING_REBALANCE:
            self._reset_and_propagate(group, Code.REBALANCE_IN_PROGRESS, now)
        group.pending_sync.clear()
        group.sync_deadline = None
        initial = group.state is State.EMPTY
        if initial:
            delay = self.config.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout() - delay, 0)
            self._set_join_deadline(group, (now + delay, delay, remaining))
        group.transition(State.PREPARING_REBALANCE, now)
        if not initial:
            if group.all_joined():
                self._complete_join_phase(group, now)
            else:
                self._set_join_deadline(group, (now + group.rebalance_timeout(), -1, 0))

    def _initial_delay_expired(self, group: Group, delay: int, remaining: int, now: int) -> None:
        """Kafka's InitialDelayedJoin: while new members keep coming, wait another delay, up to
        the rebalance timeout in all."""
        if group.new_member_added and remaining != 0:
            group.new_member_added = False
            new_delay = min(self.config.initial_rebalance_delay_ms, remaining)
            new_remaining = max(remaining - delay, 0)
            self._set_join_deadline(group, (now + new_delay, new_delay, new_remaining))
        else:
            self._complete_join_phase(group, now)

    def _complete_join_phase(self, group: Group, now: int) -> None:
        group.join_deadline = None
        for member in list(group.members.values()):
            if member.join_waiter is None and member.instance_id is None:
                group.remove(member.member_id)
        if group.state is State.DEAD:
            return
        if not self._elect_joined_leader(group) and group.members:
            self._set_join_deadline(group, (now + group.rebalance_timeout(), -1, 0))
            return
        group.generation += 1
        if group.members:
            group.protocol_name = group.select_protocol()
            group.transition(State.COMPLETING_REBALANCE, now)
        else:
            group.protocol_name = None
            group.transition(State.EMPTY, now)
        group.pending_sync.clear()
        if group.state is State.EMPTY:
            self._effects.append(Store(group.group_id, group.value(), ("empty", group.group_id)))
            return
        for member in group.members.values():
            is_leader = group.leader_id == member.member_id
            self._complete_join(
                member,
                JoinResult(
                    Code.NONE,
                    member.member_id,
                    generation=group.generation,
                    protocol_type=group.protocol_type,
                    protocol_name=group.protocol_name,
                    leader=group.leader_id or NO_LEADER,
                    members=group.join_members() if is_leader else (),
                ),
            )
            self._reschedule(group, member, now)
            member.is_new = False
            group.pending_sync.add(member.member_id)
        self._set_sync_deadline(group, (now + group.rebalance_timeout(), group.generation))

    def _elect_joined_leader(self, group: Group) -> bool:
        if group.leader_id is None:
            return False
        leader = group.members[group.leader_id]
        if leader.join_waiter is not None:
            return True
        for member in group.members.values():
            if member.join_waiter is not None:
                group.leader_id = member.member_id
                return True
        return False

    def _reset_and_propagate(self, group: Group, error: int, now: int) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate(group, error, now)

    def _propagate(self, group: Group, error: int, now: int) -> None:
        ok = error == Code.NONE
        for member in group.members.values():
            answered = self._complete_sync(
                member,
                SyncResult(
                    error,
                    protocol_type=group.protocol_type if ok else None,
                    protocol_name=group.protocol_name if ok else None,
                    assignment=member.assignment,
                ),
            )
            if answered:
                self._reschedule(group, member, now)

    # -- SyncGroup ------------------------------------------------------------------------

    def sync(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
        now: int,
        waiter: Any,
    ) -> SyncResult | None:
        group = self.groups.get(group_id)
        if group is None:
            return SyncResult(Code.UNKNOWN_MEMBER_ID)
        if group.state is State.DEAD:
            return SyncResult(Code.COORDINATOR_NOT_AVAILABLE)
        error = group.validate_member(member_id, instance_id)
        if error != Code.NONE:
            return SyncResult(error)
        if generation != group.generation:
            return SyncResult(Code.ILLEGAL_GENERATION)
        if _inconsistent(protocol_type, group.protocol_type) or _inconsistent(
            protocol_name, group.protocol_name
        ):
            return SyncResult(Code.INCONSISTENT_GROUP_PROTOCOL)
        if group.state is State.PREPARING_REBALANCE:
            return SyncResult(Code.REBALANCE_IN_PROGRESS)
        member = group.members[member_id]
        if group.state is State.COMPLETING_REBALANCE:
            if member.sync_waiter is not None and member.sync_waiter is not waiter:
                # A resent SyncGroup replaces the waiting one, told to rejoin (as JoinGroup).
                self._complete_sync(member, SyncResult(Code.REBALANCE_IN_PROGRESS))
            member.sync_waiter = waiter
            self._remove_pending_sync(group, member_id)
            if group.leader_id == member_id:
                full = {m: assignments.get(m, b"") for m in group.members}
                token = ("sync", group_id, group.generation, full)
                self._effects.append(Store(group_id, group.value(full), token))
            return None
        if group.state is State.STABLE:
            self._remove_pending_sync(group, member_id)
            return SyncResult(
                Code.NONE, group.protocol_type, group.protocol_name, member.assignment
            )
        return SyncResult(Code.UNKNOWN_MEMBER_ID)  # Empty: a member of no generation

    def _remove_pending_sync(self, group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            group.sync_deadline = None

    def stored(self, token: Any, error: int, now: int) -> None:
        """The outcome of a Store effect."""
        kind = token[0]
        if kind == "static":
            self._static_stored(token, error, now)
            return
        if kind != "sync":
            return  # an Empty group's record: nothing waits on it
        _, group_id, generation, assignment = token
        group = self.groups.get(group_id)
        if group is None or group.state is not State.COMPLETING_REBALANCE:
            return
        if group.generation != generation:
            return
        if error != Code.NONE:
            self._reset_and_propagate(group, error, now)
            self._rebalance_or_complete(group, now)
            return
        for member in group.members.values():
            member.assignment = assignment.get(member.member_id, b"")
        self._propagate(group, Code.NONE, now)
        group.transition(State.STABLE, now)

    # -- Heartbeat ------------------------------------------------------------------------

    def heartbeat(
        self, group_id: str, member_id: str, generation: int, instance_id: str | None, now: int
    ) -> int:
        group = self.groups.get(group_id)
        if group is None:
            return Code.UNKNOWN_MEMBER_ID
        if group.state is State.DEAD:
            return Code.COORDINATOR_NOT_AVAILABLE
        error = group.validate_member(member_id, instance_id)
        if error != Code.NONE:
            return error
        if generation != group.generation:
            return Code.ILLEGAL_GENERATION
        if group.state is State.EMPTY:
            return Code.UNKNOWN_MEMBER_ID
        self._reschedule(group, group.members[member_id], now)
        if group.state is State.PREPARING_REBALANCE:
            return Code.REBALANCE_IN_PROGRESS
        return Code.NONE

    # -- LeaveGroup -----------------------------------------------------------------------

    def leave(
        self, group_id: str, members: Iterable[tuple[str, str | None]], now: int
    ) -> tuple[int, list[int]]:
        """(the request's error, one code per (member id, instance id))."""
        group = self.groups.get(group_id)
        wanted = list(members)
        if group is None:
            return Code.NONE, [Code.UNKNOWN_MEMBER_ID] * len(wanted)
        if group.state is State.DEAD:
            return Code.COORDINATOR_NOT_AVAILABLE, []
        codes: list[int] = []
        for member_id, instance_id in wanted:
            if member_id == UNKNOWN_MEMBER:
                if instance_id is not None and instance_id in group.static_members:
                    self._remove_current(group, group.static_members[instance_id])
                    codes.append(Code.NONE)
                else:
                    codes.append(Code.UNKNOWN_MEMBER_ID)
            elif member_id in group.pending_join:
                group.remove(member_id)
                codes.append(Code.NONE)
            else:
                error = group.validate_member(member_id, instance_id)
                if error == Code.NONE:
                    self._remove_current(group, member_id)
                codes.append(error)
        if any(c == Code.NONE for c in codes):
            if group.state in (State.STABLE, State.COMPLETING_REBALANCE):
                self._rebalance_or_complete(group, now)
            elif group.state is State.PREPARING_REBALANCE:
                self._maybe_complete_join_phase(group, now)
        return Code.NONE, codes

    def _remove_current(self, group: Group, member_id: str) -> None:
        member = group.members[member_id]
        self._complete_join(member, JoinResult(Code.UNKNOWN_MEMBER_ID, UNKNOWN_MEMBER))
        group.remove(member_id)

    # -- timers ---------------------------------------------------------------------------

    def next_deadline(self) -> int | None:
        heap = self._deadlines
        while heap and not self._live(heap[0]):
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def tick(self, now: int) -> None:
        """Fire every deadline at or before `now` (also those that firing sets at or before
        `now`, such as a zero initial delay extended), up to _FIRES_PER_TICK of them."""
        heap = self._deadlines
        fired = 0
        while heap and heap[0][0] <= now and fired < _FIRES_PER_TICK:
            entry = heapq.heappop(heap)
            if self._live(entry):
                fired += 1
                self._fire(entry, now)

    def _fire(self, entry: tuple[int, int, int, Group, str], now: int) -> None:
        _, kind, _, group, member_id = entry
        if kind == _PENDING_JOIN:
            group.remove(member_id)
            if group.state is State.PREPARING_REBALANCE and group.all_joined():
                self._complete_join_phase(group, now)
        elif kind == _HEARTBEAT:
            member = group.members[member_id]
            member.heartbeat_deadline = None
            if not member.satisfied_heartbeat():
                self._expire_member(group, member, now)
        elif kind == _JOIN:
            assert group.join_deadline is not None
            _, delay, remaining = group.join_deadline
            group.join_deadline = None
            if delay >= 0:
                self._initial_delay_expired(group, delay, remaining, now)
            else:
                self._complete_join_phase(group, now)
        else:
            assert group.sync_deadline is not None
            _, generation = group.sync_deadline
            group.sync_deadline = None
            self._expire_pending_sync(group, generation, now)

    def _expire_member(self, group: Group, member: Member, now: int) -> None:
        self._complete_join(member, JoinResult(Code.UNKNOWN_MEMBER_ID, UNKNOWN_MEMBER))
        group.remove(member.member_id)
        if group.state in (State.STABLE, State.COMPLETING_REBALANCE):
            self._rebalance_or_complete(group, now)
        elif group.state is State.PREPARING_REBALANCE and group.all_joined():
            self._complete_join_phase(group, now)

    def _expire_pending_sync(self, group: Group, generation: int, now: int) -> None:
        if generation != group.generation:
            return
        if group.state in (State.COMPLETING_REBALANCE, State.STABLE) and group.pending_sync:
            for member_id in list(group.pending_sync):
                group.remove(member_id)
            self._prepare_rebalance(group, now)

    # -- what G1's coordinator asks -------------------------------------------------------

    def loaded(self, group_id: str, value: GroupMetadataValue, now: int) -> None:
        group = Group(group_id, now)
        group.protocol_type = value.protocol_type or None
        group.generation = value.generation
        group.protocol_name = value.protocol
        group.leader_id = value.leader
        group.state_timestamp = value.current_state_timestamp
        for m in value.members:
            member = Member(
                member_id=m.member_id,
                instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rebalance_timeout=m.rebalance_timeout,
                session_timeout=m.session_timeout,
                protocol_type=value.protocol_type,
                protocols=((value.protocol or "", m.subscription),),
                assignment=m.assignment,
            )
            group.members[m.member_id] = member
            if m.group_instance_id is not None:
                group.static_members[m.group_instance_id] = m.member_id
            self._reschedule(group, member, now)
        if group.members:
            group.state = State.STABLE
            group.previous_state = State.COMPLETING_REBALANCE
            if group.leader_id not in group.members:
                group.leader_id = next(iter(group.members))
        else:
            group.leader_id = None
        self.groups[group_id] = group

    def unloaded(self, group_ids: Iterable[str]) -> None:
        for group_id in group_ids:
            group = self.groups.pop(group_id, None)
            if group is not None:
                self._dead(group, Code.NOT_COORDINATOR)

    def _dead(self, group: Group, error: int) -> None:
        """The group is gone from here: every JoinGroup and SyncGroup waiting is told `error`."""
        for member in group.members.values():
            self._complete_join(member, JoinResult(error, member.member_id))
            self._complete_sync(member, SyncResult(error))
        group.state = State.DEAD

    def validate_commit(
        self, group_id: str, member_id: str, generation: int, instance_id: str | None
    ) -> int:
        group = self.groups.get(group_id)
        if group is None:
            return Code.NONE if generation < 0 else Code.ILLEGAL_GENERATION
        if group.state is State.DEAD:
            return Code.COORDINATOR_NOT_AVAILABLE
        if generation < 0 and group.state is State.EMPTY:
            return Code.NONE
        if generation >= 0 or member_id or instance_id is not None:
            error = group.validate_member(member_id, instance_id)
            if error != Code.NONE:
                return error
            if generation != group.generation:
                return Code.ILLEGAL_GENERATION
        elif group.state is not State.EMPTY:
            return Code.UNKNOWN_MEMBER_ID
        if group.state is State.COMPLETING_REBALANCE:
            return Code.REBALANCE_IN_PROGRESS
        return Code.NONE

    def state(self, group_id: str) -> tuple[str, str] | None:
        group = self.groups.get(group_id)
        if group is None:
            return None
        return group.state.value, group.protocol_type or ""

    def state_timestamp(self, group_id: str) -> int | None:
        """When the group entered its current state (ms), None if unknown (a loaded record
        without it)."""
        group = self.groups.get(group_id)
        if group is None or group.state_timestamp < 0:
            return None
        return group.state_timestamp

    def deletable(self, group_id: str) -> int:
        group = self.groups.get(group_id)
        if group is None or group.state is State.EMPTY:
            return Code.NONE
        return Code.NON_EMPTY_GROUP

    def delete(self, group_id: str) -> None:
        group = self.groups.pop(group_id, None)
        if group is not None:
            # Kafka's answer to a Dead group: find the coordinator again and rejoin.
            self._dead(group, Code.COORDINATOR_NOT_AVAILABLE)

    def describe(self, group_id: str) -> Described:
        group = self.groups.get(group_id)
        if group is None:
            return Described(Code.NONE, State.DEAD.value, "", "", ())
        stable = group.state is State.STABLE
        return Described(
            Code.NONE,
            group.state.value,
            group.protocol_type or "",
            (group.protocol_name or "") if stable else "",
            tuple(
                DescribedMember(
                    m.member_id,
                    m.instance_id,
                    m.client_id,
                    m.client_host,
                    m.metadata(group.protocol_name) if stable else b"",
                    m.assignment if stable else b"",
                )
                for m in group.members.values()
            ),
        )


def _inconsistent(asked: str | None, current: str | None) -> bool:
    return asked is not None and asked != current


# -- the shell ----------------------------------------------------------------------------


class Membership:
    """The event-loop shell around ClassicGroups (the interface G1's coordinator calls)."""

    def __init__(self, coordinator: GroupCoordinator, config: GroupConfig) -> None:
        self._coordinator = coordinator
        self.core = ClassicGroups(config)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: int | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopped = False
        self._arm_pending = False

    def _now(self) -> int:
        return int(self._coordinator.clock())

    def _after(self) -> None:
        """Deliver the core's effects and re-arm the timer for its earliest deadline."""
        if self._stopped:
            self.core.drain()
            return
        for effect in self.core.drain():
            if isinstance(effect, Reply):
                future = effect.waiter
                if isinstance(future, asyncio.Future) and not future.done():
                    future.set_result(effect.result)
            else:
                task = asyncio.get_running_loop().create_task(self._store(effect))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        self._arm()

    async def _store(self, effect: Store) -> None:
        try:
            error = int(await self._coordinator.store_group(effect.group_id, effect.value))
        except Exception:  # any failure is the store's error
            error = Code.UNKNOWN_SERVER_ERROR
        if self._stopped:
            return
        self.core.stored(effect.token, error, self._now())
        self._after()

    def _arm(self) -> None:
        deadline = self.core.next_deadline()
        if deadline == self._timer_at and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is None:
            return
        delay = max(deadline - self._now(), 0) / 1000
        self._timer = asyncio.get_running_loop().call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = None
        try:
            self.core.tick(self._now())
        except Exception:  # one bad deadline must not stop every session timer
            log.exception("group timer failed")
        finally:
            self._after()

    async def _wait(self, answer: Any, future: asyncio.Future[Any]) -> Any:
        self._after()
        if answer is not None:
            future.cancel()
            return answer
        return await future

    def stop(self) -> None:
        """Cancel the timer and the stores in flight, answer every waiter NOT_COORDINATOR and
        refuse everything after (every later call answers NOT_COORDINATOR)."""
        if self._stopped:
            return
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at = None
        for task in list(self._tasks):
            task.cancel()
        self._tasks.clear()
        self.core.unloaded(list(self.core.groups))
        for effect in self.core.drain():
            if isinstance(effect, Reply):
                future = effect.waiter
                if isinstance(future, asyncio.Future) and not future.done():
                    future.set_result(effect.result)

    def state_timestamp(self, group_id: str) -> int | None:
        return self.core.state_timestamp(group_id)

    async def join(self, request: JoinRequest) -> JoinResult:
        if self._stopped:
            return JoinResult(Code.NOT_COORDINATOR, request.member_id)
        future: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        answer = self.core.join(request, self._now(), future)
        result: JoinResult = await self._wait(answer, future)
        return result

    async def sync(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
    ) -> SyncResult:
        if self._stopped:
            return SyncResult(Code.NOT_COORDINATOR)
        future: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        answer = self.core.sync(
            group_id,
            member_id,
            generation,
            instance_id,
            protocol_type,
            protocol_name,
            assignments,
            self._now(),
            future,
        )
        result: SyncResult = await self._wait(answer, future)
        return result

    async def heartbeat(
        self, group_id: str, member_id: str, generation: int, instance_id: str | None
    ) -> int:
        if self._stopped:
            return Code.NOT_COORDINATOR
        code = self.core.heartbeat(group_id, member_id, generation, instance_id, self._now())
        self._after()
        return code

    async def leave(
        self, group_id: str, members: Iterable[tuple[str, str | None]]
    ) -> tuple[int, list[int]]:
        if self._stopped:
            return Code.NOT_COORDINATOR, []
        answer = self.core.leave(group_id, members, self._now())
        self._after()
        return answer

    async def describe(self, group_id: str) -> Described:
        if self._stopped:
            return Described(Code.NOT_COORDINATOR, State.DEAD.value, "", "", ())
        return self.core.describe(group_id)

    # G1's calls (synchronous, event-loop thread)
    def loaded(self, group_id: str, value: GroupMetadataValue) -> None:
        if self._stopped:
            return
        self.core.loaded(group_id, value, self._now())
        # Armed (and any effect delivered) once after a partition's load, not once per group.
        if not self._arm_pending:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop (tests): no timer
            self._arm_pending = True
            loop.call_soon(self._after_load)

    def _after_load(self) -> None:
        self._arm_pending = False
        self._after()

    def unloaded(self, group_ids: Iterable[str]) -> None:
        self.core.unloaded(group_ids)
        self._after_sync()

    def _after_sync(self) -> None:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.core.drain()  # no loop (tests): nobody waits
            return
        self._after()

    def validate_commit(
        self, group_id: str, member_id: str, generation: int, instance_id: str | None
    ) -> int:
        if self._stopped:
            return Code.NOT_COORDINATOR
        return self.core.validate_commit(group_id, member_id, generation, instance_id)

    def state(self, group_id: str) -> tuple[str, str] | None:
        return self.core.state(group_id)

    def deletable(self, group_id: str) -> int:
        return self.core.deletable(group_id)

    def delete(self, group_id: str) -> None:
        self.core.delete(group_id)
        self._after_sync()

    def groups(self) -> Iterable[str]:
        return list(self.core.groups)
