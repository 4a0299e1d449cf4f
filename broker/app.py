"""The broker's composition root: open the data dir and logs, serve gRPC, join the cluster.

I/O shell, event-loop thread only. Start-up order: lock the data dir and recover the logs (before
anything can read them), bind the gRPC port, register with the controller (the broker epoch and
cluster id come back), then follow the metadata log and heartbeat. SIGTERM is a controlled
shutdown (docs/protocol.md §16): ask the controller to move our leaderships away, wait until it
says we may go, stop serving, stop the log cleaner's threads (broker/cleaner/manager.py), flush
and checkpoint every log, and leave the clean-shutdown marker.

A data dir that fails while running (out of space, an I/O error) halts the broker, as Kafka halts
when its last log dir fails: the replica manager stops serving at once, the failure is reported
to the controller in a heartbeat (it fences us and moves our leaderships to in-sync replicas),
and the process exits with status 1 and a one-line error, without writing to the dir again
(no flush, no checkpoints, no clean-shutdown marker: the next start recovers the logs). A data
dir that cannot be used at start-up is a one-line error and status 1 too, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import sys
import time
from collections.abc import Awaitable
from typing import TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from minibroker.broker.config import BrokerConfig
from minibroker.broker.controller_link import ControllerLink, FatalRegistrationError
from minibroker.broker.groups.coordinator import GroupConfig, GroupCoordinator
from minibroker.broker.kafka.handlers import KafkaHandlers
from minibroker.broker.kafka.server import start_listener as start_kafka_listener
from minibroker.broker.metrics import BrokerMetrics
from minibroker.broker.replicas.manager import ReplicaManager
from minibroker.broker.service import BrokerServicer
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.data_dir import DataDir
from minibroker.broker.storage.errors import DataDirError, disk_error_advice, is_log_dir_failure
from minibroker.broker.storage.log_manager import LogManager
from minibroker.client.common import log as logconf
from minibroker.client.common import metrics as metrics_server
from minibroker.client.common import runtime
from minibroker.client.common.grpc_limits import LimitsInterceptor, RequestBudget
from minibroker.client.common.limits import ServerLimits
from minibroker.client.common.netfaults import NetFaults, server_interceptors
from minibroker.client.common.sasl import SaslVerifier
from minibroker.client.common.security import server_security
from minibroker.client.common.tls import add_port
from minibroker.client.errors import MiniBrokerError
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

T = TypeVar("T")

# Fetch responses are bounded by the fetch's own max bytes; requests by socket.request.max.bytes.
SERVER_OPTIONS = [
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 1000),
]
CONTROLLED_SHUTDOWN_TIMEOUT_S = 30.0


def server_options(limits: ServerLimits) -> list[tuple[str, int]]:
    return SERVER_OPTIONS + limits.grpc_options()


def main(
    config: BrokerConfig, *, port_file: str | None = None, log_format: str | None = None
) -> int:
    logconf.configure(
        "broker", node_id=config.node_id, json=None if log_format is None else log_format == "json"
    )
    return runtime.run(lambda stop: run(config, stop, port_file=port_file))


async def run(config: BrokerConfig, stop: asyncio.Event, *, port_file: str | None = None) -> int:
    log = logconf.get_logger("minibroker.broker")
    runtime.log_open_file_limit(log)
    try:
        data_dir = DataDir.open(config.data_dir, config.node_id)
    except (DataDirError, MiniBrokerError) as err:
        log.error("data_dir_unusable", error=str(err))
        _print_error(str(err))
        return 1
    started = time.monotonic()
    try:
        log_manager = LogManager.open(
            data_dir, LogConfig.from_configs(defaults=config.topic_defaults)
        )
    except (DataDirError, MiniBrokerError, OSError) as err:
        log.error("log_recovery_failed", error=str(err))
        _print_error(_load_failure(data_dir, err))
        data_dir.close()
        return 1
    log.info(
        "logs_loaded",
        partitions=len(log_manager.logs),
        clean_shutdown=data_dir.had_clean_shutdown,
        seconds=round(time.monotonic() - started, 3),
    )

    metrics = BrokerMetrics()
    metrics_port = -1
    if config["metrics.port"] >= 0:
        metrics_port = metrics_server.serve(metrics.registry, config["metrics.port"])

    # The launcher's network faults (nothing installed unless it set network.faults.file).
    faults = NetFaults.from_config(config)
    if faults is not None:
        faults.start()
    # The listener's TLS (None: PLAINTEXT), also used on the broker's channels to the controllers
    # and to the leaders it follows (build_config read the files once already).
    tls = config.tls
    rm = ReplicaManager(config, log_manager, metrics, config.controller, faults, tls)
    metrics.acls_total.set_function(lambda: len(rm.image.acls))
    metrics.refresh_on_scrape(asyncio.get_running_loop(), rm.background.update_replica_gauges)
    try:
        rm.load_existing_logs()
    except Exception as err:
        if not is_log_dir_failure(err):
            raise
        log.error("log_load_failed", error=str(err))
        _print_error(_load_failure(data_dir, err))
        data_dir.close()  # the logs stay unflushed: the process exits, the next start recovers
        return 1

    # The log cleaner's threads (none with log.cleaner.enable=false or log.cleaner.threads=0):
    # they clean the hosted compacted logs, asking this loop for every look at a log.
    rm.cleaner.start(asyncio.get_running_loop())

    limits = config.limits
    budget = RequestBudget(limits.queued_max_request_bytes)
    interceptor = LimitsInterceptor(limits, budget)
    server = grpc.aio.server(
        options=server_options(limits),
        interceptors=server_interceptors(faults, *([interceptor] if interceptor.enabled else [])),
    )
    host, port = config.listen
    bound = add_port(server, config.listener.address, tls)
    if bound == 0:
        log.error("listen_failed", address=f"{host}:{port}")
        _print_error(f"cannot listen on {host}:{port}")
        await rm.cleaner.stop()
        log_manager.close()
        data_dir.close()
        return 1
    advertised = config.advertised(bound)
    # Kafka's protocol on its own port (kafka.listeners; broker/kafka/server.py), registered
    # with the controller so that Kafka clients' Metadata answers give its address. The same
    # handlers serve the group APIs to minibroker's own client (BrokerService.KafkaGroupCall).
    # The group coordinator (broker/groups/): it follows the leaderships of __consumer_offsets.
    coordinator = GroupCoordinator(rm, GroupConfig.from_config(config.values))
    kafka_handlers = KafkaHandlers(rm, coordinator)
    try:
        kafka, kafka_host, kafka_port = await start_kafka_listener(
            config, rm, kafka_handlers, budget
        )
    except OSError as err:
        log.error("kafka_listen_failed", address=config["kafka.listeners"], error=str(err))
        _print_error(f"cannot listen on {config['kafka.listeners']}: {err}")
        await rm.cleaner.stop()
        log_manager.close()
        data_dir.close()
        return 1
    link = ControllerLink(
        controllers=config.controllers,
        broker_id=config.node_id,
        # The address registered, which Metadata answers give clients and other brokers.
        host=f"[{advertised.host}]" if ":" in advertised.host else advertised.host,
        port=advertised.port,
        rack=config.rack,
        metrics_port=metrics_port,
        cluster_id=data_dir.cluster_id or "",
        previous_broker_epoch=data_dir.previous_broker_epoch,
        heartbeat_interval_ms=config["broker.heartbeat.interval.ms"],
        on_metadata=rm.apply_metadata_batch,
        metadata_offset=rm.metadata_offset,
        applied_offset=rm.applied_metadata_offset,
        faults=faults,
        tls=tls,
        kafka_host=kafka_host,
        kafka_port=kafka_port,
    )
    rm.attach(link)
    servicer = BrokerServicer(
        rm,
        stream_idle_ms=limits.connections_max_idle_ms,
        produce_budget=budget,
        kafka_handlers=kafka_handlers,
        # Who each call is from and what it may do (authorizer.class.name, super.users).
        # The ACLs are the image's (refilled in place by a snapshot, so read live).
        security=server_security(
            config.values,
            config.security_protocol,
            sasl=SaslVerifier(rm.scram_credential).principal,
            acl_view=rm.image.acls,
            # Calls (other than nodes') wait for the image's first catch-up: no decision on a
            # half-replayed set of ACLs (KIP-801's initial load).
            loaded=rm.metadata_loaded,
        ),
    )
    if kafka_handlers.groups is not None:
        kafka_handlers.groups.access = servicer.security.access
    pb_grpc.add_BrokerServiceServicer_to_server(servicer, server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    await server.start()
    if port_file:
        _write_port_file(port_file, bound)
    log.info(
        "broker_listening",
        address=f"{host}:{bound}",
        security_protocol=config.security_protocol,
        advertised=advertised.address,
        metrics_port=metrics_port,
        controller=",".join(config.controllers),
        rack=config.rack,
        kafka=f"{kafka_host}:{kafka_port}" if kafka is not None else "",
    )

    tasks: list[asyncio.Task[None]] = []
    status = 0
    try:
        registration = await _until_stopped(link.register(stop), stop)
        if registration is None:
            return 0
        data_dir.adopt_cluster_id(registration.cluster_id)
        rm.prefetch_producer_ids()
        tasks = [
            asyncio.create_task(link.watch_loop(), name="metadata-watch"),
            asyncio.create_task(link.heartbeat_loop(), name="heartbeat"),
            asyncio.create_task(rm.run_background(stop), name="replica-background"),
        ]
        await health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        await health_servicer.set(
            "minibroker.BrokerService", health_pb2.HealthCheckResponse.SERVING
        )
        await _first_of(stop, rm.log_dir_failed)
        if rm.log_dir_failure is None:
            log.info("controlled_shutdown_started", leaderships=rm.led_partitions())
            link.request_controlled_shutdown()
            try:
                await asyncio.wait_for(
                    _first_of(link.should_shut_down, rm.log_dir_failed),
                    CONTROLLED_SHUTDOWN_TIMEOUT_S,
                )
            except TimeoutError:
                log.warning("controlled_shutdown_timed_out", leaderships=rm.led_partitions())
            else:
                if rm.log_dir_failure is None:
                    log.info("controlled_shutdown_granted", leaderships=rm.led_partitions())
        if rm.log_dir_failure is not None:
            status = await _halt_on_log_dir_failure(config, rm, link)
    except (FatalRegistrationError, DataDirError) as err:
        log.error("registration_refused", error=str(err))
        _print_error(str(err))
        status = 1
    finally:
        await health_servicer.enter_graceful_shutdown()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if kafka is not None:
            await kafka.stop()
        # The group coordinator first: its waiting joins and syncs are answered
        # NOT_COORDINATOR, its timers and loads end.
        await coordinator.stop()
        # Before the logs close: every round aborted, the threads joined while this loop
        # still answers them.
        await rm.cleaner.stop()
        await rm.stop()
        # The gRPC server after the replica manager, as before the group coordinator came:
        # stopping it first was followed once by gRPC's event engine aborting the process
        # (SIGABRT, "epoll_wait error: Bad file descriptor") on a broker halting for a full
        # disk (tests/integration/test_disk_failure.py).
        await server.stop(grace=1.0)
        await link.close()
        if faults is not None:
            faults.close()
        if rm.log_dir_failure is not None:
            # Not one more write to a failed dir (no flush, no checkpoints, no marker): the
            # files close when the process exits, and the next start recovers the logs.
            status = 1
        else:
            status = _close_logs(log_manager, data_dir, status, link.broker_epoch)
        data_dir.close()
        log.info("broker_stopped", status=status)
    return status


async def _halt_on_log_dir_failure(
    config: BrokerConfig, rm: ReplicaManager, link: ControllerLink
) -> int:
    """The data dir failed: report it to the controller (which fences us and moves our
    leaderships), wait for its answer up to `log.dir.failure.timeout.ms`, then give the
    one-line error. The replica manager already stopped serving; the caller exits."""
    failure = rm.log_dir_failure
    if failure is None:
        return 0
    log = logconf.get_logger("minibroker.broker")
    timeout_s = config["log.dir.failure.timeout.ms"] / 1000.0
    if not link.should_shut_down.is_set():  # granted: we lead nothing, the heartbeats stopped
        link.report_offline_log_dir(failure.log_dir)
        try:
            await asyncio.wait_for(link.offline_log_dirs_reported.wait(), timeout_s)
        except TimeoutError:
            # The controller is away: it fences us when our heartbeat stream ends (or, if it
            # is down now, by the session timeout after it comes back).
            log.error("log_dir_failure_not_reported", log_dir=failure.log_dir, timeout_s=timeout_s)
    partitions = len(rm.partitions)
    _print_error(
        f"log dir {failure.log_dir} failed ({failure.operation}: {failure.error}); stopped "
        f"serving its {partitions} partition{'s' if partitions != 1 else ''} and exiting: "
        f"{failure.advice}"
    )
    return 1


def _close_logs(log_manager: LogManager, data_dir: DataDir, status: int, broker_epoch: int) -> int:
    """Flush every log, write the checkpoints and, after a clean exit, the clean-shutdown
    marker. A disk failure on the way is a one-line error and status 1 (no marker)."""
    log = logconf.get_logger("minibroker.broker")
    try:
        log_manager.close()
        if status == 0 and broker_epoch >= 0:
            data_dir.mark_clean_shutdown(broker_epoch)
    except Exception as err:
        if not is_log_dir_failure(err):
            raise
        log.error("log_close_failed", error=str(err))
        _print_error(
            f"log dir {data_dir.path} failed while closing the logs ({err}); the next start "
            f"recovers them: {disk_error_advice(err)}"
        )
        return 1
    return status


def _load_failure(data_dir: DataDir, err: BaseException) -> str:
    message = f"cannot load the logs in data dir {data_dir.path}: {err}"
    return f"{message}; {disk_error_advice(err)}" if is_log_dir_failure(err) else message


def _print_error(message: str) -> None:
    """The one-line error on stderr. Best effort: stderr may be a file on the failed disk."""
    with contextlib.suppress(OSError, ValueError):
        print(f"minibroker broker: {message}", file=sys.stderr, flush=True)


async def _first_of(*events: asyncio.Event) -> None:
    """Wait until one of `events` is set."""
    waiters = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def _until_stopped(coro: Awaitable[T], stop: asyncio.Event) -> T | None:
    """Run `coro` unless `stop` is set first (then cancel it and return None)."""
    task = asyncio.ensure_future(coro)
    stopper = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        stopper.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    return None


def _write_port_file(path: str, port: int) -> None:
    target = pathlib.Path(path)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(f"{port}\n")
    os.replace(tmp, target)
