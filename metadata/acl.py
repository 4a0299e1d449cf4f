"""Principals, Kafka's ACL vocabulary, and the Authorizer interface (KIP-801's StandardAuthorizer).

Pure: no I/O. The numbers are Kafka's (clients/.../acl/AclOperation.java, resource/ResourceType,
resource/PatternType, acl/AclPermissionType), so records and RPCs carry them unchanged.

A `Principal` is who a call comes from, `User:NAME` as Kafka writes it: the CN of a TLS client
certificate, the user name of a SASL login, or `User:ANONYMOUS` when neither. Nodes are principals
too: `User:broker-N` / `User:controller-N` (the CN of their certificates, deploy/tls.py), which is
what `node_of` reads back, so a check can require that a call made for broker N comes from broker N.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Protocol

CLUSTER_RESOURCE_NAME = "kafka-cluster"  # Kafka's one CLUSTER resource
WILDCARD = "*"  # any resource name (LITERAL) / any principal (User:*) / any host


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    MATCH = 2  # filters only: literal, wildcard or prefix matches of a name
    LITERAL = 3
    PREFIXED = 4


class AclPermissionType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1  # filters only
    DENY = 2
    ALLOW = 3


@dataclass(frozen=True, slots=True)
class Principal:
    """`User:alice`. Kafka's KafkaPrincipal: a type and a name."""

    type: str
    name: str

    def __str__(self) -> str:
        return f"{self.type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> Principal:
        """`User:alice` -> Principal("User", "alice"); a clear ValueError otherwise."""
        kind, sep, name = text.strip().partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"principal {text!r} is not TYPE:NAME (for example User:alice)")
        return cls(kind, name)


ANONYMOUS = Principal("User", "ANONYMOUS")

_NODE = re.compile(r"(broker|controller)-(\d{1,9})")


def node_principal(role: str, node_id: int) -> Principal:
    """The principal a node's certificate gives it: User:broker-1, User:controller-3000."""
    return Principal("User", f"{role}-{node_id}")


def node_of(principal: Principal) -> tuple[str, int] | None:
    """("broker", 3) for User:broker-3, ("controller", 1) for User:controller-1, else None."""
    if principal.type != "User":
        return None
    m = _NODE.fullmatch(principal.name)
    return (m.group(1), int(m.group(2))) if m else None


class Authorizer(Protocol):
    """Decides one action: may `principal`, calling from `host`, do `operation` on the resource
    (`resource_type`, `name`)? Implementations read their ACLs from the metadata image."""

    def authorize(
        self,
        principal: Principal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
    ) -> bool: ...


class AllowAll:
    """No authorizer configured (`authorizer.class.name` empty): everything is allowed, as
    before security existed."""

    def authorize(
        self,
        principal: Principal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        return True
