"""Network faults between local processes: a fault layer in our own gRPC transport.

The local launcher cuts, slows and heals the links between its processes by writing one file,
`<cluster dir>/faults.json` (docs: SPEC-15 §1), replaced atomically:

    {"version": 1, "generation": 7,
     "nodes": {"broker-1": "127.0.0.1:40001", "controller-1": "127.0.0.1:40100"},
     "cut": [["broker-1", "controller-1"]],
     "no_clients": ["broker-1"],
     "slow": {"broker-2": {"delay_ms": 200, "loss": 0.1}},
     "events": [{"at": 1790000000.5, "text": "broker 1 isolated from every other node"}]}

Every connection between two of our processes is opened by one of them, so the *client side*
of each connection holds both of its directions. A partition is silence, as TCP makes it: a
message on a cut link is not refused and not dropped from an open stream; it is held (a request
is not sent, an answer that came back is not handed over) until the link heals, the call's
deadline passes (DEADLINE_EXCEEDED, as gRPC says it for a real partition) or the caller cancels.
After a heal, what was held goes on in order. A slow node's links add `delay_ms` one way per
message (both ends slow: the delays add) and a TCP-like retransmission for each "lost" message
(RTO 200 ms, doubling per consecutive loss): slower, never dropped. A node in `no_clients` holds
every call coming into its server (isolated from its clients too).

Pieces: the pure table (`parse_faults`, `FaultTable`, `retransmission_s`), the process's view of
the file (`NetFaults`: reads it at start, rereads it every `network.faults.poll.ms` and reloads it
when it changes; a bad file is logged and ignored, the previous table kept) and the grpc hooks:
`aio_interceptors` / `intercept_sync` for channels, `server_interceptors` for servers, and
`NetFaults.hold` that `client/stream.py` calls around each message of a `RequestStream` (the
fetchers' FetchStream: no interceptor machinery on that hot path). With no file configured
nothing is installed; with one and no fault set, each message costs one attribute check
(`NetFaults.active is None`).

Threads: the table is swapped whole (one attribute), read from any thread; waiters sleep on a
threading.Condition (sync channels) or on futures woken with `call_soon_threadsafe` (asyncio).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import math
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc

# grpc 1.85: the call kinds grpc.aio itself wraps an interceptor's answer iterator in.
from grpc.aio._interceptor import (
    StreamStreamCallResponseIterator,
    UnaryStreamCallResponseIterator,
)

from minibroker.client.common.config import ConfigKey, at_least
from minibroker.client.common.log import get_logger

log = get_logger(__name__)

FILE_VERSION = 1
RTO_S = 0.2  # TCP's minimum retransmission timeout (Linux: 200 ms)
MAX_RETRANSMISSIONS = 8  # consecutive losses counted for one message (RTO up to 51 s)

NETWORK_FAULT_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "network.faults.file",
        str,
        "",
        "the launcher's faults.json this process obeys ('': no fault layer at all); set only "
        "by the local launcher",
    ),
    ConfigKey(
        "network.faults.node",
        str,
        "",
        "this process's name in the faults file (broker-N, controller-N); set by the launcher",
    ),
    ConfigKey(
        "network.faults.poll.ms",
        int,
        100,
        "how often the faults file is checked for a change",
        at_least(1),
    ),
)


class FaultFileError(ValueError):
    """The faults file is not a valid fault table."""


# -- the pure table -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Slow:
    delay_ms: float
    loss: float


@dataclass(frozen=True, slots=True)
class Link:
    """The faults on the link between two nodes."""

    cut: bool
    delay_s: float  # one way, per message
    loss: float  # probability that one transmission of a message is lost

    def message_delay_s(self, rng: random.Random) -> float:
        """What one message costs on this link: the delay plus its retransmissions."""
        return self.delay_s + retransmission_s(rng, self.loss)


OPEN_LINK = Link(cut=False, delay_s=0.0, loss=0.0)


def retransmission_s(rng: random.Random, loss: float) -> float:
    """The time lost to retransmissions of one message: each transmission is lost with
    probability `loss`, and each loss costs an RTO (200 ms, doubled after every consecutive
    loss, as TCP backs off), at most MAX_RETRANSMISSIONS of them."""
    if loss <= 0:
        return 0.0
    total = 0.0
    rto = RTO_S
    for _ in range(MAX_RETRANSMISSIONS):
        if rng.random() >= loss:
            break
        total += rto
        rto *= 2
    return total


@dataclass(frozen=True, slots=True)
class FaultTable:
    generation: int = 0
    nodes: Mapping[str, str] = field(default_factory=dict)
    cut: frozenset[frozenset[str]] = frozenset()
    no_clients: frozenset[str] = frozenset()
    slow: Mapping[str, Slow] = field(default_factory=dict)
    events: tuple[tuple[float, str], ...] = ()
    # address -> node, and port -> node when no two nodes share a port
    by_address: Mapping[str, str] = field(default_factory=dict)
    by_port: Mapping[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """No fault set (the layer passes everything straight through)."""
        return not (self.cut or self.no_clients or self.slow)

    def node_at(self, address: str) -> str | None:
        """The node serving at `address` ("host:port"): by the exact address, else by the port
        alone (all nodes run on one machine; `localhost` and `127.0.0.1` are the same)."""
        node = self.by_address.get(address)
        if node is None:
            node = self.by_port.get(address.rpartition(":")[2])
        return node

    def is_cut(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self.cut

    def link(self, a: str, b: str) -> Link:
        """The faults between nodes `a` and `b` (either order)."""
        if a == b:
            return OPEN_LINK
        cut = self.is_cut(a, b)
        slow_a, slow_b = self.slow.get(a), self.slow.get(b)
        if not cut and slow_a is None and slow_b is None:
            return OPEN_LINK
        delay_ms = 0.0
        kept = 1.0
        for slow in (slow_a, slow_b):
            if slow is not None:
                delay_ms += slow.delay_ms
                kept *= 1.0 - slow.loss
        return Link(cut=cut, delay_s=delay_ms / 1000.0, loss=1.0 - kept)

    def cut_from(self, node: str) -> list[str]:
        """The nodes `node` cannot reach, sorted."""
        return sorted(other for pair in self.cut if node in pair for other in pair - {node})

    def summary(self) -> str:
        """One line for the logs: what is set."""
        if self.empty:
            return "no fault"
        parts = []
        if self.cut:
            pairs = sorted("|".join(sorted(pair)) for pair in self.cut)
            parts.append("cut " + ", ".join(pairs))
        if self.no_clients:
            parts.append("no clients at " + ", ".join(sorted(self.no_clients)))
        for node in sorted(self.slow):
            slow = self.slow[node]
            parts.append(f"{node} slow +{slow.delay_ms:g} ms, {slow.loss:.0%} loss")
        return "; ".join(parts)


EMPTY = FaultTable()


def _name(value: Any, nodes: Mapping[str, str], where: str) -> str:
    if not isinstance(value, str) or not value:
        raise FaultFileError(f"{where}: expected a node name, got {value!r}")
    if value not in nodes:
        raise FaultFileError(f"{where}: {value!r} is not in nodes")
    return value


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise FaultFileError(f"{where}: expected a number, got {value!r}")
    return float(value)


def parse_faults(text: str) -> FaultTable:
    """The table in a faults file's text; FaultFileError names what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise FaultFileError(f"not JSON: {err}") from None
    if not isinstance(data, dict):
        raise FaultFileError("expected a JSON object")
    if data.get("version") != FILE_VERSION:
        raise FaultFileError(f"version {data.get('version')!r}, expected {FILE_VERSION}")
    generation = data.get("generation", 0)
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise FaultFileError(f"generation: expected an integer >= 0, got {generation!r}")
    raw_nodes = data.get("nodes", {})
    if not isinstance(raw_nodes, dict):
        raise FaultFileError("nodes: expected an object of name: address")
    nodes: dict[str, str] = {}
    for name, address in raw_nodes.items():
        if not isinstance(address, str) or ":" not in address:
            raise FaultFileError(f"nodes: {name!r} has no host:port address ({address!r})")
        nodes[name] = address
    raw_cut = data.get("cut", [])
    if not isinstance(raw_cut, list):
        raise FaultFileError("cut: expected a list of [node, node] pairs")
    cut = set()
    for pair in raw_cut:
        if not isinstance(pair, list) or len(pair) != 2:
            raise FaultFileError(f"cut: expected a [node, node] pair, got {pair!r}")
        a, b = (_name(n, nodes, "cut") for n in pair)
        if a == b:
            raise FaultFileError(f"cut: {a!r} cut from itself")
        cut.add(frozenset((a, b)))
    raw_no_clients = data.get("no_clients", [])
    if not isinstance(raw_no_clients, list):
        raise FaultFileError("no_clients: expected a list of node names")
    no_clients = frozenset(_name(n, nodes, "no_clients") for n in raw_no_clients)
    raw_slow = data.get("slow", {})
    if not isinstance(raw_slow, dict):
        raise FaultFileError("slow: expected an object of node: {delay_ms, loss}")
    slow: dict[str, Slow] = {}
    for name, spec in raw_slow.items():
        where = f"slow.{name}"
        _name(name, nodes, "slow")
        if not isinstance(spec, dict):
            raise FaultFileError(f"{where}: expected {{delay_ms, loss}}, got {spec!r}")
        delay_ms = _number(spec.get("delay_ms", 0), f"{where}.delay_ms")
        loss = _number(spec.get("loss", 0), f"{where}.loss")
        if delay_ms < 0:
            raise FaultFileError(f"{where}.delay_ms: must be >= 0, got {delay_ms:g}")
        if not 0 <= loss < 1:
            raise FaultFileError(f"{where}.loss: must be in [0, 1), got {loss:g}")
        if delay_ms or loss:
            slow[name] = Slow(delay_ms, loss)
    events: list[tuple[float, str]] = []
    raw_events = data.get("events", [])
    if not isinstance(raw_events, list):
        raise FaultFileError("events: expected a list")
    for event in raw_events:
        if not isinstance(event, dict) or not isinstance(event.get("text"), str):
            raise FaultFileError(f"events: expected {{at, text}}, got {event!r}")
        events.append((_number(event.get("at", 0), "events.at"), event["text"]))
    ports: dict[str, list[str]] = {}
    for name, address in nodes.items():
        ports.setdefault(address.rpartition(":")[2], []).append(name)
    return FaultTable(
        generation=generation,
        nodes=nodes,
        cut=frozenset(cut),
        no_clients=no_clients,
        slow=slow,
        events=tuple(events),
        by_address={address: name for name, address in nodes.items()},
        by_port={port: names[0] for port, names in ports.items() if len(names) == 1},
    )


def load_faults(path: str) -> FaultTable:
    """The table in the file at `path`; no file: the empty table. Raises FaultFileError
    (or OSError when the file cannot be read)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return EMPTY
    return parse_faults(text)


# -- errors as gRPC gives them ------------------------------------------------------------


def _deadline_details(address: str) -> str:
    return f"Deadline Exceeded (network fault: the link to {address} is cut)"


def aio_deadline_error(address: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        _deadline_details(address),
    )


class HeldCallError(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """A synchronous call that ran out of its deadline while the link was cut."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def initial_metadata(self) -> tuple[()]:
        return ()

    def trailing_metadata(self) -> tuple[()]:
        return ()

    def debug_error_string(self) -> str:
        return self._details

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Any) -> bool:
        return False


# -- the process's view of the file ------------------------------------------------------


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class NetFaults:
    """This process (`node`) under the faults file at `path`."""

    def __init__(
        self, path: str, node: str, *, poll_ms: int = 100, rng: random.Random | None = None
    ) -> None:
        self.path = path
        self.node = node
        self._poll_s = poll_ms / 1000.0
        self.table: FaultTable = EMPTY
        # The table while any fault is set, None while none is: the one check on every message.
        self.active: FaultTable | None = None
        self._rng = rng if rng is not None else random.Random()
        # The file's bytes at the last look (None: no file). The file is small: comparing its
        # bytes is exact, where (mtime, size, inode) misses a same-size rewrite in one tick.
        self._content: bytes | None = None
        self._cond = threading.Condition()
        # One future per event loop with messages held on it, resolved by the next wake().
        self._aio_changed: dict[asyncio.AbstractEventLoop, asyncio.Future[None]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Messages held right now on a cut link or by `no_clients` (for tests and the logs);
        # changed only under `_cond` (held messages wait on several threads).
        self.held = 0

    @classmethod
    def from_config(cls, config: Any) -> NetFaults | None:
        """The fault layer a process's config asks for (None: no file set, nothing installed)."""
        path = str(config["network.faults.file"])
        if not path:
            return None
        return cls(
            path, str(config["network.faults.node"]), poll_ms=config["network.faults.poll.ms"]
        )

    # -- the file -------------------------------------------------------------------------

    def load(self) -> bool:
        """Reread the file if it changed since the last look; whether the table changed."""
        try:
            with open(self.path, "rb") as f:
                content: bytes | None = f.read()
        except FileNotFoundError:
            content = None
        except OSError as err:
            log.warning("network_faults_file_unreadable", path=self.path, error=str(err))
            return False
        if content == self._content:
            return False
        self._content = content
        try:
            table = EMPTY if content is None else parse_faults(content.decode("utf-8"))
        except (UnicodeDecodeError, FaultFileError) as err:
            log.warning(
                "network_faults_file_bad",
                path=self.path,
                error=str(err),
                kept_generation=self.table.generation,
            )
            return False
        if table == self.table:
            return False
        self.set_table(table)
        return True

    def set_table(self, table: FaultTable) -> None:
        """Apply `table` now (the poller calls it; tests may too) and wake every held message."""
        self.table = table
        self.active = None if table.empty else table
        log.info(
            "network_faults_changed",
            node=self.node,
            generation=table.generation,
            summary=table.summary(),
            cut_from=table.cut_from(self.node),
            no_clients=self.node in table.no_clients,
        )
        if table.nodes and self.node not in table.nodes:
            # Its links are found by this node's name: without it, no fault ever applies here.
            log.warning(
                "network_faults_node_unknown",
                node=self.node,
                generation=table.generation,
                nodes=sorted(table.nodes),
            )
        self.wake()

    def wake(self) -> None:
        """Wake every held message to look at the table (and its caller's cancellation)."""
        with self._cond:
            changed, self._aio_changed = self._aio_changed, {}
            self._cond.notify_all()
        for loop, future in changed.items():
            try:
                loop.call_soon_threadsafe(_resolve, future)
            except RuntimeError:  # that loop is closed: nobody waits there any more
                pass

    def start(self) -> None:
        """Read the file now and watch it on a daemon thread until `close()`."""
        self.load()
        if self._thread is None:
            context = contextvars.copy_context()
            self._thread = threading.Thread(
                target=context.run, args=(self._poll,), name="netfaults", daemon=True
            )
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)

    def _poll(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.load()
            except Exception:  # never let the watcher die: the table would freeze
                log.exception("network_faults_poll_failed", path=self.path)

    # -- the rules ------------------------------------------------------------------------

    def link_to(self, address: str) -> Link:
        """The faults on the link from this node to whoever serves at `address`."""
        table = self.active
        if table is None:
            return OPEN_LINK
        peer = table.node_at(address)
        if peer is None:
            return OPEN_LINK  # not one of the launcher's processes: never faulted
        return table.link(self.node, peer)

    def _cut_to(self, address: str) -> bool:
        return self.link_to(address).cut

    def _no_clients(self) -> bool:
        table = self.active
        return table is not None and self.node in table.no_clients

    def _delay_s(self, link: Link) -> float:
        if link.delay_s <= 0 and link.loss <= 0:
            return 0.0
        return link.message_delay_s(self._rng)

    # -- holding (asyncio) ----------------------------------------------------------------

    async def hold(
        self, address: str, deadline: float | None = None, done: asyncio.Future[Any] | None = None
    ) -> None:
        """Let one message to or from `address` through: wait while the link is cut, then its
        delay. `deadline` (time.monotonic()): raise DEADLINE_EXCEEDED there. `done`: return
        early when it completes (the call ended: the caller looks at why)."""
        if self.active is None:
            return
        link = self.link_to(address)
        if link is OPEN_LINK:
            return
        if link.cut:
            if not await self._wait_while(lambda: self._cut_to(address), deadline, done, address):
                return
            link = self.link_to(address)  # as the heal left it
        delay = self._delay_s(link)
        if delay > 0:
            await self._sleep(delay, address, deadline, done)

    async def hold_incoming(self, deadline: float | None = None) -> bool:
        """Server side: wait while this node takes no calls. False: the deadline passed."""
        if self.active is None:
            return True
        try:
            await self._wait_while(self._no_clients, deadline, None, self.node)
        except grpc.aio.AioRpcError:
            return False
        return True

    async def _wait_while(
        self,
        blocked: Callable[[], bool],
        deadline: float | None,
        done: asyncio.Future[Any] | None,
        address: str,
    ) -> bool:
        """Wait while `blocked()`; False when `done` completed first."""
        loop = asyncio.get_running_loop()
        while blocked():
            if done is not None and done.done():
                return False
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise aio_deadline_error(address)
            with self._cond:
                # Shared by every message held on this loop (never cancelled by one of them).
                changed = self._aio_changed.get(loop)
                if changed is None:
                    changed = self._aio_changed[loop] = loop.create_future()
                self.held += 1
            try:
                if not blocked():  # changed before the future was registered
                    break
                waits: set[asyncio.Future[Any]] = {changed}
                if done is not None:
                    waits.add(done)
                await asyncio.wait(waits, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                with self._cond:
                    self.held -= 1
        return True

    async def _sleep(
        self, delay: float, address: str, deadline: float | None, done: asyncio.Future[Any] | None
    ) -> None:
        remaining = None if deadline is None else deadline - time.monotonic()
        wait = delay if remaining is None else min(delay, max(remaining, 0.0))
        if done is None:
            await asyncio.sleep(wait)
        else:
            await asyncio.wait({done}, timeout=wait)
            if done.done():
                return  # the call ended: its caller looks at why
        if remaining is not None and remaining < delay:
            raise aio_deadline_error(address)

    # -- holding (threads) ----------------------------------------------------------------

    def hold_sync(
        self, address: str, deadline: float | None = None, cancelled: threading.Event | None = None
    ) -> None:
        """`hold` for a thread: returns early once `cancelled` is set (after `wake()`)."""
        if self.active is None:
            return
        link = self.link_to(address)
        if link is OPEN_LINK:
            return
        if link.cut:
            with self._cond:
                while self._cut_to(address):
                    if cancelled is not None and cancelled.is_set():
                        return
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise HeldCallError(
                            grpc.StatusCode.DEADLINE_EXCEEDED, _deadline_details(address)
                        )
                    self.held += 1
                    try:
                        self._cond.wait(remaining)
                    finally:
                        self.held -= 1
            link = self.link_to(address)  # as the heal left it
        delay = self._delay_s(link)
        if delay <= 0:
            return
        remaining = None if deadline is None else deadline - time.monotonic()
        wait = delay if remaining is None else min(delay, max(remaining, 0))
        if cancelled is not None:
            if cancelled.wait(wait):
                return
        else:
            time.sleep(wait)
        if remaining is not None and remaining < delay:
            raise HeldCallError(grpc.StatusCode.DEADLINE_EXCEEDED, _deadline_details(address))


# -- grpc.aio client side -----------------------------------------------------------------


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _remaining(details: Any, deadline: float | None) -> Any:
    """The call details with the time left after a hold (the call's deadline does not move)."""
    if deadline is None:
        return details
    return details._replace(timeout=max(deadline - time.monotonic(), 0.0))


# How long a request stream held past its deadline waits for grpc to end the call: grpc's own
# deadline is the same instant, give or take the time between computing the two.
_SETTLE_S = 5.0


async def _settled(ended: asyncio.Future[None]) -> None:
    """Wait (bounded) until the call is done, without cancelling `ended`."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(ended), _SETTLE_S)


def _cancelled_future(call: Any, stop: asyncio.Future[None] | None = None) -> asyncio.Future[None]:
    """Done once `call` is cancelled, or `stop` is done (an answer held for it is then never
    handed over)."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def ended(call: Any) -> None:
        if call.cancelled():
            _resolve(future)

    call.add_done_callback(ended)
    if stop is not None:
        stop.add_done_callback(lambda _: _resolve(future))
    return future


class _AioLink:
    """Holds the messages of every call on one channel (to `address`). grpc.aio files each
    interceptor under one kind of call only, so each kind has its own class below."""

    def __init__(self, faults: NetFaults, address: str) -> None:
        self._faults = faults
        self._address = address

    async def _unary_response(self, call: Any, deadline: float | None) -> Any:
        faults = self._faults
        try:
            response = await call
        except grpc.aio.AioRpcError:
            if faults.active is not None:
                await faults.hold(self._address, deadline)
            raise
        if faults.active is not None:
            await faults.hold(self._address, deadline)
        return response

    async def _held_requests(
        self, requests: Any, deadline: float | None, ended: asyncio.Future[None]
    ) -> AsyncIterator[Any]:
        """`requests`, each held on the way out. Past the call's deadline the iterator ends once
        grpc has ended the call itself (DEADLINE_EXCEEDED; `ended`): an error raised here would
        make grpc.aio cancel the call, and so would half-closing a call that grpc core has just
        ended but grpc.aio not yet seen as done; its caller would get CancelledError instead."""
        faults = self._faults
        if hasattr(requests, "__aiter__"):
            async for request in requests:
                if faults.active is not None:
                    try:
                        await faults.hold(self._address, deadline)
                    except grpc.aio.AioRpcError:
                        await _settled(ended)
                        return
                yield request
        else:
            for request in requests:
                if faults.active is not None:
                    try:
                        await faults.hold(self._address, deadline)
                    except grpc.aio.AioRpcError:
                        await _settled(ended)
                        return
                yield request

    async def _held_responses(
        self, call: Any, deadline: float | None, held: _HeldRead | None = None
    ) -> AsyncIterator[Any]:
        faults = self._faults
        cancelled: asyncio.Future[None] | None = None
        iterator = call.__aiter__()
        try:
            while True:
                error: grpc.aio.AioRpcError | None = None
                try:
                    response = await iterator.__anext__()
                except StopAsyncIteration:
                    response = _END
                except grpc.aio.AioRpcError as err:
                    response, error = _END, err
                if faults.active is not None:
                    if cancelled is None:
                        cancelled = _cancelled_future(call, None if held is None else held.stop)
                    if held is not None:
                        held.holding = True
                    try:
                        await faults.hold(self._address, deadline, cancelled)
                    finally:
                        if held is not None:
                            held.holding = False
                    if cancelled.done():
                        raise asyncio.CancelledError  # as grpc.aio says a cancelled call
                if error is not None:
                    raise error
                if response is _END:
                    return
                yield response
        finally:
            if cancelled is not None:
                cancelled.cancel()


class _AioUnaryUnary(_AioLink, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        deadline = _deadline(details.timeout)
        if self._faults.active is not None:
            await self._faults.hold(self._address, deadline)
            details = _remaining(details, deadline)
        return await self._unary_response(await continuation(details, request), deadline)


class _AioStreamUnary(_AioLink, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        deadline = _deadline(details.timeout)
        ended = asyncio.get_running_loop().create_future()
        call = await continuation(details, self._held_requests(request_iterator, deadline, ended))
        call.add_done_callback(lambda _: _resolve(ended))
        return await self._unary_response(call, deadline)


class _AioUnaryStream(_AioLink, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        deadline = _deadline(details.timeout)
        if self._faults.active is not None:
            await self._faults.hold(self._address, deadline)
            details = _remaining(details, deadline)
        return _held_stream_call(
            _HeldUnaryStreamCall, self, await continuation(details, request), deadline
        )


class _AioStreamStream(_AioLink, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        deadline = _deadline(details.timeout)
        ended = asyncio.get_running_loop().create_future()
        call = await continuation(details, self._held_requests(request_iterator, deadline, ended))
        call.add_done_callback(lambda _: _resolve(ended))
        return _held_stream_call(_HeldStreamStreamCall, self, call, deadline)


_END = object()


class _HeldRead:
    """Shared by a streaming call and its answer iterator: `stop` ends a held read (resolved
    by cancel()); `holding` is true while an answer (or the call's end) is held."""

    __slots__ = ("holding", "stop")

    def __init__(self, stop: asyncio.Future[None]) -> None:
        self.stop = stop
        self.holding = False


class _HeldStreamCall:
    """What a streaming interceptor returns: the call's answers through `_held_responses`, and
    a cancel() that also ends a held read. grpc.aio's own wrapper for an interceptor's answer
    iterator cancels the call underneath only, which does nothing once that call has ended:
    a stream the server ended while the link was cut (its status came back and is held) could
    not be cancelled at all, and its caller hung until the heal."""

    _call: Any
    _held: _HeldRead

    def cancel(self) -> bool:
        """True when this cancelled the call, or ended a held read (the call underneath may
        have ended already: for its caller, it had not)."""
        held = self._held
        ended_a_hold = False
        # (grpc.aio's __del__ cancels too, maybe after the loop has closed: nothing to end then.)
        if not held.stop.done() and not held.stop.get_loop().is_closed():
            ended_a_hold = held.holding
            held.stop.set_result(None)
        return bool(self._call.cancel()) or ended_a_hold


class _HeldUnaryStreamCall(_HeldStreamCall, UnaryStreamCallResponseIterator):
    pass


class _HeldStreamStreamCall(_HeldStreamCall, StreamStreamCallResponseIterator):
    pass


def _held_stream_call(kind: Any, link: _AioLink, call: Any, deadline: float | None) -> Any:
    held = _HeldRead(asyncio.get_running_loop().create_future())
    wrapped = kind(call, link._held_responses(call, deadline, held))
    wrapped._held = held
    return wrapped


def aio_interceptors(faults: NetFaults | None, address: str) -> list[Any]:
    """The interceptors for a grpc.aio channel to `address` (none without a fault layer)."""
    if faults is None:
        return []
    kinds = (_AioUnaryUnary, _AioUnaryStream, _AioStreamUnary, _AioStreamStream)
    return [kind(faults, address) for kind in kinds]


# -- synchronous client side --------------------------------------------------------------


class _HeldStream:
    """A synchronous streaming call whose answers are held; everything else is the call's."""

    def __init__(
        self,
        faults: NetFaults,
        address: str,
        call: Any,
        deadline: float | None,
        cancelled: threading.Event,
    ) -> None:
        self._faults = faults
        self._address = address
        self._call = call
        self._deadline = deadline
        self._cancelled = cancelled

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        faults = self._faults
        try:
            response = next(self._call)
        except (grpc.RpcError, StopIteration):
            if faults.active is not None:
                faults.hold_sync(self._address, self._deadline, self._cancelled)
            raise
        if faults.active is not None:
            faults.hold_sync(self._address, self._deadline, self._cancelled)
            if self._cancelled.is_set():
                return next(self._call)  # the call's own CANCELLED
        return response

    def cancel(self) -> bool:
        self._cancelled.set()
        self._faults.wake()
        return bool(self._call.cancel())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


class _SyncFaults(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    def __init__(self, faults: NetFaults, address: str) -> None:
        self._faults = faults
        self._address = address

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        faults = self._faults
        deadline = _deadline(details.timeout)
        if faults.active is not None:
            faults.hold_sync(self._address, deadline)
            details = _remaining(details, deadline)
        outcome = continuation(details, request)
        outcome.exception()  # waits for the answer (a failed call's error is the outcome's)
        if faults.active is not None:
            faults.hold_sync(self._address, deadline)
        return outcome

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        faults = self._faults
        deadline = _deadline(details.timeout)
        if faults.active is not None:
            faults.hold_sync(self._address, deadline)
            details = _remaining(details, deadline)
        call = continuation(details, request)
        return _HeldStream(faults, self._address, call, deadline, threading.Event())

    def intercept_stream_stream(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        faults = self._faults
        deadline = _deadline(details.timeout)
        cancelled = threading.Event()

        def held_requests() -> Iterator[Any]:
            for request in request_iterator:
                if faults.active is not None:
                    try:
                        faults.hold_sync(self._address, deadline, cancelled)
                    except grpc.RpcError:
                        return  # past the call's deadline: grpc ends the call itself
                    if cancelled.is_set():
                        return
                yield request

        call = continuation(details, held_requests())
        return _HeldStream(faults, self._address, call, deadline, cancelled)


def intercept_sync(channel: grpc.Channel, faults: NetFaults | None, address: str) -> grpc.Channel:
    """A synchronous channel to `address` with the fault layer (itself without one)."""
    if faults is None:
        return channel
    return grpc.intercept_channel(channel, _SyncFaults(faults, address))


# -- grpc.aio server side -----------------------------------------------------------------


class _HeldContext:
    """A servicer context whose read(), write() and abort() wait while the node takes no calls
    (grpc.aio's abort() sends the status at once, before the handler's error is raised)."""

    def __init__(self, faults: NetFaults, context: Any) -> None:
        self._faults = faults
        self._context = context

    async def read(self) -> Any:
        message = await self._context.read()
        if self._faults.active is not None:
            await _hold_incoming(self._faults, self._context)
        return message

    async def write(self, message: Any) -> None:
        if self._faults.active is not None:
            await _hold_incoming(self._faults, self._context)
        await self._context.write(message)

    async def abort(self, *args: Any, **kwargs: Any) -> NoReturn:
        if self._faults.active is not None:
            await _wait_incoming(self._faults, self._context)  # at the deadline: abort anyway
        await self._context.abort(*args, **kwargs)
        raise AssertionError("abort() returned")  # grpc.aio's raises AbortError

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


async def _wait_incoming(faults: NetFaults, context: Any) -> bool:
    """Wait while this node takes no calls; False: the call's deadline passed first."""
    remaining = context.time_remaining()
    deadline = None if remaining is None else time.monotonic() + remaining
    return await faults.hold_incoming(deadline)


async def _hold_incoming(faults: NetFaults, context: Any) -> None:
    if not await _wait_incoming(faults, context):
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")


async def _hold_failure(faults: NetFaults, context: Any) -> None:
    """Hold the error a handler raised like an answer (at the deadline it goes out as it is:
    the caller has its own DEADLINE_EXCEEDED by then). Not for AbortError: that status went
    out with abort(), held there; nor CancelledError: the call is gone."""
    if faults.active is not None:
        await _wait_incoming(faults, context)


class _NoClients(grpc.aio.ServerInterceptor):
    """Holds every incoming call (before its handler runs, each message read and each answer)
    while this node is in `no_clients`."""

    def __init__(self, faults: NetFaults) -> None:
        self._faults = faults

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        if handler.request_streaming and handler.response_streaming:
            make, behavior = grpc.stream_stream_rpc_method_handler, handler.stream_stream
        elif handler.request_streaming:
            make, behavior = grpc.stream_unary_rpc_method_handler, handler.stream_unary
        elif handler.response_streaming:
            make, behavior = grpc.unary_stream_rpc_method_handler, handler.unary_stream
        else:
            make, behavior = grpc.unary_unary_rpc_method_handler, handler.unary_unary
        return make(
            self._wrap(behavior, handler.request_streaming),
            handler.request_deserializer,
            handler.response_serializer,
        )

    def _wrap(self, behavior: Any, request_streaming: bool) -> Any:
        faults = self._faults

        async def held_requests(requests: Any, context: Any) -> AsyncIterator[Any]:
            async for request in requests:
                if faults.active is not None:
                    await _hold_incoming(faults, context)
                yield request

        def arguments(request: Any, context: Any) -> tuple[Any, Any]:
            if request_streaming:
                request = held_requests(request, context)
            return request, _HeldContext(faults, context)

        if inspect.isasyncgenfunction(behavior):

            async def wrapped_gen(request: Any, context: Any) -> AsyncIterator[Any]:
                if faults.active is not None:
                    await _hold_incoming(faults, context)
                responses = behavior(*arguments(request, context)).__aiter__()
                while True:
                    try:
                        response = await responses.__anext__()
                    except StopAsyncIteration:
                        break
                    except grpc.aio.AbortError:
                        raise
                    except Exception:
                        await _hold_failure(faults, context)
                        raise
                    if faults.active is not None:
                        await _hold_incoming(faults, context)
                    yield response
                # The end of the stream (its OK status) is an answer too.
                if faults.active is not None:
                    await _hold_incoming(faults, context)

            return wrapped_gen
        if inspect.iscoroutinefunction(behavior):

            async def wrapped(request: Any, context: Any) -> Any:
                if faults.active is not None:
                    await _hold_incoming(faults, context)
                try:
                    response = await behavior(*arguments(request, context))
                except grpc.aio.AbortError:
                    raise
                except Exception:
                    await _hold_failure(faults, context)
                    raise
                if faults.active is not None:
                    await _hold_incoming(faults, context)
                return response

            return wrapped
        return behavior  # a synchronous handler runs in grpc's thread pool: none here


def server_interceptors(
    faults: NetFaults | None, *inner: grpc.aio.ServerInterceptor
) -> list[grpc.aio.ServerInterceptor]:
    """The interceptors for a grpc.aio server: the fault layer's (none without one) first, so
    outermost, then `inner` (the server's limits). A call held by `no_clients` has then not
    reached the limits: it counts against neither max.connections.per.ip nor the request
    budget, as a connection that never arrived would not."""
    return ([] if faults is None else [_NoClients(faults)]) + list(inner)


__all__ = [
    "EMPTY",
    "NETWORK_FAULT_KEYS",
    "OPEN_LINK",
    "FaultFileError",
    "FaultTable",
    "HeldCallError",
    "Link",
    "NetFaults",
    "Slow",
    "aio_deadline_error",
    "aio_interceptors",
    "intercept_sync",
    "load_faults",
    "parse_faults",
    "retransmission_s",
    "server_interceptors",
]
