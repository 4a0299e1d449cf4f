"""`minibroker consumer-groups` (client/cli/consumer_groups.py): argument checks, Kafka's
reset rules, the describe rows and their lag; bad input exits 1 before any connection."""

from __future__ import annotations

import argparse
import datetime

import pytest

from minibroker.client.cli import consumer_groups as cg
from minibroker.client.groups.admin import GroupDescription, MemberDescription
from minibroker.client.groups.coordinator import CommittedOffset
from minibroker.client.types import TopicPartition as TP
from minibroker.deploy.cli import build_parser, main


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["consumer-groups", *argv])


@pytest.mark.parametrize(
    "argv",
    [
        ["--list"],
        ["--list", "--state"],
        ["--describe", "--group", "g"],
        ["--describe", "--group", "g", "--group", "h", "--members"],
        ["--describe", "--group", "g", "--state"],
        ["--reset-offsets", "--group", "g", "--topic", "t", "--to-earliest"],
        ["--reset-offsets", "--group", "g", "--topic", "t:0,2", "--to-offset", "4", "--execute"],
        ["--reset-offsets", "--group", "g", "--all-topics", "--shift-by", "-3", "--dry-run"],
        ["--reset-offsets", "--group", "g", "--all-topics", "--to-datetime", "2026-01-31T12:00"],
        ["--delete", "--group", "g", "--group", "h"],
    ],
)
def test_good_arguments(argv: list[str]) -> None:
    assert cg.check_args(parse(*argv)) is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "exactly one of --list"),
        (["--list", "--describe", "--group", "g"], "exactly one of --list"),
        (["--describe"], "--describe needs --group"),
        (["--delete"], "--delete needs --group"),
        (["--describe", "--group", "g", "--members", "--state"], "at most one"),
        (["--list", "--members"], "go with --describe"),
        (["--delete", "--group", "g", "--state"], "go with --describe"),
        (["--describe", "--group", "g", "--to-earliest"], "go with --reset-offsets"),
        (["--reset-offsets", "--group", "g", "--to-earliest"], "--topic or --all-topics"),
        (
            ["--reset-offsets", "--group", "g", "--topic", "t", "--all-topics", "--to-latest"],
            "--topic or --all-topics",
        ),
        (["--reset-offsets", "--group", "g", "--topic", "t"], "exactly one of --to-earliest"),
        (
            ["--reset-offsets", "--group", "g", "--topic", "t", "--to-earliest", "--to-latest"],
            "exactly one of --to-earliest",
        ),
        (
            [
                "--reset-offsets",
                "--group",
                "g",
                "--topic",
                "t",
                "--to-earliest",
                "--dry-run",
                "--execute",
            ],
            "not both",
        ),
        (
            ["--reset-offsets", "--group", "g", "--group", "h", "--topic", "t", "--to-earliest"],
            "one --group",
        ),
        (["--reset-offsets", "--group", "g", "--topic", "t:x", "--to-earliest"], "numbers"),
        (["--reset-offsets", "--group", "g", "--topic", ":1", "--to-earliest"], "no topic"),
        (["--reset-offsets", "--group", "g", "--topic", "t", "--to-offset", "-1"], ">= 0"),
        (["--reset-offsets", "--group", "g", "--topic", "t", "--to-datetime", "soon"], "ISO"),
    ],
)
def test_bad_arguments(argv: list[str], message: str) -> None:
    error = cg.check_args(parse(*argv))
    assert error is not None and message in error


def test_bad_input_exits_1_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["consumer-groups", "--reset-offsets", "--group", "g", "--to-earliest"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: ") and "--topic" in err and err.count("\n") == 1


def test_topic_specs_and_datetimes() -> None:
    assert cg.parse_topic_spec("t") == ("t", None)
    assert cg.parse_topic_spec("t:2,0,2") == ("t", [0, 2])
    with pytest.raises(ValueError):
        cg.parse_topic_spec("t:")
    assert cg.parse_datetime("1970-01-01T00:00:01") == 1000
    assert cg.parse_datetime("1970-01-01T01:00:01+01:00") == 1000
    expected = int(datetime.datetime(2026, 1, 31, 12, tzinfo=datetime.UTC).timestamp() * 1000)
    assert cg.parse_datetime("2026-01-31T12:00:00.000") == expected


@pytest.mark.parametrize(
    ("method", "value", "committed", "at_time", "expected"),
    [
        ("to_earliest", None, 7, None, 2),
        ("to_latest", None, 7, None, 20),
        ("to_offset", 9, 7, None, 9),
        ("to_offset", 99, 7, None, 20),  # clamped to the log end
        ("to_offset", 0, 7, None, 2),  # clamped to the log start
        ("shift_by", -3, 7, None, 4),
        ("shift_by", -30, 7, None, 2),
        ("shift_by", 5, None, None, 7),  # no commit: from the log start
        ("to_datetime", "x", 7, 11, 11),
        ("to_datetime", "x", 7, None, 20),  # nothing at or after the time: the end
    ],
)
def test_kafkas_reset_rules(
    method: str, value: object, committed: int | None, at_time: int | None, expected: int
) -> None:
    assert cg.new_offset(method, value, committed, 2, 20, at_time) == expected


def test_describe_rows_lag_and_owners() -> None:
    member = MemberDescription("m-1", "ours-0", "/127.0.0.1", None, (TP("t", 0), TP("t", 1)))
    described = GroupDescription("g", "Stable", "consumer", "range", (member,))
    committed = {TP("t", 0): CommittedOffset(5), TP("u", 0): CommittedOffset(3)}
    rows = cg.offset_rows("g", described, committed, {TP("t", 0): 10, TP("t", 1): 4})
    cells = [r.cells() for r in rows]
    assert cells == [
        ["g", "t", 0, 5, 10, 5, "m-1", "/127.0.0.1", "ours-0"],
        ["g", "t", 1, "-", 4, "-", "m-1", "/127.0.0.1", "ours-0"],
        ["g", "u", 0, 3, "-", "-", "-", "-", "-"],
    ]
    lines = cg.table(cg.OFFSET_HEADER, cells)
    assert lines[0].split() == list(cg.OFFSET_HEADER)
    assert lines[1].split() == ["g", "t", "0", "5", "10", "5", "m-1", "/127.0.0.1", "ours-0"]
    # A committed offset past the log end (a truncated log) shows no negative lag.
    [row] = cg.offset_rows("g", None, {TP("t", 0): CommittedOffset(12)}, {TP("t", 0): 10})
    assert row.lag == 0


def test_help_names_the_actions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["consumer-groups", "--help"])
    out = capsys.readouterr().out
    for option in ("--list", "--describe", "--reset-offsets", "--delete", "--to-datetime"):
        assert option in out
