"""The broker's controller link and the admin client follow a controller quorum's leader.

In-process fake controllers (grpc.aio servers on port 0) share one metadata log; one is active,
the others answer NOT_CONTROLLER the way the spec says (FAILED_PRECONDITION, trailing metadata
naming the leader and epoch) and end their streams the same way when the leadership moves. No
fixed sleeps: every wait is for a condition, with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from minibroker.broker.controller_link import ControllerLink, FatalRegistrationError
from minibroker.client.admin import AsyncAdmin
from minibroker.client.errors import ErrorCode
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc


class Quorum:
    """The shared state of the fake controllers: who leads, at which epoch, and the log."""

    def __init__(self) -> None:
        self.controllers: list[FakeController] = []
        self.leader: FakeController | None = None
        self.epoch = 1
        self.log: list[pb.MetadataRecord] = []
        self.changed = asyncio.Condition()

    def append(self, count: int) -> None:
        for _ in range(count):
            self.log.append(pb.MetadataRecord(offset=len(self.log), no_op=pb.NoOpRecord()))

    async def elect(self, leader: FakeController | None) -> None:
        async with self.changed:
            self.epoch += 1
            self.leader = leader
            self.changed.notify_all()

    def trailing(self) -> tuple[tuple[str, str], ...]:
        leader = f"{self.leader.node_id}@{self.leader.address}" if self.leader else ""
        return (
            ("minibroker-error", "NOT_CONTROLLER"),
            ("minibroker-controller-leader", leader),
            ("minibroker-controller-epoch", str(self.epoch)),
        )


class FakeController(pb_grpc.ControllerServiceServicer, pb_grpc.QuorumServiceServicer):
    def __init__(self, quorum: Quorum, node_id: int) -> None:
        self.quorum = quorum
        self.node_id = node_id
        self.address = ""
        self.heartbeats = 0
        self.calls: list[str] = []
        self.forgot = False  # serve an empty snapshot at offset 0: a quorum that lost its log
        self.snapshots_served = 0
        self.server: grpc.aio.Server | None = None

    async def start(self) -> None:
        self.server = grpc.aio.server()
        pb_grpc.add_ControllerServiceServicer_to_server(self, self.server)
        pb_grpc.add_QuorumServiceServicer_to_server(self, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{port}"
        await self.server.start()

    @property
    def active(self) -> bool:
        return self.quorum.leader is self

    async def _refuse(self, context: grpc.aio.ServicerContext) -> None:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            "NOT_CONTROLLER: not the active controller",
            trailing_metadata=self.quorum.trailing(),
        )

    async def DescribeQuorum(self, request: Any, context: Any) -> pb.DescribeQuorumResponse:
        leader = self.quorum.leader
        return pb.DescribeQuorumResponse(
            node_id=self.node_id,
            role="leader" if self.active else "follower",
            leader_id=leader.node_id if leader else -1,
            leader_epoch=self.quorum.epoch,
            leader_address=leader.address if leader else "",
        )

    async def RegisterBroker(self, request: Any, context: Any) -> pb.BrokerRegistrationResponse:
        self.calls.append("RegisterBroker")
        if not self.active:
            await self._refuse(context)
        return pb.BrokerRegistrationResponse(broker_epoch=7, cluster_id="c1")

    async def AlterPartition(self, request: Any, context: Any) -> pb.AlterPartitionResponse:
        self.calls.append("AlterPartition")
        if not self.active:
            await self._refuse(context)
        return pb.AlterPartitionResponse()

    async def DescribeCluster(self, request: Any, context: Any) -> pb.DescribeClusterResponse:
        self.calls.append("DescribeCluster")
        if not self.active:
            await self._refuse(context)
        return pb.DescribeClusterResponse(cluster_id="c1", controller_id=self.node_id)

    async def _until_deposed(self) -> None:
        async with self.quorum.changed:
            await self.quorum.changed.wait_for(lambda: not self.active)

    async def Heartbeat(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        if not self.active:
            await self._refuse(context)
        deposed = asyncio.ensure_future(self._until_deposed())
        try:
            while True:
                nxt = asyncio.ensure_future(request_iterator.__anext__())
                await asyncio.wait({nxt, deposed}, return_when=asyncio.FIRST_COMPLETED)
                if deposed.done():
                    nxt.cancel()
                    await self._refuse(context)
                try:
                    nxt.result()
                except StopAsyncIteration:
                    return
                self.heartbeats += 1
                yield pb.BrokerHeartbeatResponse(is_caught_up=True, is_fenced=False)
        finally:
            deposed.cancel()

    async def WatchMetadata(self, request: Any, context: Any) -> AsyncIterator[Any]:
        if not self.active:
            await self._refuse(context)
        position = request.from_offset
        if self.forgot:
            self.snapshots_served += 1
            yield pb.MetadataBatch(is_snapshot=True, snapshot_offset=0, high_offset=0)
            position = 0

        def ready() -> bool:
            return not self.active or len(self.quorum.log) > position

        while True:
            async with self.quorum.changed:
                await self.quorum.changed.wait_for(ready)
            if not self.active:
                await self._refuse(context)
            records = self.quorum.log[position:]
            position += len(records)
            yield pb.MetadataBatch(records=records, high_offset=position)


async def _wait_for(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _quorum(n: int) -> tuple[Quorum, list[FakeController]]:
    quorum = Quorum()
    controllers = [FakeController(quorum, 1000 + i) for i in range(n)]
    for c in controllers:
        await c.start()
    quorum.controllers = controllers
    return quorum, controllers


async def _stop(controllers: list[FakeController]) -> None:
    for c in controllers:
        assert c.server is not None
        await c.server.stop(grace=None)


def _run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def test_the_link_moves_heartbeats_watch_and_requests_to_the_new_leader() -> None:
    async def scenario() -> None:
        quorum, (a, b, c) = await _quorum(3)
        await quorum.elect(a)
        quorum.append(3)
        applied: list[int] = []

        async def on_metadata(batch: pb.MetadataBatch) -> None:
            applied.extend(r.offset for r in batch.records)

        link = ControllerLink(
            controllers=[c.address, b.address, a.address],
            broker_id=1,
            host="127.0.0.1",
            port=1,
            rack="",
            metrics_port=-1,
            cluster_id="",
            previous_broker_epoch=-1,
            heartbeat_interval_ms=50,
            on_metadata=on_metadata,
            metadata_offset=lambda: len(applied),
        )
        stop = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []
        try:
            registration = await asyncio.wait_for(link.register(stop), 10)
            assert registration.broker_epoch == 7
            assert a.calls == ["RegisterBroker"]  # found by DescribeQuorum, not by trying
            assert link.controller_address() == ("127.0.0.1", int(a.address.rsplit(":", 1)[1]))
            tasks = [
                asyncio.create_task(link.watch_loop()),
                asyncio.create_task(link.heartbeat_loop()),
            ]
            await _wait_for(lambda: a.heartbeats > 0 and len(applied) == 3, "a's stream")

            # The leadership moves to b: a ends its streams naming b.
            quorum.append(2)  # committed under a's leadership, applied through b's watch
            await quorum.elect(b)
            await _wait_for(lambda: b.heartbeats > 0, "heartbeats on b")
            await _wait_for(lambda: len(applied) == 5, "the watch on b")
            quorum.append(1)
            async with quorum.changed:
                quorum.changed.notify_all()
            await _wait_for(lambda: len(applied) == 6, "a new record through b")
            assert applied == list(range(6)), "a record applied twice or skipped"

            # A request sent to a deposed leader goes to the new one.
            link._finder.leader_address = a.address  # as if the move were not known yet
            await link.alter_partition(pb.AlterPartitionRequest())
            assert a.calls[-1] == "AlterPartition" and b.calls[-1] == "AlterPartition"

            # An election without a leader for a while: the link finds the winner itself.
            await quorum.elect(None)
            await asyncio.sleep(0)  # let the streams see it
            heard = c.heartbeats
            await quorum.elect(c)
            await _wait_for(lambda: c.heartbeats > heard, "heartbeats on c")
            assert link.controller_address()[1] == int(c.address.rsplit(":", 1)[1])
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await link.close()
            await _stop([a, b, c])

    _run(scenario)


class FakeBroker(pb_grpc.BrokerServiceServicer):
    def __init__(self, controller: FakeController) -> None:
        self.controller = controller

    async def Metadata(self, request: Any, context: Any) -> pb.MetadataResponse:
        host, _, port = self.controller.address.rpartition(":")
        return pb.MetadataResponse(
            cluster_id="c1", controller_id=1000, controller_host=host, controller_port=int(port)
        )


def test_admin_follows_not_controller_to_the_leader() -> None:
    async def scenario() -> None:
        quorum, (a, b) = await _quorum(2)
        await quorum.elect(b)
        server = grpc.aio.server()
        pb_grpc.add_BrokerServiceServicer_to_server(FakeBroker(a), server)  # names a stale one
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with AsyncAdmin(f"127.0.0.1:{port}", default_api_timeout_ms=5_000) as admin:
                cluster = await admin.describe_cluster()
                assert cluster.controller_id == b.node_id
                assert a.calls == ["DescribeCluster"] and b.calls == ["DescribeCluster"]
                # The hint is kept: the next call goes to b straight away.
                await admin.describe_cluster()
                assert a.calls == ["DescribeCluster"]
                # b is deposed in favour of a, at a newer epoch: followed again.
                await quorum.elect(a)
                cluster = await admin.describe_cluster()
                assert cluster.controller_id == a.node_id
        finally:
            await server.stop(grace=None)
            await _stop([a, b])

    _run(scenario)


@pytest.mark.parametrize("resent", [False, True])
def test_create_topics_reports_topic_already_exists(resent: bool) -> None:
    """Kafka's admin client reports TopicExistsException even when its own earlier attempt
    (lost in a failover) created the topic; ours too, saying the request was re-sent."""
    from minibroker.client.errors import TopicAlreadyExistsError

    async def scenario() -> None:
        admin = AsyncAdmin("127.0.0.1:1")
        answer = pb.CreateTopicsResponse()
        answer.topics.add(name="t", error_code=ErrorCode.TOPIC_ALREADY_EXISTS, error_message="t")

        async def sent(method: str, request: Any) -> tuple[Any, bool]:
            return answer, resent

        admin._controller_call_sent = sent  # type: ignore[method-assign]
        try:
            with pytest.raises(TopicAlreadyExistsError) as raised:
                await admin.create_topic("t")
            assert ("re-sent" in str(raised.value)) == resent
        finally:
            await admin.close()

    _run(scenario)


def test_a_controller_whose_log_went_back_is_never_applied() -> None:
    """A quorum that lost committed metadata (more voters' disks lost than it can bear) offers
    a snapshot older than what the broker applied: applying it would delete every partition
    the broker hosts. The link refuses it and keeps asking."""

    async def scenario() -> None:
        quorum, (a, b) = await _quorum(2)
        await quorum.elect(a)
        quorum.append(3)
        batches: list[pb.MetadataBatch] = []

        async def on_metadata(batch: pb.MetadataBatch) -> None:
            batches.append(batch)

        def applied() -> int:
            return sum(len(x.records) for x in batches)

        link = ControllerLink(
            controllers=[a.address, b.address],
            broker_id=1,
            host="127.0.0.1",
            port=1,
            rack="",
            metrics_port=-1,
            cluster_id="",
            previous_broker_epoch=-1,
            heartbeat_interval_ms=50,
            on_metadata=on_metadata,
            metadata_offset=applied,
        )
        stop = asyncio.Event()
        task: asyncio.Task[None] | None = None
        try:
            await asyncio.wait_for(link.register(stop), 10)
            task = asyncio.create_task(link.watch_loop())
            await _wait_for(lambda: applied() == 3, "three records from a")
            b.forgot = True
            await quorum.elect(b)
            await _wait_for(lambda: b.snapshots_served >= 2, "b offering its snapshot again")
            assert not any(x.is_snapshot for x in batches), "a snapshot from the past applied"
            assert applied() == 3
        finally:
            stop.set()
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await link.close()
            await _stop([a, b])

    _run(scenario)


def test_a_registration_refused_by_the_authorizer_is_fatal() -> None:
    """A broker whose certificate is another node's (or not allowed CLUSTER_ACTION) would be
    refused forever: it stops with the controller's reason instead of retrying."""

    class Refusing(FakeController):
        async def RegisterBroker(self, request: Any, context: Any) -> pb.BrokerRegistrationResponse:
            self.calls.append("RegisterBroker")
            return pb.BrokerRegistrationResponse(
                error_code=pb.CLUSTER_AUTHORIZATION_FAILED,
                error_message="User:broker-2 (the certificate of broker 2) cannot act for broker 1",
                broker_epoch=-1,
            )

    async def scenario() -> None:
        quorum = Quorum()
        controller = Refusing(quorum, 1000)
        await controller.start()
        quorum.controllers = [controller]
        await quorum.elect(controller)
        link = ControllerLink(
            controllers=[controller.address],
            broker_id=1,
            host="127.0.0.1",
            port=1,
            rack="",
            metrics_port=-1,
            cluster_id="",
            previous_broker_epoch=-1,
            heartbeat_interval_ms=50,
            on_metadata=lambda batch: asyncio.sleep(0),
            metadata_offset=lambda: 0,
        )
        try:
            with pytest.raises(FatalRegistrationError, match="cannot act for broker 1"):
                await asyncio.wait_for(link.register(asyncio.Event()), 10)
            assert controller.calls == ["RegisterBroker"]
        finally:
            await link.close()
            await _stop([controller])

    _run(scenario)
