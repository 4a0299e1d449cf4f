"""The simulation's clients: producers (plain and idempotent, acks=all) and consumers.

Producers send to whichever broker the controller's current record names as leader (the
clients' omniscient metadata; while a partition episode cuts a leader from the controller, half
of its clients' requests still go to it, as stale metadata sends them); what a leader
acknowledges goes into `acked` once the answer has travelled back, and from then on it must
never be lost. The idempotent producer (one per partition, one batch in flight) retries the
same batch (same producer id, epoch and sequence) after errors and lost answers, to whichever
broker leads now (docs/design.md §5, §8.5). A consumer per partition reads from the current
leader (or a stale one) and checks what it sees (I3).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minibroker.broker.replication.events import CompleteProduce
from minibroker.broker.replication.outputs import ProduceReply
from minibroker.client.batch import iter_batches
from minibroker.client.common.invariant import invariant
from minibroker.client.errors import ErrorCode
from minibroker.client.records import encode_batch
from minibroker.client.types import NO_LEADER

if TYPE_CHECKING:
    from node import SimBroker
    from replsim import Simulation


@dataclass
class IdempotentProducer:
    """One idempotent producer per partition, one batch in flight, retried until acked."""

    producer_id: int
    sequence: int = 0
    in_flight: bytes | None = None
    attempt: int = 0
    acked_values: list[bytes] = field(default_factory=list)


class Workload:
    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.acked: dict[tuple[int, int], bytes] = {}  # (pid, offset) -> stamped batch bytes
        self.produced = 0
        # (broker, incarnation, engine token) -> (request, pid, base offset): parked produces.
        self.waiting: dict[tuple[int, int, int], tuple[object, int, int]] = {}
        self.producers = {pid: IdempotentProducer(1_000 + pid) for pid in range(sim.opt.partitions)}
        self.consumer_position: dict[int, int] = {}
        self.producer_ids = {p.producer_id for p in self.producers.values()}
        # pid -> a leader cut from the controller whose clients' metadata still names it (set
        # by the nemesis for a partition episode): half their requests go there.
        self.stale_leader: dict[int, int] = {}

    def route(self, pid: int) -> tuple[int, bool]:
        """Where a client sends its request for `pid`: (broker, whether that is a stale leader
        rather than the controller's). No draw unless a stale leader is set."""
        sim = self.sim
        leader_id = sim.leader(pid)
        stale = self.stale_leader.get(pid)
        if stale is not None and stale != leader_id and sim.rng.random() < 0.5:
            return stale, True
        return leader_id, False

    def tick(self) -> None:
        """One scheduler tick of client activity (only while faults are on: the liveness
        phase lets the cluster settle)."""
        sim = self.sim
        opt = sim.opt
        if sim.net.faults and sim.rng.random() < opt.tick_ms / opt.produce_interval_ms:
            self._produce()
        if sim.net.faults and sim.rng.random() < 0.3:
            pid = sim.rng.randrange(opt.partitions)
            if self.producers[pid].in_flight is None:
                self._produce_idempotent(pid)
        if sim.now_ms % 20 == 0:
            self.consume()

    # -- producing ---------------------------------------------------------------------------

    def _record_ack(self, pid: int, base_offset: int, data: bytes) -> None:
        """The producer got its acknowledgement: from now on the batch must never be lost."""
        self.acked[(pid, base_offset)] = data
        self.sim.checker.on_acked(pid, base_offset)

    def _send(
        self, broker: SimBroker, pid: int, raw: bytes, request: object
    ) -> ProduceReply | None:
        """A produce request with acks=all reaches `broker` (running): the engine appends and
        parks it; `request` names it when its answer comes (an output of this call or a later
        one). None when the process has no engine (it stopped)."""
        engine = broker.engine
        if engine is None:
            return None
        sim = self.sim
        reply, outputs = engine.produce(
            broker.tp(pid), -1, raw, sim.now_ms, deadline_ms=sim.now_ms + 2_000
        )
        if reply.token is not None:
            key = (broker.broker_id, broker.incarnation, reply.token)
            self.waiting[key] = (request, pid, reply.base_offset)
        broker.handle(outputs)
        return reply

    def _produce(self) -> None:
        sim = self.sim
        pid = sim.rng.randrange(sim.opt.partitions)
        leader_id, _ = self.route(pid)
        if leader_id == NO_LEADER:
            return
        self.produced += 1
        value = f"s{sim.seed}-m{self.produced}".encode()
        raw = encode_batch([(sim.now_ms, None, value, ())])
        broker = sim.brokers[leader_id]
        request = (pid, self.produced)
        sim.net.send(lambda: broker.run_on(None, lambda: self._send(broker, pid, raw, request)))

    def _produce_idempotent(self, pid: int) -> None:
        producer = self.producers[pid]
        if producer.in_flight is None:
            value = f"p{pid}-seq{producer.sequence}".encode()
            producer.in_flight = encode_batch(
                [(self.sim.now_ms, None, value, ())],
                producer_id=producer.producer_id,
                producer_epoch=0,
                base_sequence=producer.sequence,
            )
        self._send_idempotent(pid, producer.sequence)

    def _send_idempotent(self, pid: int, sequence: int) -> None:
        sim = self.sim
        producer = self.producers[pid]
        if producer.in_flight is None or producer.sequence != sequence or not sim.net.faults:
            return
        producer.attempt += 1
        attempt = producer.attempt
        raw = producer.in_flight
        request = ("idem", pid, sequence, attempt)
        leader_id, stale = self.route(pid)

        def retry_later(delay_ms: int) -> None:
            sim.at(delay_ms, lambda: self._retry_if_current(pid, sequence, attempt))

        retry_later(2_500)  # the request timeout: a lost request or answer is retried
        if leader_id == NO_LEADER:
            return
        broker = sim.brokers[leader_id]

        def arrive() -> None:
            reply = self._send(broker, pid, raw, request)
            if reply is not None and reply.error != ErrorCode.NONE:
                if not stale:  # a zombie's producer state may lag the real leader's
                    sim.checker.on_producer_error(pid, reply.error)
                sim.net.send(lambda: self._retry_if_current(pid, sequence, attempt))

        sim.net.send(lambda: broker.run_on(None, arrive))

    def _retry_if_current(self, pid: int, sequence: int, attempt: int) -> None:
        producer = self.producers[pid]
        if producer.sequence == sequence and producer.attempt == attempt:
            self.sim.at(self.sim.rng.randint(5, 50), lambda: self._send_idempotent(pid, sequence))

    def _on_idempotent_answer(self, request: tuple[object, ...], error: ErrorCode) -> None:
        _, pid, sequence, attempt = request
        producer = self.producers[pid]  # type: ignore[index]
        if producer.sequence != sequence or producer.in_flight is None:
            return  # an answer to an attempt of a batch already acknowledged
        if error != ErrorCode.NONE:
            self._retry_if_current(pid, sequence, attempt)  # type: ignore[arg-type]
            return
        producer.acked_values.append(producer.in_flight)
        producer.in_flight = None
        producer.sequence += 1

    def on_produce_complete(self, broker: SimBroker, done: CompleteProduce) -> None:
        """`broker`'s engine answers a parked produce (the HW passed it, or an error)."""
        sim = self.sim
        waiting = self.waiting.pop((broker.broker_id, broker.incarnation, done.token), None)
        if waiting is None:
            return
        request, pid, base_offset = waiting
        if done.error == ErrorCode.NONE:
            data = broker.logs[pid].batch_at(base_offset)
            invariant(data is not None, f"acked batch at {base_offset} is not in the leader's log")
            assert data is not None
            sim.checker.on_produce_acked(broker, pid, base_offset, data)
            # The answer travels back; a lost one just means the client never learns.
            sim.net.send(lambda: self._record_ack(pid, base_offset, data))  # type: ignore[arg-type]
        if isinstance(request, tuple) and request[0] == "idem":
            sim.net.send(lambda: self._on_idempotent_answer(request, done.error))

    # -- consuming -----------------------------------------------------------------------------

    def consume(self) -> None:
        """A consumer per partition reads from the current leader, checking I3."""
        sim = self.sim
        committed = sim.checker.committed
        for pid in range(sim.opt.partitions):
            leader_id, _ = self.route(pid)
            if leader_id == NO_LEADER:
                continue
            broker = sim.brokers[leader_id]
            engine = broker.engine
            if not broker.alive or engine is None or broker.paused():
                continue
            position = self.consumer_position.get(pid, 0)
            reply, _ = engine.consumer_fetch(broker.tp(pid), -1, position, 1 << 20)
            if reply.error == ErrorCode.OFFSET_OUT_OF_RANGE and position < reply.log_start_offset:
                # Retention passed it: auto.offset.reset=earliest.
                self.consumer_position[pid] = reply.log_start_offset
                continue
            if reply.error != ErrorCode.NONE:
                continue
            data = reply.records
            high_watermark = engine.high_watermark(broker.tp(pid))
            for pos, header in iter_batches(data):
                invariant(
                    header.next_offset <= high_watermark,
                    f"p{pid}: consumer read {header.last_offset} above HW {high_watermark}",
                )
                invariant(
                    header.base_offset == position,
                    f"p{pid}: consumer expected offset {position}, got {header.base_offset}",
                )
                seen = committed.get((pid, header.base_offset))
                invariant(
                    seen is None or seen == data[pos : pos + header.size],
                    f"p{pid}: consumer saw bytes at {header.base_offset} that differ from the "
                    "committed ones",
                )
                position = header.next_offset
            self.consumer_position[pid] = position
