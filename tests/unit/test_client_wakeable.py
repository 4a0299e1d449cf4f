"""WakeableLoop, the loop shape the producer's sender and the consumer's fetcher share: a step
runs when woken or when the wait it asked for has passed, STOP ends it, a crash is reported,
spawned requests are cancelled on close. Driven on a real event loop; waits have deadlines.
"""

from __future__ import annotations

import asyncio

import pytest

from minibroker.client.consumer import AsyncConsumer
from minibroker.client.producer import AsyncProducer
from minibroker.client.transport import ClusterClient
from minibroker.client.wakeable import STOP, Stop, WakeableLoop

DEADLINE_S = 10


class Steps:
    """A step that counts its runs, returns what the test queued, and lets the test await the
    next run."""

    def __init__(self, waits: list[int | Stop | None]) -> None:
        self.runs = 0
        self.waits = waits
        self.ran = asyncio.Event()

    async def __call__(self) -> int | Stop | None:
        self.runs += 1
        self.ran.set()
        return self.waits.pop(0) if self.waits else None

    async def next_run(self) -> None:
        self.ran.clear()
        await asyncio.wait_for(self.ran.wait(), DEADLINE_S)


def make(step: Steps, crashes: list[Exception] | None = None) -> WakeableLoop:
    return WakeableLoop(
        "test-loop",
        step,
        (crashes if crashes is not None else []).append,
        ClusterClient("127.0.0.1:1"),
        retry_backoff_ms=10,
    )


def test_a_step_runs_when_woken_and_when_its_wait_has_passed() -> None:
    async def main() -> None:
        step = Steps([None, None, 5, None])
        loop = make(step)
        loop.wake()  # before start: nothing to wake, nothing fails
        loop.start()
        await step.next_run()
        assert step.runs == 1 and loop.running
        loop.wake()
        await step.next_run()
        assert step.runs == 2, "woken"
        loop.wake()
        await step.next_run()  # this run asks to be run again after 5 ms
        await step.next_run()
        assert step.runs == 4, "its timer ran it again without a wake"
        loop.task.cancel()  # type: ignore[union-attr]
        await asyncio.gather(loop.task, return_exceptions=True)  # type: ignore[arg-type]
        assert not loop.running

    asyncio.run(main())


def test_stop_ends_the_loop_without_error() -> None:
    async def main() -> None:
        step = Steps([STOP])
        loop = make(step)
        task = loop.start()
        await asyncio.wait_for(task, DEADLINE_S)
        assert step.runs == 1 and not loop.running and task.exception() is None

    asyncio.run(main())


def test_a_crash_is_reported_and_ends_the_task_with_the_error() -> None:
    async def main() -> None:
        crashes: list[Exception] = []
        bug = RuntimeError("bug")

        async def step() -> int | None:
            raise bug

        loop = make(step, crashes)  # type: ignore[arg-type]
        with pytest.raises(RuntimeError, match="bug"):
            await asyncio.wait_for(loop.start(), DEADLINE_S)
        assert crashes == [bug]

    asyncio.run(main())


def test_spawned_requests_are_cancelled_on_close() -> None:
    async def main() -> None:
        step = Steps([])
        loop = make(step)
        loop.start()
        started = asyncio.Event()

        async def request() -> None:
            started.set()
            await asyncio.Event().wait()

        loop.spawn(request())
        await asyncio.wait_for(started.wait(), DEADLINE_S)
        assert len(loop.tasks) == 1
        await loop.cancel_requests()
        assert not loop.tasks
        loop.task.cancel()  # type: ignore[union-attr]
        await asyncio.gather(loop.task, return_exceptions=True)  # type: ignore[arg-type]

    asyncio.run(main())


def test_the_sender_and_the_fetcher_run_on_it() -> None:
    assert isinstance(AsyncProducer("h:1")._sender.loop, WakeableLoop)
    assert isinstance(AsyncConsumer("h:1")._fetcher.loop, WakeableLoop)
