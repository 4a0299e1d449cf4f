"""The controller quorum's fault paths as real processes (docs/design.md §6.1, protocol.md §24).

Three `minibroker controller` voters (quorum_harness) with short timers: a follower far behind
that must load the leader's snapshot (FetchSnapshot), a voter whose data dir was wiped (it must
not help elect a leader missing committed records), a corrupted quorum-state file, the
EndQuorumEpoch hand-over on a graceful stop, and the raft metrics. Every wait has a deadline,
none is a fixed sleep; the harness kills every process by PID at the end.
"""

from __future__ import annotations

import datetime
import pathlib
from typing import Any

import pytest
from cluster_harness import wait_until
from quorum_harness import Quorum, Voter, running_quorum

pytestmark = pytest.mark.timeout(120)

ACTIVE = "kafka_controller_KafkaController_ActiveControllerCount"
RAFT = "kafka_server_raft_metrics_"


def _registered(quorum: Quorum, voter: Voter) -> set[int]:
    return set(quorum.image(voter).brokers)


def _at(event: dict[str, Any]) -> datetime.datetime:
    return datetime.datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00"))


def _hw(quorum: Quorum, voter: Voter) -> int:
    view = quorum.views().get(voter.node_id)
    return view.high_watermark if view is not None else -1


def test_a_follower_far_behind_loads_the_leaders_snapshot_and_can_lead_with_it(
    tmp_path: pathlib.Path,
) -> None:
    settings = {"metadata.snapshot.interval.records": "5"}
    with running_quorum(tmp_path, 3, settings) as quorum:
        leader = quorum.wait_leader()
        behind = next(v for v in quorum.voters if v is not leader)
        behind.kill()
        acknowledged = set(range(1, 31))
        for broker_id in sorted(acknowledged):
            quorum.register(broker_id)
        snapshots = wait_until(
            lambda: leader.events("metadata_snapshot_written"), 20, "a snapshot on the leader"
        )
        assert snapshots[-1]["snapshot_offset"] > 5
        behind.start()
        loaded = wait_until(
            lambda: behind.events("quorum_snapshot_loaded", behind.runs),
            20,
            "the restarted follower loading the leader's snapshot",
        )
        assert loaded[0]["snapshot_offset"] > 5
        target = _hw(quorum, leader)
        wait_until(lambda: _hw(quorum, behind) >= target, 20, "the follower caught up")
        # Make it lead: kill whoever leads instead (restarting the one killed before, disk
        # intact, so that two voters always run) until the election falls on it.
        down: Voter | None = None
        for _ in range(8):
            current, epoch = quorum.leading_now()
            if current is behind:
                break
            current.kill()
            if down is not None:
                down.start()
            down = current
            quorum.wait_leader(other_than=down.node_id, above_epoch=epoch)
        current, _ = quorum.leading_now()
        assert current is behind, "the caught-up follower never became leader"
        assert acknowledged <= _registered(quorum, behind)


def test_a_wiped_voter_cannot_elect_a_leader_missing_committed_changes(
    tmp_path: pathlib.Path,
) -> None:
    with running_quorum(tmp_path, 3) as quorum:
        quorum.wait_leader()
        a, b, c = quorum.voters
        # Every voter has caught up with the first leader's LeaderChange (a voter killed before
        # that counts as one that never caught up, and with B's disk lost as well no leader
        # could be elected: safe, but not this test's case).
        wait_until(
            lambda: (
                len(quorum.views()) == 3
                and all(v.high_watermark >= 1 for v in quorum.views().values())
            ),
            20,
            "every voter past the first LeaderChange",
        )
        # C is behind: every change below is committed by A and B only.
        c.kill()
        acknowledged = set(range(1, 6))
        for broker_id in sorted(acknowledged):
            quorum.register(broker_id)
        a.kill()
        b.kill()
        b.wipe()
        c.start()
        b.start()
        # B came back empty, with no quorum-state file: it may have lost committed records, so
        # it votes only for an empty log. C (a stale log) must not win with B's vote.
        wait_until(lambda: len(quorum.views()) == 2, 20, "B and C answering")
        # (C restarts as a follower of its persisted leader of the old epoch and names it until
        # its fetch timeout: a stale hint, not an election; roles tell.)
        roles_seen: set[str] = set()

        def c_tried_three_times() -> bool:
            roles_seen.update(v.role for v in quorum.views().values())
            elected = bool({"leader", "candidate"} & roles_seen)
            return elected or len(c.events("quorum_prevote_started", c.runs)) >= 3

        wait_until(c_tried_three_times, 20, "C to try (and fail) three elections")
        assert "leader" not in roles_seen, "a leader was elected without the committed changes"
        assert "candidate" not in roles_seen, "B granted C a pre-vote"
        assert not b.events("quorum_vote_granted", b.runs)
        assert not c.events("quorum_election_started", c.runs)
        assert not c.events("quorum_election_won", c.runs)
        # A holds every committed change: it is elected (C's vote, B still refusing).
        a.start()
        leader = quorum.wait_leader()
        assert leader is a
        assert acknowledged <= _registered(quorum, leader)
        catching = wait_until(
            lambda: b.events("quorum_catching_up", b.runs), 20, "B catching up to a leader's HW"
        )
        wait_until(lambda: b.events("quorum_caught_up", b.runs), 20, "B caught up")
        # A leader reports no HW (-1) until its LeaderChange commits, so B's target is never
        # a restarted leader's stale 0: it is past every acknowledged change.
        assert catching[0]["target"] > 0
        # Caught up, B votes normally again: stop A and B + C elect a leader with everything.
        epoch = quorum.epoch()
        target = _hw(quorum, a)
        wait_until(lambda: _hw(quorum, b) >= target, 20, "B's HW at the leader's")
        a.kill()
        successor = quorum.wait_leader(other_than=a.node_id, above_epoch=epoch)
        assert acknowledged <= _registered(quorum, successor)


def test_a_corrupted_quorum_state_file_refuses_to_start_and_names_it(
    tmp_path: pathlib.Path,
) -> None:
    with running_quorum(tmp_path, 3) as quorum:
        leader = quorum.wait_leader()
        voter = next(v for v in quorum.voters if v is not leader)
        voter.kill()
        state_file = voter.data_dir / "quorum-state"
        assert state_file.exists()
        state_file.write_bytes(b'{"leaderId": 1001, "leaderEp')
        voter.start()
        assert voter.proc is not None
        assert voter.proc.wait(30) != 0
        output = voter.output()
        assert str(state_file) in output
        assert "not a usable quorum-state file" in output
        assert "Traceback" not in output
        # The file is left as it was, for the operator.
        assert state_file.read_bytes() == b'{"leaderId": 1001, "leaderEp'


def test_a_graceful_stop_hands_over_to_the_first_successor_at_once(
    tmp_path: pathlib.Path,
) -> None:
    with running_quorum(tmp_path, 3) as quorum:
        quorum.wait_leader()
        quorum.register(1)
        old, epoch = quorum.leading_now()
        assert old.terminate() == 0
        new = quorum.wait_leader(other_than=old.node_id, above_epoch=epoch)
        resigned = [e for e in old.events("quorum_resigned") if e["epoch"] == epoch]
        assert [e["reason"] for e in resigned] == ["shutdown"]
        won = [e for e in new.events("quorum_election_won") if e["epoch"] > epoch]
        assert won and _at(won[0]) >= _at(resigned[0])
        # Every other voter heard EndQuorumEpoch; the first successor waits 0 ms, the next
        # one position x election timeout / n.
        resigning = {
            v.node_id: [e for e in v.events("quorum_leader_resigning") if e["epoch"] == epoch]
            for v in quorum.voters
            if v is not old
        }
        assert all(len(events) == 1 for events in resigning.values()), resigning
        delays = {node: events[0]["delay_ms"] for node, events in resigning.items()}
        first = [node for node, delay in delays.items() if delay == 0]
        assert len(first) == 1 and sorted(delays.values())[1] > 0, delays
        successor = quorum.voter(first[0])
        told = resigning[successor.node_id][0]
        prevotes = [
            e
            for e in successor.events("quorum_prevote_started")
            if e["epoch"] == epoch and _at(e) >= _at(told)
        ]
        assert prevotes, "the first successor did not pre-vote on EndQuorumEpoch"
        assert new is successor
        assert 1 in _registered(quorum, new)


def _scrape_all(quorum: Quorum) -> dict[int, dict[str, float]]:
    return {v.node_id: v.scrape() for v in quorum.running()}


def test_raft_metrics_agree_and_exactly_one_voter_is_the_active_controller(
    tmp_path: pathlib.Path,
) -> None:
    with running_quorum(tmp_path, 3, metrics=True) as quorum:
        leader = quorum.wait_leader()
        quorum.register(1)
        quorum.register(2)
        wait_until(lambda: all(v.metrics_port() > 0 for v in quorum.voters), 20, "ports")

        def settled() -> dict[int, dict[str, float]] | None:
            metrics = _scrape_all(quorum)
            agreed = {
                name: {m[RAFT + name] for m in metrics.values()}
                for name in ("current_leader", "current_epoch", "high_watermark")
            }
            if any(len(values) != 1 for values in agreed.values()):
                return None
            return metrics

        metrics = wait_until(settled, 20, "the voters' raft metrics to agree")
        epoch = quorum.views()[leader.node_id].leader_epoch
        for node_id, m in metrics.items():
            assert m[ACTIVE] == (1 if node_id == leader.node_id else 0), (node_id, m[ACTIVE])
            assert m[RAFT + "current_leader"] == leader.node_id
            assert m[RAFT + "current_epoch"] == epoch
            assert m[RAFT + "high_watermark"] >= 3  # LeaderChange + two registrations
        assert sum(m[ACTIVE] for m in metrics.values()) == 1
        # After a failover the count moves with the leadership.
        leader.kill()
        new = quorum.wait_leader(other_than=leader.node_id, above_epoch=epoch)
        metrics = wait_until(settled, 20, "the survivors' raft metrics to agree")
        assert {n: m[ACTIVE] for n, m in metrics.items()} == {
            n: (1 if n == new.node_id else 0) for n in metrics
        }
        assert all(m[RAFT + "current_leader"] == new.node_id for m in metrics.values())
