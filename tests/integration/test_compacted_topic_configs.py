"""A `cleanup.policy=compact` topic on real processes (issue 21, part 1: configs and the key rule).

One controller and one broker on 127.0.0.1, driven as a user would, through the CLI:
- `topics create --config cleanup.policy=compact --config min.cleanable.dirty.ratio=0.2` creates
  the topic; `topics describe` and `configs --describe` show the configs; a bad value
  (`cleanup.policy=compactt`, a ratio of 1.5) is refused with INVALID_CONFIG and creates nothing;
- the broker's log cleaner runs, and `topics describe` shows the partition's cleaner point and
  dirty ratio (`CleanerPoints: 1=0`, nothing cleaned yet);
- keyed records from the Producer are acknowledged and read back by a Consumer;
- a keyless record fails its future with InvalidRecordError (not retried) naming the partition,
  and the log is unchanged: the next keyed record takes the next offset, the HW and LEO did not
  move in between, and a consumer from the beginning gets exactly the keyed records;
- `configs --alter` to `cleanup.policy=[compact,delete]` is accepted, a bad alter changes nothing,
  and back to delete the keyless record is accepted.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from cluster_harness import LocalCluster, local_cluster, wait_until

from minibroker.client import Admin, Consumer, Producer, TopicPartition
from minibroker.client.errors import InvalidRecordError

pytestmark = pytest.mark.integration

TOPIC = "changelog"
TP = TopicPartition(TOPIC, 0)
# INVALID_RECORD is final: a wait much shorter than the delivery timeout ends only if it is.
DELIVERY_TIMEOUT_MS = 600_000
WAIT_S = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = pathlib.Path(tmp_path_factory.mktemp("compacted")) / "cluster"
    with local_cluster(str(directory), brokers=1) as c:
        yield c


def cli(cluster: LocalCluster, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "minibroker.deploy", *args, "--bootstrap-server", cluster.bootstrap],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if ok:
        assert done.returncode == 0, done.stderr
    return done


def offsets(admin: Admin) -> tuple[int, int]:
    (topic,) = admin.describe_topics([TOPIC])
    (part,) = topic.partitions
    return part.high_watermark, dict(part.log_end_offsets)[1]  # type: ignore[return-value]


def read_all(cluster: LocalCluster, count: int) -> list[tuple[int, bytes | None, bytes | None]]:
    with Consumer(cluster.bootstrap) as consumer:
        consumer.assign([TP])
        consumer.seek_to_beginning(TP)
        records = []
        deadline = time.monotonic() + WAIT_S
        while len(records) < count and time.monotonic() < deadline:
            records.extend(consumer.poll(timeout_ms=500))
        # Anything past `count` would be a record that should not be there: look a little more.
        records.extend(consumer.poll(timeout_ms=1000))
    return [(r.offset, r.key, r.value) for r in records]


def test_a_compacted_topic_takes_keyed_records_and_refuses_keyless_ones(
    cluster: LocalCluster,
) -> None:
    # Bad values: INVALID_CONFIG, nothing created.
    for bad, needle in [
        ("cleanup.policy=compactt", "'compactt' is not a cleanup policy"),
        ("min.cleanable.dirty.ratio=1.5", "must be in [0, 1]"),
    ]:
        refused = cli(cluster, "topics", "create", TOPIC, "--config", bad, ok=False)
        assert refused.returncode != 0
        assert "INVALID_CONFIG" in refused.stderr or "InvalidConfig" in refused.stderr, (
            refused.stderr
        )
        assert needle in refused.stderr, refused.stderr
    assert TOPIC not in cli(cluster, "topics", "list").stdout.split()

    cli(
        cluster,
        "topics",
        "create",
        TOPIC,
        "--config",
        "cleanup.policy=compact",
        "--config",
        "min.cleanable.dirty.ratio=0.2",
    )
    described = cli(cluster, "topics", "describe", TOPIC).stdout
    assert "cleanup.policy=compact" in described and "min.cleanable.dirty.ratio=0.2" in described
    configs = cli(
        cluster, "configs", "--describe", "--entity-type", "topics", "--entity-name", TOPIC, "--all"
    ).stdout
    for line in (
        "cleanup.policy=compact",
        "min.cleanable.dirty.ratio=0.2",
        "min.compaction.lag.ms=0",
        "max.compaction.lag.ms=9223372036854775807",
        "delete.retention.ms=86400000",
    ):
        assert line in configs, configs
    wait_until(
        lambda: (
            "CleanerPoints: 1=0\tDirtyRatios: 1=0.00"
            in cli(cluster, "topics", "describe", TOPIC).stdout
            or None
        ),
        WAIT_S,
        "describe to show the partition's cleaner point",
    )
    broker_log = pathlib.Path(cluster.spec(1).log_file).read_text(errors="replace")
    assert "log_cleaner_started" in broker_log

    with (
        Admin(cluster.bootstrap) as admin,
        Producer(cluster.bootstrap, delivery_timeout_ms=DELIVERY_TIMEOUT_MS) as producer,
    ):
        first = [producer.send(TOPIC, b"v%d" % i, key=b"k%d" % (i % 2)) for i in range(3)]
        assert [f.result(WAIT_S).offset for f in first] == [0, 1, 2]
        assert offsets(admin) == (3, 3)

        err = producer.send(TOPIC, b"no key", partition=0).exception(WAIT_S)
        assert isinstance(err, InvalidRecordError), repr(err)
        assert "has no key" in str(err) and "compacted topic" in str(err), err
        assert f"{TOPIC}-0" in str(err)
        assert offsets(admin) == (3, 3)

        after = producer.send(TOPIC, b"v3", key=b"k1").result(WAIT_S)
        assert after.offset == 3, "the refused batch took no offset"

    assert read_all(cluster, 4) == [
        (0, b"k0", b"v0"),
        (1, b"k1", b"v1"),
        (2, b"k0", b"v2"),
        (3, b"k1", b"v3"),
    ]

    # Dynamic change: a bad alter changes nothing; compact,delete is taken; delete takes keyless.
    alter = ("configs", "--alter", "--entity-type", "topics", "--entity-name", TOPIC)
    bad = cli(cluster, *alter, "--add-config", "max.compaction.lag.ms=0", ok=False)
    assert bad.returncode != 0 and "max.compaction.lag.ms" in bad.stderr, bad.stderr
    cli(cluster, *alter, "--add-config", "cleanup.policy=[compact,delete]")
    assert "cleanup.policy=compact,delete" in cli(cluster, "topics", "describe", TOPIC).stdout
    cli(cluster, *alter, "--delete-config", "cleanup.policy")

    with Producer(cluster.bootstrap, delivery_timeout_ms=DELIVERY_TIMEOUT_MS) as producer:
        # The broker learns the change from the metadata log: wait until it applies it.
        def keyless_taken() -> int | None:
            future = producer.send(TOPIC, b"keyless", partition=0)
            err = future.exception(WAIT_S)
            return None if err is not None else future.result().offset

        assert wait_until(keyless_taken, WAIT_S, "a keyless record taken under delete") >= 4
