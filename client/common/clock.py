"""The wall clock in milliseconds (Kafka's Time.milliseconds()), one definition for every process.

Record timestamps, `segment.ms`, `retention.ms`, `flush.ms`, the broker's replica-lag and
produce-deadline clock and `watch` read it; pure cores never call it, they are handed `now_ms`.
Deadlines that must not jump when the system clock is stepped use a monotonic clock instead
(`minibroker.client.transport.now_ms`; the controller anchors wall time to the monotonic clock).
"""

from __future__ import annotations

import time


def wall_clock_ms() -> int:
    """Milliseconds since the epoch, read from the system clock."""
    return time.time_ns() // 1_000_000
