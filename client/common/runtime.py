"""Running a process's asyncio main: uvloop where it runs, clean stop on SIGTERM/SIGINT.

Does I/O: installs signal handlers. `run(main)` calls `main(stop)` where `stop` is an
asyncio.Event set by the first SIGTERM or SIGINT; the coroutine decides how to shut down
(controlled shutdown for brokers) and returns the exit status.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable

try:  # uvloop is 1.1-1.3x faster under grpc.aio here (research/perf-baseline.md)
    import uvloop
except ImportError:  # pragma: no cover - installed on every supported platform
    uvloop = None  # type: ignore[assignment]


def new_event_loop() -> asyncio.AbstractEventLoop:
    return uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()


def run(main: Callable[[asyncio.Event], Awaitable[int]]) -> int:
    async def wrapper() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await main(stop)

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(wrapper())
