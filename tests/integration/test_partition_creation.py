"""Creating as many partitions as the limits allow fences no broker (a follow-up to issue 11
item 8).

`max.broker.partitions` lets a user put 1000 replicas on one broker with one topic. Each new
partition log used to cost a broker 35-80 ms of file creation and fsyncs on its event loop, which
also sends its heartbeats: creating 100 partitions at once stalled a broker past
`broker.session.timeout.ms` (3000), the controller fenced it and moved its leaderships, and
creating 1000 replicas per broker took over a minute of fencing and unfencing.

Against a real 3-broker cluster: a topic of 1000 partitions with replication factor 3 (the
default per-broker limit on every broker). Within a generous deadline every partition has a
leader, its full ISR, and a log on each of its replicas; the controller fenced no broker
meanwhile; and every partition takes an acks=all write.

The processes start with a soft open-file limit of 1024, as many systems set it: a broker with
1000 replicas needs more, and raises its soft limit to the hard one at start (as Kafka's JVM
does), saying so in its log.
"""

from __future__ import annotations

import json
import pathlib
import resource
from collections.abc import Iterator

import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.client import Admin, Producer
from minibroker.client.admin import TopicDescription

pytestmark = pytest.mark.integration

TOPIC = "many"
PARTITIONS = 1000  # max.broker.partitions' default, on each of the 3 brokers
# Generous: creation is done in a few seconds when nothing is fenced; the deadline is there so
# that a failure says what was missing rather than hanging.
DEADLINE_S = 240.0


SOFT_LIMIT = 1024


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    settings = {"leader.imbalance.check.interval.seconds": "3600"}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip("needs a hard open-file limit of 4096")
    # The processes inherit this soft limit; the test process gets its own back at once.
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT_LIMIT, hard))
    try:
        with local_cluster(str(tmp_path / "cluster"), brokers=3, settings=settings) as c:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            yield c
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def events(cluster: LocalCluster, ident: str | int, name: str) -> list[dict]:  # type: ignore[type-arg]
    text = pathlib.Path(cluster.spec(ident).log_file).read_text(errors="replace")
    return [
        event
        for line in text.splitlines()
        if line.startswith("{") and (event := json.loads(line)).get("event") == name
    ]


def controller_events(cluster: LocalCluster, name: str) -> list[dict]:  # type: ignore[type-arg]
    return events(cluster, "controller", name)


def open_file_limits(pid: int) -> tuple[int, int]:
    for line in pathlib.Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError(f"no open-file limit for pid {pid}")


def not_in_sync(topic: TopicDescription) -> list[str]:
    """What keeps partitions of `topic` from being fully in sync (empty: nothing)."""
    missing = []
    for p in topic.partitions:
        if p.leader < 0 or p.high_watermark < 0:
            missing.append(f"{p.partition}: no serving leader")
        elif set(p.isr) != set(p.replicas):
            missing.append(f"{p.partition}: ISR {p.isr} of {p.replicas}")
        elif any(leo is None for leo in p.log_end_offsets.values()):
            missing.append(f"{p.partition}: logs {p.log_end_offsets}")
    return missing


def test_creating_the_most_partitions_a_broker_may_host_fences_no_broker(
    cluster: LocalCluster,
) -> None:
    for spec in cluster.state.brokers:
        soft, hard = open_file_limits(spec.pid)
        assert soft == hard > SOFT_LIMIT, (spec.pid, soft, hard)
        (logged,) = events(cluster, spec.node_id, "open_file_limit")
        assert (logged["raised_from"], logged["soft"]) == (SOFT_LIMIT, soft)

    with Admin(cluster.bootstrap, request_timeout_ms=60_000) as admin:
        admin.create_topic(TOPIC, PARTITIONS, 3)
        last: list[list[str]] = [["not described yet"]]

        def in_sync() -> bool:
            (topic,) = admin.describe_topics([TOPIC])
            last[0] = not_in_sync(topic) if len(topic.partitions) == PARTITIONS else ["count"]
            return not last[0]

        try:
            wait_until(in_sync, DEADLINE_S, "every partition in sync", interval_s=0.5)
        except AssertionError as err:
            raise AssertionError(f"{err}; {len(last[0])} not in sync: {last[0][:5]}") from None
        assert controller_events(cluster, "broker_fenced") == []
        assert not any(b.fenced for b in admin.describe_cluster().brokers)

    with Producer(cluster.bootstrap, acks="all", linger_ms=5) as producer:
        futures = [producer.send(TOPIC, b"x", partition=p) for p in range(PARTITIONS)]
        offsets = {f.result(timeout=DEADLINE_S).offset for f in futures}
    assert offsets == {0}
    assert controller_events(cluster, "broker_fenced") == []
