"""kafka.listeners and kafka.advertised.listeners (broker/config.py), and the controller's check
of a registered Kafka listener (controller/core/registration.py)."""

from __future__ import annotations

import pytest

from minibroker.broker.config import build_config
from minibroker.client.common.config import ConfigError
from minibroker.controller.core.messages import RegisterRequest
from minibroker.controller.core.registration import invalid_registration

BASE = {"node.id": 1, "log.dirs": "/tmp/unused-kafka-config"}


def test_off_by_default_and_advertised_on_the_bound_port() -> None:
    assert build_config(BASE).kafka_listener is None
    config = build_config({**BASE, "kafka.listeners": "PLAINTEXT://127.0.0.1:0"})
    assert str(config.kafka_advertised(19092)) == "PLAINTEXT://127.0.0.1:19092"
    config = build_config(
        {
            **BASE,
            "kafka.listeners": "PLAINTEXT://0.0.0.0:9093",
            "kafka.advertised.listeners": "PLAINTEXT://broker1.example:0",
        }
    )
    assert str(config.kafka_advertised(9093)) == "PLAINTEXT://broker1.example:9093"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"kafka.listeners": "SSL://127.0.0.1:9093"}, "only PLAINTEXT"),
        ({"kafka.listeners": "PLAINTEXT://0.0.0.0:9093"}, "binds every interface"),
        ({"kafka.listeners": "nonsense"}, "kafka.listeners"),
        ({"kafka.advertised.listeners": "PLAINTEXT://h:1"}, "kafka.listeners is empty"),
        (
            {"kafka.listeners": "PLAINTEXT://127.0.0.1:9092", "listeners": "127.0.0.1:9092"},
            "the gRPC listener's address",
        ),
        (
            {
                "kafka.listeners": "PLAINTEXT://127.0.0.1:9093",
                "authorizer.class.name": "StandardAuthorizer",
            },
            "no authentication yet",
        ),
    ],
)
def test_refused_with_a_clear_error(values: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config({**BASE, **values})


def test_the_controller_checks_a_registered_kafka_listener() -> None:
    base = RegisterRequest(broker_id=1, cluster_id="", incarnation_id="abc", host="h", port=9092)
    assert invalid_registration(base) is None
    ok = RegisterRequest(
        broker_id=1,
        cluster_id="",
        incarnation_id="abc",
        host="h",
        port=9092,
        kafka_host="h",
        kafka_port=19092,
    )
    assert invalid_registration(ok) is None
    bad = RegisterRequest(
        broker_id=1,
        cluster_id="",
        incarnation_id="abc",
        host="h",
        port=9092,
        kafka_host="h",
        kafka_port=70000,
    )
    assert "kafka port" in (invalid_registration(bad) or "")
