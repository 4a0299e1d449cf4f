"""Listeners in Kafka's form (`NAME://host:port`), the bare `host:port` form, the security
protocol map, and the broker and controller `listeners` configs that use them."""

from __future__ import annotations

import pytest

from minibroker.broker.config import build_config as broker_config
from minibroker.client.common.config import ConfigError
from minibroker.client.common.listeners import (
    Listener,
    parse_listener,
    parse_listeners,
    parse_protocol_map,
    parse_single_listener,
    security_protocol,
)
from minibroker.controller.config import build_config as controller_config


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9092", Listener("PLAINTEXT", "127.0.0.1", 9092)),
        ("  localhost:0 ", Listener("PLAINTEXT", "localhost", 0)),
        ("PLAINTEXT://127.0.0.2:9092", Listener("PLAINTEXT", "127.0.0.2", 9092)),
        ("plaintext://h:1", Listener("PLAINTEXT", "h", 1)),
        ("SSL://broker-1.example:9093", Listener("SSL", "broker-1.example", 9093)),
        ("INTERNAL_2://0.0.0.0:65535", Listener("INTERNAL_2", "0.0.0.0", 65535)),
        ("PLAINTEXT://[::1]:9092", Listener("PLAINTEXT", "::1", 9092)),
        ("[::]:0", Listener("PLAINTEXT", "::", 0)),
    ],
)
def test_parse_listener(text: str, expected: Listener) -> None:
    assert parse_listener(text) == expected


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "empty"),
        ("127.0.0.1", "no port"),
        ("PLAINTEXT://127.0.0.1", "no port"),
        ("PLAINTEXT://:9092", "no host"),
        (":9092", "no host"),
        ("h:x", "bad port 'x'"),
        ("h:-1", "bad port"),
        ("h:", "bad port ''"),
        ("h:65536", "out of range"),
        ("1BAD://h:1", "bad listener name '1BAD'"),
        ("://h:1", "bad listener name ''"),
        ("PLAIN-TEXT://h:1", "bad listener name"),
        ("::1:9092", "IPv6 host goes in brackets"),
        ("[::1:9092", r"\[IPV6\]:PORT"),
        ("[::1]9092", r"\[IPV6\]:PORT"),
        ("[h]:1", "IPv6 hosts only"),
        ("PLAINTEXT://a/b:1", "bad host"),
        ("PLAINTEXT://u@h:1", "bad host"),
    ],
)
def test_parse_listener_refuses(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_listener(text)


def test_listener_address_and_text() -> None:
    assert parse_listener("SSL://h:1").address == "h:1"
    v6 = parse_listener("PLAINTEXT://[::1]:9")
    assert v6.address == "[::1]:9"
    assert str(v6) == "PLAINTEXT://[::1]:9"
    assert parse_listener("0.0.0.0:1").is_wildcard
    assert parse_listener("[::]:1").is_wildcard
    assert not parse_listener("127.0.0.1:1").is_wildcard


def test_parse_listeners_lists() -> None:
    assert parse_listeners("PLAINTEXT://a:1, SSL://b:2") == (
        Listener("PLAINTEXT", "a", 1),
        Listener("SSL", "b", 2),
    )
    with pytest.raises(ValueError, match="PLAINTEXT appears more than once"):
        parse_listeners("PLAINTEXT://a:1,plaintext://b:2")
    with pytest.raises(ValueError, match="at least one"):
        parse_listeners(" , ")
    with pytest.raises(ValueError, match="one listener per process"):
        parse_single_listener("PLAINTEXT://a:1,SSL://b:2")
    assert parse_single_listener("a:1,") == Listener("PLAINTEXT", "a", 1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("PLAINTEXT:PLAINTEXT,SSL:SSL", {"PLAINTEXT": "PLAINTEXT", "SSL": "SSL"}),
        ("internal:ssl, external : plaintext", {"INTERNAL": "SSL", "EXTERNAL": "PLAINTEXT"}),
        ("SASL_SSL:sasl_ssl", {"SASL_SSL": "SASL_SSL"}),
    ],
)
def test_parse_protocol_map(text: str, expected: dict[str, str]) -> None:
    assert parse_protocol_map(text) == expected


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", "at least one"),
        ("PLAINTEXT", "NAME:PROTOCOL"),
        ("PLAINTEXT:", "NAME:PROTOCOL"),
        ("A:SSL,a:PLAINTEXT", "mapped more than once"),
        ("A:SASL_PLAINTEXT", "A: SASL_PLAINTEXT is not supported: PLAIN goes over TLS only"),
        ("A:SASL_GSSAPI", "unsupported security protocol 'SASL_GSSAPI'"),
        ("1A:SSL", "bad listener name"),
    ],
)
def test_parse_protocol_map_refuses(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        parse_protocol_map(text)


def test_security_protocol() -> None:
    mapping = parse_protocol_map("PLAINTEXT:PLAINTEXT,SSL:SSL,INTERNAL:SSL")
    assert security_protocol(parse_listener("h:1"), mapping) == "PLAINTEXT"
    assert security_protocol(parse_listener("internal://h:1"), mapping) == "SSL"
    with pytest.raises(ValueError, match=r"OTHER is not in listener\.security\.protocol\.map"):
        security_protocol(parse_listener("OTHER://h:1"), mapping)


BROKER = {"node.id": "1", "log.dirs": "/data"}


def test_broker_listeners_config() -> None:
    default = broker_config(BROKER)
    assert default.listener == Listener("PLAINTEXT", "127.0.0.1", 9092)
    assert default.listen == ("127.0.0.1", 9092)
    assert default.security_protocol == "PLAINTEXT"
    named = broker_config(BROKER, {"listeners": "PLAINTEXT://127.0.0.2:0"})
    assert named.listen == ("127.0.0.2", 0)
    mapped = broker_config(
        BROKER,
        {"listeners": "INTERNAL://h:1", "listener.security.protocol.map": "INTERNAL:PLAINTEXT"},
    )
    assert mapped.listener.name == "INTERNAL"
    assert mapped.security_protocol == "PLAINTEXT"


@pytest.mark.parametrize(
    ("layer", "error"),
    [
        ({"listeners": "h"}, "listeners.*no port"),
        ({"listeners": "PLAINTEXT://a:1,SSL://b:2"}, "listeners.*one listener per process"),
        ({"listeners": "OTHER://h:1"}, "OTHER is not in listener.security.protocol.map"),
        ({"listener.security.protocol.map": "X"}, "listener.security.protocol.map"),
        ({"listeners": "SSL://h:1"}, "SSL listener"),
    ],
)
def test_broker_listeners_config_refuses(layer: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        broker_config(BROKER, layer)


def test_controller_listeners_config() -> None:
    config = controller_config({"listeners": "PLAINTEXT://127.0.0.3:9300"})
    assert config.listener == Listener("PLAINTEXT", "127.0.0.3", 9300)
    assert [(v.host, v.port) for v in config.quorum_voters()] == [("127.0.0.3", 9300)]
    voters = "1000@127.0.0.1:9002,1001@127.0.0.1:9003"
    ok = controller_config(
        {"node.id": 1000, "controller.quorum.voters": voters, "listeners": "PLAINTEXT://h:9002"}
    )
    assert ok.listener.port == 9002
    with pytest.raises(ConfigError, match="not this voter's port"):
        controller_config(
            {"node.id": 1000, "controller.quorum.voters": voters, "listeners": "PLAINTEXT://h:9"}
        )
    with pytest.raises(ConfigError, match=r"listeners.*no port"):
        controller_config({"listeners": "PLAINTEXT://h"})
    with pytest.raises(ConfigError, match="SSL listener"):
        controller_config({"listeners": "SSL://h:1"})


def test_broker_advertises_its_listener_by_default() -> None:
    config = broker_config(BROKER, {"listeners": "PLAINTEXT://127.0.0.2:0"})
    assert config.advertised(41000) == Listener("PLAINTEXT", "127.0.0.2", 41000)
    fixed = broker_config(BROKER, {"listeners": "127.0.0.2:9092"})
    assert fixed.advertised(9092) == Listener("PLAINTEXT", "127.0.0.2", 9092)


def test_broker_advertised_listeners() -> None:
    config = broker_config(
        BROKER,
        {"listeners": "PLAINTEXT://0.0.0.0:0", "advertised.listeners": "PLAINTEXT://127.0.0.4:0"},
    )
    assert config.advertised(41000) == Listener("PLAINTEXT", "127.0.0.4", 41000)
    mapped = broker_config(
        BROKER,
        {"listeners": "[::]:9092", "advertised.listeners": "PLAINTEXT://broker-1.example:19092"},
    )
    assert mapped.advertised(9092) == Listener("PLAINTEXT", "broker-1.example", 19092)


@pytest.mark.parametrize(
    ("layer", "error"),
    [
        ({"listeners": "PLAINTEXT://0.0.0.0:9092"}, "binds every interface.*advertised.listeners"),
        ({"listeners": "[::]:9092"}, "binds every interface"),
        (
            {"listeners": "0.0.0.0:9092", "advertised.listeners": "PLAINTEXT://0.0.0.0:9092"},
            "non-routable",
        ),
        ({"advertised.listeners": "h"}, "advertised.listeners.*no port"),
        ({"advertised.listeners": "PLAINTEXT://a:1,SSL://b:1"}, "one listener"),
        ({"advertised.listeners": "OTHER://h:1"}, "name OTHER is not the name in listeners"),
    ],
)
def test_broker_advertised_listeners_refused(layer: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        broker_config(BROKER, layer)


@pytest.mark.parametrize("key", ["listeners", "advertised.listeners"])
def test_the_launcher_refuses_one_address_for_every_process(key: str) -> None:
    from minibroker.deploy.cluster import LauncherError, split_settings

    with pytest.raises(LauncherError, match=f"{key} cannot be set for the whole cluster"):
        split_settings({key: "PLAINTEXT://127.0.0.1:9092"})
    assert split_settings({"broker.rack": "r"}) == ({}, {"broker.rack": "r"})
