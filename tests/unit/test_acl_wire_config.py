"""ACLs on the wire (metadata/acl_wire.py: Kafka's CreateAcls/DeleteAcls/DescribeAcls shapes,
bounds on untrusted input) and the authorizer configs (metadata/authorizer.py: make_authorizer,
the keys broker and controller configs share)."""

from __future__ import annotations

import pytest

from minibroker.broker.config import build_config
from minibroker.client.common.config import ConfigError
from minibroker.client.errors import ErrorCode, InvalidRequestError
from minibroker.controller.config import build_config as build_controller_config
from minibroker.metadata import acl_wire
from minibroker.metadata.acl import (
    AclBinding,
    AclBindingFilter,
    AclIndex,
    AclOperation,
    AclPermissionType,
    AllowAll,
    PatternType,
    Principal,
    ResourceType,
    StandardAuthorizer,
)
from minibroker.metadata.authorizer import STANDARD_AUTHORIZER, make_authorizer
from minibroker.proto import minibroker_pb2 as pb

B1 = AclBinding(
    ResourceType.TOPIC,
    "orders",
    PatternType.PREFIXED,
    "User:alice",
    "10.0.0.1",
    AclOperation.WRITE,
    AclPermissionType.DENY,
)
B2 = AclBinding(
    ResourceType.CLUSTER,
    "kafka-cluster",
    PatternType.LITERAL,
    "User:*",
    "*",
    AclOperation.ALTER,
    AclPermissionType.ALLOW,
)


def test_creations_survive_the_wire() -> None:
    msg = pb.CreateAclsRequest.FromString(acl_wire.create_request([B1, B2]).SerializeToString())
    assert acl_wire.creations(msg) == [B1, B2]
    reply = acl_wire.create_reply([(ErrorCode.NONE, ""), (ErrorCode.INVALID_REQUEST, "bad")])
    ok, bad = acl_wire.create_results(reply)
    assert ok is None and isinstance(bad, InvalidRequestError) and "bad" in str(bad)


def test_unknown_numbers_decode_as_unknown_for_validation_to_refuse() -> None:
    msg = pb.CreateAclsRequest(
        creations=[pb.AclCreation(resource_type=99, operation=-4, permission_type=3)]
    )
    (binding,) = acl_wire.creations(msg)
    assert binding.resource_type == ResourceType.UNKNOWN
    assert binding.operation == AclOperation.UNKNOWN
    assert binding.pattern_type == PatternType.UNKNOWN  # 0: unset


@pytest.mark.parametrize(
    "flt",
    [
        AclBindingFilter(),
        AclBindingFilter(ResourceType.TOPIC, "", PatternType.MATCH, "User:a", "*"),
        AclBindingFilter(operation=AclOperation.READ, permission_type=AclPermissionType.ALLOW),
    ],
)
def test_filters_survive_the_wire_with_null_and_empty_kept_apart(flt) -> None:
    msg = pb.DeleteAclsRequest.FromString(acl_wire.delete_request([flt]).SerializeToString())
    assert acl_wire.delete_filters(msg) == [flt]
    assert acl_wire.describe_filter(acl_wire.describe_request(flt)) == flt


def test_delete_and_describe_answers_survive_the_wire() -> None:
    reply = acl_wire.delete_reply(
        [(ErrorCode.NONE, "", [B1, B2]), (ErrorCode.INVALID_REQUEST, "Unknown operation", [])]
    )
    (e1, m1), (e2, m2) = acl_wire.delete_results(reply)
    assert e1 is None and m1 == [B1, B2]
    assert isinstance(e2, InvalidRequestError) and m2 == []
    b3 = AclBinding(
        B1.resource_type,
        B1.resource_name,
        B1.pattern_type,
        "User:bob",
        "*",
        B1.operation,
        AclPermissionType.ALLOW,
    )
    described = acl_wire.describe_reply([B1, B2, b3])
    assert len(described.resources) == 2  # grouped by resource pattern
    assert acl_wire.described(described) == [B1, b3, B2]
    with pytest.raises(InvalidRequestError, match="nope"):
        acl_wire.described(acl_wire.describe_error((ErrorCode.INVALID_REQUEST, "nope")))


def test_requests_past_the_bounds_are_refused_whole() -> None:
    many = pb.CreateAclsRequest(creations=[pb.AclCreation()] * (acl_wire.MAX_ACL_ITEMS + 1))
    with pytest.raises(InvalidRequestError, match="too many"):
        acl_wire.creations(many)
    long_name = pb.CreateAclsRequest(creations=[pb.AclCreation(resource_name="x" * 1001)])
    with pytest.raises(InvalidRequestError, match="resource name"):
        acl_wire.creations(long_name)
    err = InvalidRequestError("too many")
    assert len(acl_wire.create_error(many, err).results) == acl_wire.MAX_ACL_ITEMS
    long_filter = pb.DeleteAclsRequest(filters=[pb.AclFilter(principal_filter="p" * 1001)])
    with pytest.raises(InvalidRequestError, match="principal"):
        acl_wire.delete_filters(long_filter)


# -- make_authorizer and the configs --------------------------------------------------------------


def test_no_authorizer_configured_allows_everything() -> None:
    assert isinstance(make_authorizer({}, AclIndex()), AllowAll)
    assert isinstance(make_authorizer({"authorizer.class.name": ""}, AclIndex()), AllowAll)


@pytest.mark.parametrize("name", [STANDARD_AUTHORIZER, "StandardAuthorizer"])
def test_the_standard_authorizer_reads_the_view_and_the_super_users(name) -> None:
    view = AclIndex()
    auth = make_authorizer(
        {
            "authorizer.class.name": name,
            "super.users": " User:admin ; User:ops;",
            "allow.everyone.if.no.acl.found": "true",
        },
        view,
    )
    assert isinstance(auth, StandardAuthorizer)
    assert auth.super_users == {"User:admin", "User:ops"}
    alice = Principal("User", "alice")
    assert auth.authorize(alice, "h", AclOperation.READ, ResourceType.TOPIC, "t")  # no ACLs
    view.add(
        "x",
        AclBinding(
            ResourceType.TOPIC,
            "t",
            PatternType.LITERAL,
            "User:bob",
            "*",
            AclOperation.READ,
            AclPermissionType.ALLOW,
        ),
    )
    assert not auth.authorize(alice, "h", AclOperation.READ, ResourceType.TOPIC, "t")
    assert auth.authorize(Principal("User", "ops"), "h", AclOperation.READ, ResourceType.TOPIC, "t")


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (
            {"authorizer.class.name": "kafka.security.authorizer.AclAuthorizer"},
            "unknown authorizer",
        ),
        ({"authorizer.class.name": STANDARD_AUTHORIZER, "super.users": "admin"}, "TYPE:NAME"),
        ({"allow.everyone.if.no.acl.found": "maybe"}, r"allow\.everyone"),
    ],
)
def test_bad_authorizer_configs_are_refused_clearly(settings, said) -> None:
    with pytest.raises(ConfigError, match=said):
        make_authorizer(settings, AclIndex())


def test_broker_and_controller_configs_take_the_authorizer_keys(tmp_path) -> None:
    broker = build_config(
        {
            "node.id": 1,
            "log.dirs": str(tmp_path),
            "authorizer.class.name": STANDARD_AUTHORIZER,
            "super.users": "User:admin",
        }
    )
    assert broker["authorizer.class.name"] == STANDARD_AUTHORIZER
    assert broker["allow.everyone.if.no.acl.found"] is False
    assert isinstance(make_authorizer(broker.values, AclIndex()), StandardAuthorizer)
    with pytest.raises(ConfigError, match=r"super\.users"):
        build_config({"node.id": 1, "log.dirs": str(tmp_path), "super.users": "nobody"})
    controller = build_controller_config({"super.users": "User:admin"})
    assert controller["super.users"] == "User:admin"


def test_admin_refuses_bad_arguments_before_sending() -> None:
    from minibroker.client.admin import AsyncAdmin
    from minibroker.client.cli.common import run_async

    async def main() -> None:
        async with AsyncAdmin("127.0.0.1:1") as admin:
            with pytest.raises(TypeError, match="AclBinding"):
                await admin.create_acls(B1)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="AclBinding"):
                await admin.create_acls(["User:a"])  # type: ignore[list-item]
            with pytest.raises(TypeError, match="AclBindingFilter"):
                await admin.delete_acls([B1])  # type: ignore[list-item]
            with pytest.raises(TypeError, match="AclBindingFilter"):
                await admin.describe_acls(B1)  # type: ignore[arg-type]
            assert await admin.create_acls([]) is None
            assert await admin.delete_acls([]) == []

    run_async(main())


def test_the_empty_authorizer_help_says_nodes_are_still_held_to_themselves() -> None:
    from minibroker.metadata.authorizer import AUTHORIZER_KEYS

    (doc,) = [k.doc for k in AUTHORIZER_KEYS if k.name == "authorizer.class.name"]
    assert "every call allowed" not in doc
    assert "no ACLs are checked, but a node's certificate still acts only as that node" in doc
