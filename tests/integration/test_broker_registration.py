"""Registration as untrusted input, UnregisterBroker, and unknown election types, on real processes.

Issue 11 item 9. A real controller process (`controller_harness.py`) with test code as brokers:
junk registrations are refused with INVALID_REQUEST over gRPC and write nothing; an unknown
election type is INVALID_REQUEST for the whole request (Kafka's "Unknown election type N") and
moves no leader; a broker that was killed is unregistered and stays gone after a controller
restart (the UnregisterBrokerRecord is in the fsynced metadata log), while a live one is refused.
Then the same through the `minibroker brokers` command against a real cluster, and a real broker
process whose registration the controller refuses exits at once with the reason.
"""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys

import pytest

from minibroker.client.errors import ErrorCode
from minibroker.proto import minibroker_pb2 as pb
from tests.integration.cluster_harness import local_cluster
from tests.integration.controller_harness import (
    ControllerProcess,
    FakeBroker,
    FakeBrokerProcess,
    wait_until,
)

pytestmark = pytest.mark.integration

JUNK = [
    ({"host": ""}, "host is empty"),
    ({"port": -5}, "port -5"),
    ({"port": 70000}, "port 70000"),
    ({"host": "bad host"}, "host 'bad host'"),
    ({"host": "evil\n\x1b[2J"}, "host"),
    ({"rack": "r\x00"}, "rack"),
    ({"broker_id": -3}, "broker id -3"),
    ({"incarnation_id": ""}, "incarnation id"),
    ({"metrics_port": 65536}, "metrics port 65536"),
]


@pytest.fixture
def controller(tmp_path: pathlib.Path):
    proc = ControllerProcess(
        tmp_path / "controller-data", {"auto.leader.rebalance.enable": "false"}
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def brokers():
    started: list[FakeBroker | FakeBrokerProcess] = []
    try:
        yield started
    finally:
        for b in started:
            if isinstance(b, FakeBrokerProcess):
                b.kill()
            else:
                b.stop()


def registration(**change: object) -> pb.BrokerRegistrationRequest:
    fields: dict[str, object] = {
        "broker_id": 5,
        "cluster_id": "",
        "incarnation_id": "0123456789abcdef",
        "host": "127.0.0.1",
        "port": 19005,
        "rack": "",
        "previous_broker_epoch": -1,
        "metrics_port": -1,
    }
    fields.update(change)
    return pb.BrokerRegistrationRequest(**fields)  # type: ignore[arg-type]


def test_junk_registrations_are_refused_and_write_nothing(controller: ControllerProcess) -> None:
    assert controller.stub is not None
    before = controller.describe().metadata_offset
    for change, needle in JUNK:
        reply = controller.stub.RegisterBroker(registration(**change), timeout=5)
        assert reply.error_code == ErrorCode.INVALID_REQUEST, (change, reply)
        assert needle in reply.error_message, (change, reply.error_message)
        assert reply.error_message.isprintable()
    desc = controller.describe()
    assert desc.metadata_offset == before and list(desc.brokers) == []
    assert controller.events("broker_registered") == []
    # The same request with good fields is accepted.
    assert controller.stub.RegisterBroker(registration(), timeout=5).error_code == ErrorCode.NONE


def create(controller: ControllerProcess, name: str, partitions: int, rf: int) -> None:
    assert controller.stub is not None
    reply = controller.stub.CreateTopics(
        pb.CreateTopicsRequest(
            topics=[pb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=rf)]
        ),
        timeout=10,
    )
    assert reply.topics[0].error_code == ErrorCode.NONE, reply


def test_unknown_election_type_is_an_invalid_request(controller, brokers) -> None:
    for b in (1, 2):
        brokers.append(FakeBroker(controller.address, b).start())
    for b in (1, 2):
        wait_until(lambda b=b: controller.is_unfenced(b), 15, f"broker {b} unfenced")
    create(controller, "t", 2, 2)
    before = controller.snapshot_image()
    reply = controller.stub.ElectLeaders(
        pb.ElectLeadersRequest(
            election_type=7,  # proto3 enums are open: any int32 arrives
            topic_partitions=[pb.TopicPartitions(topic="t", partitions=[0, 1])],
        ),
        timeout=5,
    )
    assert reply.error_code == ErrorCode.INVALID_REQUEST
    assert reply.error_message == "Unknown election type 7"
    assert [(r.partition, r.error_code) for r in reply.results] == [
        (0, ErrorCode.INVALID_REQUEST),
        (1, ErrorCode.INVALID_REQUEST),
    ]
    reply = controller.stub.ElectLeaders(
        pb.ElectLeadersRequest(election_type=-1, all_partitions=True), timeout=5
    )
    assert reply.error_code == ErrorCode.INVALID_REQUEST and list(reply.results) == []
    after = controller.snapshot_image()
    assert after.next_offset == before.next_offset
    assert after.topic("t").partitions == before.topic("t").partitions


def test_a_dead_broker_is_unregistered_durably_and_a_live_one_is_refused(
    controller: ControllerProcess, brokers, tmp_path: pathlib.Path
) -> None:
    assert controller.stub is not None
    brokers.append(FakeBroker(controller.address, 1).start())
    dead = FakeBrokerProcess(controller.address, 2, tmp_path)
    brokers.append(dead)
    for b in (1, 2):
        wait_until(lambda b=b: controller.is_unfenced(b), 15, f"broker {b} unfenced")
    create(controller, "t", 2, 2)

    # Alive: refused, nothing written.
    offset = controller.describe().metadata_offset
    reply = controller.stub.UnregisterBroker(pb.UnregisterBrokerRequest(broker_id=2), timeout=5)
    assert reply.error_code == ErrorCode.INVALID_REQUEST
    assert "broker 2 is alive" in reply.error_message
    assert controller.describe().metadata_offset == offset
    reply = controller.stub.UnregisterBroker(pb.UnregisterBrokerRequest(broker_id=9), timeout=5)
    assert reply.error_code == ErrorCode.BROKER_ID_NOT_REGISTERED

    dead.proc.send_signal(signal.SIGKILL)
    dead.proc.wait(10)
    wait_until(lambda: controller.is_fenced(2), 15, "broker 2 fenced")
    reply = controller.stub.UnregisterBroker(pb.UnregisterBrokerRequest(broker_id=2), timeout=5)
    assert reply.error_code == ErrorCode.NONE, reply
    assert controller.broker(2) is None
    assert [e["broker_id"] for e in controller.events("broker_unregistered")] == [2]

    def check_gone() -> None:
        image = controller.snapshot_image()
        assert sorted(image.brokers) == [1]
        for p in image.topic("t").partitions.values():
            assert 2 in p.replicas and 2 not in p.isr and p.leader == 1

    check_gone()
    # Durable: a controller killed with SIGKILL and started again still has it removed.
    controller.kill()
    controller.start()
    assert controller.broker(2) is None
    check_gone()
    reply = controller.stub.UnregisterBroker(pb.UnregisterBrokerRequest(broker_id=2), timeout=5)
    assert reply.error_code == ErrorCode.BROKER_ID_NOT_REGISTERED


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "minibroker.deploy", *args],
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_brokers_command_and_a_broker_refused_at_registration(tmp_path: pathlib.Path) -> None:
    settings = {
        "broker.session.timeout.ms": "2500",
        "leader.imbalance.check.interval.seconds": "3600",
    }
    with local_cluster(str(tmp_path / "cluster"), brokers=2, settings=settings) as cluster:
        boot = ["--bootstrap-server", cluster.spec(1).address]
        listed = cli("brokers", "list", *boot)
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert [line.split("\t")[0] for line in lines] == ["Broker: 1", "Broker: 2"]
        assert all("State: active" in line for line in lines)

        refused = cli("brokers", "unregister", "2", *boot)
        assert refused.returncode == 1
        assert "InvalidRequestError: broker 2 is alive" in refused.stderr
        assert "Traceback" not in refused.stderr

        cluster.kill(2)

        def fenced() -> bool:
            out = cli("brokers", "list", *boot).stdout.splitlines()
            return any(line.startswith("Broker: 2\t") and "State: fenced" in line for line in out)

        wait_until(fenced, 30, "broker 2 fenced in `brokers list`")
        done = cli("brokers", "unregister", "2", *boot)
        assert done.returncode == 0, done.stderr
        assert done.stdout == "Broker 2 is no longer registered.\n"
        listed = cli("brokers", "list", "--json", *boot)
        assert '"broker_id": 2' not in listed.stdout and '"broker_id": 1' in listed.stdout
        again = cli("brokers", "unregister", "2", *boot)
        assert again.returncode == 1
        assert "BrokerIdNotRegisteredError: broker 2 is not registered" in again.stderr

        # A real broker whose registration is junk (a rack with a space) stops at once with
        # the controller's reason instead of retrying forever.
        bad = subprocess.run(
            [
                sys.executable,
                "-m",
                "minibroker.deploy",
                "broker",
                "--node-id",
                "7",
                "--data-dir",
                str(tmp_path / "bad-broker"),
                "--listen",
                "127.0.0.1:0",
                "--controller",
                cluster.controller_address,
                "--rack",
                "rack a",
                "--metrics-port",
                "-1",
                "--log-format",
                "json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert bad.returncode == 1, bad.stderr[-2000:]
        assert "broker registration refused: rack 'rack a'" in bad.stderr
        assert "Traceback" not in bad.stderr
