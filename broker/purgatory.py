"""The fetch purgatory (Kafka's DelayedFetch purgatory): long-poll fetches waiting for data.

I/O shell (asyncio futures), event-loop thread only. Bounded: a caller that would exceed
`capacity` gets `PurgatoryFullError` and answers its client with an error instead of parking, so
a flood of slow requests cannot grow memory without limit. acks=all produces park in the replica
core (`PartitionReplica`, bounded by its own limit), not here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable

from minibroker.client.errors import MiniBrokerError


class PurgatoryFullError(MiniBrokerError):
    """Too many parked requests; the client should retry."""


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
