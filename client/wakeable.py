"""WakeableLoop: the background task shape the producer's sender and the consumer's fetcher share.

Does asyncio only (no network of its own). One task runs `step` again whenever something wakes
it (a new batch, an answer, a seek) or when the wait `step` asked for has passed, as Kafka's
Sender and the consumer's network thread poll with a timeout and are woken early by `wakeup()`.
It also keeps the requests the step spawned (cancelled on close), starts at most one metadata
refresh at a time, and turns a crash of the step (a bug) into `on_crash(error)` so that callers
waiting on futures or on poll() hear of it instead of waiting forever.

Event-loop thread only; `wake()` may be called before `start()` (it does nothing then).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from minibroker.client.errors import MiniBrokerError
from minibroker.client.transport import ClusterClient


class Stop(enum.Enum):
    STOP = "stop"


# What `step` returns to end the loop (a producer closed with nothing left to send).
STOP = Stop.STOP


class WakeableLoop:
    """A task that runs `step() -> wait_ms | None | STOP` until cancelled or told to stop."""

    def __init__(
        self,
        name: str,
        step: Callable[[], Awaitable[int | Stop | None]],
        on_crash: Callable[[Exception], None],
        cluster: ClusterClient,
        retry_backoff_ms: int,
    ) -> None:
        self.name = name
        self._step = step
        self._on_crash = on_crash
        self._cluster = cluster
        self._retry_backoff_ms = retry_backoff_ms
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[None] | None = None
        self.tasks: set[asyncio.Task[None]] = set()
        self._refresh: asyncio.Task[None] | None = None

    def start(self) -> asyncio.Task[None]:
        """Start the task on the running loop (once)."""
        if self.task is None:
            self._loop = asyncio.get_running_loop()
            self._event = asyncio.Event()
            self.task = self._loop.create_task(self._run(), name=self.name)
        return self.task

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def wake(self) -> None:
        if self._event is not None:
            self._event.set()

    async def _run(self) -> None:
        try:
            await self._forever()
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self._on_crash(err)
            raise

    async def _forever(self) -> None:
        assert self._event is not None
        while True:
            self._event.clear()
            wait_ms = await self._step()
            if wait_ms is STOP:
                return
            await self.sleep(wait_ms)

    async def sleep(self, wait_ms: int | None) -> None:
        """Until woken, or until `wait_ms` (at least 1 ms; None: no timer) has passed."""
        assert self._event is not None and self._loop is not None
        if self._event.is_set():
            return
        timer = None
        if wait_ms is not None:
            timer = self._loop.call_later(max(wait_ms, 1) / 1000, self._event.set)
        try:
            await self._event.wait()
        finally:
            if timer is not None:
                timer.cancel()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a request beside the loop; it is cancelled by `cancel_requests`."""
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def refresh_metadata_if_due(self, now_ms: int) -> None:
        """Start a metadata refresh when the cache asks for one and none is running."""
        if self._cluster.metadata.needs_update(now_ms) and (
            self._refresh is None or self._refresh.done()
        ):
            assert self._loop is not None
            self._refresh = self._loop.create_task(self._refresh_metadata())

    async def _refresh_metadata(self) -> None:
        try:
            await self._cluster.refresh_metadata()
        except MiniBrokerError:
            # No broker answered: back off before the loop may ask again, or an unreachable
            # cluster would be polled in a tight loop.
            await asyncio.sleep(self._retry_backoff_ms / 1000)
        finally:
            self.wake()

    async def cancel_requests(self) -> None:
        """Cancel every spawned request and wait until they have ended."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


__all__ = ["STOP", "Stop", "WakeableLoop"]
