"""`minibroker bench produce|consume|e2e`: Kafka's producer and consumer perf-test tools.

Does network I/O (AsyncProducer / AsyncConsumer on uvloop) and prints measured figures; it never
asserts. Output lines follow kafka-producer-perf-test.sh (a progress line every 5 s and a final
summary with latency percentiles) and kafka-consumer-perf-test.sh (a CSV header and one line);
MB is 1024 * 1024 bytes, as in Kafka's tools. Latency is measured per record from `send` to the
acknowledgement callback. The consumer test has no consumer group, so rebalance.time.ms is 0.

Like Kafka's scripts, which start these tools with GC settings for throughput, the tools raise
CPython's generation-0 GC threshold (`--gc-threshold`, default 100000; 0 keeps Python's 700):
a producer with many records buffered keeps one future per record alive, and with the default
thresholds the full collections that rescan them took ~30 % of the client's CPU (measured: 17 ->
11-13 us of client CPU per 100 B record). Applications that produce at high rates can do the
same; the library itself leaves the process's GC alone.

`e2e` (Kafka's EndToEndLatency, at a fixed rate instead of one record at a time): a producer
in this process and a consumer in a child process (`--same-process`: both on one event loop);
each value starts with the send time (wall-clock ns, big-endian int64, one clock for both
processes on one machine) and latency is the consumer's receive time minus that, so
sub-millisecond figures survive (record timestamps are whole ms). The summary line has the
producer tool's shape, with latencies in fractional ms.

CPU per record: `produce` and `consume` also print the client process's CPU time (user + sys, all
threads: `time.process_time()`) over the measured interval divided by the records sent or read,
in us: after the Kafka-shaped summary for `produce` (`client CPU 3.10 us/record (...)`) and as the
extra CSV column client.cpu.us.per.msg for `consume`. `--broker-pids PID,...` adds the same for
other processes (e.g. the brokers of a local cluster), from their utime + stime in
/proc/<pid>/stat. `--json` prints one JSON object with every figure instead (progress lines go to
stderr). The produce figure includes the tool's own per-record work (a send time and a done
callback per record, see AckTimes: ~1 us of CPU a 100 B record, 2.4 vs 1.4 us with the producer
of issue 22); `--no-latency` drops it, so the figure is the producer's alone.

`produce --client sync` runs the blocking `minibroker.client.sync.Producer` (send returns a
concurrent future, one flush at the end) from this thread instead of AsyncProducer; its client
CPU includes the client's event-loop thread.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import datetime
import gc
import json
import multiprocessing
import operator
import os
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from minibroker.client.cli.common import (
    add_bootstrap_argument,
    bootstrap_of,
    guarded,
    parse_config_pairs,
    run_async,
    security_of,
)
from minibroker.client.produce_result import FutureRecordMetadata
from minibroker.client.types import TopicPartition

MB = 1024 * 1024
REPORT_INTERVAL_S = 5.0


def register(sub: Any) -> None:
    produce = sub.add_parser(
        "produce",
        help="producer throughput, latency and client CPU per record (kafka-producer-perf-test.sh)",
        description="Send records as fast as allowed and report throughput, latency and the "
        "client's CPU time per record (user + sys over the measured interval).",
    )
    produce.add_argument("--topic", required=True)
    produce.add_argument("--num-records", type=int, required=True)
    produce.add_argument("--record-size", type=int, required=True, help="value bytes")
    produce.add_argument("--acks", default="all", choices=["all", "-1", "1", "0"])
    produce.add_argument(
        "--throughput", type=float, default=-1, help="records/s cap (-1: unlimited)"
    )
    produce.add_argument(
        "--producer-props",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="producer keyword arguments, e.g. linger_ms=5 batch_size=1048576",
    )
    produce.add_argument(
        "--client",
        choices=["async", "sync"],
        default="async",
        help="async: AsyncProducer on one event loop (default); sync: the blocking "
        "minibroker.client.sync.Producer (send returns a future, one flush at the end)",
    )
    produce.add_argument(
        "--no-latency",
        dest="latency",
        action="store_false",
        help="time no record (no done callback per record): the client CPU per record is then "
        "the producer's own; the latency figures print as 0",
    )
    _add_cpu_arguments(produce)
    _add_gc_argument(produce)
    add_bootstrap_argument(produce)
    produce.set_defaults(func=guarded(_bench_produce))

    consume = sub.add_parser(
        "consume",
        help="consumer throughput and client CPU per record (kafka-consumer-perf-test.sh)",
        description="Read records from the start of a topic and report throughput and the "
        "client's CPU time per record (user + sys over the measured interval).",
    )
    consume.add_argument("--topic", required=True)
    consume.add_argument("--messages", type=int, required=True)
    consume.add_argument(
        "--timeout", type=int, default=10_000, help="max ms between records before giving up"
    )
    _add_cpu_arguments(consume)
    _add_gc_argument(consume)
    add_bootstrap_argument(consume)
    consume.set_defaults(func=guarded(_bench_consume))

    e2e = sub.add_parser(
        "e2e",
        help="end-to-end latency at a fixed rate (produce -> consumer sees it)",
        description="Produce at a fixed rate while a consumer reads from the end; report the "
        "latency from send to receipt per record.",
    )
    e2e.add_argument("--topic", required=True)
    e2e.add_argument("--rate", type=float, required=True, help="records/s to produce")
    e2e.add_argument("--num-records", type=int, required=True)
    e2e.add_argument("--record-size", type=int, default=1024, help="value bytes (>= 8)")
    e2e.add_argument("--acks", default="all", choices=["all", "-1", "1", "0"])
    e2e.add_argument(
        "--producer-props",
        nargs="*",
        default=["linger_ms=0"],
        metavar="KEY=VALUE",
        help="AsyncProducer keyword arguments (default linger_ms=0, as latency tests use)",
    )
    e2e.add_argument(
        "--timeout", type=int, default=10_000, help="max ms to wait for the last records"
    )
    e2e.add_argument(
        "--same-process",
        action="store_true",
        help="run the consumer on the producer's event loop instead of in its own process",
    )
    _add_gc_argument(e2e)
    add_bootstrap_argument(e2e)
    e2e.set_defaults(func=guarded(_bench_e2e))


DEFAULT_GC_THRESHOLD = 100_000


def _pid_list(text: str) -> list[int]:
    try:
        pids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected PID[,PID...], got {text!r}") from None
    if not pids or min(pids) <= 0:
        raise argparse.ArgumentTypeError(f"expected PID[,PID...], got {text!r}")
    return pids


def _add_cpu_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker-pids",
        type=_pid_list,
        default=[],
        metavar="PID[,PID...]",
        help="also print these processes' CPU per record (e.g. the brokers'), from /proc",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object with every figure (progress lines go to stderr)",
    )


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def pid_cpu_s(pid: int) -> float | None:
    """User + sys CPU seconds of a process, all its threads (/proc/<pid>/stat utime + stime);
    None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # fields 14 and 15 of stat


@dataclass(slots=True)
class CpuUsage:
    """CPU time spent over a measured interval, and per record of it."""

    records: int
    client_s: float
    broker_s: float | None = None  # None: no --broker-pids
    broker_pids: int = 0  # how many of them were measured at both ends

    @property
    def client_us_per_record(self) -> float:
        return self.client_s * 1e6 / max(self.records, 1)

    @property
    def broker_us_per_record(self) -> float | None:
        if self.broker_s is None:
            return None
        return self.broker_s * 1e6 / max(self.records, 1)

    def text(self) -> str:
        line = f"client CPU {self.client_us_per_record:.2f} us/record ({self.client_s:.2f} s)"
        if self.broker_s is not None:
            line += (
                f", brokers' CPU {self.broker_us_per_record:.2f} us/record "
                f"({self.broker_s:.2f} s, {self.broker_pids} processes)"
            )
        return line + "."

    def fields(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "client_cpu_s": round(self.client_s, 6),
            "client_cpu_us_per_record": round(self.client_us_per_record, 4),
        }
        if self.broker_s is not None:
            out["broker_cpu_s"] = round(self.broker_s, 6)
            out["broker_cpu_us_per_record"] = round(self.broker_us_per_record or 0.0, 4)
            out["broker_pids"] = self.broker_pids
        return out


class CpuMeter:
    """`start()` ... `stop(records)`: this process's CPU (every thread, `time.process_time`)
    and, optionally, other processes' (from /proc) over the interval."""

    def __init__(self, pids: Sequence[int] = ()) -> None:
        self.pids = list(pids)
        self.client_start = 0.0
        self.pid_start: dict[int, float | None] = {}

    def start(self) -> None:
        self.pid_start = {pid: pid_cpu_s(pid) for pid in self.pids}
        self.client_start = time.process_time()

    def stop(self, records: int) -> CpuUsage:
        client = time.process_time() - self.client_start
        if not self.pids:
            return CpuUsage(records, client)
        total = 0.0
        counted = 0
        for pid, before in self.pid_start.items():
            after = pid_cpu_s(pid)
            if before is not None and after is not None:
                total += after - before
                counted += 1
        return CpuUsage(records, client, total, counted)


@dataclass(slots=True)
class BenchResult:
    """One run's figures: `line` is the text output's summary, `fields` the --json object."""

    line: str
    fields: dict[str, Any] = field(default_factory=dict)
    warning: str | None = None


def _add_gc_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gc-threshold",
        type=int,
        default=DEFAULT_GC_THRESHOLD,
        help="CPython generation-0 GC threshold for this run (0: Python's default)",
    )


def tune_gc(threshold0: int) -> None:
    """Fewer collections for a run that keeps many live objects (see the module docstring)."""
    if threshold0 > 0:
        gc.set_threshold(threshold0, 50, 100)


class LatencyStats:
    """Kafka's ProducerPerformance.Stats: window lines and the final percentile line.

    `record` runs once per acknowledged record, so it only appends; counts, sums and maxima are
    computed from `latencies` when a window line or the summary is printed.
    """

    def __init__(self, num_records: int, out: TextIO, clock: Any = time.monotonic) -> None:
        self.clock = clock
        self.out = out
        self.start = clock()
        self.latencies: list[float] = []
        self.bytes = 0
        self.window_start = self.start
        self.window_first = 0  # index in `latencies` of the window's first record
        self.window_bytes_start = 0
        self.expected = num_records

    @property
    def count(self) -> int:
        return len(self.latencies)

    @property
    def total_latency(self) -> float:
        return sum(self.latencies)

    @property
    def max_latency(self) -> float:
        return max(self.latencies, default=0.0)

    def record(self, latency_ms: float, size: int, now: float | None = None) -> None:
        self.latencies.append(latency_ms)
        self.bytes += size
        if now is None:
            now = self.clock()
        if now - self.window_start >= REPORT_INTERVAL_S:
            self.print_window(now)

    def print_window(self, now: float) -> None:
        elapsed = max(now - self.window_start, 1e-9)
        window = self.latencies[self.window_first :]
        count = len(window)
        window_bytes = self.bytes - self.window_bytes_start
        self.out.write(
            f"{count} records sent, {count / elapsed:.1f} records/sec "
            f"({window_bytes / MB / elapsed:.2f} MB/sec), {sum(window) / max(count, 1):.1f} ms "
            f"avg latency, {max(window, default=0.0):.1f} ms max latency.\n"
        )
        self.out.flush()
        self.window_start = now
        self.window_first = len(self.latencies)
        self.window_bytes_start = self.bytes

    def summary(self, end: float | None = None) -> str:
        elapsed = max((end if end is not None else self.clock()) - self.start, 1e-9)
        ordered = sorted(self.latencies)

        def pct(p: float) -> int:
            if not ordered:
                return 0
            return int(ordered[min(len(ordered) - 1, int(p * len(ordered)))])

        count = len(ordered)
        top = ordered[-1] if ordered else 0.0
        return (
            f"{count} records sent, {count / elapsed:.1f} records/sec "
            f"({self.bytes / MB / elapsed:.2f} MB/sec), {sum(ordered) / max(count, 1):.2f} ms avg "
            f"latency, {top:.2f} ms max latency, {pct(0.5)} ms 50th, "
            f"{pct(0.95)} ms 95th, {pct(0.99)} ms 99th, {pct(0.999)} ms 99.9th."
        )

    def fields(self, end: float) -> dict[str, Any]:
        """The summary's figures for --json (latencies in fractional ms)."""
        elapsed = max(end - self.start, 1e-9)
        summary = LatencySummary(self.latencies)
        count = len(self.latencies)
        return {
            "records": count,
            "elapsed_s": round(elapsed, 6),
            "records_per_sec": round(count / elapsed, 3),
            "mb_per_sec": round(self.bytes / MB / elapsed, 4),
            "avg_latency_ms": round(sum(self.latencies) / max(count, 1), 4),
            "max_latency_ms": round(max(self.latencies, default=0.0), 4),
            "p50_ms": round(summary.pct(0.5), 4),
            "p95_ms": round(summary.pct(0.95), 4),
            "p99_ms": round(summary.pct(0.99), 4),
            "p999_ms": round(summary.pct(0.999), 4),
        }


# Kafka property names whose AsyncProducer keyword is not simply the dotted name with "_".
_PRODUCER_ALIASES = {
    "max.in.flight.requests.per.connection": "max_in_flight",
    "bootstrap.servers": "bootstrap_servers",
}


def _typed_props(pairs: list[str]) -> dict[str, Any]:
    """`--producer-props` (Kafka names or keyword names) -> AsyncProducer keyword arguments."""
    out: dict[str, Any] = {}
    for key, raw in parse_config_pairs(pairs).items():
        name = _PRODUCER_ALIASES.get(key, key.replace(".", "_"))
        value: Any = raw
        if raw.lstrip("-").isdigit():
            value = int(raw)
        elif raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        out[name] = value
    return out


def _produce_result(
    args: argparse.Namespace,
    stats: LatencyStats,
    end: float,
    cpu: CpuUsage,
    failures: list[BaseException],
) -> BenchResult:
    if not getattr(args, "latency", True):
        # No callback timed the records: count the acknowledged ones, latency 0.
        acked = args.num_records - len(failures)
        stats.latencies = [0.0] * acked
        stats.bytes = acked * args.record_size
    line = f"{stats.summary(end)} {cpu.text()}"
    if failures:
        line += f" ({len(failures)} failed: {type(failures[0]).__name__}: {failures[0]})"
    fields: dict[str, Any] = {
        "bench": "produce",
        "client": getattr(args, "client", "async"),
        "record_size": args.record_size,
        "records_sent": args.num_records,
        **stats.fields(end),
        "failed": len(failures),
        **cpu.fields(),
    }
    return BenchResult(line, fields)


class AckTimes:
    """The tool's per-record work when it times latency, kept small next to the producer's: at
    send, the send time by future (one dict store); at the acknowledgement, on whatever thread
    the producer calls back from, one append of (future, latency ms), no lock. Whether a record
    failed is read after the measured interval (`finish`), and window lines are printed from
    the sending loop (`window`). Like Kafka's tool, a record's latency runs to its callback."""

    def __init__(self, stats: LatencyStats, size: int) -> None:
        self.stats = stats
        self.size = size
        self.sent_at: dict[Any, float] = {}
        self.acks: list[tuple[Any, float]] = []
        self.moved = 0  # acks already in stats.latencies (window lines)
        pop = self.sent_at.pop
        append = self.acks.append
        monotonic = time.monotonic

        def done(future: Any) -> None:
            append((future, (monotonic() - pop(future)) * 1000.0))

        self.done = done

    def window(self, now: float) -> None:
        """Print a window line if one is due (called by the sending loop)."""
        stats = self.stats
        if now - stats.window_start < REPORT_INTERVAL_S:
            return
        acks = self.acks[self.moved :]  # a copy: callbacks may append meanwhile
        self.moved += len(acks)
        stats.latencies.extend(latency for _, latency in acks)
        stats.bytes = len(stats.latencies) * self.size
        stats.print_window(now)

    def finish(self, failures: list[BaseException], cancelled: type[BaseException]) -> None:
        """After the interval: the successful records' latencies; failures counted."""
        ok: list[float] = []
        for future, latency in self.acks:
            if future.cancelled():
                failures.append(cancelled())
            elif (error := future.exception()) is not None:
                failures.append(error)
            else:
                ok.append(latency)
        self.stats.latencies = ok
        self.stats.bytes = len(ok) * self.size


async def bench_produce(args: argparse.Namespace, out: TextIO) -> BenchResult:
    """AsyncProducer on this event loop (`--client async`)."""
    from minibroker.client.producer import AsyncProducer

    payload = os.urandom(args.record_size)
    stats = LatencyStats(args.num_records, out)
    props = {"acks": args.acks, **security_of(args), **_typed_props(args.producer_props)}
    bootstrap = props.pop("bootstrap_servers", None) or bootstrap_of(args)
    timed = getattr(args, "latency", True)
    meter = CpuMeter(getattr(args, "broker_pids", ()))
    failures: list[BaseException] = []
    untimed: list[FutureRecordMetadata] = []
    async with AsyncProducer(bootstrap, **props) as producer:
        await producer.partitions_for(args.topic)  # fail fast on an unknown topic
        size = len(payload)
        meter.start()
        start = time.monotonic()
        stats.start = stats.window_start = start

        acks = AckTimes(stats, size)
        sent_at = acks.sent_at
        done = acks.done
        monotonic = time.monotonic
        next_window = start + REPORT_INTERVAL_S
        # One context for every callback: asyncio's add_done_callback would copy one per
        # record. Futures of another kind (a producer's own) need none.
        context = contextvars.copy_context()
        asyncio_futures: bool | None = None  # known at the first send

        for i in range(args.num_records):
            if args.throughput > 0:
                # Throttle like Kafka's ThroughputThrottler: sleep when ahead of schedule.
                ahead = i / args.throughput - (time.monotonic() - start)
                if ahead > 0.001:
                    await asyncio.sleep(ahead)
            if timed:
                started = monotonic()
                if started >= next_window:
                    acks.window(started)
                    next_window = stats.window_start + REPORT_INTERVAL_S
                future = await producer.send(args.topic, payload)
                sent_at[future] = started
                if asyncio_futures is None:
                    asyncio_futures = isinstance(future, asyncio.Future)
                if asyncio_futures:
                    future.add_done_callback(done, context=context)
                else:
                    future.add_done_callback(done)  # a plain callback: no context to enter
            else:
                untimed.append(await producer.send(args.topic, payload))
        await producer.flush()
        end = time.monotonic()
        cpu = meter.stop(args.num_records)
    # After the measured interval: which records failed.
    acks.finish(failures, asyncio.CancelledError)
    for future in untimed:
        if future.cancelled() or future.exception() is not None:
            failures.append(future.exception() or asyncio.CancelledError())
    return _produce_result(args, stats, end, cpu, failures)


def bench_produce_sync(args: argparse.Namespace, out: TextIO) -> BenchResult:
    """The blocking Producer from this thread (`--client sync`); its acknowledgements (and
    so the latency callbacks) arrive on the client's event-loop thread."""
    import concurrent.futures

    from minibroker.client.sync import Producer

    payload = os.urandom(args.record_size)
    stats = LatencyStats(args.num_records, out)
    props = {"acks": args.acks, **security_of(args), **_typed_props(args.producer_props)}
    bootstrap = props.pop("bootstrap_servers", None) or bootstrap_of(args)
    timed = getattr(args, "latency", True)
    meter = CpuMeter(getattr(args, "broker_pids", ()))
    failures: list[BaseException] = []
    untimed: list[FutureRecordMetadata] = []
    with Producer(bootstrap, **props) as producer:
        producer.partitions_for(args.topic)  # fail fast on an unknown topic
        size = len(payload)
        # Acknowledgements call back on the client's loop thread (or on this one for a record
        # already done); AckTimes needs no lock for that.
        acks = AckTimes(stats, size)
        sent_at = acks.sent_at
        done = acks.done
        monotonic = time.monotonic

        meter.start()
        start = time.monotonic()
        stats.start = stats.window_start = start
        next_window = start + REPORT_INTERVAL_S
        for i in range(args.num_records):
            if args.throughput > 0:
                ahead = i / args.throughput - (time.monotonic() - start)
                if ahead > 0.001:
                    time.sleep(ahead)
            if timed:
                started = monotonic()
                if started >= next_window:
                    acks.window(started)
                    next_window = stats.window_start + REPORT_INTERVAL_S
                future = producer.send(args.topic, payload)
                sent_at[future] = started
                future.add_done_callback(done)
            else:
                untimed.append(producer.send(args.topic, payload))
        producer.flush()
        end = time.monotonic()
        cpu = meter.stop(args.num_records)
    acks.finish(failures, concurrent.futures.CancelledError)
    for future in untimed:
        if future.cancelled() or future.exception() is not None:
            failures.append(future.exception() or concurrent.futures.CancelledError())
    return _produce_result(args, stats, end, cpu, failures)


def _bench_produce(args: argparse.Namespace) -> int:
    tune_gc(args.gc_threshold)
    progress = sys.stderr if args.json else sys.stdout
    if args.client == "sync":
        result = bench_produce_sync(args, progress)
    else:
        result = run_async(bench_produce(args, progress))
    print(json.dumps(result.fields) if args.json else result.line)
    return 0


class LatencySummary:
    """Percentiles of many latencies in fractional ms (Kafka's tools print whole ms, which
    hides everything that matters below a few ms)."""

    def __init__(self, latencies_ms: list[float]) -> None:
        self.ordered = sorted(latencies_ms)

    def pct(self, p: float) -> float:
        if not self.ordered:
            return 0.0
        return self.ordered[min(len(self.ordered) - 1, int(p * len(self.ordered)))]

    def line(self, received: int, elapsed_s: float, total_bytes: int, sent: int) -> str:
        elapsed_s = max(elapsed_s, 1e-9)
        n = max(len(self.ordered), 1)
        avg = sum(self.ordered) / n
        top = self.ordered[-1] if self.ordered else 0.0
        missing = f" ({sent - received} of {sent} never arrived)" if received < sent else ""
        return (
            f"{received} records received, {received / elapsed_s:.1f} records/sec "
            f"({total_bytes / MB / elapsed_s:.2f} MB/sec), {avg:.2f} ms avg latency, "
            f"{top:.2f} ms max latency, {self.pct(0.5):.2f} ms 50th, {self.pct(0.95):.2f} ms "
            f"95th, {self.pct(0.99):.2f} ms 99th, {self.pct(0.999):.2f} ms 99.9th.{missing}"
        )


_SEND_TIME = struct.Struct(">q")


async def _consume_latencies(
    bootstrap: str,
    topic: str,
    num_records: int,
    timeout_ms: int,
    security: dict[str, Any] | None = None,
    *,
    ready: Callable[[], object],
    all_sent: Callable[[], bool],
) -> tuple[list[float], int]:
    """Read `topic` from its end until `num_records` of ours arrived (or `timeout_ms` passed
    without a record once everything was sent); latency = receipt - the send time in the value.

    `ready()` is called once every partition's position is pinned (nothing sent before it can
    be missed); `all_sent()` says whether the producer has flushed everything.
    """
    from minibroker.client.consumer import AsyncConsumer

    latencies: list[float] = []
    received_bytes = 0
    async with AsyncConsumer(
        bootstrap, auto_offset_reset="latest", fetch_max_wait_ms=500, **(security or {})
    ) as consumer:
        info = await consumer.cluster.wait_for_topic(topic, consumer.max_block_ms)
        tps = [TopicPartition(topic, p) for p in sorted(info.partitions)]
        consumer.assign(tps)
        for tp in tps:
            await consumer.position(tp)  # pin "latest" before the first record is sent
        ready()
        unpack = _SEND_TIME.unpack_from
        while len(latencies) < num_records:
            done = all_sent()
            records = await consumer.poll(timeout_ms if done else 1_000)
            now_ns = time.time_ns()
            if not records and done:
                break
            for r in records:
                value = r.value or b""
                if len(value) < _SEND_TIME.size:
                    continue  # not ours: another writer shares the topic
                latencies.append((now_ns - unpack(value)[0]) / 1e6)
                received_bytes += len(value)
    return latencies, received_bytes


def _e2e_consumer_process(conn: Any, args: tuple[Any, ...], gc_threshold: int) -> None:
    """The consumer side of `bench e2e` in its own process: it reports "ready", then the
    latencies; the parent says "sent" once the producer has flushed."""
    tune_gc(gc_threshold)
    sent = False

    def all_sent() -> bool:
        nonlocal sent
        if not sent and conn.poll():
            sent = conn.recv() == "sent"
        return sent

    try:
        result = run_async(
            _consume_latencies(*args, ready=lambda: conn.send("ready"), all_sent=all_sent)
        )
        conn.send(("done", result))
    except Exception as err:  # handed to the parent, which raises it as its own
        try:
            conn.send(("failed", err))
        except Exception:  # an error that does not pickle goes as text
            conn.send(("failed", RuntimeError(f"{type(err).__name__}: {err}")))
    finally:
        conn.close()


async def bench_e2e(args: argparse.Namespace, out: TextIO) -> str:
    from minibroker.client.producer import AsyncProducer

    if args.rate <= 0 or args.num_records <= 0:
        raise ValueError("--rate and --num-records must be positive")
    size = max(args.record_size, _SEND_TIME.size)
    filler = os.urandom(size - _SEND_TIME.size)
    props = {"acks": args.acks, **security_of(args), **_typed_props(args.producer_props)}
    bootstrap = props.pop("bootstrap_servers", None) or bootstrap_of(args)
    failures: list[BaseException] = []
    loop = asyncio.get_running_loop()
    consumer_args = (bootstrap, args.topic, args.num_records, args.timeout, security_of(args))
    sent_event = asyncio.Event()

    if getattr(args, "same_process", False):
        ready_event = asyncio.Event()
        # Any: this branch's reader gives the latencies, the other's the child's message.
        reader: asyncio.Future[Any] = asyncio.ensure_future(
            _consume_latencies(*consumer_args, ready=ready_event.set, all_sent=sent_event.is_set)
        )
        waiter: asyncio.Future[Any] = asyncio.ensure_future(ready_event.wait())
        await asyncio.wait([waiter, reader], return_when=asyncio.FIRST_COMPLETED)
        if reader.done():
            reader.result()  # the consumer failed before it was ready: raise its error
        mark_sent = sent_event.set
        proc = None
    else:
        # The consumer gets its own process, as an application's consumer would: sharing the
        # producer's event loop would add the producer's work to every delivery.
        ctx = multiprocessing.get_context("spawn")
        conn, child_conn = ctx.Pipe()
        proc = ctx.Process(
            target=_e2e_consumer_process,
            args=(child_conn, consumer_args, getattr(args, "gc_threshold", 0)),
            daemon=True,
        )
        proc.start()
        child_conn.close()

        def receive() -> Any:
            try:
                return conn.recv()
            except EOFError:
                return ("failed", RuntimeError("the e2e consumer process exited"))

        first = await loop.run_in_executor(None, receive)
        if first != "ready":
            proc.join(5)
            raise first[1]
        reader = loop.run_in_executor(None, receive)

        def mark_sent() -> None:
            # A broken pipe: the consumer already saw every record (before our last ack) and
            # ended.
            with contextlib.suppress(OSError):
                conn.send("sent")

    def done(future: FutureRecordMetadata) -> None:
        if future.cancelled() or future.exception() is not None:
            failures.append(future.exception() or asyncio.CancelledError())

    try:
        async with AsyncProducer(bootstrap, **props) as producer:
            await producer.partitions_for(args.topic)
            start = time.monotonic()
            for i in range(args.num_records):
                ahead = i / args.rate - (time.monotonic() - start)
                if ahead > 0:
                    await asyncio.sleep(ahead)
                value = _SEND_TIME.pack(time.time_ns()) + filler
                (await producer.send(args.topic, value)).add_done_callback(done)
                if i and i % max(1, int(args.rate * REPORT_INTERVAL_S)) == 0:
                    out.write(f"{i} records sent.\n")
                    out.flush()
            await producer.flush()
        mark_sent()
        outcome = await reader
    finally:
        if proc is not None:
            proc.join(args.timeout / 1000 + 10)
            if proc.is_alive():
                proc.kill()
                proc.join()
        elif not reader.done():
            reader.cancel()
    end = time.monotonic()
    if proc is not None:
        if outcome[0] != "done":
            raise outcome[1]
        outcome = outcome[1]
    latencies, received_bytes = outcome
    line = LatencySummary(latencies).line(
        len(latencies), end - start, received_bytes, args.num_records
    )
    if failures:
        line += f" ({len(failures)} failed: {type(failures[0]).__name__}: {failures[0]})"
    return line


def _bench_e2e(args: argparse.Namespace) -> int:
    tune_gc(args.gc_threshold)
    print(run_async(bench_e2e(args, sys.stdout)))
    return 0


def _fmt_time(ts: float) -> str:
    dt = datetime.datetime.fromtimestamp(ts)
    return dt.strftime("%Y-%m-%d %H:%M:%S:") + f"{dt.microsecond // 1000:03d}"


_KEY = operator.itemgetter(4)  # Record.key
_VALUE = operator.itemgetter(5)  # Record.value

CONSUMER_HEADER = (
    "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, "
    "rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec"
)
CPU_COLUMN = "client.cpu.us.per.msg"
BROKER_CPU_COLUMN = "broker.cpu.us.per.msg"


def consumer_header(cpu: CpuUsage | None = None) -> str:
    """Kafka's CSV header, plus a column per CPU figure `consumer_line` adds for `cpu`."""
    if cpu is None:
        return CONSUMER_HEADER
    header = f"{CONSUMER_HEADER}, {CPU_COLUMN}"
    return header + (f", {BROKER_CPU_COLUMN}" if cpu.broker_s is not None else "")


def consumer_line(
    start: float, end: float, total_bytes: int, messages: int, cpu: CpuUsage | None = None
) -> str:
    elapsed = max(end - start, 1e-9)
    mb = total_bytes / MB
    fetch_ms = int(elapsed * 1000)
    line = (
        f"{_fmt_time(start)}, {_fmt_time(end)}, {mb:.4f}, {mb / elapsed:.4f}, {messages}, "
        f"{messages / elapsed:.4f}, 0, {fetch_ms}, {mb / elapsed:.4f}, {messages / elapsed:.4f}"
    )
    if cpu is not None:
        line += f", {cpu.client_us_per_record:.4f}"
        if cpu.broker_us_per_record is not None:
            line += f", {cpu.broker_us_per_record:.4f}"
    return line


async def bench_consume(args: argparse.Namespace) -> BenchResult:
    from minibroker.client.consumer import AsyncConsumer

    meter = CpuMeter(getattr(args, "broker_pids", ()))
    async with AsyncConsumer(
        bootstrap_of(args), auto_offset_reset="earliest", **security_of(args)
    ) as consumer:
        info = await consumer.cluster.wait_for_topic(args.topic, consumer.max_block_ms)
        consumer.assign([TopicPartition(args.topic, p) for p in sorted(info.partitions)])
        meter.start()
        start = time.time()
        count = 0
        total = 0
        warning = None
        while count < args.messages:
            records = await consumer.poll(args.timeout, max_records=args.messages - count)
            if not records:
                warning = (
                    "WARNING: Exiting before consuming the expected number of messages: "
                    f"timeout ({args.timeout} ms) exceeded."
                )
                break
            count += len(records)
            # Key and value bytes, as Kafka's tool counts them, summed in C loops (a Python loop
            # per record here cost more than a tenth of the tool's CPU).
            total += sum(map(len, filter(None, map(_VALUE, records))))
            total += sum(map(len, filter(None, map(_KEY, records))))
        end = time.time()
        cpu = meter.stop(count)
    elapsed = max(end - start, 1e-9)
    fields: dict[str, Any] = {
        "bench": "consume",
        "records": count,
        "bytes": total,
        "elapsed_s": round(elapsed, 6),
        "records_per_sec": round(count / elapsed, 3),
        "mb_per_sec": round(total / MB / elapsed, 4),
        **cpu.fields(),
    }
    if warning:
        fields["warning"] = warning
    return BenchResult(consumer_line(start, end, total, count, cpu), fields, warning)


def _bench_consume(args: argparse.Namespace) -> int:
    tune_gc(args.gc_threshold)
    result = run_async(bench_consume(args))
    if result.warning:
        print(result.warning, file=sys.stderr)
    if args.json:
        print(json.dumps(result.fields))
        return 0
    cpu = CpuUsage(0, 0.0, 0.0 if "broker_cpu_s" in result.fields else None)
    print(consumer_header(cpu))
    print(result.line)
    return 0
