"""The local cluster launcher (the embedded default): controllers and brokers as processes.

I/O shell: starts, signals and inspects processes, and keeps the cluster's layout in
`<dir>/cluster.json` (ports, data dirs, log files, PIDs, the quorum's cluster id) so every
`minibroker cluster ...` command, and the client CLI's default bootstrap, find the same cluster.
Everything lives under `--dir` (default `.minibroker`): `controller/` (controller-1, today's
single controller: a quorum of one upgrades in place), `controller-2/`, ... and `broker-N/` each
hold `data/` and `process.log`.

A quorum of more than one (issue 13, docs/design.md §6.1): controller-i is node.id 999+i and
every port is chosen before anything starts, because each voter is started with
`controller.quorum.voters` naming all of them; a fresh cluster gets one generated `cluster.id`,
kept in cluster.json so restarts reuse it; brokers get every controller in
`controller.quorum.bootstrap.servers`. `controller` names the active controller (the quorum's
leader, asked with QuorumService.DescribeQuorum); a controller without QuorumService (UNIMPLEMENTED)
is the leader of its quorum of one. The pure parts are in `minibroker.deploy.quorum`.

`add_broker` starts one more broker in a running cluster (`plan_broker`: the next node id, ports
by the layout's rule, the base port and rack count `cluster up` recorded); `remove_broker` stops,
unregisters and forgets one that holds no replicas, leaving its dir (so its id is never reused).

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
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from minibroker.deploy import netfaults, quorum

STATE_FILE = "cluster.json"
DEFAULT_DIR = ".minibroker"
CONTROLLER_ID = quorum.CONTROLLER
# The library's default quorum size (tests, benchmarks, old callers): today's single controller.
# `minibroker cluster up` and the demo choose their own (cluster_cli.DEFAULT_CONTROLLERS).
DEFAULT_CONTROLLERS = 1
DESCRIBE_QUORUM_TIMEOUT_S = 1.0


class LauncherError(Exception):
    """Something the user asked cannot be done; the message says why and what to do."""


@dataclass(slots=True)
class ProcessSpec:
    role: str  # "controller" or "broker"
    node_id: int  # a controller's node.id: 1000 for controller-1, 1001 for controller-2, ...
    host: str
    port: int
    metrics_port: int
    data_dir: str
    log_file: str
    rack: str = ""
    pid: int = 0
    settings: dict[str, str] = field(default_factory=dict)
    # A broker's Kafka-protocol listener (kafka.listeners PLAINTEXT://host:kafka_port); 0: none
    # (controllers, TLS/SASL clusters: it has no authentication yet, and old cluster.json files).
    kafka_port: int = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def kafka_address(self) -> str:
        """host:port of the Kafka-protocol listener, "" when the process has none."""
        return f"{self.host}:{self.kafka_port}" if self.kafka_port else ""

    @property
    def name(self) -> str:
        """controller-N or broker-N: the name `cluster status` shows and commands accept."""
        if self.role == "controller":
            return quorum.controller_name(quorum.controller_index(self.node_id))
        return f"broker-{self.node_id}"

    @property
    def label(self) -> str:
        return self.name if self.role == "controller" else f"broker {self.node_id}"


@dataclass(slots=True)
class ClusterState:
    dir: str
    controllers: list[ProcessSpec]
    brokers: list[ProcessSpec]
    cluster_id: str = ""  # generated for a quorum of more than one; "" lets a quorum of one make it
    # `cluster up --base-port`: brokers on base+id-1, metrics on base+1000+id-1 (plan_cluster);
    # 0: every port was picked free. `add-broker` follows the same rule.
    base_port: int = 0
    racks: int = 0  # `cluster up --racks N`: rack-0..rack-N-1 (0: none)
    # SSL listeners everywhere, mutual TLS between nodes (ssl.client.auth=required); the
    # certificates live under DIR/tls (node ones made as a node first starts: tls_settings_for).
    tls: bool = False
    # `cluster up --tls --sasl`: SASL_SSL listeners (TLS, client certificates still required,
    # plus SASL PLAIN logins of `minibroker users`); DIR/tls/client.pem is the certificate
    # without rights that SASL users present (sasl_client_properties).
    sasl: bool = False

    @property
    def controller(self) -> ProcessSpec:
        """controller-1: a quorum of one's controller (use `active_controller` for a quorum)."""
        return self.controllers[0]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(b.address for b in self.brokers)

    @property
    def kafka_bootstrap_servers(self) -> str:
        """The brokers' Kafka-protocol listeners, for Kafka clients ("" when none has one)."""
        return ",".join(b.kafka_address for b in self.brokers if b.kafka_port)

    @property
    def is_quorum(self) -> bool:
        return len(self.controllers) > 1

    @property
    def voters(self) -> str:
        """controller.quorum.voters: every controller's id@host:port."""
        return quorum.voters_string((c.node_id, c.address) for c in self.controllers)

    @property
    def controller_bootstrap(self) -> str:
        """The brokers' controller.quorum.bootstrap.servers."""
        return quorum.bootstrap_string(c.address for c in self.controllers)

    def to_json(self) -> dict[str, Any]:
        return {
            "bootstrap_servers": self.bootstrap_servers,
            # controller-1, for readers that know one controller (the client CLI, old `watch`).
            "controller_address": self.controller.address,
            "controller_addresses": [c.address for c in self.controllers],
            "controller_quorum_voters": self.voters,
            "cluster_id": self.cluster_id,
            "base_port": self.base_port,
            "racks": self.racks,
            "tls": self.tls,
            "sasl": self.sasl,
            # The CLI's default --command-config for this cluster (client/cli/common.py).
            "client_config": str(client_config_path(self.dir)) if self.tls else "",
            "controller": asdict(self.controller),
            "controllers": [asdict(c) for c in self.controllers],
            "brokers": [asdict(b) for b in self.brokers],
        }

    @classmethod
    def from_json(cls, directory: str, data: dict[str, Any]) -> ClusterState:
        raw = data.get("controllers") or [data["controller"]]
        controllers = [ProcessSpec(**c) for c in raw]
        for i, c in enumerate(controllers, start=1):
            if c.node_id < 0:  # a cluster.json from before the quorum: the controller was -1
                c.node_id = quorum.controller_id(i)
        brokers = [ProcessSpec(**b) for b in data["brokers"]]
        base_port = data.get("base_port")
        if not isinstance(base_port, int):  # a cluster.json from before add-broker
            base_port = infer_base_port(controllers, brokers)
        return cls(
            dir=directory,
            controllers=controllers,
            brokers=brokers,
            cluster_id=str(data.get("cluster_id") or ""),
            base_port=base_port,
            racks=int(data.get("racks") or 0),
            tls=bool(data.get("tls")),
            sasl=bool(data.get("sasl")),
        )

    def find(self, ident: str, active: int | None = None) -> ProcessSpec:
        """The process `ident` names. `controller` is the active controller: the only one of a
        quorum of one, else controller-`active` (the caller asked the quorum who leads)."""
        try:
            target = quorum.parse_target(ident, len(self.controllers))
        except ValueError as err:
            raise LauncherError(str(err)) from None
        if target.kind == "active":
            if not self.is_quorum:
                return self.controller
            if active is None:
                raise LauncherError(
                    "no active controller: the quorum has no leader right now "
                    "(`minibroker cluster status` says why); name one: "
                    + ", ".join(c.name for c in self.controllers)
                )
            target = quorum.Target("controller", active)
        if target.kind == "controller":
            return self.controllers[target.number - 1]
        for broker in self.brokers:
            if broker.node_id == target.number:
                return broker
        ids = ", ".join(str(b.node_id) for b in self.brokers)
        raise LauncherError(f"no broker {target.number} in this cluster (brokers: {ids})")

    def all(self) -> list[ProcessSpec]:
        return [*self.controllers, *self.brokers]


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
    start, end = port_slice(_LOWEST_FREE_PORT, low, os.environ.get("MINIBROKER_PORT_SLICE", ""))
    rng = random.Random(os.urandom(8))
    if end - 1 > start:
        for _ in range(500):
            port = rng.randrange(start, end)
            if port not in _handed_out and not _port_in_use(host, port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port = int(s.getsockname()[1])
    _handed_out.add(port)
    return port


def port_slice(low: int, high: int, spec: str) -> tuple[int, int]:
    """The part of [low, high) that free_port picks from: all of it, or with
    MINIBROKER_PORT_SLICE="i/n" its i-th of n equal parts (i from 0). `make test` runs three
    pytest processes at once and gives each its own part, so that a port one of them picked
    for a stopped process (to restart it on) is never picked by another (seen once: a
    controller's port taken while it was down)."""
    if not spec:
        return low, high
    try:
        index_text, count_text = spec.split("/")
        index, count = int(index_text), int(count_text)
    except ValueError:
        raise ValueError(f"MINIBROKER_PORT_SLICE={spec!r}: expected i/n, e.g. 0/3") from None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"MINIBROKER_PORT_SLICE={spec!r}: expected 0 <= i < n")
    width = (high - low) // count
    return low + index * width, low + (index + 1) * width


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


# A SIGKILLed multi-threaded process shows as a zombie once its main thread is gone, while its
# other threads may still hold its files, the listening socket among them, for a moment.
PORT_RELEASE_S = 5.0


def _port_still_held(spec: ProcessSpec) -> bool:
    """Is the process's port (or a broker's Kafka port) in use? A port held by our own process,
    which has just stopped, is given PORT_RELEASE_S to be released before the answer is yes."""
    deadline = time.monotonic() + (PORT_RELEASE_S if _ours_exiting(spec) else 0.0)
    ports = [spec.port, *([spec.kafka_port] if spec.kafka_port else [])]
    while any(_port_in_use(spec.host, port) for port in ports):
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.05)
    return False


def _ours_exiting(spec: ProcessSpec) -> bool:
    """Is spec.pid still in the process table (a zombie, or threads still exiting)?"""
    return spec.pid > 0 and pathlib.Path(f"/proc/{spec.pid}").exists()


# -- layout -------------------------------------------------------------------------------------


def plan_cluster(
    directory: str,
    brokers: int,
    racks: int,
    base_port: int,
    settings: dict[str, str],
    host: str = "127.0.0.1",
    controllers: int = DEFAULT_CONTROLLERS,
    cluster_id: str | None = None,
) -> ClusterState:
    """Ports: brokers on base, base+1, ...; controller-i on base+100+i-1; metrics on
    base+1000+i (controller-i: base+1100+i-1). base_port 0 picks free ports for everything
    (tests). Every port is chosen here, before anything starts: each voter of a quorum is
    started with a voters list naming them all.

    controller-1 keeps the single controller's dir name (`controller/`) and id (1000), so a
    cluster made before the quorum is a quorum of one on the same files. A quorum of more than
    one gets a fresh `cluster.id` (or `cluster_id`), shared by every voter."""
    if brokers < 1:
        raise LauncherError("--brokers must be at least 1")
    try:
        quorum.check_quorum_size(controllers)
    except ValueError as err:
        raise LauncherError(str(err)) from None
    root = pathlib.Path(directory).resolve()

    def port(offset: int) -> int:
        return free_port(host) if base_port == 0 else base_port + offset

    controller_settings, broker_settings = split_settings(settings)
    controller_specs = []
    for index in range(1, controllers + 1):
        folder = "controller" if index == 1 else quorum.controller_name(index)
        controller_specs.append(
            ProcessSpec(
                role="controller",
                node_id=quorum.controller_id(index),
                host=host,
                port=port(100 + index - 1),
                metrics_port=port(1100 + index - 1),
                data_dir=str(root / folder / "data"),
                log_file=str(root / folder / "process.log"),
                settings=dict(controller_settings),
            )
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
                settings=dict(broker_settings),
                # Kafka's protocol (`up` takes it away in a TLS or SASL cluster).
                kafka_port=port(2000 + i),
            )
        )
    if cluster_id is None:
        cluster_id = quorum.new_cluster_id() if controllers > 1 else ""
    return ClusterState(
        dir=directory,
        controllers=controller_specs,
        brokers=specs,
        cluster_id=cluster_id,
        base_port=base_port,
        racks=max(racks, 0),
    )


def infer_base_port(controllers: list[ProcessSpec], brokers: list[ProcessSpec]) -> int:
    """The --base-port a layout was planned with (plan_cluster's rule), 0 when its ports do not
    follow the rule (they were picked free). For cluster.json files that do not record it."""
    if not controllers:
        return 0
    base = controllers[0].port - 100
    if base <= 0:
        return 0
    for index, c in enumerate(controllers, start=1):
        if (c.port, c.metrics_port) != (base + 100 + index - 1, base + 1100 + index - 1):
            return 0
    for b in brokers:
        if (b.port, b.metrics_port) != (base + b.node_id - 1, base + 1000 + b.node_id - 1):
            return 0
    return base


def next_broker_id(state: ClusterState, taken: Iterable[int] = ()) -> int:
    """The node id of the next broker: one above the highest in the cluster, and above every id
    in `taken` (the ids of broker dirs left by removed brokers: a new broker never starts on an
    old broker's data)."""
    return max([0, *(b.node_id for b in state.brokers), *taken]) + 1


def default_rack(state: ClusterState) -> str:
    """The rack of a new broker when none is asked for: the rack with the fewest brokers among
    `cluster up --racks N`'s rack-0..rack-N-1 and the racks brokers have (ties: in that order,
    then by broker id), which is the rack `up` would have given the next broker; none in a
    cluster without racks."""
    counts = {f"rack-{i}": 0 for i in range(state.racks)}
    for b in sorted(state.brokers, key=lambda b: b.node_id):
        if b.rack:
            counts[b.rack] = counts.get(b.rack, 0) + 1
    if not counts:
        return ""
    order = list(counts)
    return min(order, key=lambda rack: (counts[rack], order.index(rack)))


def plan_broker(
    state: ClusterState,
    rack: str | None = None,
    taken_ids: Iterable[int] = (),
    pick_port: Callable[[str], int] = free_port,
) -> ProcessSpec:
    """The spec of one more broker (not added to `state`): the next node id, ports as
    plan_cluster chooses them (base+id-1 and base+1000+id-1, or free ones for base 0), its own
    dir under the cluster's, the brokers' settings, `rack` or `default_rack`."""
    node_id = next_broker_id(state, taken_ids)
    model = state.brokers[0] if state.brokers else state.controller
    host = model.host
    used = {p for s in state.all() for p in (s.port, s.metrics_port)}
    if state.base_port:
        port = state.base_port + node_id - 1
        metrics_port = state.base_port + 1000 + node_id - 1
        for wanted, what in ((port, "port"), (metrics_port, "metrics port")):
            if wanted in used:
                owner = next(s for s in state.all() if wanted in (s.port, s.metrics_port))
                raise LauncherError(
                    f"broker {node_id}'s {what} {wanted} (--base-port {state.base_port} + "
                    f"{wanted - state.base_port}) is already {owner.label}'s: this layout has "
                    f"no room for broker {node_id}"
                )
    else:
        port = _unused_port(pick_port, host, used)
        metrics_port = _unused_port(pick_port, host, used | {port})
    kafka_port = 0
    if not (state.tls or state.sasl):
        taken = used | {port, metrics_port} | {s.kafka_port for s in state.all()}
        kafka_port = state.base_port + 2000 + node_id - 1 if state.base_port else 0
        if not kafka_port or kafka_port in taken:
            kafka_port = _unused_port(pick_port, host, taken)
    folder = pathlib.Path(state.dir).resolve() / f"broker-{node_id}"
    broker_settings = dict(state.brokers[0].settings) if state.brokers else {}
    return ProcessSpec(
        role="broker",
        node_id=node_id,
        host=host,
        port=port,
        metrics_port=metrics_port,
        data_dir=str(folder / "data"),
        log_file=str(folder / "process.log"),
        rack=default_rack(state) if rack is None else rack,
        settings=broker_settings,
        kafka_port=kafka_port,
    )


def _unused_port(pick_port: Callable[[str], int], host: str, used: set[int]) -> int:
    """A free port that no process of the cluster owns (a stopped one's port looks free)."""
    for _ in range(100):
        port = pick_port(host)
        if port not in used:
            return port
    raise LauncherError("found no free port for the new broker")


# Settings that name one process's address: one value for every process would be wrong.
PER_PROCESS_KEYS = frozenset({"listeners", "advertised.listeners"})


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
        if key in PER_PROCESS_KEYS:
            raise LauncherError(
                f"{key} cannot be set for the whole cluster: every process has its own address "
                "(the launcher gives each its listener on its own port)"
            )
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
    """The process's command line. A quorum of one is started exactly as the single controller
    was before the quorum (no quorum settings: node.id 1000 and a voters list of itself are the
    controller's defaults); a larger quorum's voters get their id, the voters list and the
    shared cluster id; brokers get every controller's address."""
    base = [sys.executable, "-m", "minibroker.deploy"]
    launcher_settings: dict[str, str] = {}
    if spec.role == "controller":
        cmd = [
            *base,
            "controller",
            "--data-dir",
            spec.data_dir,
            "--listen",
            listener_of(spec, state),
            "--metrics-port",
            str(spec.metrics_port),
        ]
        if state.is_quorum:
            cmd += ["--node-id", str(spec.node_id)]
            launcher_settings["controller.quorum.voters"] = state.voters
        if state.cluster_id and state.is_quorum:
            launcher_settings["cluster.id"] = state.cluster_id
    else:
        cmd = [
            *base,
            "broker",
            "--node-id",
            str(spec.node_id),
            "--data-dir",
            spec.data_dir,
            "--listen",
            listener_of(spec, state),
            # controller.quorum.bootstrap.servers: every controller (one for a quorum of one).
            "--controller",
            state.controller_bootstrap,
            "--metrics-port",
            str(spec.metrics_port),
        ]
        if spec.rack:
            cmd += ["--rack", spec.rack]
        if spec.kafka_port:
            launcher_settings["kafka.listeners"] = f"PLAINTEXT://{spec.kafka_address}"
    # Every process polls the launcher's fault table (nothing set: no fault, see netfaults).
    launcher_settings["network.faults.file"] = str(faults_path(state.dir).resolve())
    launcher_settings["network.faults.node"] = spec.name
    launcher_settings.update(tls_settings_for(spec, state))
    # The user's --set first, the launcher's settings last: they win (a later --set does).
    for key, value in sorted(spec.settings.items()):
        if key not in launcher_settings:
            cmd += ["--set", f"{key}={value}"]
    for key, value in sorted(launcher_settings.items()):
        cmd += ["--set", f"{key}={value}"]
    return cmd


def listener_of(spec: ProcessSpec, state: ClusterState) -> str:
    """The process's `listeners`: SSL://host:port in a --tls cluster (SASL_SSL:// with
    --sasl), else host:port."""
    if state.sasl:
        return f"SASL_SSL://{spec.address}"
    return f"SSL://{spec.address}" if state.tls else spec.address


# -- TLS (cluster up --tls) ---------------------------------------------------------------------

TLS_DIR = "tls"
# The user the launcher, the CLI and watch connect as (CN of DIR/tls/admin.pem).
CLIENT_USER = "admin"


def tls_dir(directory: str) -> pathlib.Path:
    return pathlib.Path(directory).resolve() / TLS_DIR


def _made_once(folder: pathlib.Path, name: str, make: Callable[[], Any]) -> Any:
    """folder/NAME.pem + .key when both exist, else what `make` writes there."""
    from minibroker.deploy import tls

    pair = tls.PemPair(folder / f"{name}.pem", folder / f"{name}.key")
    return pair if pair.cert.exists() and pair.key.exists() else make()


def _ca(directory: str) -> Any:
    from minibroker.deploy import tls

    folder = tls_dir(directory)
    return _made_once(folder, "ca", lambda: tls.make_ca(folder))


def node_pems(spec: ProcessSpec, state: ClusterState) -> Any:
    """The node's certificate and key (made, signed by the cluster's CA, on first use)."""
    from minibroker.deploy import tls

    folder = tls_dir(state.dir)
    return _made_once(
        folder,
        tls.node_name(spec.role, spec.node_id),
        lambda: tls.make_node_cert(_ca(state.dir), folder, spec.role, spec.node_id, [spec.host]),
    )


# The certificate SASL users present on a --sasl cluster (its CN names no user with rights).
SASL_CLIENT = "client"


def client_pems(directory: str, user: str = CLIENT_USER) -> Any:
    """DIR/tls/USER.pem and .key, a CA-signed client certificate (made on first use):
    CLIENT_USER's, the super user's; SASL_CLIENT's, without rights, for SASL users (a SASL_SSL
    listener requires a client certificate; the SASL login decides who the caller is)."""
    from minibroker.deploy import tls

    folder = tls_dir(directory)
    return _made_once(folder, user, lambda: tls.make_client_cert(_ca(directory), folder, user))


def _tls_client_properties(state: ClusterState, protocol: str, user: str) -> dict[str, str]:
    pair = client_pems(state.dir, user)
    return {
        "security.protocol": protocol,
        "ssl.ca.location": str(tls_dir(state.dir) / "ca.pem"),
        "ssl.certificate.location": str(pair.cert),
        "ssl.key.location": str(pair.key),
    }


def sasl_client_properties(state: ClusterState, username: str, password: str) -> dict[str, str]:
    """Kafka client properties for a SASL user of a --sasl cluster."""
    return {
        **_tls_client_properties(state, "SASL_SSL", SASL_CLIENT),
        "sasl.mechanism": "PLAIN",
        "sasl.username": username,
        "sasl.password": password,
    }


# A --tls cluster has its authorizer on: CLIENT_USER (the launcher's, the CLI's and watch's
# certificate) may do everything; nodes get CLUSTER_ACTION from their certificates.


def tls_settings_for(spec: ProcessSpec, state: ClusterState) -> dict[str, str]:
    """A node's security settings in a --tls cluster (nothing otherwise): its ssl.* ones, and
    the authorizer with CLIENT_USER as the super user."""
    from minibroker.metadata.authorizer import STANDARD_AUTHORIZER

    if not state.tls:
        return {}
    pair = node_pems(spec, state)
    return {
        "ssl.ca.location": str(tls_dir(state.dir) / "ca.pem"),
        "ssl.certificate.location": str(pair.cert),
        "ssl.key.location": str(pair.key),
        "ssl.client.auth": "required",
        "authorizer.class.name": STANDARD_AUTHORIZER,
        "super.users": f"User:{CLIENT_USER}",
    }


def client_properties(state: ClusterState) -> dict[str, str]:
    """Kafka client properties for this cluster (--command-config's): {} when plaintext."""
    if not state.tls:
        return {}
    return _tls_client_properties(state, "SSL", CLIENT_USER)


CLIENT_CONFIG = "client.properties"


def client_config_path(directory: str) -> pathlib.Path:
    return pathlib.Path(directory).resolve() / CLIENT_CONFIG


def write_client_config(state: ClusterState) -> pathlib.Path:
    """DIR/client.properties: Kafka client properties for the CLI (`--command-config`), the
    same a Kafka tool would take."""
    path = client_config_path(state.dir)
    lines = [
        "# minibroker cluster up --tls: connect as the user "
        f"{CLIENT_USER!r} (certificate signed by the cluster's CA)",
        *(f"{key}={value}" for key, value in client_properties(state).items()),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def client_kwargs(state: ClusterState) -> dict[str, str]:
    """The same as the Python client's keyword arguments (Producer(..., **client_kwargs(s)))."""
    return {k.replace(".", "_"): v for k, v in client_properties(state).items()}


def client_tls(state: ClusterState) -> Any:
    """The launcher's own channels' TLS settings (None: plaintext)."""
    from minibroker.client.common.tls import client_tls_from_properties

    return client_tls_from_properties(client_properties(state))


# -- actions ------------------------------------------------------------------------------------


def start_process(spec: ProcessSpec, state: ClusterState) -> None:
    if process_state(spec) != "stopped":
        return
    if _port_still_held(spec):
        raise LauncherError(
            f"cannot start {spec.label}: port {spec.port}"
            + (f" or its Kafka port {spec.kafka_port}" if spec.kafka_port else "")
            + f" on {spec.host} is in use (another cluster? try --base-port)"
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


# -- asking the quorum ---------------------------------------------------------------------------


def describe_quorum(
    spec: ProcessSpec, timeout_s: float = DESCRIBE_QUORUM_TIMEOUT_S, tls: Any = None
) -> quorum.VoterInput:
    """One controller's DescribeQuorum answer with its process state. UNIMPLEMENTED (a controller
    from before the quorum) stands for the leader of a quorum of one. Never raises for the
    network: a failed call is the answer's `error`."""
    import grpc

    from minibroker.client.common.tls import sync_channel
    from minibroker.proto import minibroker_pb2 as pb
    from minibroker.proto import minibroker_pb2_grpc as pb_grpc

    current = process_state(spec)
    base = quorum.VoterInput(
        node_id=spec.node_id,
        name=spec.name,
        address=spec.address,
        state=current,
        pid=spec.pid,
    )
    if current != "running":
        return base
    with sync_channel(spec.address, tls) as channel:
        stub = pb_grpc.QuorumServiceStub(channel)
        try:
            reply = stub.DescribeQuorum(pb.DescribeQuorumRequest(), timeout=timeout_s)
        except grpc.RpcError as err:
            code = err.code()
            if code == grpc.StatusCode.UNIMPLEMENTED:
                answer = quorum.unimplemented_answer(spec.node_id)
                return quorum.VoterInput(**{**_fields(base), "answer": answer})
            name = code.name if code is not None else "UNKNOWN"
            return quorum.VoterInput(**{**_fields(base), "error": name})
    return quorum.VoterInput(**{**_fields(base), "answer": quorum.answer_from_pb(reply)})


def _fields(voter: quorum.VoterInput) -> dict[str, Any]:
    return {name: getattr(voter, name) for name in voter.__dataclass_fields__}


def quorum_inputs(state: ClusterState) -> list[quorum.VoterInput]:
    """Every controller's DescribeQuorum answer, asked at once (a hung voter costs one
    timeout, not one per voter)."""
    from concurrent.futures import ThreadPoolExecutor

    tls = client_tls(state)
    with ThreadPoolExecutor(max_workers=len(state.controllers)) as pool:
        return list(
            pool.map(
                lambda spec: describe_quorum(spec, DESCRIBE_QUORUM_TIMEOUT_S, tls),
                state.controllers,
            )
        )


def quorum_status(state: ClusterState) -> quorum.QuorumStatus:
    return quorum.quorum_status(quorum_inputs(state))


def active_controller(state: ClusterState) -> ProcessSpec | None:
    """The controller that leads the quorum now, None when none does."""
    index = quorum.active_controller(quorum_status(state))
    return None if index is None else state.controllers[index - 1]


def resolve(state: ClusterState, ident: str) -> ProcessSpec:
    """`state.find`, asking the quorum who leads when `ident` is `controller`."""
    active: int | None = None
    if ident.strip().lower() == CONTROLLER_ID and state.is_quorum:
        active = quorum.active_controller(quorum_status(state))
    return state.find(ident, active)


def wait_ready(
    state: ClusterState, timeout_s: float, expect: list[ProcessSpec] | None = None
) -> None:
    """Wait until the active controller answers DescribeCluster, every expected broker is
    registered and unfenced, and every expected controller answers DescribeQuorum naming a
    leader (a follower does not answer DescribeCluster: NOT_CONTROLLER)."""
    from minibroker.client.common.tls import sync_channel

    expected = expect if expect is not None else state.all()
    wanted = {b.node_id for b in expected if b.role == "broker"}
    voters = [c for c in expected if c.role == "controller"]
    deadline = time.monotonic() + timeout_s
    last_problem = "controller not answering yet"
    tls = client_tls(state)
    channels = {c.address: sync_channel(c.address, tls) for c in state.controllers}
    try:
        while time.monotonic() < deadline:
            for spec in state.all():
                # Only what this call started: another voter may be down on purpose.
                if spec in expected and spec.pid > 0 and process_state(spec) == "stopped":
                    tail = read_log_tail(spec.log_file, 15)
                    raise LauncherError(
                        f"{spec.label} exited during start-up; its log ends:\n{tail}"
                    )
            last_problem = _ready_problem(state, channels, wanted, voters)
            if not last_problem:
                return
            time.sleep(0.1)
    finally:
        for channel in channels.values():
            channel.close()
    raise LauncherError(f"cluster not ready after {timeout_s:.0f}s: {last_problem}")


def _ready_problem(
    state: ClusterState,
    channels: dict[str, Any],
    wanted: set[int],
    voters: list[ProcessSpec],
) -> str:
    """Why the cluster is not ready yet; "" when it is."""
    import grpc

    from minibroker.proto import minibroker_pb2 as pb
    from minibroker.proto import minibroker_pb2_grpc as pb_grpc

    if voters and state.is_quorum:
        tls = client_tls(state)
        waiting = [
            v.name
            for v in (describe_quorum(s, DESCRIBE_QUORUM_TIMEOUT_S, tls) for s in voters)
            if v.answer is None or v.answer.leader_id == quorum.NO_LEADER
        ]
        if waiting:
            return f"no leader known to {', '.join(waiting)} yet"
    errors = []
    for spec in state.controllers:
        if process_state(spec) != "running":
            continue
        stub = pb_grpc.ControllerServiceStub(channels[spec.address])
        try:
            response = stub.DescribeCluster(pb.DescribeClusterRequest(), timeout=2.0)
        except grpc.RpcError as err:  # a follower says NOT_CONTROLLER: ask the next one
            errors.append(f"{spec.name} {err.code().name}")
            continue
        ready = {b.broker_id for b in response.brokers if not b.fenced}
        missing = wanted - ready
        if not missing:
            return ""
        return f"brokers not registered and unfenced yet: {sorted(missing)}"
    return f"no active controller answering ({', '.join(errors) or 'none running'})"


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
    controllers: int | None = None,
    tls: bool = False,
    sasl: bool = False,
) -> ClusterState:
    """Start the cluster in `directory`, or restart whatever of it is stopped (data kept).

    `tls`: a new cluster gets a local CA and certificates under DIR/tls and SSL listeners with
    mutual TLS between nodes; an existing cluster keeps what it was made with (asking for TLS
    on a plaintext one is an error). `sasl` (with `tls`): SASL_SSL listeners instead, for
    SASL PLAIN logins of `minibroker users` (client certificates stay required).

    `controllers`: the quorum size of a new cluster (None: DEFAULT_CONTROLLERS); an existing
    cluster keeps its own, and asking for another is an error (a voter set is not changed by
    restarting: new empty voters could never vote for the old one, see the spec's wiped-voter
    rule)."""
    if sasl and not tls:
        raise LauncherError("--sasl goes with --tls: SASL PLAIN logins go over TLS only")
    state = load_state(directory)
    if state is None:
        pathlib.Path(directory).mkdir(parents=True, exist_ok=True)
        state = plan_cluster(
            directory,
            brokers,
            racks,
            base_port,
            settings or {},
            controllers=controllers or DEFAULT_CONTROLLERS,
        )
        state.tls = tls
        state.sasl = sasl
        if tls or sasl:
            # The Kafka-protocol listener is PLAINTEXT, without authentication yet: none here.
            for spec in state.brokers:
                spec.kafka_port = 0
    else:
        if tls and not state.tls:
            raise LauncherError(
                f"the cluster in {directory!r} was made without --tls; its listeners stay "
                "PLAINTEXT. Start a new cluster in another --dir for TLS"
            )
        if sasl and not state.sasl:
            raise LauncherError(
                f"the cluster in {directory!r} was made without --sasl; its listeners stay "
                "SSL. Start a new cluster in another --dir for SASL_SSL"
            )
        if controllers is not None and controllers != len(state.controllers):
            raise LauncherError(
                f"the cluster in {directory!r} has {len(state.controllers)} controller(s); "
                f"--controllers {controllers} would change its voter set, which a restart "
                f"cannot do. Run `minibroker cluster up` without --controllers, or start a new "
                f"cluster in another --dir"
            )
        if settings:
            controller_settings, broker_settings = split_settings(settings)
            for c in state.controllers:
                c.settings.update(controller_settings)
            for b in state.brokers:
                b.settings.update(broker_settings)
    for spec in state.all():
        if process_state(spec) == "paused":
            signal_process(spec, signal.SIGCONT)
    reset_faults(state)  # a cluster starts with every link open
    if state.tls:
        write_client_config(state)
    if state.sasl:
        client_pems(state.dir, SASL_CLIENT)
    # Every voter at once: a quorum elects only once a majority runs.
    for spec in state.controllers:
        start_process(spec, state)
        save_state(state)
    for spec in state.brokers:
        start_process(spec, state)
        save_state(state)
    wait_ready(state, timeout_s)
    return state


def _stop_all(specs: list[ProcessSpec], timeout_s: float) -> None:
    for spec in specs:
        if process_state(spec) == "paused":
            signal_process(spec, signal.SIGCONT)
        signal_process(spec, signal.SIGTERM)
    for spec in specs:
        if not wait_stopped(spec, timeout_s):
            signal_process(spec, signal.SIGKILL)
            wait_stopped(spec, 5.0)


def down(directory: str = DEFAULT_DIR, timeout_s: float = 30.0) -> ClusterState:
    """Stop every process: brokers first (controlled shutdown, which needs the active
    controller), then the controllers together."""
    state = require_state(directory)
    _stop_all(state.brokers, timeout_s)
    _stop_all(state.controllers, timeout_s)
    for spec in state.all():
        spec.pid = 0
    save_state(state)
    remove_faults(directory)
    return state


def broker_dir_ids(directory: str) -> set[int]:
    """The node ids of the `broker-N` dirs under the cluster's dir (removed brokers' too)."""
    ids = set()
    for path in pathlib.Path(directory).glob("broker-*"):
        suffix = path.name.removeprefix("broker-")
        if path.is_dir() and suffix.isdigit():
            ids.add(int(suffix))
    return ids


def add_broker(
    directory: str = DEFAULT_DIR, rack: str | None = None, timeout_s: float = 60.0
) -> ProcessSpec:
    """Start one more broker in a running cluster (`plan_broker`) and wait until it is
    registered and unfenced. It is in cluster.json from the moment its process runs (so
    `cluster logs N`, `stop N`, `down` know it, even when it fails to become ready); a port
    that is busy refuses it with nothing changed."""
    state = require_state(directory)
    spec = plan_broker(state, rack, taken_ids=broker_dir_ids(directory))
    state.brokers.append(spec)
    start_process(spec, state)  # LauncherError for a busy port: nothing saved
    save_state(state)
    sync_fault_nodes(state)  # its peers look its address up in faults.json's nodes
    try:
        wait_ready(state, timeout_s, expect=[spec])
    except LauncherError as err:
        raise LauncherError(
            f"{err}\n{spec.label} stays in the cluster: `minibroker cluster logs "
            f"{spec.node_id}` shows why; `minibroker cluster remove-broker {spec.node_id}` "
            "drops it"
        ) from None
    return spec


def removal_refusal(broker_id: int, registered: Any, replica_partitions: int) -> str:
    """Why broker `broker_id` may not be removed ("" when it may). `registered` is its
    DescribeCluster entry (None: not registered); `replica_partitions` counts the partitions
    whose replicas name it (what an unregistered broker is still counted in)."""
    if registered is not None:
        replicas = registered.replica_count
        leaders = registered.leader_count
        if replicas == 0:
            return ""
        state = "being decommissioned" if registered.decommissioning else "not decommissioned"
        return (
            f"broker {broker_id} still holds {replicas} replica(s) ({leaders} leadership(s)); "
            f"it is {state}. Move them off first: `minibroker brokers decommission "
            f"{broker_id} --wait`, then remove it"
        )
    if replica_partitions:
        return (
            f"broker {broker_id} is not registered but {replica_partitions} partition(s) "
            f"still name it as a replica: move them first (`minibroker reassign-partitions`)"
        )
    return ""


def remove_broker(directory: str, ident: str, timeout_s: float = 30.0) -> str:
    """Stop a broker that holds no replicas (controlled shutdown), unregister it and drop it
    from cluster.json; its dir stays on disk (its log) and its id is never given again. Refused,
    with nothing changed, while it holds replicas, and for the last broker."""
    from minibroker.client import Admin
    from minibroker.client.errors import (
        BrokerIdNotRegisteredError,
        InvalidRequestError,
        MiniBrokerError,
    )

    state = require_state(directory)
    spec = state.find(ident)
    if spec.role != "broker":
        raise LauncherError(f"{spec.name} is a controller: only brokers can be removed")
    others = [b for b in state.brokers if b is not spec]
    if not others:
        raise LauncherError(f"{spec.label} is the cluster's last broker: it cannot be removed")
    bootstrap = ",".join(b.address for b in others)

    def refusal(admin: Any) -> str:
        cluster = admin.describe_cluster()
        registered = next((b for b in cluster.brokers if b.broker_id == spec.node_id), None)
        named = 0
        if registered is None:
            named = sum(
                1
                for topic in admin.describe_topics(include_offsets=False)
                for p in topic.partitions
                if spec.node_id in p.replicas
            )
        return removal_refusal(spec.node_id, registered, named)

    try:
        with Admin(bootstrap, default_api_timeout_ms=15_000, **client_kwargs(state)) as admin:
            problem = refusal(admin)
            if problem:
                raise LauncherError(problem)
            was = process_state(spec)
            if was != "stopped":
                _act_on(state, spec, "stop", ident, timeout_s)
            # Stopped, it is fenced: nothing new is placed on it. Unless something was in the
            # window between the check and the stop: then it runs again and nothing changed.
            problem = refusal(admin)
            if problem:
                if was != "stopped":
                    _act_on(state, spec, "start", ident, timeout_s)
                raise LauncherError(problem)
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    admin.unregister_broker(spec.node_id)
                    break
                except BrokerIdNotRegisteredError:
                    break  # never registered, or unregistered already
                except InvalidRequestError as err:  # its session has not ended yet
                    if time.monotonic() >= deadline:
                        raise LauncherError(f"{spec.label} was stopped but {err}") from None
                    time.sleep(0.1)
    except MiniBrokerError as err:
        raise LauncherError(f"cannot remove {spec.label}: {err}") from None
    state.brokers.remove(spec)
    save_state(state)
    sync_fault_nodes(state)
    return (
        f"removed {spec.label}: stopped, unregistered and dropped from the cluster "
        f"(its files stay in {pathlib.Path(spec.data_dir).parent})"
    )


ACTIONS = ("kill", "stop", "pause", "resume", "start", "restart")


def act(directory: str, action: str, ident: str, timeout_s: float = 30.0) -> str:
    """kill / stop / pause / resume / start / restart one process; returns a sentence for the
    user. `controller` is the active controller (for `start`: only in a quorum of one)."""
    state = require_state(directory)
    if action == "start" and ident.strip().lower() == CONTROLLER_ID and state.is_quorum:
        stopped = [c for c in state.controllers if process_state(c) == "stopped"]
        if len(stopped) != 1:
            raise LauncherError(
                "`start controller` needs a name in a quorum: "
                + ", ".join(f"{c.name} ({process_state(c)})" for c in state.controllers)
            )
        spec = stopped[0]
    else:
        spec = resolve(state, ident)
    return _act_on(state, spec, action, ident, timeout_s)


def _act_on(
    state: ClusterState, spec: ProcessSpec, action: str, ident: str, timeout_s: float
) -> str:
    current = process_state(spec)
    if action == "start":
        if current != "stopped":
            return f"{spec.label} is already {current} (pid {spec.pid})"
        start_process(spec, state)
        save_state(state)
        started = f"started {spec.label} (pid {spec.pid}) on {spec.address}"
        table = read_faults(state.dir, state)
        if netfaults.touches(table, spec.name):
            # It reads faults.json at start: cut off, it cannot register or join until healed.
            cut_from = netfaults.labels(netfaults.peers(table, spec.name)) or "its clients"
            return (
                f"{started}; it is still cut from {cut_from}, so it cannot register or join "
                "until `minibroker cluster heal`"
            )
        wait_ready(state, timeout_s, expect=[spec])
        return started
    if action == "restart":
        said = []
        if current != "stopped":
            said.append(_act_on(state, spec, "stop", ident, timeout_s))
        said.append(_act_on(state, spec, "start", ident, timeout_s))
        return "; ".join(said)
    if current == "stopped":
        raise LauncherError(f"{spec.label} is not running: `minibroker cluster start {spec.name}`")
    leader = " (the active controller)" if ident.strip().lower() == CONTROLLER_ID else ""
    if action == "kill":
        signal_process(spec, signal.SIGKILL)
        wait_stopped(spec, 5.0)
        return f"killed {spec.label}{leader} (SIGKILL, pid {spec.pid})"
    if action == "stop":
        if current == "paused":
            signal_process(spec, signal.SIGCONT)
        signal_process(spec, signal.SIGTERM)
        if not wait_stopped(spec, timeout_s):
            raise LauncherError(
                f"{spec.label} did not stop within {timeout_s:.0f}s (pid {spec.pid})"
            )
        return f"stopped {spec.label}{leader} (SIGTERM, controlled shutdown)"
    if action == "pause":
        signal_process(spec, signal.SIGSTOP)
        return f"paused {spec.label}{leader} (SIGSTOP, pid {spec.pid})"
    if action == "resume":
        signal_process(spec, signal.SIGCONT)
        return f"resumed {spec.label}{leader} (SIGCONT, pid {spec.pid})"
    raise LauncherError(f"unknown action {action!r}")


def status(directory: str = DEFAULT_DIR, ask_quorum: bool = True) -> dict[str, Any]:
    """Every process with its state, and (`ask_quorum`) the quorum as DescribeQuorum tells it."""
    state = require_state(directory)

    def row(spec: ProcessSpec) -> dict[str, Any]:
        current = process_state(spec)
        out: dict[str, Any] = {
            "role": spec.role,
            "name": spec.name,
            "pid": spec.pid if current != "stopped" else None,
            "state": current,
            "address": spec.address,
            "data_dir": spec.data_dir,
            "log_file": spec.log_file,
            "metrics_port": spec.metrics_port,
        }
        out = {"node_id": spec.node_id, **out}
        if spec.role == "broker":
            out["rack"] = spec.rack
            out["kafka_address"] = spec.kafka_address or None
        return out

    info: dict[str, Any] = {
        "bootstrap_servers": state.bootstrap_servers,
        "kafka_bootstrap_servers": state.kafka_bootstrap_servers or None,
        "controller_quorum_voters": state.voters,
        "cluster_id": state.cluster_id or None,
        "controller": row(state.controller),
        "controllers": [row(c) for c in state.controllers],
        "brokers": [row(b) for b in state.brokers],
    }
    try:
        info["faults"] = read_faults(directory, state).to_json()
    except LauncherError as err:
        info["faults"] = {"error": str(err)}
    if ask_quorum:
        info["quorum"] = quorum_status(state).to_json()
    return info


# -- network faults (SPEC-15 §2; the planning is in minibroker.deploy.netfaults) ----------------

FAULTS_LOCK = "faults.lock"


def faults_path(directory: str) -> pathlib.Path:
    return pathlib.Path(directory) / netfaults.FILE_NAME


def fault_nodes(state: ClusterState) -> list[netfaults.Node]:
    return [
        netfaults.Node(
            name=s.name,
            role=s.role,
            number=s.node_id if s.role == "broker" else quorum.controller_index(s.node_id),
            address=s.address,
        )
        for s in state.all()
    ]


def read_faults(directory: str, state: ClusterState | None = None) -> netfaults.FaultTable:
    """The table in faults.json; the empty one (naming `state`'s nodes) when there is none.
    LauncherError for a file that is not a fault table (`cluster heal` rewrites it)."""
    path = faults_path(directory)
    try:
        text = path.read_text()
    except FileNotFoundError:
        table = netfaults.FaultTable()
        return netfaults.with_nodes(table, fault_nodes(state)) if state is not None else table
    try:
        return netfaults.FaultTable.from_json(json.loads(text))
    except (ValueError, netfaults.FaultError) as err:
        raise LauncherError(
            f"{path} is not a fault table ({err}); `minibroker cluster heal` rewrites it"
        ) from None


def write_faults(directory: str, table: netfaults.FaultTable, previous: int) -> None:
    """Replace faults.json atomically with `table` at generation `previous` + 1 (the processes
    poll it: they see the old file or the new one, never half of one)."""
    path = faults_path(directory)
    data = {**table.to_json(), "generation": previous + 1}
    text = json.dumps(data, indent=2) + "\n"
    # The processes' own parser is the judge of the format: never write what they would ignore.
    from minibroker.client.common.netfaults import FaultFileError, parse_faults

    try:
        parse_faults(text)
    except FaultFileError as err:
        raise LauncherError(f"refusing a fault table the processes would reject: {err}") from None
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _update_faults(
    directory: str,
    change: Callable[[ClusterState, netfaults.FaultTable], tuple[netfaults.FaultTable, str]],
    lenient: bool = False,
) -> str:
    """Read, change and write faults.json under a lock (two commands at once do not lose one
    another's faults); returns the change's sentence. `lenient`: a bad file counts as empty."""
    import fcntl

    state = require_state(directory)
    with open(pathlib.Path(directory) / FAULTS_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            table = read_faults(directory, state)
        except LauncherError:
            if not lenient:
                raise
            table = netfaults.FaultTable()
        # The nodes map follows the cluster (brokers added or removed since it was written).
        table = netfaults.with_nodes(table, fault_nodes(state))
        try:
            new, said = change(state, table)
        except netfaults.FaultError as err:
            raise LauncherError(str(err)) from None
        write_faults(directory, new, table.generation)
    return said


def _active_name(state: ClusterState, idents: Iterable[str]) -> str | None:
    """The active controller's name when one of `idents` says `controller` (asked now)."""
    if not netfaults.needs_active(idents):
        return None
    if not state.is_quorum:
        return state.controller.name
    spec = active_controller(state)
    return spec.name if spec is not None else None


def partition(directory: str, groups: list[str]) -> str:
    """Cut every node of each group (a comma list: `1`, `broker-2`, `controller` the active
    one, `controller-2`, `controllers`, `brokers`) from every node of the other groups; nodes
    in no group keep their links. Returns the sentence for the user."""

    def change(
        state: ClusterState, table: netfaults.FaultTable
    ) -> tuple[netfaults.FaultTable, str]:
        active = _active_name(state, groups)
        resolved = netfaults.parse_groups(groups, fault_nodes(state), active)
        return netfaults.plan_partition(
            table, resolved, time.time(), active, netfaults.needs_active(groups)
        )

    return _update_faults(directory, change)


def isolate(directory: str, ident: str, scope: str = "nodes") -> str:
    """Cut one node from the controllers (`controller`), the brokers (`brokers`), both
    (`nodes`), or both and its clients (`all`). Returns the sentence for the user."""

    def change(
        state: ClusterState, table: netfaults.FaultTable
    ) -> tuple[netfaults.FaultTable, str]:
        nodes = fault_nodes(state)
        active = _active_name(state, [ident])
        name = netfaults.resolve_one(ident, nodes, active)
        named_active = netfaults.needs_active([ident])
        return netfaults.plan_isolate(table, nodes, name, scope, time.time(), named_active)

    return _update_faults(directory, change)


def slow(directory: str, ident: str, delay_ms: int, loss: float = 0.0) -> str:
    """Every link of one node: `delay_ms` one way per message, `loss` retransmitted."""
    try:
        netfaults.check_slow(delay_ms, loss)  # before asking the quorum anything
    except netfaults.FaultError as err:
        raise LauncherError(str(err)) from None

    def change(
        state: ClusterState, table: netfaults.FaultTable
    ) -> tuple[netfaults.FaultTable, str]:
        nodes = fault_nodes(state)
        name = netfaults.resolve_one(ident, nodes, _active_name(state, [ident]))
        node = next(n for n in nodes if n.name == name)
        return netfaults.plan_slow(table, node, delay_ms, loss, time.time())

    return _update_faults(directory, change)


def heal(directory: str) -> str:
    """Clear every fault (a malformed faults.json too)."""
    return _update_faults(directory, lambda _state, table: netfaults.plan_heal(table), True)


def current_faults(directory: str) -> dict[str, Any]:
    """faults.json's content (the empty table when there is none)."""
    return read_faults(directory, load_state(directory)).to_json()


def reset_faults(state: ClusterState) -> None:
    """`cluster up`: no fault (the empty table naming every process)."""
    try:
        previous = read_faults(state.dir).generation
    except LauncherError:
        previous = 0
    table = netfaults.with_nodes(netfaults.FaultTable(), fault_nodes(state))
    write_faults(state.dir, table, previous)


def sync_fault_nodes(state: ClusterState) -> None:
    """A broker was added or removed: faults.json names the cluster's processes now (faults on
    a removed broker dropped); nothing to do without a file."""
    if faults_path(state.dir).exists():
        _update_faults(state.dir, lambda _state, table: (table, ""))


def remove_faults(directory: str) -> None:
    faults_path(directory).unlink(missing_ok=True)
    (pathlib.Path(directory) / FAULTS_LOCK).unlink(missing_ok=True)
