"""`minibroker demo` (what `make demo` runs): a local cluster, a pipeline, a crash, a recovery.

I/O shell: starts the local cluster (the launcher: a quorum of three controllers by default),
creates a topic, keeps an acks=all producer writing, runs the example PySpark pipeline when the
`spark` extra is installed, kills the leader of a partition, shows the election and the ISR change
as the controller logged them, restarts the broker, waits for it to rejoin the ISR, then SIGKILLs
the active controller and times the re-election (until DescribeQuorum names a new leader, and
until a metadata change is accepted), restarts it, and ends by checking that every acknowledged
record was read back exactly once at the offset it was acknowledged with. Each step says what it
is doing.

On a `cluster up --tls` cluster (or a new one with `demo --tls`) every client, the watch frames
and the pipeline connect with the cluster's client.properties (DIR/client.properties: the
launcher's `admin` certificate), as the CLI does by default.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import pathlib
import signal
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

from minibroker.deploy import cluster as launcher
from minibroker.deploy import quorum

TOPIC = "demo-events"
DEMO_CONTROLLERS = 3  # the choice for the demo: a quorum that survives a controller kill
RESULTS_TOPIC = "demo-results"
PARTITIONS = 3


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "demo",
        help="start a local cluster, run a pipeline, kill a leader, watch it recover",
        description="The guided demo: a local cluster of 3 controllers and 3 brokers, an acks=all "
        "producer, the example PySpark pipeline (with the spark extra), a SIGKILLed leader, the "
        "election, the broker's return to the ISR, a SIGKILLed active controller and the "
        "quorum's re-election, and a final check that nothing acknowledged was lost.",
    )
    parser.add_argument("--dir", default=launcher.DEFAULT_DIR, help="cluster dir (.minibroker)")
    parser.add_argument(
        "--base-port", type=int, default=9092, help="first broker port (0: any free ports)"
    )
    parser.add_argument(
        "--controllers",
        type=int,
        choices=quorum.QUORUM_SIZES,
        default=DEMO_CONTROLLERS,
        help=f"controllers in the quorum of a new cluster (default {DEMO_CONTROLLERS}; with 1 "
        "the controller failover step is skipped: nothing could take over)",
    )
    parser.add_argument("--rate", type=int, default=2000, help="records per second to produce")
    parser.add_argument("--no-spark", action="store_true", help="skip the PySpark pipeline")
    parser.add_argument("--down", action="store_true", help="stop the cluster at the end")
    parser.add_argument(
        "--tls",
        action="store_true",
        help="a new cluster with TLS, as `cluster up --tls` (a --tls cluster already in --dir "
        "needs no flag: the demo connects with its client.properties)",
    )
    parser.set_defaults(func=main)


def say(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def detail(text: str) -> None:
    print(f"    {text}", flush=True)


class Feeder:
    """An acks=all, idempotent producer writing keyed events in the background."""

    def __init__(self, bootstrap: str, rate: int, **client: str) -> None:
        from minibroker.client import Producer

        self.acked: dict[bytes, tuple[int, int]] = {}
        self.errors: list[str] = []
        self._rate = rate
        # Values must be unique across demo runs on the same cluster: the final check reads the
        # whole topic back and counts a repeated value as a duplicate.
        self._run_id = uuid.uuid4().hex[:8]
        self._stop = threading.Event()
        self._producer = Producer(bootstrap, acks="all", linger_ms=5, **client)
        self._thread = threading.Thread(target=self._run, name="demo-feeder", daemon=True)
        self._lock = threading.Lock()

    def _run(self) -> None:
        i = 0
        started = time.monotonic()
        pending: list[tuple[bytes, Any]] = []
        while not self._stop.is_set():
            due = int((time.monotonic() - started) * self._rate)
            while i < due and not self._stop.is_set():
                user = f"user-{i % 17}"
                event = {"seq": i, "user": user, "amount": (i * 7) % 100, "run": self._run_id}
                value = json.dumps(event).encode()
                pending.append((value, self._producer.send(TOPIC, value, key=user.encode())))
                i += 1
            if len(pending) >= 200 or self._stop.is_set():
                self._settle(pending)
                pending = []
            time.sleep(0.005)
        self._settle(pending)

    def _settle(self, pending: list[tuple[bytes, Any]]) -> None:
        for value, future in pending:
            try:
                meta = future.result(timeout=120)
            except Exception as err:  # reported at the end; an unacked record is not a loss
                with self._lock:
                    self.errors.append(repr(err))
                continue
            with self._lock:
                self.acked[value] = (meta.partition, meta.offset)

    def count(self) -> int:
        with self._lock:
            return len(self.acked)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=180)
        self._producer.close()


def show_watch(directory: str, bootstrap: str, config: list[str]) -> None:
    """One frame of the live view (the same command a user runs), indented. `config`:
    `--command-config FILE` on a TLS cluster, else nothing."""
    frame = subprocess.run(
        [
            sys.executable,
            "-m",
            "minibroker.deploy",
            "watch",
            "--once",
            "--topic",
            TOPIC,
            "--cluster-dir",
            directory,
            "--width",
            "118",
            "--bootstrap-server",
            bootstrap,
            *config,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    for line in (frame.stdout or frame.stderr).rstrip().splitlines():
        print(f"    {line.rstrip()}", flush=True)


def run_pipeline(
    bootstrap: str, directory: str, config: list[str]
) -> subprocess.Popen[bytes] | None:
    example = pathlib.Path(__file__).resolve().parents[1] / "examples" / "pipeline.py"
    if not example.exists() or importlib.util.find_spec("pyspark") is None:
        return None
    log_path = pathlib.Path(directory) / "pipeline.log"
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child process
    return subprocess.Popen(
        [
            sys.executable,
            str(example),
            "--bootstrap-servers",
            bootstrap,
            "--input",
            TOPIC,
            "--output",
            RESULTS_TOPIC,
            "--checkpoint",
            str(pathlib.Path(directory) / "pipeline-ckpt"),
            *config,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )


def latest_totals(bootstrap: str, **client: str) -> dict[str, dict[str, int]]:
    """The pipeline's output as a reader of a compacted topic sees it: per user, the record with
    the most events."""
    from minibroker.client import Consumer, TopicPartition

    totals: dict[str, dict[str, int]] = {}
    with Consumer(bootstrap, **client) as consumer:
        partitions = consumer.partitions_for_topic(RESULTS_TOPIC)
        tps = [TopicPartition(RESULTS_TOPIC, p) for p in sorted(partitions)]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        consumer.seek_to_beginning(*tps)
        remaining = {tp for tp in tps if ends[tp] > 0}
        deadline = time.monotonic() + 30
        while remaining and time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=300):
                if record.value is not None:  # every record the pipeline writes has a value
                    total = json.loads(record.value)
                    user = total["user"]
                    if total["events"] >= totals.get(user, {}).get("events", -1):
                        totals[user] = total
                tp = TopicPartition(record.topic, record.partition)
                if record.offset >= ends[tp] - 1:
                    remaining.discard(tp)
    return totals


def check_pipeline(bootstrap: str, seen: dict[bytes, tuple[int, int]], **client: str) -> bool:
    """Wait until the pipeline's totals cover every event in the topic, then compare them with
    a count of the topic itself."""
    expected: dict[str, list[int]] = {}
    for value in seen:
        event = json.loads(value)
        counts = expected.setdefault(event["user"], [0, 0])
        counts[0] += 1
        counts[1] += event["amount"]
    say("Waiting for the PySpark pipeline to process everything, then checking its totals")

    def caught_up() -> dict[str, dict[str, int]] | None:
        totals = latest_totals(bootstrap, **client)
        return totals if sum(t["events"] for t in totals.values()) >= len(seen) else None

    try:
        totals = launcher.wait_for(caught_up, 300, "the pipeline to catch up")
    except launcher.LauncherError as err:
        say(f"FAILED: {err}")
        return False
    wrong = sorted(
        user for user, t in totals.items() if [t["events"], t["total"]] != expected.get(user)
    )
    counted = sum(t["events"] for t in totals.values())
    detail(f"{len(totals)} users, {counted} events counted by Spark, {len(wrong)} totals wrong")
    if wrong or set(totals) != set(expected):
        say(f"FAILED: the pipeline's totals differ from the topic for {wrong or 'some users'}")
        return False
    say("The pipeline counted every event exactly once, through the broker failure.")
    return True


def stop_pipeline(pipeline: subprocess.Popen[bytes]) -> None:
    pipeline.send_signal(signal.SIGINT)  # the query stops, then the Spark session
    try:
        pipeline.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pipeline.kill()
        pipeline.wait(timeout=10)


def controller_failover(directory: str, admin: Any) -> str | None:
    """SIGKILL the active controller while the producer writes; time until DescribeQuorum names
    a new leader and until a metadata change (a topic created, then deleted) is accepted;
    restart the killed voter. Returns the one-line report, None when there is no quorum."""
    state = launcher.require_state(directory)
    if not state.is_quorum:
        detail(
            "(one controller: killing it would freeze metadata until it is restarted; "
            "`minibroker demo --controllers 3` on a new --dir shows the quorum take over)"
        )
        return None
    before = launcher.quorum_status(state)
    victim = launcher.active_controller(state)
    if victim is None:
        raise launcher.LauncherError(f"the quorum has no leader: {before.why_no_leader}")
    say(
        f"Killing {victim.name}, the active controller (leader of the quorum in epoch "
        f"{before.epoch}), while the producer keeps writing"
    )
    killed_at = time.monotonic()
    launcher.act(directory, "kill", victim.name)

    def new_leader() -> quorum.QuorumStatus | None:
        now = launcher.quorum_status(state)
        return now if now.leader_id not in (quorum.NO_LEADER, before.leader_id) else None

    after = launcher.wait_for(new_leader, 30, "a new active controller")
    elected_ms = (time.monotonic() - killed_at) * 1000
    probe = f"demo-controller-failover-{uuid.uuid4().hex[:8]}"

    def metadata_change() -> bool:
        from minibroker.client.errors import TopicAlreadyExistsError

        try:
            admin.create_topic(probe, 1, 1)
        except TopicAlreadyExistsError:  # an earlier try was accepted but its answer was lost
            pass
        return True

    launcher.wait_for(metadata_change, 30, "the new controller to accept a metadata change")
    accepted_ms = (time.monotonic() - killed_at) * 1000
    with contextlib.suppress(Exception):
        admin.delete_topics([probe])
    detail(
        f"the quorum elected {after.leader_name} in {elected_ms:.0f} ms (epoch {before.epoch} -> "
        f"{after.epoch}); it accepted a metadata change (topic created) {accepted_ms:.0f} ms "
        "after the kill"
    )
    say(f"Restarting {victim.name}: it rejoins the quorum as a follower and catches up")
    launcher.act(directory, "start", victim.name)
    back = launcher.quorum_status(state)
    row = next(v for v in back.voters if v.node_id == victim.node_id)
    detail(f"{victim.name} is {row.role} again; the leader stays {back.leader_name}")
    return (
        f"controller failover: {victim.name} SIGKILLed -> {after.leader_name} elected in "
        f"{elected_ms:.0f} ms, first metadata change accepted after {accepted_ms:.0f} ms"
    )


def main(args: argparse.Namespace) -> int:
    try:
        return _demo(args)
    except launcher.LauncherError as err:
        print(f"minibroker demo: {err}", file=sys.stderr)
        return 1


def _demo(args: argparse.Namespace) -> int:
    from minibroker.client import Admin, Consumer, TopicPartition

    say(
        f"Starting a local cluster: {args.controllers} controller(s) and three brokers, each its "
        "own process"
    )
    existing = launcher.load_state(args.dir)
    state = launcher.up(
        args.dir,
        brokers=3,
        base_port=args.base_port,
        controllers=args.controllers if existing is None else None,
        tls=args.tls,
    )
    if state.is_quorum:
        leader = launcher.active_controller(state)
        detail(
            f"controller quorum {state.voters}, active controller "
            f"{leader.name if leader else 'not elected yet'}"
        )
    else:
        detail(f"controller at {state.controller.address}")
    detail(f"brokers at {state.bootstrap_servers}")
    detail(f"data dirs and logs under {args.dir}/ (minibroker cluster status shows them)")
    bootstrap = state.bootstrap_servers
    # The cluster's client.properties (TLS: the launcher's admin certificate), or nothing.
    client = launcher.client_kwargs(state)
    config = ["--command-config", str(launcher.client_config_path(args.dir))] if state.tls else []
    if state.tls:
        detail(f"TLS: every connection uses {config[1]}")

    admin = Admin(bootstrap, **client)
    try:
        say(
            f"Creating topic {TOPIC}: {PARTITIONS} partitions, 3 replicas each, "
            "min.insync.replicas=2"
        )
        if TOPIC not in admin.list_topics():
            admin.create_topic(TOPIC, PARTITIONS, 3, {"min.insync.replicas": "2"})
        if RESULTS_TOPIC not in admin.list_topics():
            admin.create_topic(RESULTS_TOPIC, 1, 3, {"min.insync.replicas": "2"})
        launcher.wait_for(
            lambda: all(len(p.isr) == 3 for p in admin.describe_topics([TOPIC])[0].partitions),
            30,
            "every replica in sync",
        )
        for p in admin.describe_topics([TOPIC])[0].partitions:
            detail(
                f"partition {p.partition}: leader broker {p.leader}, replicas "
                f"{list(p.replicas)}, in-sync {list(p.isr)}"
            )

        say(
            f"Producing events with acks=all ({args.rate}/s): a write is acknowledged only once "
            "the in-sync replicas have it"
        )
        feeder = Feeder(bootstrap, args.rate, **client)
        feeder.start()
        launcher.wait_for(lambda: feeder.count() >= args.rate, 60, "the first acknowledgements")
        detail(f"{feeder.count()} records acknowledged so far")

        pipeline = None
        if not args.no_spark:
            pipeline = run_pipeline(bootstrap, args.dir, config)
            if pipeline is not None:
                say(
                    f"Starting the example PySpark pipeline: {TOPIC} -> per-user totals -> "
                    f"{RESULTS_TOPIC}, a streaming query (log: {args.dir}/pipeline.log)"
                )
                launcher.wait_for(
                    lambda: pipeline.poll() is not None or latest_totals(bootstrap, **client),
                    300,
                    "the pipeline's first results",
                )
                if pipeline.poll() is not None:
                    raise launcher.LauncherError(
                        f"the pipeline exited early; see {args.dir}/pipeline.log"
                    )
                users = len(latest_totals(bootstrap, **client))
                detail(f"the pipeline is writing totals for {users} users")
            else:
                detail("(PySpark pipeline skipped: install the spark extra to run it)")

        tp = TopicPartition(TOPIC, 0)
        before = admin.describe_topics([TOPIC])[0].partitions[0]
        victim = before.leader
        say(f"Killing broker {victim}, the leader of {tp} (SIGKILL: no goodbye, like a crash)")
        killed_at = time.time()
        launcher.act(args.dir, "kill", str(victim))
        after = launcher.wait_for(
            lambda: next(
                p
                for p in admin.describe_topics([TOPIC])[0].partitions
                if p.partition == 0 and p.leader not in (victim, -1)
            ),
            30,
            "a new leader",
        )
        elapsed_ms = (time.time() - killed_at) * 1000
        reports = [
            f"broker failover: broker {victim} SIGKILLed -> broker {after.leader} leads {tp} "
            f"after {elapsed_ms:.0f} ms"
        ]
        detail(
            f"the controller elected broker {after.leader} in {elapsed_ms:.0f} ms: leader epoch "
            f"{before.leader_epoch} -> {after.leader_epoch}, ISR now {list(after.isr)}"
        )
        acked_before = feeder.count()
        launcher.wait_for(
            lambda: feeder.count() >= acked_before + args.rate // 2, 60, "writes to continue"
        )
        detail(f"producing goes on: {feeder.count()} records acknowledged")
        say(f"What `minibroker watch --once --topic {TOPIC}` shows now:")
        show_watch(args.dir, bootstrap, config)

        say(
            f"Restarting broker {victim}: it truncates anything it had that the new leader "
            "does not, fetches what it missed, and rejoins the ISR"
        )
        restarted_at = time.time()
        launcher.act(args.dir, "start", str(victim))
        launcher.wait_for(
            lambda: all(victim in p.isr for p in admin.describe_topics([TOPIC])[0].partitions),
            60,
            f"broker {victim} back in every ISR",
        )
        detail(f"broker {victim} is in sync again after {time.time() - restarted_at:.1f} s")
        show_watch(args.dir, bootstrap, config)

        acked_before = feeder.count()
        controller_report = controller_failover(args.dir, admin)
        if controller_report is not None:
            launcher.wait_for(
                lambda: feeder.count() >= acked_before + args.rate // 2, 60, "writes to continue"
            )
            detail(f"producing went on throughout: {feeder.count()} records acknowledged")
            show_watch(args.dir, bootstrap, config)
            reports.append(controller_report)

        say("Stopping the producer and reading every partition back from the beginning")
        feeder.stop()
        seen: dict[bytes, tuple[int, int]] = {}
        duplicates = 0
        with Consumer(bootstrap, **client) as consumer:
            tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
            consumer.assign(tps)
            ends = consumer.end_offsets(tps)
            consumer.seek_to_beginning(*tps)
            remaining = {tp for tp in tps if ends[tp] > 0}
            deadline = time.monotonic() + 120
            while remaining and time.monotonic() < deadline:
                for record in consumer.poll(timeout_ms=500):
                    if record.value is not None:  # every record the feeder writes has a value
                        if record.value in seen:
                            duplicates += 1
                        seen[record.value] = (record.partition, record.offset)
                    tp_r = TopicPartition(record.topic, record.partition)
                    if record.offset >= ends[tp_r] - 1:
                        remaining.discard(tp_r)
        lost = [v for v, where in feeder.acked.items() if seen.get(v) != where]
        detail(
            f"acknowledged: {len(feeder.acked)}, read back: {len(seen)}, "
            f"lost: {len(lost)}, duplicated: {duplicates}, "
            f"send errors (never acknowledged): {len(feeder.errors)}"
        )
        ok = not lost and duplicates == 0
        say("Failover times")
        for line in reports:
            detail(line)
        if ok:
            say(
                "Every acknowledged record was read back exactly once, at the offset it was "
                "acknowledged with."
            )
        else:
            say("FAILED: acknowledged records are missing or duplicated")
        if pipeline is not None:
            ok = check_pipeline(bootstrap, seen, **client) and ok
    finally:
        admin.close()
        if pipeline is not None and pipeline.poll() is None:
            stop_pipeline(pipeline)

    if args.down:
        launcher.down(args.dir)
        detail("cluster stopped")
    else:
        print("\nThe cluster is still running. Try:")
        print("  minibroker watch                      # live view: leaders, ISR, HW, events")
        print("  minibroker cluster kill 2             # then watch the election")
        print("  minibroker cluster kill controller    # the active controller: a re-election")
        print("  minibroker cluster status             # processes and the controller quorum")
        print(f"  minibroker topics describe {TOPIC}")
        print("  minibroker cluster down               # stop it (data kept)")
    return 0 if ok else 1
