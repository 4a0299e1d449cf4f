"""Parked requests (Kafka's purgatories): acks=all produces waiting for the high watermark, and
long-poll fetches waiting for data.

I/O shell (asyncio futures), event-loop thread only. Both structures are bounded: a caller that
would exceed `capacity` gets `PurgatoryFullError` and answers its client with an error instead of
parking, so a flood of slow requests cannot grow memory without limit.
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

from minibroker.client.errors import MiniBrokerError


class PurgatoryFullError(MiniBrokerError):
    """Too many parked requests; the client should retry."""


@dataclass(order=True, slots=True)
class _OffsetWaiter:
    required_offset: int
    seq: int
    future: asyncio.Future[int] = field(compare=False)


class OffsetWaiters:
    """Futures that complete once a key's watermark reaches a required offset.

    `wait(key, offset)` returns a future resolved with the watermark value; `advance(key, hw)`
    resolves every waiter whose required offset <= hw; `fail(key, exc)` fails all of a key's
    waiters (leadership lost).
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._waiters: dict[Hashable, list[_OffsetWaiter]] = {}
        self._count = 0
        self._seq = 0

    def __len__(self) -> int:
        return self._count

    def wait(self, key: Hashable, required_offset: int) -> asyncio.Future[int]:
        if self._count >= self._capacity:
            raise PurgatoryFullError(f"{self._count} produce requests are already waiting")
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._seq += 1
        bisect.insort(
            self._waiters.setdefault(key, []), _OffsetWaiter(required_offset, self._seq, future)
        )
        self._count += 1
        future.add_done_callback(lambda _f: self._forget(key, future))
        return future

    def _forget(self, key: Hashable, future: asyncio.Future[int]) -> None:
        waiters = self._waiters.get(key)
        if not waiters:
            return
        for i, waiter in enumerate(waiters):
            if waiter.future is future:
                del waiters[i]
                self._count -= 1
                break
        if not waiters:
            self._waiters.pop(key, None)

    def advance(self, key: Hashable, watermark: int) -> None:
        waiters = self._waiters.get(key)
        if not waiters:
            return
        ready = [w for w in waiters if w.required_offset <= watermark]
        for waiter in ready:
            if not waiter.future.done():
                waiter.future.set_result(watermark)

    def fail(self, key: Hashable, error: BaseException) -> None:
        for waiter in list(self._waiters.get(key, ())):
            if not waiter.future.done():
                waiter.future.set_exception(error)


class KeySignals:
    """Wake long-poll fetches when any partition they wait on changes (append, HW, leadership)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._waiting: dict[Hashable, set[asyncio.Future[bool]]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def notify(self, key: Hashable) -> None:
        for future in self._waiting.pop(key, ()):
            if not future.done():
                future.set_result(True)

    async def wait_any(self, keys: Iterable[Hashable], timeout_s: float) -> bool:
        """Wait until one of `keys` is notified or the timeout passes; True if notified.

        One future and one timer per wait (no wait_for task): this runs for every long poll,
        and each wake-up is on the replication latency path.
        """
        if timeout_s <= 0:
            return False
        if self._count >= self._capacity:
            raise PurgatoryFullError(f"{self._count} fetch requests are already waiting")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        key_list = list(keys)
        for key in key_list:
            self._waiting.setdefault(key, set()).add(future)
        self._count += 1
        timer = loop.call_later(timeout_s, _time_out, future)
        try:
            return await future
        finally:
            timer.cancel()
            self._count -= 1
            for key in key_list:
                waiting = self._waiting.get(key)
                if waiting is not None:
                    waiting.discard(future)
                    if not waiting:
                        del self._waiting[key]


def _time_out(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)
