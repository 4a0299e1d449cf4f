"""`minibroker bench failover`: time from SIGKILL of a partition leader to the first acks=all
write acknowledged by its successor, over repeated kills (issue: median under 1 s).

I/O shell: starts a throwaway local cluster (free ports, a temp dir), keeps one acks=all
producer writing single records to one partition, kills the leader, records when the first
acknowledgement after the kill arrives (the old leader is dead, so it came from the new one),
restarts the killed broker, waits for a full ISR, and repeats. Prints each kill and the median.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from typing import Any

from minibroker.deploy import cluster as launcher


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "failover",
        help="SIGKILL a leader repeatedly; time until the new leader acknowledges a write",
    )
    parser.add_argument("--kills", type=int, default=10, help="number of kills (default 10)")
    parser.add_argument(
        "--controllers",
        type=int,
        choices=(1, 3, 5),
        default=1,
        help="controllers in the quorum (default 1; 3 to check that a quorum does not slow "
        "broker failover down)",
    )
    parser.add_argument(
        "--retry-backoff-ms",
        type=int,
        default=100,
        help="the producer's retry.backoff.ms (default 100, Kafka's)",
    )
    parser.set_defaults(func=main)


class AckClock:
    """A producer sending one acks=all record at a time, noting when each ack arrives."""

    def __init__(self, bootstrap: str, retry_backoff_ms: int) -> None:
        from minibroker.client import Producer

        self._producer = Producer(
            bootstrap,
            acks="all",
            linger_ms=0,
            retry_backoff_ms=retry_backoff_ms,
            request_timeout_ms=10_000,
        )
        self._acks: list[tuple[float, float]] = []  # (sent, acknowledged)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            sent = time.monotonic()
            future = self._producer.send("failover", f"r{i}".encode(), partition=0)
            i += 1
            try:
                future.result(timeout=60)
            except Exception:
                continue
            with self._lock:
                self._acks.append((sent, time.monotonic()))

    def first_ack_after(self, t0: float, timeout_s: float) -> float:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                # An ack that arrives within 10 ms of the kill for a record sent before it was
                # already on the wire from the old leader: no election is that fast.
                later = [
                    acked
                    for sent, acked in self._acks
                    if acked > t0 and not (sent < t0 and acked - t0 < 0.010)
                ]
            if later:
                return later[0] - t0
            time.sleep(0.002)
        raise launcher.LauncherError(f"no acknowledgement within {timeout_s}s of the kill")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self._producer.close()


def main(args: argparse.Namespace) -> int:
    from minibroker.client import Admin

    with tempfile.TemporaryDirectory(prefix="minibroker-failover-") as directory:
        state = launcher.up(
            directory,
            brokers=3,
            base_port=0,
            settings={"leader.imbalance.check.interval.seconds": "3600"},
            controllers=args.controllers,
        )
        admin = Admin(state.bootstrap_servers)
        clock = AckClock(state.bootstrap_servers, args.retry_backoff_ms)
        times: list[float] = []
        try:
            admin.create_topic("failover", 1, 3, {"min.insync.replicas": "2"})

            def partition() -> Any:
                return admin.describe_topics(["failover"])[0].partitions[0]

            launcher.wait_for(lambda: len(partition().isr) == 3, 30, "a full ISR")
            clock.start()
            for n in range(1, args.kills + 1):
                launcher.wait_for(lambda: len(partition().isr) == 3, 60, "a full ISR")
                time.sleep(0.3)  # steady state: acks flowing
                leader = partition().leader
                t0 = time.monotonic()
                launcher.act(directory, "kill", str(leader))
                elapsed = clock.first_ack_after(t0, 30)
                times.append(elapsed)
                print(
                    f"kill {n}: broker {leader} -> first acks=all write acknowledged by the "
                    f"new leader after {elapsed * 1000:.0f} ms",
                    flush=True,
                )
                launcher.act(directory, "start", str(leader))
        finally:
            clock.stop()
            admin.close()
            launcher.down(directory)
    print(
        f"failover ({args.controllers} controller(s)) over {len(times)} kills: "
        f"median {statistics.median(times) * 1000:.0f} ms, "
        f"min {min(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms"
    )
    return 0
