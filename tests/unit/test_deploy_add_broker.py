"""`cluster add-broker` / `remove-broker` planning, without processes.

The next broker's node id (one above the highest, never an id whose dir a removed broker left),
its ports (plan_cluster's --base-port rule, or free ports no process of the cluster owns), its
rack (the least used one; none in a cluster without racks), the base port recorded in
cluster.json (inferred for older files), why a removal is refused, and the refusals that need
no cluster at all.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from dataclasses import dataclass
from itertools import count

import pytest

from minibroker.deploy import cluster as launcher
from minibroker.deploy import cluster_cli


def plan(
    brokers: int = 3, racks: int = 0, base_port: int = 9092, directory: str = "/nonexistent"
) -> launcher.ClusterState:
    return launcher.plan_cluster(
        directory, brokers=brokers, racks=racks, base_port=base_port,
        settings={"log.segment.bytes": "1048576"}, controllers=3,
    )  # fmt: skip


# -- node id ------------------------------------------------------------------------------------


def test_next_id_is_one_above_the_highest() -> None:
    state = plan()
    assert launcher.next_broker_id(state) == 4
    del state.brokers[0]  # broker 1 removed: its id is not the highest, nothing changes
    assert launcher.next_broker_id(state) == 4


def test_next_id_skips_ids_whose_dirs_removed_brokers_left() -> None:
    state = plan()
    del state.brokers[2]  # broker 3 removed, its broker-3/ dir kept
    assert launcher.next_broker_id(state) == 3
    assert launcher.next_broker_id(state, taken=[1, 2, 3]) == 4
    assert launcher.next_broker_id(state, taken=[9]) == 10


def test_broker_dir_ids(tmp_path: pathlib.Path) -> None:
    for name in ("broker-1", "broker-12", "broker-x", "controller", "controller-2"):
        (tmp_path / name).mkdir()
    (tmp_path / "broker-7").write_text("a file, not a broker dir")
    assert launcher.broker_dir_ids(str(tmp_path)) == {1, 12}


# -- ports --------------------------------------------------------------------------------------


def test_base_port_layout_gives_the_next_ports() -> None:
    state = plan(base_port=9092)
    spec = launcher.plan_broker(state)
    assert (spec.node_id, spec.port, spec.metrics_port) == (4, 9095, 10095)
    assert spec.kafka_port == 11095  # the Kafka listener: base+2000+id-1
    assert spec.role == "broker" and spec.host == "127.0.0.1"
    # Ports follow the id: after brokers 4 and 5 were added and 5's dir is left, 6 gets base+5.
    spec6 = launcher.plan_broker(state, taken_ids=[5])
    assert (spec6.node_id, spec6.port, spec6.metrics_port) == (6, 9097, 10097)


def test_base_port_layout_without_room_is_refused() -> None:
    state = plan(brokers=100, base_port=9092)  # brokers on 9092..9191; controller-1 on 9192
    with pytest.raises(launcher.LauncherError, match="already controller-1's"):
        launcher.plan_broker(state)


def test_free_ports_skip_every_port_the_cluster_owns() -> None:
    state = plan(base_port=9092)
    state.base_port = 0  # a layout whose ports were picked free
    owned = [state.brokers[0].port, state.controllers[1].metrics_port, state.brokers[2].port]
    picks = iter([*owned, 40001, 40001, 40002, state.brokers[1].kafka_port, 40002, 40003])
    asked: list[str] = []

    def pick(host: str) -> int:
        asked.append(host)
        return next(picks)

    spec = launcher.plan_broker(state, pick_port=pick)
    assert (spec.port, spec.metrics_port, spec.kafka_port) == (40001, 40002, 40003)
    assert set(asked) == {"127.0.0.1"}


def test_free_ports_give_up_with_a_clear_error() -> None:
    state = plan()
    state.base_port = 0
    taken = state.brokers[0].port
    with pytest.raises(launcher.LauncherError, match="no free port"):
        launcher.plan_broker(state, pick_port=lambda host: taken)


def test_plan_cluster_records_its_base_port() -> None:
    assert plan(base_port=9092).base_port == 9092
    counter = count(20000)
    state = plan(base_port=9092)
    state.base_port = 0
    assert launcher.plan_broker(state, pick_port=lambda h: next(counter)).port == 20000


def test_base_port_and_racks_round_trip_and_are_inferred_for_older_files() -> None:
    state = plan(base_port=9092, racks=2)
    data = state.to_json()
    assert (data["base_port"], data["racks"]) == (9092, 2)
    loaded = launcher.ClusterState.from_json("/x", data)
    assert (loaded.base_port, loaded.racks) == (9092, 2)
    del data["racks"]  # before add-broker: the racks in use are all that is known
    assert launcher.ClusterState.from_json("/x", data).racks == 0
    assert launcher.default_rack(launcher.ClusterState.from_json("/x", data)) == "rack-1"
    del data["base_port"]  # a cluster.json written before add-broker
    assert launcher.ClusterState.from_json("/x", data).base_port == 9092
    state.brokers[1].port = 23456  # ports that do not follow the rule: they were picked free
    data = state.to_json()
    del data["base_port"]
    assert launcher.ClusterState.from_json("/x", data).base_port == 0


def test_infer_base_port_needs_every_port_on_the_rule() -> None:
    state = plan(base_port=9092)
    assert launcher.infer_base_port(state.controllers, state.brokers) == 9092
    del state.brokers[0]  # a removed broker leaves a gap: still the rule
    assert launcher.infer_base_port(state.controllers, state.brokers) == 9092
    state.brokers[0].metrics_port += 1
    assert launcher.infer_base_port(state.controllers, state.brokers) == 0
    assert launcher.infer_base_port([], state.brokers) == 0


# -- the rest of the spec -----------------------------------------------------------------------


def test_dir_log_and_settings_follow_the_other_brokers(tmp_path: pathlib.Path) -> None:
    state = plan(directory=str(tmp_path / "mb"))
    spec = launcher.plan_broker(state)
    root = (tmp_path / "mb").resolve()
    assert spec.data_dir == str(root / "broker-4" / "data")
    assert spec.log_file == str(root / "broker-4" / "process.log")
    assert spec.settings == {"log.segment.bytes": "1048576"}
    assert spec.settings is not state.brokers[0].settings
    assert spec.pid == 0 and spec.name == "broker-4"
    assert spec not in state.brokers  # planned, not added


def test_command_line_names_every_controller_and_the_rack() -> None:
    state = plan(racks=2)
    spec = launcher.plan_broker(state)
    state.brokers.append(spec)
    cmd = launcher.command_for(spec, state)
    assert cmd[cmd.index("--node-id") + 1] == "4"
    assert cmd[cmd.index("--controller") + 1] == state.controller_bootstrap
    assert cmd[cmd.index("--rack") + 1] == spec.rack
    assert "log.segment.bytes=1048576" in cmd


@pytest.mark.parametrize(
    ("brokers", "racks", "expected"),
    [
        (3, 0, ""),  # no racks: none
        (3, 2, "rack-1"),  # rack-0 has brokers 1 and 3: what `up --racks 2` gives broker 4
        (3, 3, "rack-0"),  # one each: the first one
        (4, 3, "rack-1"),
        (1, 2, "rack-1"),  # no broker on rack-1 yet, still one of `up --racks 2`'s racks
    ],
)
def test_default_rack_is_the_least_used(brokers: int, racks: int, expected: str) -> None:
    state = plan(brokers=brokers, racks=racks)
    assert launcher.default_rack(state) == expected
    assert launcher.plan_broker(state).rack == expected


def test_default_rack_after_a_removal_and_an_explicit_rack() -> None:
    state = plan(brokers=4, racks=2)  # rack-0: 1, 3; rack-1: 2, 4
    state.brokers = [b for b in state.brokers if b.node_id != 3]
    assert launcher.default_rack(state) == "rack-0"
    state.brokers[0].rack = "east"  # added with --rack east; rack-0 is now empty
    assert launcher.default_rack(state) == "rack-0"
    no_racks = plan()
    no_racks.brokers[0].rack = "east"  # a rackless cluster where one broker was given a rack
    assert launcher.default_rack(no_racks) == "east"
    assert launcher.plan_broker(state, rack="east").rack == "east"
    assert launcher.plan_broker(plan(racks=2), rack="").rack == ""


def test_plan_broker_for_a_cluster_that_has_no_brokers_left() -> None:
    state = plan()
    state.brokers = []
    spec = launcher.plan_broker(state)
    assert (spec.node_id, spec.port, spec.host, spec.settings) == (1, 9092, "127.0.0.1", {})


# -- removal ------------------------------------------------------------------------------------


@dataclass
class Registered:
    replica_count: int
    leader_count: int = 0
    decommissioning: bool = False


def test_removal_needs_a_broker_that_holds_nothing() -> None:
    assert launcher.removal_refusal(1, Registered(0, decommissioning=True), 0) == ""
    assert launcher.removal_refusal(4, Registered(0), 0) == ""  # added, never given replicas
    refused = launcher.removal_refusal(1, Registered(3, 1), 0)
    assert "broker 1 still holds 3 replica(s) (1 leadership(s))" in refused
    assert "not decommissioned" in refused
    assert "minibroker brokers decommission 1 --wait" in refused
    moving = launcher.removal_refusal(1, Registered(2, 0, decommissioning=True), 0)
    assert "being decommissioned" in moving


def test_removal_of_an_unregistered_broker_still_named_as_a_replica() -> None:
    assert launcher.removal_refusal(5, None, 0) == ""
    refused = launcher.removal_refusal(5, None, 2)
    assert "not registered but 2 partition(s) still name it" in refused


def save(state: launcher.ClusterState) -> None:
    pathlib.Path(state.dir).mkdir(parents=True, exist_ok=True)
    launcher.save_state(state)


def test_remove_refuses_controllers_and_the_last_broker(tmp_path: pathlib.Path) -> None:
    directory = str(tmp_path / "mb")
    state = plan(brokers=1, directory=directory)
    save(state)
    before = launcher.state_path(directory).read_text()
    with pytest.raises(launcher.LauncherError, match="controller-2 is a controller"):
        launcher.remove_broker(directory, "controller-2")
    with pytest.raises(launcher.LauncherError, match="last broker"):
        launcher.remove_broker(directory, "1")
    with pytest.raises(launcher.LauncherError, match="no broker 9"):
        launcher.remove_broker(directory, "9")
    assert launcher.state_path(directory).read_text() == before


def test_add_broker_needs_a_cluster(tmp_path: pathlib.Path) -> None:
    with pytest.raises(launcher.LauncherError, match="no cluster in"):
        launcher.add_broker(str(tmp_path / "none"))


# -- the command line ---------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cluster_cli.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["cluster", *argv])


def test_cli_parses_add_and_remove() -> None:
    args = parse("--dir", "d", "add-broker", "--rack", "east")
    assert (args.dir, args.rack, args.timeout) == ("d", "east", 60.0)
    assert args.func.__name__ == "wrapped"
    assert parse("add-broker").rack is None
    args = parse("remove-broker", "3", "--timeout", "5")
    assert (args.id, args.timeout) == ("3", 5.0)


def test_cli_refusal_is_one_line_and_status_1(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = str(tmp_path / "mb")
    save(plan(brokers=1, directory=directory))
    args = parse("--dir", directory, "remove-broker", "1")
    assert args.func(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("minibroker cluster: broker 1 is the cluster's last broker")
    assert err.count("\n") == 1
    assert json.loads(launcher.state_path(directory).read_text())["brokers"][0]["node_id"] == 1


def test_the_readme_tour_shows_a_decommission_and_every_line_parses() -> None:
    import shlex

    from minibroker.deploy.cli import build_parser

    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text()
    tour = readme.split("## A tour", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    commands = [
        part.strip()
        for line in tour.splitlines()
        for part in line.split("#", 1)[0].split("|")[-1].split(";")
        if part.strip().startswith("minibroker ")
    ]
    for wanted in (
        "minibroker cluster add-broker",
        "minibroker brokers rebalance --execute",
        "minibroker brokers decommission 1 --wait",
        "minibroker cluster remove-broker 1",
    ):
        assert wanted in commands
    assert commands.index("minibroker cluster remove-broker 1") < commands.index(
        "minibroker cluster down"
    )
    parser = build_parser()
    for command in commands:
        argv = ["1" if word == "N" else word for word in shlex.split(command)[1:]]  # a placeholder
        args = parser.parse_args(argv)
        assert callable(args.func), command
