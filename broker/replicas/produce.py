"""Produce: one engine call per partition, then wait for the acks=all futures.

I/O shell (event-loop thread). The checks, the plan, the append and the acks=all rule are the
engine's (`BrokerReplicas.produce`); here only the futures and the request timeout live. A
future is completed only from the core's CompleteProduce outputs, also on a timeout
(`expire_produce`), so the core's purgatory and the futures always agree. Each
partition's outputs are carried out before the next partition is produced, so one whose
append takes the dir offline answers every later one KAFKA_STORAGE_ERROR.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from minibroker.broker import wire
from minibroker.broker.replication.events import CompleteProduce
from minibroker.client.common.clock import wall_clock_ms
from minibroker.client.common.invariant import invariant
from minibroker.client.errors import ErrorCode
from minibroker.client.types import TopicPartition

if TYPE_CHECKING:
    from minibroker.broker.replicas.manager import ReplicaManager


class ProduceHandler:
    def __init__(self, rm: ReplicaManager) -> None:
        self._rm = rm

    async def produce(
        self, acks: int, timeout_ms: int, partitions: list[wire.ProducePartition]
    ) -> list[wire.ProduceResult]:
        rm = self._rm
        rm.metrics.produce_requests.inc()
        results: list[wire.ProduceResult] = []
        waits: list[
            tuple[wire.ProduceResult, TopicPartition, int, asyncio.Future[CompleteProduce]]
        ] = []
        deadline = wall_clock_ms() + max(timeout_ms, 0)
        for part in partitions:
            tp = TopicPartition(part.topic, part.partition)
            reply, outputs = rm.engine.produce(tp, acks, part.records, wall_clock_ms(), deadline)
            result = wire.ProduceResult(
                part.topic,
                part.partition,
                reply.error,
                reply.message,
                reply.base_offset,
                reply.log_append_time_ms,
                reply.log_start_offset,
                reply.leader,
            )
            results.append(result)
            if reply.token is not None:
                # Registered before the outputs run: they may complete it at once.
                future = asyncio.get_running_loop().create_future()
                rm.produce_futures[reply.token] = future
                waits.append((result, tp, reply.token, future))
            rm.run(outputs)
        if waits:
            await asyncio.wait([f for _, _, _, f in waits], timeout=max(timeout_ms, 0) / 1000.0)
            for result, tp, token, future in waits:
                if not future.done():
                    # timeout_ms ran out first: the core answers REQUEST_TIMED_OUT for it.
                    rm.run(rm.engine.expire_produce(tp, token))
                invariant(future.done(), f"{tp}: produce {token} is parked nowhere")
                completion = future.result()
                result.error = completion.error
                result.message = completion.message
                if completion.error != ErrorCode.NONE:
                    result.base_offset = -1
        if all(r.error != ErrorCode.INVALID_REQUIRED_ACKS for r in results):
            # A request refused as a whole (bad acks) is not a failed produce (as in Kafka,
            # where KafkaApis refuses it before the append path counts).
            for result in results:
                if result.error != ErrorCode.NONE:
                    rm.metrics.failed_produce_requests.inc()
        return results
