"""deploy/docker-compose.yml under a real Docker engine, driven the way a user drives it.

Only `docker` and `docker compose` start, kill and stop anything; the host talks to the cluster
with the client library at the compose file's addresses, as `minibroker` commands would:

- every `docker build` line in the Dockerfile's header builds the image it names (a build
  without --target is the server image);
- `up --build -d --wait`; an RF 3 topic; an acks=all producer runs while the container of a
  partition leader is killed: a new leader is elected, and every acknowledged record is read back,
  none twice; `start` brings the broker back into every ISR; `stop` of a leader is a controlled
  shutdown with exit 0;
- the spark profile's pipeline writes its totals, `stop` ends it with exit 0 and no traceback in
  its log, and a restart adds no sample events (the totals stay exact);
- `down -v` leaves no container and no volume of the project;
- deploy/docker-compose.bridge.yml (no host networking): every broker's Metadata answer names
  the brokers by service name, a `cli` container creates a topic, produces acks=all and consumes
  across a SIGKILL of a leader's container with nothing acknowledged lost, and `down -v` leaves
  no container, volume or network.

Needs an engine that answers, Compose v2, a CLI that builds with BuildKit and the compose file's
ports free on this host (it uses the host's network; the bridge file needs none). Without them the
tests are skipped with the reason; with MINIBROKER_REQUIRE_DOCKER=1 (set by .ci/run) they fail
instead. Each file's project gets a name of its own, so nothing else on the machine is touched,
and it is taken down (`down -v`) whatever happens. Images are kept (their build cache makes the
next run's build take seconds).
"""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import shlex
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from minibroker.client import Admin, Consumer, Producer, TopicPartition

pytestmark = [pytest.mark.integration, pytest.mark.docker]

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "docker-compose.yml"
BRIDGE_FILE = ROOT / "deploy" / "docker-compose.bridge.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
REQUIRE = "MINIBROKER_REQUIRE_DOCKER"
BROKERS = {1: "broker-1", 2: "broker-2", 3: "broker-3"}
BOOTSTRAP = "127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094"
# Every port a container of the compose file listens on (host network): listen, then metrics.
PORTS = (9092, 9093, 9094, 9192, 10092, 10093, 10094, 10192, 11092, 11093, 11094)
# Log lines that must never appear in the pipeline's log.
BAD_LOG = ("Traceback", "Exception in", "StackOverflowError", " ERROR ", "Event loop is closed")

# Spark's own Python streaming-source runner (Spark 4.x,
# pyspark/sql/streaming/python_streaming_source_runner.py) reads the JVM's close of its socket when
# a query stops as an EOFError, tries to report it back over that closed socket (BrokenPipeError),
# and prints the chain to stderr unless the JVM killed it first: a race inside Spark, seen about one
# stop in 15 here, with no frame of ours. Such a traceback is dropped before the check; one with any
# other frame or error still fails it.
_RUNNER_ERRORS = ("EOFError", "BrokenPipeError: [Errno 32] Broken pipe")
_CHAINED = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)


def _is_spark_or_stdlib_frame(frame: str) -> bool:
    """pyspark's own code or Python's standard library; never ours (our wheel is installed in
    the same site-packages as pyspark, and our stream reader runs inside Spark's runner)."""
    if "minibroker" in frame:
        return False
    stdlib = "/lib/python3.11/" in frame and "-packages/" not in frame
    return "/pyspark/" in frame or "<frozen " in frame or stdlib


def _traceback_end(lines: list[str], start: int) -> tuple[int, list[str], list[str]]:
    """Where the traceback (with its chained ones) at `start` ends, its frames and its errors."""
    frames: list[str] = []
    errors: list[str] = []
    i = start
    while i < len(lines) and lines[i].strip() == "Traceback (most recent call last):":
        i += 1
        while i < len(lines) and lines[i].startswith(" "):
            if lines[i].strip().startswith('File "'):
                frames.append(lines[i].strip())
            i += 1
        if i < len(lines):
            errors.append(lines[i].strip())  # the exception line closes each traceback
            i += 1
        j = i
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j < len(lines) and lines[j].strip() in _CHAINED:
            j += 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            i = j
    return i, frames, errors


def _without_spark_runner_shutdown_noise(lines: list[str]) -> list[str]:
    kept: list[str] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "Traceback (most recent call last):":
            kept.append(lines[i])
            i += 1
            continue
        end, frames, errors = _traceback_end(lines, i)
        noise = (
            any("python_streaming_source_runner.py" in f for f in frames)
            and all(_is_spark_or_stdlib_frame(f) for f in frames)
            and all(e in _RUNNER_ERRORS for e in errors)
        )
        if not noise:
            kept.extend(lines[i:end])
        i = end
    return kept


# The user's environment, minus what would change which file, project or profiles Compose uses.
ENV = {
    k: v
    for k, v in os.environ.items()
    if k not in ("COMPOSE_FILE", "COMPOSE_PROJECT_NAME", "COMPOSE_PROFILES")
}
ENV["DOCKER_BUILDKIT"] = "1"  # plain `docker build` on Docker 20.10-22 (the default since 23)


def docker(
    *args: str, timeout: float = 120, check: bool = True, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        ["docker", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
        cwd=ROOT,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"`docker {shlex.join(args)}` exited with {result.returncode}:\n"
            f"{result.stdout}{result.stderr}"
        )
    return result


def unusable(ports: tuple[int, ...] = PORTS) -> str | None:
    """Why the Docker tests cannot run here, or None. `ports`: host ports the project listens
    on (the host-network file's; none for the bridge file, which publishes none it fixes)."""
    if shutil.which("docker") is None:
        return "no `docker` command on PATH"
    try:
        info = docker("info", "--format", "{{.ServerVersion}}", timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 30 s"
    if info.returncode != 0 or not info.stdout.strip():
        first = (info.stderr.strip().splitlines() or ["no output"])[0]
        return f"no Docker engine answers (`docker info`: {first})"
    compose = docker("compose", "version", "--short", timeout=30, check=False)
    if compose.returncode != 0 or not compose.stdout.strip().lstrip("v").startswith("2."):
        return (
            "Compose v2 (`docker compose`) is missing: "
            + (compose.stdout + compose.stderr).strip()[:200]
        )
    # A BuildKit-only flag, and an output that makes no image.
    probe = subprocess.run(
        ["docker", "build", "-q", "--output", "type=tar,dest=/dev/null", "-"],
        input="FROM scratch\n",
        capture_output=True,
        text=True,
        timeout=60,
        env=ENV,
        check=False,
    )
    if probe.returncode != 0:
        return f"this docker CLI cannot build with BuildKit: {probe.stderr.strip()[:200]}"
    busy = [port for port in ports if port_in_use(port)]
    if busy:
        return (
            f"ports {busy} are in use on 127.0.0.1 (a local `minibroker cluster`?); the compose "
            "cluster runs on the host's network and needs them"
        )
    return None


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll until `predicate()` is truthy; an AssertionError ends the wait, other errors retry."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except AssertionError:
            raise
        except Exception as err:
            last = err
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last error: {last!r})")


class Compose:
    """`docker compose -f FILE -p PROJECT ...` (deploy/docker-compose.yml unless told)."""

    def __init__(
        self,
        project: str,
        file: pathlib.Path = COMPOSE_FILE,
        profiles: tuple[str, ...] = ("spark",),
    ) -> None:
        self.project = project
        self.file = file
        # Every profile of the file: `ps`, `logs` and `down` see (and remove) their services too.
        self.all_profiles = [arg for profile in profiles for arg in ("--profile", profile)]
        self.timings: dict[str, float] = {}

    def run(self, *args: str, timeout: float = 600, input: str | None = None) -> str:
        base = ("compose", "-f", str(self.file), "-p", self.project)
        return docker(*base, *args, timeout=timeout, input=input).stdout

    def up(self, *services: str, profiles: tuple[str, ...] = ()) -> float:
        """`up --build -d --wait`: rebuilds what changed, returns the seconds it took."""
        flags = [arg for profile in profiles for arg in ("--profile", profile)]
        started = time.monotonic()
        self.run(*flags, "up", "--build", "-d", "--wait", *services)
        return time.monotonic() - started

    def ps(self) -> dict[str, dict[str, Any]]:
        out = self.run(*self.all_profiles, "ps", "-a", "--format", "json").strip()
        # One JSON object per line (Compose >= 2.21) or one JSON array (older v2).
        rows = json.loads(out) if out.startswith("[") else [json.loads(x) for x in out.splitlines()]
        return {row["Service"]: row for row in rows}

    def exit_code(self, service: str) -> int:
        container = self.ps()[service]["ID"]
        return int(docker("inspect", "-f", "{{.State.ExitCode}}", container).stdout)

    def healthy(self, service: str) -> bool:
        return self.ps().get(service, {}).get("Health") == "healthy"

    def logs(self, service: str) -> str:
        return self.run(*self.all_profiles, "logs", "--no-color", "--no-log-prefix", service)

    def leftovers(self) -> list[str]:
        label = f"label=com.docker.compose.project={self.project}"
        containers = docker("ps", "-a", "-q", "--filter", label).stdout.split()
        volumes = docker("volume", "ls", "-q", "--filter", label).stdout.split()
        networks = docker("network", "ls", "-q", "--filter", label).stdout.split()
        return (
            [f"container {c}" for c in containers]
            + [f"volume {v}" for v in volumes]
            + [f"network {n}" for n in networks]
        )

    def down(self) -> None:
        self.run(*self.all_profiles, "down", "-v", "--remove-orphans", "--timeout", "30")


def remove_replaced_test_images() -> None:
    """Drop the untagged images earlier runs of these tests built.

    Compose labels an image with the project that built it, so every run (a project of its own)
    tags a new image ID, and the previous run's image is left untagged. Its layers are the new
    one's, so only the entry goes; images of other projects are left alone.
    """
    label = "com.docker.compose.project"
    found = docker("images", "-q", "--filter", "dangling=true", "--filter", f"label={label}")
    for image in sorted(set(found.stdout.split())):
        project = docker(
            "image", "inspect", "-f", f'{{{{index .Config.Labels "{label}"}}}}', image, check=False
        ).stdout.strip()
        if project.startswith("minibroker-test-"):
            docker("rmi", image, check=False)


def project_of(
    kind: str, file: pathlib.Path, profiles: tuple[str, ...], ports: tuple[int, ...]
) -> Iterator[Compose]:
    """A project of its own for `file` (container, network and volume names start with it),
    unique per run, taken down whatever happens; skipped (or failed, with REQUIRE) without
    Docker."""
    reason = unusable(ports)
    if reason is not None:
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{REQUIRE}=1 but Docker cannot run here: {reason}")
        pytest.skip(reason)
    project = f"minibroker-test-{kind}{os.getpid()}-{secrets.token_hex(3)}"
    c = Compose(project, file, profiles)
    try:
        yield c
    finally:
        c.down()
        remove_replaced_test_images()
        print(f"\ndocker test timings (s): {json.dumps(c.timings)}")
        assert not c.leftovers(), f"`down -v` left {c.leftovers()}"


@pytest.fixture(scope="module")
def compose() -> Iterator[Compose]:
    yield from project_of("", COMPOSE_FILE, ("spark",), PORTS)


@pytest.fixture(scope="module")
def bridge() -> Iterator[Compose]:
    """deploy/docker-compose.bridge.yml: no host port of its own, so no port check."""
    yield from project_of("bridge-", BRIDGE_FILE, ("cli", "spark"), ())


def describe(admin: Admin, topic: str) -> list[Any]:
    (description,) = admin.describe_topics([topic], include_offsets=False)
    return list(description.partitions)


def read_values(bootstrap: str, topic: str) -> list[bytes]:
    """Every record of `topic` up to the end offsets taken first, in partition order."""
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        ends = consumer.end_offsets(tps)
        seen = dict.fromkeys(tps, 0)
        values: list[bytes] = []
        deadline = time.monotonic() + 60
        while any(seen[tp] < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"read {seen} of {ends}"
            for r in consumer.poll(timeout_ms=300):
                tp = TopicPartition(r.topic, r.partition)
                if r.offset < ends[tp]:
                    values.append(r.value)
                    seen[tp] = r.offset + 1
        return values


class AcksAllProducer:
    """Sends numbered records with acks=all in a thread, 50 at a time, and keeps the numbers of
    those acknowledged."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.acked: set[int] = set()
        self.failed = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="acks-all-producer", daemon=True)

    def _run(self) -> None:
        try:
            with Producer(BOOTSTRAP, acks="all") as producer:
                n = 0
                while not self.stop.is_set():
                    sent = [
                        (i, producer.send(self.topic, str(i).encode(), key=str(i).encode()))
                        for i in range(n, n + 50)
                    ]
                    n += 50
                    producer.flush()
                    for i, future in sent:
                        if future.exception() is None:
                            self.acked.add(i)
                        else:
                            self.failed += 1
                    self.stop.wait(0.02)  # pacing, so the records stay a few tens of thousands
        except BaseException as err:  # reported by the test
            self.error = err

    def __enter__(self) -> AcksAllProducer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=180)

    def acked_count(self) -> int:
        assert self.error is None, f"the producer failed: {self.error!r}"
        return len(self.acked)


# -- the tests -------------------------------------------------------------------------------------


@pytest.mark.timeout(900)
def test_each_docker_build_line_of_the_header_builds_its_image(compose: Compose) -> None:
    """The commands the Dockerfile's header gives, run as written (with tags of the test's own):
    without --target the server image, with --target spark the pipeline's."""
    lines = [
        line.lstrip("#").strip()
        for line in DOCKERFILE.read_text().splitlines()
        if line.lstrip("#").strip().startswith("docker build")
    ]
    assert len(lines) == 2, lines
    for line in lines:
        argv = shlex.split(line, comments=True)
        target = argv[argv.index("--target") + 1] if "--target" in argv else None
        tag = f"{compose.project}-{target or 'default'}:test"
        argv[argv.index("-t") + 1] = tag
        started = time.monotonic()
        docker(*argv[1:], timeout=900)
        compose.timings[f"docker build {target or '(no target)'}"] = time.monotonic() - started
        try:
            config = json.loads(docker("image", "inspect", "-f", "{{json .Config}}", tag).stdout)
        finally:
            docker("rmi", tag, check=False)  # its layers are shared with the compose images
        env = dict(e.split("=", 1) for e in config["Env"])
        assert config["User"] == "minibroker", line
        if target is None:
            assert config["Cmd"] == ["minibroker", "--help"], f"`{line}` built {config['Cmd']}"
            assert "JAVA_HOME" not in env, f"`{line}` built an image with a JRE"
        else:
            assert target == "spark"
            assert config["Cmd"][:2] == ["python", "/opt/minibroker/examples/pipeline.py"]
            assert "JAVA_HOME" in env


@pytest.mark.timeout(600)
def test_leader_kill_loses_nothing_acknowledged_and_the_broker_rejoins(compose: Compose) -> None:
    compose.timings["up --build -d --wait"] = compose.up()
    topic = "docker-failover"
    with Admin(BOOTSTRAP) as admin:
        registered = {b.broker_id: (b.host, b.port) for b in admin.describe_cluster().brokers}
        assert registered == {
            1: ("127.0.0.1", 9092),
            2: ("127.0.0.1", 9093),
            3: ("127.0.0.1", 9094),
        }
        admin.create_topic(topic, 3, 3, {"min.insync.replicas": "2"})
        wait_until(
            lambda: all(set(p.isr) == {1, 2, 3} for p in describe(admin, topic)), 60, "full ISRs"
        )
        before = {p.partition: p for p in describe(admin, topic)}
        victim = before[0].leader
        led = [p for p in before.values() if p.leader == victim]

        with AcksAllProducer(topic) as producer:
            wait_until(lambda: producer.acked_count() >= 1000, 60, "1000 records acknowledged")
            killed_at = time.monotonic()
            compose.run("kill", BROKERS[victim])

            def elected() -> bool:
                now = {p.partition: p for p in describe(admin, topic)}
                return all(
                    now[p.partition].leader not in (victim, -1)
                    and now[p.partition].leader_epoch > p.leader_epoch
                    and victim not in now[p.partition].isr
                    for p in led
                )

            wait_until(elected, 60, f"new leaders for the partitions broker {victim} led")
            compose.timings["kill issued -> new leaders seen"] = time.monotonic() - killed_at
            assert compose.ps()[BROKERS[victim]]["State"] == "exited", "restart must stay 'no'"
            # Records acknowledged after the election: the producer carried on.
            after = producer.acked_count()
            wait_until(lambda: producer.acked_count() >= after + 1000, 60, "acks after failover")
        acked = producer.acked_count()

        compose.run("start", BROKERS[victim])
        started_at = time.monotonic()
        wait_until(lambda: compose.healthy(BROKERS[victim]), 60, f"{BROKERS[victim]} healthy")
        wait_until(
            lambda: all(set(p.isr) == {1, 2, 3} for p in describe(admin, topic)),
            60,
            f"broker {victim} back in every ISR",
        )
        compose.timings["start -> back in every ISR"] = time.monotonic() - started_at

        values = read_values(BOOTSTRAP, topic)
        numbers = [int(v) for v in values]
        assert len(numbers) == len(set(numbers)), "a record was stored twice"
        lost = producer.acked - set(numbers)
        assert not lost, f"{len(lost)} acknowledged records lost, e.g. {sorted(lost)[:10]}"
        compose.timings["records acknowledged"] = acked
        compose.timings["records failed (not acknowledged)"] = producer.failed

        # A graceful stop of a broker that leads partitions: controlled shutdown, exit 0.
        leaders = {p.leader for p in describe(admin, topic)}
        stopped = min(leaders)
        compose.run("stop", BROKERS[stopped])
        assert compose.exit_code(BROKERS[stopped]) == 0, compose.logs(BROKERS[stopped])[-3000:]
        assert '"controlled_shutdown_granted"' in compose.logs(BROKERS[stopped])
        now = describe(admin, topic)
        assert all(p.leader not in (stopped, -1) for p in now), now
        compose.run("start", BROKERS[stopped])
        wait_until(lambda: compose.healthy(BROKERS[stopped]), 60, f"{BROKERS[stopped]} healthy")


def latest_totals(bootstrap: str, topic: str) -> dict[str, int]:
    """The pipeline's output as its readers see it: per user, the largest event count."""
    latest: dict[str, int] = {}
    for value in read_values(bootstrap, topic):
        total = json.loads(value)
        latest[total["user"]] = max(latest.get(total["user"], 0), total["events"])
    return latest


@pytest.mark.timeout(900)
def test_spark_pipeline_stops_with_exit_0_and_restarts_without_new_samples(
    compose: Compose,
) -> None:
    compose.up()
    started = time.monotonic()
    compose.up("pipeline", profiles=("spark",))
    compose.timings["spark profile up (build + start)"] = time.monotonic() - started

    def caught_up() -> bool:
        state = compose.ps()["pipeline"]["State"]
        assert state == "running", f"pipeline {state}:\n{compose.logs('pipeline')[-3000:]}"
        totals = latest_totals(BOOTSTRAP, "demo-results")
        return sum(totals.values()) >= 1000

    wait_until(caught_up, 300, "totals over the 1000 sample events")
    compose.timings["pipeline up -> totals written"] = time.monotonic() - started
    for run in (1, 2):
        compose.run("--profile", "spark", "stop", "pipeline")
        log = compose.logs("pipeline")
        assert compose.exit_code("pipeline") == 0, log[-3000:]
        lines = _without_spark_runner_shutdown_noise(log.splitlines())
        bad = [i for i, line in enumerate(lines) if any(b in line for b in BAD_LOG)]
        # Each bad line with what follows it (a traceback's frames and its error).
        assert not bad, "\n---\n".join("\n".join(lines[i : i + 30]) for i in bad[:5])
        assert log.count("pipeline: stopped on SIGTERM") == run, log[-3000:]
        if run == 1:
            compose.run("--profile", "spark", "start", "pipeline")
            # The container's log holds both runs: wait for the second query to start.
            wait_until(
                lambda: compose.logs("pipeline").count("pipeline: demo-events ->") == 2,
                300,
                "the restarted query",
            )
            second_run = compose.logs("pipeline").split("generate:")[-1]
            assert second_run.startswith(" wrote 0 sample events"), "the restart wrote samples"
    assert sum(latest_totals(BOOTSTRAP, "demo-results").values()) == 1000


def test_down_removes_every_container_and_volume(compose: Compose) -> None:
    compose.up()
    assert compose.leftovers(), "nothing to remove: the project is not up"
    compose.down()
    assert compose.leftovers() == []


_SPARK = "/usr/local/lib/python3.11/site-packages/pyspark/python/lib/pyspark.zip/pyspark"
# The chain Spark's runner printed on a stop (tracebacks' source lines left out for length).
RUNNER_NOISE = [
    "Traceback (most recent call last):",
    f'  File "{_SPARK}/sql/streaming/python_streaming_source_runner.py", line 265, in main',
    f'  File "{_SPARK}/serializers.py", line 604, in read_int',
    "EOFError",
    "",
    "During handling of the above exception, another exception occurred:",
    "",
    "Traceback (most recent call last):",
    f'  File "{_SPARK}/sql/streaming/python_streaming_source_runner.py", line 299, in main',
    '  File "/usr/lib/python3.11/socket.py", line 724, in write',
    "    return self._sock.send(b)",
    "BrokenPipeError: [Errno 32] Broken pipe",
]


def test_only_sparks_runner_shutdown_traceback_is_dropped_from_the_check() -> None:
    around = ["pipeline: demo-events -> demo-results", "pipeline: stopped on SIGTERM"]
    assert _without_spark_runner_shutdown_noise([*around, *RUNNER_NOISE, "x"]) == [*around, "x"]
    other_error = [*RUNNER_NOISE[:-1], "ValueError: boom"]
    assert _without_spark_runner_shutdown_noise(other_error) == other_error
    our_frame = list(RUNNER_NOISE)
    # Where the Spark image installs our wheel, beside pyspark.
    ours = "/usr/local/lib/python3.11/site-packages/minibroker/client/spark/source.py"
    our_frame.insert(2, f'  File "{ours}", line 9, in latestOffset')
    assert _without_spark_runner_shutdown_noise(our_frame) == our_frame


# -- deploy/docker-compose.bridge.yml: a bridge network, advertised names --------------------------

BRIDGE_ADDRESSES = {1: ("broker-1", 9092), 2: ("broker-2", 9092), 3: ("broker-3", 9092)}
# Run with `python -` in a cli container: each named broker's Metadata answer, as JSON. The
# addresses in it are what every client is handed (the client library reads nothing else).
METADATA_SCRIPT = """
import json, sys
import grpc
from minibroker.proto import minibroker_pb2 as pb, minibroker_pb2_grpc as pb_grpc
answers = {}
for address in sys.argv[1:]:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.BrokerServiceStub(channel)
        r = stub.Metadata(pb.MetadataRequest(all_topics=True), timeout=10)
    answers[address] = {
        "brokers": {b.node_id: [b.host, b.port] for b in r.brokers},
        "controller": [r.controller_host, r.controller_port],
    }
print(json.dumps(answers))
"""


def cli(bridge: Compose, command: str, input: str | None = None) -> str:
    """`docker compose run --rm -T cli COMMAND`: a command in a new container on the cluster's
    network, with $MINIBROKER_BOOTSTRAP_SERVER naming the brokers, as the file's header shows."""
    return bridge.run("run", "--rm", "-T", "cli", *shlex.split(command), input=input, timeout=180)


def produce_keyed(bridge: Compose, topic: str, numbers: range) -> list[dict[str, int]]:
    """`minibroker produce --acks all` of KEY:VALUE lines (the number as both, so the records
    spread over every partition); one {partition, offset} per acknowledged record."""
    lines = "".join(f"{i}:{i}\n" for i in numbers)
    out = cli(bridge, f"minibroker produce {topic} --acks all --key-separator : --json", lines)
    return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.mark.timeout(300)
def test_bridge_network_advertised_names_and_a_leader_kill_between_containers(
    bridge: Compose,
) -> None:
    """The bridge variant: brokers listen on 0.0.0.0 and advertise their service names, clients
    run in containers on the network; acks=all records survive a SIGKILL of a leader's
    container; `down -v` removes every container, volume and the network."""
    bridge.timings["bridge: up --build -d --wait"] = bridge.up()
    topic, n = "bridge-failover", 300

    # What clients are handed: service names, never the wildcard or loopback the brokers bind.
    names = [f"{host}:{port}" for host, port in BRIDGE_ADDRESSES.values()]
    answers = json.loads(cli(bridge, f"python - {' '.join(names)}", METADATA_SCRIPT))
    for address, answer in answers.items():
        brokers = {int(k): tuple(v) for k, v in answer["brokers"].items()}
        assert brokers == BRIDGE_ADDRESSES, f"{address} hands out {brokers}"
        host, port = answer["controller"]
        assert host in ("controller-1", "controller-2", "controller-3") and port == 9093, answer
    listed = json.loads(cli(bridge, "minibroker brokers list --json"))
    assert {b["broker_id"]: (b["host"], b["port"]) for b in listed} == BRIDGE_ADDRESSES
    assert {b["state"] for b in listed} == {"active"}, listed

    # Nothing is published on the host; the metrics answer inside the container (`exec`).
    for service, row in bridge.ps().items():
        published = [p for p in row.get("Publishers") or [] if p.get("PublishedPort")]
        assert not published, f"{service} publishes {published}"
    metrics = bridge.run(
        *shlex.split("exec -T broker-1 python -c"),
        "import urllib.request as u; print(u.urlopen('http://127.0.0.1:10092/metrics').read())",
    )
    assert "# TYPE" in metrics

    cli(
        bridge,
        f"minibroker topics create {topic} --partitions 3 --replication-factor 3 "
        "--config min.insync.replicas=2",
    )
    acked = produce_keyed(bridge, topic, range(n))
    assert len(acked) == n and {a["partition"] for a in acked} == {0, 1, 2}

    def partitions() -> dict[int, dict[str, Any]]:
        out = cli(bridge, f"minibroker topics describe {topic} --json")
        return {p["partition"]: p for p in json.loads(out)}

    before = partitions()
    assert all(set(p["isr"]) == {1, 2, 3} for p in before.values()), before
    victim = before[0]["leader"]
    led = [p for p in before.values() if p["leader"] == victim]

    killed_at = time.monotonic()
    bridge.run("kill", BROKERS[victim])
    assert bridge.ps()[BROKERS[victim]]["State"] == "exited", "restart must stay 'no'"
    # The producer's records for the victim's partitions wait for their new leaders.
    acked += produce_keyed(bridge, topic, range(n, 2 * n))
    bridge.timings["bridge: kill -> 300 more acks=all records acknowledged"] = (
        time.monotonic() - killed_at
    )
    assert len(acked) == 2 * n
    after = partitions()
    for p in led:
        now = after[p["partition"]]
        assert now["leader"] not in (victim, -1), now
        assert now["leader_epoch"] > p["leader_epoch"] and victim not in now["isr"], now

    out = cli(
        bridge,
        f"minibroker consume {topic} --from-beginning --max-messages {2 * n} "
        "--timeout-ms 20000 --json",
    )
    numbers = [int(json.loads(line)["value"]) for line in out.splitlines() if line.strip()]
    assert len(numbers) == len(set(numbers)), "a record was stored twice"
    assert sorted(numbers) == list(range(2 * n)), (
        f"acknowledged records lost: {sorted(set(range(2 * n)) - set(numbers))[:10]}"
    )
    survivors = [f"{h}:{p}" for i, (h, p) in BRIDGE_ADDRESSES.items() if i != victim]
    answers = json.loads(cli(bridge, f"python - {' '.join(survivors)}", METADATA_SCRIPT))
    for address, answer in answers.items():
        brokers = {int(k): tuple(v) for k, v in answer["brokers"].items()}
        assert set(brokers.items()) <= set(BRIDGE_ADDRESSES.items()), f"{address}: {brokers}"

    started = time.monotonic()
    bridge.down()
    bridge.timings["bridge: down -v"] = time.monotonic() - started
    assert bridge.leftovers() == []
