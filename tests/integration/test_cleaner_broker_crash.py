"""A broker SIGKILLed at each step of a cleaning round and its swap, then restarted (issue 21).

Two brokers and a controller on 127.0.0.1; one compacted partition, RF 1, on the broker under
test (the other broker keeps the cluster reachable while it is down). For each step of
`cleaner.STEPS`:
- with cleaning held off (`min.cleanable.dirty.ratio=1`: a ratio is never above 1), an acks=all
  producer writes more keyed records (tombstones among them) over a small key space;
- the broker is stopped and started again with MINIBROKER_TEST_CLEANER_CRASH_AT_STEP set, the
  ratio lowered to 0.01, and the broker SIGKILLs itself when its cleaner reaches that step;
- with cleaning held off again, the broker restarts without the variable. Its load must leave
  a whole log: no `.cleaned` or `.swap` file, segments whose offsets do not overlap, offsets
  strictly increasing, and exactly each key's last acknowledged value (read from the files and by
  a consumer from the beginning): nothing lost, nothing twice.
"""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Iterator

import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.broker.cleaner.cleaner import STEPS
from minibroker.broker.cleaner.manager import CRASH_AT_STEP_ENV
from minibroker.client import Admin, Consumer, Producer, TopicPartition
from minibroker.client.admin import AlterConfigOp, ConfigResource
from minibroker.client.records.decode import iter_records
from minibroker.deploy import cluster as launcher

pytestmark = pytest.mark.integration

TOPIC = "crash-changelog"
TP = TopicPartition(TOPIC, 0)
KEYS = 12
RECORDS_PER_STEP = 240
WAIT_S = 60
SETTINGS = {"log.cleaner.backoff.ms": "100", "broker.session.timeout.ms": "2500"}


@pytest.fixture
def cluster(tmp_path: pathlib.Path) -> Iterator[LocalCluster]:
    with local_cluster(str(tmp_path / "cluster"), brokers=2, settings=SETTINGS) as c:
        yield c


def set_ratio(admin: Admin, ratio: str) -> None:
    resource = ConfigResource("topic", TOPIC)
    admin.incremental_alter_configs(
        {resource: [AlterConfigOp("min.cleanable.dirty.ratio", "set", ratio)]}
    )


def files_of(cluster: LocalCluster, broker: int) -> tuple[dict[bytes, bytes], list[str]]:
    """(key -> latest value from the segment files, names of leftover .cleaned/.swap files);
    AssertionError when offsets overlap or go back, within or across segments."""
    directory = pathlib.Path(cluster.spec(broker).data_dir) / f"{TOPIC}-0"
    leftovers = sorted(n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap")))
    latest: dict[bytes, bytes] = {}
    last = -1
    for path in sorted(directory.glob("*.log"), key=lambda p: int(p.stem)):
        assert int(path.stem) > last, f"segment {path.name} overlaps offsets up to {last}"
        for record in iter_records(path.read_bytes(), allow_partial_tail=True):
            assert record.offset > last, f"offset {record.offset} after {last} ({path.name})"
            last = record.offset
            assert record.key is not None
            if record.value is None:
                latest.pop(record.key, None)
            else:
                latest[record.key] = record.value
    return latest, leftovers


def consumed(cluster: LocalCluster, end: int) -> dict[bytes, bytes]:
    folded: dict[bytes, bytes | None] = {}
    last = -1
    with Consumer(cluster.bootstrap) as consumer:
        consumer.assign([TP])
        consumer.seek_to_beginning(TP)
        deadline = time.monotonic() + WAIT_S
        while consumer.position(TP) < end and time.monotonic() < deadline:
            for record in consumer.poll(timeout_ms=500):
                assert record.offset > last
                last = record.offset
                assert record.key is not None
                folded[record.key] = record.value
        assert consumer.position(TP) == end
    return {k: v for k, v in folded.items() if v is not None}


def test_a_broker_killed_at_each_cleaner_step_restarts_with_a_whole_log(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected: dict[bytes, bytes | None] = {}
    written = 0
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(
            TOPIC,
            1,
            1,
            {
                "cleanup.policy": "compact",
                "segment.bytes": "4096",
                "min.cleanable.dirty.ratio": "1",
            },
        )
        (topic,) = admin.describe_topics([TOPIC])
        broker = topic.partitions[0].leader
        for step in STEPS:
            with Producer(cluster.bootstrap, acks="all", batch_size=1024) as producer:
                sent = []
                for i in range(written, written + RECORDS_PER_STEP):
                    key = b"key-%02d" % (i % KEYS)
                    value = None if i % 9 == 4 else b"%s=%d" % (key, i)
                    sent.append((key, value, producer.send(TOPIC, value, key=key, partition=0)))
                for key, value, future in sent:
                    future.result(WAIT_S)
                    expected[key] = value
            written += RECORDS_PER_STEP

            cluster.stop(broker)
            monkeypatch.setenv(CRASH_AT_STEP_ENV, step)
            cluster.start(broker)
            monkeypatch.delenv(CRASH_AT_STEP_ENV)
            set_ratio(admin, "0.01")
            spec = cluster.spec(broker)
            wait_until(
                lambda s=spec: launcher.process_state(s) == "stopped",
                WAIT_S,
                f"broker {broker} killing itself at cleaner step {step}",
            )
            assert "cleaner_crash_at_step" in cluster.log_tail(broker, 50)

            set_ratio(admin, "1")
            cluster.start(broker)
            want = {k: v for k, v in expected.items() if v is not None}
            latest, leftovers = files_of(cluster, broker)
            assert leftovers == [], f"after a crash at {step}"
            assert latest == want, f"after a crash at {step}"
            assert consumed(cluster, written) == want, f"after a crash at {step}"
