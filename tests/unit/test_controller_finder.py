"""The controller finder: the configured list, NOT_CONTROLLER hints, epoch ordering, and the
DescribeQuorum search with its fallbacks (UNAVAILABLE / DEADLINE_EXCEEDED: next controller;
UNIMPLEMENTED: a controller from before the quorum is the controller)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from minibroker.client.controller_finder import (
    ControllerFinder,
    LeaderHint,
    ask_quorum,
    best_answer,
    hint_from_describe,
    hint_from_error,
    hint_from_trailing_metadata,
    parse_controllers,
    parse_leader,
)
from minibroker.proto import minibroker_pb2 as pb


def _meta(leader: str, epoch: str = "7") -> tuple[tuple[str, str], ...]:
    return (
        ("minibroker-error", "NOT_CONTROLLER"),
        ("minibroker-controller-leader", leader),
        ("minibroker-controller-epoch", epoch),
    )


def test_parse_controllers_accepts_lists_voters_and_sequences() -> None:
    assert parse_controllers("127.0.0.1:9093") == ("127.0.0.1:9093",)
    assert parse_controllers(" a:1, b:2 ,a:1,") == ("a:1", "b:2")
    assert parse_controllers("1000@a:1,1001@b:2") == ("a:1", "b:2")
    assert parse_controllers(["a:1", "PLAINTEXT://b:2"]) == ("a:1", "b:2")
    for bad in ("", "a", "a:b", ":1", "a:0", "1000@"):
        with pytest.raises(ValueError):
            parse_controllers(bad)


def test_parse_leader() -> None:
    assert parse_leader("1001@h:9094") == (1001, "h:9094")
    assert parse_leader("") == (-1, "")
    assert parse_leader("h:9094") == (-1, "")
    assert parse_leader("x@h:9094") == (-1, "")


def test_hint_from_trailing_metadata() -> None:
    assert hint_from_trailing_metadata(_meta("1001@h:9094")) == LeaderHint(1001, "h:9094", 7)
    assert hint_from_trailing_metadata(_meta("")) == LeaderHint(-1, "", 7)
    assert hint_from_trailing_metadata(_meta("", epoch="")) == LeaderHint(-1, "", -1)
    # bytes values (binary metadata) and upper-case keys are read the same way
    raw = tuple((k.upper(), v.encode()) for k, v in _meta("1002@h:1", "3"))
    assert hint_from_trailing_metadata(raw) == LeaderHint(1002, "h:1", 3)
    assert hint_from_trailing_metadata((("minibroker-error", "OTHER"),)) is None
    assert hint_from_trailing_metadata(()) is None
    assert hint_from_trailing_metadata(None) is None


class _Err(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, trailing: object = ()) -> None:
        self._code, self._trailing = code, trailing

    def code(self) -> grpc.StatusCode:
        return self._code

    def trailing_metadata(self) -> object:
        return self._trailing


def test_hint_from_error() -> None:
    err = _Err(grpc.StatusCode.FAILED_PRECONDITION, _meta("1001@h:2"))
    assert hint_from_error(err) == LeaderHint(1001, "h:2", 7)
    assert hint_from_error(_Err(grpc.StatusCode.UNAVAILABLE)) is None
    assert hint_from_error(ValueError("no metadata")) is None


def test_hint_from_describe() -> None:
    answer = pb.DescribeQuorumResponse(leader_id=1001, leader_epoch=4, leader_address="h:2")
    assert hint_from_describe(answer) == LeaderHint(1001, "h:2", 4)
    none = pb.DescribeQuorumResponse(leader_id=-1, leader_epoch=5)
    assert hint_from_describe(none) == LeaderHint(-1, "", 5)
    assert hint_from_describe(pb.DescribeQuorumResponse(error_code=42)) is None


def test_best_answer_takes_the_highest_epoch_naming_a_leader() -> None:
    answers = [
        LeaderHint(1000, "a:1", 3),
        None,
        LeaderHint(-1, "", 9),  # knows no leader: not an answer to follow
        LeaderHint(1001, "b:2", 4),
        LeaderHint(1002, "c:3", 4),
    ]
    assert best_answer(answers) == LeaderHint(1001, "b:2", 4)
    assert best_answer([None, LeaderHint(-1, "", 2)]) is None


def test_single_controller_is_the_target_without_asking() -> None:
    finder = ControllerFinder(["a:1"])
    assert finder.target() == "a:1"
    finder.unreachable("a:1")
    assert finder.target() == "a:1"


def test_several_controllers_need_a_search_first() -> None:
    finder = ControllerFinder(["a:1", "b:2", "c:3"])
    assert finder.target() is None
    assert finder.observe(LeaderHint(1001, "b:2", 4))
    assert finder.target() == "b:2"
    finder.unreachable("a:1")  # not the leader: nothing changes
    assert finder.target() == "b:2"
    finder.unreachable("b:2")
    assert finder.target() is None
    assert finder.epoch == 4


def test_never_back_to_an_older_epochs_leader() -> None:
    finder = ControllerFinder(["a:1", "b:2", "c:3"])
    finder.observe(LeaderHint(1001, "b:2", 5))
    assert not finder.observe(LeaderHint(1000, "a:1", 4))
    assert finder.target() == "b:2"
    # the leader is gone and a stale voter still names the old one
    finder.unreachable("b:2")
    assert not finder.observe(LeaderHint(1000, "a:1", 4))
    assert finder.target() is None
    # a second leader in the same epoch cannot be: the known one is kept
    finder.observe(LeaderHint(1001, "b:2", 5))
    assert not finder.observe(LeaderHint(1002, "c:3", 5))
    assert finder.target() == "b:2"
    assert finder.observe(LeaderHint(1002, "c:3", 6))
    assert (finder.target(), finder.leader_id, finder.epoch) == ("c:3", 1002, 6)


def test_not_controller_moves_to_the_hint_or_forgets_the_leader() -> None:
    finder = ControllerFinder(["a:1", "b:2", "c:3"])
    finder.observe(LeaderHint(1000, "a:1", 2))
    assert finder.not_controller("a:1", LeaderHint(1001, "b:2", 3))
    assert finder.target() == "b:2"
    # the leader resigned in its own epoch and knows no successor yet
    assert finder.not_controller("b:2", LeaderHint(-1, "", 3))
    assert finder.target() is None
    # a newer epoch without a leader forgets a leader learned earlier
    finder.observe(LeaderHint(1002, "c:3", 3))
    assert finder.not_controller("a:1", LeaderHint(-1, "", 4))
    assert finder.target() is None and finder.epoch == 4
    # a stale hint from a lagging voter changes nothing
    assert not finder.not_controller("a:1", LeaderHint(1000, "a:1", 2))


class _Aio(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=code.name)


def _describer(answers: dict[str, object], asked: list[tuple[str, float]]):  # type: ignore[no-untyped-def]
    async def describe(address: str, timeout_s: float) -> pb.DescribeQuorumResponse:
        asked.append((address, timeout_s))
        answer = answers[address]
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, pb.DescribeQuorumResponse)
        return answer

    return describe


def test_ask_quorum_takes_the_newest_leader_and_skips_dead_controllers() -> None:
    finder = ControllerFinder(["a:1", "b:2", "c:3"])
    asked: list[tuple[str, float]] = []
    answers: dict[str, object] = {
        "a:1": _Aio(grpc.StatusCode.UNAVAILABLE),
        "b:2": pb.DescribeQuorumResponse(leader_id=1000, leader_epoch=3, leader_address="a:1"),
        "c:3": pb.DescribeQuorumResponse(leader_id=1002, leader_epoch=4, leader_address="c:3"),
    }
    found = asyncio.run(ask_quorum(finder, _describer(answers, asked), timeout_s=0.5))
    assert found == "c:3"
    assert sorted(asked) == [("a:1", 0.5), ("b:2", 0.5), ("c:3", 0.5)]


def test_ask_quorum_with_no_leader_anywhere() -> None:
    finder = ControllerFinder(["a:1", "b:2"])
    answers: dict[str, object] = {
        "a:1": _Aio(grpc.StatusCode.DEADLINE_EXCEEDED),
        "b:2": pb.DescribeQuorumResponse(leader_id=-1, leader_epoch=5, why_no_leader="election"),
    }
    assert asyncio.run(ask_quorum(finder, _describer(answers, []))) is None


def test_ask_quorum_unimplemented_means_an_old_single_controller() -> None:
    finder = ControllerFinder(["a:1", "b:2"])
    answers: dict[str, object] = {
        "a:1": _Aio(grpc.StatusCode.UNAVAILABLE),
        "b:2": _Aio(grpc.StatusCode.UNIMPLEMENTED),
    }
    assert asyncio.run(ask_quorum(finder, _describer(answers, []))) == "b:2"
    assert finder.epoch == -1
