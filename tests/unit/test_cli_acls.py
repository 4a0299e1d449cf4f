"""`minibroker acls` (client/cli/acls.py): the command line as kafka-acls reads it (principals x
hosts x operations per resource, --producer/--consumer, pattern types, the checks made before
anything is sent) and its listing in Kafka's words."""

from __future__ import annotations

import pytest

from minibroker.client.cli.acls import AclsInputError, listing_lines, parse_operation, plan_of
from minibroker.deploy.cli import build_parser
from minibroker.metadata.acl import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

Op = AclOperation
ALLOW = AclPermissionType.ALLOW
DENY = AclPermissionType.DENY


def plan(*argv: str):
    return plan_of(build_parser().parse_args(["acls", *argv]))


def test_operation_names_are_kafkas() -> None:
    assert parse_operation("Read") == Op.READ
    assert parse_operation("ClusterAction") == Op.CLUSTER_ACTION
    assert parse_operation("describe_configs") == Op.DESCRIBE_CONFIGS
    assert parse_operation("IdempotentWrite") == Op.IDEMPOTENT_WRITE
    assert parse_operation("All") == Op.ALL
    for bad in ("Any", "Unknown", "Fly"):
        with pytest.raises(AclsInputError, match="unknown operation"):
            parse_operation(bad)


def test_add_is_principals_times_hosts_times_operations() -> None:
    p = plan(
        "--add",
        "--allow-principal", "User:alice",
        "--allow-principal", "User:bob",
        "--allow-host", "10.0.0.1",
        "--deny-principal", "User:eve",
        "--operation", "Read",
        "--operation", "Write",
        "--topic", "orders",
        "--bootstrap-server", "b:1",
    )  # fmt: skip
    assert p.action == "add" and p.pattern == PatternType.LITERAL
    (bindings,) = p.bindings.values()
    assert len(bindings) == 6
    assert (
        AclBinding(
            ResourceType.TOPIC,
            "orders",
            PatternType.LITERAL,
            "User:bob",
            "10.0.0.1",
            Op.WRITE,
            ALLOW,
        )
        in bindings
    )
    assert (
        AclBinding(
            ResourceType.TOPIC, "orders", PatternType.LITERAL, "User:eve", "*", Op.READ, DENY
        )
        in bindings
    )


def test_defaults_prefixed_and_cluster() -> None:
    p = plan("--add", "--allow-principal", "User:a", "--topic", "tx-", "--resource-pattern-type",
             "prefixed", "--cluster")  # fmt: skip
    topic, cluster = p.bindings.values()
    assert [(b.operation, b.host, b.pattern_type) for b in topic] == [
        (Op.ALL, "*", PatternType.PREFIXED)
    ]
    assert cluster[0].resource_type == ResourceType.CLUSTER
    assert cluster[0].resource_name == "kafka-cluster"


def test_producer_and_consumer_conveniences() -> None:
    p = plan("--add", "--allow-principal", "User:p", "--producer", "--topic", "t")
    (ops,) = [[b.operation for b in bs] for bs in p.bindings.values()]
    assert ops == [Op.WRITE, Op.DESCRIBE, Op.CREATE]
    p = plan("--add", "--allow-principal", "User:c", "--consumer", "--topic", "t", "--group", "g")
    by_type = {r.type: [b.operation for b in bs] for r, bs in p.bindings.items()}
    assert by_type == {ResourceType.TOPIC: [Op.READ, Op.DESCRIBE], ResourceType.GROUP: [Op.READ]}


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--add", "--topic", "t"], "You must specify one of"),
        (["--add", "--allow-principal", "alice", "--topic", "t"], "TYPE:NAME"),
        (["--add", "--allow-principal", "User:a"], "name a resource"),
        (["--add", "--allow-principal", "User:a", "--operation", "Read", "--cluster"],
         "only supports operations"),
        (["--add", "--allow-principal", "User:a", "--operation", "ClusterAction", "--topic", "t"],
         "only supports operations"),
        (["--add", "--allow-principal", "User:a", "--topic", "t", "--resource-pattern-type",
          "match"], "not valid when adding"),
        (["--add", "--allow-host", "h", "--deny-principal", "User:a", "--topic", "t"],
         "--allow-host needs"),
        (["--add", "--allow-principal", "User:a", "--consumer", "--topic", "t"], "needs --group"),
        (["--add", "--allow-principal", "User:a", "--producer", "--group", "g"], "need --topic"),
        (["--remove", "--topic", "t"], "needs --force"),
        (["--list", "--allow-principal", "User:a"], "--list takes --principal"),
        (["--add", "--principal", "User:a", "--topic", "t"], "only goes with --list"),
        (["--add", "--allow-principal", "User:a", "--topic", ""], "empty topic"),
    ],
)  # fmt: skip
def test_bad_command_lines_are_refused_before_sending(argv, said) -> None:
    with pytest.raises(AclsInputError, match=said):
        plan(*argv)


def test_remove_without_principals_means_every_acl_of_the_resource() -> None:
    p = plan("--remove", "--force", "--topic", "t", "--resource-pattern-type", "any")
    assert p.action == "remove" and p.pattern == PatternType.ANY
    assert list(p.bindings.values()) == [[]]


def test_list_takes_principal_filters_and_no_resource() -> None:
    p = plan("--list", "--principal", "User:a", "--command-config", "x.properties")
    assert p.principals == ["User:a"] and p.bindings == {}


def test_help_exits_zero(capsys) -> None:
    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["acls", "--help"])
    assert done.value.code == 0
    assert "--allow-principal" in capsys.readouterr().out


def test_listing_is_kafkas_shape() -> None:
    b1 = AclBinding(ResourceType.TOPIC, "t", PatternType.LITERAL, "User:alice", "*", Op.READ, ALLOW)
    b2 = AclBinding(ResourceType.GROUP, "g", PatternType.PREFIXED, "User:bob", "h", Op.READ, DENY)
    assert listing_lines([b2, b1]) == [
        "Current ACLs for resource "
        "`ResourcePattern(resourceType=TOPIC, name=t, patternType=LITERAL)`: ",
        " \t(principal=User:alice, host=*, operation=READ, permissionType=ALLOW) ",
        "",
        "Current ACLs for resource "
        "`ResourcePattern(resourceType=GROUP, name=g, patternType=PREFIXED)`: ",
        " \t(principal=User:bob, host=h, operation=READ, permissionType=DENY) ",
        "",
    ]
