"""Producer ids for InitProducerId: blocks from the controller (Kafka's ProducerIdManager).

I/O shell (event-loop thread). Blocks come from the controller over the link. The next one is
fetched in the background once 90% of the current one is used, and the first right after
registration, so new idempotent producers keep starting while the controller is briefly away.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from minibroker.broker import wire
from minibroker.client.errors import ErrorCode
from minibroker.proto import minibroker_pb2 as pb

if TYPE_CHECKING:
    from minibroker.broker.replicas.manager import ReplicaManager

PRODUCER_ID_PREFETCH_LEFT = 100  # prefetch the next block when this few ids are left (90%)


class ProducerIds:
    def __init__(self, rm: ReplicaManager) -> None:
        self._rm = rm
        self._ids: tuple[int, int] = (0, 0)  # next id, end (exclusive)
        self._next: tuple[int, int] | None = None  # (start, length), prefetched
        self._prefetching = False
        self._lock = asyncio.Lock()

    async def init_producer_id(self) -> pb.InitProducerIdResponse:
        """Hand out the next producer id of this broker's block."""
        async with self._lock:
            next_id, end = self._ids
            if next_id >= end:
                if self._next is None:
                    try:
                        self._next = await self._rm.link.allocate_producer_ids()
                    except Exception as err:
                        return wire.encode_init_producer_id(
                            ErrorCode.NOT_CONTROLLER, f"cannot allocate producer ids: {err}"
                        )
                start, length = self._next
                self._next = None
                next_id, end = start, start + length
            self._ids = (next_id + 1, end)
            if self._next is None and end - next_id <= PRODUCER_ID_PREFETCH_LEFT:
                self.prefetch()
        return wire.encode_init_producer_id(ErrorCode.NONE, producer_id=next_id)

    def prefetch(self) -> None:
        """Fetch the next producer-id block in the background (retrying while the controller is
        away), unless one is already fetched or on its way."""
        if self._next is not None or self._prefetching:
            return
        self._prefetching = True

        async def fetch() -> None:
            try:
                delay = 0.1
                while self._next is None:
                    try:
                        self._next = await self._rm.link.allocate_producer_ids()
                    except Exception:
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, 2.0)
            finally:
                self._prefetching = False

        self._rm.spawn(fetch(), "prefetch-producer-ids")
