"""`minibroker cluster up|status|kill|stop|pause|resume|start|down|logs|add-broker|remove-broker|
partition|isolate|slow|heal`: the local cluster.

I/O shell over `minibroker.deploy.cluster`: parses flags, prints results in words a newcomer
understands, and turns LauncherError into one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from typing import Any

from minibroker.deploy import cluster as launcher
from minibroker.deploy import netfaults, quorum

# `cluster up`'s quorum size for a new cluster: 3, like `make demo` and the compose file. The
# local cluster exists to break things and watch them recover (`cluster kill`, `watch`); with one
# controller, killing it freezes every metadata change (no broker failover, no ISR change, no
# topic) until it is restarted, so the most instructive failure would be the one it cannot
# survive. 3 is the smallest quorum that survives one failure (Kafka's recommended production
# size; 5 survives two at the cost of two more processes and a larger majority per commit), and
# it costs two more small Python processes and one local round trip per metadata commit. One
# controller stays available with `--controllers 1` (today's cluster, and what the launcher's
# library default and the tests use); an existing cluster keeps the size it was made with.
DEFAULT_CONTROLLERS = 3


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "cluster",
        help="start, inspect and break a local cluster (controllers + brokers as processes)",
        description="A local cluster of real processes on 127.0.0.1: a quorum of controllers "
        "(controller-1, controller-2, ...) and N brokers, each with its own data dir and log "
        "file under --dir. 'controller' names the active controller (the quorum's leader).",
    )
    parser.add_argument(
        "--dir", default=launcher.DEFAULT_DIR, help="where the cluster lives (default: .minibroker)"
    )
    csub = parser.add_subparsers(dest="cluster_command", metavar="ACTION")

    p = csub.add_parser("up", help="start the cluster (or restart what is stopped; data is kept)")
    p.add_argument("--brokers", type=int, default=3, help="number of brokers (default 3)")
    p.add_argument(
        "--controllers",
        type=int,
        choices=quorum.QUORUM_SIZES,
        default=None,
        help=f"controllers in the metadata quorum, for a new cluster (default "
        f"{DEFAULT_CONTROLLERS}: the smallest quorum that survives a controller failure, so "
        "`cluster kill controller` shows a re-election instead of frozen metadata; 1 is "
        "today's single controller). An existing cluster keeps its size.",
    )
    p.add_argument(
        "--racks",
        type=int,
        default=0,
        help="spread brokers over N racks rack-0..rack-N-1 (default: no racks)",
    )
    p.add_argument(
        "--base-port",
        type=int,
        default=9092,
        help="brokers listen on BASE, BASE+1, ...; controller-i on BASE+100+i-1; "
        "metrics on BASE+1000+i (controllers BASE+1100+i-1; 0: any free ports)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting for every process that knows KEY (repeatable)",
    )
    p.add_argument(
        "--tls",
        action="store_true",
        help="a new cluster with TLS: a local CA and certificates under DIR/tls, SSL listeners "
        "with mutual TLS between nodes (ssl.client.auth=required), and DIR/client.properties "
        "for clients (the CLI and watch use it by default from .minibroker; elsewhere pass "
        "--command-config FILE). The authorizer is on (StandardAuthorizer, super.users="
        "User:admin, the launcher's and the CLI's certificate): a node's certificate acts only "
        "as that node, other users need ACLs. `minibroker demo` and `verify` on such a "
        "cluster connect with its client.properties too",
    )
    p.add_argument(
        "--sasl",
        action="store_true",
        help="with --tls, a new cluster whose listeners are SASL_SSL: clients may also log in "
        "with a user name and password (`minibroker users --add`; security.protocol=SASL_SSL, "
        "sasl.mechanism=PLAIN, sasl.username, sasl.password). Client certificates stay "
        "required: SASL users present DIR/tls/client.pem, a certificate without rights",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness")
    p.set_defaults(func=_up)

    p = csub.add_parser(
        "status", help="list every process with its state, and the controller quorum"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_status)

    for action, text in (
        ("kill", "SIGKILL a process (a crash)"),
        ("stop", "SIGTERM a process (controlled shutdown)"),
        ("pause", "SIGSTOP a process (a hang)"),
        ("resume", "SIGCONT a paused process"),
        ("start", "start a stopped process again"),
        ("restart", "stop a process (controlled) and start it again"),
    ):
        p = csub.add_parser(action, help=text)
        p.add_argument(
            "id",
            help="a broker node id, controller-N, or 'controller' (the active controller)",
        )
        p.set_defaults(func=_act, action=action)

    p = csub.add_parser(
        "add-broker",
        help="start one more broker in the running cluster",
        description="Start one more broker: the next node id (one above the highest), ports "
        "chosen as `cluster up` chose the others (--base-port's rule, or free ports), the "
        "brokers' settings. It holds nothing until replicas move to it: `minibroker brokers "
        "rebalance --execute`.",
    )
    p.add_argument(
        "--rack",
        default=None,
        help="its rack (default: none in a cluster without racks, else the rack with the "
        "fewest brokers)",
    )
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness")
    p.set_defaults(func=_add_broker)

    p = csub.add_parser(
        "remove-broker",
        help="stop, unregister and forget a broker that holds no replicas",
        description="Stop a broker (controlled shutdown), unregister it and drop it from the "
        "cluster; refused while it holds replicas (`minibroker brokers decommission N --wait` "
        "moves them off). Its files stay on disk; its id is not given again.",
    )
    p.add_argument("id", help="the broker's node id")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for each step")
    p.set_defaults(func=_remove_broker)

    register_faults(csub)

    p = csub.add_parser("down", help="stop everything (brokers first, controlled)")
    p.set_defaults(func=_down)

    p = csub.add_parser("logs", help="print a process's log (all processes without ID)")
    p.add_argument(
        "id",
        nargs="?",
        help="a broker node id, controller-N, or 'controller' (the active controller)",
    )
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines")
    p.add_argument("-n", "--lines", type=int, default=50, help="lines of history (default 50)")
    p.set_defaults(func=_logs)

    parser.set_defaults(func=lambda args: (parser.print_help(), 2)[1])


def _guard(fn: Any) -> Any:
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return int(fn(args) or 0)
        except launcher.LauncherError as err:
            print(f"minibroker cluster: {err}", file=sys.stderr)
            return 1
        except ValueError as err:  # ConfigError from --set parsing
            print(f"minibroker cluster: {err}", file=sys.stderr)
            return 2

    return wrapped


NODE_HELP = (
    "a broker id (1) or broker-1, controller-N, or 'controller' (the active controller, asked now)"
)


def register_faults(csub: Any) -> None:
    """partition / isolate / slow / heal: network faults between the cluster's processes."""
    p = csub.add_parser(
        "partition",
        help="cut the network between groups of processes",
        description="Cut every process of each group from every process of the other groups "
        "(both ways; a cut link is silence: calls hang until their deadline, as in a real "
        "partition). A group is a comma list of broker ids (1 or broker-1), controller-N, "
        "'controller' (the active controller now), 'controllers' or 'brokers' (all of them). "
        "Processes in no group keep every link; clients still reach every process. Faults add "
        "up until `cluster heal`. Example: `cluster partition 1 2,3,controller` (broker 1 "
        "alone, the rest with the active controller).",
    )
    p.add_argument("groups", nargs="+", metavar="GROUP", help="two or more comma lists")
    p.set_defaults(func=_partition)

    p = csub.add_parser(
        "isolate",
        help="cut one process from the others (clients still reach it unless --from all)",
        description="Cut one process from the controllers, the brokers, or both; with "
        "--from all its server also holds every incoming call, its clients' too. Faults add "
        "up until `cluster heal`.",
    )
    p.add_argument("id", help=NODE_HELP)
    p.add_argument(
        "--from",
        dest="scope",
        choices=netfaults.SCOPES,
        default="nodes",
        help="controller: cut from every controller (a controller: from the other "
        "controllers); brokers: from every other broker (a controller: from every broker); "
        "nodes: both (default); all: both, and its clients cannot reach it either",
    )
    p.set_defaults(func=_isolate)

    p = csub.add_parser(
        "slow",
        help="add delay and loss to every link of one process",
        description="Every link between the process and another process gets --delay-ms one "
        "way per message (round trip twice that; both ends slow: delays add) and --loss: each "
        "message is lost with that probability and retransmitted TCP-like (after 200 ms, "
        "doubling per consecutive loss): slow, never dropped. Replaces the process's previous "
        "slow setting; `cluster heal` clears it.",
    )
    p.add_argument("id", help=NODE_HELP)
    p.add_argument("--delay-ms", type=int, required=True, help="one-way delay per message")
    p.add_argument(
        "--loss", type=float, default=0.0, help="probability a message is lost, in [0, 1)"
    )
    p.set_defaults(func=_slow)

    p = csub.add_parser(
        "heal",
        help="clear every network fault",
        description="Open every cut link and remove every delay; held messages are delivered "
        "in order, as TCP would after a partition heals.",
    )
    p.set_defaults(func=_heal)


@_guard
def _partition(args: argparse.Namespace) -> int:
    print(launcher.partition(args.dir, args.groups))
    return 0


@_guard
def _isolate(args: argparse.Namespace) -> int:
    print(launcher.isolate(args.dir, args.id, args.scope))
    return 0


@_guard
def _slow(args: argparse.Namespace) -> int:
    print(launcher.slow(args.dir, args.id, args.delay_ms, args.loss))
    return 0


@_guard
def _heal(args: argparse.Namespace) -> int:
    print(launcher.heal(args.dir))
    return 0


@_guard
def _up(args: argparse.Namespace) -> int:
    from minibroker.client.common.config import parse_overrides

    existing = launcher.load_state(args.dir)
    print(
        f"Starting the local cluster in {args.dir} ..."
        if existing is None
        else f"Restarting what is stopped in {args.dir} (data kept) ..."
    )
    controllers = args.controllers
    if existing is None and controllers is None:
        controllers = DEFAULT_CONTROLLERS
    state = launcher.up(
        args.dir,
        args.brokers,
        args.racks,
        args.base_port,
        parse_overrides(args.set),
        args.timeout,
        controllers=controllers,
        tls=args.tls,
        sasl=args.sasl,
    )
    for c in state.controllers:
        print(
            f"  {c.name:<12} {c.address:<18} pid {c.pid:<7} "
            f"metrics http://{c.host}:{c.metrics_port}/metrics"
        )
    for b in state.brokers:
        rack = f" rack {b.rack}" if b.rack else ""
        kafka = f" kafka {b.kafka_address}" if b.kafka_port else ""
        print(
            f"  broker {b.node_id:<5} {b.address:<18} pid {b.pid:<7} "
            f"metrics http://{b.host}:{b.metrics_port}/metrics{rack}{kafka}"
        )
    if state.is_quorum:
        leader = launcher.active_controller(state)
        print(
            f"Controller quorum: {state.voters} (cluster.id {state.cluster_id}); "
            f"active controller: {leader.name if leader else 'none yet'}"
        )
    print(f"Cluster ready. Bootstrap servers: {state.bootstrap_servers}")
    if state.kafka_bootstrap_servers:
        print(f"Kafka clients (kcat, confluent-kafka, ...): {state.kafka_bootstrap_servers}")
    if state.tls:
        config = launcher.client_config_path(state.dir)
        print(
            f"TLS: SSL listeners, mutual TLS between nodes; client settings in {config} "
            f"(CA and certificates in {launcher.tls_dir(state.dir)}). The CLI uses it by default "
            f"from .minibroker; elsewhere pass --command-config {config}. Python: "
            "Producer(bootstrap, **props) with props security_protocol='SSL', ssl_ca_location, "
            "ssl_certificate_location, ssl_key_location as in that file"
        )
    if state.sasl:
        pems = launcher.client_pems(state.dir, launcher.SASL_CLIENT)
        print(
            "SASL: SASL_SSL listeners. Add users with `minibroker users --add NAME`; they "
            f"connect with security.protocol=SASL_SSL, ssl.ca.location, the certificate "
            f"{pems.cert} and key {pems.key} (no rights of their own), sasl.mechanism=PLAIN, "
            "sasl.username, sasl.password"
        )
    print(
        "Try: minibroker topics create demo --partitions 3 --replication-factor 3; minibroker watch"
    )
    return 0


@_guard
def _status(args: argparse.Namespace) -> int:
    info = launcher.status(args.dir)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    for line in status_lines(info):
        print(line)
    return 0


def status_lines(info: dict[str, Any]) -> list[str]:
    """`cluster status` in words: every process, then the quorum. Pure (tests call it)."""
    lines = [
        f"{'PROCESS':<14} {'STATE':<8} {'PID':<8} {'ADDRESS':<18} {'KAFKA':<18} {'METRICS':<8} LOG"
    ]
    rows = [(c["name"], c) for c in info["controllers"]] + [
        (f"broker {b['node_id']}", b) for b in info["brokers"]
    ]
    for label, row in rows:
        # KAFKA: a broker's Kafka-protocol listener (kafka.listeners), "-" when it has none.
        kafka = row.get("kafka_address") or "-"
        lines.append(
            f"{label:<14} {row['state']:<8} {row['pid'] or '-':<8} {row['address']:<18} "
            f"{kafka:<18} {row['metrics_port']:<8} {row['log_file']}"
        )
    if info.get("kafka_bootstrap_servers"):
        lines.append(f"Kafka clients: bootstrap.servers={info['kafka_bootstrap_servers']}")
    if "quorum" in info:
        lines.append("")
        lines += quorum.render_quorum(quorum_status_from_json(info["quorum"]))
    if "faults" in info:
        lines.append("")
        lines += fault_lines(info["faults"])
    return lines


def fault_lines(data: dict[str, Any]) -> list[str]:
    """The network faults set, from `status()`'s "faults" (faults.json's content)."""
    if "error" in data:
        return [f"network: {data['error']}"]
    try:
        table = netfaults.FaultTable.from_json(data)
    except netfaults.FaultError as err:
        return [f"network: faults.json unreadable ({err})"]
    return netfaults.describe(table)


def quorum_status_from_json(data: dict[str, Any]) -> quorum.QuorumStatus:
    return quorum.QuorumStatus(
        voters=tuple(
            quorum.VoterRow(
                node_id=v["node_id"],
                name=v["name"],
                address=v["address"],
                state=v["state"],
                pid=v["pid"],
                role=v["role"],
                log_end_offset=v["log_end_offset"],
                lag=v["lag"],
                last_fetch_ms_ago=v["last_fetch_ms_ago"],
            )
            for v in data["voters"]
        ),
        leader_id=quorum.NO_LEADER if data["leader_id"] is None else data["leader_id"],
        epoch=-1 if data["epoch"] is None else data["epoch"],
        high_watermark=data["high_watermark"],
        why_no_leader=data["why_no_leader"] or "",
        cluster_id=data["cluster_id"] or "",
        notes=tuple(data.get("notes") or ()),
    )


@_guard
def _act(args: argparse.Namespace) -> int:
    print(launcher.act(args.dir, args.action, args.id))
    return 0


@_guard
def _add_broker(args: argparse.Namespace) -> int:
    spec = launcher.add_broker(args.dir, args.rack, args.timeout)
    state = launcher.require_state(args.dir)
    rack = f" rack {spec.rack}" if spec.rack else ""
    print(
        f"added broker {spec.node_id} (pid {spec.pid}) on {spec.address}, "
        f"metrics http://{spec.host}:{spec.metrics_port}/metrics{rack}"
    )
    print(f"Bootstrap servers: {state.bootstrap_servers}")
    print("It holds no replicas yet: `minibroker brokers rebalance --execute` moves some to it.")
    return 0


@_guard
def _remove_broker(args: argparse.Namespace) -> int:
    print(launcher.remove_broker(args.dir, args.id, args.timeout))
    return 0


@_guard
def _down(args: argparse.Namespace) -> int:
    launcher.down(args.dir)
    print(
        f"Stopped every process of the cluster in {args.dir} (data kept; `cluster up` restarts it)."
    )
    return 0


@_guard
def _logs(args: argparse.Namespace) -> int:
    state = launcher.require_state(args.dir)
    specs = [launcher.resolve(state, args.id)] if args.id else state.all()
    for spec in specs:
        if len(specs) > 1:
            print(f"==> {spec.label}: {spec.log_file} <==")
        print(launcher.read_log_tail(spec.log_file, args.lines))
    if not args.follow:
        return 0
    positions = {s.log_file: _size(s.log_file) for s in specs}
    try:
        while True:
            for spec in specs:
                path = pathlib.Path(spec.log_file)
                size = _size(spec.log_file)
                if size > positions[spec.log_file]:
                    with path.open("rb") as f:
                        f.seek(positions[spec.log_file])
                        chunk = f.read(size - positions[spec.log_file]).decode(errors="replace")
                    prefix = f"[{spec.label}] " if len(specs) > 1 else ""
                    for line in chunk.splitlines():
                        print(prefix + line, flush=True)
                positions[spec.log_file] = max(size, 0)
            time.sleep(0.2)
    except KeyboardInterrupt:
        return 0


def _size(path: str) -> int:
    try:
        return pathlib.Path(path).stat().st_size
    except OSError:
        return 0
