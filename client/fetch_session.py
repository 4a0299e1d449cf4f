"""Kafka's FetchSessionHandler: the client side of incremental fetch sessions (KIP-227).

Pure: no I/O, no clock. One handler per broker a client fetches from (the follower's fetcher per
leader, the consumer per node), with at most one fetch request in flight to that broker: session
epochs require it. Generic over the per-partition request data `D` (any value with ==): the
follower uses wire.FetchPartitionRequest, the consumer its own fetch target.

Each round the caller passes *every* partition it wants to fetch with its data (not a diff) to
`build`, sends the result, and reports the outcome to exactly one of `handle_response` (an
answer arrived) or `handle_error` (send failed, timed out or was cancelled).

Request metadata (session id, epoch), as Kafka's FetchMetadata:

    (0, 0)       full, no session yet: the broker answers every partition and may create one
    (id, 0)      full: the broker closes session `id` first, then may create a new one
    (id, -1)     full, sessionless: the broker closes session `id` (notify_close)
    (id, e >= 1) incremental: only added/altered partitions are sent, removed ones forgotten;
                 the broker still fetches every partition of the session ("implied" ones) and
                 answers only those with news

What a built request carries (FetchSessionHandler.Builder.build):

    full           to_send = session = wanted; nothing forgotten
    incremental    wanted tp not in the session         -> added:   sent
                   in the session with different data   -> altered: sent (after the added ones)
                   in the session with equal data       -> implied: not sent
                   in the session but not wanted        -> removed: in to_forget
                   session := wanted

What an answer does to the next request's metadata (FetchSessionHandler.handleResponse):

    top-level FETCH_SESSION_ID_NOT_FOUND                           (0, 0), not processed
    any other top-level error (INVALID_FETCH_SESSION_EPOCH, ...)   (id, 0), not processed
    full request, partitions != the request's (missing or extra)   (0, 0), not processed
    full request, session id 0 (none created, cache full)          (0, 0), processed
    full request, session id s                                     (s, 1), processed
    incremental, a partition outside the session                   (id, 0), not processed
    incremental, session id 0 (the broker closed it)               (0, 0), processed
    incremental, otherwise                                         (id, next_epoch(e)), processed
    handle_error()                                                 (id, 0)
    notify_close()                                                 (id, -1)

Partitions absent from a processed incremental answer have nothing new: the caller keeps its
state for them. An answer to any request but the last one built and not yet reported is stale:
`handle_response` ignores it (returns False and changes nothing), which Kafka leaves to its
callers' one-in-flight bookkeeping.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from minibroker.client.errors import ErrorCode
from minibroker.client.types import TopicPartition

# Kafka's FetchMetadata values.
INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_EPOCH = 2**31 - 1

# Top-level answers after which the next request, a full one, goes out at once (the session is
# unknown or out of step); any other top-level error is the caller's to back off from.
SESSION_ERRORS = frozenset(
    {ErrorCode.FETCH_SESSION_ID_NOT_FOUND, ErrorCode.INVALID_FETCH_SESSION_EPOCH}
)

D = TypeVar("D")

_ABSENT: object = object()


def next_epoch(epoch: int) -> int:
    """The epoch after `epoch`: -1 stays -1 (sessionless), Integer.MAX_VALUE wraps to 1 (0 is the
    full-request epoch, never an incremental one)."""
    if epoch < 0:
        return FINAL_EPOCH
    if epoch == MAX_EPOCH:
        return 1
    return epoch + 1


@dataclass(frozen=True, slots=True)
class FetchRequestData(Generic[D]):
    """One built fetch request. `to_send` goes into the request's partitions (full: everything),
    `to_forget` into forgotten_topics_data, and `session` is every partition the answer may name
    (sent + implied). Do not mutate the dicts: `session` is the handler's own snapshot."""

    session_id: int
    epoch: int
    to_send: dict[TopicPartition, D]
    to_forget: list[TopicPartition]
    session: dict[TopicPartition, D]

    @property
    def is_full(self) -> bool:
        return self.epoch == INITIAL_EPOCH or self.epoch == FINAL_EPOCH


class FetchSessionHandler(Generic[D]):
    """The session state a client keeps for one broker (Kafka's FetchSessionHandler)."""

    __slots__ = ("_epoch", "_in_flight", "_session", "_session_id", "full_requests", "node_id")

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self._session_id = INVALID_SESSION_ID
        self._epoch = INITIAL_EPOCH
        # tp -> data of the last request built: what the broker's session holds once it answers.
        self._session: dict[TopicPartition, D] = {}
        # The request built last and not yet reported to handle_response / handle_error.
        self._in_flight: FetchRequestData[D] | None = None
        self.full_requests = 0

    @property
    def session_id(self) -> int:
        """The session id the next request carries (0: none)."""
        return self._session_id

    @property
    def epoch(self) -> int:
        """The epoch the next request carries (0 or -1: a full request)."""
        return self._epoch

    @property
    def next_is_full(self) -> bool:
        return self._epoch == INITIAL_EPOCH or self._epoch == FINAL_EPOCH

    @property
    def session_partitions(self) -> Mapping[TopicPartition, D]:
        """The partitions (with their data) of the last request built. Read-only."""
        return self._session

    def build(self, wanted: Mapping[TopicPartition, D]) -> FetchRequestData[D]:
        """The next request for the partitions in `wanted` (all of them, with this round's data).

        One pass over `wanted`; the session is walked again only when some partition was dropped.
        """
        session = dict(wanted)
        if self.next_is_full:
            self.full_requests += 1
            data = FetchRequestData(self._session_id, self._epoch, session, [], session)
        else:
            previous = self._session
            get = previous.get
            to_send: dict[TopicPartition, D] = {}
            altered: dict[TopicPartition, D] = {}
            kept = 0
            for tp, new in session.items():
                old = get(tp, _ABSENT)
                if old is _ABSENT:
                    to_send[tp] = new
                    continue
                kept += 1
                if old is not new and old != new:
                    altered[tp] = new
            if altered:
                to_send.update(altered)
            to_forget = (
                [tp for tp in previous if tp not in session] if kept != len(previous) else []
            )
            data = FetchRequestData(self._session_id, self._epoch, to_send, to_forget, session)
        self._session = session
        self._in_flight = data
        return data

    def handle_response(
        self,
        data: FetchRequestData[D],
        error: ErrorCode,
        session_id: int,
        partitions: Iterable[TopicPartition],
    ) -> bool:
        """Record the answer to `data` (the last request built): its top-level error, session id
        and the partitions it names. True: process the partitions; False: drop the answer (the
        next request is full, or the answer is stale)."""
        if data is not self._in_flight:
            return False
        self._in_flight = None
        if error != ErrorCode.NONE:
            if error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND:
                self._restart()
            else:
                self._epoch = INITIAL_EPOCH
            return False
        named = set(partitions)
        session = data.session
        if data.is_full:
            if len(named) != len(session) or not named.issubset(session):
                self._restart()
                return False
            if session_id == INVALID_SESSION_ID:
                self._restart()
            else:
                self._session_id = session_id
                self._epoch = next_epoch(INITIAL_EPOCH)
            return True
        if not named.issubset(session):
            self._epoch = INITIAL_EPOCH
            return False
        if session_id == INVALID_SESSION_ID:
            self._restart()
        else:
            self._epoch = next_epoch(data.epoch)
        return True

    def handle_error(self) -> None:
        """The last request got no answer (send error, timeout, cancel): the broker may or may not
        have applied it, so the next request is full and closes the session (id, 0)."""
        self._in_flight = None
        self._epoch = INITIAL_EPOCH

    def notify_close(self) -> tuple[int, int]:
        """The client is closing: the next request (id, -1) closes the session without making a
        new one. Returns that request's metadata."""
        self._in_flight = None
        self._epoch = FINAL_EPOCH
        return self._session_id, self._epoch

    def _restart(self) -> None:
        self._session_id = INVALID_SESSION_ID
        self._epoch = INITIAL_EPOCH

    def __repr__(self) -> str:
        return (
            f"FetchSessionHandler(node={self.node_id}, session={self._session_id}, "
            f"epoch={self._epoch}, partitions={len(self._session)})"
        )
