"""What `send` returns: one shared result per batch, one small future per record.

Kafka's `ProduceRequestResult` and `FutureRecordMetadata`: the producer never makes a future, a
callback or a task per record. Each batch has one `ProduceRequestResult`, completed once by the
sender with the batch's base offset (or its error); each record gets a `FutureRecordMetadata`, a
tuple of (the batch's result, the record's index in the batch, its create timestamp), whose
metadata is computed only when asked for. A record's offset is the batch's base offset plus its
index, as in Kafka.

A `FutureRecordMetadata` behaves like a `concurrent.futures.Future` (`result(timeout)`,
`exception`, `done`, `add_done_callback`) and can also be awaited on any event loop, so the
blocking `Producer` and the `AsyncProducer` return the same object.

Thread safety: a result is completed on the producer's sender thread (its event loop) and may be
waited on from any thread or loop; done-callbacks run on the thread that completes the result
(the sender's loop), or at once in the caller's thread when the result is already complete, as
with concurrent.futures. A batch split after a MESSAGE_TOO_LARGE refusal (Kafka's
splitAndReenqueue) gets one result per part; the batch's result then completes when every part
has, and each record resolves through the part that holds it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import weakref
from collections.abc import Callable, Generator, Sequence
from typing import Any

from minibroker.client.types import RecordMetadata, TopicPartition

log = logging.getLogger("minibroker.client.producer")

_new_tuple = tuple.__new__
_EMPTY: tuple[Any, ...] = ()


class ProduceRequestResult:
    """The outcome of one batch: its base offset and log-append time, or its error.

    `base_offset` is -1 when the broker does not say (acks=0); `log_append_time` is -1 unless
    the topic stamps LogAppendTime, in which case it replaces every record's timestamp.
    """

    __slots__ = (
        "_aio",
        "_callbacks",
        "_event",
        "_lock",
        "_parent",
        "_parts",
        "_pending_parts",
        "base_offset",
        "done",
        "error",
        "log_append_time",
        "tp",
    )

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.base_offset = -1
        self.log_append_time = -1
        self.error: BaseException | None = None
        self.done = False
        self._lock = threading.Lock()
        self._callbacks: list[tuple[Callable[[Any], object], Any]] | None = None
        self._event: threading.Event | None = None
        self._aio: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] | None = None
        self._parts: tuple[tuple[int, ProduceRequestResult], ...] | None = None
        self._parent: ProduceRequestResult | None = None
        self._pending_parts = 0

    # -- completing (the sender) ---------------------------------------------------------------

    def complete(self, base_offset: int, log_append_time: int = -1) -> None:
        """The batch was acknowledged at `base_offset`. Later calls change nothing."""
        self._finish(base_offset, log_append_time, None)

    def fail(self, error: BaseException) -> None:
        """The batch failed for good: every record's future raises `error`."""
        self._finish(-1, -1, error)

    def split(self, bounds: Sequence[int], parts: Sequence[ProduceRequestResult]) -> None:
        """This batch was split: records [bounds[i], bounds[i+1]) now belong to `parts[i]`.

        `bounds` starts at 0 and has one entry per part. This result completes once every part
        has; until then it is not done.
        """
        with self._lock:
            if self.done or self._parts is not None:
                raise RuntimeError(f"the batch for {self.tp} is already complete or split")
            self._parts = tuple(zip(bounds, parts))
            self._pending_parts = len(parts)
        for part in parts:
            part._parent = self

    def _finish(self, base_offset: int, log_append_time: int, error: BaseException | None) -> None:
        with self._lock:
            if self.done:
                return
            self.base_offset = base_offset
            self.log_append_time = log_append_time
            self.error = error
            self.done = True
            callbacks, self._callbacks = self._callbacks, None
            event, aio = self._event, self._aio
            self._aio = None
        if event is not None:
            event.set()
        if aio is not None:
            for loop, future in aio:
                _wake_loop(loop, future)
        if callbacks is not None:
            for fn, future in callbacks:
                _run_callback(fn, future)
        parent = self._parent
        if parent is not None:
            with parent._lock:
                parent._pending_parts -= 1
                last = parent._pending_parts == 0
            if last:
                parent._finish(-1, -1, None)

    # -- waiting -------------------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> bool:
        """Block until done (or `timeout` seconds); True when done."""
        if self.done:
            return True
        with self._lock:
            if self.done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def asyncio_future(self) -> asyncio.Future[None]:
        """A future of the running loop that completes with this result (one per loop)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._aio is None:
                self._aio = []
            else:
                for known, future in self._aio:
                    if known is loop:
                        return future
            future = loop.create_future()
            if self.done:
                future.set_result(None)
            else:
                self._aio.append((loop, future))
            return future

    def add_callback(self, fn: Callable[[Any], object], future: Any) -> None:
        """Call `fn(future)` once done (at once, in this thread, if done already)."""
        with self._lock:
            if not self.done:
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append((fn, future))
                return
        _run_callback(fn, future)

    def locate(self, index: int) -> tuple[ProduceRequestResult, int]:
        """The result that holds record `index` of this batch, and its index there."""
        result = self
        while result._parts is not None:
            parts = result._parts
            for i in range(len(parts) - 1, -1, -1):
                lo, part = parts[i]
                if index >= lo:
                    result, index = part, index - lo
                    break
        return result, index


def _timed_out(what: str, timeout: float | None) -> TimeoutError:
    """A wait that ran out (concurrent.futures raises TimeoutError the same way): the record may
    still be acknowledged later; a delivery that failed raises the broker's error instead."""
    return TimeoutError(f"{what} not acknowledged within {timeout} s")


# The event loops producers send on: blocking on one of them for a record would wait for ever.
_SENDER_LOOPS: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def register_sender_loop(loop: asyncio.AbstractEventLoop) -> None:
    """A producer's sender runs on `loop` (its results complete there)."""
    _SENDER_LOOPS.add(loop)


def _no_blocking_on_a_loop(result: ProduceRequestResult) -> None:
    """Blocking for a record inside the event loop a producer sends on would stop the very loop
    that would complete it: refuse, as an asyncio future does. Other loops (a notebook's, say)
    may block: the blocking Producer sends on a thread of its own."""
    if result.done:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    if loop in _SENDER_LOOPS:
        raise asyncio.InvalidStateError(
            "the record is not acknowledged yet: await its future instead of calling result() "
            "on the producer's own event loop"
        )


def _wake_loop(loop: asyncio.AbstractEventLoop, future: asyncio.Future[None]) -> None:
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        if not future.done():
            future.set_result(None)
        return
    try:
        loop.call_soon_threadsafe(_set_none, future)
    except RuntimeError:  # that loop is closed: nobody is waiting on it any more
        pass


def _set_none(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _in_context(
    context: contextvars.Context, fn: Callable[[Any], object]
) -> Callable[[Any], object]:
    def run(future: Any) -> object:
        return context.run(fn, future)

    return run


def _run_callback(fn: Callable[[Any], object], future: Any) -> None:
    try:
        fn(future)
    except Exception:  # as concurrent.futures: a callback's error must not stop the others
        log.exception("exception calling callback for %r", future)


class FutureRecordMetadata(tuple):  # type: ignore[type-arg]
    """The future of one sent record's `RecordMetadata` (Kafka's FutureRecordMetadata).

    A tuple (result, index, timestamp): made once per record, so it must be cheap; the metadata
    itself is built only when asked for. Use it like a `concurrent.futures.Future`, or await it.
    It cannot be cancelled: a record handed to the producer is sent (Kafka's futures refuse
    cancel too).
    """

    __slots__ = ()

    @classmethod
    def of(cls, result: ProduceRequestResult, index: int, timestamp: int) -> FutureRecordMetadata:
        return _new_tuple(cls, (result, index, timestamp))

    def __repr__(self) -> str:
        result, index, _ = self
        state = "pending" if not result.done else ("failed" if self.exception(0) else "done")
        return f"<FutureRecordMetadata {result.tp} #{index} {state}>"

    # Tuples compare by value; two futures are the same only when they are the same object.
    __eq__ = object.__eq__  # type: ignore[assignment]
    __ne__ = object.__ne__  # type: ignore[assignment]
    __hash__ = object.__hash__  # type: ignore[assignment]

    def _outcome(self) -> RecordMetadata | BaseException:
        result, index = self[0].locate(self[1])
        if result.error is not None:
            return result.error
        topic, partition = result.tp
        base = result.base_offset
        offset = base + index if base >= 0 else -1
        append_time = result.log_append_time
        timestamp = append_time if append_time >= 0 else self[2]
        return _new_tuple(RecordMetadata, (topic, partition, offset, timestamp))

    def done(self) -> bool:
        return self[0].done

    def cancel(self) -> bool:
        return False

    def cancelled(self) -> bool:
        return False

    def running(self) -> bool:
        return not self[0].done

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """The record's metadata, waiting up to `timeout` seconds (None: for ever)."""
        if not self[0].done:
            _no_blocking_on_a_loop(self[0])
            if not self[0].wait(timeout):
                raise _timed_out("the record was", timeout)
        outcome = self._outcome()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    get = result  # kafka-python's name

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if not self[0].done:
            _no_blocking_on_a_loop(self[0])
            if not self[0].wait(timeout):
                raise _timed_out("the record was", timeout)
        outcome = self._outcome()
        return outcome if isinstance(outcome, BaseException) else None

    def add_done_callback(
        self,
        fn: Callable[[FutureRecordMetadata], object],
        *,
        context: contextvars.Context | None = None,
    ) -> None:
        """Call `fn(self)` once the record is acknowledged or failed (on the producer's sender
        thread, or at once here when it is already done); in `context` if given, as
        asyncio's futures do."""
        if context is not None:
            self[0].add_callback(_in_context(context, fn), self)
            return
        self[0].add_callback(fn, self)

    def __await__(self) -> Generator[Any, None, RecordMetadata]:
        result = self[0]
        if not result.done:
            yield from result.asyncio_future().__await__()
        outcome = self._outcome()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


class SentRecords(Sequence[FutureRecordMetadata]):
    """What `send_batch` returns: the futures of many records, held as runs of one batch each.

    A sequence of `FutureRecordMetadata` (made on access, not up front), plus `result()` /
    `await` for every record's metadata at once and `exception()` for the first error.
    """

    __slots__ = ("_count", "_runs", "_timestamps")

    def __init__(self) -> None:
        # (first index in this SentRecords, result, first index in that batch, count)
        self._runs: list[tuple[int, ProduceRequestResult, int, int]] = []
        self._count = 0
        self._timestamps: list[int] | int = 0

    def _add_run(self, result: ProduceRequestResult, start: int, count: int) -> None:
        self._runs.append((self._count, result, start, count))
        self._count += count

    def __len__(self) -> int:
        return self._count

    def _locate(self, i: int) -> tuple[ProduceRequestResult, int, int]:
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError(f"record {i} of {self._count}")
        lo, hi = 0, len(self._runs)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._runs[mid][0] <= i:
                lo = mid
            else:
                hi = mid
        first, result, start, _ = self._runs[lo]
        stamps = self._timestamps
        timestamp = stamps if isinstance(stamps, int) else stamps[i]
        return result, start + i - first, timestamp

    def __getitem__(self, i: int) -> FutureRecordMetadata:  # type: ignore[override]
        if not isinstance(i, int):
            raise TypeError("SentRecords indices must be integers")
        result, index, timestamp = self._locate(i)
        return FutureRecordMetadata.of(result, index, timestamp)

    def done(self) -> bool:
        return all(result.done for _, result, _, _ in self._runs)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every record is acknowledged or failed; True when all are."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        for _, result, _, _ in self._runs:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not result.wait(left):
                return False
        return True

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The first failed record's error (None when all were acknowledged)."""
        if not self.wait(timeout):
            raise _timed_out("the records were", timeout)
        return self._first_error()

    def _first_error(self) -> BaseException | None:
        for _, result, start, count in self._runs:
            for part, _ in _parts_of(result, start, count):
                if part.error is not None:
                    return part.error
        return None

    def result(self, timeout: float | None = None) -> list[RecordMetadata]:
        """Every record's metadata in order; raises the first error if any record failed."""
        if not self.wait(timeout):
            raise _timed_out("the records were", timeout)
        return self._metadata()

    def _metadata(self) -> list[RecordMetadata]:
        error = self._first_error()
        if error is not None:
            raise error
        return [self[i]._outcome() for i in range(self._count)]  # type: ignore[misc]

    def last_offsets(self) -> dict[TopicPartition, int]:
        """The highest offset per partition among these records (all must be acknowledged;
        raises the first error): one look per batch, not per record."""
        error = self._first_error()
        if error is not None:
            raise error
        last: dict[TopicPartition, int] = {}
        for _, result, start, count in self._runs:
            for index in (start, start + count - 1):
                part, at = result.locate(index)
                if part.error is not None:
                    raise part.error
                offset = part.base_offset + at if part.base_offset >= 0 else -1
                if offset > last.get(part.tp, -1):
                    last[part.tp] = offset
        return last

    def __await__(self) -> Generator[Any, None, list[RecordMetadata]]:
        for _, result, _, _ in self._runs:
            if not result.done:
                yield from result.asyncio_future().__await__()
        return self._metadata()


def _parts_of(
    result: ProduceRequestResult, start: int, count: int
) -> list[tuple[ProduceRequestResult, int]]:
    """The (result, index) pairs records [start, start+count) of a batch resolve to, one per
    distinct part (a run is checked part by part, not record by record)."""
    if result._parts is None:
        return [(result, start)]
    seen: dict[int, tuple[ProduceRequestResult, int]] = {}
    for i in range(start, start + count):
        part, index = result.locate(i)
        seen.setdefault(id(part), (part, index))
    return list(seen.values())


__all__ = [
    "FutureRecordMetadata",
    "ProduceRequestResult",
    "SentRecords",
    "register_sender_loop",
]
