"""A consumer group member: Kafka's ConsumerCoordinator/AbstractCoordinator for the classic
protocol, over an injected transport (so the state machine runs against fakes in unit tests).

What it does, with Kafka's rules:
- finds the coordinator (FindCoordinator to any broker) and forgets it on NOT_COORDINATOR,
  COORDINATOR_NOT_AVAILABLE or a failed call; COORDINATOR_LOAD_IN_PROGRESS is retried on the
  same coordinator; every retry waits retry.backoff.ms and stops at the caller's deadline;
- joins (`join_round`): JoinGroup, again at once with the given member id on MEMBER_ID_REQUIRED
  (KIP-394), with an empty member id after UNKNOWN_MEMBER_ID; the leader runs the chosen
  assignor over every member's Subscription (partition counts from metadata) and sends the
  assignments in SyncGroup; REBALANCE_IN_PROGRESS / ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID from
  SyncGroup start the round again;
- heartbeats (`heartbeat_once`, called by the consumer's background task every
  heartbeat.interval.ms): REBALANCE_IN_PROGRESS asks for a rejoin, ILLEGAL_GENERATION too (the
  member id kept), UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID forget the member id; a member that
  has not polled within max.poll.interval.ms leaves the group (LeaveGroup) as Kafka's heartbeat
  thread does; no successful heartbeat within session.timeout.ms forgets the coordinator;
- commits (OffsetCommit with the generation and member id, or -1 and "" outside a group) and
  fetches committed offsets (OffsetFetch, require_stable); leaves (LeaveGroup).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from minibroker.client.errors import (
    CoordinatorNotAvailableError,
    ErrorCode,
    GroupError,
    MiniBrokerError,
    RebalanceInProgressError,
    RequestTimedOutError,
    error_for,
)
from minibroker.client.groups import kafka_call as api
from minibroker.client.groups.assignors import assignor_for
from minibroker.client.groups.protocol import (
    PROTOCOL_TYPE,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from minibroker.client.types import TopicPartition
from minibroker.client.wire import CallFailed

NO_GENERATION = -1
UNKNOWN_MEMBER = ""
# Errors after which the coordinator is looked up again (Kafka's markCoordinatorUnknown).
COORDINATOR_MOVED = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
# Errors after which the same call is tried again after a backoff.
RETRY_SAME = frozenset({ErrorCode.COORDINATOR_LOAD_IN_PROGRESS})
# OffsetFetch with require_stable while a transactional commit is pending (KIP-447).
UNSTABLE_OFFSET_COMMIT = 88


def group_error(code: int, message: str) -> MiniBrokerError:
    """The exception for a group answer's code (codes without a class: GroupError)."""
    try:
        ErrorCode(code)
    except ValueError:
        try:
            from kio.schema.errors import ErrorCode as KioErrorCode

            name = KioErrorCode(code).name.upper()
        except ValueError:
            name = f"error code {code}"
        return GroupError(f"{message}: {name}", kafka_code=code)
    if code == ErrorCode.INCONSISTENT_VOTER_SET:  # 68 is NON_EMPTY_GROUP in the group APIs
        return GroupError(f"{message}: NON_EMPTY_GROUP", kafka_code=code)
    return error_for(code, f"{message}: {ErrorCode(code).name}")


class GroupTransport(Protocol):
    async def find_coordinator(self, group_id: str, timeout_s: float) -> str:
        """The coordinator's gRPC address; raises MiniBrokerError (retriable or not)."""

    async def send(
        self, address: str, api_key: int, values: Mapping[str, Any], timeout_s: float
    ) -> Any:
        """The kio response; raises CallFailed."""


class MemberState(enum.Enum):
    UNJOINED = "unjoined"
    REBALANCING = "rebalancing"
    STABLE = "stable"


@dataclass
class GroupSettings:
    group_id: str
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    partition_assignment_strategy: Sequence[str] = ("range", "roundrobin")
    group_instance_id: str | None = None
    retry_backoff_ms: int = 100
    request_timeout_ms: int = 30_000


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    metadata: str = ""
    leader_epoch: int = -1


PartitionCounts = Callable[[Iterable[str]], Awaitable[dict[str, int]]]


class GroupMember:
    def __init__(
        self,
        settings: GroupSettings,
        transport: GroupTransport,
        clock: Callable[[], int],
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        for name in settings.partition_assignment_strategy:
            assignor_for(name)  # ValueError for an unknown one
        if not settings.partition_assignment_strategy:
            raise ValueError("partition_assignment_strategy names no assignor")
        self.settings = settings
        self.transport = transport
        self.clock = clock
        self.sleep = sleep
        self.coordinator: str | None = None
        self.member_id = UNKNOWN_MEMBER
        self.generation = NO_GENERATION
        self.protocol: str | None = None
        self.leader_id: str | None = None
        self.state = MemberState.UNJOINED
        self.rejoin_needed = True
        self.subscribed = False  # subscribe() (the group assigns) vs assign() (simple commits)
        self.assignment: list[TopicPartition] = []
        # The leader's view: every member's topics and their partition counts when it assigned.
        self.group_topics: set[str] = set()
        self.assigned_counts: dict[str, int] = {}
        now = clock()
        self.last_poll_ms = now
        self.last_heartbeat_ok_ms = now
        self.rejoin_reason = "not joined yet"

    @property
    def is_leader(self) -> bool:
        return self.leader_id is not None and self.leader_id == self.member_id

    def generation_values(self) -> tuple[int, str]:
        """(generation, member id) for an OffsetCommit: a stable member's, else -1 and ""."""
        if self.state is MemberState.STABLE:
            return self.generation, self.member_id
        return NO_GENERATION, UNKNOWN_MEMBER

    def request_rejoin(self, reason: str) -> None:
        if not self.rejoin_needed:
            self.rejoin_reason = reason
        self.rejoin_needed = True

    def reset_generation(self, forget_member_id: bool, reason: str) -> None:
        self.generation = NO_GENERATION
        self.state = MemberState.UNJOINED
        if forget_member_id:
            self.member_id = UNKNOWN_MEMBER
        self.request_rejoin(reason)

    def mark_coordinator_unknown(self) -> None:
        self.coordinator = None

    # -- calls ---------------------------------------------------------------------------------

    def _timeout_s(self, deadline_ms: int) -> float:
        left = max(1, deadline_ms - self.clock())
        return min(self.settings.request_timeout_ms, left) / 1000

    async def _backoff(self, deadline_ms: int, last: MiniBrokerError) -> None:
        if self.clock() + self.settings.retry_backoff_ms > deadline_ms:
            raise RequestTimedOutError(
                f"group {self.settings.group_id!r}: gave up at the deadline ({last})"
            )
        await self.sleep(self.settings.retry_backoff_ms / 1000)

    async def ensure_coordinator(self, deadline_ms: int) -> str:
        while self.coordinator is None:
            try:
                self.coordinator = await self.transport.find_coordinator(
                    self.settings.group_id, self._timeout_s(deadline_ms)
                )
            except MiniBrokerError as err:
                if not err.retriable:
                    raise
                await self._backoff(deadline_ms, err)
            except CallFailed as failed:
                await self._backoff(deadline_ms, failed.error)
        return self.coordinator

    async def coordinator_call(
        self,
        api_key: int,
        values: Mapping[str, Any],
        deadline_ms: int,
        timeout_s: float | None = None,
    ) -> Any:
        """One request to the coordinator, found first; a failed call forgets the coordinator
        and is tried again (after a backoff) until the deadline."""
        while True:
            address = await self.ensure_coordinator(deadline_ms)
            try:
                return await self.transport.send(
                    address, api_key, values, timeout_s or self._timeout_s(deadline_ms)
                )
            except CallFailed as failed:
                self.mark_coordinator_unknown()
                if not failed.error.retriable:
                    raise failed.error from None
                await self._backoff(deadline_ms, failed.error)

    # -- joining -------------------------------------------------------------------------------

    async def join_round(
        self, topics: Iterable[str], partition_counts: PartitionCounts, deadline_ms: int
    ) -> list[TopicPartition]:
        """Join and sync until this member has an assignment (or the deadline passes)."""
        settings = self.settings
        metadata = encode_subscription(topics)
        protocols = [
            {"name": name, "metadata": metadata} for name in settings.partition_assignment_strategy
        ]
        self.state = MemberState.REBALANCING
        while True:
            join = await self.coordinator_call(
                api.JOIN_GROUP,
                {
                    "group_id": settings.group_id,
                    "session_timeout": settings.session_timeout_ms,
                    "rebalance_timeout": settings.max_poll_interval_ms,
                    "member_id": self.member_id,
                    "group_instance_id": settings.group_instance_id,
                    "protocol_type": PROTOCOL_TYPE,
                    "protocols": protocols,
                    "reason": self.rejoin_reason,
                },
                deadline_ms,
                # The coordinator holds a JoinGroup until the rebalance ends (Kafka's client
                # waits rebalance.timeout.ms plus 5 s).
                (settings.max_poll_interval_ms + 5_000) / 1000,
            )
            code = api.code_of(join.error_code)
            if code == ErrorCode.MEMBER_ID_REQUIRED:
                self.member_id = join.member_id
                continue
            if code != ErrorCode.NONE:
                await self._join_error(code, "JoinGroup", deadline_ms)
                continue
            self.generation = int(join.generation_id)
            self.member_id = join.member_id
            self.protocol = join.protocol_name
            self.leader_id = join.leader
            assignments: list[dict[str, Any]] = []
            if self.is_leader:
                assignments = await self._assign(join.members, partition_counts)
            sync = await self.coordinator_call(
                api.SYNC_GROUP,
                {
                    "group_id": settings.group_id,
                    "generation_id": self.generation,
                    "member_id": self.member_id,
                    "group_instance_id": settings.group_instance_id,
                    "protocol_type": PROTOCOL_TYPE,
                    "protocol_name": self.protocol,
                    "assignments": assignments,
                },
                deadline_ms,
            )
            code = api.code_of(sync.error_code)
            if code != ErrorCode.NONE:
                await self._join_error(code, "SyncGroup", deadline_ms)
                continue
            self.assignment = decode_assignment(sync.assignment)
            self.state = MemberState.STABLE
            self.rejoin_needed = False
            self.last_heartbeat_ok_ms = self.clock()
            return list(self.assignment)

    async def _join_error(self, code: int, what: str, deadline_ms: int) -> None:
        """Act on a JoinGroup/SyncGroup error: return to try again, raise when fatal."""
        self.state = MemberState.REBALANCING
        if code == ErrorCode.UNKNOWN_MEMBER_ID:
            self.member_id = UNKNOWN_MEMBER
            self.generation = NO_GENERATION
            return
        if code == ErrorCode.ILLEGAL_GENERATION:
            self.generation = NO_GENERATION
            return
        if code == ErrorCode.REBALANCE_IN_PROGRESS:
            return
        err = group_error(code, f"{what} for group {self.settings.group_id!r}")
        if code in COORDINATOR_MOVED:
            self.mark_coordinator_unknown()
            await self._backoff(deadline_ms, err)
            return
        if code in RETRY_SAME:
            await self._backoff(deadline_ms, err)
            return
        self.state = MemberState.UNJOINED
        raise err

    async def _assign(
        self, members: Sequence[Any], partition_counts: PartitionCounts
    ) -> list[dict[str, Any]]:
        assert self.protocol is not None
        subscriptions: dict[str, Subscription] = {
            m.member_id: decode_subscription(m.metadata, getattr(m, "group_instance_id", None))
            for m in members
        }
        topics = {t for s in subscriptions.values() for t in s.topics}
        counts = await partition_counts(topics)
        self.group_topics = topics
        self.assigned_counts = dict(counts)
        result = assignor_for(self.protocol).assign(counts, subscriptions)
        return [
            {"member_id": member, "assignment": encode_assignment(tps)}
            for member, tps in sorted(result.items())
        ]

    def metadata_changed(self, counts: Mapping[str, int]) -> bool:
        """The leader's check: a subscribed topic's partition count differs from the one it
        assigned with (created: unknown then, deleted: 0 now, or partitions added). Topics
        absent from `counts` (metadata not fetched) are no evidence of a change."""
        if not self.is_leader or self.state is not MemberState.STABLE:
            return False
        return any(
            counts[t] != self.assigned_counts.get(t, 0) for t in self.group_topics if t in counts
        )

    # -- heartbeats ----------------------------------------------------------------------------

    async def heartbeat_once(self) -> None:
        """One heartbeat step (the background task calls it every heartbeat.interval.ms)."""
        settings = self.settings
        now = self.clock()
        if self.state is not MemberState.STABLE:
            return
        if now - self.last_poll_ms > settings.max_poll_interval_ms:
            # Kafka's heartbeat thread: the application stopped polling; leave so that the
            # group can rebalance without waiting for the session to expire.
            await self.leave("consumer poll timeout has expired (max.poll.interval.ms)")
            return
        if now - self.last_heartbeat_ok_ms > settings.session_timeout_ms:
            self.mark_coordinator_unknown()
        deadline = now + settings.heartbeat_interval_ms + settings.request_timeout_ms
        try:
            address = await self.ensure_coordinator(deadline)
            answer = await self.transport.send(
                address,
                api.HEARTBEAT,
                {
                    "group_id": settings.group_id,
                    "generation_id": self.generation,
                    "member_id": self.member_id,
                    "group_instance_id": settings.group_instance_id,
                },
                min(settings.request_timeout_ms, settings.session_timeout_ms) / 1000,
            )
        except CallFailed:
            self.mark_coordinator_unknown()
            return
        except MiniBrokerError:
            return
        self.on_heartbeat_code(api.code_of(answer.error_code))

    def on_heartbeat_code(self, code: int) -> None:
        if code == ErrorCode.NONE:
            self.last_heartbeat_ok_ms = self.clock()
        elif code == ErrorCode.REBALANCE_IN_PROGRESS:
            self.last_heartbeat_ok_ms = self.clock()
            self.request_rejoin("the group is rebalancing")
        elif code == ErrorCode.ILLEGAL_GENERATION:
            self.reset_generation(False, "the group's generation moved on")
        elif code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID):
            self.reset_generation(True, "the coordinator does not know this member")
        elif code in COORDINATOR_MOVED:
            self.mark_coordinator_unknown()

    # -- leaving -------------------------------------------------------------------------------

    async def leave(self, reason: str = "the consumer is being closed") -> None:
        """LeaveGroup (best effort), then forget the generation and member id."""
        if self.member_id and self.coordinator is not None:
            deadline = self.clock() + min(self.settings.request_timeout_ms, 5_000)
            try:
                await self.transport.send(
                    self.coordinator,
                    api.LEAVE_GROUP,
                    {
                        "group_id": self.settings.group_id,
                        "member_id": self.member_id,
                        "members": [
                            {
                                "member_id": self.member_id,
                                "group_instance_id": self.settings.group_instance_id,
                                "reason": reason,
                            }
                        ],
                    },
                    self._timeout_s(deadline),
                )
            except (CallFailed, MiniBrokerError):
                pass
        self.reset_generation(True, reason)

    # -- offsets -------------------------------------------------------------------------------

    async def commit(
        self, offsets: Mapping[TopicPartition, CommittedOffset], deadline_ms: int
    ) -> None:
        """OffsetCommit; raises the first partition error (Kafka's CommitFailedException cases:
        ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID / REBALANCE_IN_PROGRESS also ask to rejoin)."""
        if not offsets:
            return
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for tp, committed in sorted(offsets.items()):
            by_topic.setdefault(tp.topic, []).append(
                {
                    "partition_index": tp.partition,
                    "committed_offset": committed.offset,
                    "committed_leader_epoch": committed.leader_epoch,
                    "committed_metadata": committed.metadata,
                }
            )
        while True:
            if self.subscribed and self.state is not MemberState.STABLE:
                # Kafka's rule: a subscribed member commits only with a stable generation.
                self.request_rejoin("a commit found the member rebalancing")
                raise RebalanceInProgressError(
                    f"group {self.settings.group_id!r} is rebalancing: commit after the "
                    "rebalance (the revoked partitions' positions were committed before it)"
                )
            generation, member_id = self.generation_values()
            answer = await self.coordinator_call(
                api.OFFSET_COMMIT,
                {
                    "group_id": self.settings.group_id,
                    "generation_id_or_member_epoch": generation,
                    "member_id": member_id,
                    "group_instance_id": self.settings.group_instance_id
                    if generation >= 0
                    else None,
                    "retention_time": -1,
                    "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()],
                },
                deadline_ms,
            )
            codes = {api.code_of(p.error_code) for t in answer.topics for p in t.partitions} - {
                ErrorCode.NONE
            }
            if not codes:
                return
            code = min(codes)
            err = group_error(code, f"OffsetCommit for group {self.settings.group_id!r}")
            if code in COORDINATOR_MOVED:
                self.mark_coordinator_unknown()
                await self._backoff(deadline_ms, err)
                continue
            if code in RETRY_SAME or code == ErrorCode.REQUEST_TIMED_OUT:
                await self._backoff(deadline_ms, err)
                continue
            if code == ErrorCode.REBALANCE_IN_PROGRESS:
                self.request_rejoin("a commit met a rebalance")
            elif code == ErrorCode.ILLEGAL_GENERATION:
                self.reset_generation(False, "a commit met a new generation")
            elif code in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_INSTANCE_ID):
                self.reset_generation(True, "a commit met an unknown member id")
            raise err

    async def fetch_committed(
        self, partitions: Iterable[TopicPartition] | None, deadline_ms: int
    ) -> dict[TopicPartition, CommittedOffset | None]:
        """OffsetFetch (require_stable): each partition's committed offset, None if none
        (`partitions` None: every partition the group has committed)."""
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(set(partitions or ())):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        if partitions is not None and not by_topic:
            return {}
        topics = (
            None
            if partitions is None
            else [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()]
        )
        while True:
            answer = await self.coordinator_call(
                api.OFFSET_FETCH,
                {
                    "group_id": self.settings.group_id,
                    "topics": topics,
                    "require_stable": True,
                },
                deadline_ms,
            )
            code = api.code_of(getattr(answer, "error_code", 0))
            codes = {code} | {
                api.code_of(p.error_code) for t in answer.topics for p in t.partitions
            }
            codes.discard(ErrorCode.NONE)
            if not codes:
                return committed_from(answer)
            first = min(codes)
            err = group_error(first, f"OffsetFetch for group {self.settings.group_id!r}")
            if first in COORDINATOR_MOVED:
                self.mark_coordinator_unknown()
            elif first not in RETRY_SAME and first != UNSTABLE_OFFSET_COMMIT:
                raise err
            await self._backoff(deadline_ms, err)


def committed_from(answer: Any) -> dict[TopicPartition, CommittedOffset | None]:
    out: dict[TopicPartition, CommittedOffset | None] = {}
    for t in answer.topics:
        for p in t.partitions:
            tp = TopicPartition(t.name, int(p.partition_index))
            offset = int(p.committed_offset)
            out[tp] = (
                CommittedOffset(
                    offset,
                    p.metadata or "",
                    int(getattr(p, "committed_leader_epoch", -1)),
                )
                if offset >= 0
                else None
            )
    return out


__all__ = [
    "CommittedOffset",
    "CoordinatorNotAvailableError",
    "GroupMember",
    "GroupSettings",
    "GroupTransport",
    "MemberState",
    "committed_from",
    "group_error",
]
