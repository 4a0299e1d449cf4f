"""A real controller quorum for the process tests: N `minibroker controller` voters on 127.0.0.1.

Ports are picked free up front (every voter must name every other's address before any starts),
one cluster id is made for all, each voter has its own data dir, and every process is killed by
PID when the test ends. Calls are plain synchronous gRPC, so a test sees exactly what a client
sees: NOT_CONTROLLER with its leader hint, DescribeQuorum from any voter.
"""

from __future__ import annotations

import base64
import contextlib
import json
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
from cluster_harness import wait_until

from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

CONTROLLER_CMD = [sys.executable, "-m", "minibroker.deploy", "controller"]
# Short timers so the tests fail over quickly (the defaults are 1000/2000/1000 ms).
FAST = {
    "controller.quorum.election.timeout.ms": "300",
    "controller.quorum.fetch.timeout.ms": "600",
    "controller.quorum.election.backoff.max.ms": "300",
}


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def not_controller_hint(err: grpc.RpcError) -> str | None:
    """The leader hint of a NOT_CONTROLLER answer ("" when none), None for another error."""
    trailers = dict(err.trailing_metadata() or ())  # type: ignore[attr-defined]
    if trailers.get("minibroker-error") != "NOT_CONTROLLER":
        return None
    return str(trailers.get("minibroker-controller-leader", ""))


class Voter:
    def __init__(self, quorum: Quorum, node_id: int, port: int) -> None:
        self.quorum = quorum
        self.node_id = node_id
        self.port = port
        self.data_dir = quorum.root / f"controller-{node_id}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0
        self.settings: dict[str, str] = {}
        # --metrics-port 0 (any free port): read back from this run's controller_started event.
        self.metrics = False
        self._channel: grpc.Channel | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> pathlib.Path:
        return self.quorum.root / f"controller-{self.node_id}-{self.runs}.log"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, **overrides: str) -> None:
        self.runs += 1
        settings = {
            "controller.quorum.voters": self.quorum.voters_text,
            "cluster.id": self.quorum.cluster_id,
            **self.quorum.settings,
            **self.settings,
            **overrides,
        }
        args = [
            *CONTROLLER_CMD,
            "--data-dir",
            str(self.data_dir),
            "--listen",
            self.address,
            "--node-id",
            str(self.node_id),
            "--log-format",
            "json",
        ]
        if self.metrics:
            args += ["--metrics-port", "0"]
        for key, value in settings.items():
            args += ["--set", f"{key}={value}"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def signal(self, sig: signal.Signals) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.close_channel()

    def terminate(self, timeout_s: float = 15.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout_s)
        self.close_channel()
        return rc

    def wipe(self) -> None:
        """Delete this (stopped) voter's data dir: a voter that lost its disk."""
        assert not self.running, "wipe a stopped voter"
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def close_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.address)
        return self._channel

    def controller(self) -> pb_grpc.ControllerServiceStub:
        return pb_grpc.ControllerServiceStub(self.channel())

    def describe_quorum(self, timeout_s: float = 2.0) -> pb.DescribeQuorumResponse:
        stub = pb_grpc.QuorumServiceStub(self.channel())
        return stub.DescribeQuorum(pb.DescribeQuorumRequest(), timeout=timeout_s)

    def logs(self, run: int | None = None) -> list[dict[str, Any]]:
        runs = [run] if run is not None else range(1, self.runs + 1)
        out = []
        for r in runs:
            path = self.quorum.root / f"controller-{self.node_id}-{r}.log"
            if not path.exists():
                continue
            for line in path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def events(self, name: str, run: int | None = None) -> list[dict[str, Any]]:
        return [e for e in self.logs(run) if e.get("event") == name]

    def output(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def metrics_port(self) -> int:
        """This run's Prometheus port (started with metrics on), once it has logged it."""
        started = self.events("controller_started", self.runs)
        return int(started[-1]["metrics_port"]) if started else -1

    def scrape(self, timeout_s: float = 2.0) -> dict[str, float]:
        """This run's /metrics as {name{labels}: value} (comments and blank lines dropped)."""
        port = self.metrics_port()
        assert port > 0, f"voter {self.node_id} has no metrics port yet"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


class Quorum:
    def __init__(
        self,
        root: pathlib.Path,
        size: int,
        settings: dict[str, str] | None = None,
        *,
        metrics: bool = False,
    ):
        self.root = root
        self.cluster_id = new_cluster_id()
        self.settings = dict(FAST, **(settings or {}))
        ports = free_ports(size)
        self.voters = [Voter(self, 1000 + i, ports[i]) for i in range(size)]
        for voter in self.voters:
            voter.metrics = metrics
        self.voters_text = ",".join(f"{v.node_id}@127.0.0.1:{v.port}" for v in self.voters)

    def voter(self, node_id: int) -> Voter:
        return next(v for v in self.voters if v.node_id == node_id)

    def start(self) -> None:
        for voter in self.voters:
            voter.start()

    def stop(self) -> None:
        for voter in self.voters:
            voter.kill()

    def views(self) -> dict[int, pb.DescribeQuorumResponse]:
        out = {}
        for voter in self.voters:
            if not voter.running:
                continue
            with contextlib.suppress(grpc.RpcError):
                out[voter.node_id] = voter.describe_quorum(timeout_s=1.0)
        return out

    def leader(self, *, other_than: int | None = None, above_epoch: int = -1) -> Voter | None:
        """The voter every running voter names as leader, once that leader is active (its
        DescribeCluster answers), or None."""
        views = self.views()
        leaders = {(v.leader_id, v.leader_epoch) for v in views.values() if v.leader_id >= 0}
        if len(leaders) != 1 or len(views) < len(self.running()):
            return None
        leader_id, epoch = leaders.pop()
        if leader_id == other_than or epoch <= above_epoch:
            return None
        voter = self.voter(leader_id)
        if not voter.running:
            return None
        try:
            voter.controller().DescribeCluster(pb.DescribeClusterRequest(), timeout=2)
        except grpc.RpcError:
            return None
        return voter

    def wait_leader(
        self, timeout_s: float = 30.0, *, other_than: int | None = None, above_epoch: int = -1
    ) -> Voter:
        return wait_until(
            lambda: self.leader(other_than=other_than, above_epoch=above_epoch),
            timeout_s,
            f"one active controller (other than {other_than}, epoch > {above_epoch})",
        )

    def leading_now(self, timeout_s: float = 30.0) -> tuple[Voter, int]:
        """(the active controller, its epoch), read from the leader itself just before a test
        kills, pauses or stops it. A leader found earlier may have lost its epoch since (the
        short test timers fire on a loaded machine), and a test that then stops a follower
        waits for an election that never comes."""

        def attempt() -> tuple[Voter, int] | None:
            voter = self.leader()
            if voter is None:
                return None
            view = voter.describe_quorum()
            if view.role != "leader" or view.leader_id != voter.node_id:
                return None
            return voter, view.leader_epoch

        return wait_until(attempt, timeout_s, "a controller that says it leads")

    def running(self) -> list[Voter]:
        return [v for v in self.voters if v.running]

    def epoch(self) -> int:
        return max((v.leader_epoch for v in self.views().values()), default=-1)

    def call(self, method: str, request: Any, timeout_s: float = 30.0) -> Any:
        """A ControllerService call on whoever is active, as a client does: NOT_CONTROLLER or
        an unreachable voter sends it to the next one, until one answers or the deadline."""

        def attempt() -> Any:
            for voter in self.running():
                try:
                    return getattr(voter.controller(), method)(request, timeout=3)
                except grpc.RpcError:
                    continue
            return None

        return wait_until(attempt, timeout_s, f"{method} answered")

    def register(self, broker_id: int, timeout_s: float = 30.0) -> pb.BrokerRegistrationResponse:
        """Register a (never heartbeating) broker: one acknowledged metadata change."""
        reply = self.call(
            "RegisterBroker",
            pb.BrokerRegistrationRequest(
                broker_id=broker_id,
                cluster_id=self.cluster_id,
                incarnation_id=uuid.uuid4().hex,
                host="127.0.0.1",
                port=40000 + broker_id,
                previous_broker_epoch=-1,
                metrics_port=-1,
            ),
            timeout_s,
        )
        assert reply.error_code == pb.NONE, reply
        return reply

    def image(self, voter: Voter) -> Any:
        """`voter`'s committed metadata image, read with WatchMetadata (it must be active)."""
        from minibroker.metadata.image import MetadataImage
        from minibroker.metadata.wire import apply_batch

        stub = voter.controller()
        target = stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=5).metadata_offset
        image = MetadataImage()
        call = stub.WatchMetadata(pb.WatchMetadataRequest(from_offset=0, broker_id=-1))
        try:
            for batch in call:
                apply_batch(image, batch)
                if image.next_offset >= target:
                    break
        finally:
            call.cancel()
        return image


@contextlib.contextmanager
def running_quorum(
    root: pathlib.Path, size: int, settings: dict[str, str] | None = None, *, metrics: bool = False
) -> Iterator[Quorum]:
    quorum = Quorum(root, size, settings, metrics=metrics)
    try:
        quorum.start()
        yield quorum
    finally:
        quorum.stop()


__all__ = ["FAST", "Quorum", "Voter", "free_ports", "not_controller_hint", "running_quorum"]
