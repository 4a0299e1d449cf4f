"""Principals, Kafka's ACL vocabulary, and the Authorizer interface (KIP-801's StandardAuthorizer).

Pure: no I/O. The numbers are Kafka's (clients/.../acl/AclOperation.java, resource/ResourceType,
resource/PatternType, acl/AclPermissionType), so records and RPCs carry them unchanged.

ACLs (Kafka's AclBinding: a resource pattern and an access control entry) live in the metadata
log (AccessControlEntryRecord); `AclIndex` is the image's view of them, indexed so that one
authorization looks at the ACLs of one resource name, its wildcard and its prefixes only, never
at every ACL. `StandardAuthorizer` decides with Kafka's rules (StandardAuthorizerData).

A `Principal` is who a call comes from, `User:NAME` as Kafka writes it: the CN of a TLS client
certificate, the user name of a SASL login, or `User:ANONYMOUS` when neither. Nodes are principals
too: `User:broker-N` / `User:controller-N` (the CN of their certificates, deploy/tls.py), which is
what `node_of` reads back, so a check can require that a call made for broker N comes from broker N.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Iterator, Mapping
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


# -- ACL bindings and filters (Kafka's AclBinding / AclBindingFilter) -----------------------------

WILDCARD_PRINCIPAL = "User:*"

# ALLOW ACLs for these operations also allow DESCRIBE / DESCRIBE_CONFIGS (Kafka's implied
# operations, StandardAuthorizerData.IMPLIES_DESCRIBE / IMPLIES_DESCRIBE_CONFIGS). DENY ACLs imply
# nothing: a DENY for READ does not deny DESCRIBE.
IMPLIES_DESCRIBE = frozenset(
    {
        AclOperation.DESCRIBE,
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.DELETE,
        AclOperation.ALTER,
    }
)
IMPLIES_DESCRIBE_CONFIGS = frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS})


class AclError(ValueError):
    """A binding or filter that cannot be stored or used (Kafka's InvalidRequestException)."""


def enum_or_unknown(kind: type[enum.IntEnum], value: int) -> enum.IntEnum:
    """An int off the wire as the enum, UNKNOWN (0) when it names no member."""
    try:
        return kind(value)
    except ValueError:
        return kind(0)


@dataclass(frozen=True, slots=True)
class AclBinding:
    """One ACL: on resources (`resource_type`, `resource_name`, LITERAL or PREFIXED), the
    principal (`User:alice`, `User:*` any), calling from `host` (`*` any) is allowed or denied
    `operation`. `principal` is kept as the string Kafka stores."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission_type: AclPermissionType

    def validate(self) -> None:
        """Kafka's checks of a new ACL (AclControlManager.validateNewAcl and the broker's
        CreateAcls checks): no UNKNOWN or filter-only (ANY, MATCH) value, a non-empty name,
        the CLUSTER resource named kafka-cluster, a TYPE:NAME principal, a host. AclError."""
        if self.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            raise AclError(f"Invalid resourceType {self.resource_type.name}")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise AclError(
                f"Invalid patternType {self.pattern_type.name} (an ACL is LITERAL or PREFIXED)"
            )
        if self.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
            raise AclError(f"Invalid operation {self.operation.name}")
        if self.permission_type not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
            raise AclError(f"Invalid permissionType {self.permission_type.name} (ALLOW or DENY)")
        if not self.resource_name:
            raise AclError("Resource name should not be empty")
        if (
            self.resource_type == ResourceType.CLUSTER
            and self.resource_name != CLUSTER_RESOURCE_NAME
        ):
            raise AclError(
                f"The only valid name for the CLUSTER resource is {CLUSTER_RESOURCE_NAME}, "
                f"not {self.resource_name!r}"
            )
        try:
            Principal.parse(self.principal)
        except ValueError as err:
            raise AclError(str(err)) from None
        if self.principal != self.principal.strip():
            raise AclError(f"principal {self.principal!r} has surrounding spaces")
        if not self.host or self.host != self.host.strip():
            raise AclError(f"invalid host {self.host!r} (an address, or * for any host)")

    def pattern_str(self) -> str:
        """Kafka's ResourcePattern.toString."""
        return (
            f"ResourcePattern(resourceType={self.resource_type.name}, "
            f"name={self.resource_name}, patternType={self.pattern_type.name})"
        )

    def entry_str(self) -> str:
        """Kafka's AccessControlEntry.toString."""
        return (
            f"(principal={self.principal}, host={self.host}, "
            f"operation={self.operation.name}, permissionType={self.permission_type.name})"
        )


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """Which ACLs a DescribeAcls/DeleteAcls means (Kafka's AclBindingFilter). ANY (and None for
    the strings) matches every value; pattern type MATCH matches the ACLs that would apply to
    the named resource: LITERAL of that name, LITERAL `*`, PREFIXED prefixes of it."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission_type: AclPermissionType = AclPermissionType.ANY

    def validate(self) -> None:
        """Kafka's AclControlManager.validateFilter: no UNKNOWN value. AclError."""
        for what, value in (
            ("resource type", self.resource_type),
            ("pattern type", self.pattern_type),
            ("operation", self.operation),
            ("permission type", self.permission_type),
        ):
            if value == 0:
                raise AclError(f"Unknown {what} in the ACL filter")

    def matches(self, b: AclBinding) -> bool:
        return self.matches_pattern(b) and self.matches_entry(b)

    def matches_pattern(self, b: AclBinding) -> bool:
        """Kafka's ResourcePatternFilter.matches."""
        if self.resource_type != ResourceType.ANY and self.resource_type != b.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH, b.pattern_type):
            return False
        if self.resource_name is None:
            return True
        if self.pattern_type in (PatternType.ANY, b.pattern_type):
            return self.resource_name == b.resource_name
        # MATCH: the ACLs that apply to a resource of this name.
        if b.pattern_type == PatternType.LITERAL:
            return b.resource_name in (self.resource_name, WILDCARD)
        return self.resource_name.startswith(b.resource_name)

    def matches_entry(self, b: AclBinding) -> bool:
        """Kafka's AccessControlEntryFilter.matches."""
        if self.principal is not None and self.principal != b.principal:
            return False
        if self.host is not None and self.host != b.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != b.operation:
            return False
        return self.permission_type in (AclPermissionType.ANY, b.permission_type)


ANY_ACL = AclBindingFilter()


# -- the image's ACLs, indexed --------------------------------------------------------------------


class AclIndex(Mapping[str, AclBinding]):
    """The ACLs by id (the image's `acls`), and the indexes an authorization reads: LITERAL ACLs
    by (resource type, name), PREFIXED ones by resource type then prefix, with the lengths of the
    prefixes present, so `matching` costs one dict lookup per distinct prefix length.

    Mutated by the image as ACL records apply (one owner); the authorizer holds the same object,
    so it always sees the image's current ACLs (a snapshot load clears and refills it)."""

    def __init__(self) -> None:
        self._by_id: dict[str, AclBinding] = {}
        self._ids_by_binding: dict[AclBinding, set[str]] = {}
        self._literal: dict[tuple[ResourceType, str], dict[str, AclBinding]] = {}
        self._prefixed: dict[ResourceType, dict[str, dict[str, AclBinding]]] = {}
        self._prefix_lengths: dict[ResourceType, dict[int, int]] = {}  # length -> prefixes

    # Mapping
    def __getitem__(self, acl_id: str) -> AclBinding:
        return self._by_id[acl_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def contains_binding(self, binding: AclBinding) -> bool:
        """Whether an identical ACL is stored (CreateAcls of it again is a no-op)."""
        return binding in self._ids_by_binding

    def add(self, acl_id: str, binding: AclBinding) -> None:
        """Store `binding` under `acl_id` (replacing what the id held)."""
        if acl_id in self._by_id:
            self.remove(acl_id)
        self._by_id[acl_id] = binding
        self._ids_by_binding.setdefault(binding, set()).add(acl_id)
        if binding.pattern_type == PatternType.PREFIXED:
            by_prefix = self._prefixed.setdefault(binding.resource_type, {})
            bucket = by_prefix.get(binding.resource_name)
            if bucket is None:
                bucket = by_prefix[binding.resource_name] = {}
                lengths = self._prefix_lengths.setdefault(binding.resource_type, {})
                size = len(binding.resource_name)
                lengths[size] = lengths.get(size, 0) + 1
            bucket[acl_id] = binding
        else:
            key = (binding.resource_type, binding.resource_name)
            self._literal.setdefault(key, {})[acl_id] = binding

    def remove(self, acl_id: str) -> AclBinding | None:
        """Forget the ACL `acl_id`; None when there is none (a record replayed twice)."""
        binding = self._by_id.pop(acl_id, None)
        if binding is None:
            return None
        ids = self._ids_by_binding[binding]
        ids.discard(acl_id)
        if not ids:
            del self._ids_by_binding[binding]
        if binding.pattern_type == PatternType.PREFIXED:
            by_prefix = self._prefixed[binding.resource_type]
            bucket = by_prefix[binding.resource_name]
            del bucket[acl_id]
            if not bucket:
                del by_prefix[binding.resource_name]
                lengths = self._prefix_lengths[binding.resource_type]
                size = len(binding.resource_name)
                lengths[size] -= 1
                if not lengths[size]:
                    del lengths[size]
        else:
            key = (binding.resource_type, binding.resource_name)
            bucket = self._literal[key]
            del bucket[acl_id]
            if not bucket:
                del self._literal[key]
        return binding

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    def matching(self, resource_type: ResourceType, name: str) -> list[AclBinding]:
        """Every ACL whose resource pattern applies to the resource (`resource_type`, `name`):
        LITERAL `name`, LITERAL `*`, PREFIXED prefixes of `name`. A list (the buckets copied),
        so a caller never iterates a bucket the image is changing."""
        literal = self._literal
        out: list[AclBinding] = []
        found = literal.get((resource_type, name))
        if found:
            out.extend(found.values())
        if name != WILDCARD:
            found = literal.get((resource_type, WILDCARD))
            if found:
                out.extend(found.values())
        lengths = self._prefix_lengths.get(resource_type)
        if lengths:
            by_prefix = self._prefixed[resource_type]
            for size in tuple(lengths):
                if size <= len(name):
                    found = by_prefix.get(name[:size])
                    if found:
                        out.extend(found.values())
        return out

    def select(self, flt: AclBindingFilter) -> Iterator[tuple[str, AclBinding]]:
        """(id, binding) of every ACL `flt` matches (DescribeAcls, DeleteAcls: admin calls, so
        a scan; a LITERAL/PREFIXED filter with a name reads only its bucket)."""
        rtypes: Iterable[ResourceType]
        if flt.resource_name is not None and flt.pattern_type in (
            PatternType.LITERAL,
            PatternType.PREFIXED,
        ):
            rtypes = (
                [flt.resource_type]
                if flt.resource_type != ResourceType.ANY
                else [t for t in ResourceType if t not in (ResourceType.UNKNOWN, ResourceType.ANY)]
            )
            seen: set[str] = set()
            for rtype in rtypes:
                if flt.pattern_type == PatternType.LITERAL:
                    bucket = self._literal.get((rtype, flt.resource_name), {})
                else:
                    bucket = self._prefixed.get(rtype, {}).get(flt.resource_name, {})
                for acl_id, b in list(bucket.items()):
                    if acl_id not in seen and flt.matches(b):
                        seen.add(acl_id)
                        yield acl_id, b
            return
        for acl_id, b in list(self._by_id.items()):
            if flt.matches(b):
                yield acl_id, b


# -- the authorizer -------------------------------------------------------------------------------


class AclSource(Protocol):
    def matching(self, resource_type: ResourceType, name: str) -> Iterable[AclBinding]: ...


def acl_result(
    binding: AclBinding, principal: str, host: str, operation: AclOperation
) -> bool | None:
    """What one ACL (whose resource pattern applies) says of the action: True allow, False deny,
    None nothing (Kafka's StandardAuthorizerData.findResult)."""
    if binding.principal != principal and binding.principal != WILDCARD_PRINCIPAL:
        return None
    if binding.host != WILDCARD and binding.host != host:
        return None
    allow = binding.permission_type == AclPermissionType.ALLOW
    if binding.operation != AclOperation.ALL:
        if allow and operation == AclOperation.DESCRIBE:
            if binding.operation not in IMPLIES_DESCRIBE:
                return None
        elif allow and operation == AclOperation.DESCRIBE_CONFIGS:
            if binding.operation not in IMPLIES_DESCRIBE_CONFIGS:
                return None
        elif binding.operation != operation:
            return None
    return allow


class StandardAuthorizer:
    """Kafka's StandardAuthorizer over the metadata image's ACLs (`acls`, read live):

    - a super user (`super.users`, by principal string) may do anything;
    - else every ACL that applies to the resource (LITERAL same name, LITERAL `*`, PREFIXED
      prefix) and matches the principal (exact or `User:*`), the host (exact or `*`) and the
      operation (ALL matches every one; ALLOWs of READ/WRITE/DELETE/ALTER imply DESCRIBE, of
      ALTER_CONFIGS DESCRIBE_CONFIGS) counts: any DENY denies, else any ALLOW allows;
    - no ACL at all on the resource: `allow_everyone_if_no_acl_found`; ACLs on it but none
      matching: denied."""

    def __init__(
        self,
        acls: AclSource,
        super_users: Iterable[Principal | str] = (),
        allow_everyone_if_no_acl_found: bool = False,
    ) -> None:
        self.acls = acls
        self.super_users = frozenset(str(p) for p in super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found

    def authorize(
        self,
        principal: Principal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        who = str(principal)
        if who in self.super_users:
            return True
        has_acls = False
        allowed = False
        for binding in self.acls.matching(resource_type, name):
            has_acls = True
            result = acl_result(binding, who, host, operation)
            if result is False:
                return False
            if result:
                allowed = True
        if allowed:
            return True
        return not has_acls and self.allow_everyone_if_no_acl_found
