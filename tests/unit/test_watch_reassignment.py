"""`minibroker watch` during issue 14's moves: a reassignment's start, each new replica catching
up, the leader moving, completion and cancellation on the timeline; adding/removing replicas in
the partition view; decommissioning brokers; config changes as events."""

from __future__ import annotations

from dataclasses import replace

from minibroker.client.watch.events import EventKind
from minibroker.metadata.records import (
    CONFIG_RESOURCE_BROKER,
    CONFIG_RESOURCE_TOPIC,
    BrokerDecommissionRecord,
    BrokerRegistrationChangeRecord,
    ConfigRecord,
    PartitionRecord,
    RegisterBrokerRecord,
)
from tests.unit.test_watch_model import (
    T0,
    TOPIC_ID,
    frame_text,
    kinds,
    last_of,
    line_with,
    three_brokers_one_topic,
)


def moving(
    replicas: tuple[int, ...],
    isr: tuple[int, ...],
    leader: int,
    leader_epoch: int,
    partition_epoch: int,
    adding: tuple[int, ...] = (),
    removing: tuple[int, ...] = (),
    reason: str = "",
) -> PartitionRecord:
    return PartitionRecord(
        TOPIC_ID,
        0,
        replicas,
        isr,
        leader,
        leader_epoch,
        partition_epoch,
        reason=reason,
        adding_replicas=adding,
        removing_replicas=removing,
    )


def with_brokers_4_to_6():  # type: ignore[no-untyped-def]
    model, log = three_brokers_one_topic()
    for b in (4, 5, 6):
        log.add(RegisterBrokerRecord(b, f"inc-{b}", 10 + b, "127.0.0.1", 9091 + b, "rack-x"))
        log.add(BrokerRegistrationChangeRecord(b, 10 + b, fenced=False))
    model.apply_entries(log.entries)
    return model, log


def test_a_full_move_reads_as_a_story_on_the_timeline() -> None:
    model, log = with_brokers_4_to_6()
    started = moving((4, 5, 6, 1, 2, 3), (1, 2, 3), 1, 0, 1, (4, 5, 6), (1, 2, 3), "reassignment")
    model.apply_entries([log.add(started)])
    event = last_of(model, EventKind.REASSIGNMENT_STARTED)
    assert event.text == (
        "orders-0 reassignment started: [1,2,3] -> [4,5,6], adding [4,5,6], removing [1,2,3]"
        " (reassignment)"
    )
    assert (event.topic, event.partition) == ("orders", 0)
    assert EventKind.REASSIGNMENT not in kinds(model), "no second 'replicas changed' line"

    model.apply_entries([log.add(replace(started, isr=(1, 2, 3, 4), partition_epoch=2))])
    assert last_of(model, EventKind.REPLICA_CAUGHT_UP).text == (
        "orders-0 new replica 4 caught up, joined the ISR [1,2,3,4] (1 of 3 new replicas in sync)"
    )
    assert EventKind.ISR_EXPAND not in kinds(model), "a new replica's catch-up is its own event"
    model.apply_entries([log.add(replace(started, isr=(1, 2, 3, 4, 5, 6), partition_epoch=3))])
    assert last_of(model, EventKind.REPLICA_CAUGHT_UP).text.endswith(
        "(3 of 3 new replicas in sync)"
    )

    done = moving((4, 5, 6), (4, 5, 6), 4, 1, 4, reason="reassignment completed")
    model.apply_entries([log.add(done)])
    tail = kinds(model)[-3:]
    assert EventKind.ELECTION in tail and EventKind.ISR_SHRINK in tail
    assert tail[-1] is EventKind.REASSIGNMENT_COMPLETED
    assert last_of(model, EventKind.ELECTION).text.startswith(
        "orders-0 leader 1 -> 4, epoch 0 -> 1"
    )
    assert last_of(model, EventKind.REASSIGNMENT_COMPLETED).text == (
        "orders-0 reassignment completed: [1,2,3] -> [4,5,6] (reassignment completed)"
    )


def test_cancel_goes_back_to_the_original_replicas() -> None:
    model, log = with_brokers_4_to_6()
    model.apply_entries([log.add(moving((4, 2, 3, 1), (1, 2, 3), 1, 0, 1, (4,), (1,)))])
    model.apply_entries([log.add(moving((1, 2, 3), (1, 2, 3), 1, 0, 2, reason="cancelled"))])
    assert model.events[-1].kind is EventKind.REASSIGNMENT_CANCELLED
    assert model.events[-1].text == "orders-0 reassignment cancelled: back to [1,2,3] (cancelled)"


def test_a_plain_replica_change_is_still_a_reassignment_line() -> None:
    model, log = three_brokers_one_topic()
    model.apply_entries([log.add(moving((3, 2, 1), (1, 2, 3), 1, 0, 1))])
    assert model.events[-1].kind is EventKind.REASSIGNMENT
    assert model.events[-1].text == "orders-0 replicas [1,2,3] -> [3,2,1]"


def test_partition_view_marks_adding_and_removing_replicas() -> None:
    model, log = with_brokers_4_to_6()
    model.apply_entries([log.add(moving((4, 2, 3, 1), (1, 2, 3), 1, 0, 1, (4,), (1,)))])
    (row, _) = model.partition_rows()
    assert row.reassigning and row.adding_replicas == (4,) and row.removing_replicas == (1,)
    cells = {c.broker_id: c for c in row.cells}
    assert cells[4].adding and not cells[4].removing
    assert cells[1].removing and not cells[1].adding
    # Kafka: while moving, the replication factor is the target's (3), and the ISR has 3.
    assert not row.under_replicated
    text = frame_text(model, T0)
    line = line_with(text, "+new")
    assert "4:? +new !isr" in line and "-old" in line and "(moving)" in line


def test_decommissioning_brokers_and_the_moment_one_holds_nothing() -> None:
    model, log = with_brokers_4_to_6()
    model.apply_entries([log.add(BrokerDecommissionRecord(3, True))])
    assert model.events[-1].kind is EventKind.DECOMMISSIONING
    assert model.events[-1].text == "broker 3 decommissioning"
    # Marking again is no news.
    before = len(model.events)
    model.apply_entries([log.add(BrokerDecommissionRecord(3, True))])
    assert len(model.events) == before
    rows = {r.broker_id: r for r in model.broker_rows()}
    assert rows[3].status == "decommissioning" and rows[3].replica_count == 2
    assert rows[3].decommissioning and not rows[1].decommissioning

    # Partition 0 moves off 3 first: 3 still hosts partition 1, not decommissioned yet.
    model.apply_entries([log.add(moving((1, 2, 4), (1, 2, 4), 1, 0, 1))])
    assert EventKind.DECOMMISSIONED not in kinds(model)
    model.apply_entries([log.add(PartitionRecord(TOPIC_ID, 1, (2, 5, 1), (2, 5, 1), 2, 0, 1))])
    assert model.events[-1].kind is EventKind.DECOMMISSIONED
    assert model.events[-1].text == "broker 3 decommissioned: it hosts no replicas, safe to stop"
    rows = {r.broker_id: r for r in model.broker_rows()}
    assert rows[3].status == "decommissioned" and rows[3].replica_count == 0
    assert "decommissioned" in line_with(frame_text(model, T0), "127.0.0.1:9094")

    model.apply_entries([log.add(BrokerDecommissionRecord(3, False))])
    assert model.events[-1].text == "broker 3 decommission cancelled"
    assert {r.broker_id: r for r in model.broker_rows()}[3].status == "alive"


def test_config_changes_are_events() -> None:
    model, log = three_brokers_one_topic()
    model.apply_entries(
        [
            log.add(ConfigRecord(TOPIC_ID, "min.insync.replicas", "2", CONFIG_RESOURCE_TOPIC)),
            log.add(
                ConfigRecord(
                    "1", "leader.replication.throttled.rate", "1000", CONFIG_RESOURCE_BROKER
                )
            ),
            log.add(
                ConfigRecord(
                    "", "follower.replication.throttled.rate", None, CONFIG_RESOURCE_BROKER
                )
            ),
        ]
    )
    texts = [e.text for e in model.events if e.kind is EventKind.CONFIG]
    assert texts == [
        "config of topic orders: min.insync.replicas = 2",
        "config of broker 1: leader.replication.throttled.rate = 1000",
        "config of brokers (default): follower.replication.throttled.rate deleted",
    ]
    topic_event, broker_event, _ = [e for e in model.events if e.kind is EventKind.CONFIG]
    assert topic_event.topic == "orders" and broker_event.broker_id == 1
