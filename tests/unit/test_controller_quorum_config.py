"""`controller.quorum.voters` and the quorum timers: parsing and the cross-key rules."""

from __future__ import annotations

import pytest

from minibroker.client.common.config import ConfigError
from minibroker.controller.config import build_config, normalised_voters, parse_voters
from minibroker.controller.quorum.messages import VoterAddress


def test_voters_parse_sorted_by_id() -> None:
    voters = parse_voters(" 1002@h3:9003, 1000@h1:9001,1001@h2:9002 ")
    assert [v.voter_id for v in voters] == [1000, 1001, 1002]
    assert voters[0] == VoterAddress(1000, "h1", 9001)
    assert normalised_voters(voters) == "1000@h1:9001,1001@h2:9002,1002@h3:9003"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("1000@h1", "ID@HOST:PORT"),
        ("h1:9001", "ID@HOST:PORT"),
        ("x@h1:9001", "ID@HOST:PORT"),
        ("1000@:9001", "ID@HOST:PORT"),
        ("1000@h1:9001,1000@h2:9002", "twice"),
        ("1000@h1:9001,1001@h1:9001", "two voters"),
        ("1000@h1:70000", "out of range"),
        ("", "ID@HOST:PORT"),
    ],
)
def test_bad_voter_lists_are_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_voters(text)


def test_unset_voters_is_a_quorum_of_one_on_the_listener() -> None:
    config = build_config({"node.id": 7, "listeners": "127.0.0.1:9300"})
    assert config.quorum_voters() == (VoterAddress(7, "127.0.0.1", 9300),)
    assert config.quorum_settings().voters == (7,)


def test_the_voters_must_name_this_node_on_its_own_port() -> None:
    voters = "1000@127.0.0.1:9001,1001@127.0.0.1:9002"
    with pytest.raises(ConfigError, match="does not name"):
        build_config({"node.id": 5, "controller.quorum.voters": voters})
    with pytest.raises(ConfigError, match="not this voter's port"):
        build_config(
            {"node.id": 1000, "controller.quorum.voters": voters, "listeners": "127.0.0.1:9002"}
        )
    ok = build_config(
        {"node.id": 1001, "controller.quorum.voters": voters, "listeners": "127.0.0.1:9002"}
    )
    assert ok.quorum_settings().voters == (1000, 1001)


def test_quorum_timers_come_from_kafkas_names() -> None:
    config = build_config(
        {
            "controller.quorum.election.timeout.ms": 300,
            "controller.quorum.fetch.timeout.ms": 600,
            "controller.quorum.election.backoff.max.ms": 50,
        }
    )
    settings = config.quorum_settings()
    assert (settings.election_timeout_ms, settings.fetch_timeout_ms) == (300, 600)
    assert settings.election_backoff_max_ms == 50
    defaults = build_config({}).quorum_settings()
    assert (defaults.election_timeout_ms, defaults.fetch_timeout_ms) == (1000, 2000)
    assert defaults.election_backoff_max_ms == 1000
