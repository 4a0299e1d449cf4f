"""deploy/docker-compose.yml and deploy/Dockerfile, checked without Docker.

test_docker.py runs both under a real engine; these checks run everywhere, in a second. Two
layers. The structure tests read the compose file, the Dockerfile and .dockerignore and check
what Docker would otherwise find out at `up` time: the services and the spark profile, host
networking with no port mappings, restart "no", named volumes mounted at the data dirs the
commands use, health checks, racks, start-up order, ports equal to the local launcher's and every
command flag accepted by the real `minibroker` parser. The run test then starts each service's
`command` with its `environment` as a local process, in `depends_on` order, waiting on each health
check as Compose would, with every volume mapped to a temp dir and every port remapped to a free
one (other clusters on the machine may hold 9092), and walks the README's script: the brokers
register with their racks, a record goes through, `kill broker-2` fences it and it stays dead,
`start broker-2` on the same volume rejoins the ISR. Every process is killed by PID at the end.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib.util
import itertools
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from minibroker.deploy.cluster import free_port

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

CONTROLLERS = ("controller-1", "controller-2", "controller-3")
BROKERS = ("broker-1", "broker-2", "broker-3")
SERVER_SERVICES = (*CONTROLLERS, *BROKERS)
SPARK_SERVICE = "pipeline"


# -- reading the files -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(data, dict), "the compose file is not a mapping"
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(compose["services"])


def argv_of(value: str | list[Any]) -> list[str]:
    """A compose `command` in either form, as argv."""
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value]


def flag(argv: list[str], name: str) -> str | None:
    """The value of `--name VALUE` (or `--name=VALUE`) in argv, None when absent."""
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def port_of(address: str) -> int:
    host, sep, port = address.rpartition(":")
    assert sep and host and port.isdigit(), f"expected HOST:PORT, got {address!r}"
    return int(port)


def healthcheck_argv(service: dict[str, Any]) -> list[str]:
    test = service["healthcheck"]["test"]
    assert isinstance(test, list) and test[0] == "CMD", (
        f"use the exec form [CMD, ...] (no shell in the check): {test!r}"
    )
    return [str(v) for v in test[1:]]


def volume_mounts(service: dict[str, Any]) -> dict[str, str]:
    """container path -> named volume, for the service's short-syntax `volumes`."""
    mounts: dict[str, str] = {}
    for entry in service.get("volumes", []):
        assert isinstance(entry, str), f"use the short syntax VOLUME:PATH: {entry!r}"
        source, target = entry.split(":")[:2]
        mounts[target] = source
    return mounts


def duration_s(text: str) -> float:
    """Compose durations such as `2s`, `1m30s`, `500ms`."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"bad duration {text!r}"
    return sum(float(n) * units[u] for n, u in parts)


@dataclass(frozen=True)
class Dockerfile:
    stages: dict[str, str]  # stage name -> the image it starts FROM, in the file's order
    users: dict[str, str]  # stage name -> the last USER of the stage
    copies: dict[str, str]  # COPY from the build context: source -> destination in the image
    exposed: set[int]
    text: str


def read_dockerfile() -> Dockerfile:
    text = DOCKERFILE.read_text()
    # Join continuation lines so each instruction is one line.
    instructions = re.sub(r"\\\n", " ", text).splitlines()
    args: dict[str, str] = {}
    stages: dict[str, str] = {}
    users: dict[str, str] = {}
    copies: dict[str, str] = {}
    exposed: set[int] = set()
    stage = ""
    for line in instructions:
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        op = words[0].upper()
        if op == "ARG" and "=" in words[1]:
            name, value = words[1].split("=", 1)
            args[name] = value
        elif op == "FROM":
            image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[1])
            stage = words[3] if len(words) >= 4 and words[2].upper() == "AS" else image
            stages[stage] = image
            # A stage built FROM another stage starts as that stage's user.
            users[stage] = users.get(image, "root")
        elif op == "USER":
            users[stage] = words[1]
        elif op == "COPY" and not any(w.startswith("--from") for w in words[1:]):
            *sources, destination = [w for w in words[1:] if not w.startswith("--")]
            copies.update(dict.fromkeys(sources, destination))
        elif op == "EXPOSE":
            exposed.update(int(w.split("/")[0]) for w in words[1:])
    return Dockerfile(stages, users, copies, exposed, text)


def base_image(dockerfile: Dockerfile, stage: str) -> str:
    """The image a stage is ultimately built on (following FROM <earlier stage>)."""
    while stage in dockerfile.stages:
        stage = dockerfile.stages[stage]
    return stage


def header_builds(dockerfile: Dockerfile) -> dict[str | None, str]:
    """The header's `docker build` commands: target (None without --target) -> the tag."""
    builds: dict[str | None, str] = {}
    for line in dockerfile.text.splitlines():
        command = line.lstrip("#").strip()
        if not (line.startswith("#") and command.startswith("docker build")):
            continue
        argv = shlex.split(command, comments=True)
        target = argv[argv.index("--target") + 1] if "--target" in argv else None
        builds[target] = argv[argv.index("-t") + 1]
    return builds


# -- structure -------------------------------------------------------------------------------------


def test_services_and_the_spark_profile(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == {*SERVER_SERVICES, SPARK_SERVICE}
    for name in SERVER_SERVICES:
        # A plain `docker compose up` starts the whole cluster and nothing else.
        assert not services[name].get("profiles"), f"{name} must not hide behind a profile"
    assert services[SPARK_SERVICE]["profiles"] == ["spark"]


def test_host_network_restart_off_and_no_port_mappings(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        # The address a broker listens on is the address it registers and clients dial, so it
        # must mean the same thing on the host and in every container: the host's network.
        assert service.get("network_mode") == "host", name
        # Compose rejects port mappings on the host network; the listen ports are the host's.
        assert "ports" not in service, f"{name}: `ports:` cannot be used with network_mode host"
        # A quoted "no": YAML reads a bare `no` as false. A killed broker must stay dead.
        assert service.get("restart") == "no", f"{name}: restart must be the string 'no'"
        assert service.get("init") is True, f"{name}: tini forwards SIGTERM (controlled shutdown)"


def test_images_are_built_from_the_dockerfile(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    dockerfile = read_dockerfile()
    assert base_image(dockerfile, "server").startswith("python:3.11-slim")
    built: dict[str, str] = {}  # image -> the target that builds it
    for name, service in services.items():
        build = service.get("build")
        if build is None:
            continue
        assert (COMPOSE_FILE.parent / build["context"]).resolve() == ROOT, name
        assert (ROOT / build["dockerfile"]).resolve() == DOCKERFILE, name
        assert build["target"] in dockerfile.stages, f"{name}: no stage {build['target']!r}"
        assert dockerfile.users[build["target"]] not in ("root", "0"), (
            f"{name}: stage {build['target']} runs as root"
        )
        assert service["image"] not in built, f"{service['image']} is built twice"
        built[service["image"]] = build["target"]
    # One image for every server process, so they can never drift apart, built once.
    assert {services[n]["image"] for n in SERVER_SERVICES} == {services["controller-1"]["image"]}
    assert built[services["controller-1"]["image"]] == "server"
    assert built[services[SPARK_SERVICE]["image"]] == "spark"
    assert compose.get("name") == "minibroker", "a fixed project name keeps volume names stable"


def test_a_build_without_target_gives_the_server_image(services: dict[str, dict[str, Any]]) -> None:
    """`docker build` builds the last stage: that must be the server, as the header says."""
    dockerfile = read_dockerfile()
    assert list(dockerfile.stages)[-1] == "server"
    builds = header_builds(dockerfile)
    assert builds == {
        None: services["controller-1"]["image"],
        "spark": services[SPARK_SERVICE]["image"],
    }, "the header's `docker build` lines must tag the images the compose file runs"


def test_dockerfile_installs_the_package_without_dev_extras() -> None:
    dockerfile = read_dockerfile()
    assert "[dev]" not in dockerfile.text
    assert re.search(r"pip install /wheels/minibroker-\*\.whl", dockerfile.text)
    assert re.search(r"\[spark\]", dockerfile.text), "the spark image needs the spark extra"
    # pyspark needs a Java runtime: a jlink image of the JDK, copied into the spark stage.
    assert re.search(r"jlink --output /opt/java\b", dockerfile.text)
    assert "COPY --from=jre /opt/java /opt/java" in dockerfile.text
    assert "JAVA_HOME=/opt/java" in dockerfile.text
    ignored = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    # The wheel is built from what the build stage copies: every package folder must be there.
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"
    ]
    copied = {source.rstrip("/") for source in dockerfile.copies}
    assert {"pyproject.toml", "README.md", *package_dirs.values()} <= copied
    for source in dockerfile.copies:
        path = source.rstrip("/")
        assert (ROOT / path).exists(), f"COPY {source}: not in the repository"
        hits = [p for p in ignored if fnmatch.fnmatch(path, p.rstrip("/"))]
        assert not hits, f"COPY {source}: excluded from the build context by .dockerignore {hits}"


def test_commands_are_accepted_by_the_minibroker_parser(
    services: dict[str, dict[str, Any]],
) -> None:
    from minibroker.deploy.cli import build_parser

    parser = build_parser()
    for name in SERVER_SERVICES:
        argv = argv_of(services[name]["command"])
        assert argv[0] == "minibroker", f"{name}: run the installed `minibroker` command"
        try:
            args = parser.parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"{name}: `minibroker` rejects {argv[1:]}")
        assert args.command == ("controller" if name in CONTROLLERS else "broker")


def test_volumes_are_named_and_mounted_at_the_data_dirs(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    declared = set(compose["volumes"])
    owners: dict[str, str] = {}
    dockerfile = read_dockerfile()
    for name in SERVER_SERVICES:
        service = services[name]
        mounts = volume_mounts(service)
        data_dir = flag(argv_of(service["command"]), "--data-dir")
        assert data_dir in mounts, f"{name}: --data-dir {data_dir} is not on a volume"
        volume = mounts[data_dir]
        assert volume in declared, f"{name}: {volume} is not a named volume"
        # Two processes can never share a data dir (its .lock would stop the second one).
        assert volume not in owners, f"{volume} is used by {owners.get(volume)} and {name}"
        owners[volume] = name
        # A new named volume takes the mount point's owner from the image: the Dockerfile must
        # create the data dir for the unprivileged user, or the process cannot write to it.
        assert re.search(
            rf"install -d -o minibroker -g minibroker( -m \d+)? {re.escape(data_dir)}\b",
            dockerfile.text,
        ), f"{name}: the Dockerfile does not create {data_dir} for the minibroker user"


def settings_of(argv: list[str]) -> dict[str, str]:
    """The `--set KEY=VALUE` pairs of a command line."""
    return dict(v.split("=", 1) for k, v in itertools.pairwise(argv) if k == "--set")


def test_ports_match_the_local_launcher(services: dict[str, dict[str, Any]]) -> None:
    from minibroker.deploy import cluster as launcher
    from minibroker.deploy import quorum

    plan = launcher.plan_cluster(
        "/nonexistent", brokers=3, racks=3, base_port=9092, settings={}, controllers=3
    )
    listen_ports: set[int] = set()
    metrics_ports: set[int] = set()
    cluster_ids = set()
    for spec in plan.controllers:
        argv = argv_of(services[spec.name]["command"])
        assert flag(argv, "--node-id") == str(spec.node_id), spec.name
        listen = flag(argv, "--listen")
        assert listen is not None and port_of(listen) == spec.port, spec.name
        assert flag(argv, "--metrics-port") == str(spec.metrics_port)
        settings = settings_of(argv)
        # Every voter is started with the same voters list, the launcher's.
        assert settings["controller.quorum.voters"] == plan.voters, spec.name
        cluster_ids.add(settings["cluster.id"])
        listen_ports.add(spec.port)
        metrics_ports.add(spec.metrics_port)
    (cluster_id,) = cluster_ids  # one cluster id for the whole quorum, in Kafka's format
    assert len(cluster_id) == len(quorum.new_cluster_id()) and "=" not in cluster_id
    for spec in plan.brokers:
        argv = argv_of(services[f"broker-{spec.node_id}"]["command"])
        assert flag(argv, "--node-id") == str(spec.node_id)
        listen = flag(argv, "--listen")
        assert listen is not None and port_of(listen) == spec.port, f"broker-{spec.node_id}"
        assert flag(argv, "--metrics-port") == str(spec.metrics_port)
        assert flag(argv, "--controller") == plan.controller_bootstrap
        # The Kafka port is the launcher's, advertised as is: host clients dial that address.
        settings = settings_of(argv)
        assert spec.kafka_port and settings["kafka.listeners"] == (
            f"PLAINTEXT://{spec.kafka_address}"
        ), f"broker-{spec.node_id}"
        assert settings["kafka.advertised.listeners"] == settings["kafka.listeners"]
        listen_ports.add(spec.kafka_port)
        listen_ports.add(spec.port)
        metrics_ports.add(spec.metrics_port)
    for name in SERVER_SERVICES:
        host = (flag(argv_of(services[name]["command"]), "--listen") or "").rpartition(":")[0]
        # The listen host is the registered address: a wildcard is no address to dial.
        assert host not in ("0.0.0.0", "::", "[::]", ""), f"{name} listens on {host!r}"
    assert read_dockerfile().exposed == listen_ports | metrics_ports


def test_racks_are_distinct(services: dict[str, dict[str, Any]]) -> None:
    racks = [flag(argv_of(services[name]["command"]), "--rack") for name in BROKERS]
    assert all(racks) and len(set(racks)) == len(BROKERS), racks


def test_health_checks_probe_the_listen_address(services: dict[str, dict[str, Any]]) -> None:
    from minibroker.deploy.healthcheck import DEFAULT_TIMEOUT_S

    for name in SERVER_SERVICES:
        service = services[name]
        argv = healthcheck_argv(service)
        assert argv[:3] == ["python", "-m", "minibroker.deploy.healthcheck"], name
        assert argv[3] == flag(argv_of(service["command"]), "--listen"), name
        check = service["healthcheck"]
        # Docker abandons a probe at `timeout`: the probe's own deadline must come first.
        assert duration_s(check["timeout"]) > DEFAULT_TIMEOUT_S, name
        assert duration_s(check["interval"]) <= 5, f"{name}: slow health checks delay `up`"
        assert int(check["retries"]) >= 3, name


def test_start_up_order(services: dict[str, dict[str, Any]]) -> None:
    for name in CONTROLLERS:
        # The voters start together: a quorum elects only once a majority runs.
        assert not services[name].get("depends_on"), name
    for name in BROKERS:
        expected = {c: {"condition": "service_healthy"} for c in CONTROLLERS}
        assert services[name]["depends_on"] == expected, name
    pipeline = services[SPARK_SERVICE]["depends_on"]
    assert {n: d["condition"] for n, d in pipeline.items()} == dict.fromkeys(
        BROKERS, "service_healthy"
    )


def test_pipeline_command_is_accepted_by_the_example(
    services: dict[str, dict[str, Any]],
) -> None:
    """The spark profile's command against examples/pipeline.py's own parser (Spark itself is
    too slow to start inside this budget; tests/spark runs the pipeline's query)."""
    service = services[SPARK_SERVICE]
    argv = argv_of(service["command"])
    assert argv[0] == "python"
    # The container path of the script is the repository file the Dockerfile copies there.
    copies = read_dockerfile().copies
    script = next(
        (
            ROOT / source.rstrip("/") / pathlib.PurePosixPath(argv[1]).relative_to(dest)
            for source, dest in copies.items()
            if pathlib.PurePosixPath(argv[1]).is_relative_to(dest)
        ),
        None,
    )
    assert script is not None, f"no COPY in the Dockerfile puts anything at {argv[1]}"
    assert script == ROOT / "examples" / "pipeline.py" and script.exists(), script
    spec = importlib.util.spec_from_file_location("compose_pipeline", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        args = module.parse_args(argv[2:])
    except SystemExit:
        pytest.fail(f"examples/pipeline.py rejects {argv[2:]}")
    brokers = [flag(argv_of(services[n]["command"]), "--listen") for n in BROKERS]
    assert args.bootstrap_servers.split(",") == brokers
    checkpoint = pathlib.PurePosixPath(args.checkpoint)
    assert any(checkpoint.is_relative_to(m) for m in volume_mounts(service)), (
        f"the checkpoint {checkpoint} is not on a volume: a restart would start over"
    )
    assert (service.get("environment") or {}).get("SPARK_LOCAL_IP") == "127.0.0.1"


def test_readme_shows_the_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert "\n## Docker\n" in text
    section = text.split("\n## Docker\n", 1)[1].split("\n## ", 1)[0]
    for command in ("up -d", "kill broker-2", "start broker-2", "down -v", "--profile spark"):
        assert command in section, f"the README's Docker section does not show `{command}`"


# -- the bridge-network variant (deploy/docker-compose.bridge.yml) ---------------------------------

BRIDGE_FILE = ROOT / "deploy" / "docker-compose.bridge.yml"
CLI_SERVICE = "cli"


@pytest.fixture(scope="module")
def bridge() -> dict[str, Any]:
    data = yaml.safe_load(BRIDGE_FILE.read_text())
    assert isinstance(data, dict), "the bridge compose file is not a mapping"
    return data


@pytest.fixture(scope="module")
def bridge_services(bridge: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(bridge["services"])


@dataclass(frozen=True)
class BridgeNode:
    """What a bridge service's command makes of itself, read by the real config code."""

    name: str
    node_id: int
    listener: Any  # client.common.listeners.Listener
    advertised: Any  # the Listener it registers (brokers) or its voter entry (controllers)
    config: Any


def bridge_nodes(
    services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> dict[str, BridgeNode]:
    """Each server's command run through `minibroker` up to the point where the process would
    start (its config built and checked by the broker's and controller's own code)."""
    from minibroker.broker import app as broker_app
    from minibroker.client.common import listeners
    from minibroker.controller import app as controller_app
    from minibroker.deploy.cli import build_parser

    configs: list[Any] = []
    monkeypatch.setattr(broker_app, "main", lambda config, **_: configs.append(config) or 0)
    monkeypatch.setattr(
        controller_app, "run_controller", lambda config, **_: configs.append(config) or 0
    )
    monkeypatch.setattr("minibroker.client.common.log.configure", lambda *a, **k: None)
    parser = build_parser()
    nodes: dict[str, BridgeNode] = {}
    for name in SERVER_SERVICES:
        argv = argv_of(services[name]["command"])
        assert argv[0] == "minibroker", f"{name}: run the installed `minibroker` command"
        try:
            args = parser.parse_args(argv[1:])
        except SystemExit:
            pytest.fail(f"{name}: `minibroker` rejects {argv[1:]}")
        assert args.command == ("controller" if name in CONTROLLERS else "broker"), name
        assert args.func(args) == 0, f"{name}: the {args.command} refuses its configuration"
        config = configs.pop()
        if name in BROKERS:
            advertised = config.advertised(config.listener.port)
        else:
            (advertised,) = [v for v in config.quorum_voters() if v.voter_id == config["node.id"]]
            advertised = listeners.Listener("PLAINTEXT", advertised.host, advertised.port)
        nodes[name] = BridgeNode(name, config["node.id"], config.listener, advertised, config)
    return nodes


def test_bridge_services_network_and_no_host_networking(
    bridge: dict[str, Any], bridge_services: dict[str, dict[str, Any]]
) -> None:
    assert set(bridge_services) == {*SERVER_SERVICES, CLI_SERVICE, SPARK_SERVICE}
    for name in SERVER_SERVICES:
        assert not bridge_services[name].get("profiles"), f"{name} must not hide behind a profile"
    assert bridge_services[CLI_SERVICE]["profiles"] == ["cli"]
    assert bridge_services[SPARK_SERVICE]["profiles"] == ["spark"]
    (network,) = bridge["networks"]
    assert (bridge["networks"][network] or {}).get("driver", "bridge") == "bridge"
    for name, service in bridge_services.items():
        assert "network_mode" not in service, f"{name}: the bridge variant has no host networking"
        assert service.get("networks") == [network], f"{name} is not on the {network} network"
        # No published port: the brokers advertise names that only mean something on the
        # network (a host client would bootstrap, then fail on broker-2:9092), and the metrics
        # listen on the container's loopback.
        assert "ports" not in service, f"{name} publishes {service['ports']}"
        assert service.get("restart") == "no", f"{name}: restart must be the string 'no'"
        assert service.get("init") is True, f"{name}: tini forwards SIGTERM"
    # `run --rm cli ...` must never start a broker that was killed on purpose.
    assert not bridge_services[CLI_SERVICE].get("depends_on")


def test_bridge_keeps_apart_from_the_host_file_but_shares_its_images(
    compose: dict[str, Any],
    services: dict[str, dict[str, Any]],
    bridge: dict[str, Any],
    bridge_services: dict[str, dict[str, Any]],
) -> None:
    # Another project: containers, network and volumes of their own, both files can run at once.
    assert bridge.get("name") == "minibroker-bridge" != compose.get("name")
    # The same images, built the same way (one build serves both files and their tests).
    server_image = services["controller-1"]["image"]
    for name in (*SERVER_SERVICES, CLI_SERVICE):
        assert bridge_services[name]["image"] == server_image, name
    assert bridge_services[SPARK_SERVICE]["image"] == services[SPARK_SERVICE]["image"]
    builds = {n: s["build"] for n, s in bridge_services.items() if "build" in s}
    assert builds == {
        "controller-1": services["controller-1"]["build"],
        SPARK_SERVICE: services[SPARK_SERVICE]["build"],
    }
    # Its own cluster id (a quorum's voters share it; the host file's cluster is another one).
    ids = {settings_of(argv_of(bridge_services[n]["command"]))["cluster.id"] for n in CONTROLLERS}
    host_ids = {settings_of(argv_of(services[n]["command"]))["cluster.id"] for n in CONTROLLERS}
    assert len(ids) == 1 and ids != host_ids
    # Every data dir on a named volume of its own.
    declared = set(bridge["volumes"])
    owners: dict[str, str] = {}
    for name in (*SERVER_SERVICES, SPARK_SERVICE):
        for volume in volume_mounts(bridge_services[name]).values():
            assert volume in declared and volume not in owners, (name, volume, owners)
            owners[volume] = name
    for name in SERVER_SERVICES:
        data_dir = flag(argv_of(bridge_services[name]["command"]), "--data-dir")
        assert data_dir in volume_mounts(bridge_services[name]), name


def test_bridge_brokers_listen_on_every_interface_and_advertise_their_service_names(
    bridge_services: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = bridge_nodes(bridge_services, monkeypatch)
    for name, node in nodes.items():
        # Bound to 0.0.0.0 inside the container; handed out as the service name, which Docker's
        # DNS resolves on the network, on the port it listens on.
        assert node.listener.is_wildcard, f"{name} listens on {node.listener}"
        assert (node.advertised.host, node.advertised.port) == (name, node.listener.port), name
        assert node.advertised.name == node.listener.name == "PLAINTEXT", name
    voters = nodes["controller-1"].config.quorum_voters()
    for name in CONTROLLERS:
        assert nodes[name].config.quorum_voters() == voters, f"{name}: another voters list"
    assert {v.voter_id: v.host for v in voters} == {nodes[n].node_id: n for n in CONTROLLERS}
    controllers = ",".join(f"{v.host}:{v.port}" for v in voters)
    for name in BROKERS:
        assert nodes[name].config.controllers == tuple(controllers.split(",")), name
        assert nodes[name].node_id == int(name.removeprefix("broker-")), name
    racks = {nodes[n].config.rack for n in BROKERS}
    assert len(racks) == len(BROKERS), racks
    # Health checks ask at the advertised address: healthy also means the name reaches it.
    for name, node in nodes.items():
        argv = healthcheck_argv(bridge_services[name])
        assert argv[:3] == ["python", "-m", "minibroker.deploy.healthcheck"], name
        assert argv[3] == node.advertised.address, name
    # Clients in containers are given the advertised addresses and nothing else.
    bootstrap = [nodes[n].advertised.address for n in BROKERS]
    cli_env = bridge_services[CLI_SERVICE]["environment"]
    assert cli_env["MINIBROKER_BOOTSTRAP_SERVER"].split(",") == bootstrap
    pipeline = argv_of(bridge_services[SPARK_SERVICE]["command"])
    assert (flag(pipeline, "--bootstrap-servers") or "").split(",") == bootstrap


def test_bridge_start_up_order_and_the_pipeline_command(
    services: dict[str, dict[str, Any]], bridge_services: dict[str, dict[str, Any]]
) -> None:
    for name in CONTROLLERS:
        assert not bridge_services[name].get("depends_on"), name
    for name in BROKERS:
        expected = {c: {"condition": "service_healthy"} for c in CONTROLLERS}
        assert bridge_services[name]["depends_on"] == expected, name
    assert bridge_services[SPARK_SERVICE]["depends_on"] == services[SPARK_SERVICE]["depends_on"]
    # The pipeline's command is the host file's but for the brokers' addresses.
    host_argv = argv_of(services[SPARK_SERVICE]["command"])
    bridge_argv = argv_of(bridge_services[SPARK_SERVICE]["command"])
    i = host_argv.index("--bootstrap-servers") + 1
    assert bridge_argv[:i] + bridge_argv[i + 1 :] == host_argv[:i] + host_argv[i + 1 :]


def test_readme_shows_the_bridge_variant() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Docker\n", 1)[1].split("\n## ", 1)[0]
    assert "deploy/docker-compose.bridge.yml" in section
    assert "run --rm cli" in section, "the README must say where the bridge variant's clients run"


# -- running the services as local processes -------------------------------------------------------


@dataclass
class LocalService:
    """One compose service as a local process: its argv, environment and health check."""

    name: str
    argv: list[str]
    env: dict[str, str]
    health_argv: list[str]
    log_path: pathlib.Path
    depends_on: list[str]
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.procs[-1]

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.procs.append(
                subprocess.Popen(
                    self.argv,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def kill(self) -> None:
        """SIGKILL by PID, as `docker compose kill` does, and reap the process."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def healthy(self) -> bool:
        result = subprocess.run(
            self.health_argv, env=self.env, capture_output=True, timeout=30, check=False
        )
        return result.returncode == 0

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class LocalCompose:
    """The compose file's services as processes; container paths and ports mapped locally."""

    def __init__(self, services: dict[str, dict[str, Any]], workdir: pathlib.Path) -> None:
        self.workdir = workdir
        # Every port some process listens on gets a free local port; every other mention of it
        # (--controller, the voters list, health checks) is mapped the same way, so a reference
        # to a port nobody listens on stays unmapped and fails.
        self.ports: dict[int, int] = {}
        for name in SERVER_SERVICES:
            argv = argv_of(services[name]["command"])
            self.ports[port_of(flag(argv, "--listen") or "")] = free_port()
            self.ports[int(flag(argv, "--metrics-port") or "0")] = free_port()
        self.volumes: dict[str, pathlib.Path] = {}
        self.services: dict[str, LocalService] = {}
        for name in SERVER_SERVICES:
            service = services[name]
            mounts = {
                target: self.volume_dir(volume) for target, volume in volume_mounts(service).items()
            }
            env = dict(os.environ)
            env.update({k: str(v) for k, v in (service.get("environment") or {}).items()})
            self.services[name] = LocalService(
                name=name,
                argv=self.localize(argv_of(service["command"]), mounts),
                env=env,
                health_argv=self.localize(healthcheck_argv(service), mounts),
                log_path=workdir / f"{name}.log",
                depends_on=list(service.get("depends_on") or {}),
            )

    def volume_dir(self, volume: str) -> pathlib.Path:
        if volume not in self.volumes:
            path = self.workdir / "volumes" / volume
            path.mkdir(parents=True)
            self.volumes[volume] = path
        return self.volumes[volume]

    def localize(self, argv: list[str], mounts: dict[str, pathlib.Path]) -> list[str]:
        """Container argv -> local argv: the installed command, volume dirs, mapped ports."""
        head = {
            "minibroker": [sys.executable, "-m", "minibroker.deploy"],
            "python": [sys.executable],
        }
        out = list(head.get(argv[0], [argv[0]]))
        previous = ""
        for arg in argv[1:]:
            for target, local in mounts.items():
                if arg == target or arg.startswith(target.rstrip("/") + "/"):
                    arg = str(local) + arg[len(target.rstrip("/")) :]
            if re.search(r"[\w.]+:\d+", arg):
                # HOST:PORT, alone or in a list (`a:1,b:2`, `1000@a:1,...`).
                arg = re.sub(
                    r"([\w.]+):(\d+)",
                    lambda m: f"{m.group(1)}:{self.ports.get(int(m.group(2)), int(m.group(2)))}",
                    arg,
                )
            elif previous == "--metrics-port" and arg.isdigit() and int(arg) in self.ports:
                arg = str(self.ports[int(arg)])
            out.append(arg)
            previous = arg
        return out

    def address(self, name: str) -> str:
        listen = flag(self.services[name].argv, "--listen")
        assert listen is not None
        return listen

    def metrics_port(self, name: str) -> int:
        return int(flag(self.services[name].argv, "--metrics-port") or "0")

    def up(self) -> None:
        """Start every service after its dependencies are healthy, as `docker compose up`."""
        started: set[str] = set()
        while len(started) < len(self.services):
            ready = [
                s
                for s in self.services.values()
                if s.name not in started and set(s.depends_on) <= started
            ]
            assert ready, f"depends_on has a cycle or a missing service: {self.services.keys()}"
            for service in ready:
                service.start()
            for service in ready:
                self.wait_healthy(service.name)
                started.add(service.name)

    def wait_healthy(self, name: str, timeout_s: float = 60.0) -> None:
        service = self.services[name]

        def check() -> bool:
            if service.proc.poll() is not None:
                raise AssertionError(
                    f"{name} exited with {service.proc.returncode}; its log ends:\n"
                    + service.log_tail()
                )
            return service.healthy()

        wait_until(check, timeout_s, f"{name} healthy", interval_s=0.2, log=service.log_tail)

    def kill_all(self) -> None:
        for service in self.services.values():
            service.kill()


def wait_until(
    predicate: Callable[[], Any],
    timeout_s: float,
    what: str,
    interval_s: float = 0.1,
    log: Callable[[], str] | None = None,
) -> Any:
    """Poll `predicate` until it returns a truthy value; AssertionErrors it raises end the wait."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except AssertionError:
            raise
        except Exception as err:
            last_error = err
        time.sleep(interval_s)
    detail = f" (last error: {last_error!r})" if last_error else ""
    tail = f"\nlog:\n{log()}" if log else ""
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}{detail}{tail}")


@pytest.fixture
def local_compose(
    services: dict[str, dict[str, Any]], tmp_path: pathlib.Path
) -> Iterator[LocalCompose]:
    cluster = LocalCompose(services, tmp_path)
    try:
        yield cluster
    finally:
        cluster.kill_all()


def test_health_check_fails_when_nothing_serves() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "minibroker.deploy.healthcheck",
            f"127.0.0.1:{free_port()}",
            "--timeout",
            "0.5",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "127.0.0.1" in result.stdout


def controller_has_quorum() -> bool:
    from minibroker.controller.config import ALL_KEYS

    return "controller.quorum.voters" in {k.name for k in ALL_KEYS}


@pytest.mark.integration
@pytest.mark.skipif(
    not controller_has_quorum(), reason="the controller has no controller.quorum.voters yet"
)
def test_services_run_as_local_processes(
    local_compose: LocalCompose, services: dict[str, dict[str, Any]]
) -> None:
    from minibroker.client import Admin, Consumer, Producer, TopicPartition

    local_compose.up()
    bootstrap = ",".join(local_compose.address(name) for name in BROKERS)
    expected = {}
    for name in BROKERS:
        argv = argv_of(services[name]["command"])
        host, _, port = local_compose.address(name).rpartition(":")
        expected[int(flag(argv, "--node-id") or "-1")] = (host, int(port), flag(argv, "--rack"))

    # Every metrics port serves Prometheus text.
    for name in SERVER_SERVICES:
        url = f"http://127.0.0.1:{local_compose.metrics_port(name)}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200, name
            assert b"# TYPE" in response.read(), name

    topic, tp = "compose-check", TopicPartition("compose-check", 0)
    with Admin(bootstrap) as admin:
        # Healthy means registered; a broker is unfenced once it has caught up with the metadata
        # and heartbeated (Kafka's rule), which under load can come a moment later.
        def all_unfenced() -> Any:
            described = admin.describe_cluster()
            return None if any(b.fenced for b in described.brokers) else described

        cluster = wait_until(all_unfenced, 30, "every broker unfenced after start-up")
        registered = {b.broker_id: (b.host, b.port, b.rack) for b in cluster.brokers}
        assert registered == expected
        assert not any(b.fenced for b in cluster.brokers)
        admin.create_topic(topic, 1, 3, {"min.insync.replicas": "2"})

        def isr() -> set[int]:
            (description,) = admin.describe_topics([topic], include_offsets=False)
            return set(description.partitions[0].isr)

        wait_until(lambda: isr() == {1, 2, 3}, 30, "the ISR to hold every broker")
        with Producer(bootstrap, acks="all") as producer:
            first = producer.send(topic, b"before", key=b"k").result(timeout=60)

            # `docker compose kill broker-2`: SIGKILL, and restart "no" leaves it dead.
            broker_2 = local_compose.services["broker-2"]
            broker_2.kill()
            wait_until(
                lambda: any(
                    b.broker_id == 2 and b.fenced for b in admin.describe_cluster().brokers
                ),
                30,
                "broker 2 fenced after the kill",
            )
            wait_until(lambda: 2 not in isr(), 30, "broker 2 out of the ISR")
            second = producer.send(topic, b"while-2-is-down", key=b"k").result(timeout=60)

            # `docker compose start broker-2`: the same command on the same volume.
            broker_2.start()
            local_compose.wait_healthy("broker-2")
            wait_until(lambda: isr() == {1, 2, 3}, 60, "broker 2 back in the ISR")
        assert (first.offset, second.offset) == (0, 1)
        meta = (local_compose.volumes["broker-2-data"] / "meta.properties").read_text()
        assert f"cluster.id={cluster.cluster_id}" in meta, "broker 2's data dir is not its volume"

    with Consumer(bootstrap) as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        records: list[Any] = []
        deadline = time.monotonic() + 30
        while len(records) < 2 and time.monotonic() < deadline:
            records.extend(consumer.poll(timeout_ms=500))
    assert [(r.offset, r.value) for r in records] == [(0, b"before"), (1, b"while-2-is-down")]
