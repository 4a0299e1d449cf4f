"""Running a process's asyncio main: uvloop where it runs, clean stop on SIGTERM/SIGINT, and
the process-wide tuning a minibroker process starts with (`tune_process`).

Does I/O: installs signal handlers; `tune_process` sets glibc malloc parameters and raises the
open-file limit. `run(main)` calls `main(stop)` where `stop` is an asyncio.Event set by the first
SIGTERM or SIGINT; the coroutine decides how to shut down (controlled shutdown for brokers) and
returns the exit status.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True, slots=True)
class OpenFileLimit:
    """RLIMIT_NOFILE as `raise_open_file_limit` left it, and the soft limit it found."""

    soft: int
    hard: int
    was: int


# Linux refuses a soft limit above fs.nr_open (this is its default) even when the hard limit
# is "unlimited".
_NR_OPEN_DEFAULT = 1024 * 1024
_open_file_limit: OpenFileLimit | None = None


def _nr_open() -> int:
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return _NR_OPEN_DEFAULT


def raise_open_file_limit() -> OpenFileLimit | None:
    """Raise this process's soft open-file limit to its hard limit.

    Kafka's JVM does this at start (HotSpot's -XX:+MaxFDLimit, on by default): a broker holds a
    file per partition replica plus its connections (about 2,100 at the default
    max.broker.partitions and max.connections), and many systems give processes a soft limit of
    1024 under a far higher hard one. The hard limit is the operator's: it is never touched.
    Returns the limits (None where the platform has none); a limit that cannot be raised is
    left as it is.
    """
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _nr_open() if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
    return OpenFileLimit(resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard, soft)


def open_file_limit() -> OpenFileLimit | None:
    """What `tune_process` did to the open-file limit (None before it ran); the servers log it."""
    return _open_file_limit


def log_open_file_limit(log: Any) -> None:
    """One `open_file_limit` event with what `tune_process` set (servers, at start)."""
    limit = _open_file_limit
    if limit is not None:
        log.info("open_file_limit", soft=limit.soft, hard=limit.hard, raised_from=limit.was)


def tune_process() -> None:
    """Process-wide settings every `minibroker` command starts with (see tune_malloc and
    raise_open_file_limit)."""
    global _open_file_limit
    tune_malloc()
    _open_file_limit = raise_open_file_limit()


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
