"""ACL bindings, filters and the StandardAuthorizer (metadata/acl.py) against Kafka's rules.

Table tests name one rule each (StandardAuthorizerData, AclControlManager.validateNewAcl,
ResourcePatternFilter / AccessControlEntryFilter.matches); a hypothesis test checks the indexed
authorizer against a naive one that scans every ACL, on random ACL sets and requests, with ACLs
added and removed in between (the index must follow)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.metadata.acl import (
    AclBinding,
    AclBindingFilter,
    AclError,
    AclIndex,
    AclOperation,
    AclPermissionType,
    PatternType,
    Principal,
    ResourceType,
    StandardAuthorizer,
)

Op = AclOperation
RT = ResourceType
PT = PatternType
ALLOW = AclPermissionType.ALLOW
DENY = AclPermissionType.DENY
ALICE = Principal("User", "alice")
BOB = Principal("User", "bob")


def acl(
    name: str = "orders",
    op: AclOperation = Op.READ,
    perm: AclPermissionType = ALLOW,
    principal: str = "User:alice",
    host: str = "*",
    pattern: PatternType = PT.LITERAL,
    rtype: ResourceType = RT.TOPIC,
) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


def authorizer(*bindings: AclBinding, supers=(), allow_if_none=False) -> StandardAuthorizer:
    index = AclIndex()
    for i, b in enumerate(bindings):
        index.add(f"id-{i}", b)
    return StandardAuthorizer(index, supers, allow_if_none)


# (case, ACLs, principal, host, operation, resource type, name, allowed)
RULES = [
    ("no ACLs, default deny", [], ALICE, "1.1.1.1", Op.READ, RT.TOPIC, "orders", False),
    ("literal allow", [acl()], ALICE, "1.1.1.1", Op.READ, RT.TOPIC, "orders", True),
    ("literal is exact", [acl()], ALICE, "h", Op.READ, RT.TOPIC, "orders2", False),
    ("literal * any name", [acl("*")], ALICE, "h", Op.READ, RT.TOPIC, "x", True),
    (
        "prefixed matches",
        [acl("ord", pattern=PT.PREFIXED)],
        ALICE,
        "h",
        Op.READ,
        RT.TOPIC,
        "orders",
        True,
    ),
    (
        "prefixed whole name",
        [acl("orders", pattern=PT.PREFIXED)],
        ALICE,
        "h",
        Op.READ,
        RT.TOPIC,
        "orders",
        True,
    ),
    (
        "prefixed not a prefix",
        [acl("orx", pattern=PT.PREFIXED)],
        ALICE,
        "h",
        Op.READ,
        RT.TOPIC,
        "orders",
        False,
    ),
    (
        "prefixed * is not a wildcard",
        [acl("*", pattern=PT.PREFIXED)],
        ALICE,
        "h",
        Op.READ,
        RT.TOPIC,
        "orders",
        False,
    ),
    ("other resource type", [acl(rtype=RT.GROUP)], ALICE, "h", Op.READ, RT.TOPIC, "orders", False),
    ("other principal", [acl()], BOB, "h", Op.READ, RT.TOPIC, "orders", False),
    (
        "User:* any principal",
        [acl(principal="User:*")],
        BOB,
        "h",
        Op.READ,
        RT.TOPIC,
        "orders",
        True,
    ),
    (
        "host must match",
        [acl(host="10.0.0.1")],
        ALICE,
        "10.0.0.2",
        Op.READ,
        RT.TOPIC,
        "orders",
        False,
    ),
    ("host exact", [acl(host="10.0.0.1")], ALICE, "10.0.0.1", Op.READ, RT.TOPIC, "orders", True),
    ("operation must match", [acl(op=Op.WRITE)], ALICE, "h", Op.READ, RT.TOPIC, "orders", False),
    ("ALL matches every op", [acl(op=Op.ALL)], ALICE, "h", Op.DELETE, RT.TOPIC, "orders", True),
    (
        "deny wins over allow",
        [acl(), acl(perm=DENY)],
        ALICE,
        "h",
        Op.READ,
        RT.TOPIC,
        "orders",
        False,
    ),
    (
        "prefixed deny beats literal allow",
        [acl(), acl("o", pattern=PT.PREFIXED, perm=DENY)],
        ALICE,
        "h",
        Op.READ,
        RT.TOPIC,
        "orders",
        False,
    ),
    (
        "wildcard deny beats literal allow",
        [acl(), acl("*", perm=DENY, principal="User:*")],
        ALICE,
        "h",
        Op.READ,
        RT.TOPIC,
        "orders",
        False,
    ),
    (
        "deny ALL denies",
        [acl(), acl(op=Op.ALL, perm=DENY)],
        ALICE,
        "h",
        Op.WRITE,
        RT.TOPIC,
        "orders",
        False,
    ),
    (
        "deny for another host",
        [acl(), acl(perm=DENY, host="9.9.9.9")],
        ALICE,
        "h",
        Op.READ,
        RT.TOPIC,
        "orders",
        True,
    ),
    ("READ implies DESCRIBE", [acl(op=Op.READ)], ALICE, "h", Op.DESCRIBE, RT.TOPIC, "orders", True),
    (
        "WRITE implies DESCRIBE",
        [acl(op=Op.WRITE)],
        ALICE,
        "h",
        Op.DESCRIBE,
        RT.TOPIC,
        "orders",
        True,
    ),
    (
        "DELETE implies DESCRIBE",
        [acl(op=Op.DELETE)],
        ALICE,
        "h",
        Op.DESCRIBE,
        RT.TOPIC,
        "orders",
        True,
    ),
    (
        "ALTER implies DESCRIBE",
        [acl(op=Op.ALTER)],
        ALICE,
        "h",
        Op.DESCRIBE,
        RT.TOPIC,
        "orders",
        True,
    ),
    (
        "CREATE does not imply DESCRIBE",
        [acl(op=Op.CREATE)],
        ALICE,
        "h",
        Op.DESCRIBE,
        RT.TOPIC,
        "orders",
        False,
    ),
    (
        "ALTER_CONFIGS implies DESCRIBE_CONFIGS",
        [acl(op=Op.ALTER_CONFIGS)],
        ALICE,
        "h",
        Op.DESCRIBE_CONFIGS,
        RT.TOPIC,
        "orders",
        True,
    ),
    (
        "ALTER does not imply DESCRIBE_CONFIGS",
        [acl(op=Op.ALTER)],
        ALICE,
        "h",
        Op.DESCRIBE_CONFIGS,
        RT.TOPIC,
        "orders",
        False,
    ),
    (
        "DESCRIBE does not imply READ",
        [acl(op=Op.DESCRIBE)],
        ALICE,
        "h",
        Op.READ,
        RT.TOPIC,
        "orders",
        False,
    ),
    (
        "deny READ does not deny DESCRIBE",
        [acl(op=Op.WRITE), acl(op=Op.READ, perm=DENY)],
        ALICE,
        "h",
        Op.DESCRIBE,
        RT.TOPIC,
        "orders",
        True,
    ),
    (
        "deny DESCRIBE denies despite READ allow",
        [acl(op=Op.READ), acl(op=Op.DESCRIBE, perm=DENY)],
        ALICE,
        "h",
        Op.DESCRIBE,
        RT.TOPIC,
        "orders",
        False,
    ),
    (
        "cluster action",
        [acl("kafka-cluster", op=Op.CLUSTER_ACTION, rtype=RT.CLUSTER)],
        ALICE,
        "h",
        Op.CLUSTER_ACTION,
        RT.CLUSTER,
        "kafka-cluster",
        True,
    ),
]


@pytest.mark.parametrize(
    ("acls", "principal", "host", "op", "rtype", "name", "allowed"),
    [r[1:] for r in RULES],
    ids=[r[0] for r in RULES],
)
def test_standard_authorizer_rules(acls, principal, host, op, rtype, name, allowed) -> None:
    assert authorizer(*acls).authorize(principal, host, op, rtype, name) is allowed


def test_super_users_are_always_allowed_even_against_a_deny() -> None:
    auth = authorizer(acl(op=Op.ALL, perm=DENY, principal="User:*"), supers=["User:admin"])
    assert auth.authorize(Principal("User", "admin"), "h", Op.READ, RT.TOPIC, "orders")
    assert not auth.authorize(ALICE, "h", Op.READ, RT.TOPIC, "orders")
    assert authorizer(supers=[ALICE]).authorize(ALICE, "h", Op.ALTER, RT.CLUSTER, "kafka-cluster")


def test_allow_everyone_if_no_acl_found_only_when_the_resource_has_none() -> None:
    auth = authorizer(acl(principal="User:bob"), allow_if_none=True)
    assert auth.authorize(ALICE, "h", Op.READ, RT.TOPIC, "no-acls-here")
    # The resource has an ACL (for someone else): no default, alice is denied.
    assert not auth.authorize(ALICE, "h", Op.READ, RT.TOPIC, "orders")
    # A prefixed ACL covering the name counts as an ACL on the resource.
    auth = authorizer(acl("ord", pattern=PT.PREFIXED, principal="User:bob"), allow_if_none=True)
    assert not auth.authorize(ALICE, "h", Op.READ, RT.TOPIC, "orders")
    assert auth.authorize(ALICE, "h", Op.READ, RT.TOPIC, "other")


def test_the_authorizer_reads_the_index_live() -> None:
    index = AclIndex()
    auth = StandardAuthorizer(index)
    assert not auth.authorize(ALICE, "h", Op.READ, RT.TOPIC, "orders")
    index.add("a", acl("or", pattern=PT.PREFIXED))
    assert auth.authorize(ALICE, "h", Op.READ, RT.TOPIC, "orders")
    index.add("b", acl("or", pattern=PT.PREFIXED))  # an identical ACL under another id
    index.remove("a")
    assert auth.authorize(ALICE, "h", Op.READ, RT.TOPIC, "orders")
    index.remove("b")
    assert not auth.authorize(ALICE, "h", Op.READ, RT.TOPIC, "orders")
    assert index.remove("b") is None
    assert len(index) == 0 and not index.contains_binding(acl("or", pattern=PT.PREFIXED))


# -- validation -----------------------------------------------------------------------------------

INVALID = [
    ("unknown resource type", acl(rtype=RT.UNKNOWN), "resourceType"),
    ("ANY resource type", acl(rtype=RT.ANY), "resourceType"),
    ("ANY pattern", acl(pattern=PT.ANY), "patternType"),
    ("MATCH pattern", acl(pattern=PT.MATCH), "patternType"),
    ("unknown operation", acl(op=Op.UNKNOWN), "operation"),
    ("ANY operation", acl(op=Op.ANY), "operation"),
    ("ANY permission", acl(perm=AclPermissionType.ANY), "permissionType"),
    ("unknown permission", acl(perm=AclPermissionType.UNKNOWN), "permissionType"),
    ("empty name", acl(""), "empty"),
    ("empty prefix", acl("", pattern=PT.PREFIXED), "empty"),
    ("cluster name", acl("c", rtype=RT.CLUSTER), "kafka-cluster"),
    ("principal without type", acl(principal="alice"), "TYPE:NAME"),
    ("principal without name", acl(principal="User:"), "TYPE:NAME"),
    ("empty host", acl(host=""), "host"),
]


@pytest.mark.parametrize(("binding", "said"), [r[1:] for r in INVALID], ids=[r[0] for r in INVALID])
def test_invalid_bindings_are_refused(binding, said) -> None:
    with pytest.raises(AclError, match=said):
        binding.validate()


def test_valid_bindings_pass() -> None:
    acl().validate()
    acl("kafka-cluster", Op.ALTER, rtype=RT.CLUSTER).validate()
    acl("tx-", Op.WRITE, DENY, "User:*", "10.0.0.1", PT.PREFIXED).validate()
    acl("g", rtype=RT.GROUP, principal="Group:x").validate()


# -- filters --------------------------------------------------------------------------------------

FILTERS = [
    ("ANY matches all", AclBindingFilter(), acl("x", pattern=PT.PREFIXED), True),
    ("type", AclBindingFilter(RT.GROUP), acl(), False),
    (
        "ANY pattern, name exact",
        AclBindingFilter(resource_name="orders"),
        acl("orders", pattern=PT.PREFIXED),
        True,
    ),
    ("ANY pattern, other name", AclBindingFilter(resource_name="ord"), acl("orders"), False),
    ("LITERAL pattern", AclBindingFilter(pattern_type=PT.LITERAL), acl(pattern=PT.PREFIXED), False),
    (
        "LITERAL * is literal under LITERAL",
        AclBindingFilter(resource_name="x", pattern_type=PT.LITERAL),
        acl("*"),
        False,
    ),
    (
        "MATCH literal",
        AclBindingFilter(resource_name="orders", pattern_type=PT.MATCH),
        acl("orders"),
        True,
    ),
    (
        "MATCH wildcard",
        AclBindingFilter(resource_name="orders", pattern_type=PT.MATCH),
        acl("*"),
        True,
    ),
    (
        "MATCH prefix",
        AclBindingFilter(resource_name="orders", pattern_type=PT.MATCH),
        acl("ord", pattern=PT.PREFIXED),
        True,
    ),
    (
        "MATCH longer prefix",
        AclBindingFilter(resource_name="ord", pattern_type=PT.MATCH),
        acl("orders", pattern=PT.PREFIXED),
        False,
    ),
    (
        "MATCH other literal",
        AclBindingFilter(resource_name="orders", pattern_type=PT.MATCH),
        acl("ord"),
        False,
    ),
    ("principal", AclBindingFilter(principal="User:bob"), acl(), False),
    (
        "principal exact, not wildcard",
        AclBindingFilter(principal="User:alice"),
        acl(principal="User:*"),
        False,
    ),
    ("host", AclBindingFilter(host="*"), acl(host="1.2.3.4"), False),
    ("operation", AclBindingFilter(operation=Op.WRITE), acl(), False),
    ("operation ALL is a value", AclBindingFilter(operation=Op.READ), acl(op=Op.ALL), False),
    ("permission", AclBindingFilter(permission_type=DENY), acl(), False),
    (
        "everything named",
        AclBindingFilter(RT.TOPIC, "orders", PT.LITERAL, "User:alice", "*", Op.READ, ALLOW),
        acl(),
        True,
    ),
]


@pytest.mark.parametrize(
    ("flt", "binding", "matches"), [r[1:] for r in FILTERS], ids=[r[0] for r in FILTERS]
)
def test_filter_matching(flt, binding, matches) -> None:
    assert flt.matches(binding) is matches
    index = AclIndex()
    index.add("x", binding)
    assert [b for _, b in index.select(flt)] == ([binding] if matches else [])


def test_filters_with_unknown_values_are_refused() -> None:
    AclBindingFilter().validate()
    for flt in (
        AclBindingFilter(RT.UNKNOWN),
        AclBindingFilter(pattern_type=PT.UNKNOWN),
        AclBindingFilter(operation=Op.UNKNOWN),
        AclBindingFilter(permission_type=AclPermissionType.UNKNOWN),
    ):
        with pytest.raises(AclError, match="Unknown"):
            flt.validate()


# -- the indexed authorizer against a naive one ----------------------------------------------


def naive_authorize(bindings, supers, allow_if_none, principal, host, op, rtype, name) -> bool:
    """Kafka's rules written the slow, obvious way: scan every ACL."""
    if str(principal) in supers:
        return True

    def applies(b: AclBinding) -> bool:
        if b.resource_type != rtype:
            return False
        if b.pattern_type == PT.LITERAL:
            return b.resource_name == name or b.resource_name == "*"
        return name.startswith(b.resource_name)

    def op_matches(b: AclBinding) -> bool:
        if b.operation == Op.ALL or b.operation == op:
            return True
        if b.permission_type != ALLOW:
            return False
        if op == Op.DESCRIBE:
            return b.operation in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER)
        if op == Op.DESCRIBE_CONFIGS:
            return b.operation == Op.ALTER_CONFIGS
        return False

    on_resource = [b for b in bindings if applies(b)]
    matching = [
        b
        for b in on_resource
        if b.principal in (str(principal), "User:*") and b.host in (host, "*") and op_matches(b)
    ]
    if any(b.permission_type == DENY for b in matching):
        return False
    if matching:
        return True
    return allow_if_none and not on_resource


# Small domains, so that random ACLs often meet on one resource (denies against allows,
# wildcards against prefixes) rather than passing each other by.
NAMES = st.sampled_from(["", "o", "or", "orders", "*", "x"])
OPS = st.sampled_from(
    [Op.ALL, Op.READ, Op.WRITE, Op.CREATE, Op.DESCRIBE, Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS]
)
RTYPES = st.sampled_from([RT.TOPIC, RT.GROUP])
PRINCIPALS = st.sampled_from(["User:alice", "User:bob", "User:*"])
HOSTS = st.sampled_from(["*", "*", "10.0.0.1"])
BINDINGS = st.builds(
    AclBinding,
    RTYPES,
    NAMES.filter(bool),
    st.sampled_from([PT.LITERAL, PT.PREFIXED]),
    PRINCIPALS,
    HOSTS,
    OPS,
    st.sampled_from([ALLOW, DENY]),
)
REQUESTS = st.tuples(
    st.sampled_from([ALICE, BOB, Principal("User", "admin")]),
    st.sampled_from(["10.0.0.1", "10.0.0.2"]),
    OPS,
    RTYPES,
    NAMES,
)


@settings(max_examples=400, deadline=None)
@given(
    bindings=st.lists(BINDINGS, max_size=12),
    removed=st.sets(st.integers(0, 11), max_size=4),
    supers=st.sets(st.sampled_from(["User:admin", "User:bob"]), max_size=1),
    allow_if_none=st.booleans(),
    requests=st.lists(REQUESTS, min_size=1, max_size=8),
)
def test_indexed_authorizer_agrees_with_a_full_scan(
    bindings, removed, supers, allow_if_none, requests
) -> None:
    index = AclIndex()
    for i, b in enumerate(bindings):
        index.add(f"id-{i}", b)
    for i in removed:
        index.remove(f"id-{i}")
    kept = [b for i, b in enumerate(bindings) if i not in removed]
    auth = StandardAuthorizer(index, supers, allow_if_none)
    for principal, host, op, rtype, name in requests:
        expected = naive_authorize(kept, supers, allow_if_none, principal, host, op, rtype, name)
        assert auth.authorize(principal, host, op, rtype, name) is expected, (
            principal,
            host,
            op,
            rtype,
            name,
        )
    # Filters over the index select what a scan selects.
    for _, _, op, rtype, name in requests:
        for flt in (
            AclBindingFilter(rtype, name or None, PT.MATCH),
            AclBindingFilter(rtype, name or None, PT.LITERAL),
            AclBindingFilter(RT.ANY, name or None, PT.PREFIXED, operation=op),
        ):
            got = sorted(map(repr, (b for _, b in index.select(flt))))
            assert got == sorted(map(repr, (b for b in kept if flt.matches(b))))
