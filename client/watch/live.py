"""The I/O loop of `minibroker watch`: polls the cluster, follows the metadata log, redraws.

Does network I/O (grpc.aio), reads files (the local launcher's `cluster.json` and `faults.json`,
`/proc/<pid>/stat` and `cmdline`) and writes to the terminal (rich). Event-loop thread
only; the `WatchModel` it feeds is owned by this loop.

Three activities share the model:
- `follow_metadata`: a `WatchMetadata` stream from the model's next offset; when it breaks (the
  controller died or restarted) it reconnects from where it stopped, and a snapshot replaces the
  image when the controller's log no longer has that offset.
- `poll`: every `poll_interval_s`, with `rpc_timeout_s` deadlines, `DescribeQuorum` on every known
  controller (the voters in cluster.json, the ones the leader names, the one brokers name) to
  learn the active controller, then `DescribeCluster` on it and `DescribeReplicas` on every
  known broker at once (replica states, and each
  replica's truncation count and last truncation); a failed call marks that process unreachable
  in the model instead of stopping anything. For a local cluster it also reads process states.
- the render loop redraws a few times a second.

Nothing here raises on an unreachable process: what cannot be reached is shown as such.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from rich.console import Console
from rich.live import Live

from minibroker.client.common.clock import wall_clock_ms
from minibroker.client.common.tls import TlsSettings, aio_channel
from minibroker.client.transport import CHANNEL_OPTIONS, parse_bootstrap
from minibroker.client.watch.model import WatchModel
from minibroker.client.watch.observations import (
    CONTROLLER,
    BrokerAddress,
    CleanerRunReport,
    ClusterInfo,
    FaultsInfo,
    FollowerReport,
    ProcessInfo,
    QuorumAnswer,
    ReplicaReport,
    TruncationReport,
    faults_from_json,
    merge_quorum_answers,
)
from minibroker.client.watch.render import render
from minibroker.metadata.wire import batch_from_pb
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

CLUSTER_FILE = "cluster.json"
FAULTS_FILE = "faults.json"  # the launcher's network faults (deploy/netfaults.py)
RECONNECT_DELAY_S = 0.25
GROUPS_POLL_MS = 2_000


@dataclass(frozen=True, slots=True)
class WatchOptions:
    bootstrap: tuple[str, ...]
    topic: str | None = None
    cluster_dir: str | None = None  # the local launcher's directory holding cluster.json
    poll_interval_s: float = 0.25
    rpc_timeout_s: float = 1.0
    refresh_per_second: float = 4.0
    tls: TlsSettings | None = None  # the cluster's client TLS (--command-config); None: plaintext


# -- wire: protobuf answers -> model types ------------------------------------------------------


def truncation_from_pb(r: pb.ReplicaDescription) -> TruncationReport | None:
    if not r.HasField("last_truncation"):
        return None
    t = r.last_truncation
    return TruncationReport(
        t.timestamp_ms, t.from_offset, t.to_offset, t.fully, t.reason, t.leader_epoch
    )


def cleaner_run_from_pb(r: pb.ReplicaDescription) -> CleanerRunReport | None:
    if not r.HasField("last_cleaner_run"):
        return None
    c = r.last_cleaner_run
    return CleanerRunReport(
        c.timestamp_ms,
        c.outcome,
        c.first_dirty_offset,
        c.end_offset,
        c.bytes_read,
        c.bytes_written,
        c.records_read,
        c.records_written,
        c.elapsed_ms,
        c.error,
    )


def replica_reports_from_pb(msg: pb.DescribeReplicasResponse) -> list[ReplicaReport]:
    return [
        ReplicaReport(
            topic=r.topic,
            partition=r.partition,
            is_leader=r.is_leader,
            leader_id=r.leader_id,
            leader_epoch=r.leader_epoch,
            partition_epoch=r.partition_epoch,
            log_start_offset=r.log_start_offset,
            leo=r.log_end_offset,
            high_watermark=r.high_watermark,
            isr=tuple(r.isr),
            maximal_isr=tuple(r.maximal_isr),
            followers=tuple(
                FollowerReport(f.replica_id, f.log_end_offset, f.last_caught_up_time_ms)
                for f in r.followers
            ),
            size_bytes=r.size_bytes,
            truncations=r.truncations,
            last_truncation=truncation_from_pb(r),
            cleaner_runs=r.cleaner_runs,
            last_cleaner_run=cleaner_run_from_pb(r),
        )
        for r in msg.replicas
    ]


def cluster_info_from_pb(msg: pb.DescribeClusterResponse) -> ClusterInfo:
    return ClusterInfo(
        cluster_id=msg.cluster_id,
        controller_id=msg.controller_id,
        metadata_offset=msg.metadata_offset,
        heartbeat_ms_ago={b.broker_id: b.last_heartbeat_ms_ago for b in msg.brokers},
    )


def quorum_answer_from_pb(msg: pb.DescribeQuorumResponse) -> QuorumAnswer:
    return QuorumAnswer(
        node_id=msg.node_id,
        role=msg.role,
        leader_id=msg.leader_id,
        leader_epoch=msg.leader_epoch,
        leader_address=msg.leader_address,
        high_watermark=msg.high_watermark,
        why_no_leader=msg.why_no_leader,
    )


def rpc_error_text(err: BaseException) -> str:
    if isinstance(err, grpc.aio.AioRpcError):
        return err.code().name
    if isinstance(err, TimeoutError):
        return "DEADLINE_EXCEEDED"
    return type(err).__name__


# -- the local launcher's files -----------------------------------------------------------------


def read_cluster_file(cluster_dir: str) -> dict[str, Any] | None:
    """The launcher's cluster.json (plain JSON, see deploy/cluster.py), or None."""
    try:
        data = json.loads((pathlib.Path(cluster_dir) / CLUSTER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_faults_file(cluster_dir: str) -> FaultsInfo | None:
    """The launcher's faults.json: no file is no fault (`FaultsInfo()`); None when it cannot be
    read as a fault table (hand-edited: the processes keep their last table, so does `watch`).
    The launcher replaces it atomically: a half-written file is never seen."""
    try:
        text = (pathlib.Path(cluster_dir) / FAULTS_FILE).read_text()
    except FileNotFoundError:
        return FaultsInfo()
    except OSError:
        return None
    try:
        return faults_from_json(json.loads(text))
    except ValueError:
        return None


def local_process_state(pid: int, data_dir: str) -> str:
    """running / paused / stopped, the way the launcher judges it: a PID counts only while its
    command line still names the process's data dir (the kernel may have reused the PID)."""
    if pid <= 0:
        return "stopped"
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "stopped"
    # An empty command line is a process still inside exec (right after the launcher started
    # it, measured here in ~1 of 5 starts under load), not a PID reused by another program.
    if cmdline and data_dir and data_dir.encode() not in cmdline:
        return "stopped"
    # Field 3 of /proc/PID/stat, after the parenthesised command name.
    fields = stat.rsplit(")", 1)[-1].split()
    code = fields[0] if fields else "?"
    if code in ("T", "t"):
        return "paused"
    if code in ("Z", "X"):
        return "stopped"
    return "running"


# -- the watcher --------------------------------------------------------------------------------


class Watcher:
    """Feeds a `WatchModel` from a live cluster. Use as an async context manager (channels)."""

    def __init__(
        self,
        options: WatchOptions,
        model: WatchModel | None = None,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.options = options
        self.model = model or WatchModel()
        self._clock = clock
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._controller_address_fixed = False
        # The quorum's voters: from cluster.json, or as the leader's DescribeQuorum names them.
        self._voter_addresses: list[str] = []
        # Consumer groups: a client of their own (group calls over KafkaGroupCall), polled
        # every GROUPS_POLL_MS at most.
        self._group_admin: Any = None
        self._groups_polled_ms = -GROUPS_POLL_MS

    async def __aenter__(self) -> Watcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._group_admin is not None:
            await self._group_admin.cluster.close()
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = aio_channel(address, self.options.tls, options=CHANNEL_OPTIONS)
            self._channels[address] = channel
        return channel

    # -- discovery ------------------------------------------------------------------------------

    def _read_local(self) -> None:
        """cluster.json: broker addresses, the controller address and process states."""
        if self.options.cluster_dir is None:
            return
        data = read_cluster_file(self.options.cluster_dir)
        if data is None:
            return
        try:
            self._apply_local(data)
        except (TypeError, ValueError, AttributeError):
            # A hand-edited or half-migrated file: keep the last good view rather than stop.
            return
        faults = read_faults_file(self.options.cluster_dir)
        if faults is not None:
            self.model.observe_faults(faults, self._clock())

    def _apply_local(self, data: dict[str, Any]) -> None:
        controllers = data.get("controllers")
        if not isinstance(controllers, list) or not controllers:
            controllers = [data.get("controller")]
        controllers = [c for c in controllers if isinstance(c, dict)]
        controller_address = data.get("controller_address")
        if len(controllers) > 1:
            # A quorum: the active controller moves; DescribeQuorum on the voters finds it.
            self._voter_addresses = [f"{c['host']}:{c['port']}" for c in controllers]
            if not self.model.controller_address:
                self.model.controller_address = self._voter_addresses[0]
        elif isinstance(controller_address, str) and controller_address:
            self.model.controller_address = controller_address
            self._controller_address_fixed = True
        processes: dict[str, ProcessInfo] = {}
        addresses: dict[int, BrokerAddress] = {}
        for index, controller in enumerate(controllers, start=1):
            pid = int(controller.get("pid") or 0)
            state = local_process_state(pid, str(controller.get("data_dir") or ""))
            key = CONTROLLER if len(controllers) == 1 else f"{CONTROLLER}-{index}"
            processes[key] = ProcessInfo(state, pid)
        for broker in data.get("brokers") or []:
            if not isinstance(broker, dict) or "node_id" not in broker:
                continue
            node_id = int(broker["node_id"])
            pid = int(broker.get("pid") or 0)
            state = local_process_state(pid, str(broker.get("data_dir") or ""))
            processes[str(node_id)] = ProcessInfo(state, pid)
            addresses[node_id] = BrokerAddress(
                str(broker.get("host", "")), int(broker.get("port", 0)), str(broker.get("rack", ""))
            )
        self.model.note_broker_addresses(addresses)
        self.model.observe_processes(processes, self._clock())

    async def _discover_from_brokers(self) -> None:
        """Ask the bootstrap brokers (then any known broker) for the brokers and the controller's
        address; the first answer wins."""
        timeout = self.options.rpc_timeout_s
        addresses = list(self.options.bootstrap)
        for broker_id in self.model.broker_ids():
            known = self.model.broker_address(broker_id)
            if known is not None:
                addresses.append(f"{known.host}:{known.port}")
        failures = []
        for address in dict.fromkeys(addresses):
            stub = pb_grpc.BrokerServiceStub(self._channel(address))
            try:
                reply = await stub.Metadata(pb.MetadataRequest(all_topics=False), timeout=timeout)
            except (grpc.aio.AioRpcError, TimeoutError) as err:
                failures.append(f"{address} {rpc_error_text(err)}")
                continue
            self.model.discovery_error = ""
            self.model.note_broker_addresses(
                {b.node_id: BrokerAddress(b.host, b.port, b.rack) for b in reply.brokers}
            )
            if reply.controller_host and reply.controller_port > 0:
                self.model.controller_address = f"{reply.controller_host}:{reply.controller_port}"
            return
        self.model.discovery_error = "no broker answered Metadata: " + ", ".join(failures)

    # -- polling --------------------------------------------------------------------------------

    async def _describe_quorum(self, address: str) -> QuorumAnswer | str:
        """A voter's answer, or why there is none ("UNIMPLEMENTED": a controller from before the
        quorum)."""
        stub = pb_grpc.QuorumServiceStub(self._channel(address))
        try:
            reply = await stub.DescribeQuorum(
                pb.DescribeQuorumRequest(), timeout=self.options.rpc_timeout_s
            )
        except (grpc.aio.AioRpcError, TimeoutError) as err:
            return rpc_error_text(err)
        if reply.role == "leader":
            self._voter_addresses = list(
                dict.fromkeys([*self._voter_addresses, *(v.address for v in reply.voters)])
            )
        return quorum_answer_from_pb(reply)

    async def _poll_quorum(self) -> None:
        """Ask every known voter who leads; point the controller address at the leader."""
        addresses = list(dict.fromkeys([*self._voter_addresses, self.model.controller_address]))
        addresses = [a for a in addresses if a]
        if not addresses:
            return
        results = await asyncio.gather(*(self._describe_quorum(a) for a in addresses))
        answers = [r for r in results if isinstance(r, QuorumAnswer)]
        if not answers and all(r == "UNIMPLEMENTED" for r in results):
            # A single controller from before the quorum: it is the active one.
            self.model.observe_quorum(self._clock(), None)
            return
        asked = max(len(self._voter_addresses), len(addresses))
        info = merge_quorum_answers(answers, asked)
        self.model.observe_quorum(self._clock(), info)
        if info is not None and info.leader_address and not self._controller_address_fixed:
            self.model.controller_address = info.leader_address

    async def _poll_controller(self) -> None:
        address = self.model.controller_address
        if not address:
            return
        stub = pb_grpc.ControllerServiceStub(self._channel(address))
        try:
            reply = await stub.DescribeCluster(
                pb.DescribeClusterRequest(), timeout=self.options.rpc_timeout_s
            )
        except (grpc.aio.AioRpcError, TimeoutError) as err:
            self.model.observe_controller(self._clock(), error=rpc_error_text(err))
            return
        self.model.observe_controller(self._clock(), cluster=cluster_info_from_pb(reply))
        self.model.note_broker_addresses(
            {
                b.broker_id: BrokerAddress(b.host, b.port, b.rack)
                for b in reply.brokers
                if b.broker_id not in self.model.addresses
            }
        )

    async def _poll_broker(self, broker_id: int) -> None:
        address = self.model.broker_address(broker_id)
        if address is None:
            return
        stub = pb_grpc.BrokerServiceStub(self._channel(f"{address.host}:{address.port}"))
        topics = [self.options.topic] if self.options.topic else []
        try:
            reply = await stub.DescribeReplicas(
                pb.DescribeReplicasRequest(topics=topics), timeout=self.options.rpc_timeout_s
            )
        except (grpc.aio.AioRpcError, TimeoutError) as err:
            self.model.observe_broker_failure(broker_id, rpc_error_text(err), self._clock())
            return
        if reply.broker_id != broker_id:
            # Another broker now listens at this address: its replicas are not this broker's.
            self.model.observe_broker_failure(
                broker_id, f"broker {reply.broker_id} answers at its address", self._clock()
            )
            return
        self.model.observe_broker_replicas(broker_id, replica_reports_from_pb(reply), self._clock())

    async def poll_once(self) -> None:
        """One round: local files, discovery when needed, the controller and every broker."""
        self._read_local()
        controller_lost = not self.model.controller_address or (
            not self._controller_address_fixed and self.model.controller.reachable is False
        )
        if controller_lost or not self.model.broker_ids():
            # A broker's Metadata answer names the controller, which may have moved.
            await self._discover_from_brokers()
        await self._poll_quorum()
        await asyncio.gather(
            self._poll_controller(),
            self._poll_groups(),
            *(self._poll_broker(b) for b in self.model.broker_ids()),
        )

    async def _poll_groups(self) -> None:
        """ListGroups, DescribeGroups and OffsetFetch of every group; a failure keeps the last
        view (groups are not what watch is for when the cluster is in trouble)."""
        now = self._clock()
        if now - self._groups_polled_ms < GROUPS_POLL_MS:
            return
        self._groups_polled_ms = now
        from minibroker.client.errors import MiniBrokerError
        from minibroker.client.groups.admin import GroupAdmin
        from minibroker.client.transport import ClusterClient
        from minibroker.client.wire import CallFailed

        if self._group_admin is None:
            timeout_ms = int(self.options.rpc_timeout_s * 1000)
            cluster = ClusterClient(
                list(self.options.bootstrap), request_timeout_ms=timeout_ms, tls=self.options.tls
            )
            self._group_admin = GroupAdmin(
                cluster,
                request_timeout_ms=timeout_ms,
                retry_backoff_ms=100,
                default_api_timeout_ms=2 * timeout_ms,
            )
        admin = self._group_admin
        try:
            listed = await admin.list_groups()
            ids = [g.group_id for g in listed]
            described = await admin.describe_groups(ids) if ids else {}
            offsets = {}
            for g in ids:
                committed = await admin.list_group_offsets(g)
                offsets[g] = {(tp.topic, tp.partition): c.offset for tp, c in committed.items()}
        except (MiniBrokerError, CallFailed, ValueError):
            return
        self.model.observe_groups(
            {
                g: (d.state, len(d.members), d.protocol)
                for g, d in described.items()
                if d.state != "Dead"
            },
            offsets,
        )

    async def poll(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.poll_once()
            await _wait(stop, self.options.poll_interval_s)

    # -- metadata -------------------------------------------------------------------------------

    def _apply(self, msg: pb.MetadataBatch) -> None:
        decoded = batch_from_pb(msg)
        if decoded.is_snapshot:
            self.model.apply_snapshot(decoded.records, decoded.snapshot_offset, self._clock())
        else:
            self.model.apply_entries(decoded.entries, decoded.high_offset)

    async def follow_metadata(self, stop: asyncio.Event) -> None:
        """Follow the controller's metadata log until `stop`, reconnecting after failures."""
        while not stop.is_set():
            address = self.model.controller_address
            if not address:
                await _wait(stop, RECONNECT_DELAY_S)
                continue
            stub = pb_grpc.ControllerServiceStub(self._channel(address))
            call = stub.WatchMetadata(
                pb.WatchMetadataRequest(from_offset=self.model.image.next_offset, broker_id=-1)
            )
            try:
                async for msg in call:
                    self._apply(msg)
                    if stop.is_set():
                        break
            except grpc.aio.AioRpcError as err:
                # DescribeCluster polling reports reachability; here only reconnect.
                if err.code() == grpc.StatusCode.CANCELLED and stop.is_set():
                    return
            finally:
                call.cancel()
            await _wait(stop, RECONNECT_DELAY_S)

    async def catch_up_metadata(self, timeout_s: float) -> bool:
        """Read the metadata log up to the controller's current offset (as DescribeCluster last
        said); False when the controller did not get us there within `timeout_s`."""
        target = self.model.cluster.metadata_offset if self.model.cluster else -1
        address = self.model.controller_address
        if target < 0 or not address:
            return False
        if self.model.image.next_offset >= target:
            return True
        stub = pb_grpc.ControllerServiceStub(self._channel(address))
        call = stub.WatchMetadata(
            pb.WatchMetadataRequest(from_offset=self.model.image.next_offset, broker_id=-1),
            timeout=timeout_s,
        )
        try:
            async for msg in call:
                self._apply(msg)
                if self.model.image.next_offset >= target:
                    return True
        except grpc.aio.AioRpcError:
            return False
        finally:
            call.cancel()
        return self.model.image.next_offset >= target

    # -- the two ways to run --------------------------------------------------------------------

    def frame(self, event_rows: int = 15, max_partition_rows: int | None = None) -> Any:
        return render(
            self.model,
            self._clock(),
            topic=self.options.topic,
            event_rows=event_rows,
            max_partition_rows=max_partition_rows,
        )

    async def run_once(self, console: Console, timeout_s: float = 5.0) -> bool:
        """Gather one consistent picture and print one frame; True if anything answered."""
        await self.poll_once()
        if await self.catch_up_metadata(timeout_s):
            # Partitions the image just brought in name leaders whose reports we want too.
            await self.poll_once()
        console.print(self.frame(event_rows=30))
        reached = self.model.controller.reachable or any(
            p.reach.reachable for p in self.model.brokers.values()
        )
        return bool(reached)

    async def run_live(self, console: Console, stop: asyncio.Event) -> None:
        """Redraw until `stop`; the polling and metadata tasks live exactly as long."""
        tasks = [
            asyncio.create_task(self.poll(stop), name="watch-poll"),
            asyncio.create_task(self.follow_metadata(stop), name="watch-metadata"),
        ]
        try:
            with Live(
                console=console,
                auto_refresh=False,
                transient=False,
                redirect_stdout=False,
                redirect_stderr=False,
            ) as live:
                while not stop.is_set():
                    for task in tasks:
                        if task.done() and task.exception() is not None:
                            raise task.exception()  # type: ignore[misc]
                    live.update(self._sized_frame(console), refresh=True)
                    await _wait(stop, 1.0 / self.options.refresh_per_second)
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await task

    def _sized_frame(self, console: Console) -> Any:
        """A frame that fits the terminal: the timeline and healthy partitions give way first."""
        height = console.size.height
        event_rows = max(5, min(15, height // 4))
        broker_lines = len(self.model.broker_ids()) + 4
        fixed = 3 + broker_lines + event_rows + 2 + 5
        return self.frame(event_rows=event_rows, max_partition_rows=max(3, height - fixed))


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def watch(
    options: WatchOptions,
    console: Console,
    once: bool,
    stop: asyncio.Event | None = None,
) -> int:
    """The `minibroker watch` command body; returns the exit status."""
    async with Watcher(options) as watcher:
        if once:
            return 0 if await watcher.run_once(console) else 1
        await watcher.run_live(console, stop or asyncio.Event())
        return 0


def options_for(
    bootstrap: str, topic: str | None, cluster_dir: str | None, tls: TlsSettings | None = None
) -> WatchOptions:
    return WatchOptions(
        bootstrap=tuple(parse_bootstrap(bootstrap)), topic=topic, cluster_dir=cluster_dir, tls=tls
    )


__all__ = [
    "WatchOptions",
    "Watcher",
    "cleaner_run_from_pb",
    "cluster_info_from_pb",
    "local_process_state",
    "options_for",
    "quorum_answer_from_pb",
    "read_cluster_file",
    "read_faults_file",
    "replica_reports_from_pb",
    "truncation_from_pb",
    "watch",
]
