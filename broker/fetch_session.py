"""Incremental fetch sessions (KIP-227), the server side: the session cache and its rules.

Pure: no I/O, no clock (every call takes `now_ms`), no randomness of its own (session ids come
from an injected random source). Kafka's `FetchSession.scala` (`FetchManager.newContext`,
`FetchSessionCacheShard`, `CachedPartition.maybeUpdateResponseData`), one shard: the cache is
used from the event-loop thread only.

A fetch request carries (session id, epoch). Epoch -1 is sessionless, epoch 0 a full request
that asks for a new session (closing the named one first), epoch >= 1 an incremental request
on an existing session: it lists only the partitions added or altered since the last request
and the ones to forget; every other session partition is "implied" and keeps its cached
request parameters. An incremental response carries only the partitions with something new
(records, a high watermark / log start / log end change, an error, a diverging epoch, a
preferred read replica); the client keeps its state for the others.

Unlike Kafka, which reads every session partition on every fetch, a session here keeps a dirty
set: `FetchSessionCache.mark_dirty(tp)` (called wherever the partition's fetch answer may have
changed: append, HW / log start change, leadership, errors) marks the partition in every session
holding it, through a reverse index. An incremental fetch evaluates only the partitions it sends
plus the dirty ones, so an idle session costs nothing per request; `respond` re-marks the
partitions whose answer would come out included again without any change (errors, data left
behind by byte limits or throttles, ...), so this selection equals Kafka's full scan.

Eviction (Kafka's `tryEvict`): when the cache is full, a new session may replace the least
recently used one if it was unused for longer than `eviction_ms`; otherwise the first of the
evictable sessions ordered by (privileged, size, id), when the newcomer's (privileged, size, 0)
is not smaller. Followers' sessions are privileged; a session is evictable by a privileged
newcomer if it is not privileged or is older than `eviction_ms`, by anyone only if older (as of
its last touch).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from minibroker.broker.wire import FetchPartitionRequest, FetchPartitionResult
from minibroker.client.errors import ErrorCode

# Kafka's FetchMetadata values and epoch rule: the client handler's, one definition for both.
from minibroker.client.fetch_session import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    MAX_EPOCH,
    next_epoch,
)
from minibroker.client.types import TopicPartition

MIN_EVICTION_MS = 120_000  # Kafka's MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS (a constant)

ContextKind = Literal["sessionless", "full", "incremental", "error"]


@dataclass(frozen=True, slots=True)
class FetchMetadata:
    """A request's (session id, epoch)."""

    session_id: int
    epoch: int

    @property
    def is_full(self) -> bool:
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)


class RandomSource(Protocol):
    """What the cache needs of `random.Random` (session ids)."""

    def getrandbits(self, k: int, /) -> int: ...


class _SplitMix:
    """The fallback id source when none is injected: splitmix64 seeded from the process's string
    hash seed (PYTHONHASHSEED), so ids differ between broker runs. Ids need only be unique in
    the cache and hard to stumble on (a session also checks its owner); pass `random.Random()`
    for better."""

    __slots__ = ("_state",)

    def __init__(self) -> None:
        self._state = hash("minibroker.fetch_session") & 0xFFFFFFFFFFFFFFFF

    def getrandbits(self, k: int, /) -> int:
        self._state = (self._state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = self._state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        return (z ^ (z >> 31)) >> (64 - k)


class CachedPartition:
    """One session partition: the request parameters the session remembers (replaced when the
    client sends the partition again) and what the last response carried (-1: never sent)."""

    __slots__ = ("high_watermark", "log_end_offset", "log_start_offset", "request")

    def __init__(
        self,
        request: FetchPartitionRequest,
        high_watermark: int = -1,
        log_start_offset: int = -1,
        log_end_offset: int = -1,
    ) -> None:
        self.request = request
        self.high_watermark = high_watermark
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset

    def __repr__(self) -> str:
        return (
            f"CachedPartition({self.request!r}, hw={self.high_watermark}, "
            f"log_start={self.log_start_offset}, leo={self.log_end_offset})"
        )

    def update_response(self, result: FetchPartitionResult) -> bool:
        """Kafka's `maybeUpdateResponseData` (plus the log end offset, minibroker's): must the
        result go into an incremental response? Caches what it carries either way."""
        include = bool(result.records)
        if result.high_watermark != self.high_watermark:
            include = True
            self.high_watermark = result.high_watermark
        if result.log_start_offset != self.log_start_offset:
            include = True
            self.log_start_offset = result.log_start_offset
        if result.log_end_offset != self.log_end_offset:
            include = True
            self.log_end_offset = result.log_end_offset
        if result.preferred_read_replica >= 0 or result.diverging_epoch is not None:
            include = True
        if result.error != ErrorCode.NONE:
            self.high_watermark = -1  # so the partition is sent again once the error clears
            include = True
        return include


def _needs_another_look(
    cp: CachedPartition, result: FetchPartitionResult, privileged: bool
) -> bool:
    """Would this partition's answer be included again with nothing changed? Then it stays
    dirty, so the next request evaluates it (as Kafka's full scan would): an error, a diverging
    epoch or preferred replica (repeated while set), or data not all sent (records returned, or
    none while behind: byte limits or a throttle left them out)."""
    if (
        result.error != ErrorCode.NONE
        or result.diverging_epoch is not None
        or result.preferred_read_replica >= 0
        or result.records
    ):
        return True
    limit = result.log_end_offset if privileged else result.high_watermark
    return cp.request.fetch_offset < limit


class FetchSession:
    """One incremental fetch session: its partitions in rotation order (those that returned data
    move to the end) and the ones changed since they were last evaluated (`dirty`)."""

    __slots__ = (
        "_evict_key",
        "_in_by_all",
        "_in_by_privileged",
        "_lru_key",
        "_topic_counts",
        "created_ms",
        "dirty",
        "epoch",
        "id",
        "last_used_ms",
        "owner",
        "partitions",
        "privileged",
    )

    def __init__(
        self,
        session_id: int,
        privileged: bool,
        owner: Hashable,
        now_ms: int,
        partitions: dict[TopicPartition, CachedPartition],
    ) -> None:
        self.id = session_id
        self.privileged = privileged
        self.owner = owner
        self.created_ms = now_ms
        self.last_used_ms = now_ms
        self.epoch = next_epoch(INITIAL_EPOCH)
        self.partitions = partitions
        self.dirty: set[TopicPartition] = set()
        self._topic_counts: dict[str, int] = {}
        for tp in partitions:
            self._topic_counts[tp.topic] = self._topic_counts.get(tp.topic, 0) + 1
        # Eviction bookkeeping as of the last touch (Kafka's cachedSize / evictable maps).
        self._evict_key: tuple[bool, int, int] = (privileged, -1, session_id)
        self._in_by_privileged = False
        self._in_by_all = False
        self._lru_key: tuple[int, int] | None = None

    def __repr__(self) -> str:
        return (
            f"FetchSession(id={self.id}, epoch={self.epoch}, privileged={self.privileged}, "
            f"partitions={len(self.partitions)}, dirty={len(self.dirty)})"
        )

    def topics(self) -> frozenset[str]:
        """The topic names in the session (to re-authorize an incremental request)."""
        return frozenset(self._topic_counts)

    def _add(self, tp: TopicPartition, cp: CachedPartition) -> None:
        self.partitions[tp] = cp
        self._topic_counts[tp.topic] = self._topic_counts.get(tp.topic, 0) + 1

    def _discard(self, tp: TopicPartition) -> bool:
        if self.partitions.pop(tp, None) is None:
            return False
        self.dirty.discard(tp)
        left = self._topic_counts[tp.topic] - 1
        if left:
            self._topic_counts[tp.topic] = left
        else:
            del self._topic_counts[tp.topic]
        return True


_new_tuple = tuple.__new__  # builds a TopicPartition without its Python-level __new__


def _tp(p: FetchPartitionRequest | FetchPartitionResult) -> TopicPartition:
    return _new_tuple(TopicPartition, (p.topic, p.partition))


class FetchContext:
    """What the cache decided for one request; the shell calls `to_evaluate`, then (after a
    wake) `take_dirty` any number of times, then `respond` once, with a result for every
    partition those two returned (a partition they returned is no longer dirty: one left
    without a result is not looked at again until it is marked dirty)."""

    __slots__ = (
        "_cache",
        "_meta",
        "_owner",
        "_privileged",
        "_requests",
        "error",
        "kind",
        "session",
    )

    def __init__(
        self,
        cache: FetchSessionCache,
        kind: ContextKind,
        meta: FetchMetadata,
        *,
        error: ErrorCode = ErrorCode.NONE,
        session: FetchSession | None = None,
        requests: Sequence[FetchPartitionRequest] = (),
        privileged: bool = False,
        owner: Hashable = None,
    ) -> None:
        self._cache = cache
        self.kind: ContextKind = kind
        self._meta = meta
        self.error = error
        self.session = session
        # sessionless/full: the request's partitions; incremental: those it sent (deduplicated).
        self._requests = requests
        self._privileged = privileged
        self._owner = owner

    def __repr__(self) -> str:
        return f"FetchContext({self.kind}, {self.error.name}, {self.session!r})"

    def _superseded(self) -> bool:
        """Has a newer request on this session arrived (Kafka's duplicate-request check)?"""
        assert self.session is not None
        return self.session.epoch != next_epoch(self._meta.epoch)

    def to_evaluate(self) -> list[FetchPartitionRequest]:
        """The partitions to read for this request. Incremental: the ones it sent (still in the
        session) then the other dirty ones, with their cached parameters; consumes the dirty
        set."""
        session = self.session
        if self.kind != "incremental" or session is None:
            return list(self._requests) if self.kind != "error" else []
        if self._superseded():
            return []  # a newer request owns the session (and its dirty set) now
        partitions = session.partitions
        out: list[FetchPartitionRequest] = []
        sent: set[TopicPartition] = set()
        for req in self._requests:
            tp = _tp(req)
            cp = partitions.get(tp)
            if cp is not None:
                sent.add(tp)
                out.append(cp.request)
        dirty = session.dirty
        if dirty:
            for tp in dirty:
                if tp not in sent:
                    out.append(partitions[tp].request)
            dirty.clear()
        return out

    def take_dirty(self) -> list[FetchPartitionRequest]:
        """Incremental only, after a wake: the partitions marked dirty since (cached
        parameters); consumes them."""
        session = self.session
        if self.kind != "incremental" or session is None or not session.dirty:
            return []
        if self._superseded():
            return []
        partitions = session.partitions
        out = [partitions[tp].request for tp in session.dirty]
        session.dirty.clear()
        return out

    def respond(
        self, results: Iterable[FetchPartitionResult], now_ms: int
    ) -> tuple[int, ErrorCode, list[FetchPartitionResult]]:
        """(session id, top-level error, the partitions to put in the response)."""
        if self.kind == "error":
            return INVALID_SESSION_ID, self.error, []
        if self.kind == "sessionless":
            return INVALID_SESSION_ID, ErrorCode.NONE, list(results)
        if self.kind == "full":
            results = list(results)
            session_id = self._cache._create_from_full(
                self._requests, results, self._privileged, self._owner, now_ms
            )
            return session_id, ErrorCode.NONE, results
        session = self.session
        assert session is not None
        partitions = session.partitions
        if self._superseded():
            # Another request on this session arrived since: this one is a duplicate. What it
            # evaluated goes back to the dirty set, for the request that owns the session now.
            for result in results:
                tp = _tp(result)
                if tp in partitions:
                    session.dirty.add(tp)
            return session.id, ErrorCode.INVALID_FETCH_SESSION_EPOCH, []
        last: dict[TopicPartition, FetchPartitionResult] = {}
        for result in results:
            last[_tp(result)] = result
        privileged = session.privileged
        out: list[FetchPartitionResult] = []
        for tp, result in last.items():
            cp = partitions.get(tp)
            if cp is None:
                continue  # not (or no longer) in the session
            if cp.update_response(result):
                out.append(result)
                if result.records:
                    partitions[tp] = partitions.pop(tp)  # rotation: to the end
            if _needs_another_look(cp, result, privileged):
                session.dirty.add(tp)
        self._cache._touch(session, now_ms)
        return session.id, ErrorCode.NONE, out


class FetchSessionCache:
    """The broker's fetch sessions (Kafka's FetchSessionCache, one shard) and the reverse index
    partition -> sessions holding it, for `mark_dirty`."""

    __slots__ = (
        "_by_all",
        "_by_privileged",
        "_index",
        "_lru",
        "_partitions_cached",
        "_rng",
        "_sessions",
        "eviction_ms",
        "evictions",
        "max_slots",
    )

    def __init__(
        self, max_slots: int, eviction_ms: int = MIN_EVICTION_MS, rng: RandomSource | None = None
    ) -> None:
        if max_slots < 0:
            raise ValueError("max_slots must be at least 0")
        self.max_slots = max_slots
        self.eviction_ms = eviction_ms
        self._rng: RandomSource = rng if rng is not None else _SplitMix()
        self._sessions: dict[int, FetchSession] = {}
        self._index: dict[TopicPartition, dict[int, FetchSession]] = {}
        # Heaps with lazy deletion (an entry is live iff it matches its session's state):
        # (last used ms, id) for the stale check; (privileged, size, id) for the two queues.
        self._lru: list[tuple[int, int]] = []
        self._by_privileged: list[tuple[bool, int, int]] = []
        self._by_all: list[tuple[bool, int, int]] = []
        self._partitions_cached = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def partitions_cached(self) -> int:
        """The sum of the sessions' sizes."""
        return self._partitions_cached

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def sessions_holding(self, tp: TopicPartition) -> list[FetchSession]:
        """The sessions that hold `tp` (the reverse index)."""
        return list(self._index.get(tp, {}).values())

    def remove(self, session_id: int) -> None:
        session = self._sessions.pop(session_id, None)
        if session is None:
            return
        index = self._index
        for tp in session.partitions:
            holders = index[tp]
            del holders[session_id]
            if not holders:
                del index[tp]
        self._partitions_cached -= len(session.partitions)

    def mark_dirty(self, tp: TopicPartition) -> list[FetchSession]:
        """Mark `tp` dirty in every session holding it; the sessions where it was not dirty yet
        (the shell wakes their parked request)."""
        holders = self._index.get(tp)
        if not holders:
            return []
        woken: list[FetchSession] = []
        for session in holders.values():
            dirty = session.dirty
            if tp not in dirty:
                dirty.add(tp)
                woken.append(session)
        return woken

    def new_context(
        self,
        meta: FetchMetadata,
        *,
        privileged: bool,
        owner: Hashable,
        to_send: Sequence[FetchPartitionRequest],
        to_forget: Sequence[TopicPartition],
        now_ms: int,
    ) -> FetchContext:
        """Kafka's `FetchManager.newContext` (KIP-227): decide what the request is."""
        if meta.is_full:
            if meta.session_id != INVALID_SESSION_ID:
                old = self._sessions.get(meta.session_id)
                if old is not None and old.owner == owner:
                    self.remove(meta.session_id)
            kind: ContextKind = "sessionless" if meta.epoch == FINAL_EPOCH else "full"
            return FetchContext(
                self, kind, meta, requests=to_send, privileged=privileged, owner=owner
            )
        session = self._sessions.get(meta.session_id)
        if session is None or session.owner != owner:
            return FetchContext(self, "error", meta, error=ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != meta.epoch:
            return FetchContext(self, "error", meta, error=ErrorCode.INVALID_FETCH_SESSION_EPOCH)
        sent = self._update(session, to_send, to_forget)
        if not session.partitions:
            self.remove(session.id)
            return FetchContext(self, "sessionless", meta, requests=to_send, owner=owner)
        self._touch(session, now_ms)
        session.epoch = next_epoch(session.epoch)
        return FetchContext(self, "incremental", meta, session=session, requests=sent, owner=owner)

    def _update(
        self,
        session: FetchSession,
        to_send: Sequence[FetchPartitionRequest],
        to_forget: Sequence[TopicPartition],
    ) -> list[FetchPartitionRequest]:
        """Kafka's `FetchSession.update`: add or re-parameterize what was sent, then drop what was
        forgotten; the reverse index follows. Returns the sent requests, one per partition (the
        last wins)."""
        partitions = session.partitions
        index = self._index
        sid = session.id
        sent: dict[TopicPartition, FetchPartitionRequest] = {}
        for req in to_send:
            tp = _tp(req)
            sent[tp] = req
            cp = partitions.get(tp)
            if cp is None:
                session._add(tp, CachedPartition(req))
                index.setdefault(tp, {})[sid] = session
                self._partitions_cached += 1
            else:
                cp.request = req
        for tp in to_forget:
            if session._discard(tp):
                holders = index[tp]
                del holders[sid]
                if not holders:
                    del index[tp]
                self._partitions_cached -= 1
        return list(sent.values())

    def _create_from_full(
        self,
        requests: Sequence[FetchPartitionRequest],
        results: list[FetchPartitionResult],
        privileged: bool,
        owner: Hashable,
        now_ms: int,
    ) -> int:
        """Kafka's `maybeCreateSession` for a full response: a session caching each result's
        offsets, or INVALID_SESSION_ID if the cache is full and nothing may be evicted."""
        # Plain (topic, partition) tuples equal and hash as TopicPartition, and cost less.
        by_tp = {(req.topic, req.partition): req for req in requests}
        last = {(result.topic, result.partition): result for result in results}  # last counts
        partitions: dict[TopicPartition, CachedPartition] = {}
        dirty: set[TopicPartition] = set()
        for key, result in last.items():
            req = by_tp.get(key)
            if req is None:
                continue  # an answer for something not asked: nothing to cache it with
            tp = _new_tuple(TopicPartition, key)
            cp = CachedPartition(req)
            cp.update_response(result)
            partitions[tp] = cp
            if _needs_another_look(cp, result, privileged):
                dirty.add(tp)
        size = len(partitions)
        if len(self._sessions) >= self.max_slots and not self._try_evict(privileged, size, now_ms):
            return INVALID_SESSION_ID
        session_id = self._new_id()
        session = FetchSession(session_id, privileged, owner, now_ms, partitions)
        session.dirty = dirty
        self._sessions[session_id] = session
        index = self._index
        for tp in partitions:
            index.setdefault(tp, {})[session_id] = session
        self._partitions_cached += size
        self._touch(session, now_ms)
        return session_id

    def _new_id(self) -> int:
        while True:
            session_id = self._rng.getrandbits(31)
            if session_id != INVALID_SESSION_ID and session_id not in self._sessions:
                return session_id

    def _touch(self, session: FetchSession, now_ms: int) -> None:
        """Kafka's `touch`: last used := now; re-file the session in the eviction queues by its
        size and age now."""
        if self._sessions.get(session.id) is not session:
            return  # removed or evicted while its request was parked
        session.last_used_ms = now_ms
        lru_key = (now_ms, session.id)
        if session._lru_key != lru_key:
            session._lru_key = lru_key
            heapq.heappush(self._lru, lru_key)
        key = (session.privileged, len(session.partitions), session.id)
        old_enough = now_ms - session.created_ms > self.eviction_ms
        by_privileged = not session.privileged or old_enough
        changed = key != session._evict_key
        session._evict_key = key
        if by_privileged and (changed or not session._in_by_privileged):
            heapq.heappush(self._by_privileged, key)
        session._in_by_privileged = by_privileged
        if old_enough and (changed or not session._in_by_all):
            heapq.heappush(self._by_all, key)
        session._in_by_all = old_enough
        self._compact()

    def _compact(self) -> None:
        """Rebuild a heap that holds mostly dead entries (amortized O(1) per touch)."""
        bound = 2 * len(self._sessions) + 16
        if len(self._lru) > bound:
            self._lru = [s._lru_key for s in self._sessions.values() if s._lru_key is not None]
            heapq.heapify(self._lru)
        if len(self._by_privileged) > bound:
            live = [s._evict_key for s in self._sessions.values() if s._in_by_privileged]
            heapq.heapify(live)
            self._by_privileged = live
        if len(self._by_all) > bound:
            live = [s._evict_key for s in self._sessions.values() if s._in_by_all]
            heapq.heapify(live)
            self._by_all = live

    def _least_recently_used(self) -> FetchSession | None:
        heap = self._lru
        while heap:
            session = self._sessions.get(heap[0][1])
            if session is not None and session._lru_key == heap[0]:
                return session
            heapq.heappop(heap)
        return None

    def _first_evictable(self, privileged: bool) -> FetchSession | None:
        heap = self._by_privileged if privileged else self._by_all
        while heap:
            key = heap[0]
            session = self._sessions.get(key[2])
            if (
                session is not None
                and session._evict_key == key
                and (session._in_by_privileged if privileged else session._in_by_all)
            ):
                return session
            heapq.heappop(heap)
        return None

    def _try_evict(self, privileged: bool, size: int, now_ms: int) -> bool:
        """Kafka's `tryEvict`: make room for a new session of `size` partitions."""
        lru = self._least_recently_used()
        if lru is None:
            return False
        if now_ms - lru.last_used_ms > self.eviction_ms:
            victim = lru
        else:
            first = self._first_evictable(privileged)
            if first is None or (privileged, size, 0) < first._evict_key:
                return False
            victim = first
        self.remove(victim.id)
        self.evictions += 1
        return True


__all__ = [
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "INVALID_SESSION_ID",
    "MAX_EPOCH",
    "MIN_EVICTION_MS",
    "CachedPartition",
    "ContextKind",
    "FetchContext",
    "FetchMetadata",
    "FetchSession",
    "FetchSessionCache",
    "RandomSource",
    "next_epoch",
]
