"""`minibroker verify`: a Jepsen-style run against a local launcher cluster (issue 15).

A workload of idempotent acks=all producers writing unique values and consumers reading every
partition from its start (they are given what is below the high watermark), while a nemesis
causes one seeded fault per round (`verify_schedule`): kill -9 and restart, SIGSTOP past
replica.lag.time.max.ms and SIGCONT, network partitions through the launcher's fault file
(a zombie leader, a follower cut from its leader, a broker cut from the controllers only, a
split 1 | rest with the active controller on either side), a controller kill and restart, and
a full disk (the broker's RLIMIT_FSIZE lowered with `prlimit`, as
tests/integration/test_disk_failure.py does: its next append fails, it takes its log dir
offline and exits; it is started again without the limit). Each round heals everything and
waits until no partition is under-replicated before the next one.

After the last round: the producers stop, the consumers catch up, every partition is read once
more from its start (the final logs), every replica's log files are read up to the high
watermark (a digest each), and the controllers' logs give the ISR each partition had over time.
`verify_checker.check` judges that history; `verify_report` prints the table per fault kind
(count, recovery median/p95/max), the totals and a chart of throughput with the faults marked.
Exit 1 on any violation (or a cluster that did not settle after a heal), printing the seed.

`--fresh` runs on a temporary cluster of its own (3 brokers, 3 controllers, short timeouts)
that is killed by PID at the end; otherwise the cluster in `--dir` is used (its topics are
`verify-<seed>-N`, deleted at the end). On a `cluster up --tls` cluster (or `--fresh --tls`) every
client connects with the cluster's client.properties (the launcher's `admin` certificate).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import hashlib
import json
import os
import pathlib
import random
import resource
import shlex
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from minibroker.deploy import cluster as launcher
from minibroker.deploy import verify_checker as checker
from minibroker.deploy import verify_report as report
from minibroker.deploy.bench_failover import read_lines
from minibroker.deploy.verify_schedule import (
    FAULT_KINDS,
    PlannedFault,
    Schedule,
    Timing,
    parse_duration,
    parse_kinds,
)

# A fresh cluster's settings: short timeouts so a round takes seconds.
FRESH_SETTINGS = {
    "replica.lag.time.max.ms": "1500",
    "broker.session.timeout.ms": "2500",
    "controller.quorum.election.timeout.ms": "500",
    "controller.quorum.fetch.timeout.ms": "1000",
    "controller.quorum.election.backoff.max.ms": "500",
}
FRESH_BROKERS = 3
FRESH_CONTROLLERS = 3
SETTLE_TIMEOUT_S = 120.0
# How much the broker's largest file may still grow once its disk is "full".
DISK_HEADROOM_BYTES = 16 * 1024
DISK_EXIT_TIMEOUT_S = 30.0
CHART_COLUMNS = 60
# Kafka's defaults, for a user's cluster whose settings do not say.
DEFAULT_LAG_MS = 10_000
DEFAULT_SESSION_MS = 3_000


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "verify",
        help="a Jepsen-style run: faults under an acks=all workload, then check every invariant",
        description="Run idempotent acks=all producers and consumers against a local cluster "
        "while a seeded nemesis kills, pauses, partitions and fills the disk of its processes; "
        "then check that no acknowledged write was lost, duplicated or moved, offsets are "
        "contiguous, no consumer read above the high watermark, replicas are identical and "
        "no write was acknowledged with fewer than min.insync.replicas copies. Exit 1 on any "
        "violation, with the seed that reproduces the run.",
    )
    parser.add_argument(
        "--dir",
        default=launcher.DEFAULT_DIR,
        help=f"the launcher cluster to run against (default {launcher.DEFAULT_DIR})",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help=f"start a temporary cluster of its own ({FRESH_BROKERS} brokers, "
        f"{FRESH_CONTROLLERS} controllers, short timeouts) and kill it at the end",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="with --fresh: the temporary cluster runs TLS, as `cluster up --tls` (a --tls "
        "cluster in --dir needs no flag: verify connects with its client.properties)",
    )
    parser.add_argument(
        "--duration",
        default=None,
        help="how long to cause faults, e.g. 60s, 10m (default 60s, or unlimited with --rounds)",
    )
    parser.add_argument("--rounds", type=int, default=None, help="stop after N fault rounds")
    parser.add_argument(
        "--faults",
        default="all",
        help=f"comma-separated fault kinds among {','.join(FAULT_KINDS)} (default all)",
    )
    parser.add_argument("--seed", type=int, default=None, help="the nemesis seed (default random)")
    parser.add_argument("--topics", type=int, default=1, help="topics to write (default 1)")
    parser.add_argument("--partitions", type=int, default=3, help="partitions per topic (3)")
    parser.add_argument(
        "--rate", type=float, default=200.0, help="records per second, all producers (200)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")
    parser.set_defaults(func=main)


# -- the workload ---------------------------------------------------------------------------------


def _now() -> float:
    return time.time()


class WriteLog:
    """Every write sent, and how it ended; thread-safe (acks arrive on the client's loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # value -> [partition, sent, acked, offset, error]
        self._writes: dict[str, list[Any]] = {}
        self.last_ack = 0.0

    def sent(self, value: str, partition: str) -> None:
        with self._lock:
            self._writes[value] = [partition, _now(), None, None, None]

    def done(self, value: str, future: Any) -> None:
        at = _now()
        try:
            metadata = future.result(timeout=0)
        except Exception as err:
            with self._lock:
                self._writes[value][4] = f"{type(err).__name__}: {err}"
            return
        with self._lock:
            entry = self._writes[value]
            entry[2], entry[3] = at, metadata.offset
            self.last_ack = max(self.last_ack, at)

    def acks_since(self, since: float) -> int:
        with self._lock:
            return sum(1 for e in self._writes.values() if e[2] is not None and e[2] >= since)

    def history(self) -> list[checker.Write]:
        with self._lock:
            return [
                checker.Write(value, e[0], e[1], e[2], e[3], e[4] if e[2] is None else None)
                if e[2] is not None or e[4] is not None
                else checker.Write(value, e[0], e[1], None, None, "never answered")
                for value, e in self._writes.items()
            ]


class ProducerThread:
    """One idempotent acks=all producer writing unique values to its topic's partitions in
    turn, at `rate` records per second."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        rate: float,
        tag: str,
        log: WriteLog,
        **client: str,
    ) -> None:
        from minibroker.client import Producer

        self._producer = Producer(
            bootstrap,
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
            request_timeout_ms=5_000,
            delivery_timeout_ms=120_000,
            retry_backoff_ms=100,
            **client,
        )
        self._topic, self._partitions, self._rate, self._tag = topic, partitions, rate, tag
        self._log = log
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"verify-{topic}", daemon=True)

    def _run(self) -> None:
        interval = 1.0 / self._rate
        next_at = time.monotonic()
        i = 0
        while not self._stop.is_set():
            partition = i % self._partitions
            value = f"{self._tag}-{i:08d}"
            self._log.sent(value, f"{self._topic}-{partition}")
            future = self._producer.send(self._topic, value.encode(), partition=partition)
            future.add_done_callback(functools.partial(self._log.done, value))
            i += 1
            next_at = max(next_at + interval, time.monotonic() - 1.0)
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def start(self) -> None:
        self._thread.start()

    def stop(self, flush_timeout_s: float) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        with contextlib.suppress(Exception):
            self._producer.close(int(flush_timeout_s * 1000))


class ConsumerThread:
    """Reads every partition of a topic from its start, noting each record with the highest
    high watermark it had been told for the partition."""

    def __init__(
        self, bootstrap: str, topic: str, partitions: int, name: str, **client: str
    ) -> None:
        self.name = name
        self._client = client
        self.reads: list[checker.Read] = []
        self.errors: list[str] = []
        self._bootstrap, self._topic, self._partitions = bootstrap, topic, partitions
        self._next: dict[int, int] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=f"read-{topic}", daemon=True)

    def _run(self) -> None:
        from minibroker.client import Consumer, TopicPartition

        tps = [TopicPartition(self._topic, p) for p in range(self._partitions)]
        hw = dict.fromkeys(tps, -1)
        restart = dict.fromkeys(tps, True)
        with Consumer(
            self._bootstrap, auto_offset_reset="none", request_timeout_ms=10_000, **self._client
        ) as c:
            c.assign(tps)
            c.seek_to_beginning(*tps)
            while not self._stop.is_set():
                try:
                    records = c.poll(timeout_ms=200)
                except Exception as err:
                    self.errors.append(f"{_now():.3f} {type(err).__name__}: {err}")
                    self._stop.wait(0.2)
                    for tp in tps:  # go on from where it was
                        with contextlib.suppress(Exception):
                            c.seek(tp, self._next.get(tp.partition, 0))
                        restart[tp] = True
                    continue
                at = _now()
                for tp in tps:
                    told = c.highwater(tp)
                    if told is not None:
                        hw[tp] = max(hw[tp], told)
                batch = []
                for r in records:
                    tp = TopicPartition(r.topic, r.partition)
                    batch.append(
                        checker.Read(
                            self.name,
                            str(tp),
                            r.offset,
                            (r.value or b"").decode(errors="replace"),
                            at,
                            hw[tp],
                            restart[tp],
                        )
                    )
                    restart[tp] = False
                    self._next[r.partition] = r.offset + 1
                with self._lock:
                    self.reads.extend(batch)

    def position(self, partition: int) -> int:
        with self._lock:
            return self._next.get(partition, 0)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


# -- the cluster ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Target:
    """What a fault hits, resolved from the cluster as it is when the fault starts."""

    brokers: list[int]
    partitions: tuple[str, ...]  # affected partitions ("" = every partition)
    label: str


@dataclass(slots=True)
class Run:
    directory: str
    topics: list[str]
    partitions: int
    admin: Any
    seed: int
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def state(self) -> launcher.ClusterState:
        return launcher.require_state(self.directory)

    def describe(self) -> list[Any]:
        """Every partition of our topics, in (topic, partition) order."""
        out = []
        for desc in self.admin.describe_topics(self.topics, include_offsets=False):
            out.extend(desc.partitions)
        return sorted(out, key=lambda p: (p.topic, p.partition))

    def settled_problem(self) -> str:
        """Why the cluster is not settled ("" when it is): every process running, and every
        partition led with its whole replica set in the ISR."""
        state = self.state()
        down = [s.label for s in state.all() if launcher.process_state(s) != "running"]
        if down:
            return f"not running: {', '.join(down)}"
        try:
            parts = self.describe()
        except Exception as err:
            return f"metadata not available ({type(err).__name__})"
        under = [
            f"{p.topic}-{p.partition}"
            for p in parts
            if p.leader < 0 or set(p.isr) != set(p.replicas)
        ]
        return f"under-replicated: {', '.join(under)}" if under else ""

    def wait_settled(self, timeout_s: float = SETTLE_TIMEOUT_S) -> bool:
        deadline = time.monotonic() + timeout_s
        problem = ""
        while time.monotonic() < deadline:
            problem = self.settled_problem()
            if not problem:
                return True
            time.sleep(0.1)
        self.problems.append(f"the cluster did not settle within {timeout_s:.0f}s: {problem}")
        return False


def _affected(parts: Sequence[Any], brokers: Iterable[int]) -> tuple[str, ...]:
    """The partitions `brokers` lead: where a fault of theirs stops the writes until a new
    leader takes over (a follower's fault only slows them until the ISR shrinks)."""
    wanted = set(brokers)
    return tuple(f"{p.topic}-{p.partition}" for p in parts if p.leader in wanted)


def _resolve(run: Run, fault: PlannedFault) -> Target:
    parts = run.describe()
    part = parts[fault.pick % len(parts)]
    leader = part.leader if part.leader >= 0 else part.replicas[0]
    brokers = [leader]
    if fault.variant == "two":
        others = sorted(b.node_id for b in run.state().brokers if b.node_id != leader)
        brokers.append(others[(fault.pick >> 10) % len(others)])
    where = f"{part.topic}-{part.partition}"
    label = " and ".join(f"broker {b}" for b in brokers) + f" (leader of {where})"
    return Target(brokers, _affected(parts, brokers), label)


def _start_brokers(run: Run, ids: Sequence[int]) -> None:
    state = run.state()
    specs = [state.find(str(i)) for i in ids]
    for spec in specs:
        launcher.start_process(spec, state)
        launcher.save_state(state)
    launcher.wait_ready(state, 60.0, expect=specs)


def _hold(seconds: float, stop: threading.Event) -> None:
    stop.wait(seconds)


def _cause(run: Run, fault: PlannedFault, stop: threading.Event) -> tuple[Target, float, float]:
    """Cause `fault`, hold it, heal it; (target, start, end) in wall seconds."""
    directory = run.directory
    if fault.kind == "controller":
        state = run.state()
        spec = launcher.active_controller(state) if state.is_quorum else state.controller
        if spec is None:
            raise launcher.LauncherError("no active controller to kill")
        target = Target([], (), f"{spec.name} (the active controller)")
        started = _now()
        launcher.signal_process(spec, signal.SIGKILL)
        launcher.wait_stopped(spec, 5.0)
        _hold(fault.hold_s, stop)
        ended = _now()
        launcher.start_process(spec, state)
        launcher.save_state(state)
        launcher.wait_ready(state, 60.0, expect=[spec])
        return target, started, ended
    if fault.kind == "partition":
        return _partition(run, fault, stop)
    target = _resolve(run, fault)
    if fault.kind == "kill":
        started = _now()
        for b in target.brokers:
            launcher.act(directory, "kill", str(b))
        _hold(fault.hold_s, stop)
        ended = _now()
        _start_brokers(run, target.brokers)
        return target, started, ended
    if fault.kind == "pause":
        started = _now()
        for b in target.brokers:
            launcher.act(directory, "pause", str(b))
        _hold(fault.hold_s, stop)
        ended = _now()
        for b in target.brokers:
            launcher.act(directory, "resume", str(b))
        return target, started, ended
    if fault.kind == "disk":
        return _disk(run, target)
    raise ValueError(f"unknown fault kind {fault.kind!r}")


def _largest_file(*roots: pathlib.Path) -> int:
    sizes = [0]
    for root in roots:
        paths = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for p in paths:
            with contextlib.suppress(OSError):
                sizes.append(p.stat().st_size)
    return max(sizes)


def _disk(run: Run, target: Target) -> tuple[Target, float, float]:
    """Fill the broker's disk: no file of it may grow more than a little past the largest it
    has (its process log included, so the error it logs gets out); it fails its next append
    that crosses that, takes its log dir offline and exits. Started again without the limit."""
    (broker,) = target.brokers
    spec = run.state().find(str(broker))
    limit = (
        _largest_file(pathlib.Path(spec.data_dir), pathlib.Path(spec.log_file))
        + DISK_HEADROOM_BYTES
    )
    started = _now()
    resource.prlimit(spec.pid, resource.RLIMIT_FSIZE, (limit, limit))
    if not launcher.wait_stopped(spec, DISK_EXIT_TIMEOUT_S):
        run.notes.append(
            f"disk: broker {broker} still ran {DISK_EXIT_TIMEOUT_S:.0f}s after its file size "
            "limit was lowered; killed"
        )
        launcher.signal_process(spec, signal.SIGKILL)
        launcher.wait_stopped(spec, 5.0)
    ended = _now()
    # The fault begins when the broker's append fails, not when its limit was lowered: the
    # controller logs the report it then sends (`log_dir_offline`).
    lines = [line for s in run.state().controllers for line in read_lines(s.log_file)]
    reported = first_event_at(lines, "log_dir_offline", started, broker_id=broker)
    _start_brokers(run, [broker])
    return target, reported if reported is not None else started, ended


def first_event_at(lines: Iterable[str], name: str, since: float, **match: Any) -> float | None:
    """The wall time of the first JSON log event `name` at or after `since` whose fields
    include `match`; None when there is none."""
    found: float | None = None
    for line in lines:
        if not line.startswith("{") or name not in line:
            continue
        try:
            event = json.loads(line)
            at = datetime.datetime.fromisoformat(str(event["timestamp"])).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        if event.get("event") != name or at < since:
            continue
        if all(event.get(k) == v for k, v in match.items()) and (found is None or at < found):
            found = at
    return found


def _partition(run: Run, fault: PlannedFault, stop: threading.Event) -> tuple[Target, float, float]:
    net = launcher
    directory = run.directory
    parts = run.describe()
    part = parts[fault.pick % len(parts)]
    leader = part.leader if part.leader >= 0 else part.replicas[0]
    where = f"{part.topic}-{part.partition}"
    state = run.state()
    brokers = sorted(b.node_id for b in state.brokers)
    variant = fault.variant
    marks = _log_sizes(state)
    called = _now()
    if variant == "zombie":
        net.isolate(directory, str(leader), "nodes")
        target = Target(
            [leader],
            _affected(parts, [leader]),
            f"broker {leader} (leader of {where}) isolated from every other node",
        )
    elif variant == "follower":
        followers = [r for r in part.replicas if r != leader]
        follower = followers[(fault.pick >> 10) % len(followers)]
        net.partition(directory, [str(follower), str(leader)])
        target = Target(
            [follower],
            tuple(
                f"{p.topic}-{p.partition}"
                for p in parts
                if p.leader == leader and follower in p.replicas
            ),
            f"broker {follower} cut from broker {leader}, its leader of {where}",
        )
    elif variant == "controller_only":
        net.isolate(directory, str(leader), "controller")
        target = Target(
            [leader],
            _affected(parts, [leader]),
            f"broker {leader} (leader of {where}) cut from the controllers",
        )
    else:  # split: the leader alone | the rest, the active controller on one side
        others = [str(b) for b in brokers if b != leader]
        active = launcher.active_controller(state) if state.is_quorum else state.controller
        rest = [c.name for c in state.controllers if active is None or c.name != active.name]
        if (fault.pick >> 11) % 2 and active is not None:
            groups = [f"{leader},{active.name}", ",".join(others + rest)]
            side = f"{active.name} (active) with broker {leader}"
        else:
            groups = [str(leader), ",".join(others + [c.name for c in state.controllers])]
            side = "the controllers with the majority"
        net.partition(directory, groups)
        target = Target([leader], _affected(parts, [leader]), f"split {' | '.join(groups)}: {side}")
    # Processes poll the fault file: the fault starts when every one of them has applied it.
    generation = int(launcher.current_faults(directory).get("generation", 0))
    started = faults_applied_at(state, marks, generation) or called
    _hold(fault.hold_s, stop)
    ended = _now()
    net.heal(directory)
    return target, started, ended


def _log_sizes(state: launcher.ClusterState) -> dict[str, int]:
    sizes = {}
    for spec in state.all():
        try:
            sizes[spec.log_file] = os.path.getsize(spec.log_file)
        except OSError:
            sizes[spec.log_file] = 0
    return sizes


def faults_applied_at(
    state: launcher.ClusterState, marks: dict[str, int], generation: int, timeout_s: float = 5.0
) -> float | None:
    """The wall time by which every running process had logged `network_faults_changed` for
    `generation` or a later one (read from its log past `marks`); None if one did not within
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    applied: dict[str, float] = {}
    while time.monotonic() < deadline:
        running = [s for s in state.all() if launcher.process_state(s) == "running"]
        for spec in running:
            if spec.log_file in applied:
                continue
            try:
                with open(spec.log_file, "rb") as f:
                    f.seek(marks.get(spec.log_file, 0))
                    text = f.read().decode(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                if "network_faults_changed" not in line or not line.startswith("{"):
                    continue
                try:
                    event = json.loads(line)
                    at = datetime.datetime.fromisoformat(str(event["timestamp"])).timestamp()
                    if int(event.get("generation", -1)) >= generation:
                        applied[spec.log_file] = at
                        break
                except (ValueError, KeyError, TypeError):
                    continue
        if all(s.log_file in applied for s in running):
            return max(applied.values(), default=None)
        time.sleep(0.02)
    return None


# -- after the run --------------------------------------------------------------------------------


def final_logs(
    bootstrap: str,
    topics: Sequence[str],
    partitions: int,
    timeout_s: float = 60.0,
    client: dict[str, str] | None = None,
) -> tuple[dict[str, list[tuple[int, str]]], dict[str, int]]:
    """Every record of every partition from its start to its high watermark. `client`: the
    cluster's client properties as keyword arguments (TLS)."""
    from minibroker.client import Consumer, TopicPartition

    tps = [TopicPartition(t, p) for t in topics for p in range(partitions)]
    final: dict[str, list[tuple[int, str]]] = {str(tp): [] for tp in tps}
    with Consumer(bootstrap, auto_offset_reset="earliest", **(client or {})) as consumer:
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout_s
        left = {tp for tp in tps if ends[tp] > 0}
        while left and time.monotonic() < deadline:
            for r in consumer.poll(timeout_ms=500, max_records=5000):
                tp = TopicPartition(r.topic, r.partition)
                if r.offset < ends[tp]:
                    final[str(tp)].append((r.offset, (r.value or b"").decode(errors="replace")))
                if r.offset >= ends[tp] - 1:
                    left.discard(tp)
        if left:
            raise launcher.LauncherError(
                f"the final read did not reach the high watermark of {sorted(map(str, left))}"
            )
    return final, {str(tp): ends[tp] for tp in tps}


def replica_digest(
    data_dir: str, partition: str, hw: int, *, compacted: bool = False
) -> tuple[str, int]:
    """(digest, end) of a replica's segment files: the sha256 of the bytes of every batch
    wholly below `hw`, and the offset those batches end at (`hw` once the replica holds every
    batch below it).

    `compacted` (cleanup.policy includes compact): each replica cleans its log on its own, so
    replicas agree on the latest value of every key below the HW, not on bytes
    (docs/design.md, the replica invariant): the digest is then `latest_values_digest` of
    `replica_latest_values`, and the end is where the replica's log reaches (the last
    segment's base offset or its last batch's next offset), since cleaning may remove the
    last batches below the HW."""
    from minibroker.client.batch import scan_valid_prefix

    if compacted:
        values, end = replica_latest_values(data_dir, partition, hw)
        return latest_values_digest(values), end
    digest = hashlib.sha256()
    end = 0
    folder = pathlib.Path(data_dir) / partition
    for segment in sorted(folder.glob("*.log")):
        data = segment.read_bytes()
        _valid, batches, _error = scan_valid_prefix(data)
        for pos, header in batches:
            if header.last_offset < hw:
                digest.update(data[pos : pos + header.size])
                end = max(end, header.last_offset + 1)
    return digest.hexdigest(), end


def replica_latest_values(data_dir: str, partition: str, hw: int) -> tuple[dict[bytes, bytes], int]:
    """The latest value of every key among a replica's records below `hw` (a key whose latest
    record is a tombstone is absent: a replica that already removed the tombstone agrees with
    one that still holds it), and the offset the replica's log reaches (its last segment's
    base offset or the next offset of its last batch, whichever is larger). Reads the segment
    files as they are: gaps between batches and inside them are what cleaning leaves."""
    from minibroker.client.batch import scan_valid_prefix
    from minibroker.client.log_format import parse_segment_file_name
    from minibroker.client.records import decode_batch

    values: dict[bytes, bytes] = {}
    reached = 0
    folder = pathlib.Path(data_dir) / partition
    for segment in sorted(folder.glob("*.log")):
        parsed = parse_segment_file_name(segment.name)
        if parsed is not None:
            reached = max(reached, parsed[0])
        data = segment.read_bytes()
        _valid, batches, _error = scan_valid_prefix(data)
        for pos, header in batches:
            reached = max(reached, header.next_offset)
            if header.base_offset >= hw or header.is_control:
                continue
            for record in decode_batch(data, pos).records:
                if record.offset >= hw or record.key is None:
                    continue
                if record.value is None:
                    values.pop(record.key, None)
                else:
                    values[record.key] = record.value
    return values, reached


def latest_values_digest(values: dict[bytes, bytes]) -> str:
    """sha256 of a key -> value map, independent of the order it was built in."""
    digest = hashlib.sha256()
    for key in sorted(values):
        value = values[key]
        digest.update(len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value)
    return digest.hexdigest()


def replica_digests(
    run: Run, final_hw: dict[str, int], timeout_s: float = 60.0
) -> dict[str, dict[int, str]]:
    """Per partition, per replica: the digest of its log below the HW, once every replica's
    files reach the HW (followers fetch what the leader has; nothing is compared before).
    verify's topics are `cleanup.policy=delete` (its workload is keyless), so bytes are
    compared; `replica_digest(..., compacted=True)` is the comparison for a compacted log."""
    state = run.state()
    dirs = {b.node_id: b.data_dir for b in state.brokers}
    parts = run.describe()
    out: dict[str, dict[int, str]] = {}
    deadline = time.monotonic() + timeout_s
    for p in parts:
        tp = f"{p.topic}-{p.partition}"
        hw = final_hw.get(tp, 0)
        digests: dict[int, str] = {}
        for broker in p.replicas:
            while True:
                try:
                    digest, end = replica_digest(dirs[broker], tp, hw)
                except OSError:
                    digest, end = "", -1
                if end >= hw or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            if end < hw:
                run.problems.append(f"broker {broker}'s copy of {tp} never reached the HW {hw}")
            digests[broker] = digest
        out[tp] = digests
    return out


ISR_EVENTS = (
    "leader_elected",
    "unclean_leader_elected",
    "partition_offline",
    "isr_shrink",
    "isr_expand",
)


def isr_timeline(
    lines: Iterable[str], topics: Iterable[str]
) -> dict[str, list[tuple[float, int, tuple[int, ...]]]]:
    """From controllers' JSON log lines: per partition of `topics`, (wall seconds, partition
    epoch, ISR) of every committed change. Several controllers may log the same change (each
    partition epoch has one ISR): the earliest line counts."""
    wanted = set(topics)
    by_epoch: dict[tuple[str, int], tuple[float, tuple[int, ...]]] = {}
    for line in lines:
        if not line.startswith("{") or '"event"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") not in ISR_EVENTS or event.get("topic") not in wanted:
            continue
        isr = event.get("new_isr", event.get("isr"))
        try:
            at = datetime.datetime.fromisoformat(str(event["timestamp"])).timestamp()
            key = (f"{event['topic']}-{event['partition']}", int(event["partition_epoch"]))
        except (KeyError, ValueError, TypeError):
            continue
        if isr is None:
            continue
        if key not in by_epoch or at < by_epoch[key][0]:
            by_epoch[key] = (at, tuple(int(b) for b in isr))
    out: dict[str, list[tuple[float, int, tuple[int, ...]]]] = {}
    for (tp, epoch), (at, isr) in by_epoch.items():
        out.setdefault(tp, []).append((at, epoch, isr))
    for changes in out.values():
        changes.sort(key=lambda c: (c[1], c[0]))
    return out


# -- the run --------------------------------------------------------------------------------------


def _setting_ms(state: launcher.ClusterState, key: str, default: int) -> int:
    for spec in state.all():
        if key in spec.settings:
            with contextlib.suppress(ValueError):
                return int(spec.settings[key])
    return default


def _say(args: argparse.Namespace, line: str) -> None:
    print(line, file=sys.stderr if args.json else sys.stdout, flush=True)


def _kill_cluster(directory: str) -> list[int]:
    """SIGKILL every process of the cluster by its PID (resumed first if paused); the PIDs."""
    state = launcher.load_state(directory)
    pids: list[int] = []
    if state is None:
        return pids
    for spec in state.all():
        if spec.pid > 0 and launcher.process_state(spec) != "stopped":
            pids.append(spec.pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(spec.pid, signal.SIGCONT)
                os.kill(spec.pid, signal.SIGKILL)
            launcher.wait_stopped(spec, 5.0)
    return pids


def run_verify(args: argparse.Namespace) -> dict[str, Any]:
    kinds = parse_kinds(args.faults)
    if args.rounds is not None and args.rounds < 1:
        raise ValueError("--rounds must be at least 1")
    if getattr(args, "tls", False) and not args.fresh:
        raise ValueError(
            "--tls makes the temporary cluster a TLS one: use it with --fresh (a --tls cluster "
            "in --dir needs no flag)"
        )
    if args.topics < 1 or args.partitions < 1 or args.rate <= 0:
        raise ValueError("--topics and --partitions must be at least 1, --rate positive")
    if args.duration is not None:
        duration_s = parse_duration(args.duration)
    else:
        duration_s = float("inf") if args.rounds is not None else 60.0
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    _say(args, f"verify: seed {seed} (replay with --seed {seed}), faults {','.join(kinds)}")
    if args.fresh:
        with tempfile.TemporaryDirectory(prefix="minibroker-verify-") as directory:
            pids: list[int] = []
            try:
                state = launcher.up(
                    directory,
                    brokers=FRESH_BROKERS,
                    base_port=0,
                    settings=dict(FRESH_SETTINGS),
                    controllers=FRESH_CONTROLLERS,
                    tls=getattr(args, "tls", False),
                )
                pids = [s.pid for s in state.all()]
                result = _run(args, directory, kinds, seed, duration_s)
            finally:
                killed = _kill_cluster(directory)
            # Every process this run started and killed at the end, and where it ran (gone
            # now), so a caller can check that nothing is left.
            result["cluster_dir"] = directory
            result["cluster_pids"] = sorted(set(pids) | set(killed))
            return result
    return _run(args, args.dir, kinds, seed, duration_s)


def _run(
    args: argparse.Namespace,
    directory: str,
    kinds: Sequence[str],
    seed: int,
    duration_s: float,
) -> dict[str, Any]:
    from minibroker.client import Admin

    state = launcher.require_state(directory)
    timing = Timing(
        lag_s=_setting_ms(state, "replica.lag.time.max.ms", DEFAULT_LAG_MS) / 1000,
        session_s=_setting_ms(state, "broker.session.timeout.ms", DEFAULT_SESSION_MS) / 1000,
    )
    replicas = min(3, len(state.brokers))
    min_insync = max(1, replicas - 1)
    topics = [f"verify-{seed}-{i}" for i in range(args.topics)]
    # The cluster's client.properties (TLS: the launcher's admin certificate), or nothing.
    client = launcher.client_kwargs(state)
    admin = Admin(state.bootstrap_servers, default_api_timeout_ms=30_000, **client)
    run = Run(directory, topics, args.partitions, admin, seed)
    log = WriteLog()
    producers: list[ProducerThread] = []
    consumers: list[ConsumerThread] = []
    faults: list[checker.Fault] = []
    fault_rows: list[dict[str, Any]] = []
    stop = threading.Event()
    started = _now()  # again once the workload starts: the chart and elapsed time begin there
    try:
        for topic in topics:
            # delete, whatever the broker default: the workload's records are keyless (a
            # compacted topic refuses them) and every acked write must stay readable.
            admin.create_topic(
                topic,
                args.partitions,
                replicas,
                {"min.insync.replicas": str(min_insync), "cleanup.policy": "delete"},
            )
        created_at = _now()
        if not run.wait_settled(60.0):
            raise launcher.LauncherError(run.problems[-1])
        initial_isr = {f"{p.topic}-{p.partition}": tuple(p.replicas) for p in run.describe()}
        rate = args.rate / len(topics)
        for i, topic in enumerate(topics):
            producers.append(
                ProducerThread(
                    state.bootstrap_servers,
                    topic,
                    args.partitions,
                    rate,
                    f"{seed}-{i}",
                    log,
                    **client,
                )
            )
            consumers.append(
                ConsumerThread(state.bootstrap_servers, topic, args.partitions, f"c{i}", **client)
            )
        started = _now()
        for producer in producers:
            producer.start()
        for consumer in consumers:
            consumer.start()
        schedule = Schedule(seed, kinds, timing)
        began = time.monotonic()
        rounds = 0
        while (args.rounds is None or rounds < args.rounds) and (
            time.monotonic() - began < duration_s
        ):
            # Steady state first: writes acknowledged since the cluster settled.
            since = _now()
            launcher.wait_for(lambda s=since: log.acks_since(s) >= 5, 60, "acks before a fault")
            fault = schedule.next()
            rounds += 1
            target, t0, t1 = _cause(run, fault, stop)
            faults.append(checker.Fault(fault.kind, target.label, t0, t1, target.partitions))
            settled = run.wait_settled()
            fault_rows.append(
                {
                    "round": fault.round,
                    "kind": fault.kind,
                    "variant": fault.variant,
                    "target": target.label,
                    "held_s": round(t1 - t0, 3),
                    "settled_after_s": round(_now() - t1, 3),
                }
            )
            _say(
                args,
                f"round {fault.round}: {fault.describe()} of {target.label}, held "
                f"{t1 - t0:.1f}s, settled {_now() - t1:.1f}s later"
                + ("" if settled else " (NOT settled)"),
            )
            if not settled:
                break
        ended = _now()
        for p in producers:
            p.stop(flush_timeout_s=60)
        final, final_hw = final_logs(
            state.bootstrap_servers, topics, args.partitions, client=client
        )
        # The live consumers catch up to the end before they stop (their reads are checked
        # against the final logs).
        deadline = time.monotonic() + 60
        for i, c in enumerate(consumers):
            for partition in range(args.partitions):
                end = final_hw[f"{topics[i]}-{partition}"]
                while c.position(partition) < end and time.monotonic() < deadline:
                    time.sleep(0.05)
        for c in consumers:
            c.stop()
        digests = replica_digests(run, final_hw)
        lines = [
            line
            for s in launcher.require_state(directory).controllers
            for line in read_lines(s.log_file)
        ]
        timeline = isr_timeline(lines, topics)
    finally:
        stop.set()
        for p in producers:
            with contextlib.suppress(Exception):
                p.stop(flush_timeout_s=5)
        for c in consumers:
            c.stop()
        with contextlib.suppress(Exception):
            now = launcher.current_faults(directory)
            if now.get("cut") or now.get("no_clients") or now.get("slow"):
                launcher.heal(directory)
        if not args.fresh:
            with contextlib.suppress(Exception):
                admin.delete_topics(topics)
        admin.close()
    isr: dict[str, list[tuple[float, tuple[int, ...]]]] = {}
    for tp, initial in initial_isr.items():
        isr[tp] = [(created_at, initial)] + [
            (at, members) for at, _e, members in timeline.get(tp, [])
        ]
    reads = [r for c in consumers for r in c.reads]
    history = checker.History(
        writes=log.history(),
        reads=reads,
        final=final,
        final_hw=final_hw,
        replicas=digests,
        isr=isr,
        min_insync=min_insync,
        faults=faults,
    )
    verdict = checker.check(history)
    table = checker.recovery_table(history)
    rates = checker.throughput(history.writes, started, ended, CHART_COLUMNS)
    marks = [(f.started - started, f.ended - started, f.kind) for f in faults]
    problems = run.problems
    command = " ".join(
        shlex.quote(a)
        for a in [
            "minibroker",
            "verify",
            "--fresh" if args.fresh else f"--dir={directory}",
            *(["--tls"] if args.fresh and getattr(args, "tls", False) else []),
            f"--seed={seed}",
            f"--faults={','.join(kinds)}",
            f"--topics={args.topics}",
            f"--partitions={args.partitions}",
            f"--rate={args.rate:g}",
        ]
        + ([f"--rounds={args.rounds}"] if args.rounds is not None else [])
        + ([f"--duration={args.duration}"] if args.duration is not None else [])
    )
    return {
        "seed": seed,
        "command": command,
        "ok": verdict.ok and not problems,
        "rounds": len(faults),
        "elapsed_s": round(ended - started, 3),
        "fault_kinds": list(kinds),
        "faults": table,
        "rounds_detail": fault_rows,
        "totals": {
            "acked": verdict.acked,
            "failed": verdict.failed,
            "indeterminate_stored": verdict.indeterminate_stored,
            "read": verdict.read,
            "final_records": verdict.final_records,
            "lost": verdict.lost,
            "duplicated": verdict.duplicated,
        },
        "violation_counts": verdict.counts(),
        "violations": [v.text() for v in verdict.violations],
        "problems": problems,
        "notes": run.notes,
        "consumer_errors": [e for c in consumers for e in c.errors][:50],
        "throughput_per_s": [round(r, 1) for r in rates],
        "chart": report.chart(rates, ended - started, marks),
        "min_insync_replicas": min_insync,
        # ISR changes the controllers committed for our partitions (the min ISR check's input).
        "isr_changes": sum(len(changes) for changes in timeline.values()),
        "topics": topics,
        "partitions": args.partitions,
    }


def main(args: argparse.Namespace) -> int:
    try:
        result = run_verify(args)
    except (ValueError, launcher.LauncherError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        print(report.render(result))
        for line in result["problems"]:
            print(f"PROBLEM: {line}")
        for line in result["notes"]:
            print(f"note: {line}")
    if not result["ok"]:
        print(
            f"verify FAILED: reproduce with --seed {result['seed']}: {result['command']}",
            file=sys.stderr,
        )
        return 1
    return 0
