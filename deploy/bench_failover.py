"""`minibroker bench failover` and `minibroker bench metadata`: benchmarks that need a throwaway
local cluster of their own (free ports, a temp dir), started and stopped with the launcher.

`bench failover --target broker` (the default): time from SIGKILL of a partition leader to the
first acks=all write acknowledged by its successor, over repeated kills (issue: median under
1 s). One acks=all producer writes single records to one partition; the leader is killed; the
first acknowledgement after the kill came from the new leader (the old one is dead). The killed
broker is restarted and a full ISR awaited before the next round. `--controllers 3` runs the
same on a 3-voter quorum, to check that the quorum does not slow broker failover down.

`bench failover --target controller` (issue 13): per round, find the active controller
(DescribeQuorum), SIGKILL it (SIGTERM with `--graceful`: it hands over with EndQuorumEpoch) and
time from the signal to
  (a) a surviving voter's DescribeQuorum naming a new leader (of a higher epoch), and
  (b) the first metadata change accepted by the new leader: a CreateTopics of a fresh topic
      through the Admin client (which follows NOT_CONTROLLER hints), timed when the controller's
      answer arrives (the topic is committed then);
and from the new leader's own log (wall clock, so ~ms precision): when it activated
(`controller_activated`), committed our topic (`topic_created`), and the first broker-driven
change it committed (registration, fencing, ISR change, election), if any happened. The killed
voter is restarted and the round ends when it follows the new leader, caught up to its high
watermark, and every broker is registered and unfenced.

`bench metadata`: metadata commit latency and throughput, 1 voter vs 3 (issue 13: "metadata
commit latency with 3 voters vs 1 (topic creation rate)"). A mode of its own rather than a
flag of `failover`, because it kills nothing; it lives here because, like failover, it needs
clusters of a chosen quorum size that it starts itself (`client/cli/bench.py`'s tools run
against a cluster the user already has). Per run: a fresh cluster, K topics created one after
another through the Admin, then K more by M concurrent callers; each creation is timed from
the call to the controller's answer (committed by the quorum), not until brokers show leaders.
The active controller's `kafka_server_raft_metrics_commit_latency_avg` is read from /metrics.
Runs alternate the quorum sizes (1, 3, 1, 3, ...) so slow phases of a noisy machine hit both.

Benchmarks measure and never assert. The pure parts (argument checks, summary math, log and
metrics parsing, "has a new leader been named") are plain functions, unit tested.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from minibroker.deploy import cluster as launcher
from minibroker.deploy import quorum

# A fresh local cluster's settings for every bench here: no automatic leader rebalance in the
# middle of a measurement.
BENCH_SETTINGS = {"leader.imbalance.check.interval.seconds": "3600"}
ROUND_TIMEOUT_S = 60.0
POLL_INTERVAL_S = 0.005
# Events a controller commits because a broker asked for something or its session changed:
# "the first accepted AlterPartition/registration" after a controller failover.
BROKER_DRIVEN_EVENTS = frozenset(
    {
        "broker_registered",
        "broker_unfenced",
        "broker_fenced",
        "broker_controlled_shutdown",
        "isr_shrink",
        "isr_expand",
        "leader_elected",
        "partition_offline",
    }
)
COMMIT_LATENCY_METRIC = "kafka_server_raft_metrics_commit_latency_avg"


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "failover",
        help="kill a partition leader (or the active controller) repeatedly; time the failover",
        description="On a throwaway local cluster: SIGKILL a partition leader (--target broker) "
        "or the active controller (--target controller) round after round, and time until "
        "the successor accepts a write (broker) or a metadata change (controller).",
    )
    parser.add_argument(
        "--target",
        choices=("broker", "controller"),
        default="broker",
        help="what to kill: a partition's leader broker (default) or the active controller",
    )
    parser.add_argument(
        "--rounds",
        "--kills",
        dest="rounds",
        type=int,
        default=10,
        help="number of kills (default 10)",
    )
    parser.add_argument(
        "--controllers",
        type=int,
        choices=quorum.QUORUM_SIZES,
        default=None,
        help="controllers in the quorum (default: 1 for --target broker, 3 for --target "
        "controller; --target broker --controllers 3 checks that a quorum does not slow "
        "broker failover down)",
    )
    parser.add_argument("--brokers", type=int, default=3, help="brokers in the cluster (default 3)")
    parser.add_argument(
        "--graceful",
        action="store_true",
        help="SIGTERM instead of SIGKILL (a controller hands over with EndQuorumEpoch, a "
        "broker does a controlled shutdown)",
    )
    parser.add_argument(
        "--retry-backoff-ms",
        type=int,
        default=100,
        help="the producer's and admin client's retry.backoff.ms (default 100, Kafka's)",
    )
    _add_common(parser)
    parser.set_defaults(func=main)

    meta = sub.add_parser(
        "metadata",
        help="metadata commit latency and topic creation rate, 1 controller vs 3",
        description="On throwaway local clusters of each quorum size: create topics one after "
        "another, then with concurrent callers, and time each creation until the controller "
        "answers (committed by the quorum).",
    )
    meta.add_argument(
        "--controllers",
        type=parse_sizes,
        default=(1, 3),
        help="comma-separated quorum sizes to compare (default 1,3)",
    )
    meta.add_argument("--topics", type=int, default=200, help="topics per phase (default 200)")
    meta.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="concurrent callers of the second phase (default 8; 1 skips it)",
    )
    meta.add_argument(
        "--runs", type=int, default=1, help="runs per quorum size, alternated (default 1)"
    )
    meta.add_argument("--partitions", type=int, default=1, help="partitions per topic (1)")
    meta.add_argument(
        "--replication-factor", type=int, default=3, help="replicas per partition (3)"
    )
    meta.add_argument("--brokers", type=int, default=3, help="brokers in the cluster (default 3)")
    _add_common(meta)
    meta.set_defaults(func=metadata_main)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        type=parse_setting,
        default=[],
        metavar="KEY=VALUE",
        help="a controller or broker setting for the bench's cluster (repeatable), e.g. "
        "controller.quorum.fetch.timeout.ms=1000",
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON object")


# -- pure parts ----------------------------------------------------------------------------------


def parse_setting(text: str) -> tuple[str, str]:
    """`key=value` -> (key, value) for `--set`."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--set expects KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def parse_sizes(text: str) -> tuple[int, ...]:
    """`1,3` -> (1, 3): quorum sizes for `bench metadata --controllers`."""
    sizes = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) not in quorum.QUORUM_SIZES:
            allowed = ", ".join(str(n) for n in quorum.QUORUM_SIZES)
            raise argparse.ArgumentTypeError(
                f"quorum sizes are comma-separated numbers among {allowed}, got {text!r}"
            )
        sizes.append(int(part))
    return tuple(dict.fromkeys(sizes))


def controllers_for(args: argparse.Namespace) -> int:
    """The quorum size a failover bench runs with; ValueError when it cannot fail over."""
    if args.rounds < 1:
        raise ValueError("--rounds must be at least 1")
    if args.target == "controller":
        count = 3 if args.controllers is None else args.controllers
        if count < 3:
            raise ValueError(
                "--target controller needs a quorum that can elect another leader: "
                "--controllers 3 or 5"
            )
        return int(count)
    return 1 if args.controllers is None else int(args.controllers)


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..1): the smallest value with at least p of them at or
    below it. p99 of 10 values is their maximum."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(p * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True, slots=True)
class Summary:
    n: int
    median: float
    minimum: float
    maximum: float
    p99: float

    def fields(self, unit: str = "ms") -> dict[str, float | int]:
        return {
            "n": self.n,
            f"median_{unit}": round(self.median, 3),
            f"min_{unit}": round(self.minimum, 3),
            f"max_{unit}": round(self.maximum, 3),
            f"p99_{unit}": round(self.p99, 3),
        }

    def text(self) -> str:
        return (
            f"median {self.median:.0f} ms, min {self.minimum:.0f} ms, "
            f"max {self.maximum:.0f} ms (n={self.n})"
        )


def summarize(values: Iterable[float | None]) -> Summary | None:
    """Median, min, max and p99 of the values that were measured (None: not observed)."""
    seen = [v for v in values if v is not None]
    if not seen:
        return None
    return Summary(len(seen), statistics.median(seen), min(seen), max(seen), percentile(seen, 0.99))


def new_leader_named(
    answers: Iterable[quorum.QuorumAnswer | None], old_leader: int, old_epoch: int
) -> tuple[int, int] | None:
    """(leader id, epoch) when some voter names a leader other than `old_leader` in a later
    epoch than `old_epoch`; the highest epoch named wins. None while nobody does."""
    best: tuple[int, int] | None = None
    for answer in answers:
        if answer is None or answer.leader_id in (quorum.NO_LEADER, old_leader):
            continue
        if answer.leader_epoch <= old_epoch:
            continue
        if best is None or answer.leader_epoch > best[1]:
            best = (answer.leader_id, answer.leader_epoch)
    return best


def leader_of(answers: Iterable[quorum.QuorumAnswer | None]) -> quorum.QuorumAnswer | None:
    """The answer of the voter that says it leads, at the highest epoch."""
    leaders = [a for a in answers if a is not None and a.role == "leader"]
    return max(leaders, key=lambda a: a.leader_epoch) if leaders else None


def follows(answer: quorum.QuorumAnswer | None, leader: quorum.QuorumAnswer | None) -> bool:
    """`answer`'s voter follows `leader` and holds everything the leader has committed."""
    if answer is None or leader is None or answer.role != "follower":
        return False
    return (
        answer.leader_id == leader.node_id
        and answer.leader_epoch == leader.leader_epoch
        and answer.log_end_offset >= leader.high_watermark >= 0
    )


@dataclass(frozen=True, slots=True)
class LogTimes:
    """What the new leader's log says happened after the signal, in ms after it."""

    activated_ms: float | None = None
    topic_created_ms: float | None = None
    broker_change_ms: float | None = None
    broker_change: str = ""


def log_times(
    lines: Iterable[str], since_wall_s: float, topic: str, until_wall_s: float | None = None
) -> LogTimes:
    """From a controller's JSON log lines: the first `controller_activated`, the
    `topic_created` of `topic` and the first broker-driven change at or after `since_wall_s`
    (and before `until_wall_s`), as ms after `since_wall_s`. Lines that are not JSON events
    (a traceback, a partial last line) are skipped."""
    activated: float | None = None
    created: float | None = None
    change: float | None = None
    change_name = ""
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
            at = datetime.datetime.fromisoformat(str(event["timestamp"])).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        if at < since_wall_s or (until_wall_s is not None and at > until_wall_s):
            continue
        name = event.get("event")
        ms = (at - since_wall_s) * 1000
        if name == "controller_activated" and activated is None:
            activated = ms
        elif name == "topic_created" and event.get("topic") == topic and created is None:
            created = ms
        elif name in BROKER_DRIVEN_EVENTS and change is None:
            change, change_name = ms, str(name)
    return LogTimes(activated, created, change, change_name)


def metric_value(text: str, name: str) -> float | None:
    """The value of an unlabelled sample `name` in Prometheus text, None when absent."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) >= 2 and parts[0] == name:
            try:
                return float(parts[1])
            except ValueError:
                return None
    return None


def alternate(sizes: Sequence[int], runs: int) -> list[int]:
    """The order the metadata runs go in: every size once per run, [1, 3, 1, 3, ...]."""
    return [size for _ in range(runs) for size in sizes]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f} ms"


# -- broker failover -----------------------------------------------------------------------------


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


def _start_cluster(
    args: argparse.Namespace, directory: str, controllers: int
) -> launcher.ClusterState:
    return launcher.up(
        directory,
        brokers=args.brokers,
        base_port=0,
        settings={**BENCH_SETTINGS, **dict(args.settings)},
        controllers=controllers,
    )


def broker_failover(args: argparse.Namespace, controllers: int) -> dict[str, Any]:
    from minibroker.client import Admin

    sig = signal.SIGTERM if args.graceful else signal.SIGKILL
    times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="minibroker-failover-") as directory:
        state = _start_cluster(args, directory, controllers)
        admin = Admin(state.bootstrap_servers)
        clock = AckClock(state.bootstrap_servers, args.retry_backoff_ms)
        try:
            replicas = min(3, args.brokers)
            admin.create_topic("failover", 1, replicas, {"min.insync.replicas": "2"})

            def partition() -> Any:
                return admin.describe_topics(["failover"])[0].partitions[0]

            launcher.wait_for(lambda: len(partition().isr) == replicas, 30, "a full ISR")
            clock.start()
            for n in range(1, args.rounds + 1):
                launcher.wait_for(lambda: len(partition().isr) == replicas, 60, "a full ISR")
                time.sleep(0.3)  # steady state: acks flowing
                leader = partition().leader
                # The launcher's saved layout: `act(..., "start", ...)` below records the
                # restarted broker's new PID there, not in `state`.
                spec = launcher.require_state(directory).find(str(leader))
                t0 = time.monotonic()
                if not launcher.signal_process(spec, sig):
                    raise launcher.LauncherError(f"{spec.label} was not running to be killed")
                elapsed = clock.first_ack_after(t0, 30)
                times.append(elapsed * 1000)
                _say(
                    args,
                    f"kill {n}: broker {leader} ({sig.name}) -> first acks=all write "
                    f"acknowledged by the new leader after {elapsed * 1000:.0f} ms",
                )
                if not launcher.wait_stopped(spec, 30.0):
                    launcher.signal_process(spec, signal.SIGKILL)
                    launcher.wait_stopped(spec, 5.0)
                launcher.act(directory, "start", str(leader))
        finally:
            clock.stop()
            admin.close()
            launcher.down(directory)
    summary = summarize(times)
    assert summary is not None  # at least one round ran, or we raised
    return {
        "bench": "failover",
        "target": "broker",
        "controllers": controllers,
        "brokers": args.brokers,
        "signal": sig.name,
        "settings": dict(args.settings),
        "rounds": [{"round": i + 1, "first_ack_ms": round(t, 3)} for i, t in enumerate(times)],
        "first_ack": summary.fields(),
        "load_average": list(os.getloadavg()),
    }


def _say(args: argparse.Namespace, line: str) -> None:
    # With --json the progress lines go to stderr so stdout is one JSON object.
    print(line, file=sys.stderr if args.json else sys.stdout, flush=True)


# -- controller failover -------------------------------------------------------------------------


class QuorumPoller:
    """DescribeQuorum on every voter over channels kept open (a fresh channel per poll would
    add a connection set-up to every sample)."""

    def __init__(self, specs: Sequence[launcher.ProcessSpec], tls: Any = None) -> None:
        from minibroker.client.common.tls import aio_channel
        from minibroker.proto import minibroker_pb2_grpc as pb_grpc

        self._channels = {s.node_id: aio_channel(s.address, tls) for s in specs}
        self._stubs = {i: pb_grpc.QuorumServiceStub(c) for i, c in self._channels.items()}

    async def ask(self, node_id: int, timeout_s: float = 0.5) -> quorum.QuorumAnswer | None:
        import grpc

        from minibroker.proto import minibroker_pb2 as pb

        try:
            reply = await self._stubs[node_id].DescribeQuorum(
                pb.DescribeQuorumRequest(), timeout=timeout_s
            )
        except grpc.RpcError:
            return None
        return quorum.answer_from_pb(reply)

    async def ask_all(self, node_ids: Iterable[int]) -> list[quorum.QuorumAnswer | None]:
        return list(await asyncio.gather(*(self.ask(i) for i in node_ids)))

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()


def timed_admin(bootstrap: str, **config: Any) -> Any:
    """An AsyncAdmin whose topic creations are timed when the controller's answer arrives (the
    topic is committed then: `accepted_at[name]`, monotonic), and that does not wait for the
    brokers to show the new leaders (AsyncAdmin's best-effort `_wait_for_leaders`)."""
    from minibroker.client.admin import AsyncAdmin, CreatedTopic

    class TimedAdmin(AsyncAdmin):
        def __init__(self) -> None:
            super().__init__(bootstrap, **config)
            self.accepted_at: dict[str, float] = {}

        async def _wait_for_leaders(self, created: Mapping[str, CreatedTopic]) -> None:
            now = time.monotonic()
            for name in created:
                self.accepted_at[name] = now

    return TimedAdmin()


async def _create_accepted(
    admin: Any, topic: str, replicas: int, backoff_s: float
) -> tuple[float, list[str]]:
    """Create `topic`; the monotonic time the controller's answer arrived, and the errors the
    Admin gave up with before that (each retried here after `backoff_s`: a client that wants
    its change made would). A re-sent request may find the topic created by an attempt whose
    answer was lost in the failover: the "already exists" answer is then the acceptance."""
    from minibroker.client.errors import MiniBrokerError, TopicAlreadyExistsError

    errors: list[str] = []
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    while True:
        try:
            await admin.create_topic(topic, 1, replicas)
        except TopicAlreadyExistsError:
            return time.monotonic(), errors
        except MiniBrokerError as err:
            errors.append(f"{type(err).__name__}: {err}")
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(backoff_s)
            continue
        return float(admin.accepted_at[topic]), errors


async def _wait_new_leader(
    poller: QuorumPoller, survivors: Sequence[int], old_id: int, old_epoch: int
) -> tuple[float, int, int]:
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    while time.monotonic() < deadline:
        named = new_leader_named(await poller.ask_all(survivors), old_id, old_epoch)
        if named is not None:
            return time.monotonic(), named[0], named[1]
        await asyncio.sleep(POLL_INTERVAL_S)
    raise launcher.LauncherError(f"no new leader named within {ROUND_TIMEOUT_S:.0f}s")


async def _current_leader(poller: QuorumPoller, ids: Sequence[int]) -> quorum.QuorumAnswer:
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    while time.monotonic() < deadline:
        leader = leader_of(await poller.ask_all(ids))
        if leader is not None:
            return leader
        await asyncio.sleep(0.05)
    raise launcher.LauncherError(f"no controller leads after {ROUND_TIMEOUT_S:.0f}s")


async def _wait_follows(poller: QuorumPoller, node_id: int, ids: Sequence[int]) -> None:
    deadline = time.monotonic() + ROUND_TIMEOUT_S
    while time.monotonic() < deadline:
        answers = await poller.ask_all(ids)
        mine = answers[list(ids).index(node_id)]
        if follows(mine, leader_of(answers)):
            return
        await asyncio.sleep(0.05)
    raise launcher.LauncherError(
        f"{quorum.controller_name(quorum.controller_index(node_id))} does not follow the "
        f"leader {ROUND_TIMEOUT_S:.0f}s after its restart"
    )


def _stopped_at(spec: launcher.ProcessSpec, timeout_s: float) -> float | None:
    """The monotonic time `spec`'s process was seen gone (polled every 5 ms), None if not."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if launcher.process_state(spec) == "stopped":
            at = time.monotonic()
            launcher.wait_stopped(spec, 1.0)  # reaps it
            return at
        time.sleep(POLL_INTERVAL_S)
    return None


def read_lines(path: str) -> list[str]:
    """A process's log file as lines ([] when it cannot be read: not written yet)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readlines()
    except OSError:
        return []


async def _controller_round(
    args: argparse.Namespace,
    state: launcher.ClusterState,
    poller: QuorumPoller,
    admin: Any,
    n: int,
) -> dict[str, Any]:
    ids = [c.node_id for c in state.controllers]
    by_id = {c.node_id: c for c in state.controllers}
    await asyncio.to_thread(launcher.wait_ready, state, ROUND_TIMEOUT_S)
    old = await _current_leader(poller, ids)
    spec = by_id[old.node_id]
    survivors = [i for i in ids if i != old.node_id]
    sig = signal.SIGTERM if args.graceful else signal.SIGKILL
    topic = f"failover-c{n}-{os.getpid()}"
    replicas = min(3, len(state.brokers))
    t0_wall, t0 = time.time(), time.monotonic()
    if not launcher.signal_process(spec, sig):
        raise launcher.LauncherError(f"{spec.name} was not running when it was to be killed")
    elected = asyncio.create_task(
        _wait_new_leader(poller, survivors, old.node_id, old.leader_epoch)
    )
    created = asyncio.create_task(
        _create_accepted(admin, topic, replicas, args.retry_backoff_ms / 1000)
    )
    exited = asyncio.create_task(asyncio.to_thread(_stopped_at, spec, 30.0))
    elected_at, new_id, new_epoch = await elected
    accepted_at, errors = await created
    stopped_at = await exited
    exit_ms = None if stopped_at is None else (stopped_at - t0) * 1000
    if stopped_at is None:
        launcher.signal_process(spec, signal.SIGKILL)
        launcher.wait_stopped(spec, 5.0)
    # The new leader's log, up to now: its activation, our topic, a broker-driven change.
    logged = log_times(read_lines(by_id[new_id].log_file), t0_wall, topic, time.time())
    result = {
        "round": n,
        "killed": spec.name,
        "old_epoch": old.leader_epoch,
        "new_leader": by_id[new_id].name,
        "new_epoch": new_epoch,
        "elected_ms": round((elected_at - t0) * 1000, 3),
        "accepted_ms": round((accepted_at - t0) * 1000, 3),
        "activated_ms": _round(logged.activated_ms),
        "topic_committed_ms": _round(logged.topic_created_ms),
        "broker_change_ms": _round(logged.broker_change_ms),
        "broker_change": logged.broker_change or None,
        "old_leader_exited_ms": _round(exit_ms),
        "admin_errors": errors,
    }
    change = (
        f", first broker-driven change ({logged.broker_change}) {_ms(logged.broker_change_ms)}"
        if logged.broker_change
        else ""
    )
    _say(
        args,
        f"round {n}: {sig.name} {spec.name} (epoch {old.leader_epoch}) -> "
        f"{by_id[new_id].name} named leader (epoch {new_epoch}) after "
        f"{result['elected_ms']:.0f} ms, active after {_ms(logged.activated_ms)}, "
        f"first CreateTopics accepted after {result['accepted_ms']:.0f} ms{change}"
        + (f" (the Admin failed first with {'; '.join(errors)})" if errors else ""),
    )
    # Restart the killed voter; the round ends when it follows, caught up.
    launcher.start_process(spec, state)
    launcher.save_state(state)
    await _wait_follows(poller, spec.node_id, ids)
    return result


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


async def _controller_failover_async(
    args: argparse.Namespace, directory: str, state: launcher.ClusterState
) -> list[dict[str, Any]]:
    poller = QuorumPoller(state.controllers)
    admin = timed_admin(
        state.bootstrap_servers, retry_backoff_ms=args.retry_backoff_ms, request_timeout_ms=10_000
    )
    rounds = []
    try:
        # The admin learns the active controller first, as a client in use would have.
        await admin.create_topic(f"warm-up-{os.getpid()}", 1, min(3, len(state.brokers)))
        for n in range(1, args.rounds + 1):
            rounds.append(await _controller_round(args, state, poller, admin, n))
    finally:
        await admin.close()
        await poller.close()
    return rounds


def controller_failover(args: argparse.Namespace, controllers: int) -> dict[str, Any]:
    from minibroker.client.cli.common import run_async

    with tempfile.TemporaryDirectory(prefix="minibroker-cfailover-") as directory:
        state = _start_cluster(args, directory, controllers)
        try:
            rounds = run_async(_controller_failover_async(args, directory, state))
        finally:
            launcher.down(directory)
    summaries: dict[str, Any] = {}
    for key in (
        "elected_ms",
        "activated_ms",
        "accepted_ms",
        "topic_committed_ms",
        "broker_change_ms",
        "old_leader_exited_ms",
    ):
        summary = summarize(r[key] for r in rounds)
        summaries[key.removesuffix("_ms")] = summary.fields() if summary else None
    return {
        "bench": "failover",
        "target": "controller",
        "controllers": controllers,
        "brokers": args.brokers,
        "signal": "SIGTERM" if args.graceful else "SIGKILL",
        "settings": dict(args.settings),
        "rounds": rounds,
        "summary": summaries,
        "load_average": list(os.getloadavg()),
    }


def _controller_text(result: dict[str, Any]) -> list[str]:
    labels = {
        "elected": "new leader named (DescribeQuorum)",
        "activated": "new leader active (its log)",
        "accepted": "first CreateTopics accepted",
        "topic_committed": "topic committed (its log)",
        "broker_change": "first broker-driven change",
        "old_leader_exited": "old leader exited",
    }
    n = len(result["rounds"])
    lines = [
        f"controller failover ({result['signal']}, {result['controllers']} voters) over "
        f"{n} rounds, ms after the signal:"
    ]
    for key, label in labels.items():
        s = result["summary"][key]
        if s is None:
            lines.append(f"  {label:<36} not observed")
        else:
            lines.append(
                f"  {label:<36} median {s['median_ms']:.0f}, min {s['min_ms']:.0f}, "
                f"max {s['max_ms']:.0f} (n={s['n']})"
            )
    lines.append("  load average " + " ".join(f"{x:.2f}" for x in result["load_average"]))
    return lines


def main(args: argparse.Namespace) -> int:
    try:
        controllers = controllers_for(args)
        if args.target == "controller":
            result = controller_failover(args, controllers)
        else:
            result = broker_failover(args, controllers)
    except (ValueError, launcher.LauncherError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    elif args.target == "controller":
        print("\n".join(_controller_text(result)))
    else:
        s = result["first_ack"]
        graceful = ", SIGTERM" if args.graceful else ""
        print(
            f"failover ({controllers} controller(s){graceful}) over {s['n']} kills: "
            f"median {s['median_ms']:.0f} ms, min {s['min_ms']:.0f} ms, "
            f"max {s['max_ms']:.0f} ms"
        )
    return 0


# -- metadata commit latency ---------------------------------------------------------------------


@dataclass(slots=True)
class Phase:
    """One phase of a metadata run: `callers` concurrent callers creating `latencies_ms`."""

    callers: int
    elapsed_s: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)

    def fields(self) -> dict[str, Any]:
        summary = summarize(self.latencies_ms)
        rate = len(self.latencies_ms) / self.elapsed_s if self.elapsed_s > 0 else 0.0
        out: dict[str, Any] = {
            "callers": self.callers,
            "topics": len(self.latencies_ms),
            "topics_per_s": round(rate, 2),
        }
        if summary is not None:
            out["median_ms"] = round(summary.median, 3)
            out["p99_ms"] = round(summary.p99, 3)
            out["max_ms"] = round(summary.maximum, 3)
        return out


async def _create_phase(
    admin: Any, prefix: str, count: int, callers: int, replicas: int, partitions: int
) -> Phase:
    phase = Phase(callers)
    names = [f"{prefix}-{i}" for i in range(count)]

    async def caller(mine: list[str]) -> None:
        for name in mine:
            sent = time.monotonic()
            await admin.create_topic(name, partitions, replicas)
            phase.latencies_ms.append((admin.accepted_at[name] - sent) * 1000)

    started = time.monotonic()
    await asyncio.gather(*(caller(names[i::callers]) for i in range(callers)))
    phase.elapsed_s = time.monotonic() - started
    return phase


def _scrape(host: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


async def _metadata_run_async(
    args: argparse.Namespace, state: launcher.ClusterState
) -> dict[str, Any]:
    replicas = min(args.replication_factor, len(state.brokers))
    admin = timed_admin(state.bootstrap_servers, request_timeout_ms=30_000)
    try:
        await admin.create_topic("warm-up", 1, replicas)
        phases = [await _create_phase(admin, "seq", args.topics, 1, replicas, args.partitions)]
        if args.concurrency > 1:
            phases.append(
                await _create_phase(
                    admin, "conc", args.topics, args.concurrency, replicas, args.partitions
                )
            )
    finally:
        await admin.close()
    poller = QuorumPoller(state.controllers)
    try:
        leader = await _current_leader(poller, [c.node_id for c in state.controllers])
    finally:
        await poller.close()
    active = next(c for c in state.controllers if c.node_id == leader.node_id)
    try:
        commit_avg = metric_value(
            await asyncio.to_thread(_scrape, active.host, active.metrics_port),
            COMMIT_LATENCY_METRIC,
        )
    except OSError:
        commit_avg = None
    return {
        "controllers": len(state.controllers),
        "phases": [p.fields() for p in phases],
        "commit_latency_avg_ms": commit_avg,
    }


def metadata_run(args: argparse.Namespace, controllers: int) -> dict[str, Any]:
    from minibroker.client.cli.common import run_async

    with tempfile.TemporaryDirectory(prefix="minibroker-metadata-") as directory:
        state = _start_cluster(args, directory, controllers)
        try:
            return run_async(_metadata_run_async(args, state))
        finally:
            launcher.down(directory)


def metadata_summary(runs: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per quorum size and phase: the median over runs of each run's figures."""
    out = []
    for size in dict.fromkeys(r["controllers"] for r in runs):
        mine = [r for r in runs if r["controllers"] == size]
        for index, phase in enumerate(mine[0]["phases"]):
            rows = [r["phases"][index] for r in mine if index < len(r["phases"])]
            row: dict[str, Any] = {
                "controllers": size,
                "callers": phase["callers"],
                "runs": len(rows),
            }
            for key in ("topics_per_s", "median_ms", "p99_ms"):
                values = [p[key] for p in rows if key in p]
                row[key] = round(statistics.median(values), 3) if values else None
            out.append(row)
        commits = [
            r["commit_latency_avg_ms"] for r in mine if r["commit_latency_avg_ms"] is not None
        ]
        out.append(
            {
                "controllers": size,
                "commit_latency_avg_ms": round(statistics.median(commits), 3) if commits else None,
                "runs": len(commits),
            }
        )
    return out


def metadata_main(args: argparse.Namespace) -> int:
    try:
        if args.topics < 1 or args.runs < 1 or args.concurrency < 1:
            raise ValueError("--topics, --runs and --concurrency must be at least 1")
        runs = []
        for size in alternate(args.controllers, args.runs):
            run = metadata_run(args, size)
            runs.append(run)
            for p in run["phases"]:
                _say(
                    args,
                    f"{size} controller(s), {p['callers']} caller(s): {p['topics']} topics, "
                    f"{p['topics_per_s']:.1f} topics/s, median {p.get('median_ms', 0):.1f} ms, "
                    f"p99 {p.get('p99_ms', 0):.1f} ms",
                )
            commit = run["commit_latency_avg_ms"]
            if commit is not None:
                _say(args, f"{size} controller(s): {COMMIT_LATENCY_METRIC} {commit:.2f} ms")
    except (ValueError, launcher.LauncherError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    summary = metadata_summary(runs)
    if args.json:
        print(
            json.dumps(
                {
                    "bench": "metadata",
                    "runs": runs,
                    "summary": summary,
                    "load_average": list(os.getloadavg()),
                }
            )
        )
        return 0
    print(f"metadata commit, medians over {args.runs} run(s) per quorum size:")
    for row in summary:
        if "callers" in row:
            print(
                f"  {row['controllers']} controller(s), {row['callers']} caller(s): "
                f"{row['topics_per_s']} topics/s, median {row['median_ms']} ms, "
                f"p99 {row['p99_ms']} ms"
            )
        else:
            print(
                f"  {row['controllers']} controller(s): {COMMIT_LATENCY_METRIC} "
                f"{row['commit_latency_avg_ms']} ms"
            )
    print("  load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    return 0
