"""The local launcher's view of the controller quorum (issue 13, docs/design.md §6.1). Pure.

- naming: controller-1, controller-2, ... are node ids 1000, 1001, ... (so a quorum of one keeps
  today's id and files); `controller` alone means the active controller (the quorum's leader);
- the strings the processes are configured with: `controller.quorum.voters`
  (`1000@127.0.0.1:9192,1001@...`) and the brokers' `controller.quorum.bootstrap.servers`;
- a fresh cluster id in Kafka's format (22 characters, URL-safe base64 of a UUID4, no padding);
- the quorum as `cluster status` shows it, built from each voter's DescribeQuorum answer (or why
  there is none) and its process state: roles, leader, epoch, high watermark, each voter's log
  end and lag as the leader sees them, and when nothing leads, why.

No I/O and no clock: the launcher (`minibroker.deploy.cluster`) asks the processes and passes the
answers in, already converted from protobuf by `answer_from_pb`.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

FIRST_CONTROLLER_ID = 1000
CONTROLLER = "controller"  # the active controller, and a quorum of one's only controller
QUORUM_SIZES = (1, 3, 5)
NO_LEADER = -1


def controller_id(index: int) -> int:
    """node.id of controller-`index` (1-based)."""
    return FIRST_CONTROLLER_ID + index - 1


def controller_name(index: int) -> str:
    return f"{CONTROLLER}-{index}"


def controller_index(node_id: int) -> int:
    return node_id - FIRST_CONTROLLER_ID + 1


def voters_string(voters: Iterable[tuple[int, str]]) -> str:
    """`controller.quorum.voters` for (node id, host:port) pairs, sorted by id: the spec's
    normalised form, so every voter is started with exactly the same string."""
    return ",".join(f"{node_id}@{address}" for node_id, address in sorted(voters))


def parse_voters(text: str) -> list[tuple[int, str]]:
    """`1000@h:p,1001@h:p` -> [(1000, "h:p"), ...]; ValueError on anything else."""
    out: list[tuple[int, str]] = []
    for part in text.split(","):
        ident, sep, address = part.strip().partition("@")
        host, colon, port = address.rpartition(":")
        if not sep or not ident.strip().isdigit() or not colon or not host or not port.isdigit():
            raise ValueError(f"expected ID@HOST:PORT in controller.quorum.voters, got {part!r}")
        out.append((int(ident), address))
    return out


def bootstrap_string(addresses: Iterable[str]) -> str:
    """The brokers' `controller.quorum.bootstrap.servers`: every controller's host:port."""
    return ",".join(addresses)


def new_cluster_id(value: uuid.UUID | None = None) -> str:
    """Kafka's cluster id format (`kafka-storage random-uuid`): URL-safe base64 of a UUID4's 16
    bytes without the `==` padding, 22 characters."""
    raw = (value or uuid.uuid4()).bytes
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def check_quorum_size(count: int) -> None:
    if count not in QUORUM_SIZES:
        sizes = ", ".join(str(n) for n in QUORUM_SIZES)
        raise ValueError(
            f"--controllers must be one of {sizes} (an odd quorum: an even one tolerates no more "
            f"failures than the odd one below it), got {count}"
        )


def majority(voters: int) -> int:
    return voters // 2 + 1


# -- addressing ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """What a process name given on the command line means."""

    kind: str  # "active" (the active controller), "controller" (by index) or "broker"
    number: int = 0  # the controller's index (1-based) or the broker's node id


def parse_target(ident: str, controllers: int) -> Target:
    """`controller` (the active one), `controller-2` (also `controller2`, or its node id 1001),
    or a broker's node id. ValueError with what to type instead when it names nothing."""
    text = ident.strip().lower()
    if text == CONTROLLER:
        return Target("active")
    if text.startswith(CONTROLLER):
        rest = text[len(CONTROLLER) :].lstrip("-")
        if rest.isdigit() and 1 <= int(rest) <= controllers:
            return Target("controller", int(rest))
        raise ValueError(
            f"unknown process {ident!r}: this cluster has controllers "
            f"{', '.join(controller_name(i) for i in range(1, controllers + 1))}"
        )
    try:
        number = int(text)
    except ValueError:
        raise ValueError(
            f"unknown process {ident!r}: use a broker node id, 'controller' (the active one) "
            f"or 'controller-N'"
        ) from None
    if controllers > 0 and 1 <= controller_index(number) <= controllers:
        return Target("controller", controller_index(number))
    return Target("broker", number)


# -- the quorum as DescribeQuorum answers describe it -------------------------------------------


@dataclass(frozen=True, slots=True)
class VoterProgress:
    """One voter as the leader's DescribeQuorum answer describes it; -1 is unknown."""

    voter_id: int
    address: str = ""
    log_end_offset: int = -1
    last_fetch_ms_ago: int = -1
    last_caught_up_ms_ago: int = -1


@dataclass(frozen=True, slots=True)
class QuorumAnswer:
    """One voter's DescribeQuorum answer. `implemented` False: the controller predates the
    quorum (UNIMPLEMENTED); a quorum of one is then its own leader."""

    node_id: int
    role: str
    leader_id: int = NO_LEADER
    leader_epoch: int = -1
    leader_address: str = ""
    high_watermark: int = -1
    log_end_offset: int = -1
    voters: tuple[VoterProgress, ...] = ()
    why_no_leader: str = ""
    cluster_id: str = ""
    implemented: bool = True


def answer_from_pb(msg: Any) -> QuorumAnswer:
    """A `DescribeQuorumResponse` (duck-typed, so this module imports no protobuf)."""
    return QuorumAnswer(
        node_id=msg.node_id,
        role=msg.role or "unknown",
        leader_id=msg.leader_id,
        leader_epoch=msg.leader_epoch,
        leader_address=msg.leader_address,
        high_watermark=msg.high_watermark,
        log_end_offset=msg.log_end_offset,
        voters=tuple(
            VoterProgress(
                v.voter_id,
                v.address,
                v.log_end_offset,
                v.last_fetch_ms_ago,
                v.last_caught_up_ms_ago,
            )
            for v in msg.voters
        ),
        why_no_leader=msg.why_no_leader,
        cluster_id=msg.cluster_id,
    )


def unimplemented_answer(node_id: int) -> QuorumAnswer:
    """What a controller without QuorumService stands for: the leader of a quorum of one."""
    return QuorumAnswer(node_id=node_id, role="leader", leader_id=node_id, implemented=False)


@dataclass(frozen=True, slots=True)
class VoterInput:
    """What the launcher knows of one controller: its place, its process, its answer."""

    node_id: int
    name: str
    address: str
    state: str  # running / paused / stopped (the process)
    pid: int = 0
    answer: QuorumAnswer | None = None
    error: str = ""  # why there is no answer (gRPC status name), "" when there is one


@dataclass(frozen=True, slots=True)
class VoterRow:
    node_id: int
    name: str
    address: str
    state: str
    pid: int | None
    role: str  # the voter's own answer, or "stopped"/"paused"/"unreachable (...)"
    log_end_offset: int | None  # the leader's view, else the voter's own
    lag: int | None  # the leader's log end minus this voter's, as the leader sees them
    last_fetch_ms_ago: int | None


@dataclass(frozen=True, slots=True)
class QuorumStatus:
    voters: tuple[VoterRow, ...]
    leader_id: int  # -1: none
    epoch: int  # -1: unknown
    high_watermark: int | None
    why_no_leader: str  # "" when there is a leader
    cluster_id: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def leader_name(self) -> str:
        return (
            "none"
            if self.leader_id == NO_LEADER
            else controller_name(controller_index(self.leader_id))
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "leader_id": self.leader_id if self.leader_id != NO_LEADER else None,
            "leader": None if self.leader_id == NO_LEADER else self.leader_name,
            "epoch": self.epoch if self.epoch >= 0 else None,
            "high_watermark": self.high_watermark,
            "why_no_leader": self.why_no_leader or None,
            "cluster_id": self.cluster_id or None,
            "notes": list(self.notes),
            "voters": [
                {
                    "node_id": v.node_id,
                    "name": v.name,
                    "address": v.address,
                    "state": v.state,
                    "pid": v.pid,
                    "role": v.role,
                    "log_end_offset": v.log_end_offset,
                    "lag": v.lag,
                    "last_fetch_ms_ago": v.last_fetch_ms_ago,
                }
                for v in self.voters
            ],
        }


def _leader_answer(answers: Sequence[QuorumAnswer]) -> QuorumAnswer | None:
    """The answer of the voter that says it leads, at the highest epoch (a paused old leader
    that was resumed may still say so for a moment at its stale epoch)."""
    leaders = [a for a in answers if a.role == "leader"]
    return max(leaders, key=lambda a: a.leader_epoch) if leaders else None


def quorum_status(voters: Sequence[VoterInput]) -> QuorumStatus:
    """The quorum as `cluster status` shows it, from every voter's answer (or its absence)."""
    answers = [v.answer for v in voters if v.answer is not None]
    leader = _leader_answer(answers)
    notes: list[str] = []
    if leader is not None:
        leader_id, epoch = leader.node_id, leader.leader_epoch
    else:
        # No voter says it leads; the freshest follower may still name one (it is elected but
        # not reachable from here, or it answered while we asked the others).
        named = [a for a in answers if a.leader_id != NO_LEADER]
        best = max(named, key=lambda a: a.leader_epoch) if named else None
        leader_id = best.leader_id if best else NO_LEADER
        epoch = max((a.leader_epoch for a in answers), default=-1)
        if best is not None:
            notes.append(
                f"{controller_name(controller_index(leader_id))} is named leader by the others "
                f"but did not answer as leader"
            )
    progress = {p.voter_id: p for p in leader.voters} if leader else {}
    leader_end = leader.log_end_offset if leader else -1
    rows = []
    for v in voters:
        answer = v.answer
        if v.state != "running":
            role = v.state
        elif answer is None:
            role = f"unreachable ({v.error})" if v.error else "unreachable"
        else:
            role = answer.role
        seen = progress.get(v.node_id)
        end: int | None = None
        if seen is not None and seen.log_end_offset >= 0:
            end = seen.log_end_offset
        elif answer is not None and answer.log_end_offset >= 0 and answer.implemented:
            end = answer.log_end_offset
        if leader is not None and v.node_id == leader.node_id and leader_end >= 0:
            end = leader_end
        lag = None if end is None or leader_end < 0 else max(leader_end - end, 0)
        fetch = seen.last_fetch_ms_ago if seen is not None and seen.last_fetch_ms_ago >= 0 else None
        rows.append(
            VoterRow(
                node_id=v.node_id,
                name=v.name,
                address=v.address,
                state=v.state,
                pid=v.pid if v.state != "stopped" and v.pid > 0 else None,
                role=role,
                log_end_offset=end,
                lag=lag,
                last_fetch_ms_ago=fetch,
            )
        )
    why = ""
    if leader is None:
        why = why_no_leader(voters)
    hw = leader.high_watermark if leader is not None and leader.high_watermark >= 0 else None
    cluster_id = next((a.cluster_id for a in answers if a.cluster_id), "")
    return QuorumStatus(
        voters=tuple(rows),
        leader_id=leader_id if leader is not None else NO_LEADER,
        epoch=epoch,
        high_watermark=hw,
        why_no_leader=why,
        cluster_id=cluster_id,
        notes=tuple(notes),
    )


def why_no_leader(voters: Sequence[VoterInput]) -> str:
    """Why nothing leads, in words: no majority of live voters, else what the voters say."""
    total = len(voters)
    down = [v for v in voters if v.state != "running" or v.answer is None]
    if total - len(down) < majority(total):
        names = ", ".join(
            f"{v.name} {v.state if v.state != 'running' else 'unreachable'}" for v in down
        )
        return f"no majority: {len(down)} of {total} voters down ({names})"
    reasons = [
        f"{v.name}: {v.answer.why_no_leader}"
        for v in voters
        if v.answer is not None and v.answer.why_no_leader
    ]
    if reasons:
        return "; ".join(reasons)
    return "an election is in progress (no voter reports a leader yet)"


def _cell(value: int | None) -> str:
    return "-" if value is None else str(value)


def render_quorum(status: QuorumStatus) -> list[str]:
    """`cluster status`'s quorum section, one string per line."""
    size = len(status.voters)
    if status.leader_id != NO_LEADER:
        epoch = "?" if status.epoch < 0 else str(status.epoch)
        hw = _cell(status.high_watermark)
        head = (
            f"controller quorum: {size} voter{'s' if size != 1 else ''}, leader "
            f"{status.leader_name} (node {status.leader_id}), epoch {epoch}, high watermark {hw}"
        )
    else:
        plural = "s" if size != 1 else ""
        head = f"controller quorum: {size} voter{plural}, NO LEADER: {status.why_no_leader}"
    lines = [head]
    lines += [f"  note: {n}" for n in status.notes]
    lines.append(
        f"  {'VOTER':<14} {'ID':<5} {'ADDRESS':<18} {'ROLE':<14} {'PID':<8} "
        f"{'LOG END':>8} {'LAG':>6} {'FETCHED':>8}"
    )
    for v in status.voters:
        fetched = "-" if v.last_fetch_ms_ago is None else f"{v.last_fetch_ms_ago / 1000:.1f}s"
        lines.append(
            f"  {v.name:<14} {v.node_id:<5} {v.address:<18} {v.role:<14} "
            f"{_cell(v.pid):<8} {_cell(v.log_end_offset):>8} {_cell(v.lag):>6} {fetched:>8}"
        )
    return lines


def active_controller(status: QuorumStatus) -> int | None:
    """The index (1-based) of the active controller, None when nothing leads."""
    return None if status.leader_id == NO_LEADER else controller_index(status.leader_id)


__all__ = [
    "CONTROLLER",
    "FIRST_CONTROLLER_ID",
    "NO_LEADER",
    "QUORUM_SIZES",
    "QuorumAnswer",
    "QuorumStatus",
    "Target",
    "VoterInput",
    "VoterProgress",
    "VoterRow",
    "active_controller",
    "answer_from_pb",
    "bootstrap_string",
    "check_quorum_size",
    "controller_id",
    "controller_index",
    "controller_name",
    "majority",
    "new_cluster_id",
    "parse_target",
    "parse_voters",
    "quorum_status",
    "render_quorum",
    "unimplemented_answer",
    "voters_string",
    "why_no_leader",
]
