"""The local cluster launcher (the embedded default): a controller and N brokers as processes.

I/O shell: starts, signals and inspects processes, and keeps the cluster's layout in
`<dir>/cluster.json` (ports, data dirs, log files, PIDs) so every `minibroker cluster ...`
command, and the client CLI's default bootstrap, find the same cluster. Everything lives under
`--dir` (default `.minibroker`): `controller/` and `broker-N/` each hold `data/` and `process.log`.

A process is identified by its PID *and* its command line (the data dir is in it), so a PID that
the kernel reused for something else is never signalled.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

STATE_FILE = "cluster.json"
DEFAULT_DIR = ".minibroker"
CONTROLLER_ID = "controller"


class LauncherError(Exception):
    """Something the user asked cannot be done; the message says why and what to do."""


@dataclass(slots=True)
class ProcessSpec:
    role: str  # "controller" or "broker"
    node_id: int  # the controller's id is -1 in this file: it is addressed as "controller"
    host: str
    port: int
    metrics_port: int
    data_dir: str
    log_file: str
    rack: str = ""
    pid: int = 0
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def label(self) -> str:
        return CONTROLLER_ID if self.role == "controller" else f"broker {self.node_id}"


@dataclass(slots=True)
class ClusterState:
    dir: str
    controller: ProcessSpec
    brokers: list[ProcessSpec]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(b.address for b in self.brokers)

    def to_json(self) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.bootstrap_servers,
            "controller_address": self.controller.address,
            "controller": asdict(self.controller),
            "brokers": [asdict(b) for b in self.brokers],
        }

    @classmethod
    def from_json(cls, directory: str, data: dict[str, Any]) -> ClusterState:
        return cls(
            dir=directory,
            controller=ProcessSpec(**data["controller"]),
            brokers=[ProcessSpec(**b) for b in data["brokers"]],
        )

    def find(self, ident: str) -> ProcessSpec:
        if ident == CONTROLLER_ID:
            return self.controller
        try:
            node_id = int(ident)
        except ValueError:
            raise LauncherError(
                f"unknown process {ident!r}: use a broker node id or 'controller'"
            ) from None
        for broker in self.brokers:
            if broker.node_id == node_id:
                return broker
        ids = ", ".join(str(b.node_id) for b in self.brokers)
        raise LauncherError(f"no broker {node_id} in this cluster (brokers: {ids})")

    def all(self) -> list[ProcessSpec]:
        return [self.controller, *self.brokers]


# -- state file ---------------------------------------------------------------------------------


def state_path(directory: str) -> pathlib.Path:
    return pathlib.Path(directory) / STATE_FILE


def load_state(directory: str) -> ClusterState | None:
    path = state_path(directory)
    if not path.exists():
        return None
    return ClusterState.from_json(directory, json.loads(path.read_text()))


def require_state(directory: str) -> ClusterState:
    state = load_state(directory)
    if state is None:
        raise LauncherError(
            f"no cluster in {directory!r}: start one with `minibroker cluster up --dir {directory}`"
        )
    return state


def save_state(state: ClusterState) -> None:
    path = state_path(state.dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state.to_json(), indent=2) + "\n")
    os.replace(tmp, path)


# -- process inspection -------------------------------------------------------------------------


def process_state(spec: ProcessSpec) -> str:
    """ "running", "paused" (SIGSTOPped) or "stopped"."""
    if spec.pid <= 0:
        return "stopped"
    try:
        stat = pathlib.Path(f"/proc/{spec.pid}/stat").read_text()
        cmdline = pathlib.Path(f"/proc/{spec.pid}/cmdline").read_bytes()
    except OSError:
        return "stopped"
    # Field 3 of /proc/PID/stat, after the parenthesised command name.
    code = stat.rsplit(")", 1)[1].split()[0]
    if code in ("Z", "X"):
        return "stopped"
    # An empty command line is a process still inside exec() right after Popen: ours. A
    # command line without our data dir is a PID the kernel reused for another program.
    if cmdline and spec.data_dir.encode() not in cmdline:
        return "stopped"
    if code in ("T", "t"):
        return "paused"
    return "running"


# Ports handed out by free_port in this process, never handed out twice.
_handed_out: set[int] = set()
_LOWEST_FREE_PORT = 10_000


def _ephemeral_port_range() -> tuple[int, int]:
    try:
        low, high = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, for a process started later to listen on.

    Chosen at random below the kernel's ephemeral range, not with bind(0): a port from bind(0)
    belongs to the range outgoing connections draw from, so any client socket could take it
    before the process told to listen there starts, or while a killed broker waits to be
    restarted on it (seen: "Failed to bind to address" for a broker in a test). Random rather
    than sequential so that two test runs picking at once rarely meet.
    """
    low, _high = _ephemeral_port_range()
    rng = random.Random(os.urandom(8))
    if low - 1 > _LOWEST_FREE_PORT:
        for _ in range(500):
            port = rng.randrange(_LOWEST_FREE_PORT, low)
            if port not in _handed_out and not _port_in_use(host, port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port = int(s.getsockname()[1])
    _handed_out.add(port)
    return port


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


# -- layout -------------------------------------------------------------------------------------


def plan_cluster(
    directory: str,
    brokers: int,
    racks: int,
    base_port: int,
    settings: dict[str, str],
    host: str = "127.0.0.1",
) -> ClusterState:
    """Ports: brokers on base, base+1, ...; the controller on base+100; metrics on base+1000+i
    (controller: base+1100). base_port 0 picks free ports for everything (tests)."""
    if brokers < 1:
        raise LauncherError("--brokers must be at least 1")
    root = pathlib.Path(directory).resolve()

    def port(offset: int) -> int:
        return free_port(host) if base_port == 0 else base_port + offset

    controller_settings, broker_settings = split_settings(settings)
    controller = ProcessSpec(
        role="controller",
        node_id=-1,
        host=host,
        port=port(100),
        metrics_port=port(1100),
        data_dir=str(root / "controller" / "data"),
        log_file=str(root / "controller" / "process.log"),
        settings=controller_settings,
    )
    specs = []
    for i in range(brokers):
        node_id = i + 1
        specs.append(
            ProcessSpec(
                role="broker",
                node_id=node_id,
                host=host,
                port=port(i),
                metrics_port=port(1000 + i),
                data_dir=str(root / f"broker-{node_id}" / "data"),
                log_file=str(root / f"broker-{node_id}" / "process.log"),
                rack=f"rack-{i % racks}" if racks > 0 else "",
                settings=broker_settings,
            )
        )
    return ClusterState(dir=directory, controller=controller, brokers=specs)


def split_settings(settings: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Route each --set key to the processes that know it; a key nobody knows is an error."""
    from minibroker.broker.config import is_known_key as broker_knows
    from minibroker.controller.config import ALL_KEYS

    controller_keys = {k.name for k in ALL_KEYS}

    def controller_knows(key: str) -> bool:
        return key in controller_keys

    controller: dict[str, str] = {}
    broker: dict[str, str] = {}
    for key, value in settings.items():
        known = False
        if controller_knows(key):
            controller[key] = value
            known = True
        if broker_knows(key):
            broker[key] = value
            known = True
        if not known:
            raise LauncherError(
                f"unknown setting {key!r}: neither the controller nor a broker knows it"
            )
    return controller, broker


def command_for(spec: ProcessSpec, state: ClusterState) -> list[str]:
    base = [sys.executable, "-m", "minibroker.deploy"]
    if spec.role == "controller":
        cmd = [
            *base,
            "controller",
            "--data-dir",
            spec.data_dir,
            "--listen",
            spec.address,
            "--metrics-port",
            str(spec.metrics_port),
        ]
    else:
        cmd = [
            *base,
            "broker",
            "--node-id",
            str(spec.node_id),
            "--data-dir",
            spec.data_dir,
            "--listen",
            spec.address,
            "--controller",
            state.controller.address,
            "--metrics-port",
            str(spec.metrics_port),
        ]
        if spec.rack:
            cmd += ["--rack", spec.rack]
    for key, value in sorted(spec.settings.items()):
        cmd += ["--set", f"{key}={value}"]
    return cmd


# -- actions ------------------------------------------------------------------------------------


def start_process(spec: ProcessSpec, state: ClusterState) -> None:
    if process_state(spec) != "stopped":
        return
    if _port_in_use(spec.host, spec.port):
        raise LauncherError(
            f"cannot start {spec.label}: port {spec.port} on {spec.host} is in use "
            f"(another cluster? try --base-port)"
        )
    pathlib.Path(spec.data_dir).mkdir(parents=True, exist_ok=True)
    log_path = pathlib.Path(spec.log_file)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command_for(spec, state),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a Ctrl-C in the user's shell does not reach the cluster
        )
    spec.pid = proc.pid


def signal_process(spec: ProcessSpec, sig: signal.Signals) -> bool:
    if process_state(spec) == "stopped":
        return False
    os.kill(spec.pid, sig)
    return True


def wait_stopped(spec: ProcessSpec, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process_state(spec) == "stopped":
            _reap(spec.pid)
            return True
        _reap(spec.pid)
        time.sleep(0.05)
    return process_state(spec) == "stopped"


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    except OSError:
        pass


def wait_ready(
    state: ClusterState, timeout_s: float, expect: list[ProcessSpec] | None = None
) -> None:
    """Wait until the controller answers and every expected broker is registered and unfenced."""
    import grpc

    from minibroker.proto import minibroker_pb2 as pb
    from minibroker.proto import minibroker_pb2_grpc as pb_grpc

    brokers = expect if expect is not None else state.brokers
    wanted = {b.node_id for b in brokers if b.role == "broker"}
    deadline = time.monotonic() + timeout_s
    last_problem = "controller not answering yet"
    with grpc.insecure_channel(state.controller.address) as channel:
        stub = pb_grpc.ControllerServiceStub(channel)
        while time.monotonic() < deadline:
            for spec in state.all():
                watched = spec in brokers or spec.role == "controller"
                if watched and spec.pid > 0 and process_state(spec) == "stopped":
                    tail = read_log_tail(spec.log_file, 15)
                    raise LauncherError(
                        f"{spec.label} exited during start-up; its log ends:\n{tail}"
                    )
            try:
                response = stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=2.0)
                ready = {b.broker_id for b in response.brokers if not b.fenced}
                missing = wanted - ready
                if not missing:
                    return
                last_problem = f"brokers not registered and unfenced yet: {sorted(missing)}"
            except grpc.RpcError as err:
                last_problem = f"controller not answering ({err.code().name})"
            time.sleep(0.1)
    raise LauncherError(f"cluster not ready after {timeout_s:.0f}s: {last_problem}")


def wait_for(predicate: Any, timeout_s: float, what: str) -> Any:
    """Poll `predicate` (an exception counts as "not yet": the cluster may be mid-failover)
    until it returns something truthy, and return that; LauncherError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception:
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise LauncherError(f"gave up after {timeout_s:.0f}s waiting for {what}")


def read_log_tail(path: str, lines: int) -> str:
    try:
        text = pathlib.Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def up(
    directory: str = DEFAULT_DIR,
    brokers: int = 3,
    racks: int = 0,
    base_port: int = 9092,
    settings: dict[str, str] | None = None,
    timeout_s: float = 60.0,
) -> ClusterState:
    """Start the cluster in `directory`, or restart whatever of it is stopped (data kept)."""
    state = load_state(directory)
    if state is None:
        pathlib.Path(directory).mkdir(parents=True, exist_ok=True)
        state = plan_cluster(directory, brokers, racks, base_port, settings or {})
    elif settings:
        controller_settings, broker_settings = split_settings(settings)
        state.controller.settings.update(controller_settings)
        for b in state.brokers:
            b.settings.update(broker_settings)
    for spec in state.all():
        if process_state(spec) == "paused":
            signal_process(spec, signal.SIGCONT)
    start_process(state.controller, state)
    save_state(state)
    for spec in state.brokers:
        start_process(spec, state)
        save_state(state)
    wait_ready(state, timeout_s)
    return state


def down(directory: str = DEFAULT_DIR, timeout_s: float = 30.0) -> ClusterState:
    """Stop every process: brokers first (controlled shutdown), then the controller."""
    state = require_state(directory)
    for spec in state.brokers:
        if process_state(spec) == "paused":
            signal_process(spec, signal.SIGCONT)
        signal_process(spec, signal.SIGTERM)
    for spec in state.brokers:
        if not wait_stopped(spec, timeout_s):
            signal_process(spec, signal.SIGKILL)
            wait_stopped(spec, 5.0)
    if process_state(state.controller) == "paused":
        signal_process(state.controller, signal.SIGCONT)
    signal_process(state.controller, signal.SIGTERM)
    if not wait_stopped(state.controller, timeout_s):
        signal_process(state.controller, signal.SIGKILL)
        wait_stopped(state.controller, 5.0)
    for spec in state.all():
        spec.pid = 0
    save_state(state)
    return state


def act(directory: str, action: str, ident: str, timeout_s: float = 30.0) -> str:
    """kill / stop / pause / resume / start one process; returns a sentence for the user."""
    state = require_state(directory)
    spec = state.find(ident)
    current = process_state(spec)
    if action == "start":
        if current != "stopped":
            return f"{spec.label} is already {current} (pid {spec.pid})"
        start_process(spec, state)
        save_state(state)
        wait_ready(state, timeout_s, expect=[spec])
        return f"started {spec.label} (pid {spec.pid}) on {spec.address}"
    if current == "stopped":
        raise LauncherError(f"{spec.label} is not running: `minibroker cluster start {ident}`")
    if action == "kill":
        signal_process(spec, signal.SIGKILL)
        wait_stopped(spec, 5.0)
        return f"killed {spec.label} (SIGKILL, pid {spec.pid})"
    if action == "stop":
        if current == "paused":
            signal_process(spec, signal.SIGCONT)
        signal_process(spec, signal.SIGTERM)
        if not wait_stopped(spec, timeout_s):
            raise LauncherError(
                f"{spec.label} did not stop within {timeout_s:.0f}s (pid {spec.pid})"
            )
        return f"stopped {spec.label} (SIGTERM, controlled shutdown)"
    if action == "pause":
        signal_process(spec, signal.SIGSTOP)
        return f"paused {spec.label} (SIGSTOP, pid {spec.pid})"
    if action == "resume":
        signal_process(spec, signal.SIGCONT)
        return f"resumed {spec.label} (SIGCONT, pid {spec.pid})"
    raise LauncherError(f"unknown action {action!r}")


def status(directory: str = DEFAULT_DIR) -> dict[str, Any]:
    state = require_state(directory)

    def row(spec: ProcessSpec) -> dict[str, Any]:
        current = process_state(spec)
        out: dict[str, Any] = {
            "role": spec.role,
            "pid": spec.pid if current != "stopped" else None,
            "state": current,
            "address": spec.address,
            "data_dir": spec.data_dir,
            "log_file": spec.log_file,
            "metrics_port": spec.metrics_port,
        }
        if spec.role == "broker":
            out = {"node_id": spec.node_id, **out, "rack": spec.rack}
        return out

    return {
        "bootstrap_servers": state.bootstrap_servers,
        "controller": row(state.controller),
        "brokers": [row(b) for b in state.brokers],
    }
