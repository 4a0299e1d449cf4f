"""The leader's record of one follower: Kafka's `Replica.scala` fetch state.

Pure: no I/O, no clock. The leader updates a `RemoteReplica` on every accepted follower fetch
(`update_fetch_state`) and resets it when it becomes leader (`reset`); the lag rule
(`is_caught_up`, replica.lag.time.max.ms) reads it for ISR shrink and the high watermark. The
follower's LEO here is its fetch offset: what it asked for next is what it holds.

Concurrency contract: single-threaded (owned by one PartitionReplica).
"""

from __future__ import annotations

from dataclasses import dataclass

from minibroker.broker.replication.events import UNKNOWN_BROKER_EPOCH, RemoteReplicaView
from minibroker.client.types import UNKNOWN_OFFSET

NEVER_MS = -(1 << 62)


@dataclass(slots=True)
class RemoteReplica:
    """The leader's view of one follower (Kafka's Replica.scala state).

    leo == -1 means unknown: nothing heard in this leadership yet, which holds the HW back.
    NEVER_MS as a time means "never" (Kafka uses 0 against a wall clock; virtual clocks in the
    tests and the simulation start at 0, so "never" needs its own value).
    """

    replica_id: int
    leo: int = UNKNOWN_OFFSET
    log_start_offset: int = UNKNOWN_OFFSET
    last_caught_up_time_ms: int = NEVER_MS
    last_fetch_leader_leo: int = UNKNOWN_OFFSET
    last_fetch_time_ms: int = NEVER_MS
    broker_epoch: int = UNKNOWN_BROKER_EPOCH

    def reset(self, now_ms: int, leader_leo: int, is_new_leader: bool, in_isr: bool) -> None:
        """Kafka's `Replica.resetReplicaState` on becoming leader (docs/protocol.md §7)."""
        # An ISR member gets a fresh lag allowance; a non-member gets none, so it cannot hold
        # the HW back through the "caught up" clause before it has fetched.
        self.last_caught_up_time_ms = now_ms if in_isr else NEVER_MS
        # What the follower fetched in an earlier epoch may be gone: a leader re-elected in a
        # later epoch may have missed an epoch in between whose leader truncated the follower.
        # So even a re-elected leader forgets the LEO: the HW waits for a fetch in this epoch.
        self.leo = UNKNOWN_OFFSET
        if is_new_leader:
            self.log_start_offset = UNKNOWN_OFFSET
            self.last_fetch_leader_leo = UNKNOWN_OFFSET
            self.last_fetch_time_ms = NEVER_MS
            self.broker_epoch = UNKNOWN_BROKER_EPOCH
        else:
            self.last_fetch_leader_leo = leader_leo
            self.last_fetch_time_ms = now_ms if in_isr else NEVER_MS

    def update_fetch_state(
        self,
        fetch_offset: int,
        log_start_offset: int,
        now_ms: int,
        leader_leo: int,
        broker_epoch: int,
    ) -> None:
        """Kafka's `Replica.updateFetchStateOrThrow` (docs/protocol.md §7); leader_leo taken before
        the read."""
        if fetch_offset >= leader_leo:
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_leo:
            # It reached what the leader had at its previous fetch: caught up as of then.
            self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        self.last_fetch_leader_leo = max(leader_leo, self.last_fetch_leader_leo)
        self.last_fetch_time_ms = now_ms
        self.leo = fetch_offset
        self.log_start_offset = log_start_offset
        if broker_epoch != UNKNOWN_BROKER_EPOCH:
            self.broker_epoch = broker_epoch

    def implied_fetch(self, at_ms: int) -> None:
        """The follower's fetch session carried this partition at `at_ms` without naming it
        (KIP-227), and the leader's log had not changed since the follower last read it:
        Kafka reads every session partition on every request, so the follower fetched again
        from the same offset, against the same leader LEO. Without this an idle partition's
        follower looks stale the moment a record arrives, and the ISR shrinks before its
        next request reads the record (docs/protocol.md §7)."""
        if (
            at_ms <= self.last_fetch_time_ms
            or self.leo == UNKNOWN_OFFSET
            or self.leo < self.last_fetch_leader_leo
        ):
            return  # an older request, nothing heard yet, or it was behind: a real read decides
        self.last_caught_up_time_ms = max(self.last_caught_up_time_ms, at_ms)
        self.last_fetch_time_ms = at_ms

    def is_caught_up(self, leader_leo: int, now_ms: int, lag_time_max_ms: int) -> bool:
        return self.leo == leader_leo or now_ms - self.last_caught_up_time_ms <= lag_time_max_ms

    def view(self) -> RemoteReplicaView:
        """A frozen copy for the shell (`PartitionReplica.remote_replicas`)."""
        return RemoteReplicaView(
            self.replica_id,
            self.leo,
            self.log_start_offset,
            self.last_caught_up_time_ms,
            self.broker_epoch,
        )
