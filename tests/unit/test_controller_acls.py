"""The controller's ACL commands (controller/core/acl_control.py): CreateAcls, DeleteAcls and
DescribeAcls with Kafka's rules, the records they write, and that a replay of those records (a
restarted controller, a broker's image) holds the same ACLs."""

from __future__ import annotations

import random

import pytest

from minibroker.client.errors import ErrorCode
from minibroker.controller.core.controller import ControllerCore, ControllerSettings
from minibroker.metadata.acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import AccessControlEntryRecord, RemoveAccessControlEntryRecord

Op = AclOperation
RT = ResourceType
PT = PatternType
ALLOW = AclPermissionType.ALLOW
DENY = AclPermissionType.DENY


def acl(
    name: str = "orders",
    op: AclOperation = Op.READ,
    perm: AclPermissionType = ALLOW,
    principal: str = "User:alice",
    pattern: PatternType = PT.LITERAL,
    rtype: ResourceType = RT.TOPIC,
    host: str = "*",
) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


def new_core() -> ControllerCore:
    return ControllerCore(ControllerSettings(), "cluster", random.Random(3), 0)


def test_create_writes_one_record_per_new_acl_and_identical_ones_are_no_ops() -> None:
    core = new_core()
    out = core.create_acls([acl(), acl(op=Op.WRITE), acl()], 10)
    assert [r.error for r in out.reply] == [ErrorCode.NONE] * 3
    records = [e.record for e in out.entries]
    assert len(records) == 2 and all(isinstance(r, AccessControlEntryRecord) for r in records)
    assert records[0].resource_name == "orders" and records[0].operation == int(Op.READ)
    assert [e.name for e in out.events] == ["acl_created", "acl_created"]
    again = core.create_acls([acl()], 11)
    assert again.reply[0].error == ErrorCode.NONE and again.entries == ()
    assert len(core.image.acls) == 2


@pytest.mark.parametrize(
    ("binding", "said"),
    [
        (acl(rtype=RT.ANY), "resourceType"),
        (acl(pattern=PT.MATCH), "patternType"),
        (acl(op=Op.ANY), "operation"),
        (acl(perm=AclPermissionType.ANY), "permissionType"),
        (acl(""), "empty"),
        (acl("c", rtype=RT.CLUSTER), "kafka-cluster"),
        (acl(principal="alice"), "TYPE:NAME"),
    ],
)
def test_an_invalid_creation_is_invalid_request_and_writes_nothing(binding, said) -> None:
    core = new_core()
    out = core.create_acls([binding, acl()], 10)
    bad, good = out.reply
    assert bad.error == ErrorCode.INVALID_REQUEST and said in bad.message
    assert good.error == ErrorCode.NONE
    assert len(out.entries) == 1 and list(core.image.acls.values()) == [acl()]


def test_delete_removes_every_match_and_reports_per_filter() -> None:
    core = new_core()
    core.create_acls(
        [acl(), acl(op=Op.WRITE), acl("ord", pattern=PT.PREFIXED), acl("*", principal="User:*")],
        1,
    )
    out = core.delete_acls(
        [
            AclBindingFilter(RT.TOPIC, "orders", PT.LITERAL),  # the two literal ones
            AclBindingFilter(operation=Op.WRITE),  # one of them again
            AclBindingFilter(RT.GROUP),  # nothing
            AclBindingFilter(RT.UNKNOWN),  # invalid
        ],
        2,
    )
    first, second, third, bad = out.reply
    assert first.error == ErrorCode.NONE and set(first.matching) == {acl(), acl(op=Op.WRITE)}
    assert second.matching == (acl(op=Op.WRITE),)
    assert third.matching == () and third.error == ErrorCode.NONE
    assert bad.error == ErrorCode.INVALID_REQUEST and "Unknown" in bad.message
    removes = [e.record for e in out.entries]
    assert len(removes) == 2 and all(isinstance(r, RemoveAccessControlEntryRecord) for r in removes)
    assert set(core.image.acls.values()) == {
        acl("ord", pattern=PT.PREFIXED),
        acl("*", principal="User:*"),
    }
    # MATCH deletes what applies to a name: the prefix and the wildcard.
    out = core.delete_acls([AclBindingFilter(RT.TOPIC, "orders", PT.MATCH)], 3)
    assert len(out.reply[0].matching) == 2 and len(core.image.acls) == 0


def test_describe_answers_the_filter_and_writes_nothing() -> None:
    core = new_core()
    core.create_acls([acl(), acl(principal="User:bob"), acl("g", rtype=RT.GROUP)], 1)
    described = core.describe_acls(AclBindingFilter(principal="User:alice"))
    assert described.error == ErrorCode.NONE
    assert described.bindings == (acl(), acl("g", rtype=RT.GROUP))
    assert len(core.describe_acls(AclBindingFilter()).bindings) == 3
    bad = core.describe_acls(AclBindingFilter(operation=Op.UNKNOWN))
    assert bad.error == ErrorCode.INVALID_REQUEST and bad.bindings == ()


def test_a_replay_of_the_log_and_a_snapshot_hold_the_same_acls() -> None:
    core = new_core()
    log = []
    log += core.create_acls([acl(), acl("p", pattern=PT.PREFIXED, perm=DENY)], 1).entries
    log += core.delete_acls([AclBindingFilter(RT.TOPIC, "orders")], 2).entries
    log += core.create_acls([acl("kafka-cluster", Op.ALTER, rtype=RT.CLUSTER)], 3).entries
    replayed = MetadataImage()
    for entry in log:
        replayed.apply(entry)
    assert dict(replayed.acls) == dict(core.image.acls)
    restored = MetadataImage()
    restored.replace_with_snapshot(core.image.to_records(), core.image.next_offset)
    assert restored == core.image and dict(restored.acls) == dict(core.image.acls)
    restarted = ControllerCore(ControllerSettings(), "cluster", random.Random(3), 5, restored)
    assert restarted.create_acls([acl("p", pattern=PT.PREFIXED, perm=DENY)], 6).entries == ()
