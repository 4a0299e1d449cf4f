"""What a broker registration may contain: every field is untrusted input from the network.

Pure: no I/O. `invalid_registration` returns the first problem as one printable line (junk is
quoted with repr and cut short, never echoed raw), or None. The controller answers a problem with
INVALID_REQUEST and writes nothing, so a registration that clients could not use (an empty host,
port -5, a host with spaces or control characters) never reaches the metadata log.

The rules:
- broker id: 0 or more (Kafka's node.id);
- host: a DNS name (ASCII letters, digits, '-' and '_' in labels of 1-63 characters that neither
  start nor end with '-', at most 253 characters, one trailing '.' allowed), an IPv4 address, or
  an IPv6 address in brackets (`[::1]`: clients join host and port with ':');
- port: 1-65535; metrics port: -1 (off) or 1-65535;
- rack: empty (none) or at most 255 printable characters without whitespace;
- incarnation id: 1-64 of [A-Za-z0-9_-] (brokers send a UUID);
- cluster id: empty (a fresh data dir) or 1-64 of [A-Za-z0-9._-] (Kafka's are 22 characters);
- previous broker epoch: -1 (none) or more.
"""

from __future__ import annotations

import ipaddress
import re

from minibroker.controller.core.messages import RegisterRequest

MAX_HOST_LENGTH = 253  # DNS
MAX_LABEL_LENGTH = 63
MAX_RACK_LENGTH = 255
MAX_PORT = 65535
NO_METRICS_PORT = -1
_QUOTED = 40  # characters of a bad value shown in a message

_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?")
_INCARNATION_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_CLUSTER_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")


def quoted(value: str) -> str:
    """`value` for an error message: repr (control characters escaped), cut short."""
    text = repr(value)
    if len(text) <= _QUOTED:
        return text
    return f"{text[:_QUOTED]}... ({len(value)} characters)"


def invalid_host(host: str) -> str | None:
    """Why `host` cannot be a broker's address, or None."""
    if not host:
        return "host is empty"
    if len(host) > MAX_HOST_LENGTH:
        return f"host {quoted(host)} is longer than {MAX_HOST_LENGTH} characters"
    if host.startswith("["):
        inner = host[1:-1] if host.endswith("]") else None
        try:
            # A scope id (`%eth0`) is local to the host that wrote it, and IPv6Address takes
            # any text after the `%`, control characters included: refused.
            if inner is None or "%" in inner:
                raise ValueError
            ipaddress.IPv6Address(inner)
        except ValueError:
            return f"host {quoted(host)} is not an IPv6 address in brackets"
        return None
    if ":" in host:
        return f"host {quoted(host)} has a ':' (write an IPv6 address in brackets: [::1])"
    name = host.removesuffix(".")
    labels = name.split(".")
    for label in labels:
        if len(label) > MAX_LABEL_LENGTH or _LABEL.fullmatch(label) is None:
            return (
                f"host {quoted(host)} is not a host name or IP address (labels of 1-"
                f"{MAX_LABEL_LENGTH} ASCII letters, digits, '-' and '_', separated by '.')"
            )
    if labels[-1].isdigit():
        # An all-numeric last label is an IPv4 address or nothing (RFC 1123 2.1).
        try:
            ipaddress.IPv4Address(name)
        except ValueError:
            return f"host {quoted(host)} is not a valid IPv4 address"
    return None


def invalid_port(port: int, what: str, *, optional: bool = False) -> str | None:
    """Why `port` cannot be a listening port (or, `optional`, -1 for none), or None."""
    if optional and port == NO_METRICS_PORT:
        return None
    if 1 <= port <= MAX_PORT:
        return None
    allowed = f"1-{MAX_PORT}" + (" or -1 (none)" if optional else "")
    return f"{what} {port} is out of range ({allowed})"


def invalid_rack(rack: str) -> str | None:
    if len(rack) > MAX_RACK_LENGTH:
        return f"rack {quoted(rack)} is longer than {MAX_RACK_LENGTH} characters"
    if any(not c.isprintable() or c.isspace() for c in rack):
        return f"rack {quoted(rack)} has whitespace or control characters"
    return None


def invalid_cluster_id(cluster_id: str) -> str | None:
    if cluster_id and _CLUSTER_ID.fullmatch(cluster_id) is None:
        return f"cluster id {quoted(cluster_id)} is not 1-64 of [A-Za-z0-9._-]"
    return None


def invalid_registration(req: RegisterRequest) -> str | None:
    """The first thing wrong with a registration, or None when every field is usable."""
    if req.broker_id < 0:
        return f"invalid broker id {req.broker_id} (must be 0 or more)"
    problem = (
        invalid_cluster_id(req.cluster_id)
        or invalid_host(req.host)
        or invalid_port(req.port, "port")
        or invalid_port(req.metrics_port, "metrics port", optional=True)
        or invalid_rack(req.rack)
        or _invalid_kafka_listener(req.kafka_host, req.kafka_port)
    )
    if problem is not None:
        return problem
    if _INCARNATION_ID.fullmatch(req.incarnation_id) is None:
        return f"incarnation id {quoted(req.incarnation_id)} is not 1-64 of [A-Za-z0-9_-]"
    if req.previous_broker_epoch < -1:
        return f"previous broker epoch {req.previous_broker_epoch} is below -1"
    return None


__all__ = [
    "invalid_cluster_id",
    "invalid_host",
    "invalid_port",
    "invalid_rack",
    "invalid_registration",
    "quoted",
]


def _invalid_kafka_listener(host: str, port: int) -> str | None:
    """The Kafka-protocol listener is optional (port 0 and no host: none)."""
    if port == 0 and not host:
        return None
    return invalid_host(host) or invalid_port(port, "kafka port")
