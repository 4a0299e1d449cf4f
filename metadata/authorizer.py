"""Which authorizer a broker or controller runs, from Kafka's configs (defined once here, used by
broker/config.py and controller/config.py):

- `authorizer.class.name`: "" (the default) none: no ACLs are checked (`AllowAll`), but a
  node's certificate still acts only as that node (client/common/security.py's node rule);
  `org.apache.kafka.metadata.authorizer.StandardAuthorizer` (or
  `StandardAuthorizer`): ACLs from the metadata log (`StandardAuthorizer`); anything else is
  refused at start;
- `super.users`: principals allowed everything, `User:admin;User:ops` (each TYPE:NAME);
- `allow.everyone.if.no.acl.found`: whether a resource without any ACL is open to all (false).

Pure: `make_authorizer` builds the authorizer over the image's ACL view (`MetadataImage.acls`),
which it reads live as ACL records apply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from minibroker.client.common.config import ConfigError, ConfigKey
from minibroker.metadata.acl import AclSource, AllowAll, Authorizer, Principal, StandardAuthorizer

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
        f"unknown authorizer {value!r}: leave it empty (no ACLs checked) or set "
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
        f"'' (no ACLs are checked, but a node's certificate still acts only as that node) or "
        f"{STANDARD_AUTHORIZER} (ACLs from the metadata log)",
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


def make_authorizer(settings: Mapping[str, Any], acl_view: AclSource) -> Authorizer:
    """The authorizer the configs name (raw or typed values; missing keys take their
    defaults), over `acl_view`. ConfigError for an unknown class or a bad principal."""
    values = {key.name: key.convert(settings.get(key.name, key.default)) for key in AUTHORIZER_KEYS}
    name = values["authorizer.class.name"].strip()
    if name == "":
        return AllowAll()
    if name not in AUTHORIZER_NAMES:  # pragma: no cover - the key's check refuses it first
        raise ConfigError(_check_class(name) or name)
    return StandardAuthorizer(
        acl_view,
        parse_super_users(values["super.users"]),
        values["allow.everyone.if.no.acl.found"],
    )


__all__ = [
    "AUTHORIZER_KEYS",
    "AUTHORIZER_NAMES",
    "STANDARD_AUTHORIZER",
    "make_authorizer",
    "parse_super_users",
]
