"""Which authorizer a broker or controller runs, from Kafka's configs (defined once here, used by
broker/config.py and controller/config.py).

STAND-IN (sec-enforce) for sec-acls' module of the same path and names, which replaces this
file whole at the merge: same `AUTHORIZER_KEYS`, same `make_authorizer(settings, acl_view)`.
Until then there are no ACLs: the StandardAuthorizer here lets super users do everything and
anyone else only with `allow.everyone.if.no.acl.found` (no resource has an ACL).

- `authorizer.class.name`: "" (the default) none, every call allowed as before security
  existed (`AllowAll`); `org.apache.kafka.metadata.authorizer.StandardAuthorizer` (or
  `StandardAuthorizer`); anything else is refused at start;
- `super.users`: principals allowed everything, `User:admin;User:ops` (each TYPE:NAME);
- `allow.everyone.if.no.acl.found`: whether a resource without any ACL is open to all (false).

Node principals get CLUSTER_ACTION from client/common/security.py's `Access`, not from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from minibroker.client.common.config import ConfigError, ConfigKey
from minibroker.metadata.acl import (
    AclOperation,
    AllowAll,
    Authorizer,
    Principal,
    ResourceType,
)

STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
AUTHORIZER_NAMES = ("", STANDARD_AUTHORIZER, "StandardAuthorizer")


def parse_super_users(text: str) -> tuple[Principal, ...]:
    """`User:a;User:b` -> the principals (blank items skipped); ValueError naming a bad one."""
    out = []
    for item in text.split(";"):
        if item.strip():
            try:
                out.append(Principal.parse(item))
            except ValueError as err:
                raise ValueError(f"super.users: {err}") from None
    return tuple(out)


def _check_class(value: str) -> str | None:
    if value.strip() in AUTHORIZER_NAMES:
        return None
    return (
        f"unknown authorizer {value!r}: leave it empty (no authorization) or set "
        f"{STANDARD_AUTHORIZER} (ACLs from the metadata log)"
    )


def _check_super_users(value: str) -> str | None:
    try:
        parse_super_users(value)
    except ValueError as err:
        return str(err)
    return None


AUTHORIZER_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "authorizer.class.name",
        str,
        "",
        f"'' (every call allowed) or {STANDARD_AUTHORIZER} (ACLs from the metadata log)",
        _check_class,
    ),
    ConfigKey(
        "super.users",
        str,
        "",
        "principals allowed everything, semicolon-separated (User:admin;User:ops)",
        _check_super_users,
    ),
    ConfigKey(
        "allow.everyone.if.no.acl.found",
        bool,
        False,
        "with the StandardAuthorizer: a resource without any ACL is open to everyone",
    ),
)


class _NoAclsAuthorizer:
    """The stand-in StandardAuthorizer: no resource has an ACL yet."""

    def __init__(self, super_users: tuple[Principal, ...], allow_if_no_acl: bool) -> None:
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_if_no_acl

    def authorize(
        self,
        principal: Principal,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
    ) -> bool:
        return principal in self.super_users or self.allow_if_no_acl


def make_authorizer(settings: Mapping[str, Any], acl_view: Any = None) -> Authorizer:
    """The authorizer the configs name (raw or typed values; missing keys take their
    defaults). ConfigError for an unknown class or a bad principal."""
    values = {key.name: key.convert(settings.get(key.name, key.default)) for key in AUTHORIZER_KEYS}
    name = values["authorizer.class.name"].strip()
    if name == "":
        return AllowAll()
    if name not in AUTHORIZER_NAMES:  # pragma: no cover - the key's check refuses it first
        raise ConfigError(_check_class(name) or name)
    return _NoAclsAuthorizer(
        parse_super_users(values["super.users"]), values["allow.everyone.if.no.acl.found"]
    )


__all__ = [
    "AUTHORIZER_KEYS",
    "AUTHORIZER_NAMES",
    "STANDARD_AUTHORIZER",
    "make_authorizer",
    "parse_super_users",
]
