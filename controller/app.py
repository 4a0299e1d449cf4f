"""The controller process's composition root: data dir, journal, core, gRPC server, timers.

I/O shell, event-loop thread only (journal writes run in a worker thread, one at a time).
Concurrency contract: ONE command task owns the core. Every RPC, timer tick and stream-close
notice is a command put on a bounded queue; the task runs it against the core, makes the
resulting records durable (fsync), then publishes them to metadata watchers, logs the events,
refreshes metrics, and only then completes the caller's future (etcd's "persist before send").
Watchers and DescribeCluster only ever see committed state.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from minibroker.client.common import metrics as common_metrics
from minibroker.client.common import runtime
from minibroker.client.common.grpc_limits import LimitsInterceptor, RequestBudget
from minibroker.client.common.log import get_logger
from minibroker.controller.config import ControllerConfig
from minibroker.controller.core.controller import ControllerCore
from minibroker.controller.core.messages import Outcome
from minibroker.controller.journal import DataDir, MetadataJournal, write_atomically
from minibroker.controller.metrics import ControllerMetrics
from minibroker.controller.service import ControllerServicer
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import LogEntry
from minibroker.metadata.wire import batch_to_pb, snapshot_to_pb
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

log = get_logger(__name__)

R = TypeVar("R")
Command = Callable[[ControllerCore, int], Outcome[Any]]

COMMAND_QUEUE_BOUND = 10_000
TICK_INTERVAL_S = 0.1
MAX_ENTRIES_PER_BATCH = 1000
GROUP_COMMIT_MAX = 256  # commands per fsync
# The request size, idle and connection limits come from the config (client/common/limits.py).
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # Ping idle peers so a vanished host (no RST) still breaks its heartbeat stream.
    ("grpc.keepalive_time_ms", 2000),
    ("grpc.keepalive_timeout_ms", 2000),
    ("grpc.keepalive_permit_without_calls", 1),
    # Brokers ping every 2 s; the default server policy would answer with GOAWAY.
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    ("grpc.http2.max_ping_strikes", 0),
]


class ControllerStopped(Exception):
    """The controller is stopping (or hit a fatal journal error); the command did not run."""


# Wall-clock time at start, advanced by the monotonic clock: record timestamps read like wall
# time, while session timeouts never jump when the system clock is stepped.
_CLOCK_BASE_S = time.time() - time.monotonic()


def _now_ms() -> int:
    return int((time.monotonic() + _CLOCK_BASE_S) * 1000)


def _split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen expects HOST:PORT, got {listen!r}")
    return host or "127.0.0.1", int(port)


class ControllerApp:
    def __init__(self, config: ControllerConfig, *, port_file: str | None = None) -> None:
        self.config = config
        self.port_file = port_file
        self.data_dir = DataDir(config["metadata.log.dir"])
        self.journal = MetadataJournal(self.data_dir.path)
        self._core: ControllerCore | None = None
        self.cluster_id = ""
        self.port = -1
        self.metrics_port = -1
        self.registry = common_metrics.new_registry()
        self.metrics = ControllerMetrics(self.registry)
        self.stopping = False
        self.fatal: BaseException | None = None
        self._queue: asyncio.Queue[tuple[Command, asyncio.Future[Any] | None]] = asyncio.Queue(
            COMMAND_QUEUE_BOUND
        )
        self._committed = asyncio.Condition()
        self.committed_offset = 0
        # Committed entries kept in memory for watchers: [retained_start, committed_offset).
        self._retained: list[LogEntry] = []
        self._retained_start = 0
        self._since_snapshot = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._fatal_event = asyncio.Event()

    @property
    def core(self) -> ControllerCore:
        if self._core is None:
            raise ControllerStopped("the controller has not loaded its metadata yet")
        return self._core

    # -- start and stop -----------------------------------------------------------------------

    async def start(self) -> None:
        started = time.monotonic()
        runtime.log_open_file_limit(log)
        self.data_dir.lock()
        self.cluster_id, created = self.data_dir.load_or_create_cluster_id(self.config["node.id"])
        loaded = await asyncio.to_thread(self.journal.load)
        image = MetadataImage()
        if loaded.snapshot_records is not None:
            image.replace_with_snapshot(loaded.snapshot_records, loaded.snapshot_offset)
        else:
            image.next_offset = loaded.snapshot_offset
        for entry in loaded.entries:
            image.apply(entry)
        self._core = ControllerCore(
            self.config.settings(),
            self.cluster_id,
            random.Random(int.from_bytes(os.urandom(16), "big")),
            _now_ms(),
            image,
        )
        self.committed_offset = image.next_offset
        self._retained = list(loaded.entries)
        self._retained_start = image.next_offset - len(self._retained)
        self._since_snapshot = len(loaded.entries)
        self.metrics.refresh(image, self.committed_offset)
        log.info(
            "metadata_loaded",
            cluster_id=self.cluster_id,
            cluster_id_created=created,
            snapshot_offset=loaded.snapshot_offset,
            replayed_records=len(loaded.entries),
            truncated_bytes=loaded.truncated_bytes,
            next_offset=image.next_offset,
            brokers=len(image.brokers),
            topics=len(image.topics_by_id),
            partitions=image.partition_count(),
            load_ms=round((time.monotonic() - started) * 1000, 1),
        )
        self._tasks = [
            asyncio.create_task(self._command_loop(), name="controller-commands"),
            asyncio.create_task(self._tick_loop(), name="controller-ticks"),
        ]
        host, port = _split_listen(self.config["listeners"])
        limits = self.config.limits
        interceptor = LimitsInterceptor(limits, RequestBudget(limits.queued_max_request_bytes))
        server = grpc.aio.server(
            options=SERVER_OPTIONS + limits.grpc_options(),
            interceptors=[interceptor] if interceptor.enabled else [],
        )
        pb_grpc.add_ControllerServiceServicer_to_server(ControllerServicer(self), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        self.port = server.add_insecure_port(f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"cannot listen on {host}:{port}")
        await server.start()
        self._server = server
        if self.config["metrics.port"] >= 0:
            self.metrics_port = common_metrics.serve(self.registry, self.config["metrics.port"])
        for service in ("", "minibroker.ControllerService"):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        if self.port_file:
            write_atomically(pathlib.Path(self.port_file), f"{self.port}\n".encode())
        log.info(
            "controller_started",
            host=host,
            port=self.port,
            metrics_port=self.metrics_port,
            node_id=self.config["node.id"],
            cluster_id=self.cluster_id,
        )

    async def stop(self) -> None:
        """Stop serving. Stream ends caused by our own shutdown fence nobody."""
        self.stopping = True
        await self._health.enter_graceful_shutdown()
        if self._server is not None:
            await self._server.stop(grace=0.5)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        while not self._queue.empty():
            _, future = self._queue.get_nowait()
            if future is not None and not future.done():
                future.set_exception(ControllerStopped("controller stopped"))
        self.journal.close()
        self.data_dir.unlock()
        log.info("controller_stopped", committed_offset=self.committed_offset)

    async def run(self, stop: asyncio.Event) -> int:
        await self.start()
        waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(self._fatal_event.wait())]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
        await self.stop()
        return 1 if self.fatal is not None else 0

    # -- commands -----------------------------------------------------------------------------

    async def submit(self, command: Callable[[ControllerCore, int], Outcome[R]]) -> R:
        """Run `command` on the core; returns its reply once its records are durable."""
        if self.stopping or self.fatal is not None:
            raise ControllerStopped("controller is stopping")
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        await self._queue.put((command, future))
        return await future

    def submit_nowait(self, command: Command) -> None:
        """Queue a command nobody waits for (stream-close notices, ticks)."""
        if self.stopping or self.fatal is not None:
            return
        try:
            self._queue.put_nowait((command, None))
        except asyncio.QueueFull:
            log.error("command_queue_full", bound=COMMAND_QUEUE_BOUND)

    async def _command_loop(self) -> None:
        """Run queued commands in order. Group commit: every command already waiting is run
        too, and their records share one write and one fsync; no reply leaves before it. A
        later command of a group may see an earlier one's records before they are durable;
        that is safe because all of them become durable (or the process stops) before anyone
        is answered or any watcher sees them."""
        core = self.core
        while True:
            group = [await self._queue.get()]
            while len(group) < GROUP_COMMIT_MAX and not self._queue.empty():
                group.append(self._queue.get_nowait())
            ran: list[tuple[asyncio.Future[Any] | None, Outcome[Any], BaseException | None]] = []
            for command, future in group:
                if future is not None and future.done():
                    continue  # the caller went away before it ran; nothing happened yet
                error: BaseException | None = None
                try:
                    outcome = command(core, _now_ms())
                except Exception as err:
                    # A bug in the core. Whatever it had already applied must still reach
                    # the log, so that the log and the image never disagree.
                    log.exception("controller_command_failed")
                    error = err
                    outcome = core.take_pending()
                ran.append((future, outcome, error))
            frames = [outcome.entries for _, outcome, _ in ran if outcome.entries]
            if frames:
                try:
                    await asyncio.to_thread(self.journal.append_frames, frames)
                except BaseException as err:
                    self._die(err)
                    for future, _, _ in ran:
                        if future is not None and not future.done():
                            future.set_exception(ControllerStopped("metadata journal failed"))
                    return
                for entries in frames:
                    await self._publish(entries)
            events = [event for _, outcome, _ in ran for event in outcome.events]
            for event in events:
                log.info(event.name, **event.fields)
            if frames or events:
                self.metrics.count(events)
                self.metrics.refresh(core.image, self.committed_offset)
            for future, outcome, error in ran:
                if future is None or future.done():
                    continue
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(outcome.reply)
            if self._since_snapshot >= self.config["metadata.snapshot.interval.records"]:
                await self._snapshot()

    def _die(self, err: BaseException) -> None:
        log.error("metadata_journal_failed", error=repr(err))
        self.fatal = err
        self._fatal_event.set()

    async def _publish(self, entries: tuple[LogEntry, ...]) -> None:
        self._retained.extend(entries)
        self.committed_offset = entries[-1].offset + 1
        self._since_snapshot += len(entries)
        async with self._committed:
            self._committed.notify_all()

    async def _snapshot(self) -> None:
        image = self.core.image
        records = image.to_records()
        offset = image.next_offset
        started = time.monotonic()
        try:
            await asyncio.to_thread(self.journal.write_snapshot, records, offset)
        except BaseException as err:
            self._die(err)
            return
        self._since_snapshot = 0
        # Keep the most recent records in memory so a slightly lagging watcher still gets
        # deltas instead of a whole snapshot.
        keep = self.config["metadata.snapshot.interval.records"]
        if len(self._retained) > keep:
            drop = len(self._retained) - keep
            self._retained = self._retained[drop:]
            self._retained_start += drop
        log.info(
            "metadata_snapshot_written",
            snapshot_offset=offset,
            records=len(records),
            write_ms=round((time.monotonic() - started) * 1000, 1),
        )

    async def _tick_loop(self) -> None:
        interval = min(TICK_INTERVAL_S, self.config["broker.session.timeout.ms"] / 10_000)
        while True:
            await asyncio.sleep(interval)
            self.submit_nowait(lambda core, now: core.tick(now))

    # -- metadata watchers --------------------------------------------------------------------

    async def _committed_image_batch(self) -> pb.MetadataBatch:
        """A snapshot batch of the committed image (waits out an in-flight fsync)."""
        image = self.core.image
        async with self._committed:
            await self._committed.wait_for(lambda: image.next_offset == self.committed_offset)
            return snapshot_to_pb(image.to_records(), self.committed_offset)

    def _advanced_past(self, offset: int) -> Callable[[], bool]:
        return lambda: self.committed_offset > offset

    async def watch(self, from_offset: int) -> AsyncIterator[pb.MetadataBatch]:
        """Committed metadata from `from_offset` on, forever: a snapshot first when the log no
        longer holds that offset, then every new batch, and an empty keep-alive batch with the
        high offset after `metadata.max.idle.interval.ms` of quiet."""
        idle_s = self.config["metadata.max.idle.interval.ms"] / 1000
        position = from_offset
        while True:
            if position < self._retained_start or position > self.committed_offset:
                batch = await self._committed_image_batch()
                position = batch.snapshot_offset
                yield batch
                continue
            if position < self.committed_offset:
                start = position - self._retained_start
                entries = self._retained[start : start + MAX_ENTRIES_PER_BATCH]
                position = entries[-1].offset + 1
                yield batch_to_pb(entries, self.committed_offset)
                continue
            async with self._committed:
                try:
                    await asyncio.wait_for(
                        self._committed.wait_for(self._advanced_past(position)),
                        idle_s,
                    )
                except TimeoutError:
                    pass
            if self.committed_offset == position:
                yield pb.MetadataBatch(high_offset=self.committed_offset)


def run_controller(config: ControllerConfig, port_file: str | None = None) -> int:
    """Run a controller process until SIGTERM/SIGINT; returns the exit status."""
    from minibroker.client.common.runtime import run

    async def amain(stop: asyncio.Event) -> int:
        app = ControllerApp(config, port_file=port_file)
        return await app.run(stop)

    return run(amain)


__all__ = ["ControllerApp", "ControllerStopped", "run_controller"]
