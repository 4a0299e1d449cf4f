"""A broker whose event loop is busy keeps heartbeating (as Kafka's broker does: its heartbeats
run on their own thread, so a slow request handler does not get it fenced).

The broker's `ControllerLink` against a real controller process (`controller_harness.py`): once
registered and unfenced, its event loop is kept busy in a blocking call for twice
`broker.session.timeout.ms`, as creating a thousand partition logs once kept it; the controller
keeps hearing from it throughout and fences nothing. Before, the heartbeats were sent from that
same loop, and the controller fenced the broker after 3 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import time
from collections.abc import Iterator

import pytest
from controller_harness import ControllerProcess

from minibroker.broker.controller_link import ControllerLink
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.wire import apply_batch
from minibroker.proto import minibroker_pb2 as pb

pytestmark = pytest.mark.integration

SESSION_TIMEOUT_MS = 3000
BROKER_ID = 4


@pytest.fixture
def controller(tmp_path: pathlib.Path) -> Iterator[ControllerProcess]:
    proc = ControllerProcess(
        tmp_path / "controller-data",
        {
            "auto.leader.rebalance.enable": "false",
            "broker.session.timeout.ms": str(SESSION_TIMEOUT_MS),
        },
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


def busy_loop_watching(controller: ControllerProcess, seconds: float) -> list[int]:
    """Block the calling (event loop) thread for `seconds`, as a long synchronous task does;
    returns how long ago the controller last heard from the broker, sampled meanwhile."""
    heard_ms_ago = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        broker = controller.broker(BROKER_ID)
        assert broker is not None
        heard_ms_ago.append(-1 if broker.fenced else broker.last_heartbeat_ms_ago)
        time.sleep(0.1)  # the stall itself: the loop must not run
    return heard_ms_ago


async def test_a_busy_event_loop_does_not_stop_the_heartbeats(
    controller: ControllerProcess,
) -> None:
    image = MetadataImage()

    async def on_metadata(batch: pb.MetadataBatch) -> None:
        apply_batch(image, batch)

    link = ControllerLink(
        controller=("127.0.0.1", controller.port),
        broker_id=BROKER_ID,
        host="127.0.0.1",
        port=19004,
        rack="",
        metrics_port=-1,
        cluster_id="",
        previous_broker_epoch=-1,
        heartbeat_interval_ms=500,
        on_metadata=on_metadata,
        metadata_offset=lambda: image.next_offset,
    )
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        await asyncio.wait_for(link.register(stop), 20)
        tasks = [asyncio.create_task(link.watch_loop()), asyncio.create_task(link.heartbeat_loop())]
        deadline = time.monotonic() + 20
        while not controller.is_unfenced(BROKER_ID):
            assert time.monotonic() < deadline, "the broker was never unfenced"
            await asyncio.sleep(0.05)

        heard_ms_ago = busy_loop_watching(controller, 2 * SESSION_TIMEOUT_MS / 1000)

        # -1: fenced at that moment (the others: ms since the controller last heard from it).
        assert -1 not in heard_ms_ago, f"fenced while the loop was busy: {heard_ms_ago}"
        assert controller.events("broker_fenced") == []
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await link.close()


async def test_an_unexpected_error_on_the_heartbeat_thread_does_not_end_the_heartbeats(
    controller: ControllerProcess,
) -> None:
    """A heartbeat stream that ends with an error the loop did not expect (here a ValueError,
    as from a closed channel or an answer this broker cannot read) is logged and followed by a
    new stream: the broker stays unfenced. Before, such an error ended the heartbeat task for
    good and the controller fenced the broker a session timeout later."""
    image = MetadataImage()

    async def on_metadata(batch: pb.MetadataBatch) -> None:
        apply_batch(image, batch)

    link = ControllerLink(
        controller=("127.0.0.1", controller.port),
        broker_id=BROKER_ID,
        host="127.0.0.1",
        port=19004,
        rack="",
        metrics_port=-1,
        cluster_id="",
        previous_broker_epoch=-1,
        heartbeat_interval_ms=500,
        on_metadata=on_metadata,
        metadata_offset=lambda: image.next_offset,
    )
    real_stream = link._heartbeat_stream
    failures: list[int] = []

    def failing_once(loop: asyncio.AbstractEventLoop) -> None:
        if not failures:
            failures.append(1)
            raise ValueError("injected: the heartbeat thread met something unexpected")
        real_stream(loop)

    link._heartbeat_stream = failing_once  # type: ignore[method-assign]
    stop = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []
    try:
        await asyncio.wait_for(link.register(stop), 20)
        tasks = [asyncio.create_task(link.watch_loop()), asyncio.create_task(link.heartbeat_loop())]
        deadline = time.monotonic() + 20
        while not controller.is_unfenced(BROKER_ID):
            assert time.monotonic() < deadline, "the broker was never unfenced after the error"
            await asyncio.sleep(0.05)
        assert failures == [1]
        # Unfenced, and still heard from a session timeout later: the heartbeats go on.
        end = time.monotonic() + 2 * SESSION_TIMEOUT_MS / 1000
        while time.monotonic() < end:
            assert controller.is_unfenced(BROKER_ID), "fenced: the heartbeats stopped"
            await asyncio.sleep(0.1)
        assert controller.events("broker_fenced") == []
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await link.close()
