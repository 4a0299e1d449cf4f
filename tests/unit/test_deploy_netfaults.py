"""Network faults, the launcher's side (SPEC-15 §2), without processes.

Naming (groups and targets), partition/isolate/slow/heal planning into the fault table, the
sentences and event lines they give, the file's JSON round trip, the launcher's file I/O
(atomic replace, generation + 1, `up` writes the empty table, `down` removes it), command_for's
settings, and the CLI's parsing and `cluster status` lines.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import pytest

from minibroker.deploy import cluster as launcher
from minibroker.deploy import cluster_cli
from minibroker.deploy import netfaults as nf

C1, C2, C3 = "controller-1", "controller-2", "controller-3"
B1, B2, B3 = "broker-1", "broker-2", "broker-3"
T = 1_790_000_000.5


def nodes(brokers: int = 3, controllers: int = 3) -> list[nf.Node]:
    out = [
        nf.Node(f"controller-{i}", "controller", i, f"127.0.0.1:{9191 + i}")
        for i in range(1, controllers + 1)
    ]
    out += [
        nf.Node(f"broker-{i}", "broker", i, f"127.0.0.1:{9091 + i}") for i in range(1, brokers + 1)
    ]
    return out


def empty(n: list[nf.Node] | None = None) -> nf.FaultTable:
    return nf.with_nodes(nf.FaultTable(), n or nodes())


def cuts(table: nf.FaultTable) -> set[frozenset[str]]:
    return {frozenset(p) for p in table.cut}


def all_pairs(left: list[str], right: list[str]) -> set[frozenset[str]]:
    return {frozenset((a, b)) for a in left for b in right}


# -- naming -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ident", "active", "expected"),
    [
        ("1", None, [B1]),
        ("broker-2", None, [B2]),
        ("Broker2", None, [B2]),
        (" 3 ", None, [B3]),
        ("controller-2", None, [C2]),
        ("controller2", None, [C2]),
        ("1001", None, [C2]),  # controller-2's node id
        ("controller", C3, [C3]),
        ("controllers", None, [C1, C2, C3]),
        ("brokers", None, [B1, B2, B3]),
    ],
)
def test_resolve(ident: str, active: str | None, expected: list[str]) -> None:
    assert nf.resolve(ident, nodes(), active) == expected


@pytest.mark.parametrize(
    ("ident", "active", "error"),
    [
        ("7", None, r"no broker 7 in this cluster \(brokers: 1, 2, 3\)"),
        ("broker-9", None, "no broker 9"),
        ("broker-x", None, "unknown node 'broker-x'"),
        ("zookeeper", None, "unknown node 'zookeeper'"),
        ("controller-4", None, "unknown process 'controller-4': this cluster has controllers"),
        ("controller", None, "no active controller"),
    ],
)
def test_resolve_errors(ident: str, active: str | None, error: str) -> None:
    with pytest.raises(nf.FaultError, match=error):
        nf.resolve(ident, nodes(), active)


def test_resolve_one_refuses_a_name_for_many() -> None:
    with pytest.raises(nf.FaultError, match="'brokers' names 3 nodes"):
        nf.resolve_one("brokers", nodes())


@pytest.mark.parametrize(
    ("groups", "active", "expected"),
    [
        (["1", "2,3,controller"], C2, [[B1], [B2, B3, C2]]),
        (["1", "brokers"], None, None),  # broker 1 in both
        (["1,controllers", "2", "3"], None, [[B1, C1, C2, C3], [B2], [B3]]),
        (["1,1,broker-1", "2"], None, [[B1], [B2]]),  # repeats within a group are one node
        (["1,", "2"], None, [[B1], [B2]]),
    ],
)
def test_parse_groups(
    groups: list[str], active: str | None, expected: list[list[str]] | None
) -> None:
    if expected is None:
        with pytest.raises(nf.FaultError, match=r"broker 1 is in group 1 .* and group 2"):
            nf.parse_groups(groups, nodes(), active)
    else:
        assert nf.parse_groups(groups, nodes(), active) == expected


@pytest.mark.parametrize(
    ("groups", "error"),
    [
        (["1"], "at least two groups"),
        ([], "at least two groups"),
        (["1", ","], r"group 2 \(','\) names no node"),
        (["1", "controller-2,controller2"], None),
        (["controller-1", "1000"], "controller-1 is in group 1"),
        (["1", "9"], "no broker 9"),
    ],
)
def test_parse_groups_errors(groups: list[str], error: str | None) -> None:
    if error is None:
        nf.parse_groups(groups, nodes())
        return
    with pytest.raises(nf.FaultError, match=error):
        nf.parse_groups(groups, nodes())


def test_needs_active_only_for_the_word_controller() -> None:
    assert nf.needs_active(["1", "2,controller"])
    assert not nf.needs_active(["1", "controllers,controller-2"])


# -- planning -----------------------------------------------------------------------------------


def test_partition_cuts_every_pair_across_groups_and_nothing_else() -> None:
    table, said = nf.plan_partition(empty(), [[B1], [B2, B3, C2]], T, active=C2, named_active=True)
    assert cuts(table) == all_pairs([B1], [B2, B3, C2])
    assert table.events == (
        nf.Event(T, "network partition: broker 1 | controller-2, broker 2, broker 3"),
    )
    assert said == (
        "cut broker 1 from controller-2, broker 2, broker 3 (controller-2 is the active "
        "controller); controller-1, controller-3 keep every link (clients still reach every "
        "node); heal with `minibroker cluster heal`"
    )
    assert not table.no_clients and not table.slow


def test_three_groups_cut_each_from_the_others() -> None:
    table, said = nf.plan_partition(empty(), [[B1], [B2], [B3, C1]], T)
    assert cuts(table) == all_pairs([B1], [B2, B3, C1]) | all_pairs([B2], [B3, C1])
    assert said.startswith(
        "cut every group from the others: broker 1 | broker 2 | controller-1, broker 3"
    )
    assert "controller-2, controller-3 keep every link" in said


@pytest.mark.parametrize(
    ("target", "scope", "peers", "no_clients", "event"),
    [
        (B1, "nodes", [C1, C2, C3, B2, B3], False, "broker 1 isolated from every other node"),
        (
            B1,
            "all",
            [C1, C2, C3, B2, B3],
            True,
            "broker 1 isolated from every other node and from its clients",
        ),
        (B1, "controller", [C1, C2, C3], False, "broker 1 isolated from the controllers"),
        (B1, "brokers", [B2, B3], False, "broker 1 isolated from the other brokers"),
        (C2, "controller", [C1, C3], False, "controller-2 isolated from the other controllers"),
        (C2, "brokers", [B1, B2, B3], False, "controller-2 isolated from the brokers"),
        (C2, "nodes", [C1, C3, B1, B2, B3], False, "controller-2 isolated from every other node"),
    ],
)
def test_isolate_scopes(
    target: str, scope: str, peers: list[str], no_clients: bool, event: str
) -> None:
    table, said = nf.plan_isolate(empty(), nodes(), target, scope, T)
    assert cuts(table) == all_pairs([target], peers)
    assert nf.peers(table, target) == peers
    assert (target in table.no_clients) is no_clients
    assert table.events == (nf.Event(T, event),)
    assert said.endswith("heal with `minibroker cluster heal`")
    if scope == "all":
        assert "its clients are cut too" in said
    else:
        assert "clients still reach it" in said


def test_isolate_sentence_names_every_peer_and_the_active_controller() -> None:
    _, said = nf.plan_isolate(empty(), nodes(), B1, "nodes", T)
    assert said == (
        "cut broker 1 from controller-1, controller-2, controller-3, broker 2, broker 3 "
        "(clients still reach it); heal with `minibroker cluster heal`"
    )
    _, said = nf.plan_isolate(empty(), nodes(), C3, "controller", T, active_named=True)
    assert said.startswith(
        "cut controller-3 (the active controller) from controller-1, controller-2 ("
    )


def test_isolate_with_nobody_to_cut_from_is_an_error_and_an_unknown_scope_too() -> None:
    single = nodes(brokers=1, controllers=1)
    with pytest.raises(nf.FaultError, match="controller-1 has no other controllers"):
        nf.plan_isolate(empty(single), single, C1, "controller", T)
    with pytest.raises(nf.FaultError, match="broker 1 has no other brokers"):
        nf.plan_isolate(empty(single), single, B1, "brokers", T)
    with pytest.raises(nf.FaultError, match="unknown scope 'everything'"):
        nf.plan_isolate(empty(), nodes(), B1, "everything", T)


@pytest.mark.parametrize(
    ("delay", "loss", "event"),
    [
        (200, 0.1, "broker 2 slow: +200 ms, 10% loss"),
        (50, 0.0, "broker 2 slow: +50 ms"),
        (0, 0.25, "broker 2 slow: 25% loss"),
        (10, 0.125, "broker 2 slow: +10 ms, 12.5% loss"),
    ],
)
def test_slow(delay: int, loss: float, event: str) -> None:
    node = nodes()[4]
    table, said = nf.plan_slow(empty(), node, delay, loss, T)
    assert table.slow == {B2: nf.Slow(delay, loss)}
    assert table.events == (nf.Event(T, event),)
    assert said.startswith("slowed every link of broker 2:")
    if delay:
        assert f"round trip +{2 * delay} ms" in said


@pytest.mark.parametrize(
    ("delay", "loss", "error"),
    [
        (-1, 0.0, "--delay-ms must be 0 or more"),
        (100, 1.0, r"--loss must be in \[0, 1\)"),
        (100, -0.1, r"--loss must be in \[0, 1\)"),
        (0, 0.0, "slows nothing"),
    ],
)
def test_slow_errors(delay: int, loss: float, error: str) -> None:
    with pytest.raises(nf.FaultError, match=error):
        nf.plan_slow(empty(), nodes()[4], delay, loss, T)


def test_faults_add_up_and_heal_clears_them_all() -> None:
    table, _ = nf.plan_partition(empty(), [[B1], [B2, B3]], T)
    table, _ = nf.plan_slow(table, nodes()[4], 200, 0.1, T + 1)
    table, _ = nf.plan_isolate(table, nodes(), C1, "all", T + 2)
    table, _ = nf.plan_slow(table, nodes()[4], 100, 0.0, T + 3)  # replaces broker 2's setting
    assert all_pairs([B1], [B2, B3]) <= cuts(table)
    assert all_pairs([C1], [C2, C3, B1, B2, B3]) <= cuts(table)
    assert table.slow == {B2: nf.Slow(100, 0.0)}
    assert table.no_clients == {C1}
    assert [e.at for e in table.events] == [T, T + 1, T + 2, T + 3]
    healed, said = nf.plan_heal(table)
    assert healed.empty and not healed.events and healed.nodes == table.nodes
    assert said.startswith("healed the network: every link open, no delay (was: network partition")
    assert nf.plan_heal(healed)[1] == "no network fault was set; nothing to heal"


def test_with_nodes_follows_the_cluster_and_drops_faults_on_removed_nodes() -> None:
    table, _ = nf.plan_isolate(empty(), nodes(), B3, "all", T)
    table, _ = nf.plan_slow(table, nodes()[5], 10, 0.0, T)
    table, _ = nf.plan_partition(table, [[B1], [B2]], T)
    smaller = nf.with_nodes(table, nodes(brokers=2))
    assert B3 not in smaller.nodes
    assert cuts(smaller) == {frozenset((B1, B2))}
    assert not smaller.no_clients and not smaller.slow


def test_touches() -> None:
    table, _ = nf.plan_isolate(empty(), nodes(), B1, "controller", T)
    assert nf.touches(table, B1) and nf.touches(table, C2) and not nf.touches(table, B2)


# -- the file -----------------------------------------------------------------------------------


def test_json_is_the_specs_format_and_round_trips() -> None:
    table, _ = nf.plan_isolate(empty(nodes(2, 1)), nodes(2, 1), B1, "all", T)
    table, _ = nf.plan_slow(table, nodes(2, 1)[2], 200, 0.1, T + 1)
    data = table.to_json()
    assert data == {
        "version": 1,
        "generation": 0,
        "nodes": {C1: "127.0.0.1:9192", B1: "127.0.0.1:9092", B2: "127.0.0.1:9093"},
        "cut": [[C1, B1], [B1, B2]],
        "no_clients": [B1],
        "slow": {B2: {"delay_ms": 200, "loss": 0.1}},
        "events": [
            {"at": T, "text": "broker 1 isolated from every other node and from its clients"},
            {"at": T + 1, "text": "broker 2 slow: +200 ms, 10% loss"},
        ],
    }
    assert nf.FaultTable.from_json(json.loads(json.dumps(data))) == table


@pytest.mark.parametrize(
    "data",
    [
        [],
        {"version": 2},
        {"version": 1, "cut": [["a"]]},
        {"version": 1, "slow": {"x": {}}},
        {"version": 1, "cut": [["a", "a"]]},
    ],
)
def test_bad_tables_are_refused(data: object) -> None:
    with pytest.raises(nf.FaultError):
        nf.FaultTable.from_json(data)


def test_describe() -> None:
    assert nf.describe(empty()) == ["network: no faults set"]
    table, _ = nf.plan_isolate(empty(), nodes(), B1, "controller", T)
    table = nf.FaultTable(
        **{**{f: getattr(table, f) for f in table.__dataclass_fields__}, "generation": 4}
    )
    assert nf.describe(table) == [
        "network faults (faults.json generation 4):",
        "  broker 1 isolated from the controllers",
        "  controller-1 cut from broker 1",
        "  controller-2 cut from broker 1",
        "  controller-3 cut from broker 1",
        "  broker 1 cut from controller-1, controller-2, controller-3",
        "  heal with `minibroker cluster heal`",
    ]


# -- the launcher's file I/O and settings (no process started) -----------------------------------


def saved_cluster(tmp_path: pathlib.Path, controllers: int = 3) -> launcher.ClusterState:
    directory = str(tmp_path / "mb")
    pathlib.Path(directory).mkdir()
    state = launcher.plan_cluster(directory, 3, 0, 9092, {}, controllers=controllers)
    launcher.save_state(state)
    return state


def read(state: launcher.ClusterState) -> dict:  # type: ignore[type-arg]
    return json.loads((pathlib.Path(state.dir) / "faults.json").read_text())


def test_commands_write_the_file_with_a_new_generation_each_time(tmp_path: pathlib.Path) -> None:
    state = saved_cluster(tmp_path)
    assert launcher.current_faults(state.dir)["cut"] == []  # no file: the empty table
    launcher.reset_faults(state)  # what `cluster up` does
    first = read(state)
    assert first["generation"] == 1 and first["cut"] == [] and first["events"] == []
    assert first["nodes"] == {s.name: s.address for s in state.all()}
    said = launcher.partition(state.dir, ["1", "2,3"])
    assert said.startswith("cut broker 1 from broker 2, broker 3;")
    said = launcher.isolate(state.dir, "controller-2", "controller")
    assert said.startswith("cut controller-2 from controller-1, controller-3 (clients")
    said = launcher.slow(state.dir, "broker-2", 200, 0.1)
    data = read(state)
    assert data["generation"] == 4
    assert data["cut"] == [
        ["controller-1", "controller-2"], ["controller-2", "controller-3"],
        ["broker-1", "broker-2"], ["broker-1", "broker-3"],
    ]  # fmt: skip
    assert data["slow"] == {"broker-2": {"delay_ms": 200, "loss": 0.1}}
    assert [e["text"] for e in data["events"]] == [
        "network partition: broker 1 | broker 2, broker 3",
        "controller-2 isolated from the other controllers",
        "broker 2 slow: +200 ms, 10% loss",
    ]
    assert launcher.current_faults(state.dir) == data
    assert not list(pathlib.Path(state.dir).glob("*.tmp"))
    assert launcher.heal(state.dir).startswith("healed the network")
    healed = read(state)
    assert healed["generation"] == 5 and healed["cut"] == [] and healed["slow"] == {}
    assert healed["events"] == [] and healed["nodes"] == data["nodes"]


def test_errors_leave_the_file_alone(tmp_path: pathlib.Path) -> None:
    state = saved_cluster(tmp_path)
    launcher.reset_faults(state)
    for call, error in (
        (lambda: launcher.partition(state.dir, ["1"]), "at least two groups"),
        (lambda: launcher.partition(state.dir, ["1", "brokers"]), "broker 1 is in group 1"),
        (lambda: launcher.isolate(state.dir, "9"), "no broker 9"),
        (lambda: launcher.slow(state.dir, "1", -5), "--delay-ms must be 0 or more"),
        (lambda: launcher.slow(state.dir, "1", 5, 1.5), "--loss must be in"),
    ):
        with pytest.raises(launcher.LauncherError, match=error):
            call()
    assert read(state)["generation"] == 1


def test_the_launcher_never_writes_a_table_the_processes_reject(tmp_path: pathlib.Path) -> None:
    """The processes' parser judges the file: a table naming a node outside `nodes` (which a
    process would log as bad and ignore, keeping its old faults) is refused, the file kept."""
    state = saved_cluster(tmp_path)
    launcher.reset_faults(state)
    bad = nf.FaultTable(
        nodes={"broker-1": "127.0.0.1:1"}, cut=frozenset({("broker-1", "broker-9")})
    )
    with pytest.raises(launcher.LauncherError, match="processes would reject"):
        launcher.write_faults(state.dir, bad, 1)
    assert read(state)["generation"] == 1


def test_controller_in_a_quorum_of_one_is_its_only_controller(tmp_path: pathlib.Path) -> None:
    state = saved_cluster(tmp_path, controllers=1)
    said = launcher.isolate(state.dir, "controller")
    assert said.startswith("cut controller-1 (the active controller) from broker 1, broker 2")
    said = launcher.partition(state.dir, ["1", "controller"])
    assert "(controller-1 is the active controller)" in said


def test_a_bad_file_is_refused_but_heal_rewrites_it(tmp_path: pathlib.Path) -> None:
    state = saved_cluster(tmp_path)
    (pathlib.Path(state.dir) / "faults.json").write_text("{not json")
    with pytest.raises(launcher.LauncherError, match=r"is not a fault table.*cluster heal"):
        launcher.isolate(state.dir, "1")
    assert "error" in launcher.status(state.dir, ask_quorum=False)["faults"]
    launcher.heal(state.dir)
    assert read(state)["cut"] == []


def test_down_removes_the_file_and_add_broker_bookkeeping_follows_the_nodes(
    tmp_path: pathlib.Path,
) -> None:
    state = saved_cluster(tmp_path)
    launcher.reset_faults(state)
    launcher.isolate(state.dir, "3", "all")
    state.brokers.pop()  # broker 3 removed
    launcher.save_state(state)
    launcher.sync_fault_nodes(state)
    data = read(state)
    assert "broker-3" not in data["nodes"] and data["cut"] == [] and data["no_clients"] == []
    launcher.down(state.dir, timeout_s=1.0)  # nothing runs: only the bookkeeping
    assert not (pathlib.Path(state.dir) / "faults.json").exists()


def test_command_for_names_the_file_and_the_node_and_a_users_set_cannot_override(
    tmp_path: pathlib.Path,
) -> None:
    state = saved_cluster(tmp_path)
    state.brokers[0].settings["network.faults.node"] = "broker-9"
    path = str((pathlib.Path(state.dir) / "faults.json").resolve())
    for spec in state.all():
        cmd = launcher.command_for(spec, state)
        sets = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--set"]
        assert f"network.faults.file={path}" in sets
        assert f"network.faults.node={spec.name}" in sets
        assert "network.faults.node=broker-9" not in sets


# -- the CLI ------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="minibroker")
    cluster_cli.register(root.add_subparsers())
    return root


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["partition", "1", "2,3,controller"], {"groups": ["1", "2,3,controller"]}),
        (["isolate", "2"], {"id": "2", "scope": "nodes"}),
        (["isolate", "controller", "--from", "brokers"], {"id": "controller", "scope": "brokers"}),
        (
            ["slow", "2", "--delay-ms", "200", "--loss", "0.1"],
            {"id": "2", "delay_ms": 200, "loss": 0.1},
        ),
        (["slow", "2", "--delay-ms", "5"], {"loss": 0.0}),
        (["heal"], {}),
    ],
)
def test_cli_parses(argv: list[str], expected: dict) -> None:  # type: ignore[type-arg]
    args = parser().parse_args(["cluster", "--dir", "d", *argv])
    for key, value in expected.items():
        assert getattr(args, key) == value


@pytest.mark.parametrize(
    "argv",
    [
        ["partition"],
        ["isolate", "1", "--from", "clients"],
        ["slow", "1"],
        ["slow", "1", "--delay-ms", "x"],
    ],
)
def test_cli_refuses(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["cluster", "--dir", "d", *argv])


def test_cli_runs_the_commands_and_says_errors_in_one_line(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = saved_cluster(tmp_path)

    def run(*argv: str) -> int:
        args = parser().parse_args(["cluster", "--dir", state.dir, *argv])
        return int(args.func(args))

    assert run("isolate", "1", "--from", "controller") == 0
    assert "cut broker 1 from controller-1, controller-2, controller-3" in capsys.readouterr().out
    assert run("partition", "1", "1,2") == 1
    err = capsys.readouterr().err
    assert err.startswith("minibroker cluster: broker 1 is in group 1") and err.count("\n") == 1
    assert run("slow", "2", "--delay-ms", "-3") == 1
    assert "--delay-ms must be 0 or more" in capsys.readouterr().err
    info = launcher.status(state.dir, ask_quorum=False)
    assert info["faults"]["cut"] == [[f"controller-{i}", "broker-1"] for i in (1, 2, 3)]
    lines = cluster_cli.status_lines(info)
    assert lines[lines.index("network faults (faults.json generation 1):") + 1] == (
        "  broker 1 isolated from the controllers"
    )
    assert run("heal") == 0
    assert "healed the network" in capsys.readouterr().out
    assert cluster_cli.status_lines(launcher.status(state.dir, ask_quorum=False))[-1] == (
        "network: no faults set"
    )
