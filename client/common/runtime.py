"""Running a process's asyncio main: uvloop where it runs, clean stop on SIGTERM/SIGINT, and
the process-wide tuning a minibroker process starts with (`tune_process`).

Does I/O: installs signal handlers; `tune_process` sets glibc malloc parameters. `run(main)`
calls `main(stop)` where `stop` is an asyncio.Event set by the first SIGTERM or SIGINT; the
coroutine decides how to shut down (controlled shutdown for brokers) and returns the exit status.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import signal
import sys
from collections.abc import Awaitable, Callable

try:  # uvloop is 1.1-1.3x faster under grpc.aio here (docs/design.md §9)
    import uvloop
except ImportError:  # pragma: no cover - installed on every supported platform
    uvloop = None  # type: ignore[assignment]


# mallopt(3) parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# The largest mmap threshold glibc accepts on 64-bit (HEAP_MAX_SIZE / 2): every message a
# broker handles (1 MiB fetch responses, produce requests up to max.request.size) is below it.
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
# Free heap memory a process keeps for reuse before giving it back to the kernel.
TRIM_THRESHOLD_BYTES = 64 * 1024 * 1024


def tune_malloc() -> bool:
    """Keep freed message buffers in the heap instead of returning them to the kernel.

    By default glibc serves a large allocation with a fresh mmap and trims the heap top as soon
    as it is freed, so a process that builds and drops a 1 MiB message per request takes a page
    fault for every 4 KiB of every message and zeroes it again (measured on a 1 MiB gRPC stream
    between two processes: 2.6 ms of the server's CPU per message, 0.4 ms with these settings;
    round trip 3.3 -> 0.7 ms). Fixed thresholds turn that off, at the cost of up to
    TRIM_THRESHOLD_BYTES of free memory kept per process. Only the minibroker processes call
    this (brokers, the controller, the CLI): a library must not change its host's allocator.
    Returns False where there is no glibc (nothing is changed).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )


def tune_process() -> None:
    """Process-wide settings every `minibroker` command starts with (see tune_malloc)."""
    tune_malloc()


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
