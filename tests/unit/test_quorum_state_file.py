"""The quorum-state file (controller/quorum/state_file.py): round trip, Kafka's JSON shape,
atomic writes, and a clear error (never a silent reset) for a file that does not parse."""

from __future__ import annotations

import json
import pathlib

import pytest

from minibroker.controller.journal import JournalError
from minibroker.controller.quorum.messages import CATCH_UP_UNKNOWN, CAUGHT_UP, QuorumState
from minibroker.controller.quorum.state_file import (
    QuorumStateError,
    quorum_state_path,
    read_quorum_state,
    write_quorum_state,
)


def test_missing_file_is_none(tmp_path: pathlib.Path) -> None:
    assert read_quorum_state(tmp_path) is None


@pytest.mark.parametrize(
    "state",
    [
        QuorumState(),
        QuorumState(epoch=7, voted_for=1001, leader_id=1002, catching_up_to=CAUGHT_UP),
        QuorumState(epoch=1, voted_for=-1, leader_id=-1, catching_up_to=CATCH_UP_UNKNOWN),
        QuorumState(epoch=3, voted_for=1000, leader_id=-1, catching_up_to=42),
    ],
)
def test_round_trip(tmp_path: pathlib.Path, state: QuorumState) -> None:
    write_quorum_state(tmp_path, state)
    assert read_quorum_state(tmp_path) == state


def test_kafka_shape_and_no_temp_left(tmp_path: pathlib.Path) -> None:
    write_quorum_state(tmp_path, QuorumState(epoch=5, voted_for=1001, leader_id=1002))
    write_quorum_state(tmp_path, QuorumState(epoch=6, voted_for=1000, leader_id=-1))
    doc = json.loads(quorum_state_path(tmp_path).read_text())
    assert doc == {
        "leaderId": -1,
        "leaderEpoch": 6,
        "votedId": 1000,
        "appliedOffset": 0,
        "currentVoters": None,
        "data_version": 0,
        "catchingUpTo": CAUGHT_UP,
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["quorum-state"]


def test_kafka_file_without_catching_up_to_reads_as_caught_up(tmp_path: pathlib.Path) -> None:
    quorum_state_path(tmp_path).write_text(
        '{"clusterId":"","leaderId":1,"leaderEpoch":2,"votedId":-1,"appliedOffset":0,'
        '"currentVoters":null,"data_version":0}'
    )
    assert read_quorum_state(tmp_path) == QuorumState(2, -1, 1, CAUGHT_UP)


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"{", id="torn-json"),
        pytest.param(b"\xff\xfe{}", id="not-utf8"),
        pytest.param(b"[1, 2]", id="not-object"),
        pytest.param(b'{"leaderId": 1, "votedId": -1, "data_version": 0}', id="no-epoch"),
        pytest.param(
            b'{"leaderId": 1, "leaderEpoch": "2", "votedId": -1, "data_version": 0}',
            id="epoch-string",
        ),
        pytest.param(
            b'{"leaderId": 1, "leaderEpoch": true, "votedId": -1, "data_version": 0}',
            id="epoch-bool",
        ),
        pytest.param(
            b'{"leaderId": 1, "leaderEpoch": -3, "votedId": -1, "data_version": 0}',
            id="negative-epoch",
        ),
        pytest.param(
            b'{"leaderId": -5, "leaderEpoch": 3, "votedId": -1, "data_version": 0}',
            id="bad-leader",
        ),
        pytest.param(
            b'{"leaderId": 1, "leaderEpoch": 3, "votedId": -1, "data_version": 1}',
            id="unknown-version",
        ),
        pytest.param(
            b'{"leaderId": 1, "leaderEpoch": 3, "votedId": -1, "data_version": 0, '
            b'"catchingUpTo": -9}',
            id="bad-catching-up-to",
        ),
    ],
)
def test_corrupt_file_is_a_clear_error_and_left_untouched(
    tmp_path: pathlib.Path, content: bytes
) -> None:
    path = quorum_state_path(tmp_path)
    path.write_bytes(content)
    with pytest.raises(QuorumStateError) as caught:
        read_quorum_state(tmp_path)
    assert isinstance(caught.value, JournalError)
    assert str(path) in str(caught.value) and "quorum-state" in str(caught.value)
    assert path.read_bytes() == content
