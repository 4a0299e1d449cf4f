"""Connection and request limits of the broker's and the controller's gRPC servers.

Pure: no I/O. Kafka bounds what clients may hold on a server with `connections.max.idle.ms`,
`max.connections`, `max.connections.per.ip`, `socket.request.max.bytes` and
`queued.max.request.bytes`; both minibroker servers accept the same names, and this module maps
them onto what grpc core offers (the settings are read once, at start):

- `max.connections` is grpc's `grpc.max_allowed_incoming_connections`: past it, a new TCP
  connection is accepted and closed at once, so a new client sees UNAVAILABLE and retries with
  its reconnect backoff, while every connection already open keeps working. Kafka instead stops
  accepting (the connection waits in the listen backlog); the client's view is the same: it
  waits until a slot frees.
- `connections.max.idle.ms` closes a connection that has no call open for that long
  (`grpc.max_connection_idle_ms`, a GOAWAY the client follows by reconnecting on its next call)
  and one that never finishes its HTTP/2 handshake within min(that, 120 s). A request stream
  (ProduceStream, FetchStream) on which no request arrived for that long is ended by the broker,
  so a client that holds streams open but sends nothing is idle too: its connection closes at
  most twice the setting after its last request. Kafka counts bytes; gRPC's idle counts calls.
- `max.connections.per.ip` cannot be checked at accept (grpc's Python API does not expose
  accepted sockets), so it counts the connections from one address that have a call open: a
  call that would make one more such connection is refused with RESOURCE_EXHAUSTED. Connections
  with no call are bounded by `max.connections` and closed after `connections.max.idle.ms`.
- `socket.request.max.bytes` is grpc's `grpc.max_receive_message_length`, checked against the
  length in each message's header before the message is buffered (a stream's messages are
  checked one by one); the call ends with RESOURCE_EXHAUSTED.
- `queued.max.request.bytes` bounds the bytes of requests read and not yet answered: while they
  are over it the server reads no new request (see `grpc_limits.RequestBudget`). HTTP/2's
  bandwidth-delay probing is turned off so that grpc core does not buffer unread requests past
  the stream's 64 KiB window either.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from minibroker.client.common.config import ConfigError, ConfigKey

INT32_MAX = 2**31 - 1
MIB = 1024 * 1024
# grpc's own default for the HTTP/2 handshake; a slower peer is not a client we want.
HANDSHAKE_TIMEOUT_MS = 120_000
# HTTP/2's recommended minimum (RFC 9113 §6.5.2). A minibroker client opens two or three streams
# per connection; a peer past this limit waits for a stream to end, it is not refused.
MAX_CONCURRENT_STREAMS = 100

# Twice the producer's default max_request_size (8 MiB): a default producer's fullest request
# and its framing always fit, and one request can hold no more than this on the server.
DEFAULT_SOCKET_REQUEST_MAX_BYTES = 16 * MIB
# Sixteen requests of 8 MiB: three producers pipelining five full requests each still fit.
DEFAULT_QUEUED_MAX_REQUEST_BYTES = 128 * MIB
# A local cluster needs a few connections per client and per broker; this leaves most of a
# 1024-file ulimit -n, if that is all there is, to the logs.
DEFAULT_MAX_CONNECTIONS = 1000


def _between(low: int, high: int) -> Any:
    return lambda v: None if low <= v <= high else f"must be between {low} and {high}"


def _queued_check(value: int) -> str | None:
    if value == -1 or 1 <= value <= 2**63 - 1:
        return None
    return "must be -1 (no bound) or >= 1"


LIMIT_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "connections.max.idle.ms",
        int,
        600_000,
        "close a connection with no call open, and end a request stream with no request, "
        "after this long",
        _between(1, INT32_MAX),
    ),
    ConfigKey(
        "max.connections",
        int,
        DEFAULT_MAX_CONNECTIONS,
        "connections open at once; past it a new connection is closed at accept "
        f"(Kafka: {INT32_MAX}, no limit)",
        _between(1, INT32_MAX),
    ),
    ConfigKey(
        "max.connections.per.ip",
        int,
        INT32_MAX,
        "connections with a call open from one address; a call past it is refused "
        "(RESOURCE_EXHAUSTED)",
        _between(1, INT32_MAX),
    ),
    ConfigKey(
        "socket.request.max.bytes",
        int,
        DEFAULT_SOCKET_REQUEST_MAX_BYTES,
        "largest request message (each message of a stream); larger ones end the call with "
        "RESOURCE_EXHAUSTED (Kafka: 104857600)",
        _between(1024, INT32_MAX),
    ),
    ConfigKey(
        "queued.max.request.bytes",
        int,
        DEFAULT_QUEUED_MAX_REQUEST_BYTES,
        "bytes of requests read and not yet answered; past it no new request is read until "
        "some are answered (-1: no bound, Kafka's default)",
        _queued_check,
    ),
)


@dataclass(frozen=True, slots=True)
class ServerLimits:
    connections_max_idle_ms: int = 600_000
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_connections_per_ip: int = INT32_MAX
    socket_request_max_bytes: int = DEFAULT_SOCKET_REQUEST_MAX_BYTES
    queued_max_request_bytes: int = DEFAULT_QUEUED_MAX_REQUEST_BYTES

    @classmethod
    def from_config(cls, values: Mapping[str, Any]) -> ServerLimits:
        limits = cls(
            connections_max_idle_ms=values["connections.max.idle.ms"],
            max_connections=values["max.connections"],
            max_connections_per_ip=values["max.connections.per.ip"],
            socket_request_max_bytes=values["socket.request.max.bytes"],
            queued_max_request_bytes=values["queued.max.request.bytes"],
        )
        limits.check()
        return limits

    def check(self) -> None:
        """Cross-key rules (Kafka's KafkaConfig checks the same one)."""
        queued = self.queued_max_request_bytes
        if queued != -1 and queued < self.socket_request_max_bytes:
            raise ConfigError(
                f"queued.max.request.bytes ({queued}) must be -1 or at least "
                f"socket.request.max.bytes ({self.socket_request_max_bytes}): otherwise one "
                "request could never be read"
            )

    @property
    def per_ip_limited(self) -> bool:
        return self.max_connections_per_ip < INT32_MAX

    def grpc_options(self) -> list[tuple[str, int]]:
        """Server channel arguments; the caller adds its own (send size, keepalive, ...)."""
        options = [
            ("grpc.max_receive_message_length", self.socket_request_max_bytes),
            ("grpc.max_connection_idle_ms", self.connections_max_idle_ms),
            (
                "grpc.server_handshake_timeout_ms",
                min(self.connections_max_idle_ms, HANDSHAKE_TIMEOUT_MS),
            ),
            ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
            ("grpc.http2.bdp_probe", 0),
        ]
        # grpc core aborts the process when this is INT32_MAX ("unset" there): leave it out.
        if self.max_connections < INT32_MAX:
            options.append(("grpc.max_allowed_incoming_connections", self.max_connections))
        return options


def peer_host(peer: str) -> str:
    """The address part of a grpc peer string: `ipv4:10.0.0.1:5000` -> `ipv4:10.0.0.1`,
    `ipv6:[::1]:5000` -> `ipv6:[::1]`; anything else (`unix:/path`) is its own host."""
    if peer.startswith(("ipv4:", "ipv6:")):
        host, sep, port = peer.rpartition(":")
        if sep and port.isdigit() and host not in ("ipv4", "ipv6"):
            return host
    return peer


class ConnectionsPerIp:
    """Connections (grpc peers, `host:port`) per host that have at least one call open.

    `open(peer)` admits a call unless it would make its host's count of such connections exceed
    the limit; every admitted call is matched by one `close(peer)`. Peers are forgotten when
    their last call ends, so the bookkeeping is bounded by the calls open.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the per-host limit must be at least 1")
        self.limit = limit
        self._calls: dict[str, int] = {}
        self._peers: dict[str, set[str]] = {}

    def open(self, peer: str) -> bool:
        calls = self._calls.get(peer)
        if calls is not None:
            self._calls[peer] = calls + 1
            return True
        host = peer_host(peer)
        peers = self._peers.get(host)
        if peers is None:
            peers = self._peers[host] = set()
        elif len(peers) >= self.limit:
            return False
        peers.add(peer)
        self._calls[peer] = 1
        return True

    def close(self, peer: str) -> None:
        calls = self._calls.get(peer)
        if calls is None:
            return
        if calls > 1:
            self._calls[peer] = calls - 1
            return
        del self._calls[peer]
        host = peer_host(peer)
        peers = self._peers[host]
        peers.discard(peer)
        if not peers:
            del self._peers[host]

    def connections(self, host: str) -> int:
        return len(self._peers.get(host, ()))

    @property
    def open_calls(self) -> int:
        return sum(self._calls.values())


__all__ = [
    "INT32_MAX",
    "LIMIT_KEYS",
    "ConnectionsPerIp",
    "ServerLimits",
    "peer_host",
]
