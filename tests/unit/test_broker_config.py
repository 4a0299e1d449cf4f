"""Broker config: the controllers to contact (controller.quorum.bootstrap.servers as a list,
Kafka's controller.quorum.voters with its ids ignored)."""

from __future__ import annotations

import pytest

from minibroker.broker.config import build_config
from minibroker.client.common.config import ConfigError

BASE = {"node.id": "1", "log.dirs": "/data"}


def test_default_is_one_local_controller() -> None:
    config = build_config(BASE)
    assert config.controllers == ("127.0.0.1:9093",)
    assert config.controller == ("127.0.0.1", 9093)


def test_bootstrap_servers_accepts_one_or_a_list() -> None:
    one = build_config(BASE, {"controller.quorum.bootstrap.servers": "h:1"})
    assert one.controllers == ("h:1",)
    many = build_config(BASE, {"controller.quorum.bootstrap.servers": " h:1, h:2,h:3 ,h:1"})
    assert many.controllers == ("h:1", "h:2", "h:3")
    assert many.controller == ("h", 1)
    assert many["controller.quorum.bootstrap.servers"] == "h:1,h:2,h:3"


def test_voters_are_used_when_no_bootstrap_server_is_set() -> None:
    config = build_config(BASE, {"controller.quorum.voters": "1000@a:1,1001@b:2,1002@c:3"})
    assert config.controllers == ("a:1", "b:2", "c:3")
    both = build_config(
        BASE,
        {"controller.quorum.voters": "1000@a:1"},
        {"controller.quorum.bootstrap.servers": "x:9"},
    )
    assert both.controllers == ("x:9",)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("controller.quorum.bootstrap.servers", "nohost"),
        ("controller.quorum.bootstrap.servers", ","),
        ("controller.quorum.bootstrap.servers", "h:1,h:x"),
        ("controller.quorum.voters", "1000@a"),
    ],
)
def test_bad_controller_lists_are_refused(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        build_config(BASE, {key: value})
