"""Controller-core bugs found by the seeded simulation (tests/sim), each pinned as a unit test.

Pure: the real ControllerCore driven command by command, no I/O. Every test names the seed and
the simulation check that found the bug, states the rule it broke and where the rule comes from.
"""

from __future__ import annotations

import random

from minibroker.controller.core.controller import ControllerCore, ControllerSettings
from minibroker.controller.core.messages import (
    CreatableTopic,
    HeartbeatReply,
    HeartbeatRequest,
    Outcome,
    RegisterRequest,
)
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import LogEntry

CLUSTER = "cluster-sim"
SETTINGS = ControllerSettings(auto_leader_rebalance_enable=False, session_timeout_ms=3_000)


class Journal:
    """The core plus the entries it made durable, so a restart can replay them."""

    def __init__(self, now_ms: int) -> None:
        self.core = ControllerCore(SETTINGS, CLUSTER, random.Random(1), now_ms)
        self.entries: list[LogEntry] = []
        self.epochs: dict[int, int] = {}

    def take(self, outcome: Outcome):  # type: ignore[no-untyped-def]
        self.entries.extend(outcome.entries)
        return outcome.reply

    def restart(self, now_ms: int) -> None:
        """What ControllerApp.start does: replay the journal into a fresh image and core."""
        image = MetadataImage()
        for entry in self.entries:
            image.apply(entry)
        self.core = ControllerCore(SETTINGS, CLUSTER, random.Random(2), now_ms, image)

    def heartbeat(
        self, broker_id: int, stream_id: int, now_ms: int, *, shut: bool = False
    ) -> HeartbeatReply:
        request = HeartbeatRequest(
            broker_id,
            self.epochs[broker_id],
            self.core.image.next_offset,  # caught up with everything written so far
            want_shut_down=shut,
        )
        reply: HeartbeatReply = self.take(self.core.heartbeat(request, stream_id, now_ms))
        return reply


def three_brokers_one_topic(now_ms: int) -> Journal:
    j = Journal(now_ms)
    for b in (1, 2, 3):
        reply = j.take(
            j.core.register_broker(
                RegisterRequest(b, CLUSTER, f"inc-{b}", "127.0.0.1", 9_000 + b), now_ms
            )
        )
        j.epochs[b] = reply.broker_epoch
    for b in (1, 2, 3):
        j.heartbeat(b, stream_id=b, now_ms=now_ms)
    j.take(j.core.create_topics([CreatableTopic("t", 3, 3)], False, now_ms))
    return j


def test_controlled_shutdown_is_granted_by_a_controller_restarted_midway() -> None:
    """Found by tests/sim (seeds 22, 36, 58, 77 before the fix): "controlled shutdown not
    granted in 2000 ms by a controller up since ...". Broker 3 started a controlled shutdown,
    the controller crashed and restarted from its journal before granting it, and the new
    controller never granted it: the shutdown offset lives only in the session, which a
    restart rebuilds empty, and the registration already says in_controlled_shutdown, so the
    branch that sets the offset never ran again. Kafka sets it on the first heartbeat of a
    broker in controlled shutdown after a failover (BrokerHeartbeatManager
    .maybeUpdateControlledShutdownOffset keeps the first offset); docs/protocol.md §16."""
    now = 1_000
    j = three_brokers_one_topic(now)
    first = j.heartbeat(2, stream_id=2, now_ms=now, shut=True)
    assert not first.should_shut_down  # its peers have not seen the leader moves yet
    assert j.core.image.brokers[2].in_controlled_shutdown
    assert all(p.leader != 2 for _, p in j.core.image.partitions())

    j.restart(now + 100)
    granted = False
    for round_ms in range(200, 800, 100):  # a few heartbeat rounds, everyone caught up
        j.heartbeat(1, stream_id=11, now_ms=now + round_ms)
        j.heartbeat(3, stream_id=13, now_ms=now + round_ms)
        granted = j.heartbeat(2, stream_id=12, now_ms=now + round_ms, shut=True).should_shut_down
        if granted:
            break
    assert granted, "the restarted controller never granted the controlled shutdown"
