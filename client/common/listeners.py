"""Listeners in Kafka's form: `NAME://host:port`, and the name -> security protocol map.

Pure. `parse_listener("SSL://127.0.0.2:9092")` is `Listener("SSL", "127.0.0.2", 9092)`; the bare
form `host:port` (minibroker's older one) is the PLAINTEXT listener. An IPv6 host is written in
brackets (`PLAINTEXT://[::1]:9092`) and kept without them. Names are normalised to upper case
(Kafka's `ListenerName.normalised`). `listener.security.protocol.map` maps each listener name to
PLAINTEXT, SSL or SASL_SSL (SASL PLAIN logins over TLS; SASL_PLAINTEXT is refused: PLAIN sends
the password, so it goes over TLS only); its default is `PLAINTEXT:PLAINTEXT,SSL:SSL,
SASL_SSL:SASL_SSL` (Kafka's, without SASL_PLAINTEXT). Every error is a `ValueError` whose
message says what was expected; the config layers prefix it with the key's name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
SASL_SSL = "SASL_SSL"
SASL_PLAINTEXT = "SASL_PLAINTEXT"
PROTOCOLS = (PLAINTEXT, SSL, SASL_SSL)
DEFAULT_PROTOCOL_MAP = "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL"
SASL_PLAINTEXT_REFUSED = "SASL_PLAINTEXT is not supported: PLAIN goes over TLS only (use SASL_SSL)"
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class Listener:
    """One listener: its name (upper case), host (IPv6 without brackets) and port (0: any)."""

    name: str
    host: str
    port: int

    @property
    def address(self) -> str:
        """`host:port` as gRPC takes it (an IPv6 host in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def is_wildcard(self) -> bool:
        """Bound to every interface (0.0.0.0 or ::): not an address anyone can connect to."""
        return self.host in WILDCARD_HOSTS

    def __str__(self) -> str:
        return f"{self.name}://{self.address}"


def parse_listener(text: str) -> Listener:
    """`NAME://host:port` or `host:port` (PLAINTEXT) -> Listener; ValueError on anything else."""
    raw = text.strip()
    if not raw:
        raise ValueError("expected NAME://HOST:PORT or HOST:PORT, got an empty value")
    name, sep, rest = raw.partition("://")
    if not sep:
        name, rest = PLAINTEXT, raw
    elif not _NAME.fullmatch(name):
        raise ValueError(
            f"bad listener name {name!r} in {raw!r}: a letter then letters, digits or '_'"
        )
    host, port = _split_address(rest, raw)
    return Listener(name.upper(), host, port)


def _split_address(rest: str, raw: str) -> tuple[str, int]:
    if rest.startswith("["):
        end = rest.find("]")
        if end < 0 or rest[end + 1 : end + 2] != ":":
            raise ValueError(f"expected [IPV6]:PORT, got {raw!r}")
        host, port = rest[1:end], rest[end + 2 :]
        if ":" not in host:
            raise ValueError(f"brackets are for IPv6 hosts only, got {raw!r}")
    else:
        host, sep, port = rest.rpartition(":")
        if not sep:
            raise ValueError(f"expected NAME://HOST:PORT or HOST:PORT, got {raw!r} (no port)")
        if ":" in host:
            raise ValueError(f"an IPv6 host goes in brackets ([::1]:9092), got {raw!r}")
    if not host:
        raise ValueError(f"no host in {raw!r} (0.0.0.0 binds every interface)")
    if any(c.isspace() or c in "/@," for c in host):
        raise ValueError(f"bad host {host!r} in {raw!r}")
    if not port.isdigit():
        raise ValueError(f"bad port {port!r} in {raw!r}: expected a number 0-65535")
    value = int(port)
    if value > 65535:
        raise ValueError(f"port {value} out of range 0-65535 in {raw!r}")
    return host, value


def parse_listeners(text: str) -> tuple[Listener, ...]:
    """A comma-separated list of listeners; at least one, names distinct."""
    parts = [p for p in (s.strip() for s in text.split(",")) if p]
    if not parts:
        raise ValueError("expected at least one listener (NAME://HOST:PORT)")
    listeners = tuple(parse_listener(p) for p in parts)
    names = [li.name for li in listeners]
    for name in names:
        if names.count(name) > 1:
            raise ValueError(f"listener name {name} appears more than once in {text.strip()!r}")
    return listeners


def parse_single_listener(text: str) -> Listener:
    """Exactly one listener (one per process for now); ValueError for a list of more."""
    listeners = parse_listeners(text)
    if len(listeners) > 1:
        raise ValueError(
            f"one listener per process is supported, got {len(listeners)} in {text.strip()!r}"
        )
    return listeners[0]


def parse_protocol_map(text: str) -> dict[str, str]:
    """`NAME:PROTOCOL,...` -> {NAME: PROTOCOL}, names upper-cased, protocols PLAINTEXT, SSL or
    SASL_SSL."""
    result: dict[str, str] = {}
    for part in (s.strip() for s in text.split(",")):
        if not part:
            continue
        name, sep, protocol = (s.strip() for s in part.partition(":"))
        if not sep or not name or not protocol:
            raise ValueError(f"expected NAME:PROTOCOL, got {part!r}")
        if not _NAME.fullmatch(name):
            raise ValueError(f"bad listener name {name!r} in {part!r}")
        key = name.upper()
        if key in result:
            raise ValueError(f"listener name {key} is mapped more than once")
        proto = protocol.upper()
        if proto == SASL_PLAINTEXT:
            raise ValueError(f"{key}: {SASL_PLAINTEXT_REFUSED}")
        if proto not in PROTOCOLS:
            raise ValueError(
                f"unsupported security protocol {protocol!r} for {key}: "
                f"expected one of {', '.join(PROTOCOLS)}"
            )
        result[key] = proto
    if not result:
        raise ValueError("expected at least one NAME:PROTOCOL")
    return result


def security_protocol(listener: Listener, protocol_map: Mapping[str, str]) -> str:
    """The listener's security protocol; ValueError when its name is not in the map."""
    try:
        return protocol_map[listener.name]
    except KeyError:
        raise ValueError(
            f"listener name {listener.name} is not in listener.security.protocol.map "
            f"({','.join(f'{k}:{v}' for k, v in protocol_map.items())})"
        ) from None


__all__ = [
    "DEFAULT_PROTOCOL_MAP",
    "PLAINTEXT",
    "PROTOCOLS",
    "SASL_PLAINTEXT",
    "SASL_PLAINTEXT_REFUSED",
    "SASL_SSL",
    "SSL",
    "Listener",
    "parse_listener",
    "parse_listeners",
    "parse_protocol_map",
    "parse_single_listener",
    "security_protocol",
]
