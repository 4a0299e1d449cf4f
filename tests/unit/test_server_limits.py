"""The servers' connection and request limits (client/common/limits.py, grpc_limits.py): the pure
rules and their configuration, without a socket.

- `ConnectionsPerIp` never admits more connections with a call open per host than its limit,
  counts a connection once however many calls it carries, and forgets a peer with its last call;
- the settings are Kafka's names on both servers, checked (queued.max.request.bytes below
  socket.request.max.bytes could never read a request) and turned into grpc core's options
  (never INT32_MAX for `grpc.max_allowed_incoming_connections`, which grpc core aborts on);
- `RequestBudget` holds readers while the bytes taken are at the limit and lets them go when
  enough are given back.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.config import build_config as build_broker_config
from minibroker.client.common.config import ConfigError
from minibroker.client.common.grpc_limits import RequestBudget
from minibroker.client.common.limits import (
    INT32_MAX,
    ConnectionsPerIp,
    ServerLimits,
    peer_host,
)
from minibroker.controller.config import build_config as build_controller_config

BROKER_REQUIRED = {"node.id": "1", "log.dirs": "/tmp/x"}


def test_peer_host_keeps_the_address_and_drops_the_port() -> None:
    assert peer_host("ipv4:10.0.0.1:5000") == "ipv4:10.0.0.1"
    assert peer_host("ipv6:[::1]:5000") == "ipv6:[::1]"
    assert peer_host("ipv6:[2001:db8::1]:443") == "ipv6:[2001:db8::1]"
    assert peer_host("unix:/tmp/sock") == "unix:/tmp/sock"
    assert peer_host("ipv4:") == "ipv4:"


def test_a_host_gets_at_most_limit_connections_with_calls_and_a_freed_slot_is_reused() -> None:
    per_ip = ConnectionsPerIp(2)
    assert per_ip.open("ipv4:10.0.0.1:1")
    assert per_ip.open("ipv4:10.0.0.1:1")  # a second call on the same connection
    assert per_ip.open("ipv4:10.0.0.1:2")
    assert not per_ip.open("ipv4:10.0.0.1:3")
    assert per_ip.open("ipv4:10.0.0.2:3")  # another host has its own count
    per_ip.close("ipv4:10.0.0.1:1")
    assert not per_ip.open("ipv4:10.0.0.1:3")  # connection 1 still has a call open
    per_ip.close("ipv4:10.0.0.1:1")
    assert per_ip.open("ipv4:10.0.0.1:3")
    assert per_ip.connections("ipv4:10.0.0.1") == 2


@settings(max_examples=300, deadline=None)
@given(
    limit=st.integers(1, 4),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 2), st.integers(0, 5)), max_size=80),
)
def test_per_ip_count_never_exceeds_the_limit_and_empties_when_every_call_ends(
    limit: int, ops: list[tuple[bool, int, int]]
) -> None:
    per_ip = ConnectionsPerIp(limit)
    admitted: list[str] = []
    for is_open, host, port in ops:
        peer = f"ipv4:10.0.0.{host}:{port}"
        if is_open:
            if per_ip.open(peer):
                admitted.append(peer)
        elif peer in admitted:
            admitted.remove(peer)
            per_ip.close(peer)
        for h in range(3):
            assert per_ip.connections(f"ipv4:10.0.0.{h}") <= limit
        assert per_ip.open_calls == len(admitted)
    for peer in admitted:
        per_ip.close(peer)
    assert per_ip.open_calls == 0
    assert all(per_ip.connections(f"ipv4:10.0.0.{h}") == 0 for h in range(3))


def test_both_servers_take_kafkas_names_with_their_defaults() -> None:
    for values in (
        build_broker_config(BROKER_REQUIRED).values,
        build_controller_config({}).values,
    ):
        limits = ServerLimits.from_config(values)
        assert limits == ServerLimits()
        assert limits.connections_max_idle_ms == 600_000  # Kafka's default
        assert limits.socket_request_max_bytes == 16 * 1024 * 1024
        assert limits.queued_max_request_bytes == 128 * 1024 * 1024
        assert limits.max_connections == 1000
        assert limits.max_connections_per_ip == INT32_MAX


def test_queued_bytes_below_the_request_size_limit_is_refused() -> None:
    bad = {"socket.request.max.bytes": "2097152", "queued.max.request.bytes": "1048576"}
    with pytest.raises(ConfigError, match=r"queued\.max\.request\.bytes"):
        build_broker_config(BROKER_REQUIRED, bad)
    with pytest.raises(ConfigError, match=r"queued\.max\.request\.bytes"):
        build_controller_config(bad)
    unbounded = {"queued.max.request.bytes": "-1"}
    assert build_broker_config(BROKER_REQUIRED, unbounded).limits.queued_max_request_bytes == -1


@pytest.mark.parametrize(
    "key, value",
    [
        ("max.connections", "0"),
        ("max.connections", str(2**31)),
        ("max.connections.per.ip", "0"),
        ("connections.max.idle.ms", "0"),
        ("socket.request.max.bytes", "100"),
        ("queued.max.request.bytes", "0"),
        ("queued.max.request.bytes", "-2"),
    ],
)
def test_out_of_range_limits_are_refused(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_broker_config(BROKER_REQUIRED, {key: value})


def test_grpc_options_carry_every_limit() -> None:
    limits = ServerLimits(
        connections_max_idle_ms=5000,
        max_connections=50,
        socket_request_max_bytes=1 << 20,
        queued_max_request_bytes=4 << 20,
    )
    options = dict(limits.grpc_options())
    assert options["grpc.max_receive_message_length"] == 1 << 20
    assert options["grpc.max_connection_idle_ms"] == 5000
    assert options["grpc.server_handshake_timeout_ms"] == 5000
    assert options["grpc.max_allowed_incoming_connections"] == 50
    # Without it grpc core buffers unread requests past the stream window.
    assert options["grpc.http2.bdp_probe"] == 0
    assert (
        dict(ServerLimits(connections_max_idle_ms=600_000).grpc_options())[
            "grpc.server_handshake_timeout_ms"
        ]
        == 120_000
    )


def test_an_unlimited_connection_count_is_left_out_of_grpcs_options() -> None:
    options = dict(ServerLimits(max_connections=INT32_MAX).grpc_options())
    assert "grpc.max_allowed_incoming_connections" not in options


def test_the_budget_holds_readers_at_the_limit_and_releases_them() -> None:
    async def scenario() -> None:
        budget = RequestBudget(100)
        budget.take(60)
        await asyncio.wait_for(budget.wait_for_room(), 1)  # 60 < 100: room
        budget.take(50)
        assert budget.full
        waiter = asyncio.create_task(budget.wait_for_room())
        await asyncio.sleep(0)
        budget.give_back(5)  # 105: still full
        await asyncio.sleep(0)
        assert not waiter.done()
        budget.give_back(50)
        await asyncio.wait_for(waiter, 1)
        assert budget.used == 55 and budget.high_water == 110

    asyncio.run(scenario())


def test_a_budget_without_limit_never_holds() -> None:
    budget = RequestBudget(-1)
    budget.take(1 << 40)
    assert not budget.full
