"""Cancelling a call whose end is held by the fault layer (client/common/netfaults.py).

A stream the server ends while the link is cut: its last status came back and is held, so the
call underneath is already done and its own cancel() does nothing. The caller's cancel() must
still end the held read at once (found with a controller that resigned while cut off: the broker
moved its metadata watch to the new leader by cancelling it, and the watch hung until the heal).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from minibroker.client.common.netfaults import NetFaults, aio_interceptors, parse_faults
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

WAIT_S = 10.0


class Ending(pb_grpc.ControllerServiceServicer):
    """WatchMetadata sends one batch, then ends the stream with an error when told to."""

    def __init__(self) -> None:
        self.end = asyncio.Event()

    async def WatchMetadata(self, request: Any, context: Any) -> AsyncIterator[Any]:
        yield pb.MetadataBatch(high_offset=1)
        await self.end.wait()
        await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "not the controller any more")


def table(port: int, cut: bool) -> Any:
    return parse_faults(
        json.dumps(
            {
                "version": 1,
                "generation": 1,
                "nodes": {"broker-1": "127.0.0.1:1", "controller-1": f"127.0.0.1:{port}"},
                "cut": [["broker-1", "controller-1"]] if cut else [],
            }
        )
    )


async def eventually(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def test_cancel_ends_a_read_whose_held_answer_is_the_streams_end() -> None:
    servicer = Ending()
    server = grpc.aio.server()
    pb_grpc.add_ControllerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    address = f"127.0.0.1:{port}"
    faults = NetFaults("unused", "broker-1")
    channel = grpc.aio.insecure_channel(address, interceptors=aio_interceptors(faults, address))
    try:
        call = pb_grpc.ControllerServiceStub(channel).WatchMetadata(pb.WatchMetadataRequest())
        got: list[int] = []

        async def consume() -> None:
            async for batch in call:
                got.append(batch.high_offset)

        consumer = asyncio.ensure_future(consume())
        await eventually(lambda: got == [1], "the first batch")
        faults.set_table(table(port, cut=True))
        servicer.end.set()  # the server ends the stream; its status is held on the cut link
        await eventually(lambda: faults.held == 1, "the stream's end held")
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(consumer, WAIT_S)
        assert faults.held == 0
    finally:
        await channel.close()
        await server.stop(grace=None)
