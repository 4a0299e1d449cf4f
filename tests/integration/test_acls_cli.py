"""ACLs end to end (issue 16): `minibroker acls` against a real cluster (one controller, two
brokers, plaintext: enforcement is tested elsewhere). ACLs added through the CLI are listed in
kafka-acls' words, reach every broker's metadata image (each broker's
kafka_server_authorizer_AclsTotalCount gauge counts the ACLs its image holds), are removed by
--remove, and survive a controller restart (log replay and a snapshot: the snapshot interval is
small, so the restarted controller loads one that holds them)."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.client import Admin
from minibroker.client.admin import AsyncAdmin
from minibroker.client.cli.common import run_async
from minibroker.client.errors import InvalidRequestError
from minibroker.metadata.acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("acls") / "cluster"
    settings = {"metadata.snapshot.interval.records": "5"}
    with local_cluster(str(directory), brokers=2, settings=settings) as c:
        yield c


def acls(cluster: LocalCluster, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "minibroker.deploy", "acls", *args,
         "--bootstrap-server", cluster.bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    if check:
        assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
    return result


def broker_acl_counts(cluster: LocalCluster) -> list[int]:
    counts = []
    for spec in cluster.state.brokers:
        url = f"http://127.0.0.1:{spec.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=2) as r:
            text = r.read().decode()
        line = next(
            ln
            for ln in text.splitlines()
            if ln.startswith("kafka_server_authorizer_AclsTotalCount")
        )
        counts.append(int(float(line.rpartition(" ")[2])))
    return counts


def describe(cluster: LocalCluster, flt: AclBindingFilter) -> list:
    with Admin(cluster.bootstrap, default_api_timeout_ms=20_000) as admin:
        return admin.describe_acls(flt)


def test_acls_added_listed_replicated_removed_and_durable(cluster: LocalCluster) -> None:
    # Add: principals x operations on a topic, a prefixed deny, a consumer's set, the cluster.
    out = acls(
        cluster, "--add", "--allow-principal", "User:alice", "--allow-principal", "User:bob",
        "--operation", "Read", "--operation", "Describe", "--topic", "orders",
    ).stdout  # fmt: skip
    assert "Adding ACLs for resource `ResourcePattern(resourceType=TOPIC, name=orders, " in out
    assert "(principal=User:bob, host=*, operation=DESCRIBE, permissionType=ALLOW)" in out
    acls(cluster, "--add", "--deny-principal", "User:*", "--deny-host", "10.9.9.9",
         "--operation", "Write", "--topic", "pay",
         "--resource-pattern-type", "prefixed")  # fmt: skip
    acls(cluster, "--add", "--allow-principal", "User:carol", "--consumer", "--topic", "orders",
         "--group", "billing")  # fmt: skip
    acls(cluster, "--add", "--allow-principal", "User:ops", "--operation", "Alter", "--cluster")
    # Adding the same ACL again is a no-op success.
    acls(cluster, "--add", "--allow-principal", "User:ops", "--operation", "Alter", "--cluster")
    total = 4 + 1 + 3 + 1
    assert len(describe(cluster, AclBindingFilter())) == total
    listed = acls(cluster, "--list").stdout
    assert (
        "Current ACLs for resource "
        "`ResourcePattern(resourceType=TOPIC, name=orders, patternType=LITERAL)`:" in listed
    )
    assert "(principal=User:carol, host=*, operation=READ, permissionType=ALLOW)" in listed
    assert "name=pay, patternType=PREFIXED" in listed
    assert "(principal=User:*, host=10.9.9.9, operation=WRITE, permissionType=DENY)" in listed
    assert "resourceType=CLUSTER, name=kafka-cluster" in listed
    # MATCH: the ACLs that apply to topic "payments" are the prefixed deny only.
    match = acls(cluster, "--list", "--topic", "payments", "--resource-pattern-type", "match")
    assert "name=pay, patternType=PREFIXED" in match.stdout and "orders" not in match.stdout
    by_principal = acls(cluster, "--list", "--principal", "User:carol").stdout
    assert "ACLs for principal `User:carol`" in by_principal and "alice" not in by_principal
    # Every broker's image holds them (the brokers follow the metadata log).
    wait_until(lambda: broker_acl_counts(cluster) == [total] * 2, 20, "ACLs on every broker")

    # Refusals say why and change nothing.
    bad = acls(cluster, "--add", "--allow-principal", "alice", "--topic", "t", check=False)
    assert bad.returncode == 1 and "TYPE:NAME" in bad.stderr
    bad = acls(cluster, "--remove", "--topic", "orders", check=False)
    assert bad.returncode == 1 and "--force" in bad.stderr

    # The controller's own checks (the CLI's are bypassed): INVALID_REQUEST, nothing written.
    async def refused() -> tuple[str, str]:
        async with AsyncAdmin(cluster.bootstrap, default_api_timeout_ms=20_000) as admin:
            with pytest.raises(InvalidRequestError) as created:
                await admin.create_acls(
                    [
                        AclBinding(
                            ResourceType.CLUSTER,
                            "not-the-cluster",
                            PatternType.LITERAL,
                            "User:x",
                            "*",
                            AclOperation.ALTER,
                            AclPermissionType.ALLOW,
                        )
                    ]
                )
            with pytest.raises(InvalidRequestError) as deleted:
                await admin.delete_acls([AclBindingFilter(operation=AclOperation.UNKNOWN)])
            return str(created.value), str(deleted.value)

    created, deleted = run_async(refused())
    assert "kafka-cluster" in created and "Unknown operation" in deleted
    assert len(describe(cluster, AclBindingFilter())) == total

    # Remove one entry, then every ACL of the group.
    acls(cluster, "--remove", "--force", "--allow-principal", "User:bob", "--operation",
         "Describe", "--topic", "orders")  # fmt: skip
    acls(cluster, "--remove", "--force", "--group", "billing")
    total -= 2
    remaining = describe(
        cluster, AclBindingFilter(ResourceType.TOPIC, "orders", PatternType.LITERAL)
    )
    assert {(b.principal, b.operation) for b in remaining} == {
        ("User:alice", AclOperation.READ),
        ("User:alice", AclOperation.DESCRIBE),
        ("User:bob", AclOperation.READ),
        ("User:carol", AclOperation.READ),
        ("User:carol", AclOperation.DESCRIBE),
    }
    wait_until(lambda: broker_acl_counts(cluster) == [total] * 2, 20, "removals on every broker")

    # A controller restart replays the log (from a snapshot that holds ACLs): nothing is lost.
    before = sorted(map(repr, describe(cluster, AclBindingFilter())))
    cluster.kill("controller")
    cluster.start("controller")
    assert wait_until(
        lambda: sorted(map(repr, describe(cluster, AclBindingFilter()))) == before,
        30,
        "the ACLs after a controller restart",
    )
    assert "name=pay, patternType=PREFIXED" in acls(cluster, "--list").stdout
    # Brokers that re-follow the restarted controller still hold the same ACLs.
    wait_until(lambda: broker_acl_counts(cluster) == [total] * 2, 20, "ACLs after the restart")
