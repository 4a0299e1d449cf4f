"""SCRAM users on a real cluster (issue 16): `cluster up --tls --sasl` (SASL_SSL listeners,
client certificates still required), one controller and two brokers as processes.

`minibroker users --add/--list/--delete` and the Admin methods write and read credentials; the
controller refuses node names, bad iteration counts and unknown users; no password reaches the
metadata log; the credentials reach every broker's image; they survive a controller restart
(from its snapshot and log). A SASL_SSL client (certificate without rights + user/password) is
authenticated as its user, by brokers and the controller (SaslVerifier as the per-call
authentication's SASL hook): with no ACLs it is refused by the authorizer, not the
authentication; a wrong password or an unknown user is SaslAuthenticationFailedError; managing
users needs ALTER/DESCRIBE on the cluster. One password per user: `users --add` replaces the
user's other mechanism's credential, `users --delete` removes them all, and the old password
stops working.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import Iterator

import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.client import (
    Admin,
    Producer,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from minibroker.client.errors import (
    ClusterAuthorizationFailedError,
    SaslAuthenticationFailedError,
    TopicAuthorizationFailedError,
    UnacceptableCredentialError,
)
from minibroker.deploy import cluster as launcher

pytestmark = pytest.mark.integration

PASSWORDS = {"alice": "wonder-land-7", "bob": "builder-of-things"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Snapshots every few records, so the restart below loads credentials from one.
    settings = {"metadata.snapshot.interval.records": "10"}
    directory = tmp_path_factory.mktemp("sasl") / "cluster"
    with local_cluster(
        str(directory), brokers=2, settings=settings, controllers=1, tls=True, sasl=True
    ) as c:
        yield c


def _cli(cluster: LocalCluster, *argv: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    config = str(launcher.client_config_path(cluster.state.dir))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "minibroker.deploy",
            *argv,
            "--bootstrap-server",
            cluster.bootstrap,
            "--command-config",
            config,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "MINIBROKER_BOOTSTRAP_SERVER"},
    )


def _admin(cluster: LocalCluster) -> Admin:
    return Admin(cluster.bootstrap, **launcher.client_kwargs(cluster.state))


def _sasl(cluster: LocalCluster, user: str, password: str) -> dict[str, str]:
    props = launcher.sasl_client_properties(cluster.state, user, password)
    return {k.replace(".", "_"): v for k, v in props.items()}


def _broker_users(cluster: LocalCluster, broker_id: int) -> list[str] | None:
    """The users of the last `scram_credentials_changed` line of the broker's log."""
    users = None
    for line in cluster.log_tail(broker_id, 2000).splitlines():
        if '"scram_credentials_changed"' in line:
            users = json.loads(line)["users"]
    return users


def test_listeners_are_sasl_ssl(cluster: LocalCluster) -> None:
    state = cluster.state
    assert state.tls and state.sasl
    for spec in state.all():
        command = launcher.command_for(spec, state)
        assert f"SASL_SSL://{spec.address}" in command and "ssl.client.auth=required" in command
    assert (launcher.tls_dir(state.dir) / "client.pem").exists()


def test_users_add_list_delete_and_replicate(cluster: LocalCluster, tmp_path: pathlib.Path) -> None:
    added = _cli(cluster, "users", "--add", "alice", "--password", PASSWORDS["alice"], cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    assert "Completed updating SCRAM-SHA-256 credential of user alice." in added.stdout
    with _admin(cluster) as admin:
        results = admin.alter_user_scram_credentials(
            [
                UserScramCredentialUpsertion("bob", PASSWORDS["bob"], "SCRAM-SHA-512", 8192),
                UserScramCredentialUpsertion("carol", "pw", iterations=100),
            ]
        )
        assert results["bob"] is None
        assert isinstance(results["carol"], UnacceptableCredentialError)
        assert "too few iterations" in str(results["carol"])
        described = admin.describe_user_scram_credentials()
        assert {u: [(c.mechanism, c.iterations) for c in cs] for u, cs in described.items()} == {
            "alice": [("SCRAM-SHA-256", 4096)],
            "bob": [("SCRAM-SHA-512", 8192)],
        }
    node = _cli(cluster, "users", "--add", "broker-1", "--password", "x", cwd=tmp_path)
    assert node.returncode == 1 and "UnacceptableCredentialError" in node.stderr, node.stderr
    assert "node's name" in node.stderr
    missing = _cli(cluster, "users", "--delete", "nobody", cwd=tmp_path)
    assert missing.returncode == 1 and "ResourceNotFoundError" in missing.stderr, missing.stderr
    listed = _cli(cluster, "users", "--list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines() == [
        "SCRAM credential configs for user-principal 'alice' are SCRAM-SHA-256=iterations=4096",
        "SCRAM credential configs for user-principal 'bob' are SCRAM-SHA-512=iterations=8192",
    ]
    # Every broker's image has both users.
    for broker in cluster.state.brokers:
        wait_until(
            lambda b=broker.node_id: _broker_users(cluster, b) == ["alice", "bob"],
            20,
            f"both users in broker {broker.node_id}'s image",
        )
    # No password (nor its text in any encoding) reached the controller's disk.
    data = pathlib.Path(cluster.state.controller.data_dir)
    stored = b"".join(p.read_bytes() for p in data.rglob("*") if p.is_file())
    assert b"alice" in stored
    for password in PASSWORDS.values():
        assert password.encode() not in stored


def test_a_sasl_user_is_authenticated(cluster: LocalCluster) -> None:
    login = _sasl(cluster, "alice", PASSWORDS["alice"])
    assert login["security_protocol"] == "SASL_SSL"
    with _admin(cluster) as admin:
        admin.create_topic("sasl-topic", 1, 2)
    # DescribeCluster: any authenticated caller.
    with Admin(cluster.bootstrap, **login) as admin:
        assert len(admin.describe_cluster().brokers) == 2
    # Authenticated as User:alice, who has no ACLs (super.users is User:admin): the
    # authorizer refuses, not the authentication.
    with (
        Producer(cluster.bootstrap, acks="all", **login) as producer,
        pytest.raises(TopicAuthorizationFailedError),
    ):
        producer.send("sasl-topic", b"from alice", partition=0).result(timeout=30)


def test_wrong_password_and_user_admin_refused_after_enforcement(cluster: LocalCluster) -> None:
    for user, password in [("alice", "not-her-password"), ("mallory", "whatever")]:
        admin = Admin(
            cluster.bootstrap,
            request_timeout_ms=5000,
            default_api_timeout_ms=5000,
            **_sasl(cluster, user, password),
        )
        try:
            with pytest.raises(SaslAuthenticationFailedError) as err:
                admin.list_topics()
        finally:
            admin.close()
        assert "invalid username or password" in str(err.value)
    # Authenticated, but without ALTER/DESCRIBE on the cluster: users are not alice's to manage.
    with Admin(cluster.bootstrap, **_sasl(cluster, "alice", PASSWORDS["alice"])) as admin:
        refused = admin.alter_user_scram_credentials([UserScramCredentialDeletion("bob")])
        assert isinstance(refused["bob"], ClusterAuthorizationFailedError)
        with pytest.raises(ClusterAuthorizationFailedError):
            admin.describe_user_scram_credentials()


def test_credentials_survive_a_controller_restart(
    cluster: LocalCluster, tmp_path: pathlib.Path
) -> None:
    cluster.stop("controller")
    cluster.start("controller")
    with _admin(cluster) as admin:
        described = wait_until(
            admin.describe_user_scram_credentials, 30, "the users after the restart"
        )
        assert sorted(described) == ["alice", "bob"]
        results = admin.alter_user_scram_credentials([UserScramCredentialDeletion("alice")])
        assert results == {"alice": None}
    for broker in cluster.state.brokers:
        wait_until(
            lambda b=broker.node_id: _broker_users(cluster, b) == ["bob"],
            20,
            f"alice gone from broker {broker.node_id}'s image",
        )
    # bob still logs in (checked by the brokers and the controller once enforcement is merged).
    with Admin(cluster.bootstrap, **_sasl(cluster, "bob", PASSWORDS["bob"])) as admin:
        assert len(admin.describe_cluster().brokers) == 2


def _logs_in(cluster: LocalCluster, user: str, password: str) -> bool:
    """Whether the login is accepted by the controller (DescribeCluster) and a broker
    (Metadata)."""
    admin = Admin(
        cluster.bootstrap,
        request_timeout_ms=5000,
        default_api_timeout_ms=5000,
        **_sasl(cluster, user, password),
    )
    try:
        admin.describe_cluster()
        admin.list_topics()
    except SaslAuthenticationFailedError:
        return False
    finally:
        admin.close()
    return True


def test_one_password_per_user(cluster: LocalCluster, tmp_path: pathlib.Path) -> None:
    # bob has a SCRAM-SHA-512 credential; a new password (SCRAM-SHA-256) replaces it.
    added = _cli(cluster, "users", "--add", "bob", "--password", "new-bob-pw", cwd=tmp_path)
    assert added.returncode == 0, added.stderr
    assert added.stdout.splitlines() == [
        "Completed updating SCRAM-SHA-256 credential of user bob.",
        "Deleted SCRAM-SHA-512 credential of user bob (one password per user).",
    ]
    wait_until(lambda: _logs_in(cluster, "bob", "new-bob-pw"), 20, "bob's new password")
    wait_until(lambda: not _logs_in(cluster, "bob", PASSWORDS["bob"]), 20, "old one refused")
    deleted = _cli(cluster, "users", "--delete", "bob", cwd=tmp_path)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.splitlines() == ["Deleted SCRAM-SHA-256 credential of user bob."]
    listed = _cli(cluster, "users", "--list", cwd=tmp_path)
    assert listed.stdout.splitlines() == ["No SCRAM users."], listed.stderr
    wait_until(lambda: not _logs_in(cluster, "bob", "new-bob-pw"), 20, "deleted bob refused")
