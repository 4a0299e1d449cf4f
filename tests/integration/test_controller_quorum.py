"""The controller quorum as real processes: three (or one) `minibroker controller` voters.

Each test starts real voters on 127.0.0.1 with free ports, kills them with SIGKILL, pauses them
with SIGSTOP, stops them with SIGTERM, and checks what a client can see: one active controller,
NOT_CONTROLLER with a hint everywhere else, and no acknowledged metadata change ever lost
(docs/design.md §6.1, §8). Timers are shortened (quorum_harness.FAST) so failovers are quick;
every wait has a deadline, none is a fixed sleep.
"""

from __future__ import annotations

import pathlib
import signal

import grpc
import pytest
from cluster_harness import wait_until
from quorum_harness import Quorum, not_controller_hint, running_quorum

from minibroker.proto import minibroker_pb2 as pb

pytestmark = pytest.mark.timeout(300)


def _registered(quorum: Quorum, leader_id: int) -> set[int]:
    return set(quorum.image(quorum.voter(leader_id)).brokers)


def test_three_voters_elect_one_active_controller_the_others_answer_not_controller(
    tmp_path: pathlib.Path,
) -> None:
    with running_quorum(tmp_path, 3) as quorum:
        leader = quorum.wait_leader()
        views = quorum.views()
        assert {v.leader_id for v in views.values()} == {leader.node_id}
        assert views[leader.node_id].role == "leader"
        assert len(views[leader.node_id].voters) == 3
        for voter in quorum.voters:
            if voter is leader:
                continue
            with pytest.raises(grpc.RpcError) as caught:
                voter.controller().DescribeCluster(pb.DescribeClusterRequest(), timeout=3)
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert not_controller_hint(caught.value) == f"{leader.node_id}@{leader.address}"
        quorum.register(1)
        # Committed on a majority: every voter's HW reaches the registration.
        offset = quorum.image(leader).next_offset
        wait_until(
            lambda: all(v.high_watermark >= offset for v in quorum.views().values()),
            20,
            "every voter's high watermark at the registration",
        )


def test_sigkill_the_active_controller_five_times_loses_no_acknowledged_change(
    tmp_path: pathlib.Path,
) -> None:
    with running_quorum(tmp_path, 3) as quorum:
        leader = quorum.wait_leader()
        acknowledged: set[int] = set()
        epochs = []
        # Ten kills in a row, with brokers and an acks=all producer: test_quorum_cluster.py.
        for round_ in range(5):
            quorum.register(round_ + 1)
            acknowledged.add(round_ + 1)
            leader, epoch = quorum.leading_now()
            epochs.append(epoch)
            leader.kill()
            new_leader = quorum.wait_leader(other_than=leader.node_id, above_epoch=epoch)
            assert acknowledged <= _registered(quorum, new_leader.node_id)
            leader.start()
            leader = new_leader
        wait_until(lambda: len(quorum.views()) == 3, 30, "every voter answering again")
        final = quorum.wait_leader()
        assert acknowledged <= _registered(quorum, final.node_id)
        assert epochs == sorted(set(epochs)), "quorum epochs only grow"


def test_a_paused_leader_comes_back_as_a_follower_and_its_stale_writes_are_refused(
    tmp_path: pathlib.Path,
) -> None:
    with running_quorum(tmp_path, 3) as quorum:
        quorum.wait_leader()
        quorum.register(1)
        old, epoch = quorum.leading_now()
        old.signal(signal.SIGSTOP)
        try:
            new = wait_until(
                lambda: _leader_among_others(quorum, old.node_id, epoch),
                30,
                "a new leader while the old one is paused",
            )
            quorum.register(2)
        finally:
            old.signal(signal.SIGCONT)
        # Back, it learns the new epoch and follows; it never acts as controller again.
        wait_until(
            lambda: (
                quorum.views().get(old.node_id, pb.DescribeQuorumResponse()).leader_id
                == new.node_id
            ),
            30,
            "the resumed voter following the new leader",
        )
        with pytest.raises(grpc.RpcError) as caught:
            old.controller().RegisterBroker(
                pb.BrokerRegistrationRequest(
                    broker_id=3,
                    cluster_id=quorum.cluster_id,
                    incarnation_id="stale",
                    host="127.0.0.1",
                    port=40003,
                    previous_broker_epoch=-1,
                    metrics_port=-1,
                ),
                timeout=3,
            )
        assert not_controller_hint(caught.value) == f"{new.node_id}@{new.address}"
        assert {1, 2} <= _registered(quorum, new.node_id)
        assert 3 not in _registered(quorum, new.node_id)
        resigned = old.events("quorum_resigned") + old.events("controller_deactivated")
        assert resigned, "the paused leader says it gave up"


def _leader_among_others(quorum: Quorum, old_id: int, epoch: int) -> object:
    """The leader the running, unpaused voters agree on, above `epoch` and not `old_id`."""
    views = {}
    for voter in quorum.voters:
        if voter.node_id == old_id:
            continue
        try:
            views[voter.node_id] = voter.describe_quorum(timeout_s=1.0)
        except grpc.RpcError:
            return None
    leaders = {(v.leader_id, v.leader_epoch) for v in views.values()}
    if len(leaders) != 1:
        return None
    leader_id, leader_epoch = leaders.pop()
    if leader_id < 0 or leader_id == old_id or leader_epoch <= epoch:
        return None
    voter = quorum.voter(leader_id)
    try:
        voter.controller().DescribeCluster(pb.DescribeClusterRequest(), timeout=2)
    except grpc.RpcError:
        return None
    return voter


def test_a_graceful_stop_hands_over_with_end_quorum_epoch(tmp_path: pathlib.Path) -> None:
    with running_quorum(tmp_path, 3) as quorum:
        quorum.wait_leader()
        quorum.register(1)
        leader, epoch = quorum.leading_now()
        assert leader.terminate() == 0
        new = quorum.wait_leader(other_than=leader.node_id, above_epoch=epoch)
        assert 1 in _registered(quorum, new.node_id)
        # The hand-over was asked for, not found by a timeout.
        assert any(v.events("quorum_leader_resigning") for v in quorum.voters if v is not leader)
        assert leader.events("quorum_resigned")[-1]["reason"] == "shutdown"


def test_a_quorum_without_majority_elects_nobody_and_says_why(tmp_path: pathlib.Path) -> None:
    with running_quorum(tmp_path, 3) as quorum:
        leader = quorum.wait_leader()
        others = [v for v in quorum.voters if v is not leader]
        others[0].kill()
        others[1].kill()

        def alone() -> str:
            view = leader.describe_quorum()
            return view.why_no_leader if view.leader_id < 0 else ""

        why = wait_until(alone, 30, "the lone voter to give up leading")
        assert "no majority" in why
        with pytest.raises(grpc.RpcError) as caught:
            leader.controller().DescribeCluster(pb.DescribeClusterRequest(), timeout=5)
        assert not_controller_hint(caught.value) == ""
        others[0].start()
        new = quorum.wait_leader()
        assert new.running


def test_a_voter_with_another_voter_list_is_refused_and_says_so(tmp_path: pathlib.Path) -> None:
    with running_quorum(tmp_path, 3) as quorum:
        quorum.wait_leader()
        odd = quorum.voters[2]
        odd.kill()
        wrong = ",".join(
            f"{v.node_id}@127.0.0.1:{v.port + (1 if v is quorum.voters[1] else 0)}"
            for v in quorum.voters
        )
        odd.start(**{"controller.quorum.voters": wrong})
        wait_until(
            lambda: any(
                e.get("error") == "INCONSISTENT_VOTER_SET"
                for v in quorum.voters
                for e in v.events("quorum_peer_refused")
            ),
            30,
            "a voter set mismatch logged",
        )
        leader = quorum.wait_leader()
        quorum.register(1)
        assert leader.node_id != odd.node_id


def test_fresh_voters_without_a_cluster_id_refuse_to_start(tmp_path: pathlib.Path) -> None:
    quorum = Quorum(tmp_path, 3)
    voter = quorum.voters[0]
    try:
        voter.start(**{"cluster.id": ""})
        assert voter.proc is not None
        assert voter.proc.wait(30) != 0
        assert "cluster.id" in voter.output()
    finally:
        quorum.stop()


def test_a_voter_holding_another_clusters_data_refuses_to_start(tmp_path: pathlib.Path) -> None:
    with running_quorum(tmp_path, 3) as quorum:
        quorum.wait_leader()
        voter = quorum.voters[0]
        voter.kill()
        voter.start(**{"cluster.id": "AnotherClusterAAAAAAAA"})
        assert voter.proc is not None
        assert voter.proc.wait(30) != 0
        assert "another cluster" in voter.output()
