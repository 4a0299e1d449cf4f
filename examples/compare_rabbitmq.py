"""Benchmark: `minibroker bench produce` beside RabbitMQ Streams on the same machine, interleaved.

    apt-get install -y --no-install-recommends rabbitmq-server   # Debian's; not started by apt
    .venv/bin/pip install rstream                                 # for the run only
    .venv/bin/python examples/compare_rabbitmq.py                 # 100 B and 1 KiB, 5 rounds
    .venv/bin/python examples/compare_rabbitmq.py --sizes 100 --rounds 3 --records 300000 \\
        --json-out /tmp/compare.json

Measures, never asserts; not part of CI. Everything it starts lives under one temp dir on the
filesystem of `--dir` (default: the system temp dir) and listens on 127.0.0.1 only, on free
ports; every process it starts is stopped by PID (SIGTERM, then SIGKILL of its process group) on
exit, failure or Ctrl-C included.

The two sides, matched to issue 22's setup:
  RabbitMQ   three nodes of Debian's rabbitmq-server (rabbitmq_stream enabled offline through
             RABBITMQ_ENABLED_PLUGINS_FILE), clustered with `rabbitmqctl join_cluster`; one stream
             per round created with initial-cluster-size 3 (a confirm means a majority, 2 of 3,
             has the chunk: like acks=all with min.insync.replicas=2). The publisher is rstream
             with publisher confirms (a callback per message), in a child process on uvloop with
             the GC threshold `bench produce` uses: `--rstream-mode batch` (default) sends
             `send_batch` frames of `--rstream-batch` messages (default: ~512 KiB frames, 4681 x
             100 B or 506 x 1 KiB), keeping at most `--rstream-window` unconfirmed (default 8
             frames); `send` is rstream's buffered `send` (flushed by its 0.5 s timer). batch
             was its fastest confirmed mode here (rstream 1.1.1, 100 B: 259-271k records/s at
             2.3 us client CPU/record vs 131k at 5.9 for `send`; 1 KiB: 101k vs 75k; frames of
             1000 x 100 B or 100 x 1 KiB: 174k and 70k). Sub-entry batching (`send_sub_entry`)
             is left out: it confirms a sub-entry, not each record. Erlang schedulers do not
             busy-wait (+sbwt none, as RabbitMQ advises for hosts shared with other work), so
             the nodes' CPU is work, not spinning.
  minibroker three brokers (`minibroker.deploy.cluster`), one topic per round with 3 partitions,
             RF 3, min.insync.replicas=2; `minibroker bench produce --acks all --json` (the
             default AsyncProducer, `--client sync` with `--minibroker-client sync`).
Rounds alternate R, M, R, M, ... per record size; each figure is the median over rounds.

Figures per run: records/s and MB/s of payload (records x size), the client process's CPU per
record (user + sys over the measured interval, time.process_time in each client) and the
servers' CPU per record (the RabbitMQ nodes' beam processes or the three brokers, from
/proc/<pid>/stat over the same interval). The disk: sequential writes of the largest run's
replicated bytes (3 x records x size, at least 512 MiB) in 1 KiB and 1 MiB writes (dd) to a file
beside the data dirs, no fsync per write: once with one fsync at the end, once without (the page
cache's rate); replicated bytes/s (3 x payload bytes/s) are given as a fraction of the rate with
the fsync (median of `--disk-repeats` runs, after the clusters have stopped).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import pathlib
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

RABBIT_BIN = pathlib.Path("/usr/lib/rabbitmq/bin")  # the real scripts (no `su rabbitmq` wrapper)
MB = 1024 * 1024
GC_THRESHOLD = 100_000  # what `minibroker bench` uses; the rstream child gets the same


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1024", help="record sizes in bytes (comma list)")
    parser.add_argument("--records", type=int, default=500_000, help="records per 100 B run")
    parser.add_argument(
        "--records-1k",
        type=int,
        default=200_000,
        help="records per run for sizes >= 1 KiB",
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per size")
    parser.add_argument("--dir", default="", help="parent of the temp dir (default: system temp)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, data)")
    parser.add_argument("--rstream-mode", choices=["batch", "send"], default="batch")
    parser.add_argument("--rstream-batch", type=int, default=0, help="0: fill ~500 KiB frames")
    parser.add_argument("--rstream-window", type=int, default=0, help="0: 8 batches")
    parser.add_argument("--minibroker-client", choices=["async", "sync"], default="async")
    parser.add_argument(
        "--producer-props",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="passed to `minibroker bench produce --producer-props`",
    )
    parser.add_argument(
        "--no-latency",
        action="store_true",
        help="run `bench produce --no-latency` (the client CPU is then the producer's alone)",
    )
    parser.add_argument("--skip-rabbitmq", action="store_true", help="minibroker runs only")
    parser.add_argument("--skip-disk", action="store_true")
    parser.add_argument("--disk-repeats", type=int, default=3, help="disk runs (median)")
    parser.add_argument("--json-out", default="", help="also write every run's figures here")
    return parser.parse_args(argv)


# -- processes: everything started is recorded and stopped by PID --------------------------------


@dataclass
class Started:
    name: str
    proc: subprocess.Popen[bytes]
    log: pathlib.Path


STARTED: list[Started] = []


def start(name: str, argv: list[str], env: dict[str, str], log: pathlib.Path) -> Started:
    """Start a long-running process in its own session (so its children share its process
    group), output to `log`."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    entry = Started(name, proc, log)
    STARTED.append(entry)
    return entry


def stop_all(timeout_s: float = 20.0) -> None:
    """SIGTERM each started process (newest first), wait, then SIGKILL its process group."""
    for entry in reversed(STARTED):
        if entry.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                entry.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for entry in reversed(STARTED):
        with contextlib.suppress(subprocess.TimeoutExpired):
            entry.proc.wait(max(0.1, deadline - time.monotonic()))
        # The group (pgid == our child's PID, from start_new_session) holds what it started:
        # beam.smp, erl_child_setup, inet_gethost.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(entry.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            entry.proc.wait(5)
    STARTED.clear()


def _raise_on_signal(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_TAKEN: set[int] = set()


def free_port(count: int = 1) -> int:
    """A free port on 127.0.0.1 (the first of `count` consecutive free ones), below the
    ephemeral range, never handed out twice by this run."""
    for _ in range(2000):
        base = random.randrange(20_000, 32_000 - count)
        ports = range(base, base + count)
        if all(p not in _TAKEN and port_is_free(p) for p in ports):
            _TAKEN.update(ports)
            return base
    raise RuntimeError("no free port found")


def children_of(pid: int) -> list[int]:
    """Every descendant of `pid` (from /proc/*/stat's ppid)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = pathlib.Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        parents[int(entry)] = int(stat[stat.rindex(b")") + 2 :].split()[1])
    found: list[int] = []
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found.extend(kids)
        frontier.extend(kids)
    return found


def comm(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def wait_for(predicate: Any, timeout_s: float, what: str, step_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(step_s)


# -- RabbitMQ ------------------------------------------------------------------------------------


@dataclass
class RabbitNode:
    name: str  # rmq1@localhost
    amqp_port: int
    stream_port: int
    dist_port: int
    base: pathlib.Path
    env: dict[str, str] = field(default_factory=dict)
    started: Started | None = None

    def beam_pids(self) -> list[int]:
        assert self.started is not None
        return [p for p in children_of(self.started.proc.pid) if comm(p).startswith("beam")]


class RabbitCluster:
    """Three RabbitMQ nodes on 127.0.0.1, one epmd of our own, all under `root`."""

    def __init__(self, root: pathlib.Path, nodes: int = 3) -> None:
        self.root = root
        self.home = root / "home"  # the Erlang cookie lives here, not in root's real home
        self.home.mkdir(parents=True)
        cookie = self.home / ".erlang.cookie"
        cookie.write_text("minibroker-compare-" + os.urandom(8).hex())
        cookie.chmod(0o400)
        self.epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
        self.epmd_port = free_port()
        ctl_base = free_port(12)
        self.common_env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))},
            "HOME": str(self.home),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "ERL_EPMD_PORT": str(self.epmd_port),
            "RABBITMQ_CONF_ENV_FILE": str(root / "rabbitmq-env.conf"),
            "RABBITMQ_CTL_DIST_PORT_MIN": str(ctl_base),
            "RABBITMQ_CTL_DIST_PORT_MAX": str(ctl_base + 11),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
        }
        (root / "rabbitmq-env.conf").write_text("")
        (root / "enabled_plugins").write_text("[rabbitmq_stream].\n")
        self.nodes: list[RabbitNode] = []
        for i in range(1, nodes + 1):
            base = root / f"rmq{i}"
            (base / "log").mkdir(parents=True)
            node = RabbitNode(f"rmq{i}@localhost", free_port(), free_port(), free_port(), base)
            conf = base / "rabbitmq.conf"
            conf.write_text(
                "\n".join(
                    [
                        f"listeners.tcp.1 = 127.0.0.1:{node.amqp_port}",
                        f"stream.listeners.tcp.1 = 127.0.0.1:{node.stream_port}",
                        "stream.advertised_host = 127.0.0.1",
                        f"stream.advertised_port = {node.stream_port}",
                        "loopback_users = none",
                        "log.console = false",
                        "log.file.level = warning",
                        "",
                    ]
                )
            )
            node.env = {
                **self.common_env,
                "RABBITMQ_NODENAME": node.name,
                "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                "RABBITMQ_NODE_PORT": str(node.amqp_port),
                "RABBITMQ_DIST_PORT": str(node.dist_port),
                "RABBITMQ_CONFIG_FILE": str(conf),
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(root / "enabled_plugins"),
                "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
                "RABBITMQ_LOG_BASE": str(base / "log"),
                "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
                "RABBITMQ_SCHEDULER_BUSY_WAIT_THRESHOLD": "none",
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": (
                    "-kernel inet_dist_use_interface {127,0,0,1} +sbwtdcpu none +sbwtdio none"
                ),
            }
            self.nodes.append(node)

    def ctl(self, node: RabbitNode, *args: str, timeout_s: float = 120.0) -> str:
        result = subprocess.run(
            [str(RABBIT_BIN / "rabbitmqctl"), "-n", node.name, *args],
            env=node.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"rabbitmqctl {' '.join(args)} on {node.name} exited {result.returncode}: "
                f"{result.stdout.strip()} {result.stderr.strip()}"
            )
        return result.stdout

    def start(self) -> None:
        start(
            "epmd",
            [self.epmd, "-address", "127.0.0.1", "-port", str(self.epmd_port)],
            self.common_env,
            self.root / "epmd.log",
        )
        wait_for(lambda: not port_is_free(self.epmd_port), 10, "epmd")
        for node in self.nodes:
            node.started = start(
                node.name,
                [str(RABBIT_BIN / "rabbitmq-server")],
                node.env,
                node.base / "server.log",
            )
        for node in self.nodes:
            # await_startup gives up at once on a node not yet registered with epmd.
            wait_for(lambda n=node: self.registered(n), 120, f"{node.name} in epmd")
            self.ctl(node, "await_startup", "--timeout", "120", timeout_s=150)
        first = self.nodes[0]
        for node in self.nodes[1:]:
            self.ctl(node, "stop_app")
            self.ctl(node, "join_cluster", first.name)
            self.ctl(node, "start_app")
            self.ctl(node, "await_startup", "--timeout", "120", timeout_s=150)
        status = self.ctl(first, "cluster_status", "--formatter", "json")
        running = json.loads(status[status.index("{") :]).get("running_nodes", [])
        if sorted(running) != sorted(n.name for n in self.nodes):
            raise RuntimeError(f"cluster has running nodes {running}")
        for node in self.nodes:
            wait_for(lambda n=node: not port_is_free(n.stream_port), 60, f"{node.name} stream")

    def registered(self, node: RabbitNode) -> bool:
        assert node.started is not None
        if node.started.proc.poll() is not None:
            raise RuntimeError(f"{node.name} exited; see {node.started.log} and {node.base}/log")
        out = subprocess.run(
            [self.epmd, "-port", str(self.epmd_port), "-names"],
            env=self.common_env,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
        return f"name {node.name.split('@')[0]} at port" in out

    def stream_members(self, stream: str) -> list[str]:
        out = self.ctl(self.nodes[0], "list_queues", "name", "members", "--formatter", "json")
        for row in json.loads(out[out.index("[") :]):
            if row.get("name") == stream:
                members = row.get("members", [])
                return list(members) if isinstance(members, list) else [str(members)]
        return []

    def beam_pids(self) -> list[int]:
        return [pid for node in self.nodes for pid in node.beam_pids()]


async def _rstream_admin(port: int, stream: str, create: bool) -> None:
    from rstream import Producer

    async with Producer("127.0.0.1", port, username="guest", password="guest") as producer:
        if create:
            await producer.create_stream(stream, arguments={"initial-cluster-size": 3})
        else:
            await producer.delete_stream(stream, missing_ok=True)


def rstream_publish_child(argv: list[str]) -> int:
    """`compare_rabbitmq.py rstream-publish ...`: one publisher run in this process; prints one
    JSON object (the figures), like `minibroker bench produce --json`."""
    parser = argparse.ArgumentParser(prog="compare_rabbitmq.py rstream-publish")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stream", required=True)
    parser.add_argument("--num-records", type=int, required=True)
    parser.add_argument("--record-size", type=int, required=True)
    parser.add_argument("--mode", choices=["batch", "send"], default="batch")
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--window", type=int, default=0)
    parser.add_argument("--pids", default="")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args(argv)
    gc.set_threshold(GC_THRESHOLD, 50, 100)
    if args.loop == "uvloop":
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    else:
        runner = asyncio.Runner()
    with runner:
        fields = runner.run(_rstream_publish(args))
    print(json.dumps(fields))
    return 0


async def _rstream_publish(args: argparse.Namespace) -> dict[str, Any]:
    from rstream import ConfirmationStatus, Producer

    from minibroker.client.cli.bench import CpuMeter

    payload = os.urandom(args.record_size)
    n = args.num_records
    # One Publish frame must stay under frame_max (1 MiB): ~500 KiB frames by default.
    batch = args.batch or max(1, min(5000, (512 * 1024) // (args.record_size + 12)))
    window = args.window or 8 * batch
    pids = [int(p) for p in args.pids.split(",") if p]
    meter = CpuMeter(pids)
    confirmed = 0
    failed = 0
    outstanding = 0
    space = asyncio.Event()
    done = asyncio.Event()

    def on_confirm(status: ConfirmationStatus) -> None:
        nonlocal confirmed, failed, outstanding
        if status.is_confirmed:
            confirmed += 1
        else:
            failed += 1
        outstanding -= 1
        if outstanding <= window - batch:
            space.set()
        if confirmed + failed == n:
            done.set()

    async with Producer("127.0.0.1", args.port, username="guest", password="guest") as producer:
        # Declare the publisher (and its connection to the leader) before the clock starts.
        await producer.send_batch(args.stream, [payload], on_publish_confirm=lambda s: None)
        await asyncio.sleep(0.2)  # let that confirm arrive: it is not one of the n
        meter.start()
        start = time.monotonic()
        if args.mode == "batch":
            sent = 0
            while sent < n:
                k = min(batch, n - sent)
                while outstanding + k > window:
                    space.clear()
                    await space.wait()
                outstanding += k
                await producer.send_batch(args.stream, [payload] * k, on_publish_confirm=on_confirm)
                sent += k
        else:
            for _ in range(n):
                outstanding += 1
                await producer.send(args.stream, payload, on_publish_confirm=on_confirm)
        try:
            await asyncio.wait_for(done.wait(), 300)
        except TimeoutError:
            raise RuntimeError(
                f"{n - confirmed - failed} of {n} messages unconfirmed after 300 s"
            ) from None
        end = time.monotonic()
        cpu = meter.stop(n)
    elapsed = max(end - start, 1e-9)
    return {
        "system": "rabbitmq",
        "mode": args.mode,
        "batch": batch if args.mode == "batch" else None,
        "window": window if args.mode == "batch" else None,
        "loop": args.loop,
        "record_size": args.record_size,
        "records": confirmed,
        "failed": failed,
        "elapsed_s": round(elapsed, 6),
        "records_per_sec": round(confirmed / elapsed, 3),
        "mb_per_sec": round(confirmed * args.record_size / MB / elapsed, 4),
        **cpu.fields(),
    }


def run_json(argv: list[str], timeout_s: float, what: str) -> dict[str, Any]:
    """Run a client child to completion (its own process, so its CPU is its own) and parse the
    JSON object on its last stdout line."""
    result = subprocess.run(
        argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s
    )
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise RuntimeError(
            f"{what} exited {result.returncode}: {result.stdout[-2000:]} {result.stderr[-2000:]}"
        )
    fields: dict[str, Any] = json.loads(lines[-1])
    return fields


# -- minibroker ----------------------------------------------------------------------------------


@contextlib.contextmanager
def minibroker_cluster(root: pathlib.Path) -> Iterator[Any]:
    from minibroker.deploy import cluster as launcher

    directory = str(root / "minibroker")
    state = launcher.up(directory, brokers=3, base_port=0, settings={}, timeout_s=90.0)
    try:
        yield state
    finally:
        with contextlib.suppress(launcher.LauncherError):
            launcher.down(directory)
        for spec in (launcher.load_state(directory) or state).all():
            if spec.pid > 0 and launcher.process_state(spec) != "stopped":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(spec.pid, signal.SIGKILL)


def minibroker_run(
    state: Any, topic: str, records: int, size: int, args: argparse.Namespace
) -> dict[str, Any]:
    from minibroker.client import Admin

    with Admin(state.bootstrap_servers) as admin:
        admin.create_topic(topic, 3, 3, {"min.insync.replicas": "2"})
    argv = [
        str(pathlib.Path(sys.executable).parent / "minibroker"),
        "bench",
        "produce",
        "--topic",
        topic,
        "--num-records",
        str(records),
        "--record-size",
        str(size),
        "--acks",
        "all",
        "--json",
        "--client",
        args.minibroker_client,
        "--broker-pids",
        ",".join(str(b.pid) for b in state.brokers),
        "--bootstrap-server",
        state.bootstrap_servers,
    ]
    if args.no_latency:
        argv.append("--no-latency")
    if args.producer_props:
        argv += ["--producer-props", *args.producer_props]
    try:
        fields = run_json(argv, 1800, "minibroker bench produce")
    finally:
        with Admin(state.bootstrap_servers) as admin, contextlib.suppress(Exception):
            admin.delete_topics([topic])
    fields["system"] = "minibroker"
    return fields


def rabbit_run(
    cluster: RabbitCluster, stream: str, records: int, size: int, args: argparse.Namespace
) -> dict[str, Any]:
    port = cluster.nodes[0].stream_port
    asyncio.run(_rstream_admin(port, stream, create=True))
    try:
        members = cluster.stream_members(stream)
        if len(members) != 3:
            raise RuntimeError(f"stream {stream} has members {members}, expected 3")
        argv = [
            sys.executable,
            __file__,
            "rstream-publish",
            "--port",
            str(port),
            "--stream",
            stream,
            "--num-records",
            str(records),
            "--record-size",
            str(size),
            "--mode",
            args.rstream_mode,
            "--batch",
            str(args.rstream_batch),
            "--window",
            str(args.rstream_window),
            "--pids",
            ",".join(str(p) for p in cluster.beam_pids()),
        ]
        return run_json(argv, 1800, "rstream publisher")
    finally:
        asyncio.run(_rstream_admin(port, stream, create=False))


# -- the disk ------------------------------------------------------------------------------------


def disk_rate(directory: pathlib.Path, total: int, chunk: int) -> dict[str, float]:
    """Sequential writes of `total` bytes in `chunk`-byte writes to a file in `directory`: with
    one fsync at the end (`dd conv=fsync`), then without (the page cache's rate).

    dd's C loop, not Python's: at 1 KiB a Python loop of os.write measured ~20% below dd."""
    rates: dict[str, float] = {"chunk": chunk}
    count = max(1, total // chunk)
    for key, extra in (("with_fsync_mb_per_sec", ["conv=fsync"]), ("write_mb_per_sec", [])):
        path = directory / f"disk-test-{chunk}"
        try:
            result = subprocess.run(
                ["dd", "if=/dev/zero", f"of={path}", f"bs={chunk}", f"count={count}", *extra],
                capture_output=True,
                text=True,
                timeout=600,
                check=True,
                env={**os.environ, "LC_ALL": "C"},
            )
        finally:
            path.unlink(missing_ok=True)
        match = re.search(r"^(\d+) bytes .* copied, ([\d.e-]+) s", result.stderr, re.M)
        if match is None:
            raise RuntimeError(f"unexpected dd output: {result.stderr}")
        size, seconds = int(match.group(1)), float(match.group(2))
        rates["bytes"] = size
        rates[key] = size / MB / max(seconds, 1e-9)
    return rates


# -- the report ----------------------------------------------------------------------------------


def median(runs: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def server_cpu(run: dict[str, Any]) -> float | None:
    value = run.get("broker_cpu_us_per_record")
    return float(value) if value is not None else None


def disk_medians(disk: list[dict[str, float]]) -> dict[int, float]:
    """chunk -> the median rate with the final fsync (MB/s) over the repeats."""
    chunks = sorted({int(d["chunk"]) for d in disk})
    return {
        c: statistics.median(d["with_fsync_mb_per_sec"] for d in disk if d["chunk"] == c)
        for c in chunks
    }


def report(runs: list[dict[str, Any]], disk: list[dict[str, float]]) -> None:
    print("\n== medians per record size (each run's figures above) ==")
    header = (
        f"{'size':>6} {'system':<11} {'runs':>4} {'records/s':>11} {'MB/s':>8} "
        f"{'client us/rec':>13} {'server us/rec':>13} {'repl MB/s':>9}"
    )
    print(header)
    sizes = sorted({r["record_size"] for r in runs})
    for size in sizes:
        medians: dict[str, float] = {}
        for system in ("rabbitmq", "minibroker"):
            mine = [r for r in runs if r["record_size"] == size and r["system"] == system]
            if not mine:
                continue
            for r in mine:
                r["server_cpu_us_per_record"] = server_cpu(r)
            rate = median(mine, "records_per_sec")
            mbps = median(mine, "mb_per_sec")
            medians[system] = rate
            print(
                f"{size:>6} {system:<11} {len(mine):>4} {rate:>11,.0f} {mbps:>8.2f} "
                f"{median(mine, 'client_cpu_us_per_record'):>13.2f} "
                f"{median(mine, 'server_cpu_us_per_record'):>13.2f} {3 * mbps:>9.2f}"
            )
            if disk:
                shares = ", ".join(
                    f"{3 * mbps / rate:.0%} of {chunk} B writes ({rate:.0f} MB/s)"
                    for chunk, rate in disk_medians(disk).items()
                )
                print(f"{'':>6} {'':<11} replicated bytes/s = {shares}")
        if len(medians) == 2:
            ratios = [
                m["records_per_sec"] / r["records_per_sec"]
                for r, m in zip(
                    [x for x in runs if x["record_size"] == size and x["system"] == "rabbitmq"],
                    [x for x in runs if x["record_size"] == size and x["system"] == "minibroker"],
                    strict=False,
                )
            ]
            print(
                f"{'':>6} minibroker / RabbitMQ: "
                f"{medians['minibroker'] / medians['rabbitmq']:.2f}x "
                f"(ratio of medians; median of the rounds' ratios "
                f"{statistics.median(ratios) if ratios else float('nan'):.2f}: "
                f"{', '.join(f'{x:.2f}' for x in ratios)})"
            )


def versions() -> dict[str, str]:
    """What was measured: the packages' versions and minibroker's commit."""
    from importlib import metadata

    import minibroker.client

    def quiet(argv: list[str]) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.strip()
        except OSError:
            return ""

    try:
        rstream_version = metadata.version("rstream")
    except metadata.PackageNotFoundError:
        rstream_version = "not installed"
    repo = pathlib.Path(minibroker.client.__file__).resolve().parent.parent
    return {
        "rabbitmq_server": quiet(["dpkg-query", "-W", "-f=${Version}", "rabbitmq-server"]),
        "rstream": rstream_version,
        "minibroker_commit": quiet(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"]),
        "minibroker_repo": str(repo),
        "python": sys.version.split()[0],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    # SIGINT too: a shell starts a background job with SIGINT ignored, and the cleanup must run.
    signal.signal(signal.SIGTERM, _raise_on_signal)
    signal.signal(signal.SIGINT, _raise_on_signal)
    root = pathlib.Path(tempfile.mkdtemp(prefix="minibroker-vs-rabbitmq-", dir=args.dir or None))
    setup = versions()
    print(f"working dir {root}; {json.dumps(setup)}", flush=True)
    runs: list[dict[str, Any]] = []
    disk: list[dict[str, float]] = []
    try:
        rabbit = None
        if not args.skip_rabbitmq:
            rabbit = RabbitCluster(root / "rabbitmq")
            started = time.monotonic()
            rabbit.start()
            print(
                f"RabbitMQ: 3 nodes clustered in {time.monotonic() - started:.0f} s "
                f"(stream ports {[n.stream_port for n in rabbit.nodes]}, "
                f"beam PIDs {rabbit.beam_pids()})",
                flush=True,
            )
        with minibroker_cluster(root) as state:
            print(
                f"minibroker: {state.bootstrap_servers} "
                f"(broker PIDs {[b.pid for b in state.brokers]})",
                flush=True,
            )
            for size in sizes:
                records = args.records if size < 1024 else args.records_1k
                for rnd in range(1, args.rounds + 1):
                    pair: list[tuple[str, Any]] = []
                    if rabbit is not None:
                        pair.append(("rabbitmq", rabbit))
                    pair.append(("minibroker", state))
                    for system, target in pair:
                        name = f"bench-{size}-{rnd}-{int(time.time())}"
                        if system == "rabbitmq":
                            fields = rabbit_run(target, name, records, size, args)
                        else:
                            fields = minibroker_run(target, name, records, size, args)
                        fields["round"] = rnd
                        fields["load_avg_1m"] = round(os.getloadavg()[0], 2)
                        runs.append(fields)
                        print(
                            f"{size:>5} B round {rnd} {system:<10} "
                            f"{fields['records_per_sec']:>10,.0f} records/s "
                            f"{fields['mb_per_sec']:>7.2f} MB/s  client "
                            f"{fields['client_cpu_us_per_record']:.2f} us/rec  servers "
                            f"{fields.get('broker_cpu_us_per_record', float('nan')):.2f} us/rec"
                            + f"  load {fields['load_avg_1m']:.1f}"
                            + (f"  FAILED {fields['failed']}" if fields.get("failed") else ""),
                            flush=True,
                        )
        if not args.skip_disk:
            # The largest run's replicated bytes, at least 512 MiB: less only measures the
            # virtual disk's write cache (85 MiB went at 1.5-2 GB/s with the fsync here).
            largest = max(
                [3 * (args.records if s < 1024 else args.records_1k) * s for s in sizes]
                + [512 * MB]
            )
            for rep in range(1, args.disk_repeats + 1):
                for chunk in (1024, MB):
                    d = disk_rate(root, largest, chunk)
                    d["repeat"] = rep
                    disk.append(d)
                    print(
                        f"disk {rep}: {d['bytes'] / MB:.0f} MiB in {chunk} B writes: "
                        f"{d['with_fsync_mb_per_sec']:.0f} MB/s with one fsync at the end, "
                        f"{d['write_mb_per_sec']:.0f} MB/s without (page cache)  "
                        f"load {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
    except BaseException as err:
        print(f"stopping everything started: {type(err).__name__}: {err}", flush=True)
        raise
    finally:
        stop_all()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    report(runs, disk)
    if args.json_out:
        out = {"setup": setup, "runs": runs, "disk": disk}
        pathlib.Path(args.json_out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rstream-publish":
        sys.exit(rstream_publish_child(sys.argv[2:]))
    sys.exit(main())
