"""The launcher's quorum layout and `cluster status`'s quorum section, without processes.

Voters strings (docs/design.md §6.1: `id@host:port`, sorted, controller-i = 999+i), the cluster
id format (Kafka's: 22 URL-safe base64 characters of a UUID), process addressing (`controller` =
the active one, `controller-2`), the command lines a quorum's processes get, and the status built
from DescribeQuorum answers, including "why no leader".
"""

from __future__ import annotations

import base64
import json
import uuid

import pytest

from minibroker.deploy import cluster as launcher
from minibroker.deploy import quorum
from minibroker.deploy.cluster_cli import quorum_status_from_json, status_lines
from minibroker.proto import minibroker_pb2 as pb


def plan(controllers: int, base_port: int = 9092) -> launcher.ClusterState:
    return launcher.plan_cluster(
        "/nonexistent", brokers=3, racks=0, base_port=base_port, settings={},
        controllers=controllers,
    )  # fmt: skip


# -- layout -------------------------------------------------------------------------------------


def test_controller_ids_and_names() -> None:
    assert [quorum.controller_id(i) for i in (1, 2, 3)] == [1000, 1001, 1002]
    assert quorum.controller_name(2) == "controller-2"
    assert quorum.controller_index(1002) == 3


def test_voters_string_is_sorted_and_round_trips() -> None:
    text = quorum.voters_string([(1002, "h:3"), (1000, "h:1"), (1001, "h:2")])
    assert text == "1000@h:1,1001@h:2,1002@h:3"
    assert quorum.parse_voters(text) == [(1000, "h:1"), (1001, "h:2"), (1002, "h:3")]
    for bad in ("1000h:1", "x@h:1", "1000@h", "1000@:1"):
        with pytest.raises(ValueError):
            quorum.parse_voters(bad)


def test_cluster_id_is_kafkas_format() -> None:
    value = uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8")
    cid = quorum.new_cluster_id(value)
    assert len(cid) == 22 and "=" not in cid
    assert base64.urlsafe_b64decode(cid + "==") == value.bytes
    assert quorum.new_cluster_id() != quorum.new_cluster_id()


def test_quorum_sizes() -> None:
    for n in (1, 3, 5):
        quorum.check_quorum_size(n)
    for n in (0, 2, 4, 7):
        with pytest.raises(ValueError, match="one of 1, 3, 5"):
            quorum.check_quorum_size(n)
    with pytest.raises(launcher.LauncherError):
        plan(2)


def test_plan_of_three_controllers() -> None:
    state = plan(3)
    assert [c.node_id for c in state.controllers] == [1000, 1001, 1002]
    assert [c.port for c in state.controllers] == [9192, 9193, 9194]
    assert [c.metrics_port for c in state.controllers] == [10192, 10193, 10194]
    # controller-1 keeps the single controller's folder: a quorum of one upgrades in place.
    assert state.controllers[0].data_dir.endswith("/controller/data")
    assert state.controllers[1].data_dir.endswith("/controller-2/data")
    assert state.voters == "1000@127.0.0.1:9192,1001@127.0.0.1:9193,1002@127.0.0.1:9194"
    assert len(state.cluster_id) == 22
    assert state.controller_bootstrap == "127.0.0.1:9192,127.0.0.1:9193,127.0.0.1:9194"


def test_plan_with_free_ports_names_every_port_up_front() -> None:
    state = plan(5, base_port=0)
    ports = [s.port for s in state.all()] + [s.metrics_port for s in state.all()]
    assert len(set(ports)) == len(ports) and all(p > 0 for p in ports)
    assert [p for _, p in [a.rsplit(":", 1) for a in state.controller_bootstrap.split(",")]] == [
        str(c.port) for c in state.controllers
    ]


def launcher_sets(cmd: list[str]) -> list[str]:
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == "--set"]


def test_single_controller_keeps_todays_layout_and_command() -> None:
    state = plan(1)
    assert state.cluster_id == ""
    assert state.controller.node_id == 1000 and state.controller.port == 9192
    cmd = launcher.command_for(state.controller, state)
    assert "--node-id" not in cmd
    # Only the fault table every process polls (SPEC-15): no quorum setting.
    assert all(s.startswith("network.faults.") for s in launcher_sets(cmd))
    broker = launcher.command_for(state.brokers[0], state)
    assert broker[broker.index("--controller") + 1] == "127.0.0.1:9192"


def test_quorum_commands() -> None:
    state = plan(3)
    state.controllers[1].settings["controller.quorum.voters"] = "1@wrong:1"  # the launcher wins
    cmd = launcher.command_for(state.controllers[1], state)
    assert cmd[cmd.index("--node-id") + 1] == "1001"
    sets = [s for s in launcher_sets(cmd) if not s.startswith("network.faults.")]
    assert sets == [f"cluster.id={state.cluster_id}", f"controller.quorum.voters={state.voters}"]
    broker = launcher.command_for(state.brokers[0], state)
    assert broker[broker.index("--controller") + 1] == state.controller_bootstrap


def test_state_round_trips_and_reads_a_pre_quorum_file() -> None:
    state = plan(3)
    again = launcher.ClusterState.from_json("/nonexistent", json.loads(json.dumps(state.to_json())))
    assert again.to_json() == state.to_json()
    old = plan(1).to_json()
    del old["controllers"], old["cluster_id"]
    old["controller"]["node_id"] = -1  # how the launcher wrote it before the quorum
    loaded = launcher.ClusterState.from_json("/nonexistent", old)
    assert [c.node_id for c in loaded.controllers] == [1000]
    assert loaded.controller.name == "controller-1" and not loaded.is_quorum


# -- addressing ---------------------------------------------------------------------------------


def test_parse_target() -> None:
    assert quorum.parse_target("controller", 3) == quorum.Target("active")
    assert quorum.parse_target("controller-2", 3) == quorum.Target("controller", 2)
    assert quorum.parse_target("Controller2", 3) == quorum.Target("controller", 2)
    assert quorum.parse_target("1002", 3) == quorum.Target("controller", 3)
    assert quorum.parse_target("2", 3) == quorum.Target("broker", 2)
    with pytest.raises(ValueError, match="controller-1, controller-2, controller-3"):
        quorum.parse_target("controller-4", 3)
    with pytest.raises(ValueError, match="unknown process"):
        quorum.parse_target("zookeeper", 3)


def test_find() -> None:
    state = plan(3)
    assert state.find("controller-3") is state.controllers[2]
    assert state.find("controller", active=2) is state.controllers[1]
    with pytest.raises(launcher.LauncherError, match="no active controller"):
        state.find("controller")
    assert state.find("2") is state.brokers[1]
    with pytest.raises(launcher.LauncherError, match="no broker 9"):
        state.find("9")
    single = plan(1)
    assert single.find("controller") is single.controller
    assert single.find("controller-1") is single.controller


# -- status from DescribeQuorum answers ---------------------------------------------------------


def voter(index: int, state: str = "running", answer: quorum.QuorumAnswer | None = None,
          error: str = "") -> quorum.VoterInput:  # fmt: skip
    return quorum.VoterInput(
        node_id=quorum.controller_id(index),
        name=quorum.controller_name(index),
        address=f"127.0.0.1:{9191 + index}",
        state=state,
        pid=100 + index,
        answer=answer,
        error=error,
    )


def leader_answer() -> quorum.QuorumAnswer:
    msg = pb.DescribeQuorumResponse(
        cluster_id="cid",
        node_id=1001,
        role="leader",
        leader_id=1001,
        leader_epoch=4,
        leader_address="127.0.0.1:9193",
        high_watermark=120,
        log_end_offset=125,
        voters=[
            pb.QuorumVoter(voter_id=1000, address="127.0.0.1:9192", log_end_offset=100,
                           last_fetch_ms_ago=40, last_caught_up_ms_ago=900),
            pb.QuorumVoter(voter_id=1001, address="127.0.0.1:9193", log_end_offset=125,
                           last_fetch_ms_ago=0, last_caught_up_ms_ago=0),
            pb.QuorumVoter(voter_id=1002, address="127.0.0.1:9194", log_end_offset=-1,
                           last_fetch_ms_ago=-1, last_caught_up_ms_ago=-1),
        ],
    )  # fmt: skip
    return quorum.answer_from_pb(msg)


def follower(node_id: int, leader_id: int = 1001, epoch: int = 4, end: int = 110,
             why: str = "") -> quorum.QuorumAnswer:  # fmt: skip
    return quorum.QuorumAnswer(
        node_id=node_id,
        role="follower" if leader_id >= 0 else "prospective",
        leader_id=leader_id,
        leader_epoch=epoch,
        log_end_offset=end,
        why_no_leader=why,
    )


def test_status_with_a_leader() -> None:
    status = quorum.quorum_status(
        [voter(1, answer=follower(1000)), voter(2, answer=leader_answer()), voter(3, "paused")]
    )
    assert (status.leader_id, status.epoch, status.high_watermark) == (1001, 4, 120)
    assert status.leader_name == "controller-2" and status.why_no_leader == ""
    rows = {r.name: r for r in status.voters}
    # Log ends and lag as the leader sees them (not the follower's own 110).
    assert (rows["controller-1"].log_end_offset, rows["controller-1"].lag) == (100, 25)
    assert (rows["controller-2"].log_end_offset, rows["controller-2"].lag) == (125, 0)
    assert rows["controller-3"].role == "paused" and rows["controller-3"].log_end_offset is None
    assert rows["controller-1"].last_fetch_ms_ago == 40
    assert quorum.active_controller(status) == 2
    text = "\n".join(quorum.render_quorum(status))
    assert "leader controller-2 (node 1001), epoch 4, high watermark 120" in text
    assert "controller-1   1000  127.0.0.1:9192     follower" in text
    assert "paused" in text


def test_status_without_a_majority() -> None:
    status = quorum.quorum_status(
        [voter(1, answer=follower(1000, leader_id=-1)), voter(2, "stopped"),
         voter(3, error="UNAVAILABLE")]
    )  # fmt: skip
    assert status.leader_id == quorum.NO_LEADER
    assert status.why_no_leader.startswith("no majority: 2 of 3 voters down")
    assert "controller-2 stopped" in status.why_no_leader
    assert "controller-3 unreachable" in status.why_no_leader
    assert quorum.active_controller(status) is None
    rows = {r.name: r for r in status.voters}
    assert rows["controller-3"].role == "unreachable (UNAVAILABLE)"
    assert rows["controller-2"].pid is None
    assert "NO LEADER: no majority: 2 of 3 voters down" in quorum.render_quorum(status)[0]


def test_status_when_the_voters_say_why() -> None:
    why = "election in progress: epoch 5, voted for 1000"
    status = quorum.quorum_status(
        [voter(i, answer=follower(999 + i, leader_id=-1, epoch=5, why=why)) for i in (1, 2, 3)]
    )
    assert status.epoch == 5
    assert status.why_no_leader.count(why) == 3 and "controller-2: " in status.why_no_leader


def test_status_of_a_controller_without_quorum_service() -> None:
    status = quorum.quorum_status([voter(1, answer=quorum.unimplemented_answer(1000))])
    assert status.leader_id == 1000 and status.epoch == -1
    assert "epoch ?" in quorum.render_quorum(status)[0]


def test_the_leaders_highest_epoch_wins() -> None:
    stale = quorum.QuorumAnswer(node_id=1000, role="leader", leader_id=1000, leader_epoch=3)
    status = quorum.quorum_status([voter(1, answer=stale), voter(2, answer=leader_answer())])
    assert (status.leader_id, status.epoch) == (1001, 4)


def test_status_lines_from_json() -> None:
    status = quorum.quorum_status(
        [voter(1, answer=follower(1000)), voter(2, answer=leader_answer()), voter(3, "stopped")]
    )
    data = json.loads(json.dumps(status.to_json()))
    assert quorum_status_from_json(data) == status
    state = plan(3)
    info = {
        "controllers": [
            {"name": c.name, "state": "running", "pid": 1, "address": c.address,
             "metrics_port": c.metrics_port, "log_file": "x.log"}
            for c in state.controllers
        ],
        "brokers": [],
        "quorum": data,
    }  # fmt: skip
    lines = status_lines(info)
    assert lines[1].startswith("controller-1   running")
    assert any("leader controller-2" in line for line in lines)
