"""A simulated broker: its process lifecycle and control plane (tests/sim).

Modelled on broker/controller_link.py and broker/replicas/metadata_apply.py:

- a process start is a fresh incarnation; it registers (DUPLICATE_BROKER_REGISTRATION is
  retried), heartbeats on a virtual timer over a heartbeat stream, and is unfenced by the
  controller core once caught up; a heartbeat answer that no longer knows its epoch makes it
  register again;
- the metadata log reaches it through a watch stream: batches are delayed and arrive out of
  order, the broker buffers them and applies them in offset order (a snapshot after a
  controller restart, for watchers behind its retained log), then acts on the image the way
  `MetadataApplier.apply_batch` does;
- a paused process (SIGSTOP) runs nothing until it wakes: what reaches it waits.

Its partitions are hosted in the product's replica engine (`BrokerReplicas`, one per process)
over MemLogs; the logs (`logs`) outlive a process, everything else belongs to one incarnation.
The I/O around the engine (fetch sessions, AlterPartition, produce answers) is `ReplicaShell`
(replica_shell.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memlog import MemLog
from replica_shell import Fetcher, ReplicaShell
from scheduler import CONTROLLER

from minibroker.broker.replication.engine import BrokerReplicas
from minibroker.broker.replication.outputs import EngineConfig
from minibroker.client.common.invariant import invariant
from minibroker.client.errors import ErrorCode
from minibroker.client.types import TopicPartition
from minibroker.controller.core.messages import (
    HeartbeatReply,
    HeartbeatRequest,
    RegisterReply,
    RegisterRequest,
)
from minibroker.metadata.delta import EVERYTHING, MetadataDelta, delta_of
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import LogEntry

if TYPE_CHECKING:
    from replsim import Simulation

CLUSTER_ID = "sim-cluster"


class SimBroker(ReplicaShell):
    """One broker across process restarts: its logs survive (minus the unflushed tail), the
    rest (registration, metadata image, streams, replica cores) belongs to one incarnation."""

    def __init__(self, broker_id: int, sim: Simulation) -> None:
        self.broker_id = broker_id
        self.sim = sim
        self.alive = False
        self.incarnation = 0  # process starts; answers addressed to an older process are lost
        self.incarnation_id = ""
        self.registered = False
        self.broker_epoch = -1  # from the controller's RegisterReply; -1 until then
        self.image = MetadataImage()  # the metadata log as this broker has applied it
        self.acted_since_start = False  # set once metadata was acted on by this process
        self.metadata_buffer: dict[int, LogEntry] = {}  # arrived out of order, not yet applied
        self.watch: int | None = None  # token of the open WatchMetadata stream
        self.hb_stream: tuple[int, int] | None = None  # (stream id, controller generation)
        self.logs: dict[int, MemLog] = {}  # pid -> log: what survives a process
        self.engine: BrokerReplicas[MemLog] | None = None  # this process's hosted replicas
        self.fetchers: dict[TopicPartition, Fetcher] = {}
        self.paused_until_ms = 0  # SIGSTOP: nothing runs on this broker before this time
        self.shutting_down = False  # SIGTERM: controlled shutdown in progress
        # Crashed, so its log may lack what it acknowledged, until a new incarnation registers.
        self.lossy = False
        self.crashed_at_ms = -1  # the last crash (the nemesis's), for the checker

    def start_process(self) -> None:
        self.alive = True
        self.incarnation += 1
        self.incarnation_id = f"b{self.broker_id}-i{self.incarnation}"
        self.registered = False
        self.broker_epoch = -1
        self.image = MetadataImage()
        self.metadata_buffer = {}
        self.watch = None
        self.hb_stream = None
        opt = self.sim.opt
        config = EngineConfig(
            broker_id=self.broker_id,
            replica_lag_time_max_ms=opt.replica_lag_time_max_ms,
            replica_fetch_backoff_ms=opt.replica_fetch_backoff_ms,
        )
        self.engine = BrokerReplicas(config, self.image)
        self.acted_since_start = False
        self.fetchers = {}
        self.shutting_down = False
        # MetadataApplier.load_existing_logs: every log on disk is hosted at once, at its
        # checkpointed HW with the broker's default configs; roles (or removal, for a replica
        # moved away while this broker was down) come with the metadata.
        topic_id = self.sim.topic_id
        for pid, log in sorted(self.logs.items()):
            assert topic_id is not None  # a log exists only once the topic does
            self.engine.host(self.tp(pid), topic_id, log, None, high_watermark=log.hw_checkpoint)

    def stop_process(self) -> None:
        """The process is gone (crash or stop): only the logs remain."""
        self.alive = False
        self.engine = None
        self.fetchers = {}
        self.registered = False
        self.watch = None

    def runs(self, incarnation: int) -> Callable[[], bool]:
        """Whether the process `incarnation` still runs (what it was sending is still sent)."""
        return lambda: self.alive and self.incarnation == incarnation

    def paused(self) -> bool:
        return self.sim.now_ms < self.paused_until_ms

    def run_on(self, incarnation: int | None, action: Callable[[], None]) -> None:
        """Run `action` on this broker's process (`incarnation`, None: whichever runs). A paused
        process runs it when it wakes (SIGSTOP defers, it does not drop); a dead or replaced
        one never does."""
        if not self.alive or (incarnation is not None and self.incarnation != incarnation):
            return
        if self.paused():
            self.sim.at(
                self.paused_until_ms - self.sim.now_ms,
                lambda: self.run_on(incarnation, action),
            )
            return
        action()

    # -- registration and heartbeats ---------------------------------------------------------

    def start(self) -> None:
        """A process starts: it registers, and heartbeats from then on."""
        sim = self.sim
        self.start_process()
        incarnation = self.incarnation
        self.register(incarnation)
        sim.at(sim.opt.heartbeat_interval_ms, lambda: self._heartbeat_tick(incarnation))

    def register(self, incarnation: int) -> None:
        if not self.alive or self.incarnation != incarnation or self.registered:
            return
        sim = self.sim
        request = RegisterRequest(
            broker_id=self.broker_id,
            cluster_id=CLUSTER_ID,
            incarnation_id=self.incarnation_id,
            host="127.0.0.1",
            port=9_000 + self.broker_id,
        )
        answered = [False]

        def retry() -> None:
            if not answered[0]:
                answered[0] = True
                sim.at(sim.rng.randint(50, 150), lambda: self.register(incarnation))

        def on_reply(reply: RegisterReply) -> None:
            if answered[0]:
                return
            answered[0] = True
            if reply.error != ErrorCode.NONE:
                # DUPLICATE_BROKER_REGISTRATION: the old incarnation's session is still alive.
                sim.at(sim.rng.randint(50, 150), lambda: self.register(incarnation))
                return
            self.broker_epoch = reply.broker_epoch
            self.registered = True
            self.lossy = False  # the registration took this incarnation out of every ISR
            sim.note(f"b{self.broker_id} registered, broker epoch {reply.broker_epoch}")
            self._open_watch(incarnation)

        deadline_ms = sim.now_ms + sim.opt.request_timeout_ms
        to_controller = (self.broker_id, CONTROLLER)

        def arrive() -> None:
            sim.call_controller(
                lambda core, now: core.register_broker(request, now),
                lambda reply: sim.net.send(
                    lambda: self.run_on(incarnation, lambda: on_reply(reply)),
                    (CONTROLLER, self.broker_id),
                    deadline_ms,
                ),
            )

        sim.at(sim.opt.request_timeout_ms, retry)
        sim.net.send(arrive, to_controller, deadline_ms, self.runs(incarnation))

    def _heartbeat_tick(self, incarnation: int) -> None:
        if not self.alive or self.incarnation != incarnation:
            return
        sim = self.sim
        sim.at(sim.opt.heartbeat_interval_ms, lambda: self._heartbeat_tick(incarnation))
        if self.registered and not self.paused():
            self.send_heartbeat()

    def send_heartbeat(self, want_fence: bool = False) -> None:
        sim = self.sim
        ctl = sim.controller
        stream = self.hb_stream
        if stream is None or stream[1] != ctl.generation:
            if not ctl.up:
                self.hb_stream = None
                return
            stream = self.hb_stream = (next(sim.stream_ids), ctl.generation)
        if (
            sim.net.faults
            and sim.rng.random() < sim.opt.stream_break_rate
            and sim.nemesis.fence_ok()
        ):
            # The connection breaks under a live broker: the controller fences it at once and
            # the next heartbeat, on a new stream, unfences it.
            sim.stats["stream_breaks"] += 1
            self.break_heartbeat_stream(notice=True)
            return
        request = HeartbeatRequest(
            self.broker_id,
            self.broker_epoch,
            self.image.next_offset,  # what controller_link.py reports
            want_fence=want_fence,
            want_shut_down=self.shutting_down,
        )
        stream_id, generation = stream
        incarnation = self.incarnation

        def arrive() -> None:
            if sim.controller.generation != generation:
                return  # the stream died with that controller process
            sim.call_controller(
                lambda core, now: core.heartbeat(request, stream_id, now),
                lambda reply: sim.net.transmit(
                    lambda: self.run_on(incarnation, lambda: self._on_heartbeat_reply(reply)),
                    (CONTROLLER, self.broker_id),
                ),
            )

        # A stream is TCP: heartbeats are delayed, never dropped alone (a loss breaks it). It has
        # no deadline: on a cut link they wait for the heal (keepalive is not modelled).
        sim.net.transmit(
            arrive, (self.broker_id, CONTROLLER), still_sent=lambda: self.hb_stream == stream
        )

    def _on_heartbeat_reply(self, reply: HeartbeatReply) -> None:
        if reply.error in (ErrorCode.STALE_BROKER_EPOCH, ErrorCode.BROKER_ID_NOT_REGISTERED):
            # controller_link.py: the controller no longer knows this epoch; register again.
            self.registered = False
            self.hb_stream = None
            self.register(self.incarnation)
        elif reply.should_shut_down and self.shutting_down:
            self.sim.nemesis.stop_broker(self, "controlled shutdown granted")

    def break_heartbeat_stream(self, notice: bool) -> None:
        """The heartbeat stream ends; with `notice` the controller hears of it (a reset)."""
        stream, self.hb_stream = self.hb_stream, None
        if stream is None or not notice:
            return
        sim = self.sim
        stream_id, generation = stream
        broker_id, broker_epoch = self.broker_id, self.broker_epoch

        def arrive() -> None:
            if sim.controller.generation == generation:
                sim.call_controller(
                    lambda core, now: core.heartbeat_stream_closed(
                        broker_id, broker_epoch, stream_id, now
                    )
                )

        sim.net.transmit(arrive, (broker_id, CONTROLLER))

    # -- metadata (WatchMetadata) -------------------------------------------------------------

    def break_watch(self) -> None:
        """The watch stream broke; reconnect later, from the applied offset."""
        sim = self.sim
        self.watch = None
        incarnation = self.incarnation
        sim.at(sim.rng.randint(20, 200), lambda: self._open_watch(incarnation))

    def _open_watch(self, incarnation: int) -> None:
        if (
            not self.alive
            or self.incarnation != incarnation
            or not self.registered
            or self.watch is not None
        ):
            return
        sim = self.sim
        ctl = sim.controller
        if not ctl.up or sim.net.is_cut(self.broker_id, CONTROLLER):
            # Refused, or (cut) the call would hang until the heal: try again later.
            sim.at(sim.rng.randint(50, 200), lambda: self._open_watch(incarnation))
            return
        token = self.watch = next(sim.watch_ids)
        is_snapshot, items, offset = ctl.read_from(self.image.next_offset)
        if is_snapshot or items:
            sim.net.transmit(
                lambda: self.on_watch_batch(token, is_snapshot, items, offset),
                (CONTROLLER, self.broker_id),
            )

    def on_watch_batch(
        self, token: int, is_snapshot: bool, items: tuple[Any, ...], offset: int
    ) -> None:
        """A batch of the watch stream `token` arrives: entries, or a snapshot at `offset`."""
        if self.watch != token or not self.alive:
            return  # that stream is gone; its reconnect asks again from the applied offset
        sim = self.sim
        if self.paused():
            sim.at(
                self.paused_until_ms - sim.now_ms,
                lambda: self.on_watch_batch(token, is_snapshot, items, offset),
            )
            return
        image = self.image
        applied = False
        applied_entries = []
        if is_snapshot:
            image.replace_with_snapshot(items, offset)
            self.metadata_buffer = {
                o: e for o, e in self.metadata_buffer.items() if o >= image.next_offset
            }
            applied = True
            sim.stats["metadata_snapshots"] += 1
        else:
            for entry in items:
                if entry.offset >= image.next_offset:
                    self.metadata_buffer[entry.offset] = entry
        # WatchMetadata applies in offset order: what arrived early waits for the gap to fill.
        while image.next_offset in self.metadata_buffer:
            entry = self.metadata_buffer.pop(image.next_offset)
            image.apply(entry)
            applied_entries.append(entry)
            applied = True
        if applied:
            # As the broker's MetadataApplier: everything after a snapshot or a (re)start,
            # else only what the applied records touched (metadata/delta.py).
            everything = is_snapshot or not self.acted_since_start
            self.acted_since_start = True
            self._act_on_metadata(EVERYTHING if everything else delta_of(applied_entries, 0))

    def _act_on_metadata(self, delta: MetadataDelta = EVERYTHING) -> None:
        """The shell's part of acting on the metadata (the broker's `apply_metadata_batch`):
        the engine decides; a partition it needs a log for gets this broker's MemLog for it
        (the one that survived the last process, or a new one), hosted at the checkpointed HW.
        """
        engine = self.engine
        assert engine is not None
        now = self.sim.now_ms
        new, outputs = engine.act_on_metadata(now, delta)
        for topic, record in new:
            # A replica new here (created, or added by a reassignment): a new empty log; the
            # follower's core fetches from the leader's log start (OFFSET_OUT_OF_RANGE path).
            invariant(
                record.partition not in self.logs,
                f"b{self.broker_id} p{record.partition}: a log exists but is not hosted",
            )
            log = self.logs[record.partition] = MemLog()
            engine.host(
                self.tp(record.partition),
                topic.topic_id,
                log,
                dict(topic.configs),
                high_watermark=log.hw_checkpoint,
            )
            outputs += engine.act_on_partition(topic, record, now)
        self.handle(outputs)
        self.sim.checker.on_metadata_acted(self)
