"""Brokers on more than one "host": each bound to its own loopback address (127.0.0.2, 127.0.0.3),
and one bound to 0.0.0.0 advertising 127.0.0.4 (advertised.listeners). Clients bootstrapped from
one broker learn the others from Metadata answers, which give the advertised addresses; a leader
kill fails over. A broker on 0.0.0.0 without an advertised listener is refused at start."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import grpc
import pytest
from cluster_harness import local_cluster, wait_until

from minibroker.client import Admin, Consumer, Producer, TopicPartition
from minibroker.deploy import cluster as launcher
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

SETTINGS = {
    "replica.lag.time.max.ms": "1500",
    "broker.session.timeout.ms": "2500",
    "leader.imbalance.check.interval.seconds": "3600",
}


def plan_hosts(directory: str) -> launcher.ClusterState:
    """Three brokers: 127.0.0.2, 127.0.0.3, and 0.0.0.0 advertised as 127.0.0.4. The launcher
    talks to a broker at its spec's host (the advertised one); the third broker's `listeners`
    and `advertised.listeners` settings (a --set wins over --listen) bind it to every interface."""
    pathlib.Path(directory).mkdir(parents=True)
    state = launcher.plan_cluster(directory, brokers=3, racks=0, base_port=0, settings=SETTINGS)
    hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    for spec, host in zip(state.brokers, hosts, strict=True):
        spec.host = host
        spec.port = launcher.free_port("0.0.0.0")
    wildcard = state.brokers[2]
    wildcard.settings["listeners"] = f"PLAINTEXT://0.0.0.0:{wildcard.port}"
    wildcard.settings["advertised.listeners"] = f"PLAINTEXT://127.0.0.4:{wildcard.port}"
    launcher.save_state(state)
    return state


def metadata_addresses(address: str) -> dict[int, str]:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.BrokerServiceStub(channel)
        answer = stub.Metadata(pb.MetadataRequest(all_topics=True), timeout=5)
    return {b.node_id: f"{b.host}:{b.port}" for b in answer.brokers}


def leaders(admin: Admin, topic: str) -> dict[int, int]:
    (desc,) = admin.describe_topics([topic])
    return {p.partition: p.leader for p in desc.partitions}


def test_brokers_on_three_hosts_reach_each_other_and_fail_over(tmp_path: pathlib.Path) -> None:
    directory = str(tmp_path / "cluster")
    planned = plan_hosts(directory)
    expected = {b.node_id: b.address for b in planned.brokers}
    assert expected[3].startswith("127.0.0.4:")
    with local_cluster(directory, brokers=3) as cluster:
        # Every broker's Metadata answer gives the advertised addresses, not 0.0.0.0.
        for spec in cluster.state.brokers:
            assert metadata_addresses(spec.address) == expected
        with grpc.insecure_channel(cluster.controller_address) as channel:
            brokers = (
                pb_grpc.ControllerServiceStub(channel)
                .DescribeCluster(pb.DescribeClusterRequest(), timeout=5)
                .brokers
            )
        assert {b.broker_id: f"{b.host}:{b.port}" for b in brokers} == expected

        bootstrap = expected[1]  # one broker only: the others come from Metadata
        with Admin(bootstrap) as admin:
            admin.create_topic("hosts", 3, 3, {"min.insync.replicas": "2"})
            wait_until(
                lambda: all(
                    len(p.isr) == 3 for p in admin.describe_topics(["hosts"])[0].partitions
                ),
                30,
                "full ISRs",
            )
            before = leaders(admin, "hosts")
        assert set(before.values()) == {1, 2, 3}, before  # the producer must reach every host

        sent: list[bytes] = []
        with Producer(bootstrap, acks="all", request_timeout_ms=5000) as producer:
            for i in range(30):
                value = f"before-{i}".encode()
                producer.send("hosts", value, partition=i % 3).result(timeout=30)
                sent.append(value)
            # Kill the leader of a partition led off the bootstrap broker (by then the producer
            # knows every broker; the bootstrap stays up for the consumer below).
            victim_partition = next(p for p, leader in before.items() if leader != 1)
            victim = before[victim_partition]
            cluster.kill(victim)
            with Admin(bootstrap) as admin:
                wait_until(
                    lambda: leaders(admin, "hosts")[victim_partition] not in (victim, -1),
                    30,
                    f"a new leader for hosts-{victim_partition}",
                )
            for i in range(30):
                value = f"after-{i}".encode()
                producer.send("hosts", value, partition=i % 3).result(timeout=60)
                sent.append(value)

        with Consumer(bootstrap) as consumer:
            tps = [TopicPartition("hosts", p) for p in range(3)]
            consumer.assign(tps)
            for tp in tps:
                consumer.seek_to_beginning(tp)
            got: list[bytes] = []

            def read_everything() -> bool:
                got.extend(r.value for r in consumer.poll(timeout_ms=500))
                return len(got) >= len(sent)

            wait_until(read_everything, 60, "every acknowledged record", interval_s=0)
        assert sorted(got) == sorted(sent)


def test_a_broker_on_every_interface_needs_an_advertised_listener(tmp_path: pathlib.Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "minibroker.deploy",
            "broker",
            "--node-id",
            "1",
            "--data-dir",
            str(tmp_path / "data"),
            "--listen",
            "PLAINTEXT://0.0.0.0:0",
            "--controller",
            "127.0.0.1:1",
            "--metrics-port",
            "-1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "binds every interface" in result.stderr
    assert "advertised.listeners" in result.stderr
    assert not (tmp_path / "data").exists()
