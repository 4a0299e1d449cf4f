"""One consumer group member in its own process, for tests/integration/test_group_membership.py
(so that a test can SIGKILL it): `python group_member.py KIND BOOTSTRAP GROUP TOPIC [INSTANCE]`,
KIND one of confluent, kafka-python, aiokafka, INSTANCE a group.instance.id (confluent only).
All use the 'range' assignor, a 6 s session and 500 ms heartbeats, start from the earliest
offset and commit nothing; on SIGTERM a member closes its consumer (which leaves the group) and
exits. It prints JSON lines on stdout: {"assigned": [partitions]} whenever its assignment
changes, {"rec": [partition, offset, value]} for each record, and (kafka-python only, from its
coordinator's private state) {"generation": n} whenever its group generation changes."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
from typing import Any

SESSION_MS = 6000
HEARTBEAT_MS = 500
STOP = threading.Event()


def emit(**what: Any) -> None:
    sys.stdout.write(json.dumps(what) + "\n")
    sys.stdout.flush()


def run_confluent(bootstrap: str, group: str, topic: str, instance: str | None) -> None:
    import confluent_kafka

    static = {"group.instance.id": instance} if instance else {}
    consumer = confluent_kafka.Consumer(
        {
            **static,
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": "confluent-member",
            "partition.assignment.strategy": "range",
            "session.timeout.ms": SESSION_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 2000,
        }
    )
    consumer.subscribe([topic])
    last: list[int] | None = None
    while not STOP.is_set():
        message = consumer.poll(0.1)
        assigned = sorted(tp.partition for tp in consumer.assignment())
        if assigned != last:
            last = assigned
            emit(assigned=assigned)
        if message is None or message.error() is not None:
            continue
        emit(rec=[message.partition(), message.offset(), message.value().decode()])
    consumer.close()
    emit(closed=True)


def run_kafka_python(bootstrap: str, group: str, topic: str) -> None:
    import kafka
    from kafka.coordinator.assignors.range import RangePartitionAssignor

    consumer = kafka.KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        client_id="kafka-python-member",
        partition_assignment_strategy=[RangePartitionAssignor],
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        metadata_max_age_ms=2000,
    )
    last: list[int] | None = None
    generation = None
    while not STOP.is_set():
        batches = consumer.poll(timeout_ms=100)
        current = consumer._coordinator._generation.generation_id  # no public accessor
        if current != generation:
            generation = current
            emit(generation=current)
        assigned = sorted(tp.partition for tp in consumer.assignment())
        if assigned != last:
            last = assigned
            emit(assigned=assigned)
        for tp, records in batches.items():
            for r in records:
                emit(rec=[tp.partition, r.offset, r.value.decode()])
    consumer.close()
    emit(closed=True)


async def run_aiokafka(bootstrap: str, group: str, topic: str) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        client_id="aiokafka-member",
        partition_assignment_strategy=(RangePartitionAssignor,),
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        metadata_max_age_ms=2000,
    )
    await consumer.start()
    last: list[int] | None = None
    while not STOP.is_set():
        batches = await consumer.getmany(timeout_ms=100)
        assigned = sorted(tp.partition for tp in consumer.assignment())
        if assigned != last:
            last = assigned
            emit(assigned=assigned)
        for tp, records in batches.items():
            for r in records:
                assert r.value is not None
                emit(rec=[tp.partition, r.offset, r.value.decode()])
    await consumer.stop()
    emit(closed=True)


def main() -> None:
    kind, bootstrap, group, topic = sys.argv[1:5]
    instance = sys.argv[5] if len(sys.argv) > 5 else None
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    if kind == "confluent":
        run_confluent(bootstrap, group, topic, instance)
    elif kind == "kafka-python":
        run_kafka_python(bootstrap, group, topic)
    elif kind == "aiokafka":
        asyncio.run(run_aiokafka(bootstrap, group, topic))
    else:
        raise SystemExit(f"unknown member kind {kind}")


if __name__ == "__main__":
    main()
