"""Network faults between the local launcher's processes: the planning side. Pure.

The launcher (`minibroker.deploy.cluster`: `partition`, `isolate`, `slow`, `heal`) describes the
faults it wants in `<cluster dir>/faults.json`; every process polls that file and holds, delays or
"loses" the messages of the links it names (`minibroker.client.common.netfaults`, docs/design.md).
This module turns a command into the next table, and a table into words:

- naming: a group or target is a comma list of `1` / `broker-1` (a broker), `controller-2` (or its
  node id 1001), `controller` (the active controller: the caller asks the quorum and passes its
  name in), `controllers` (all of them), `brokers` (all of them);
- `partition`: every node of a group is cut from every node of every other group; nodes named in
  no group keep their links; a node in two groups is an error;
- `isolate`: a node cut from the controllers (`controller`), the brokers (`brokers`), both
  (`nodes`), or both and its own clients (`all`: the node's server holds every incoming call);
- `slow`: every link of a node gets a one-way delay per message and a loss rate (a loss costs a
  TCP-like retransmission, never a drop);
- `heal`: nothing set.

Faults add up: each command adds to the table; only `heal` takes anything away. Each command also
appends its sentence to `events` (what `cluster status` and `watch` show while it is set).

The file (SPEC-15 §1):
    {"version": 1, "generation": 7,
     "nodes": {"broker-1": "127.0.0.1:40001", ...},       every process by its launcher name
     "cut": [["broker-1", "controller-1"], ...],            unordered pairs, silent both ways
     "no_clients": ["broker-1"],                            servers holding every incoming call
     "slow": {"broker-2": {"delay_ms": 200, "loss": 0.1}},
     "events": [{"at": 1790000000.5, "text": "broker 1 isolated from every other node"}]}
No I/O and no clock: the caller passes the time in and writes the file (atomically, generation + 1).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from minibroker.deploy import quorum

FILE_NAME = "faults.json"
VERSION = 1
SCOPES = ("controller", "brokers", "nodes", "all")
HEAL_HINT = "heal with `minibroker cluster heal`"
ALL_BROKERS = "brokers"
ALL_CONTROLLERS = "controllers"


class FaultError(ValueError):
    """A fault command that cannot be planned; the message says why and what to type."""


@dataclass(frozen=True, slots=True)
class Node:
    """One process of the cluster as the fault table names it."""

    name: str  # broker-N or controller-N (ProcessSpec.name)
    role: str  # "broker" or "controller"
    number: int  # the broker's node id, or the controller's index (1-based)
    address: str = ""

    @property
    def label(self) -> str:
        """How sentences name it: `broker 1`, `controller-2` (as `cluster status` does)."""
        return f"broker {self.number}" if self.role == "broker" else self.name


@dataclass(frozen=True, slots=True)
class Slow:
    delay_ms: int
    loss: float = 0.0


@dataclass(frozen=True, slots=True)
class Event:
    at: float  # wall-clock seconds
    text: str


@dataclass(frozen=True, slots=True)
class FaultTable:
    generation: int = 0
    nodes: dict[str, str] = field(default_factory=dict)
    cut: frozenset[tuple[str, str]] = frozenset()  # each pair in node order (`pair`)
    no_clients: frozenset[str] = frozenset()
    slow: dict[str, Slow] = field(default_factory=dict)
    events: tuple[Event, ...] = ()

    @property
    def empty(self) -> bool:
        """No fault set (the nodes map and the generation do not count)."""
        return not self.cut and not self.no_clients and not self.slow

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "generation": self.generation,
            "nodes": dict(sorted(self.nodes.items(), key=lambda kv: node_key(kv[0]))),
            "cut": [list(p) for p in sorted(self.cut, key=lambda p: tuple(map(node_key, p)))],
            "no_clients": sorted(self.no_clients, key=node_key),
            "slow": {
                name: {"delay_ms": s.delay_ms, "loss": s.loss}
                for name, s in sorted(self.slow.items(), key=lambda kv: node_key(kv[0]))
            },
            "events": [{"at": e.at, "text": e.text} for e in self.events],
        }

    @classmethod
    def from_json(cls, data: Any) -> FaultTable:
        """The file's content; FaultError when it is not a fault table of this version."""
        try:
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise FaultError(f"not a version {VERSION} fault table")
            nodes = {str(k): str(v) for k, v in dict(data.get("nodes") or {}).items()}
            cut = set()
            for entry in data.get("cut") or []:
                a, b = entry
                cut.add(pair(str(a), str(b)))
            slow = {
                str(name): Slow(int(s["delay_ms"]), float(s.get("loss", 0.0)))
                for name, s in dict(data.get("slow") or {}).items()
            }
            events = tuple(Event(float(e["at"]), str(e["text"])) for e in data.get("events") or [])
            return cls(
                generation=int(data.get("generation") or 0),
                nodes=nodes,
                cut=frozenset(cut),
                no_clients=frozenset(str(n) for n in data.get("no_clients") or []),
                slow=slow,
                events=events,
            )
        except (TypeError, ValueError, KeyError, AttributeError) as err:
            if isinstance(err, FaultError):
                raise
            raise FaultError(f"malformed fault table: {err!r}") from None


def node_key(name: str) -> tuple[int, int, str]:
    """Controllers first, then brokers, each by number; anything else after, by name."""
    role, _, number = name.rpartition("-")
    if number.isdigit() and role in ("controller", "broker"):
        return (0 if role == "controller" else 1, int(number), "")
    return (2, 0, name)


def pair(a: str, b: str) -> tuple[str, str]:
    if a == b:
        raise FaultError(f"a node cannot be cut from itself ({a})")
    x, y = sorted((a, b), key=node_key)
    return (x, y)


def label_of(name: str) -> str:
    role, _, number = name.rpartition("-")
    return f"broker {number}" if role == "broker" else name


def labels(names: Iterable[str]) -> str:
    return ", ".join(label_of(n) for n in sorted(names, key=node_key))


def peers(table: FaultTable, name: str) -> list[str]:
    """The nodes `name` is cut from, in node order."""
    out = [b if a == name else a for a, b in table.cut if name in (a, b)]
    return sorted(out, key=node_key)


def touches(table: FaultTable, name: str) -> bool:
    """Whether a cut or no_clients concerns `name` (a restarted process cannot be expected to
    register or join while it holds)."""
    return name in table.no_clients or any(name in p for p in table.cut)


# -- naming -------------------------------------------------------------------------------------


def needs_active(items: Iterable[str]) -> bool:
    """Whether any of the comma lists names `controller`: the caller must ask the quorum."""
    return any(
        part.strip().lower() == quorum.CONTROLLER for item in items for part in item.split(",")
    )


def resolve(ident: str, nodes: Sequence[Node], active: str | None = None) -> list[str]:
    """The node names one ident names (`brokers`/`controllers`: several)."""
    text = ident.strip().lower()
    brokers = [n for n in nodes if n.role == "broker"]
    controllers = [n for n in nodes if n.role == "controller"]
    if text == ALL_BROKERS:
        return [n.name for n in brokers]
    if text == ALL_CONTROLLERS:
        return [n.name for n in controllers]
    if text == quorum.CONTROLLER:
        if active is None:
            raise FaultError(
                "no active controller: the quorum has no leader right now (`minibroker cluster "
                "status` says why); name one: " + ", ".join(n.name for n in controllers)
            )
        return [active]
    if text.startswith("broker"):
        rest = text.removeprefix("broker").lstrip("-")
        if not rest.isdigit():
            raise FaultError(_unknown(ident))
        text = rest
    try:
        target = quorum.parse_target(text, len(controllers))
    except ValueError as err:
        raise FaultError(str(err) if text.startswith("controller") else _unknown(ident)) from None
    if target.kind == "controller":
        return [quorum.controller_name(target.number)]
    for n in brokers:
        if n.number == target.number:
            return [n.name]
    ids = ", ".join(str(n.number) for n in brokers)
    raise FaultError(f"no broker {target.number} in this cluster (brokers: {ids})")


def _unknown(ident: str) -> str:
    return (
        f"unknown node {ident!r}: use a broker id (1) or broker-1, controller-N, 'controller' "
        "(the active one), 'brokers' or 'controllers' (all of them)"
    )


def resolve_one(ident: str, nodes: Sequence[Node], active: str | None = None) -> str:
    names = resolve(ident, nodes, active)
    if len(names) != 1:
        raise FaultError(f"{ident!r} names {len(names)} nodes: name one (e.g. 1, controller-2)")
    return names[0]


def parse_groups(
    groups: Sequence[str], nodes: Sequence[Node], active: str | None = None
) -> list[list[str]]:
    """`["1", "2,3,controller"]` -> the node names of each group. Errors: fewer than two
    groups, a group naming nothing, an unknown node, a node in two groups."""
    if len(groups) < 2:
        raise FaultError(
            "a partition needs at least two groups, e.g. `cluster partition 1 2,3,controller` "
            "(to cut one node from all others: `cluster isolate N`)"
        )
    out: list[list[str]] = []
    where: dict[str, int] = {}
    for index, group in enumerate(groups, start=1):
        names: list[str] = []
        for part in group.split(","):
            if not part.strip():
                continue
            for name in resolve(part, nodes, active):
                if name in where and where[name] != index:
                    raise FaultError(
                        f"{label_of(name)} is in group {where[name]} ({groups[where[name] - 1]}) "
                        f"and group {index} ({group}): a node can be on one side only"
                    )
                where[name] = index
                if name not in names:
                    names.append(name)
        if not names:
            raise FaultError(f"group {index} ({group!r}) names no node")
        out.append(names)
    return out


# -- planning -----------------------------------------------------------------------------------


def _active_note(names: Iterable[str], active: str | None, used: bool) -> str:
    if used and active is not None and active in names:
        return f" ({label_of(active)} is the active controller)"
    return ""


def plan_partition(
    table: FaultTable,
    groups: Sequence[Sequence[str]],
    at: float,
    active: str | None = None,
    named_active: bool = False,
) -> tuple[FaultTable, str]:
    """Cut every node of each group from every node of the others; the new table and the
    sentence for the user. `groups` as `parse_groups` gives them."""
    cut = set(table.cut)
    for i, left in enumerate(groups):
        for right in groups[i + 1 :]:
            for a in left:
                for b in right:
                    cut.add(pair(a, b))
    sides = " | ".join(labels(g) for g in groups)
    text = f"network partition: {sides}"
    named = {n for g in groups for n in g}
    outside = [n for n in table.nodes if n not in named]
    if len(groups) == 2:
        said = f"cut {labels(groups[0])} from {labels(groups[1])}"
    else:
        said = f"cut every group from the others: {sides}"
    said += _active_note(named, active, named_active)
    if outside:
        said += f"; {labels(outside)} keep{'s' if len(outside) == 1 else ''} every link"
    said += f" (clients still reach every node); {HEAL_HINT}"
    new = replace(table, cut=frozenset(cut), events=(*table.events, Event(at, text)))
    return new, said


def isolate_peers(nodes: Sequence[Node], name: str, scope: str) -> list[str]:
    """The nodes `isolate name --from scope` cuts `name` from."""
    if scope not in SCOPES:
        raise FaultError(f"unknown scope {scope!r}: --from one of {', '.join(SCOPES)}")
    me = next((n for n in nodes if n.name == name), None)
    if me is None:
        raise FaultError(f"no node {name} in this cluster")
    others = [n for n in nodes if n.name != name]
    if scope == "controller":
        chosen = [n for n in others if n.role == "controller"]
    elif scope == "brokers":
        chosen = [n for n in others if n.role == "broker"]
    else:
        chosen = others
    return sorted((n.name for n in chosen), key=node_key)


def isolate_text(node: Node, scope: str) -> str:
    """The event line of `isolate`: what is set now."""
    who = node.label
    if scope == "controller":
        whom = "the other controllers" if node.role == "controller" else "the controllers"
        return f"{who} isolated from {whom}"
    if scope == "brokers":
        whom = "the brokers" if node.role == "controller" else "the other brokers"
        return f"{who} isolated from {whom}"
    if scope == "all":
        return f"{who} isolated from every other node and from its clients"
    return f"{who} isolated from every other node"


def plan_isolate(
    table: FaultTable,
    nodes: Sequence[Node],
    name: str,
    scope: str,
    at: float,
    active_named: bool = False,
) -> tuple[FaultTable, str]:
    """Cut `name` from the nodes its scope names (`all`: and hold its incoming calls)."""
    targets = isolate_peers(nodes, name, scope)
    me = next(n for n in nodes if n.name == name)
    if not targets and scope != "all":
        whom = "other controllers" if scope == "controller" else "other brokers"
        raise FaultError(f"{me.label} has no {whom} to be cut from in this cluster")
    cut = set(table.cut) | {pair(name, t) for t in targets}
    no_clients = set(table.no_clients)
    if scope == "all":
        no_clients.add(name)
    who = me.label + (" (the active controller)" if active_named else "")
    clients = (
        "its clients are cut too: it answers no call"
        if scope == "all"
        else "clients still reach it"
    )
    said = f"cut {who} from {labels(targets) or 'no other node'} ({clients}); {HEAL_HINT}"
    new = replace(
        table,
        cut=frozenset(cut),
        no_clients=frozenset(no_clients),
        events=(*table.events, Event(at, isolate_text(me, scope))),
    )
    return new, said


def loss_text(loss: float) -> str:
    return f"{loss * 100:g}%"


def slow_text(label: str, slow: Slow) -> str:
    parts = [f"+{slow.delay_ms} ms"] if slow.delay_ms else []
    if slow.loss:
        parts.append(f"{loss_text(slow.loss)} loss")
    return f"{label} slow: {', '.join(parts)}"


def check_slow(delay_ms: int, loss: float) -> None:
    if delay_ms < 0:
        raise FaultError(f"--delay-ms must be 0 or more (a one-way delay), got {delay_ms}")
    if not 0.0 <= loss < 1.0:
        raise FaultError(
            f"--loss must be in [0, 1) (a probability: 0.1 is 10%; every lost message is "
            f"retransmitted, so 1 would never deliver), got {loss:g}"
        )
    if delay_ms == 0 and loss == 0.0:
        raise FaultError(
            "--delay-ms 0 without --loss slows nothing; `minibroker cluster heal` clears faults"
        )


def plan_slow(
    table: FaultTable, node: Node, delay_ms: int, loss: float, at: float
) -> tuple[FaultTable, str]:
    """Every link of `node` gets `delay_ms` one way per message and `loss` (replacing any slow
    setting it had)."""
    check_slow(delay_ms, loss)
    setting = Slow(delay_ms, loss)
    text = slow_text(node.label, setting)
    said = f"slowed every link of {node.label}:"
    if delay_ms:
        said += f" +{delay_ms} ms each way per message (round trip +{2 * delay_ms} ms)"
    if loss:
        said += (
            f"{',' if delay_ms else ''} {loss_text(loss)} of messages lost and retransmitted "
            "(after 200 ms, doubling per consecutive loss)"
        )
    said += f"; {HEAL_HINT}"
    new = replace(
        table, slow={**table.slow, node.name: setting}, events=(*table.events, Event(at, text))
    )
    return new, said


def plan_heal(table: FaultTable) -> tuple[FaultTable, str]:
    """Nothing set (the nodes stay)."""
    if table.empty:
        said = "no network fault was set; nothing to heal"
    else:
        was = "; ".join(e.text for e in table.events) or "faults"
        said = f"healed the network: every link open, no delay (was: {was})"
    return FaultTable(generation=table.generation, nodes=dict(table.nodes)), said


def with_nodes(table: FaultTable, nodes: Sequence[Node]) -> FaultTable:
    """The table for the cluster's nodes now (a broker added or removed): the nodes map
    replaced, faults naming a node that is gone dropped."""
    names = {n.name for n in nodes}
    return replace(
        table,
        nodes={n.name: n.address for n in nodes},
        cut=frozenset(p for p in table.cut if p[0] in names and p[1] in names),
        no_clients=frozenset(n for n in table.no_clients if n in names),
        slow={k: v for k, v in table.slow.items() if k in names},
    )


def describe(table: FaultTable) -> list[str]:
    """The faults set, in words, for `cluster status`: one line per command that set them, then
    each node's cut links."""
    if table.empty:
        return ["network: no faults set"]
    lines = [f"network faults (faults.json generation {table.generation}):"]
    lines += [f"  {e.text}" for e in table.events]
    cut_nodes = sorted({n for p in table.cut for n in p}, key=node_key)
    for name in cut_nodes:
        lines.append(f"  {label_of(name)} cut from {labels(peers(table, name))}")
    for name in sorted(table.no_clients, key=node_key):
        lines.append(f"  {label_of(name)} holds every incoming call (clients too)")
    lines.append(f"  {HEAL_HINT}")
    return lines


__all__ = [
    "FILE_NAME",
    "SCOPES",
    "Event",
    "FaultError",
    "FaultTable",
    "Node",
    "Slow",
    "check_slow",
    "describe",
    "isolate_peers",
    "isolate_text",
    "needs_active",
    "parse_groups",
    "peers",
    "plan_heal",
    "plan_isolate",
    "plan_partition",
    "plan_slow",
    "resolve",
    "resolve_one",
    "slow_text",
    "touches",
    "with_nodes",
]
