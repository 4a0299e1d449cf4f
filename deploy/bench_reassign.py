"""`minibroker bench reassign`: moving a partition (issue 14's benchmark), on a throwaway local
cluster of its own (free ports, a temp dir), started and stopped with the launcher.

Setup: one controller and `--brokers` brokers (default 2 x the replication factor, so a move can
replace every replica); a topic `reassign-bench` with one partition of `--replication-factor`
replicas (default 1); the partition filled to `--size` (default 1 GiB) by an acks=all producer at
full speed. The topic gets `retention.bytes = --size` (and segments of size/16, at most 64 MiB;
the brokers check retention every second), so the records the load producer keeps adding do not
make later runs move more than the first: every move copies about `--size` bytes.

Then per run (`--runs`, medians reported), with one acks=all producer (`--record-size`, default
1 KiB values, `--throughput` records/s cap, default none) in a thread of its own:
  (a) idle: the producer's throughput over `--window` seconds with nothing moving;
  (b) move: Admin.alter_partition_reassignments to the brokers that hold no replica (every
      replica replaced), polling Admin.list_partition_reassignments until it is empty: move time,
      bytes moved (the target brokers' ReplicationBytesInPerSec counters over the move: the
      partition plus everything the producer wrote while it moved), move MB/s, and the
      producer's throughput over exactly the move;
  (c) throttled move: the same back again, with `--throttle` bytes/s set the way
      kafka-reassign-partitions --execute --throttle sets it (KIP-73): the dynamic broker configs
      leader/follower.replication.throttled.rate on every broker involved (old and new replicas),
      and the topic configs leader.replication.throttled.replicas = the current replicas and
      follower.replication.throttled.replicas = the moving (added) replicas, all through
      Admin.incremental_alter_configs before the move starts, all deleted after it (--verify's
      job in Kafka's tool). Besides move time and the producer's throughput, the throttled rate the
      brokers measured: kafka_server_leader_replication_byte_rate (old leader) and
      kafka_server_follower_replication_byte_rate (new replicas), sampled from /metrics every
      second during the move (median of the non-zero samples).
      The producer runs through the first `--window` seconds of the throttled move only (its
      throughput is measured over those), then stops: a producer writing faster than the
      throttle (a full-speed one on one partition easily does) never lets a throttled replica
      catch up, in Kafka too, so the move would never end. The move time (c) is therefore
      "throttled copy of --size plus what was written in the window", not comparable with (b).
Ratios are the producer's records/s during a move over its records/s idle in the same run.

A move that has not completed after `--move-timeout` seconds (a throttle below the producer's
rate never lets the new replica catch up, in Kafka too) is cancelled and reported as such.

MB is 1024 * 1024 bytes, as in Kafka's perf tools; sizes and rates accept K/KB/KiB, M/MB/MiB,
G/GB/GiB, all binary. Benchmarks measure and never assert; the pure parts (size parsing, medians
and ratios, the throttle configs, metrics parsing, the table) are plain functions, unit tested.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from minibroker.deploy import cluster as launcher

MB = 1024 * 1024
TOPIC = "reassign-bench"
DEFAULT_SIZE = 1024 * MB
DEFAULT_THROTTLE = 50 * MB
FILL_RECORD_SIZE = 32 * 1024
MAX_SEGMENT_BYTES = 64 * MB
MIN_SEGMENT_BYTES = 64 * 1024
POLL_INTERVAL_S = 0.05
METRICS_INTERVAL_S = 1.0
WARM_UP_S = 1.0
SETTLE_TIMEOUT_S = 120.0

# The cluster's settings: no leader rebalance in the middle of a measurement, and retention
# checked every second (the topic's retention.bytes keeps the partition at --size).
BENCH_SETTINGS = {
    "leader.imbalance.check.interval.seconds": "3600",
    "log.retention.check.interval.ms": "1000",
}
REPLICATION_BYTES_IN = "kafka_server_BrokerTopicMetrics_ReplicationBytesInPerSec_total"
LEADER_BYTE_RATE = "kafka_server_leader_replication_byte_rate"
FOLLOWER_BYTE_RATE = "kafka_server_follower_replication_byte_rate"


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "reassign",
        help="move a filled partition to other brokers, with and without a throttle; time it "
        "and the producer's throughput during the move",
        description="On a throwaway local cluster: fill one partition to --size with acks=all, "
        "then per run measure an acks=all producer's throughput with nothing moving, during a "
        "move of the partition to other brokers (every replica replaced), and during a move "
        "back with a replication throttle (KIP-73); report move times, move MB/s, the brokers' "
        "throttled byte rates and the producer's throughput ratios (medians over --runs).",
    )
    parser.add_argument(
        "--size",
        type=parse_size_arg,
        default=DEFAULT_SIZE,
        help="bytes to fill the partition with, e.g. 1GiB, 256MiB, 4M (default 1GiB; K, M, G "
        "are binary with or without B/iB)",
    )
    parser.add_argument("--runs", type=int, default=3, help="runs, medians reported (default 3)")
    parser.add_argument(
        "--throttle",
        type=parse_size_arg,
        default=DEFAULT_THROTTLE,
        help="bytes/s for the throttled move, like kafka-reassign-partitions --throttle; "
        "suffixes allowed, e.g. 50MiB (default 50 MiB/s)",
    )
    parser.add_argument(
        "--replication-factor",
        type=int,
        default=1,
        help="replicas of the partition (default 1); every one of them is replaced by a move",
    )
    parser.add_argument(
        "--brokers",
        type=int,
        default=None,
        help="brokers in the cluster (default and minimum: 2 x --replication-factor)",
    )
    parser.add_argument(
        "--window",
        type=float,
        default=10.0,
        help="seconds the idle throughput is measured over (default 10)",
    )
    parser.add_argument(
        "--record-size",
        type=int,
        default=1024,
        help="value bytes of the measured producer's records (default 1024)",
    )
    parser.add_argument(
        "--throughput",
        type=float,
        default=-1,
        help="records/s cap of the measured producer (default -1: as fast as it goes)",
    )
    parser.add_argument(
        "--move-timeout",
        type=float,
        default=900.0,
        help="seconds before an unfinished move is cancelled and reported so (default 900)",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        type=parse_setting,
        default=[],
        metavar="KEY=VALUE",
        help="a controller or broker setting for the bench's cluster (repeatable)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the result as one JSON object (progress lines go to stderr)",
    )
    parser.set_defaults(func=main)


# -- pure parts ----------------------------------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": MB, "g": 1024 * MB, "t": 1024 * 1024 * MB}


def parse_size(text: str) -> int:
    """`1GiB`, `256MiB`, `256M`, `4MB`, `512k`, `1048576`, `1.5G` -> bytes (binary units, as
    MB is in Kafka's perf tools). ValueError for anything else, zero or less included."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(f"expected a size such as 1GiB, 256MiB or 1048576, got {text!r}")
    value = int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])
    if value <= 0:
        raise ValueError(f"a size must be positive, got {text!r}")
    return value


def parse_size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def parse_setting(text: str) -> tuple[str, str]:
    """`key=value` -> (key, value) for `--set`."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--set expects KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def format_size(n: float) -> str:
    """Bytes as the largest binary unit that keeps the number at least 1: 1 GiB, 256 MiB."""
    for unit, scale in (("GiB", 1024 * MB), ("MiB", MB), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def brokers_for(args: argparse.Namespace) -> int:
    """The cluster size; ValueError when the arguments cannot make a bench."""
    rf = args.replication_factor
    if rf < 1:
        raise ValueError("--replication-factor must be at least 1")
    brokers = 2 * rf if args.brokers is None else args.brokers
    if brokers < 2 * rf:
        raise ValueError(
            f"--brokers {brokers} cannot replace all {rf} replica(s): a move needs "
            f"{2 * rf} brokers (2 x --replication-factor)"
        )
    if args.runs < 1:
        raise ValueError("--runs must be at least 1")
    if args.window <= 0 or args.move_timeout <= 0:
        raise ValueError("--window and --move-timeout must be positive")
    if not 1 <= args.record_size <= batch_bytes_for(args.size, MB) - 1024:
        raise ValueError(
            f"--record-size must be 1 to {batch_bytes_for(args.size, MB) - 1024} for a "
            f"--size of {format_size(args.size)} (half its segments)"
        )
    return int(brokers)


def segment_bytes_for(size: int) -> int:
    """The topic's segment.bytes: size/16 within [64 KiB, 64 MiB], so retention.bytes = size
    trims the log in small steps."""
    return max(MIN_SEGMENT_BYTES, min(MAX_SEGMENT_BYTES, size // 16))


def batch_bytes_for(size: int, most: int) -> int:
    """A producer's batch_size for the topic: at most `most` and half a segment (a batch
    larger than segment.bytes is refused)."""
    return min(most, segment_bytes_for(size) // 2)


def move_target(current: Sequence[int], brokers: Sequence[int]) -> tuple[int, ...]:
    """Where a move sends the partition: as many brokers as it has replicas, none of them a
    current replica, lowest ids first. ValueError when there are not enough."""
    free = sorted(b for b in brokers if b not in set(current))
    if len(free) < len(current):
        raise ValueError(
            f"no {len(current)} brokers outside {list(current)} among {sorted(brokers)}"
        )
    return tuple(free[: len(current)])


def throttle_configs(
    topic: str,
    partition: int,
    current: Sequence[int],
    target: Sequence[int],
    rate: int,
) -> dict[tuple[str, str], dict[str, str]]:
    """What kafka-reassign-partitions --execute --throttle RATE sets for one move, as
    {(resource type, name): {config: value}}: the reassign tool's own plan
    (client/cli/reassign_plan.throttle_plan and throttle_changes), so the benchmark measures
    exactly what the tool sets: both rates on every broker of the old and new replica sets,
    the leader throttle on the current replicas and the follower throttle on the added ones."""
    from minibroker.client.cli.reassign_plan import throttle_changes, throttle_plan
    from minibroker.client.types import TopicPartition

    tp = TopicPartition(topic, partition)
    changes = throttle_changes(throttle_plan({tp: current}, {tp: target}), rate)
    return {
        (kind, name): {key: value or "" for key, _op, value in ops} for kind, name, ops in changes
    }


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def metric_total(text: str, name: str) -> float | None:
    """The sum of every sample of `name` in Prometheus text, labelled or not (a per-topic or
    per-partition metric adds up to the broker's figure); None when there is none."""
    total: float | None = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None or match.group(1) != name:
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        total = value if total is None else total + value
    return total


def rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def ratio(during: float | None, idle: float | None) -> float | None:
    """Throughput during a move over throughput with nothing moving; None when either is
    missing or the idle figure is zero."""
    if during is None or idle is None or idle <= 0:
        return None
    return during / idle


def median_of(values: Iterable[Any]) -> float | None:
    """The median of the numbers among `values` (None, booleans and text are skipped)."""
    seen = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return statistics.median(seen) if seen else None


def nonzero_median(samples: Iterable[float | None]) -> float | None:
    """The rate a metric showed while data moved: the median of its non-zero samples."""
    return median_of(s for s in samples if s)


PHASES = ("idle", "move", "throttled_move")
SUMMARY_KEYS = (
    "records_per_sec",
    "mb_per_sec",
    "ratio",
    "move_s",
    "moved_bytes",
    "move_mb_per_sec",
    "leader_byte_rate_mb_per_sec",
    "follower_byte_rate_mb_per_sec",
)


def summarize_runs(runs: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per phase, the median over runs of each figure (None when no run measured it), and how
    many runs completed their move."""
    out: dict[str, dict[str, Any]] = {}
    for phase in PHASES:
        rows = [r[phase] for r in runs if r.get(phase) is not None]
        if not rows:
            continue
        summary: dict[str, Any] = {"runs": len(rows)}
        for key in SUMMARY_KEYS:
            if any(key in row for row in rows):
                value = median_of(row.get(key) for row in rows)
                summary[key] = None if value is None else round(value, 4)
        if phase != "idle":
            summary["completed"] = sum(1 for row in rows if row.get("completed"))
        out[phase] = summary
    return out


def _cell(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def format_table(result: Mapping[str, Any]) -> list[str]:
    """The text report: a header line, one row per phase (medians), the throttle's measured
    rates and the load average."""
    summary = result["summary"]
    throttle = result["throttle_bytes_per_s"]
    runs = result["runs_requested"]
    lines = [
        f"reassign: 1 partition of {format_size(result['size_bytes'])}, RF "
        f"{result['replication_factor']}, {result['brokers']} brokers; acks=all producer of "
        f"{result['record_size']} B records; medians over {runs} run(s)",
        f"  {'phase':<24}{'move s':>9}{'moved MB':>10}{'move MB/s':>11}{'records/s':>12}"
        f"{'MB/s':>9}{'ratio':>8}  done",
    ]
    labels = {
        "idle": "nothing moving",
        "move": "move, no throttle",
        "throttled_move": f"move, throttle {throttle / MB:g} MB/s",
    }
    for phase, label in labels.items():
        s = summary.get(phase)
        if s is None:
            continue
        moved = s.get("moved_bytes")
        done = "-" if phase == "idle" else f"{s.get('completed', 0)}/{s['runs']}"
        lines.append(
            f"  {label:<24}{_cell(s.get('move_s'), '.1f'):>9}"
            f"{_cell(None if moved is None else moved / MB, '.1f'):>10}"
            f"{_cell(s.get('move_mb_per_sec'), '.1f'):>11}"
            f"{_cell(s.get('records_per_sec'), '.0f'):>12}{_cell(s.get('mb_per_sec'), '.2f'):>9}"
            f"{_cell(1.0 if phase == 'idle' else s.get('ratio'), '.2f'):>8}  {done}"
        )
    t = summary.get("throttled_move")
    if t is not None:
        lines.append(
            f"  throttled rate measured by the brokers (/metrics, median while moving): leader "
            f"{_cell(t.get('leader_byte_rate_mb_per_sec'), '.1f')} MB/s, follower "
            f"{_cell(t.get('follower_byte_rate_mb_per_sec'), '.1f')} MB/s (throttle "
            f"{throttle / MB:g} MB/s)"
        )
    lines.append(
        "  (moved MB: what the new replicas fetched, the partition plus the writes during the move)"
    )
    fill = result.get("fill")
    if fill:
        lines.append(
            f"  fill: {format_size(fill['bytes'])} in {fill['elapsed_s']:.1f} s "
            f"({fill['mb_per_sec']:.1f} MB/s, acks=all, {fill['record_size']} B records)"
        )
    lines.append("  load average " + " ".join(f"{x:.2f}" for x in result["load_average"]))
    return lines


# -- the measured producer -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Snapshot:
    at: float  # monotonic
    records: int
    bytes: int
    failed: int


def throughput(start: Snapshot, end: Snapshot) -> dict[str, Any]:
    """The producer's acknowledged records/s and MB/s between two snapshots."""
    seconds = end.at - start.at
    return {
        "elapsed_s": round(seconds, 4),
        "records": end.records - start.records,
        "records_per_sec": round(rate(end.records - start.records, seconds), 3),
        "mb_per_sec": round(rate(end.bytes - start.bytes, seconds) / MB, 4),
        "failed": end.failed - start.failed,
    }


class LoadProducer:
    """An acks=all AsyncProducer in a thread of its own (its own event loop), sending to
    partition 0 while resumed; counts acknowledged records and bytes."""

    def __init__(
        self, bootstrap: str, topic: str, record_size: int, cap: float, batch_size: int
    ) -> None:
        self.bootstrap = bootstrap
        self.batch_size = batch_size
        self.topic = topic
        self.payload = os.urandom(record_size)
        self.cap = cap  # records/s, <= 0: none
        self.records = 0
        self.bytes = 0
        self.failed = 0
        self.error: BaseException | None = None
        self._sending = threading.Event()
        self._drained = threading.Event()
        self._drained.set()
        self._ready = threading.Event()
        self._stop = False
        self._fill_bytes = 0
        self.fill: dict[str, Any] | None = None
        self._thread = threading.Thread(target=self._main, name="reassign-load", daemon=True)

    def snapshot(self) -> Snapshot:
        return Snapshot(time.monotonic(), self.records, self.bytes, self.failed)

    def start(self, fill_bytes: int = 0) -> dict[str, Any] | None:
        """Start the thread; it first fills the partition with `fill_bytes` (on the same
        event loop: one loop for every producer of the bench) and returns the fill's figures."""
        self._fill_bytes = fill_bytes
        self._thread.start()
        while not self._ready.wait(1.0):
            if not self._thread.is_alive():
                break
        if not self._ready.is_set() or self.error is not None:
            if isinstance(self.error, launcher.LauncherError):
                raise self.error
            raise launcher.LauncherError(f"the load producer did not start: {self.error!r}")
        return self.fill

    def resume(self) -> None:
        self._drained.clear()
        self._sending.set()

    def pause(self, timeout_s: float = 120.0) -> None:
        """Stop sending and wait until everything sent is acknowledged (or failed)."""
        self._sending.clear()
        self._drained.wait(timeout_s)

    def stop(self) -> None:
        self._stop = True
        self._sending.set()
        self._thread.join(timeout=120)

    def _main(self) -> None:
        from minibroker.client.cli.common import run_async

        try:
            run_async(self._run())
        except BaseException as err:  # reported by start() or in the result
            self.error = err
            self._ready.set()
            self._drained.set()

    def _done(self, future: Any) -> None:
        if future.cancelled() or future.exception() is not None:
            self.failed += 1
        else:
            self.records += 1
            self.bytes += len(self.payload)

    async def _run(self) -> None:
        import asyncio

        from minibroker.client.producer import AsyncProducer

        if self._fill_bytes > 0:
            self.fill = await _fill(self.bootstrap, self.topic, self._fill_bytes)
        async with AsyncProducer(
            self.bootstrap,
            acks="all",
            linger_ms=5,
            batch_size=self.batch_size,
            max_block_ms=120_000,
            request_timeout_ms=30_000,
        ) as producer:
            await producer.partitions_for(self.topic)
            self._ready.set()
            payload, topic, done = self.payload, self.topic, self._done
            while not self._stop:
                if not self._sending.is_set():
                    await producer.flush()
                    self._drained.set()
                    await asyncio.to_thread(self._sending.wait)
                    continue
                started, sent = time.monotonic(), 0
                while self._sending.is_set() and not self._stop:
                    for _ in range(100):
                        (await producer.send(topic, payload, partition=0)).add_done_callback(done)
                    sent += 100
                    if self.cap > 0:
                        ahead = sent / self.cap - (time.monotonic() - started)
                        if ahead > 0:
                            await asyncio.sleep(ahead)
            await producer.flush()
            self._drained.set()


async def _fill(bootstrap: str, topic: str, size: int) -> dict[str, Any]:
    from minibroker.client.producer import AsyncProducer

    batch_size = batch_bytes_for(size, MB)
    payload = os.urandom(min(FILL_RECORD_SIZE, batch_size // 4))
    failures: list[BaseException] = []

    def done(future: Any) -> None:
        if future.cancelled() or future.exception() is not None:
            failures.append(future.exception() or RuntimeError("cancelled"))

    count = -(-size // len(payload))
    async with AsyncProducer(
        bootstrap,
        acks="all",
        linger_ms=5,
        batch_size=batch_size,
        max_block_ms=120_000,
        buffer_memory=128 * MB,
    ) as producer:
        started = time.monotonic()
        for _ in range(count):
            (await producer.send(topic, payload, partition=0)).add_done_callback(done)
        await producer.flush()
        elapsed = time.monotonic() - started
    if failures:
        raise launcher.LauncherError(
            f"filling the partition: {len(failures)} records failed, the first with "
            f"{type(failures[0]).__name__}: {failures[0]}"
        )
    written = count * len(payload)
    return {
        "bytes": written,
        "records": count,
        "record_size": len(payload),
        "elapsed_s": round(elapsed, 3),
        "mb_per_sec": round(rate(written, elapsed) / MB, 3),
    }


# -- cluster side --------------------------------------------------------------------------------


def _scrape(spec: launcher.ProcessSpec) -> str | None:
    try:
        url = f"http://{spec.host}:{spec.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return None


def _broker_metric(spec: launcher.ProcessSpec, name: str) -> float | None:
    text = _scrape(spec)
    return None if text is None else metric_total(text, name)


class RateSampler:
    """Samples the throttled byte-rate metrics of the old leader and the new replicas once a
    second in a thread, between start() and stop()."""

    def __init__(self, leader: launcher.ProcessSpec, followers: Sequence[launcher.ProcessSpec]):
        self.leader = leader
        self.followers = list(followers)
        self.leader_samples: list[float | None] = []
        self.follower_samples: list[float | None] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reassign-metrics", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(METRICS_INTERVAL_S):
            self.leader_samples.append(_broker_metric(self.leader, LEADER_BYTE_RATE))
            rates = [_broker_metric(s, FOLLOWER_BYTE_RATE) for s in self.followers]
            seen = [r for r in rates if r is not None]
            self.follower_samples.append(sum(seen) if seen else None)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


class Bench:
    """One cluster, one filled partition, the measured producer; `run()` does one run."""

    def __init__(self, args: argparse.Namespace, state: launcher.ClusterState) -> None:
        from minibroker.client import Admin

        self.args = args
        self.state = state
        self.admin = Admin(state.bootstrap_servers, request_timeout_ms=30_000)
        self.load: LoadProducer | None = None
        self.broker_ids = [int(spec.node_id) for spec in state.brokers]

    def close(self) -> None:
        if self.load is not None:
            self.load.stop()
        self.admin.close()

    def _spec(self, broker_id: int) -> launcher.ProcessSpec:
        return next(s for s in self.state.brokers if int(s.node_id) == broker_id)

    def _partition(self) -> Any:
        return self.admin.describe_topics([TOPIC], include_offsets=False)[0].partitions[0]

    def _wait_settled(self, replicas: Sequence[int] | None = None) -> Any:
        """Until the partition has a leader, a full ISR and no reassignment (and, when given,
        exactly `replicas`)."""

        def settled() -> Any:
            p = self._partition()
            if p.leader < 0 or set(p.isr) != set(p.replicas):
                return None
            if replicas is not None and set(p.replicas) != set(replicas):
                return None
            if p.adding_replicas or p.removing_replicas:
                return None
            return p

        return launcher.wait_for(settled, SETTLE_TIMEOUT_S, "the partition to settle")

    def setup(self) -> dict[str, Any]:
        args = self.args
        self.admin.create_topic(
            TOPIC,
            1,
            args.replication_factor,
            {
                "retention.bytes": str(args.size),
                "segment.bytes": str(segment_bytes_for(args.size)),
            },
        )
        self._wait_settled()
        _say(args, f"filling {TOPIC}-0 with {format_size(args.size)} (acks=all) ...")
        self.load = LoadProducer(
            self.state.bootstrap_servers,
            TOPIC,
            args.record_size,
            args.throughput,
            batch_bytes_for(args.size, 256 * 1024),
        )
        fill = self.load.start(fill_bytes=args.size)
        assert fill is not None
        _say(
            args,
            f"filled {format_size(fill['bytes'])} in {fill['elapsed_s']:.1f} s "
            f"({fill['mb_per_sec']:.1f} MB/s)",
        )
        self._wait_settled()
        return fill

    def _replication_bytes_in(self, brokers: Iterable[int]) -> float | None:
        values = [_broker_metric(self._spec(b), REPLICATION_BYTES_IN) for b in brokers]
        seen = [v for v in values if v is not None]
        return sum(seen) if seen else None

    def idle(self) -> dict[str, Any]:
        assert self.load is not None
        self._wait_settled()
        self.load.resume()
        time.sleep(WARM_UP_S)
        start = self.load.snapshot()
        time.sleep(self.args.window)
        end = self.load.snapshot()
        self.load.pause()
        return throughput(start, end)

    def move(self, throttle: int | None) -> dict[str, Any]:
        """Move the partition to the brokers that hold none of it; `throttle` bytes/s or None."""
        from minibroker.client.types import TopicPartition

        assert self.load is not None
        before = self._wait_settled()
        current = tuple(before.replicas)
        target = move_target(current, self.broker_ids)
        tp = TopicPartition(TOPIC, 0)
        configs = (
            throttle_configs(TOPIC, 0, current, target, throttle) if throttle is not None else {}
        )
        sampler = RateSampler(self._spec(before.leader), [self._spec(b) for b in target])
        self.load.resume()
        time.sleep(WARM_UP_S)
        if configs:
            self._alter_configs(configs, delete=False)
        moved_before = self._replication_bytes_in(target)
        if throttle is not None:
            sampler.start()
        start = self.load.snapshot()
        # The producer runs through an unthrottled move, and through the first --window
        # seconds of a throttled one (see the module docstring).
        load_s = None if throttle is None else self.args.window
        load_end: list[Snapshot] = []

        def poll(elapsed_s: float) -> None:
            assert self.load is not None
            if load_s is not None and not load_end and elapsed_s >= load_s:
                load_end.append(self.load.snapshot())
                self.load.pause(timeout_s=0)

        errors = self.admin.alter_partition_reassignments({tp: list(target)})
        if errors.get(tp) is not None:
            raise launcher.LauncherError(f"the reassignment was refused: {errors[tp]}")
        completed = self._wait_no_reassignment(tp, self.args.move_timeout, poll)
        end = self.load.snapshot()
        if throttle is not None:
            sampler.stop()
        moved_after = self._replication_bytes_in(target)
        if not completed:
            self.admin.alter_partition_reassignments({tp: None})
            self._wait_no_reassignment(tp, SETTLE_TIMEOUT_S)
        self.load.pause()
        if configs:
            self._alter_configs(configs, delete=True)
        out = throughput(start, load_end[0] if load_end else end)
        out["producer_s"] = out.pop("elapsed_s")
        move_s = end.at - start.at
        moved = (
            None if moved_before is None or moved_after is None else int(moved_after - moved_before)
        )
        out.update(
            {
                "from": list(current),
                "to": list(target),
                "completed": completed,
                "move_s": round(move_s, 4),
                "moved_bytes": moved,
                "move_mb_per_sec": None if moved is None else round(rate(moved, move_s) / MB, 4),
            }
        )
        if throttle is not None:
            leader = nonzero_median(sampler.leader_samples)
            follower = nonzero_median(sampler.follower_samples)
            out.update(
                {
                    "throttle_bytes_per_s": throttle,
                    "leader_byte_rate_mb_per_sec": None if leader is None else leader / MB,
                    "follower_byte_rate_mb_per_sec": None if follower is None else follower / MB,
                    "leader_byte_rate_samples": sampler.leader_samples,
                    "follower_byte_rate_samples": sampler.follower_samples,
                }
            )
        self._wait_settled(target if completed else current)
        return out

    def _wait_no_reassignment(
        self, tp: Any, timeout_s: float, poll: Callable[[float], None] | None = None
    ) -> bool:
        """Until Admin.list_partition_reassignments has nothing for `tp` (True) or `timeout_s`
        passed (False); `poll(seconds so far)` before each look."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if poll is not None:
                poll(time.monotonic() - started)
            if tp not in self.admin.list_partition_reassignments([tp]):
                return True
            time.sleep(POLL_INTERVAL_S)
        return False

    def _alter_configs(
        self, configs: Mapping[tuple[str, str], Mapping[str, str]], delete: bool
    ) -> None:
        from minibroker.client.admin import AlterConfigOp, ConfigResource

        changes = {
            ConfigResource(kind, name): [
                AlterConfigOp(key, "delete") if delete else AlterConfigOp(key, "set", value)
                for key, value in values.items()
            ]
            for (kind, name), values in configs.items()
        }
        self.admin.incremental_alter_configs(changes)

    def run(self, n: int) -> dict[str, Any]:
        args = self.args
        idle = self.idle()
        _say(
            args,
            f"run {n}: idle {idle['records_per_sec']:.0f} records/s "
            f"({idle['mb_per_sec']:.2f} MB/s) over {idle['elapsed_s']:.1f} s",
        )
        result: dict[str, Any] = {"run": n, "idle": idle}
        for phase, throttle in (("move", None), ("throttled_move", args.throttle)):
            moved = self.move(throttle)
            moved["ratio"] = _round(ratio(moved["records_per_sec"], idle["records_per_sec"]))
            result[phase] = moved
            _say(args, f"run {n}: {_move_line(moved)}")
        return result


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _move_line(m: Mapping[str, Any]) -> str:
    moved = m["moved_bytes"]
    what = "throttled move" if "throttle_bytes_per_s" in m else "move"
    line = (
        f"{what} {m['from']} -> {m['to']} "
        f"{'in' if m['completed'] else 'NOT COMPLETED, cancelled after'} {m['move_s']:.1f} s"
        f" ({'?' if moved is None else f'{moved / MB:.1f}'} MB moved, "
        f"{_cell(m['move_mb_per_sec'], '.1f')} MB/s); producer {m['records_per_sec']:.0f} "
        f"records/s ({m['mb_per_sec']:.2f} MB/s), ratio {_cell(m.get('ratio'), '.2f')}"
    )
    if "throttle_bytes_per_s" in m:
        line += (
            f"; brokers' throttled rate: leader "
            f"{_cell(m['leader_byte_rate_mb_per_sec'], '.1f')} MB/s, follower "
            f"{_cell(m['follower_byte_rate_mb_per_sec'], '.1f')} MB/s"
        )
    return line


def _say(args: argparse.Namespace, line: str) -> None:
    print(line, file=sys.stderr if args.json else sys.stdout, flush=True)


def reassign_bench(args: argparse.Namespace) -> dict[str, Any]:
    brokers = brokers_for(args)
    with tempfile.TemporaryDirectory(prefix="minibroker-reassign-") as directory:
        bench: Bench | None = None
        try:
            state = launcher.up(
                directory,
                brokers=brokers,
                base_port=0,
                settings={**BENCH_SETTINGS, **dict(args.settings)},
            )
            bench = Bench(args, state)
            fill = bench.setup()
            runs = [bench.run(n) for n in range(1, args.runs + 1)]
            failed = bench.load.failed if bench.load is not None else 0
        finally:
            if bench is not None:
                bench.close()
            launcher.down(directory)
    return {
        "bench": "reassign",
        "size_bytes": args.size,
        "replication_factor": args.replication_factor,
        "brokers": brokers,
        "record_size": args.record_size,
        "throughput_cap": args.throughput,
        "window_s": args.window,
        "throttle_bytes_per_s": args.throttle,
        "runs_requested": args.runs,
        "settings": dict(args.settings),
        "fill": fill,
        "runs": runs,
        "summary": summarize_runs(runs),
        "producer_failed_records": failed,
        "load_average": list(os.getloadavg()),
    }


def main(args: argparse.Namespace) -> int:
    from minibroker.client.errors import MiniBrokerError

    try:
        result = reassign_bench(args)
    except (ValueError, launcher.LauncherError, MiniBrokerError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join(format_table(result)))
    return 0
