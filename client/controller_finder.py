"""Finding the active controller of a controller quorum (issue 13; docs/spec quorum.md).

Shared by the broker's controller link and the admin client. Two parts:

- pure: `parse_controllers` (the configured list), `hint_from_trailing_metadata` (the
  NOT_CONTROLLER convention's trailing metadata), `best_answer` (which DescribeQuorum answer to
  believe) and `ControllerFinder`, which tracks the believed leader and its quorum epoch and never
  goes back to the leader of an older epoch;
- I/O: `hint_from_error` (reads a gRPC error's status and trailing metadata) and `ask_quorum`,
  which asks `QuorumService.DescribeQuorum` of every configured controller (in parallel, each with
  a short deadline) and feeds the answers to the finder.

The wire convention: a controller that is not the active one fails every ControllerService call
(and ends its Heartbeat and WatchMetadata streams) with FAILED_PRECONDITION and trailing metadata
`minibroker-error: NOT_CONTROLLER`, `minibroker-controller-leader: <id>@<host>:<port>` (empty when
it knows no leader) and `minibroker-controller-epoch: <epoch>`. A controller from before the
quorum has no QuorumService: UNIMPLEMENTED from DescribeQuorum means "this address is the
controller" (epoch unknown, -1), so a single old controller keeps working.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from minibroker.proto import minibroker_pb2 as pb

ERROR_KEY = "minibroker-error"
LEADER_KEY = "minibroker-controller-leader"
EPOCH_KEY = "minibroker-controller-epoch"
NOT_CONTROLLER = "NOT_CONTROLLER"

# Per-controller deadline of a DescribeQuorum: a live voter answers in milliseconds; a hung one
# (SIGSTOP) must not hold the search.
DESCRIBE_QUORUM_TIMEOUT_S = 0.5
# Waits between searches that found no leader (an election is running): short, so that a
# broker moves within a fraction of a second of the election's end.
SEARCH_BACKOFF_S = (0.05, 0.1, 0.2, 0.25)


@dataclass(frozen=True, slots=True)
class LeaderHint:
    """What a controller said about the quorum's leader. address "" / leader_id -1: it knows no
    leader; epoch -1: unknown (a controller from before the quorum)."""

    leader_id: int
    address: str
    epoch: int


def split_address(text: str) -> tuple[str, int]:
    """HOST:PORT (an `id@` prefix, as in controller.quorum.voters, is dropped)."""
    text = text.strip()
    _, _, text = text.rpartition("@")
    for prefix in ("PLAINTEXT://", "plaintext://"):
        text = text.removeprefix(prefix)
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT or ID@HOST:PORT, got {text!r}")
    return host, int(port)


def parse_controllers(value: str | Sequence[str]) -> tuple[str, ...]:
    """The controllers to ask, as "host:port", in the given order, duplicates dropped.

    Accepts "h:p", "h1:p1,h2:p2", "1000@h1:p1,1001@h2:p2" (ids ignored) or a sequence of those;
    raises ValueError for anything else or an empty list.
    """
    items = [value] if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in items:
        for part in str(item).split(","):
            if not part.strip():
                continue
            host, port = split_address(part)
            out.append(f"{host}:{port}")
    if not out:
        raise ValueError("no controller address given")
    return tuple(dict.fromkeys(out))


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def parse_leader(text: str) -> tuple[int, str]:
    """`id@host:port` -> (id, "host:port"); "" or anything unreadable -> (-1, "")."""
    text = text.strip()
    ident, sep, rest = text.partition("@")
    if not sep:
        return -1, ""
    try:
        host, port = split_address(rest)
        leader_id = int(ident)
    except ValueError:
        return -1, ""
    return leader_id, f"{host}:{port}"


def hint_from_trailing_metadata(
    pairs: Iterable[tuple[str, str | bytes]] | None,
) -> LeaderHint | None:
    """The NOT_CONTROLLER hint in a call's trailing metadata; None when it is not NOT_CONTROLLER."""
    values = {str(k).lower(): _text(v) for k, v in (pairs or ())}
    if values.get(ERROR_KEY, "").strip() != NOT_CONTROLLER:
        return None
    leader_id, address = parse_leader(values.get(LEADER_KEY, ""))
    try:
        epoch = int(values.get(EPOCH_KEY, "").strip())
    except ValueError:
        epoch = -1
    return LeaderHint(leader_id, address, epoch)


def hint_from_describe(response: pb.DescribeQuorumResponse) -> LeaderHint | None:
    """A DescribeQuorum answer as a hint; None when the answer is an error."""
    if response.error_code != 0:
        return None
    address = ""
    if response.leader_id >= 0 and response.leader_address:
        try:
            host, port = split_address(response.leader_address)
            address = f"{host}:{port}"
        except ValueError:
            address = ""
    return LeaderHint(response.leader_id if address else -1, address, response.leader_epoch)


def best_answer(answers: Iterable[LeaderHint | None]) -> LeaderHint | None:
    """The answer with the highest epoch that names a leader (the first of equals), or None."""
    best: LeaderHint | None = None
    for answer in answers:
        if answer is None or not answer.address:
            continue
        if best is None or answer.epoch > best.epoch:
            best = answer
    return best


class ControllerFinder:
    """Who the active controller is believed to be (pure state, no I/O).

    `target()` is where to send the next call: the believed leader, else the one configured
    address when there is only one (calling it is as quick as asking it who leads), else None
    (ask the quorum: `ask_quorum`). Learned leaders are taken only at an epoch at least the
    known one, so a stale hint or a stale voter's answer never moves calls back to the leader of
    an older epoch. A controller from before the quorum has epoch -1 throughout.
    """

    def __init__(self, addresses: Sequence[str]) -> None:
        self.addresses = parse_controllers(addresses)
        self.leader_address: str | None = None
        self.leader_id = -1
        self.epoch = -1

    def target(self) -> str | None:
        if self.leader_address is not None:
            return self.leader_address
        if len(self.addresses) == 1:
            return self.addresses[0]
        return None

    def observe(self, hint: LeaderHint) -> bool:
        """Take what a controller said; True when the believed leader changed."""
        if hint.epoch < self.epoch:
            return False  # older news
        before = self.leader_address
        if hint.address:
            if hint.epoch == self.epoch and before is not None and before != hint.address:
                # Two leaders in one epoch cannot be; keep ours until a newer epoch shows up.
                return False
            self.leader_address, self.leader_id = hint.address, hint.leader_id
        elif hint.epoch > self.epoch:
            # A newer epoch with no leader known yet (an election runs): ours is of the past.
            self.leader_address, self.leader_id = None, -1
        self.epoch = hint.epoch
        return self.leader_address != before

    def not_controller(self, address: str, hint: LeaderHint | None) -> bool:
        """`address` answered NOT_CONTROLLER (with its hint, if any); True when the believed
        leader changed."""
        before = self.leader_address
        if address == self.leader_address:
            self.leader_address, self.leader_id = None, -1
        if hint is not None:
            self.observe(hint)
        return self.leader_address != before

    def unreachable(self, address: str) -> None:
        """`address` did not answer (UNAVAILABLE, DEADLINE_EXCEEDED): ask the quorum next time.
        The epoch is kept, so only a leader of this epoch or a newer one is taken back."""
        if address == self.leader_address:
            self.leader_address, self.leader_id = None, -1


# -- I/O ----------------------------------------------------------------------------------------


def hint_from_error(err: BaseException) -> LeaderHint | None:
    """The NOT_CONTROLLER hint of a failed gRPC call or stream (aio or blocking), else None."""
    trailing = getattr(err, "trailing_metadata", None)
    if trailing is None:
        return None
    try:
        pairs = trailing()
    except Exception:
        return None
    return hint_from_trailing_metadata(pairs)


def is_unreachable(err: BaseException) -> bool:
    """A call that got no answer from the controller at all: try another one."""
    code = err.code() if isinstance(err, grpc.RpcError) and hasattr(err, "code") else None
    return code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


DescribeQuorum = Callable[[str, float], Awaitable[pb.DescribeQuorumResponse]]


async def describe_one(
    describe: DescribeQuorum, address: str, timeout_s: float
) -> LeaderHint | None:
    """One controller's answer about the leader; None when it has none to give."""
    try:
        response = await describe(address, timeout_s)
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.UNIMPLEMENTED:
            # A controller from before the quorum: it is the (only) controller.
            return LeaderHint(-1, address, -1)
        return None  # UNAVAILABLE, DEADLINE_EXCEEDED, ...: the next one may know
    except Exception:
        return None
    return hint_from_describe(response)


async def ask_quorum(
    finder: ControllerFinder,
    describe: DescribeQuorum,
    timeout_s: float = DESCRIBE_QUORUM_TIMEOUT_S,
) -> str | None:
    """Ask every configured controller who leads (in parallel, `timeout_s` each), take the
    answer with the highest epoch that names a leader, and return the finder's target."""
    answers = await asyncio.gather(
        *(describe_one(describe, a, timeout_s) for a in finder.addresses)
    )
    best = best_answer(answers)
    if best is not None:
        finder.observe(best)
    return finder.leader_address


def quorum_describer(stub_for: Callable[[str], Any]) -> DescribeQuorum:
    """A DescribeQuorum caller over `stub_for(address)` (a QuorumServiceStub on a grpc.aio
    channel the caller owns)."""

    async def describe(address: str, timeout_s: float) -> pb.DescribeQuorumResponse:
        stub = stub_for(address)
        response: pb.DescribeQuorumResponse = await stub.DescribeQuorum(
            pb.DescribeQuorumRequest(), timeout=timeout_s
        )
        return response

    return describe


__all__ = [
    "ControllerFinder",
    "LeaderHint",
    "ask_quorum",
    "best_answer",
    "hint_from_error",
    "hint_from_trailing_metadata",
    "parse_controllers",
]
