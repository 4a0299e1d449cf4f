"""Broker liveness: heartbeat sessions, the session timeout and the heartbeat-stream fast path.

Pure bookkeeping (docs/protocol.md §16, docs/design.md §3.4). Nothing here is durable: after a
controller restart every known broker starts with contact time = now (KAFKA-18138), so one that
died while the controller was down is still fenced by the timeout. A session is *alive* while its
heartbeat stream is open and it has been heard from within `broker.session.timeout.ms`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True)
class BrokerSession:
    broker_id: int
    broker_epoch: int
    last_contact_ms: int
    stream_id: int | None = None  # the heartbeat stream that speaks for this incarnation
    metadata_offset: int = -1  # the last current_metadata_offset the broker reported
    heard_since_start: bool = False
    # Controlled shutdown: the offset the broker's peers must reach before it may exit, and
    # whether it was told it may (after which its stream ending is not a failure).
    shutdown_offset: int | None = None
    shutdown_granted: bool = False
    # The log dirs this incarnation reported offline: once reported, it stays fenced for the
    # rest of its session whatever later heartbeats say (a failed dir does not come back
    # without a restart, which is a new incarnation and a new session).
    offline_log_dirs: tuple[str, ...] = ()


class Liveness:
    def __init__(self, session_timeout_ms: int) -> None:
        self.session_timeout_ms = session_timeout_ms
        self.sessions: dict[int, BrokerSession] = {}

    def start_session(self, broker_id: int, broker_epoch: int, now_ms: int) -> BrokerSession:
        session = BrokerSession(broker_id, broker_epoch, now_ms)
        self.sessions[broker_id] = session
        return session

    def forget(self, broker_id: int) -> None:
        """Drop the session of a broker whose registration was removed."""
        self.sessions.pop(broker_id, None)

    def get(self, broker_id: int) -> BrokerSession | None:
        return self.sessions.get(broker_id)

    def touch(self, broker_id: int, stream_id: int, metadata_offset: int, now_ms: int) -> None:
        session = self.sessions[broker_id]
        session.last_contact_ms = now_ms
        session.stream_id = stream_id
        session.metadata_offset = metadata_offset
        session.heard_since_start = True

    def is_alive(self, broker_id: int, now_ms: int) -> bool:
        session = self.sessions.get(broker_id)
        return (
            session is not None
            and session.stream_id is not None
            and now_ms - session.last_contact_ms <= self.session_timeout_ms
        )

    def close_stream(self, broker_id: int, broker_epoch: int, stream_id: int) -> bool:
        """Forget a heartbeat stream that ended; True when it was the current one of the
        current incarnation (so its end means the broker is gone)."""
        session = self.sessions.get(broker_id)
        if session is None or session.broker_epoch != broker_epoch:
            return False
        if session.stream_id != stream_id:
            return False
        session.stream_id = None
        return True

    def oldest_expired(self, candidates: Iterable[int], now_ms: int) -> int | None:
        """The candidate whose session expired longest ago, or None (Kafka fences one stale
        broker per pass so each fence's records are written before the next)."""
        expired = [
            (s.last_contact_ms, s.broker_id)
            for b in candidates
            if (s := self.sessions.get(b)) is not None
            and now_ms - s.last_contact_ms > self.session_timeout_ms
        ]
        return min(expired)[1] if expired else None


__all__ = ["BrokerSession", "Liveness"]
