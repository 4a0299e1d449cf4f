"""`minibroker bench scale`: what many partitions cost (issue 17's benchmark), one fresh local
cluster per size, started and stopped with the launcher (free ports on 127.0.0.1, a temp dir;
every process it starts is stopped by its PID, on errors and Ctrl-C too).

Per size of `--partitions` (e.g. 300,3000,10000), on `--brokers` brokers and one controller (its
max.partitions and max.broker.partitions raised so that the topics fit, automatic leader
rebalancing off), one topic `scale` of that many partitions and `--rf` replicas
(min.insync.replicas = min(2, RF)), then
in order, each phase with a deadline of `--phase-timeout` seconds (a phase past it is reported as
">120 s" and the bench moves on):
  (1) create: from the CreateTopics call until a client's Metadata shows every partition with a
      leader and a full ISR;
  (1b) logs on disk: from the same call until every replica's log dir (with its
      `partition.metadata`) exists on its broker: Metadata shows a full ISR at once (a new
      partition starts with every replica in it, as in Kafka) while brokers may still be making
      the logs, which would otherwise run into the idle window;
  (2) idle: SETTLE_S seconds after that and once replication has settled (no broker read a
      partition for a fetch between two scrapes SETTLED_POLL_S apart:
      `minibroker_fetch_partitions_evaluated_total` flat; the first full fetches of thousands of
      partitions take a while after the logs exist), `--idle-seconds` with no client
      traffic: CPU % of one core (utime + stime from /proc/<pid>/stat over the window) and RSS
      (the largest VmRSS of /proc/<pid>/status, sampled every second) of each broker and of the
      controller; brokers reported as median and max. Then every broker's /metrics is grepped
      for `FetchSession` (fetch-session metrics, KIP-227; "-" when no broker exposes any);
  (3) kill: SIGKILL of the broker leading the most partitions (fewest id on a tie), timed from
      the signal until a client's Metadata shows none of its leaderships left (every partition
      with a live leader); the time of the first one seen moved too;
  (4) rejoin: the killed broker restarted (same id, ports and data), timed from the start of its
      process until Metadata shows it in the ISR of every partition it replicates;
  (5) preferred election: Admin.elect_leaders("preferred") for every partition (automatic leader
      rebalancing is off in the bench's cluster), timed from the call until Metadata shows every
      partition led by its first replica (of those whose first replica is in the ISR);
  (6) produce: `--records` acks=all records of `--record-size` bytes (one idempotent
      AsyncProducer, linger 5 ms) sent round-robin over every partition of `scale`
      (`partition=i % N`), then the same keyless with no partition (the producer's sticky
      partitioner, Kafka's KIP-480 default: one partition until its batch is full, then another,
      so the records spread over all N), then round-robin over a 3-partition topic of the same
      RF: records/s from the first send to the flush, and the ratios all / 3 and sticky / 3 (a
      run past its deadline: the rate of the records acknowledged by then, shown next to
      ">120 s" and used for the ratio). Before each, untimed, one record to a partition of each
      leader (the producer id and the connections). The bench's own CPU (the producer) and the
      brokers' over each run are reported (JSON: `client_cpu_s`, `brokers_cpu_s`, and per batch
      the producer opened, `batches`, `client_cpu_us_per_batch`, `brokers_cpu_us_per_batch`)
      to tell who was busy.
Metadata is polled every POLL_INTERVAL_S seconds (plus the call itself: the median call time is
reported, the resolution of the timings). A phase's deadline runs from its event. A creation that
does not complete skips the other phases (reported with how far it got).

Benchmarks measure and never assert. The pure parts (argument parsing, /proc parsing, the
conditions on a Metadata snapshot, medians, the table) are plain functions.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from minibroker.deploy import cluster as launcher

TOPIC = "scale"
SMALL_TOPIC = "scale-3"
SMALL_PARTITIONS = 3
DEFAULT_SIZES = (300, 3000, 10000)
POLL_INTERVAL_S = 0.02
LOGS_POLL_S = 0.2
SETTLE_S = 2.0
SETTLED_POLL_S = 1.0
RSS_SAMPLE_S = 1.0
MIB = 1024 * 1024
# No automatic leader rebalance: it would undo the kill's moves behind the election phase's back.
BENCH_SETTINGS = {"leader.imbalance.check.interval.seconds": "3600"}
FETCH_SESSION = "fetchsession"
DEFAULT_MAX_PARTITIONS = 10_000  # the controller's max.partitions
DEFAULT_MAX_BROKER_PARTITIONS = 1000  # and max.broker.partitions


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "scale",
        help="many partitions: creation time, idle CPU/RSS, leader moves after a SIGKILL, "
        "rejoin, preferred election, produce over all partitions (round-robin and keyless "
        "sticky) vs 3",
        description="Per size of --partitions, on a fresh local cluster: time the creation of "
        "a topic of that many partitions (until every one has a leader and a full ISR), "
        "measure each broker's and the controller's idle CPU and RSS, SIGKILL the broker "
        "leading the most partitions and time until every leadership moved (as a client's "
        "Metadata shows), restart it and time until it is back in every ISR, time a "
        "preferred election of everything, and compare acks=all produce throughput spread "
        "over every partition (round-robin, and keyless records placed by the default sticky "
        "partitioner) with round-robin over 3 partitions. Each phase has a deadline "
        "(--phase-timeout); one past it is reported as such. Prints a table row per size.",
    )
    parser.add_argument("--brokers", type=int, default=5, help="brokers (default 5)")
    parser.add_argument(
        "--partitions",
        type=parse_sizes_arg,
        default=list(DEFAULT_SIZES),
        help="comma-separated partition counts, one fresh cluster each (default 300,3000,10000)",
    )
    parser.add_argument("--rf", type=int, default=3, help="replication factor (default 3)")
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=10.0,
        help="idle window for CPU and RSS, no client traffic (default 10)",
    )
    parser.add_argument(
        "--records",
        type=int,
        default=100_000,
        help="records per produce measurement, the same for both topics (default 100000)",
    )
    parser.add_argument(
        "--record-size", type=int, default=1024, help="value bytes per record (default 1024)"
    )
    parser.add_argument(
        "--phase-timeout",
        type=float,
        default=120.0,
        help="deadline of each phase in seconds; a phase past it is reported as '>N s' "
        "(default 120)",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        type=parse_setting,
        default=[],
        metavar="KEY=VALUE",
        help="a controller or broker setting for the bench's clusters (repeatable)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the result as one JSON object (progress lines go to stderr)",
    )
    parser.set_defaults(func=main)


# -- pure parts ----------------------------------------------------------------------------------


def parse_sizes(text: str) -> list[int]:
    """`300,3000,10000` -> [300, 3000, 10000]; ValueError for anything not a positive int."""
    sizes = []
    for part in text.split(","):
        part = part.strip().replace("_", "")
        if not part.isdigit() or int(part) <= 0:
            raise ValueError(f"expected positive partition counts such as 300,3000, got {text!r}")
        sizes.append(int(part))
    return sizes


def parse_sizes_arg(text: str) -> list[int]:
    try:
        return parse_sizes(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def limits_for(partitions: int, rf: int) -> dict[str, str]:
    """The partition limits raised (never lowered below their defaults) so that the measured
    topic and the 3-partition one fit: the bench measures cost, not the limits."""
    total = partitions + SMALL_PARTITIONS
    return {
        "max.partitions": str(max(DEFAULT_MAX_PARTITIONS, total)),
        "max.broker.partitions": str(max(DEFAULT_MAX_BROKER_PARTITIONS, total * rf)),
    }


def parse_setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--set expects KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds_of_stat(stat: bytes) -> float:
    """utime + stime (all threads) of a /proc/<pid>/stat line, in seconds."""
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def rss_mib_of_status(status: str) -> float | None:
    """VmRSS of a /proc/<pid>/status text, in MiB (None: no such line, e.g. a zombie)."""
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def pid_cpu_s(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return cpu_seconds_of_stat(f.read())
    except (OSError, ValueError, IndexError):
        return None


def pid_rss_mib(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            return rss_mib_of_status(f.read())
    except OSError:
        return None


def leader_counts(partitions: Iterable[Any]) -> dict[int, int]:
    """Leaderships per broker id (offline partitions, leader -1, left out)."""
    counts = collections.Counter(p.leader for p in partitions if p.leader >= 0)
    return dict(counts)


def busiest_leader(partitions: Iterable[Any]) -> int:
    """The broker leading the most partitions (the lowest id on a tie)."""
    counts = leader_counts(partitions)
    if not counts:
        raise ValueError("no partition has a leader")
    return min(counts, key=lambda b: (-counts[b], b))


def fully_replicated(partitions: Sequence[Any], expected: int) -> bool:
    """`expected` partitions, each with a leader and every replica in its ISR."""
    return len(partitions) == expected and all(
        p.leader >= 0 and set(p.isr) == set(p.replicas) for p in partitions
    )


def creation_progress(partitions: Sequence[Any]) -> dict[str, int]:
    return {
        "seen": len(partitions),
        "with_leader": sum(1 for p in partitions if p.leader >= 0),
        "full_isr": sum(1 for p in partitions if p.leader >= 0 and set(p.isr) == set(p.replicas)),
    }


def still_led_by(partitions: Iterable[Any], broker: int) -> int:
    """Partitions led by `broker` or by nobody: leaderships not yet moved off a dead broker."""
    return sum(1 for p in partitions if p.leader == broker or p.leader < 0)


def missing_from_isr(partitions: Iterable[Any], broker: int) -> int:
    """Partitions that `broker` replicates without being in their ISR."""
    return sum(1 for p in partitions if broker in p.replicas and broker not in p.isr)


def not_preferred(partitions: Iterable[Any]) -> int:
    """Partitions not led by their first replica although it is in the ISR."""
    return sum(
        1 for p in partitions if p.replicas and p.replicas[0] in p.isr and p.leader != p.replicas[0]
    )


def median_max(values: Iterable[float | None]) -> tuple[float | None, float | None]:
    seen = [v for v in values if v is not None]
    if not seen:
        return None, None
    return statistics.median(seen), max(seen)


_METRIC_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def fetch_session_metrics(texts: Iterable[str]) -> dict[str, float]:
    """Every metric whose name holds `FetchSession` (any case) in Prometheus texts, summed over
    the texts (brokers) by name; {} when none exposes one."""
    out: dict[str, float] = {}
    for text in texts:
        for line in text.splitlines():
            if line.startswith("#") or FETCH_SESSION not in line.lower():
                continue
            match = _METRIC_LINE.match(line)
            if match is None or FETCH_SESSION not in match.group(1).lower():
                continue
            try:
                value = float(match.group(3))
            except ValueError:
                continue
            out[match.group(1)] = out.get(match.group(1), 0.0) + value
    return out


def produce_ratio(run: Mapping[str, Any], base: Mapping[str, Any]) -> float | None:
    """records/s of `run` over those of `base` (a run past its deadline counts the records
    acknowledged by then); None when either has no rate."""

    def of(p: Mapping[str, Any]) -> Any:
        return p.get("records_per_sec") or p.get("records_per_sec_by_deadline")

    a, b = of(run), of(base)
    return _r(a / b, 3) if a and b else None


def rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


# -- the table -----------------------------------------------------------------------------------


def phase_cell(phase: Mapping[str, Any] | None, key: str = "s") -> str:
    """`0.85 s`, `>120 s` for a phase past its deadline, `-` for one not run."""
    if phase is None or phase.get("skipped"):
        return "-"
    if phase.get("timed_out"):
        return f">{phase['timeout_s']:g} s"
    if phase.get("failed"):
        return "failed"
    value = phase.get(key)
    return "-" if value is None else f"{value:.2f} s"


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


TABLE_HEADER = (
    "| partitions | create | logs on disk | broker CPU % med/max | broker RSS MiB med/max "
    "| controller CPU % | controller RSS MiB | kill: leaderships moved | rejoin: every ISR "
    "| preferred election | produce all round-robin, rec/s | produce all keyless sticky, rec/s "
    "| produce 3, rec/s | all / 3 | sticky / 3 | FetchSession metrics |"
)


def table_row(size: Mapping[str, Any]) -> str:
    idle = size.get("idle") or {}
    kill = size.get("kill")
    produce = size.get("produce") or {}
    create = size["create"]
    create_cell = phase_cell(create)
    if create.get("timed_out"):
        progress = create.get("progress") or {}
        create_cell += (
            f" ({progress.get('with_leader', 0)} led, {progress.get('full_isr', 0)} full ISR)"
        )
    kill_cell = phase_cell(kill)
    if kill and not kill.get("skipped"):
        kill_cell += f" ({kill['leaderships']} of broker {kill['broker']})"
    logs = size.get("logs")
    logs_cell = phase_cell(logs)
    if logs and logs.get("timed_out"):
        logs_cell += f" ({logs['missing']} of {logs['replicas']} missing)"
    rejoin = size.get("rejoin")
    rejoin_cell = phase_cell(rejoin)
    if rejoin and not rejoin.get("skipped") and rejoin.get("not_in_isr") is not None:
        back = rejoin["replicas"] - rejoin["not_in_isr"]
        rejoin_cell += f" ({back} of {rejoin['replicas']} ISRs)"
    election = size.get("election")
    election_cell = phase_cell(election)
    if election and not election.get("skipped"):
        election_cell += f" ({election.get('to_move')} to move)"
    fetch = idle.get("fetch_session_metrics")
    fetch_cell = "-" if not fetch else ", ".join(f"{k}={v:g}" for k, v in sorted(fetch.items()))

    def produce_cell(which: str) -> str:
        p = produce.get(which)
        if p is None or p.get("skipped"):
            return "-"
        if p.get("timed_out"):
            got = p.get("records_per_sec_by_deadline")
            return f">{p['timeout_s']:g} s" + ("" if got is None else f" ({got:.0f}/s acked)")
        return f"{p['records_per_sec']:.0f}"

    cells = [
        f"{size['partitions']}",
        create_cell,
        logs_cell,
        f"{_num(idle.get('broker_cpu_pct_median'), '.1f')} / "
        f"{_num(idle.get('broker_cpu_pct_max'), '.1f')}",
        f"{_num(idle.get('broker_rss_mib_median'), '.0f')} / "
        f"{_num(idle.get('broker_rss_mib_max'), '.0f')}",
        _num(idle.get("controller_cpu_pct"), ".1f"),
        _num(idle.get("controller_rss_mib"), ".0f"),
        kill_cell,
        rejoin_cell,
        election_cell,
        produce_cell("all"),
        produce_cell("sticky"),
        produce_cell("three"),
        _num(produce.get("ratio"), ".2f"),
        _num(produce.get("sticky_ratio"), ".2f"),
        fetch_cell,
    ]
    return "| " + " | ".join(cells) + " |"


def format_table(result: Mapping[str, Any]) -> list[str]:
    lines = [
        f"scale: {result['brokers']} brokers + 1 controller, RF {result['rf']}, idle window "
        f"{result['idle_seconds']:g} s, produce {result['records']} acks=all records of "
        f"{result['record_size']} B, phase deadline {result['phase_timeout_s']:g} s",
        "",
        TABLE_HEADER,
        "|" + "---|" * TABLE_HEADER.count(" | ") + "---|",
    ]
    lines += [table_row(size) for size in result["sizes"]]
    lines.append("")
    for size in result["sizes"]:
        lines.append(
            f"  {size['partitions']} partitions: load average "
            + " -> ".join(
                " ".join(f"{x:.2f}" for x in size[k])
                for k in ("load_before", "load_after")
                if size.get(k)
            )
            + (
                f"; Metadata poll median {size['metadata_poll_ms']:.1f} ms"
                if size.get("metadata_poll_ms") is not None
                else ""
            )
            + (f"; error: {size['error']}" if size.get("error") else "")
        )
    lines.append(
        "  (CPU %: of one core over the idle window; RSS: largest VmRSS in it; times from the "
        "event to a client's Metadata showing the result; '-': not measured or not exposed)"
    )
    return lines


# -- cluster side --------------------------------------------------------------------------------


def _partitions_evaluated(text: str) -> float:
    """The sum of a broker's `minibroker_fetch_partitions_evaluated_total` (0 when absent)."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("minibroker_fetch_partitions_evaluated_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _scrape(spec: launcher.ProcessSpec) -> str:
    try:
        url = f"http://{spec.host}:{spec.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""


@dataclass
class Poller:
    """Metadata of one topic, polled every POLL_INTERVAL_S; the call times are kept."""

    admin: Any
    call_ms: list[float] = field(default_factory=list)

    async def partitions(self, topic: str) -> list[Any] | None:
        from minibroker.client.errors import MiniBrokerError

        started = time.monotonic()
        try:
            snapshot = await self.admin.cluster.fetch_metadata([topic])
        except MiniBrokerError:
            return None
        self.call_ms.append((time.monotonic() - started) * 1000)
        info = snapshot.topics.get(topic)
        if info is None or info.error_code != 0:
            return None
        return [info.partitions[p] for p in sorted(info.partitions)]

    async def until(
        self,
        topic: str,
        done: Callable[[list[Any]], bool],
        t0: float,
        timeout_s: float,
        seen: Callable[[list[Any], float], None] | None = None,
    ) -> tuple[float | None, list[Any] | None]:
        """Seconds from `t0` to the first Metadata answer for which `done(partitions)` holds
        (None past the deadline), and the last partitions seen; `seen(partitions, elapsed)`
        for every answer."""
        last: list[Any] | None = None
        while True:
            parts = await self.partitions(topic)
            elapsed = time.monotonic() - t0
            if parts is not None:
                last = parts
                if seen is not None:
                    seen(parts, elapsed)
                if done(parts):
                    return elapsed, last
            if elapsed >= timeout_s:
                return None, last
            await asyncio.sleep(POLL_INTERVAL_S)


def _say(args: argparse.Namespace, line: str) -> None:
    print(line, file=sys.stderr if args.json else sys.stdout, flush=True)


def _timed(s: float | None, timeout_s: float, **extra: Any) -> dict[str, Any]:
    return {"s": _r(s, 4), "timed_out": s is None, "timeout_s": timeout_s, **extra}


class SizeRun:
    """One size: a running cluster, the measurements in order."""

    def __init__(self, args: argparse.Namespace, state: launcher.ClusterState, n: int) -> None:
        from minibroker.client.admin import AsyncAdmin

        self.args = args
        self.state = state
        self.n = n
        self.timeout_s = float(args.phase_timeout)
        self.admin = AsyncAdmin(
            state.bootstrap_servers, request_timeout_ms=int(self.timeout_s * 1000)
        )
        self.poller = Poller(self.admin)
        self.created: tuple[float, list[Any]] = (0.0, [])

    def say(self, line: str) -> None:
        _say(self.args, f"[{self.n} partitions] {line}")

    async def create(self, topic: str, partitions: int) -> dict[str, Any]:
        rf = self.args.rf
        configs = {"min.insync.replicas": str(min(2, rf))}
        from minibroker.client.errors import MiniBrokerError

        t0 = time.monotonic()
        error = None
        try:
            # Returns once the brokers' Metadata shows leaders (or after 10 s); the ISRs are
            # polled below, the deadline counted from the call.
            await asyncio.wait_for(
                self.admin.create_topic(topic, partitions, rf, configs), self.timeout_s
            )
        except TimeoutError:
            error = f"CreateTopics did not return within {self.timeout_s:g} s"
        except MiniBrokerError as err:
            return {
                **_timed(None, self.timeout_s),
                "timed_out": False,
                "failed": True,
                "error": f"{type(err).__name__}: {err}",
            }
        s, last = await self.poller.until(
            topic, lambda ps: fully_replicated(ps, partitions), t0, self.timeout_s
        )
        self.created = (t0, last or [])
        out = _timed(s, self.timeout_s, progress=creation_progress(last or []))
        if error and s is None:
            out["error"] = error
        return out

    async def logs(self, t0: float, partitions: list[Any]) -> dict[str, Any]:
        """Until every replica's log exists on its broker's disk (its dir with
        `partition.metadata`): Metadata shows a new partition's ISR full at once (the controller
        starts it with every replica, as Kafka does) while the brokers may still be making its
        logs, so the idle window starts only after this; timed from the CreateTopics call."""
        dirs = {s.node_id: s.data_dir for s in self.state.brokers}
        wanted = [
            os.path.join(dirs[r], f"{TOPIC}-{p.partition}", "partition.metadata")
            for p in partitions
            for r in p.replicas
            if r in dirs
        ]

        def missing() -> int:
            return sum(1 for path in wanted if not os.path.exists(path))

        left = len(wanted)
        while True:
            left = await asyncio.to_thread(missing)
            elapsed = time.monotonic() - t0
            if left == 0:
                return _timed(elapsed, self.timeout_s, replicas=len(wanted), missing=0)
            if elapsed >= self.timeout_s:
                return _timed(None, self.timeout_s, replicas=len(wanted), missing=left)
            await asyncio.sleep(LOGS_POLL_S)

    async def _settled(self, brokers: list[launcher.ProcessSpec]) -> float:
        """Seconds until no broker reads partitions for fetches any more (the partition reads
        counter is the same in two scrapes in a row), or the phase deadline."""
        t0 = time.monotonic()
        last: tuple[float, ...] | None = None
        while time.monotonic() - t0 < self.timeout_s:
            texts = await asyncio.gather(*(asyncio.to_thread(_scrape, s) for s in brokers))
            now = tuple(_partitions_evaluated(text) for text in texts)
            if now == last:
                break
            last = now
            await asyncio.sleep(SETTLED_POLL_S)
        return time.monotonic() - t0

    async def idle(self) -> dict[str, Any]:
        brokers = list(self.state.brokers)
        controllers = list(self.state.controllers)
        procs = brokers + controllers
        await asyncio.sleep(SETTLE_S)
        settled_s = await self._settled(brokers)
        cpu0 = {s.pid: pid_cpu_s(s.pid) for s in procs}
        rss: dict[int, list[float]] = {s.pid: [] for s in procs}
        t0 = time.monotonic()
        while True:
            for s in procs:
                value = pid_rss_mib(s.pid)
                if value is not None:
                    rss[s.pid].append(value)
            left = self.args.idle_seconds - (time.monotonic() - t0)
            if left <= 0:
                break
            await asyncio.sleep(min(RSS_SAMPLE_S, left))
        wall = time.monotonic() - t0
        cpu1 = {s.pid: pid_cpu_s(s.pid) for s in procs}

        def cpu_pct(spec: launcher.ProcessSpec) -> float | None:
            a, b = cpu0.get(spec.pid), cpu1.get(spec.pid)
            return None if a is None or b is None else 100.0 * (b - a) / wall

        def peak(spec: launcher.ProcessSpec) -> float | None:
            return max(rss[spec.pid]) if rss[spec.pid] else None

        per_broker = {
            str(s.node_id): {"cpu_pct": _r(cpu_pct(s), 2), "rss_mib": _r(peak(s), 1)}
            for s in brokers
        }
        cpu_med, cpu_max = median_max(cpu_pct(s) for s in brokers)
        rss_med, rss_max = median_max(peak(s) for s in brokers)
        texts = await asyncio.gather(*(asyncio.to_thread(_scrape, s) for s in brokers))
        return {
            "window_s": round(wall, 3),
            "settled_s": round(settled_s, 3),
            "brokers": per_broker,
            "broker_cpu_pct_median": _r(cpu_med, 2),
            "broker_cpu_pct_max": _r(cpu_max, 2),
            "broker_rss_mib_median": _r(rss_med, 1),
            "broker_rss_mib_max": _r(rss_max, 1),
            "controller_cpu_pct": _r(median_max(cpu_pct(c) for c in controllers)[1], 2),
            "controller_rss_mib": _r(median_max(peak(c) for c in controllers)[1], 1),
            "fetch_session_metrics": fetch_session_metrics(texts),
            "metrics_scraped": sum(1 for t in texts if t),
        }

    async def kill(self) -> tuple[dict[str, Any], launcher.ProcessSpec | None]:
        parts = await self.poller.partitions(TOPIC)
        if not parts:
            return {"skipped": True, "error": "no Metadata for the topic"}, None
        victim = busiest_leader(parts)
        led = leader_counts(parts)[victim]
        spec = next(s for s in self.state.brokers if s.node_id == victim)
        first: list[float] = []

        def seen(ps: list[Any], elapsed: float) -> None:
            if not first and still_led_by(ps, victim) < led:
                first.append(elapsed)

        t0 = time.monotonic()
        if not launcher.signal_process(spec, signal.SIGKILL):
            raise launcher.LauncherError(f"{spec.label} was not running to be killed")
        s, last = await self.poller.until(
            TOPIC, lambda ps: still_led_by(ps, victim) == 0, t0, self.timeout_s, seen
        )
        await asyncio.to_thread(launcher.wait_stopped, spec, 5.0)
        out = _timed(
            s,
            self.timeout_s,
            broker=victim,
            leaderships=led,
            first_moved_s=_r(first[0] if first else None, 4),
            not_moved=None if last is None else still_led_by(last, victim),
        )
        return out, spec

    async def rejoin(self, spec: launcher.ProcessSpec) -> dict[str, Any]:
        broker = spec.node_id
        first: list[float] = []
        parts = await self.poller.partitions(TOPIC) or []
        replicated = sum(1 for p in parts if broker in p.replicas)

        def seen(ps: list[Any], elapsed: float) -> None:
            if not first and missing_from_isr(ps, broker) < replicated:
                first.append(elapsed)
            if launcher.process_state(spec) == "stopped":
                tail = launcher.read_log_tail(spec.log_file, 15)
                raise launcher.LauncherError(f"{spec.label} exited after its restart:\n{tail}")

        t0 = time.monotonic()
        launcher.start_process(spec, self.state)
        launcher.save_state(self.state)  # `down` stops the new PID
        s, last = await self.poller.until(
            TOPIC, lambda ps: missing_from_isr(ps, broker) == 0, t0, self.timeout_s, seen
        )
        return _timed(
            s,
            self.timeout_s,
            broker=broker,
            replicas=replicated,
            first_joined_s=_r(first[0] if first else None, 4),
            not_in_isr=None if last is None else missing_from_isr(last, broker),
        )

    async def election(self) -> dict[str, Any]:
        from minibroker.client.errors import MiniBrokerError

        before = await self.poller.partitions(TOPIC) or []
        t0 = time.monotonic()
        call_s = None
        elected = None
        error = None
        try:
            results = await asyncio.wait_for(
                self.admin.elect_leaders("preferred", None), self.timeout_s
            )
            call_s = time.monotonic() - t0
            elected = sum(1 for e in results.values() if e is None)
        except (TimeoutError, MiniBrokerError) as err:
            error = f"{type(err).__name__}: {err}"
        remaining = max(0.0, self.timeout_s - (time.monotonic() - t0))
        s, last = await self.poller.until(TOPIC, lambda ps: not_preferred(ps) == 0, t0, remaining)
        out = _timed(
            s,
            self.timeout_s,
            to_move=not_preferred(before),
            elected=elected,
            call_s=_r(call_s, 4),
            not_preferred=None if last is None else not_preferred(last),
        )
        if error:
            out["error"] = error
        return out

    async def produce(self, topic: str, partitions: int, *, sticky: bool = False) -> dict[str, Any]:
        """`--records` records over `topic`: round-robin (`partition=i % partitions`), or with
        `sticky` keyless with no partition (the producer's default sticky partitioner)."""
        from minibroker.client.producer import AsyncProducer

        args = self.args
        payload = os.urandom(args.record_size)
        failures = 0
        acked = 0

        def done(future: Any) -> None:
            nonlocal failures, acked
            if future.cancelled() or future.exception() is not None:
                failures += 1
            else:
                acked += 1

        timeout_ms = int(self.timeout_s * 1000)
        producer = AsyncProducer(self.state.bootstrap_servers, acks="all", max_block_ms=timeout_ms)
        try:
            await producer.partitions_for(topic)
            # Not timed: the producer id, and a connection to every leader of the topic.
            parts = await self.poller.partitions(topic) or []
            one_per_leader = {p.leader: p.partition for p in parts if p.leader >= 0}
            for partition in one_per_leader.values():
                (await producer.send(topic, payload, partition=partition)).add_done_callback(done)
            await producer.flush()
            failures = acked = 0

            async def run() -> float:
                started = time.monotonic()
                if sticky:
                    for _ in range(args.records):
                        (await producer.send(topic, payload)).add_done_callback(done)
                else:
                    for i in range(args.records):
                        future = await producer.send(topic, payload, partition=i % partitions)
                        future.add_done_callback(done)
                await producer.flush()
                return time.monotonic() - started

            started = time.monotonic()
            batches0 = producer.accumulator.batches_created
            cpu0 = time.process_time()
            brokers0 = {b.pid: pid_cpu_s(b.pid) for b in self.state.brokers}
            try:
                elapsed = await asyncio.wait_for(run(), self.timeout_s)
            except TimeoutError:
                # How far it got: the acknowledged records' rate over the deadline.
                at = time.monotonic() - started
                return _timed(
                    None,
                    self.timeout_s,
                    partitions=partitions,
                    placement="sticky" if sticky else "round-robin",
                    records=args.records,
                    acked_by_deadline=acked,
                    records_per_sec_by_deadline=round(rate(acked, at), 1),
                )
            # Who was busy: this process (the producer) and the brokers, CPU seconds over the
            # run, and per batch sent (each batch of one partition is appended, replicated and
            # acknowledged on its own: round-robin over thousands of partitions makes a batch
            # per record).
            client_cpu = time.process_time() - cpu0
            batches = producer.accumulator.batches_created - batches0
        finally:
            await producer.close(timeout_ms=0)
        ok = args.records - failures
        broker_cpu = 0.0
        for pid, before in brokers0.items():
            after = pid_cpu_s(pid)
            if before is not None and after is not None:
                broker_cpu += after - before
        out = _timed(
            elapsed,
            self.timeout_s,
            partitions=partitions,
            placement="sticky" if sticky else "round-robin",
        )
        out.update(
            {
                "client_cpu_s": round(client_cpu, 3),
                "brokers_cpu_s": round(broker_cpu, 3),
                "batches": batches,
                "client_cpu_us_per_batch": _r(client_cpu / batches * 1e6, 1) if batches else None,
                "brokers_cpu_us_per_batch": _r(broker_cpu / batches * 1e6, 1) if batches else None,
                "records": args.records,
                "failed": failures,
                "records_per_sec": round(rate(ok, elapsed), 1),
                "mb_per_sec": round(
                    rate((args.records - failures) * len(payload), elapsed) / MIB, 3
                ),
            }
        )
        return out

    async def run(self) -> dict[str, Any]:
        from minibroker.client.errors import MiniBrokerError

        out: dict[str, Any] = {"partitions": self.n}
        try:
            await self._run(out)
        except (launcher.LauncherError, MiniBrokerError) as err:
            # Reported with what was measured before it; the next size still runs.
            out["error"] = f"{type(err).__name__}: {err}"
            self.say(f"error: {out['error']}")
        finally:
            await self.admin.close()
        return out

    async def _run(self, out: dict[str, Any]) -> None:
        create = out["create"] = await self.create(TOPIC, self.n)
        self.say(
            f"create: {phase_cell(create)} {create.get('progress', '')} {create.get('error', '')}"
        )
        if create["timed_out"] or create.get("failed"):
            out["error"] = create.get("error") or (
                f"topic creation not complete after {self.timeout_s:g} s"
            )
            return
        logs = out["logs"] = await self.logs(*self.created)
        self.say(f"logs on disk: {phase_cell(logs)} {logs}")
        idle = out["idle"] = await self.idle()
        self.say(
            f"idle: brokers CPU {idle['broker_cpu_pct_median']}% median, "
            f"{idle['broker_cpu_pct_max']}% max; RSS {idle['broker_rss_mib_median']} MiB median; "
            f"controller CPU {idle['controller_cpu_pct']}%, RSS {idle['controller_rss_mib']} MiB "
            f"(replication settled {idle['settled_s']} s after the logs)"
        )
        kill, spec = await self.kill()
        out["kill"] = kill
        self.say(f"kill: {phase_cell(kill)} {kill}")
        if spec is not None:
            rejoin = out["rejoin"] = await self.rejoin(spec)
            self.say(f"rejoin: {phase_cell(rejoin)} {rejoin}")
        election = out["election"] = await self.election()
        self.say(f"preferred election: {phase_cell(election)} {election}")
        small = await self.create(SMALL_TOPIC, SMALL_PARTITIONS)
        produce: dict[str, Any] = {"small_topic_create": small}
        out["produce"] = produce
        produce["all"] = await self.produce(TOPIC, self.n)
        self.say(f"produce round-robin over {self.n}: {produce['all']}")
        produce["sticky"] = await self.produce(TOPIC, self.n, sticky=True)
        self.say(f"produce keyless (sticky) over {self.n}: {produce['sticky']}")
        if small["timed_out"]:
            produce["three"] = {"skipped": True}
        else:
            produce["three"] = await self.produce(SMALL_TOPIC, SMALL_PARTITIONS)
            self.say(f"produce round-robin over {SMALL_PARTITIONS}: {produce['three']}")
        produce["ratio"] = produce_ratio(produce["all"], produce["three"])
        produce["sticky_ratio"] = produce_ratio(produce["sticky"], produce["three"])


def run_size(args: argparse.Namespace, n: int) -> dict[str, Any]:
    load_before = list(os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="minibroker-scale-") as directory:
        try:
            state = launcher.up(
                directory,
                brokers=args.brokers,
                base_port=0,
                settings={**BENCH_SETTINGS, **limits_for(n, args.rf), **dict(args.settings)},
            )
            size = SizeRun(args, state, n)
            # A loop of our own rather than asyncio.run: its SIGINT handler only cancels the main
            # task, which a client call may absorb; here Ctrl-C raises KeyboardInterrupt at once
            # and the `finally` below stops the cluster.
            loop = asyncio.new_event_loop()
            try:
                result = loop.run_until_complete(size.run())
            finally:
                loop.close()
            calls = size.poller.call_ms
            result["metadata_poll_ms"] = _r(statistics.median(calls), 2) if calls else None
            result["metadata_polls"] = len(calls)
        finally:
            if launcher.load_state(directory) is not None:
                launcher.down(directory)
    result["load_before"] = load_before
    result["load_after"] = list(os.getloadavg())
    return result


def scale_bench(args: argparse.Namespace) -> dict[str, Any]:
    if args.brokers < args.rf:
        raise ValueError(f"--rf {args.rf} needs at least as many brokers (--brokers)")
    if args.rf < 2:
        raise ValueError("--rf must be at least 2: a killed broker's leaderships must move")
    sizes = []
    for n in args.partitions:
        _say(args, f"[{n} partitions] starting {args.brokers} brokers and a controller ...")
        sizes.append(run_size(args, n))
    return {
        "bench": "scale",
        "brokers": args.brokers,
        "controllers": 1,
        "rf": args.rf,
        "idle_seconds": args.idle_seconds,
        "records": args.records,
        "record_size": args.record_size,
        "phase_timeout_s": args.phase_timeout,
        "settings": dict(args.settings),
        "sizes": sizes,
    }


def main(args: argparse.Namespace) -> int:
    from minibroker.client.cli.bench import tune_gc
    from minibroker.client.errors import MiniBrokerError

    tune_gc(100_000)
    try:
        result = scale_bench(args)
    except (ValueError, launcher.LauncherError, MiniBrokerError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join(format_table(result)))
    return 0
