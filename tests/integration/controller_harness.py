"""A real controller process and fake brokers for the controller's process tests.

`ControllerProcess` runs `python -m minibroker.deploy controller` on 127.0.0.1 with port 0, a
port file and a tmp data dir, and kills it by PID. `FakeBroker` is test code acting as a broker
over gRPC: it registers, follows WatchMetadata into a `MetadataImage`, and keeps a heartbeat
stream open reporting the offset it has applied. Run this file as a script to get a fake broker
in its own process (so a test can SIGKILL or SIGSTOP it); it prints one JSON line per state change
and does a controlled shutdown on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from cluster_harness import wait_until

from minibroker.metadata.image import MetadataImage
from minibroker.metadata.wire import apply_batch
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

CONTROLLER_CMD = [sys.executable, "-m", "minibroker.deploy", "controller"]
HARNESS_FILE = pathlib.Path(__file__).resolve()


class ControllerProcess:
    def __init__(self, data_dir: pathlib.Path, settings: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.settings = settings or {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = -1
        self.runs = 0
        self.channel: grpc.Channel | None = None
        self.stub: pb_grpc.ControllerServiceStub | None = None
        self._tag = uuid.uuid4().hex[:8]  # log and port files never clash between processes

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> pathlib.Path:
        return self.data_dir.parent / f"controller-{self._tag}-{self.runs}.log"

    def start(self, timeout_s: float = 20.0) -> None:
        self.runs += 1
        port_file = self.data_dir.parent / f"controller-{self._tag}-{self.runs}.port"
        args = [
            *CONTROLLER_CMD,
            "--data-dir",
            str(self.data_dir),
            "--listen",
            "127.0.0.1:0",
            "--port-file",
            str(port_file),
            "--metrics-port",
            "0",
            "--log-format",
            "json",
        ]
        for key, value in self.settings.items():
            args += ["--set", f"{key}={value}"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"controller exited: {self.log_path.read_text()[-2000:]}")
            return port_file.exists() and port_file.read_text().endswith("\n")

        wait_until(ready, timeout_s, "controller port file")
        self.port = int(port_file.read_text())
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.ControllerServiceStub(self.channel)

    def _close_channel(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self._close_channel()

    def terminate(self, timeout_s: float = 15.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout_s)
        self._close_channel()
        return rc

    def logs(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.logs() if e.get("event") == name]

    def describe(self) -> pb.DescribeClusterResponse:
        assert self.stub is not None
        return self.stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=5)

    def broker(self, broker_id: int) -> pb.ClusterBroker | None:
        return next((b for b in self.describe().brokers if b.broker_id == broker_id), None)

    def is_fenced(self, broker_id: int) -> bool:
        b = self.broker(broker_id)
        return b is not None and b.fenced

    def is_unfenced(self, broker_id: int) -> bool:
        b = self.broker(broker_id)
        return b is not None and not b.fenced

    def snapshot_image(self) -> MetadataImage:
        """The controller's committed image, read with WatchMetadata from offset 0."""
        assert self.stub is not None
        target = self.describe().metadata_offset
        image = MetadataImage()
        call = self.stub.WatchMetadata(pb.WatchMetadataRequest(from_offset=0, broker_id=-1))
        try:
            for batch in call:
                apply_batch(image, batch)
                if image.next_offset >= target:
                    break
        finally:
            call.cancel()
        return image


class FakeBroker:
    """Test code acting as a broker over gRPC (sync API, background threads)."""

    def __init__(
        self,
        address: str,
        broker_id: int,
        *,
        rack: str = "",
        cluster_id: str = "",
        interval_s: float = 0.1,
        on_change: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.address = address
        self.broker_id = broker_id
        self.rack = rack
        self.cluster_id = cluster_id
        self.interval_s = interval_s
        self.incarnation_id = uuid.uuid4().hex
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.ControllerServiceStub(self.channel)
        self.image = MetadataImage()
        self.broker_epoch = -1
        self.want_shut_down = False
        self.last_reply: pb.BrokerHeartbeatResponse | None = None
        self.should_shut_down = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._heartbeat_call: Any = None
        self._watch_call: Any = None
        self._on_change = on_change or (lambda event, fields: None)

    def register(self, incarnation_id: str | None = None) -> pb.BrokerRegistrationResponse:
        reply = self.stub.RegisterBroker(
            pb.BrokerRegistrationRequest(
                broker_id=self.broker_id,
                cluster_id=self.cluster_id,
                incarnation_id=incarnation_id or self.incarnation_id,
                host="127.0.0.1",
                port=19000 + self.broker_id,
                rack=self.rack,
                previous_broker_epoch=-1,
                metrics_port=-1,
            ),
            timeout=5,
        )
        if reply.error_code == 0:
            self.broker_epoch = reply.broker_epoch
            self.cluster_id = reply.cluster_id
        return reply

    def start(self) -> FakeBroker:
        reply = self.register()
        if reply.error_code != 0:
            raise AssertionError(f"registration failed: {reply}")
        for target in (self._watch_loop, self._heartbeat_loop):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def metadata_offset(self) -> int:
        with self._lock:
            return self.image.next_offset

    def _watch_loop(self) -> None:
        self._watch_call = self.stub.WatchMetadata(
            pb.WatchMetadataRequest(from_offset=0, broker_id=self.broker_id)
        )
        with contextlib.suppress(grpc.RpcError):
            for batch in self._watch_call:
                with self._lock:
                    apply_batch(self.image, batch)

    def _requests(self) -> Iterator[pb.BrokerHeartbeatRequest]:
        while not self._stop.is_set():
            yield pb.BrokerHeartbeatRequest(
                broker_id=self.broker_id,
                broker_epoch=self.broker_epoch,
                current_metadata_offset=self.metadata_offset(),
                want_fence=False,
                want_shut_down=self.want_shut_down,
            )
            self._stop.wait(self.interval_s)

    def _heartbeat_loop(self) -> None:
        self._heartbeat_call = self.stub.Heartbeat(self._requests())
        fenced: bool | None = None
        with contextlib.suppress(grpc.RpcError):
            for reply in self._heartbeat_call:
                self.last_reply = reply
                if reply.is_fenced != fenced:
                    fenced = reply.is_fenced
                    self._on_change("fence_state", {"fenced": fenced, "epoch": self.broker_epoch})
                if reply.should_shut_down:
                    self.should_shut_down.set()
                    self._on_change("shutdown_granted", {})
                    return

    @property
    def is_fenced(self) -> bool:
        return self.last_reply is None or self.last_reply.is_fenced

    def close_stream(self) -> None:
        """End the heartbeat stream as a dying process would (the RPC is cancelled)."""
        if self._heartbeat_call is not None:
            self._heartbeat_call.cancel()

    def stop(self) -> None:
        self._stop.set()
        for call in (self._heartbeat_call, self._watch_call):
            if call is not None:
                call.cancel()
        for t in self._threads:
            t.join(5)
        self.channel.close()


class FakeBrokerProcess:
    """A FakeBroker in its own process, started by running this file."""

    def __init__(self, address: str, broker_id: int, log_dir: pathlib.Path) -> None:
        self.broker_id = broker_id
        self.out_path = log_dir / f"fake-broker-{broker_id}-{uuid.uuid4().hex[:6]}.out"
        with open(self.out_path, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(HARNESS_FILE),
                    "--controller",
                    address,
                    "--broker-id",
                    str(broker_id),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.out_path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def _main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--controller", required=True)
    parser.add_argument("--broker-id", type=int, required=True)
    args = parser.parse_args()
    events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()

    def emit(event: str, fields: dict[str, Any]) -> None:
        print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)
        events.put((event, fields))

    broker = FakeBroker(args.controller, args.broker_id, on_change=emit)
    signal.signal(signal.SIGTERM, lambda *_: setattr(broker, "want_shut_down", True))
    broker.start()
    emit("registered", {"epoch": broker.broker_epoch})
    broker.should_shut_down.wait()
    broker.stop()
    emit("exiting", {})
    return 0


if __name__ == "__main__":
    sys.exit(_main())
