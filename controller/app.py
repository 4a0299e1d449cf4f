"""The controller process's composition root: data dir, quorum, core, gRPC server, timers.

I/O shell, event-loop thread only (log writes run in a worker thread, one at a time, through the
quorum shell). Every controller is one voter of the metadata quorum (`controller/quorum/`,
docs/design.md §6.1); the quorum's leader is the ACTIVE controller once the LeaderChange record
of its epoch is committed. Only the active controller has a `ControllerCore`, built from the
committed image at that moment; every other controller answers ControllerService calls with
NOT_CONTROLLER and a hint of who leads.

Concurrency contract: ONE command task owns the core. Every RPC, timer tick and stream-close
notice is a command put on a bounded queue; the task runs it against the core, appends the
resulting records to the quorum log (fsync), and parks the callers until the quorum's high
watermark passes them; only then are the records streamed to metadata watchers, the events
logged and the callers answered (persist and commit before send). Every voter applies committed
records to its `committed_image` in offset order; watchers and DescribeCluster only ever see
committed state. Losing the leadership fails every parked caller with NOT_CONTROLLER and drops
the core (its image may hold records that will never commit).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import pathlib
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from minibroker.client.common import metrics as common_metrics
from minibroker.client.common import runtime
from minibroker.client.common.grpc_limits import LimitsInterceptor, RequestBudget
from minibroker.client.common.log import get_logger
from minibroker.client.common.netfaults import NetFaults, server_interceptors
from minibroker.client.common.sasl import SaslVerifier
from minibroker.client.common.scram import ScramCredential
from minibroker.client.common.security import server_security
from minibroker.client.common.tls import add_port
from minibroker.controller.config import ControllerConfig, normalised_voters
from minibroker.controller.core.controller import ControllerCore
from minibroker.controller.core.messages import Event, Outcome
from minibroker.controller.journal import _CLUSTER_ID, DataDir, JournalError, write_atomically
from minibroker.controller.metrics import ControllerMetrics
from minibroker.controller.quorum.messages import Event as QuorumEvent
from minibroker.controller.quorum.messages import (
    OffsetAndEpoch,
    QuorumState,
    Role,
    RoleChanged,
    VoterAddress,
)
from minibroker.controller.quorum.raft_log import RaftLog
from minibroker.controller.quorum.shell import (
    LeaderHint,
    NotController,
    NotLeader,
    QuorumShell,
    now_ms,
)
from minibroker.controller.service import ControllerServicer, QuorumServicer
from minibroker.metadata.acl import AclBinding, ResourceType
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import LogEntry, MetadataRecord
from minibroker.metadata.wire import batch_to_pb, snapshot_to_pb
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

log = get_logger(__name__)

R = TypeVar("R")
Command = Callable[[ControllerCore, int], Outcome[Any]]

COMMAND_QUEUE_BOUND = 10_000
TICK_INTERVAL_S = 0.1
MAX_ENTRIES_PER_BATCH = 1000
_SENT_BATCHES_KEPT = 64
EVENTS_LOGGED_PER_PASS = 100
EVENTS_LOGGED_EACH = 100
GROUP_COMMIT_MAX = 256  # commands per fsync
ACTIVATION_WAIT_S = 2.0
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


@dataclass(slots=True)
class _Pending:
    """Commands whose records are on the local log, waiting for the HW to pass them."""

    wait_offset: int
    appended_s: float
    ran: list[tuple[asyncio.Future[Any] | None, Outcome[Any], BaseException | None]]


def _clone(image: MetadataImage) -> MetadataImage:
    copy = MetadataImage()
    copy.replace_with_snapshot(image.to_records(), image.next_offset)
    return copy


class ControllerApp:
    def __init__(self, config: ControllerConfig, *, port_file: str | None = None) -> None:
        self.config = config
        self.port_file = port_file
        self.data_dir = DataDir(config["metadata.log.dir"])
        self.raft_log = RaftLog(self.data_dir.path)
        self.quorum: QuorumShell | None = None
        # The active controller's core, built from the committed image once this voter leads
        # and its LeaderChange is committed; None on every other voter.
        self._core: ControllerCore | None = None
        self.active_epoch = -1
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
        self._pending: collections.deque[_Pending] = collections.deque()
        # Every voter applies committed records here, in offset order, exactly once.
        self.committed_image = MetadataImage()
        self.committed_offset = 0
        self._commit_event = asyncio.Event()
        # Committed entries kept in memory for watchers: [retained_start, committed_offset).
        self._retained: list[LogEntry] = []
        self._retained_start = 0
        # The batches last sent to watchers, by (first offset, high offset): every broker
        # watches, and all of them want the same batch after a commit, encoded once.
        self._sent_batches: dict[tuple[int, int], pb.MetadataBatch] = {}
        self._since_snapshot = 0
        self._snapshotting = False
        self._background: set[asyncio.Task[None]] = set()
        # Committed commands' events, logged a chunk per loop pass (`_log_events`).
        self._events_to_log: collections.deque[Event] = collections.deque()
        self._logging_events = False
        self._tasks: list[asyncio.Task[None]] = []
        self._server: grpc.aio.Server | None = None
        self._health = health.aio.HealthServicer()
        self._fatal_event = asyncio.Event()
        self.faults: NetFaults | None = None

    @property
    def core(self) -> ControllerCore:
        if self._core is None:
            raise self.not_controller("this controller is not active")
        return self._core

    def scram_credential(self, user: str, mechanism: int) -> ScramCredential | None:
        """`user`'s SCRAM credential for Kafka's mechanism number, from the committed image
        (every voter has one; an uncommitted change does not count yet): the lookup of this
        controller's SaslVerifier (client/common/sasl.py)."""
        return self.committed_image.scram_credential(user, mechanism)

    @property
    def active(self) -> bool:
        return self._core is not None

    def not_controller(self, why: str) -> NotController:
        hint = self.quorum.leader_hint() if self.quorum is not None else LeaderHint(-1, "", 0)
        return NotController(hint, why)

    # -- start and stop -----------------------------------------------------------------------

    def _cluster_id(self, voters: int) -> tuple[str, bool]:
        """The data dir's cluster id; `cluster.id` formats a fresh dir and must match an old one."""
        wanted = str(self.config["cluster.id"]).strip()
        node_id = self.config["node.id"]
        meta = self.data_dir.path / "meta.properties"
        fresh = not os.path.lexists(meta)
        if fresh and wanted:
            if _CLUSTER_ID.fullmatch(wanted) is None:
                raise JournalError(
                    f"cluster.id {wanted[:40]!r} is not a cluster id (1-64 letters, digits, "
                    "'-', '_', '.')"
                )
            if not any(self.data_dir.path.glob("metadata-*.log")):
                text = (
                    f"#minibroker controller\ncluster.id={wanted}\nnode.id={node_id}\nversion=1\n"
                )
                write_atomically(meta, text.encode())
        elif fresh and voters > 1:
            raise JournalError(
                f"a quorum of {voters} voters needs the same cluster.id on every voter to format "
                f"a fresh data dir ({self.data_dir.path}): pass --set cluster.id=ID (22 "
                'characters of URL-safe base64, e.g. from `python -c "import base64,uuid;'
                'print(base64.urlsafe_b64encode(uuid.uuid4().bytes).decode()[:22])"`)'
            )
        cluster_id, created = self.data_dir.load_or_create_cluster_id(node_id)
        if wanted and cluster_id != wanted:
            raise JournalError(
                f"data dir {self.data_dir.path} belongs to cluster {cluster_id}, but cluster.id "
                f"is {wanted}: this voter holds another cluster's metadata; remove the dir to "
                "join this cluster, or start it with its own cluster's settings"
            )
        return cluster_id, created or (fresh and bool(wanted))

    async def start(self) -> None:
        started = time.monotonic()
        runtime.log_open_file_limit(log)
        self.data_dir.lock()
        voters = self.config.quorum_voters()
        self.cluster_id, created = self._cluster_id(len(voters))
        loaded = await asyncio.to_thread(self.raft_log.load)
        image = MetadataImage()
        if loaded.snapshot_records is not None:
            image.replace_with_snapshot(loaded.snapshot_records, loaded.snapshot_id.offset)
        else:
            image.next_offset = self.raft_log.start_offset
        # Only the snapshot is known to be committed; the records after it are applied once
        # the quorum's high watermark passes them.
        self.committed_image = image
        self.committed_offset = image.next_offset
        self._retained = []
        self._retained_start = image.next_offset
        self.metrics.refresh(image, self.committed_offset)
        log.info(
            "metadata_loaded",
            cluster_id=self.cluster_id,
            cluster_id_created=created,
            snapshot_offset=self.raft_log.start_offset,
            log_end_offset=self.raft_log.end_offset,
            truncated_bytes=loaded.truncated_bytes,
            brokers=len(image.brokers),
            topics=len(image.topics_by_id),
            partitions=image.partition_count(),
            load_ms=round((time.monotonic() - started) * 1000, 1),
        )
        listener = self.config.listener
        host, port = listener.host, listener.port
        limits = self.config.limits
        interceptor = LimitsInterceptor(limits, RequestBudget(limits.queued_max_request_bytes))
        # The launcher's network faults (nothing installed unless it set network.faults.file).
        self.faults = NetFaults.from_config(self.config)
        if self.faults is not None:
            self.faults.start()
        server = grpc.aio.server(
            options=SERVER_OPTIONS + limits.grpc_options(),
            interceptors=server_interceptors(
                self.faults, *([interceptor] if interceptor.enabled else [])
            ),
        )
        # Who each call is from and what it may do (authorizer.class.name, super.users).
        # The ACLs of the committed image, looked up through `self` at each call: never the
        # core's image (uncommitted records, rebuilt at each change of leader).
        security = server_security(
            self.config.values,
            self.config.security_protocol,
            sasl=SaslVerifier(self.scram_credential).principal,
            acl_view=_CommittedAcls(self),
        )
        pb_grpc.add_ControllerServiceServicer_to_server(ControllerServicer(self, security), server)
        pb_grpc.add_QuorumServiceServicer_to_server(QuorumServicer(self, security), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        tls = self.config.tls
        self.port = add_port(server, listener.address, tls)
        if self.port == 0:
            raise OSError(f"cannot listen on {host}:{port}")
        if not str(self.config["controller.quorum.voters"]).strip():
            # A quorum of one, named by the port actually bound (--listen may say port 0).
            voters = (VoterAddress(self.config["node.id"], host, self.port),)
        self.quorum = QuorumShell(
            settings=self.config.quorum_settings(),
            voters=voters,
            cluster_id=self.cluster_id,
            raft_log=self.raft_log,
            listener=self,
            header_voters=normalised_voters(voters),
            faults=self.faults,
            tls=tls,
        )
        await self.quorum.start()
        self._tasks = [
            asyncio.create_task(self._command_loop(), name="controller-commands"),
            asyncio.create_task(self._tick_loop(), name="controller-ticks"),
        ]
        await server.start()
        self._server = server
        if self.config["metrics.port"] >= 0:
            self.metrics_port = common_metrics.serve(self.registry, self.config["metrics.port"])
        for service in ("", "minibroker.ControllerService", "minibroker.QuorumService"):
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
            voters=normalised_voters(voters),
        )

    async def stop(self) -> None:
        """Stop serving. A leader hands the quorum over first (EndQuorumEpoch). Stream ends
        caused by our own shutdown fence nobody."""
        self.stopping = True
        if self.quorum is not None:
            await self.quorum.resign()
        await self._health.enter_graceful_shutdown()
        self._deactivate("controller stopping")
        if self._server is not None:
            await self._server.stop(grace=0.5)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.quorum is not None:
            await self.quorum.stop()
        if self.faults is not None:
            self.faults.close()
        while not self._queue.empty():
            _, future = self._queue.get_nowait()
            if future is not None and not future.done():
                future.set_exception(ControllerStopped("controller stopped"))
        self.raft_log.close()
        self.data_dir.unlock()
        while self._events_to_log:
            event = self._events_to_log.popleft()
            log.info(event.name, **event.fields)
        log.info("controller_stopped", committed_offset=self.committed_offset)

    async def run(self, stop: asyncio.Event) -> int:
        await self.start()
        waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(self._fatal_event.wait())]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for w in waiters:
            w.cancel()
        await self.stop()
        return 1 if self.fatal is not None else 0

    # -- the quorum's news (QuorumListener; called with the quorum's lock held) -----------------

    def on_role_changed(self, change: RoleChanged) -> None:
        if self._core is not None and (
            change.role != Role.LEADER or change.epoch != self.active_epoch
        ):
            self._deactivate(
                f"quorum {change.role.value} at epoch {change.epoch} ({change.reason})"
            )
        self.metrics.quorum_role(change)

    def on_committed(self, entries: Sequence[LogEntry], high_watermark: int) -> None:
        image = self.committed_image
        for entry in entries:
            if entry.offset >= image.next_offset:
                image.apply(entry)
        self._retained.extend(e for e in entries if e.offset >= self.committed_offset)
        self.committed_offset = high_watermark
        self._since_snapshot += len(entries)
        self._answer_committed()
        self.metrics.refresh(image, self.committed_offset)
        self.metrics.quorum_offsets(high_watermark, self.raft_log.end_offset)
        quorum = self.quorum
        if (
            self._core is None
            and quorum is not None
            and quorum.role == Role.LEADER
            and 0 <= quorum.epoch_start_offset < high_watermark
            and not self.stopping
        ):
            self._activate(quorum.epoch)
        self._wake_watchers()
        if (
            self._since_snapshot >= self.config["metadata.snapshot.interval.records"]
            and not self._snapshotting
        ):
            self._snapshotting = True
            task = asyncio.get_running_loop().create_task(self._snapshot())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    def on_snapshot_installed(
        self, records: Sequence[MetadataRecord], snapshot_id: OffsetAndEpoch
    ) -> None:
        self.committed_image.replace_with_snapshot(records, snapshot_id.offset)
        self.committed_offset = snapshot_id.offset
        self._retained = []
        self._retained_start = snapshot_id.offset
        self._since_snapshot = 0
        self.metrics.refresh(self.committed_image, self.committed_offset)
        self._wake_watchers()

    def on_quorum_failed(self, error: BaseException) -> None:
        self._die(error)

    def on_quorum_state(self, state: QuorumState) -> None:
        self.metrics.quorum_state(state)

    def on_quorum_event(self, event: QuorumEvent) -> None:
        log.info(event.name, **event.fields)
        self.metrics.quorum_event(event)

    def _activate(self, epoch: int) -> None:
        image = _clone(self.committed_image)
        self._core = ControllerCore(
            self.config.settings(),
            self.cluster_id,
            random.Random(int.from_bytes(os.urandom(16), "big")),
            now_ms(),
            image,
        )
        self.active_epoch = epoch
        self.metrics.active_controller_count.set(1)
        log.info(
            "controller_activated",
            epoch=epoch,
            committed_offset=self.committed_offset,
            brokers=len(image.brokers),
            topics=len(image.topics_by_id),
        )

    def _deactivate(self, why: str) -> None:
        if self._core is None:
            return
        log.info("controller_deactivated", epoch=self.active_epoch, reason=why)
        self._core = None
        self.active_epoch = -1
        self.metrics.active_controller_count.set(0)
        error = self.not_controller(why)
        while self._pending:
            for future, _, _ in self._pending.popleft().ran:
                if future is not None and not future.done():
                    future.set_exception(error)
        self._wake_watchers()

    def _wake_watchers(self) -> None:
        self._commit_event.set()
        self._commit_event = asyncio.Event()

    # -- commands -----------------------------------------------------------------------------

    async def _wait_active(self) -> None:
        """While this voter leads but its LeaderChange is not committed yet, or while an
        election is under way (no leader known), wait up to ACTIVATION_WAIT_S instead of
        bouncing the caller: a quorum of one elects itself within milliseconds of starting, a
        new leader becomes active within a round trip. A voter that knows another leader
        answers NOT_CONTROLLER with that hint at once."""
        quorum = self.quorum
        node_id = self.config["node.id"]
        deadline = time.monotonic() + ACTIVATION_WAIT_S
        while (
            self._core is None
            and quorum is not None
            and quorum.leader_id in (-1, node_id)
            and not self.stopping
            and time.monotonic() < deadline
        ):
            event = self._commit_event
            try:
                await asyncio.wait_for(event.wait(), min(0.05, deadline - time.monotonic()))
            except TimeoutError:
                pass
        if self._core is None:
            raise self.not_controller(f"controller {node_id} is not active")

    async def submit(self, command: Callable[[ControllerCore, int], Outcome[R]]) -> R:
        """Run `command` on the active controller's core; returns its reply once its records
        (and every record before them) are committed by the quorum."""
        if self.fatal is not None:
            raise ControllerStopped("controller is stopping")
        if self.stopping:
            # Retriable for the caller: another voter takes over (EndQuorumEpoch was sent).
            raise self.not_controller("this controller is stopping")
        await self._wait_active()
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        await self._queue.put((command, future))
        return await future

    def submit_nowait(self, command: Command) -> None:
        """Queue a command nobody waits for (stream-close notices, ticks); dropped on a
        controller that is not active (a new one starts every broker's session afresh)."""
        if self.stopping or self.fatal is not None or self._core is None:
            return
        try:
            self._queue.put_nowait((command, None))
        except asyncio.QueueFull:
            log.error("command_queue_full", bound=COMMAND_QUEUE_BOUND)

    async def _command_loop(self) -> None:
        """Run queued commands in order on the active core. Group commit: every command
        already waiting runs too, their records go to the quorum log as one batch per command
        with one write and one fsync, and they wait together for the high watermark (no reply
        leaves before its records are committed). A later command may see an earlier one's
        records before they are committed; that is safe because none is answered or streamed
        before the HW passes it, and a lost leadership fails them all with NOT_CONTROLLER and
        drops the core that saw them."""
        while True:
            group = [await self._queue.get()]
            while len(group) < GROUP_COMMIT_MAX and not self._queue.empty():
                group.append(self._queue.get_nowait())
            core, epoch = self._core, self.active_epoch
            if core is None or self.quorum is None:
                error = self.not_controller("this controller is not active")
                for _, future in group:
                    if future is not None and not future.done():
                        future.set_exception(error)
                continue
            ran: list[tuple[asyncio.Future[Any] | None, Outcome[Any], BaseException | None]] = []
            for command, future in group:
                if future is not None and future.done():
                    continue  # the caller went away before it ran; nothing happened yet
                error2: BaseException | None = None
                try:
                    outcome = command(core, now_ms())
                except Exception as err:
                    # A bug in the core. Whatever it had already applied must still reach
                    # the log, so that the log and the image never disagree.
                    log.exception("controller_command_failed")
                    error2 = err
                    outcome = core.take_pending()
                ran.append((future, outcome, error2))
            frames = [outcome.entries for _, outcome, _ in ran if outcome.entries]
            if frames:
                try:
                    await self.quorum.append_as_leader(epoch, frames)
                except NotLeader as err:
                    # The core already applied these records: it must go, with them. (A voter
                    # that still leads then stays inactive until its next election: it resigns
                    # on its own if nothing commits.)
                    if self._core is core:
                        self._deactivate(str(err))
                    self._fail(ran, self.not_controller(str(err)))
                    continue
                except BaseException as err:
                    self._die(err)
                    for future, _, _ in ran:
                        if future is not None and not future.done():
                            future.set_exception(ControllerStopped("metadata log failed"))
                    return
            if self._core is not core:
                # Deactivated while appending: these records may never commit.
                self._fail(ran, self.not_controller("the leadership was lost"))
                continue
            self._pending.append(_Pending(core.image.next_offset, time.monotonic(), ran))
            self._answer_committed()

    def _log_events(self, events: Sequence[Event]) -> None:
        """Log one command's committed events in order, at most EVENTS_LOGGED_PER_PASS per pass
        of the event loop, and at most EVENTS_LOGGED_EACH of each name, then one
        `events_summarized` line with the count: a broker's death elects a new leader for
        each partition it led and shrinks the ISR of each it followed, thousands of lines that
        cost more than the election (the metadata log and `watch` keep every change)."""
        self._events_to_log.extend(events_to_log(events, EVENTS_LOGGED_EACH))
        if not self._logging_events:
            self._logging_events = True
            asyncio.get_running_loop().call_soon(self._log_some_events)

    def _log_some_events(self) -> None:
        queue = self._events_to_log
        for _ in range(min(len(queue), EVENTS_LOGGED_PER_PASS)):
            event = queue.popleft()
            log.info(event.name, **event.fields)
        if queue:
            asyncio.get_running_loop().call_soon(self._log_some_events)
        else:
            self._logging_events = False

    @staticmethod
    def _fail(
        ran: list[tuple[asyncio.Future[Any] | None, Outcome[Any], BaseException | None]],
        error: BaseException,
    ) -> None:
        for future, _, _ in ran:
            if future is not None and not future.done():
                future.set_exception(error)

    def _answer_committed(self) -> None:
        """Answer, in order, every command whose records are below the high watermark."""
        while self._pending and self._pending[0].wait_offset <= self.committed_offset:
            pending = self._pending.popleft()
            if any(outcome.entries for _, outcome, _ in pending.ran):
                self.metrics.commit_latency((time.monotonic() - pending.appended_s) * 1000)
            events = [event for _, outcome, _ in pending.ran for event in outcome.events]
            if events:
                self.metrics.count(events)
                self._log_events(events)
            for future, outcome, error in pending.ran:
                if future is None or future.done():
                    continue
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(outcome.reply)

    def _die(self, err: BaseException) -> None:
        log.error("metadata_journal_failed", error=repr(err))
        self.fatal = err
        self._fatal_event.set()

    async def _snapshot(self) -> None:
        try:
            image = self.committed_image
            records = image.to_records()
            offset = image.next_offset
            started = time.monotonic()
            if self.quorum is None:
                return
            try:
                await self.quorum.write_snapshot(records, offset)
            except BaseException as err:
                self._die(err)
                return
            self._since_snapshot = max(0, self.committed_offset - offset)
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
        finally:
            self._snapshotting = False

    async def _tick_loop(self) -> None:
        interval = min(TICK_INTERVAL_S, self.config["broker.session.timeout.ms"] / 10_000)
        while True:
            await asyncio.sleep(interval)
            self.submit_nowait(lambda core, now: core.tick(now))

    # -- metadata watchers --------------------------------------------------------------------

    def _committed_image_batch(self) -> pb.MetadataBatch:
        """A snapshot batch of the committed image."""
        return self._encoded(
            -1,
            lambda: snapshot_to_pb(self.committed_image.to_records(), self.committed_offset),
        )

    def _encoded(self, first: int, encode: Callable[[], pb.MetadataBatch]) -> pb.MetadataBatch:
        """The batch from `first` (-1: the image) at the current commit, encoded once for every
        watcher that asks for it (the messages are never changed after)."""
        key = (first, self.committed_offset)
        batch = self._sent_batches.get(key)
        if batch is None:
            if len(self._sent_batches) >= _SENT_BATCHES_KEPT:
                self._sent_batches.clear()
            batch = self._sent_batches[key] = encode()
        return batch

    async def watch(self, from_offset: int) -> AsyncIterator[pb.MetadataBatch]:
        """Committed metadata from `from_offset` on, while this controller is active: a
        snapshot first when the log no longer holds that offset, then every new batch, and an
        empty keep-alive batch with the high offset after `metadata.max.idle.interval.ms` of
        quiet. Ends with NotController when this controller stops being the active one."""
        await self._wait_active()
        epoch = self.active_epoch
        idle_s = self.config["metadata.max.idle.interval.ms"] / 1000
        position = from_offset
        while True:
            if self.active_epoch != epoch or self._core is None:
                raise self.not_controller("this controller is no longer active")
            if position < self._retained_start or position > self.committed_offset:
                batch = self._committed_image_batch()
                position = batch.snapshot_offset
                yield batch
                continue
            if position < self.committed_offset:
                start = position - self._retained_start
                entries = self._retained[start : start + MAX_ENTRIES_PER_BATCH]
                live = self._encoded(
                    position, functools.partial(batch_to_pb, entries, self.committed_offset)
                )
                position = entries[-1].offset + 1
                yield live
                continue
            event = self._commit_event
            try:
                await asyncio.wait_for(event.wait(), idle_s)
            except TimeoutError:
                pass
            if self.committed_offset == position and self.active_epoch == epoch:
                yield pb.MetadataBatch(high_offset=self.committed_offset)


def events_to_log(events: Sequence[Event], each: int) -> list[Event]:
    """The first `each` events of every name, in order, then an `events_summarized` event for
    each name that had more (its total and how many were left out)."""
    counts: dict[str, int] = {}
    out: list[Event] = []
    for event in events:
        seen = counts[event.name] = counts.get(event.name, 0) + 1
        if seen <= each:
            out.append(event)
    for name, count in counts.items():
        if count > each:
            fields = {"name": name, "total": count, "not_logged": count - each}
            out.append(Event("events_summarized", fields))
    return out


def run_controller(config: ControllerConfig, port_file: str | None = None) -> int:
    """Run a controller process until SIGTERM/SIGINT; returns the exit status."""
    from minibroker.client.common.runtime import run

    async def amain(stop: asyncio.Event) -> int:
        app = ControllerApp(config, port_file=port_file)
        return await app.run(stop)

    return run(amain)


__all__ = ["ControllerApp", "ControllerStopped", "NotController", "run_controller"]


class _CommittedAcls:
    """The authorizer's view of the ACLs: the committed image's, whichever image object that is."""

    def __init__(self, app: ControllerApp) -> None:
        self._app = app

    def matching(self, resource_type: ResourceType, name: str) -> Iterable[AclBinding]:
        return self._app.committed_image.acls.matching(resource_type, name)
