"""A real local cluster for integration tests: controller and brokers as processes on 127.0.0.1.

Built on the launcher (`minibroker.deploy.cluster`), so the tests exercise the same code path as
`minibroker cluster up`. Ports are picked free (base port 0); every process is killed by PID when
the test ends, whatever happened.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

from minibroker.deploy import cluster as launcher


def wait_until(
    predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05
) -> Any:
    """Poll `predicate` until it returns a truthy value or the deadline passes."""
    deadline = time.monotonic() + timeout_s
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as err:
            last_error = err
        time.sleep(interval_s)
    detail = f" (last error: {last_error!r})" if last_error else ""
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}{detail}")


class LocalCluster:
    def __init__(
        self,
        directory: str,
        brokers: int,
        settings: dict[str, str],
        racks: int = 0,
        controllers: int = 1,
        tls: bool = False,
        sasl: bool = False,
    ):
        self.directory = directory
        self.state = launcher.up(
            directory,
            brokers=brokers,
            racks=racks,
            base_port=0,
            settings=settings,
            timeout_s=60.0,
            controllers=controllers,
            tls=tls,
            sasl=sasl,
        )

    @property
    def bootstrap(self) -> str:
        return self.state.bootstrap_servers

    @property
    def kafka_bootstrap(self) -> str:
        """The brokers' Kafka-protocol listeners (every harness cluster without TLS/SASL has
        them: the launcher gives each broker a free Kafka port)."""
        return self.state.kafka_bootstrap_servers

    @property
    def controller_address(self) -> str:
        return self.state.controller.address

    def reload(self) -> None:
        state = launcher.load_state(self.directory)
        assert state is not None
        self.state = state

    def spec(self, ident: str | int) -> launcher.ProcessSpec:
        return self.state.find(str(ident))

    def kill(self, ident: str | int) -> None:
        launcher.act(self.directory, "kill", str(ident))
        self.reload()

    def stop(self, ident: str | int) -> None:
        launcher.act(self.directory, "stop", str(ident))
        self.reload()

    def pause(self, ident: str | int) -> None:
        launcher.act(self.directory, "pause", str(ident))

    def resume(self, ident: str | int) -> None:
        launcher.act(self.directory, "resume", str(ident))

    def start(self, ident: str | int) -> None:
        launcher.act(self.directory, "start", str(ident))
        self.reload()

    # Network faults (SPEC-15 §2): faults.json, which every process polls; they add up until
    # heal(). Each returns the launcher's sentence.

    def partition(self, *groups: str | int) -> str:
        return launcher.partition(self.directory, [str(g) for g in groups])

    def isolate(self, ident: str | int, scope: str = "nodes") -> str:
        return launcher.isolate(self.directory, str(ident), scope)

    def slow(self, ident: str | int, delay_ms: int, loss: float = 0.0) -> str:
        return launcher.slow(self.directory, str(ident), delay_ms, loss)

    def heal(self) -> str:
        return launcher.heal(self.directory)

    def faults(self) -> dict[str, Any]:
        return launcher.current_faults(self.directory)

    def log_tail(self, ident: str | int, lines: int = 40) -> str:
        return launcher.read_log_tail(self.spec(ident).log_file, lines)

    def kill_all(self) -> None:
        state = launcher.load_state(self.directory) or self.state
        for spec in state.all():
            if spec.pid > 0 and launcher.process_state(spec) != "stopped":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(spec.pid, signal.SIGCONT)
                    os.kill(spec.pid, signal.SIGKILL)
                launcher.wait_stopped(spec, 5.0)


@contextlib.contextmanager
def local_cluster(
    directory: str,
    brokers: int = 3,
    settings: dict[str, str] | None = None,
    racks: int = 0,
    controllers: int = 1,
    tls: bool = False,
    sasl: bool = False,
) -> Iterator[LocalCluster]:
    cluster: LocalCluster | None = None
    try:
        cluster = LocalCluster(directory, brokers, settings or {}, racks, controllers, tls, sasl)
        yield cluster
    finally:
        if cluster is not None:
            cluster.kill_all()
        else:
            state = launcher.load_state(directory)
            if state is not None:
                for spec in state.all():
                    if spec.pid > 0 and launcher.process_state(spec) != "stopped":
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(spec.pid, signal.SIGKILL)
