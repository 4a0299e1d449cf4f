"""A TLS cluster end to end (issue 16 B): SSL listeners everywhere, mutual TLS between nodes.

Real processes from the launcher with `tls=True` (what `cluster up --tls` makes): a controller
quorum of three and three brokers whose replication and controller links run over TLS with node
certificates (ssl.client.auth=required). A Python client with Kafka's TLS keyword arguments
produces and consumes; a plaintext client, a TLS client without a certificate, and one that
does not trust the cluster's CA all get a clear error; a leader kill fails over.
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

from minibroker.client import Admin, Consumer, Producer, TopicPartition
from minibroker.client.errors import MiniBrokerError
from minibroker.deploy import cluster as launcher
from minibroker.deploy import tls as certs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    settings = {
        "replica.lag.time.max.ms": "1500",
        "broker.session.timeout.ms": "2500",
        "leader.imbalance.check.interval.seconds": "3600",
    }
    directory = tmp_path_factory.mktemp("tls") / "cluster"
    with local_cluster(str(directory), brokers=3, settings=settings, controllers=3, tls=True) as c:
        yield c


def _records(bootstrap: str, tp: TopicPartition, want: int, **tls: str) -> list[bytes]:
    values: list[bytes] = []
    with Consumer(bootstrap, **tls) as consumer:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        wait_until(
            lambda: (
                values.extend(r.value for r in consumer.poll(timeout_ms=200)) or len(values) >= want
            ),
            30,
            f"{want} records",
        )
    return values


def test_every_listener_is_ssl_with_node_certificates(cluster: LocalCluster) -> None:
    state = cluster.state
    assert state.tls
    for spec in state.all():
        command = launcher.command_for(spec, state)
        assert f"SSL://{spec.address}" in command
        assert "ssl.client.auth=required" in command
        name = certs.node_name(spec.role, spec.node_id)
        pem = (launcher.tls_dir(state.dir) / f"{name}.pem").read_bytes()
        assert certs.identity(pem) == f"node:{name}"
        if spec.role == "broker":
            log = launcher.read_log_tail(spec.log_file, 400)
            assert '"security_protocol": "SSL"' in log


def test_tls_client_produces_and_consumes_and_a_leader_kill_fails_over(
    cluster: LocalCluster,
) -> None:
    tls = launcher.client_kwargs(cluster.state)
    assert tls["security_protocol"] == "SSL"
    tp = TopicPartition("secure", 0)
    with Admin(cluster.bootstrap, **tls) as admin:
        admin.create_topic("secure", 1, 3, {"min.insync.replicas": "2"})

        def isr() -> list[int]:
            (desc,) = admin.describe_topics(["secure"])
            return list(desc.partitions[0].isr)

        wait_until(lambda: len(isr()) == 3, 30, "a full ISR over TLS replication")
        with Producer(cluster.bootstrap, acks="all", **tls) as producer:
            for i in range(50):
                producer.send("secure", f"a{i}".encode(), partition=0)
            producer.flush()
            (desc,) = admin.describe_topics(["secure"])
            leader = desc.partitions[0].leader
            cluster.kill(leader)
            wait_until(
                lambda: (
                    admin.describe_topics(["secure"])[0].partitions[0].leader not in (leader, -1)
                ),
                30,
                "a new leader",
            )
            futures = [producer.send("secure", f"b{i}".encode(), partition=0) for i in range(50)]
            for future in futures:
                future.result(timeout=60)
        cluster.start(leader)
        wait_until(lambda: len(isr()) == 3, 30, f"broker {leader} back in the ISR over TLS")
    values = _records(cluster.bootstrap, tp, 100, **tls)
    assert values[:100] == [f"a{i}".encode() for i in range(50)] + [
        f"b{i}".encode() for i in range(50)
    ]


def _refused(bootstrap: str, **kwargs: str) -> str:
    admin = Admin(bootstrap, request_timeout_ms=3000, default_api_timeout_ms=3000, **kwargs)
    try:
        with pytest.raises(MiniBrokerError) as caught:
            admin.list_topics()
    finally:
        admin.close()
    return str(caught.value)


def test_a_plaintext_client_gets_a_clear_error(cluster: LocalCluster) -> None:
    message = _refused(cluster.bootstrap)
    assert "security_protocol='SSL'" in message, message


def test_a_client_without_a_certificate_is_refused(cluster: LocalCluster) -> None:
    ca = str(launcher.tls_dir(cluster.state.dir) / "ca.pem")
    message = _refused(cluster.bootstrap, security_protocol="SSL", ssl_ca_location=ca)
    assert "ssl_certificate_location" in message, message


def test_a_client_that_does_not_trust_the_ca_is_refused(
    cluster: LocalCluster, tmp_path: pathlib.Path
) -> None:
    other = certs.make_ca(tmp_path / "other")
    user = certs.make_client_cert(other, tmp_path / "other", "mallory")
    message = _refused(
        cluster.bootstrap,
        security_protocol="SSL",
        ssl_ca_location=str(other.cert),
        ssl_certificate_location=str(user.cert),
        ssl_key_location=str(user.key),
    )
    assert "CERTIFICATE_VERIFY_FAILED" in message or "handshake" in message.lower(), message


def _cli(*argv: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "minibroker.deploy", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "MINIBROKER_BOOTSTRAP_SERVER"},
    )


def test_cli_and_watch_connect_with_the_client_properties(
    cluster: LocalCluster, tmp_path: pathlib.Path
) -> None:
    config = launcher.client_config_path(cluster.state.dir)
    text = config.read_text()
    assert "security.protocol=SSL" in text and "ssl.certificate.location=" in text
    common = ("--bootstrap-server", cluster.bootstrap, "--command-config", str(config))
    made = _cli(
        "topics",
        "create",
        "cli-tls",
        "--partitions",
        "1",
        "--replication-factor",
        "3",
        *common,
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr
    listed = _cli("topics", "list", *common, cwd=tmp_path)
    assert listed.returncode == 0 and "cli-tls" in listed.stdout.split(), listed.stderr
    plain = _cli("topics", "list", "--bootstrap-server", cluster.bootstrap, cwd=tmp_path)
    assert plain.returncode == 1 and "--command-config" in plain.stderr, plain.stderr
    # watch finds the cluster's client.properties through its cluster.json.
    watched = _cli("watch", "--once", "--cluster-dir", cluster.state.dir, cwd=tmp_path)
    assert watched.returncode == 0, watched.stderr
    assert watched.stdout.count("alive") >= 3, watched.stdout


def test_controller_failover_over_tls(cluster: LocalCluster) -> None:
    """The quorum re-elects over its TLS links and brokers follow the new active controller."""
    state = cluster.state
    victim = launcher.active_controller(state)
    assert victim is not None
    cluster.kill(victim.name)
    try:
        wait_until(
            lambda: (
                (leader := launcher.active_controller(state)) is not None
                and leader.name != victim.name
            ),
            30,
            "a new active controller",
        )
        with Admin(cluster.bootstrap, **launcher.client_kwargs(state)) as admin:
            admin.create_topic("after-failover", 1, 3)
            wait_until(lambda: "after-failover" in admin.list_topics(), 30, "the topic in metadata")
    finally:
        cluster.start(victim.name)


def test_add_broker_gets_its_own_certificate(cluster: LocalCluster) -> None:
    spec = launcher.add_broker(cluster.directory, timeout_s=60)
    cluster.reload()
    name = certs.node_name("broker", spec.node_id)
    pem = (launcher.tls_dir(cluster.state.dir) / f"{name}.pem").read_bytes()
    assert certs.identity(pem) == f"node:{name}"
    with Admin(cluster.bootstrap, **launcher.client_kwargs(cluster.state)) as admin:
        registered = {b.broker_id for b in admin.describe_cluster().brokers}
    assert spec.node_id in registered


def test_bench_produce_and_consume_use_the_clusters_client_properties(
    cluster: LocalCluster, tmp_path: pathlib.Path
) -> None:
    """Run where `.minibroker` is the cluster's dir, as after `cluster up --tls`: no flags, the
    bench tools find the brokers and client.properties through cluster.json."""
    (tmp_path / ".minibroker").symlink_to(cluster.state.dir, target_is_directory=True)
    with Admin(cluster.bootstrap, **launcher.client_kwargs(cluster.state)) as admin:
        admin.create_topic("bench-tls", 1, 3)
    args = "bench produce --topic bench-tls --num-records 20 --record-size 16 --json"
    produced = _cli(*args.split(), cwd=tmp_path)
    assert produced.returncode == 0, produced.stderr
    assert '"records": 20' in produced.stdout, produced.stdout
    consumed = _cli(
        "bench", "consume", "--topic", "bench-tls", "--messages", "20", "--json", cwd=tmp_path
    )
    assert consumed.returncode == 0, consumed.stderr
    assert '"records": 20' in consumed.stdout, consumed.stdout


def test_verify_runs_on_a_tls_cluster(cluster: LocalCluster, tmp_path: pathlib.Path) -> None:
    """`minibroker verify --dir` on a --tls cluster (one kill round): every client of the run
    connects with the cluster's client.properties, and the history checks out."""
    try:
        args = "--rounds 1 --faults kill --rate 100 --seed 16 --json"
        result = _cli("verify", "--dir", cluster.state.dir, *args.split(), cwd=tmp_path)
    finally:
        cluster.reload()  # the killed process was started again under a new PID
    assert result.returncode == 0, result.stderr[-4000:] + result.stdout[-2000:]
    out = json.loads(result.stdout)
    assert out["ok"] and out["rounds"] == 1, out
    assert out["totals"]["acked"] > 0 and out["totals"]["lost"] == 0, out["totals"]
