"""One frame of `minibroker watch`: the model as a rich renderable.

Pure: no I/O, no clock reads (`now_ms`, wall-clock milliseconds, comes in). `render(model, now_ms)`
returns a `rich.console.Group` (header, brokers, partitions, timeline) that the live loop hands to
`rich.live.Live` and tests print to `Console(record=True, width=...)`. Problems are spelled out
in words (a STATUS column, "offline", "under-replicated", "stopped", ...) as well as coloured, so
a frame reads the same without colour, in a log or a test.
"""

from __future__ import annotations

from datetime import UTC, datetime

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from minibroker.client.types import NO_LEADER
from minibroker.client.watch.events import ClusterEvent, EventKind
from minibroker.client.watch.model import WatchModel
from minibroker.client.watch.observations import Reachability
from minibroker.client.watch.rows import BrokerRow, GroupRow, PartitionRow, ReplicaCell

DEFAULT_EVENT_ROWS = 15

OFFLINE_STYLE = "bold red"
UNDER_MIN_ISR_STYLE = "red"
UNDER_REPLICATED_STYLE = "yellow"

_EVENT_STYLES = {
    EventKind.OFFLINE: "bold red",
    EventKind.FENCED: "red",
    EventKind.UNREGISTERED: "yellow",
    EventKind.UNREACHABLE: "red",
    EventKind.TRUNCATION: "magenta",
    EventKind.CLEANER: "blue",
    EventKind.ELECTION: "cyan",
    EventKind.ISR_SHRINK: "yellow",
    EventKind.ISR_EXPAND: "green",
    EventKind.UNFENCED: "green",
    EventKind.REACHABLE: "green",
    EventKind.REGISTERED: "green",
    EventKind.CONTROLLED_SHUTDOWN: "yellow",
    EventKind.PROCESS: "blue",
    EventKind.CONTROLLER_ELECTION: "bold cyan",
    EventKind.CONTROLLER_RESIGNED: "bold red",
    EventKind.NETWORK: "bold magenta",
}

_BROKER_STATUS_STYLES = {
    "alive": "green",
    "fenced": "red",
    "stopped": "bold red",
    "paused": "magenta",
    "unreachable": "red",
    "shutting-down": "yellow",
    "unregistered": "yellow",
    "decommissioning": "cyan",
    "decommissioned": "dim",
}


def format_time(timestamp_ms: int) -> str:
    """UTC wall-clock time with milliseconds, like the processes' log lines. Times come from
    the network (metadata records, DescribeReplicas): one no calendar holds is drawn as such."""
    try:
        moment = datetime.fromtimestamp(timestamp_ms / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return "??:??:??.???"
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def _seconds(ms: int) -> str:
    return f"{max(ms, 0) / 1000:.1f}s"


def _reach_text(reach: Reachability, now_ms: int) -> Text:
    if reach.reachable is None:
        return Text("-", style="dim")
    if reach.reachable:
        return Text("ok", style="green")
    detail = f": {reach.error}" if reach.error else ""
    return Text(f"UNREACHABLE {_seconds(now_ms - reach.since_ms)}{detail}", style="red")


def _quorum_line(model: WatchModel, text: Text) -> None:
    """The controller quorum: leader and epoch (DescribeQuorum, else the metadata log's last
    LeaderChangeRecord), why there is no leader, and local voters not running. Nothing for a
    controller from before the quorum (it answers no DescribeQuorum and writes no
    LeaderChangeRecord)."""
    quorum = model.quorum
    voters = {
        k: v
        for k, v in (model.processes or {}).items()
        if k.startswith("controller-") and v.state != "running"
    }
    leader = model.quorum_leader()
    if quorum is None and leader is None and not voters:
        return
    text.append("quorum ")
    if leader is not None:
        epoch = "?" if leader[1] < 0 else str(leader[1])
        text.append(f"leader {leader[0]}", style="bold")
        text.append(f" epoch {epoch}")
        if quorum is not None and quorum.high_watermark >= 0:
            text.append(f" HW {quorum.high_watermark}")
    elif quorum is not None:
        text.append("NO LEADER", style="bold red")
        if quorum.why_no_leader:
            text.append(f": {quorum.why_no_leader}", style="red")
    if quorum is not None and quorum.voters:
        text.append(f"  {quorum.answered}/{quorum.voters} voters answering")
    for name, info in sorted(voters.items()):
        text.append(
            f"  {name} {info.state}", style="bold red" if info.state == "stopped" else "magenta"
        )
    text.append("\n")


def _header(model: WatchModel, now_ms: int, rows: list[PartitionRow]) -> Text:
    text = Text()
    text.append("minibroker watch", style="bold")
    if model.cluster is not None:
        text.append(f"  cluster {model.cluster.cluster_id}")
    text.append(f"  {format_time(now_ms)} UTC\n")
    text.append("controller ")
    text.append(model.controller_address or "?")
    text.append(" ")
    controller = model.controller
    if controller.reachable is None:
        text.append("not reached yet", style="yellow")
    else:
        text.append_text(_reach_text(controller, now_ms))
    if model.processes is not None and "controller" in model.processes:
        state = model.processes["controller"].state
        if state != "running":
            text.append(f" (process {state})", style="bold red")
    if model.discovery_error and not model.controller.reachable:
        text.append(f"  ({model.discovery_error})", style="red")
    high = max(model.high_offset, model.image.next_offset)
    text.append(f"  metadata offset {model.image.next_offset}/{high}\n")
    _quorum_line(model, text)
    faults = model.fault_texts()
    if faults:
        text.append("network faults: ", style="bold magenta")
        text.append("; ".join(faults), style="magenta")
        text.append("  (`minibroker cluster heal` clears them)\n")
    offline = sum(1 for r in rows if r.offline)
    under_min = sum(1 for r in rows if r.under_min_isr)
    under = sum(1 for r in rows if r.under_replicated)
    text.append(f"{len(rows)} partitions: ")
    text.append(f"{offline} offline", style=OFFLINE_STYLE if offline else "")
    text.append(", ")
    text.append(f"{under} under-replicated", style=UNDER_REPLICATED_STYLE if under else "")
    if under_min:
        text.append(", ")
        text.append(f"{under_min} under-min-isr", style=UNDER_MIN_ISR_STYLE)
    return text


def _brokers_table(rows: list[BrokerRow], now_ms: int) -> Table:
    table = Table(title="brokers", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("ID", "ADDRESS", "RACK", "STATUS", "FENCED", "PROCESS", "RPC", "HEARTBEAT"):
        table.add_column(name, no_wrap=name != "RPC")
    table.add_column("EPOCH", justify="right")
    table.add_column("LEADERS", justify="right")
    table.add_column("REPLICAS", justify="right")
    for row in rows:
        fenced = "-" if row.fenced is None else ("yes" if row.fenced else "no")
        if row.in_controlled_shutdown:
            fenced += " (shutdown)"
        heartbeat = "-" if row.heartbeat_ms_ago in (None, -1) else _seconds(row.heartbeat_ms_ago)
        table.add_row(
            str(row.broker_id),
            row.address,
            row.rack or "-",
            Text(row.status, style=_BROKER_STATUS_STYLES.get(row.status, "")),
            Text(fenced, style="red" if row.fenced else ""),
            row.process or "-",
            _reach_text(row.reach, now_ms),
            heartbeat,
            "-" if row.broker_epoch < 0 else str(row.broker_epoch),
            str(row.leader_count),
            str(row.replica_count),
        )
    return table


def _cell_text(cell: ReplicaCell) -> Text:
    text = Text()
    text.append(
        f"{cell.broker_id}{'*' if cell.is_leader else ''}", style="bold" if cell.is_leader else ""
    )
    text.append(":")
    text.append("?" if cell.leo is None else str(cell.leo))
    if cell.lag:
        text.append(f" lag {cell.lag}", style="yellow")
    if cell.adding:
        text.append(" +new", style="cyan")
    if cell.removing:
        text.append(" -old", style="magenta")
    if not cell.in_isr:
        text.append(" !isr", style="yellow")
    if cell.problem:
        text.append(f" {cell.problem}", style="red")
    return text


def _row_style(row: PartitionRow) -> str:
    if row.offline:
        return OFFLINE_STYLE
    if row.under_min_isr or row.unclean:
        return UNDER_MIN_ISR_STYLE
    if row.under_replicated or row.leader_unreachable:
        return UNDER_REPLICATED_STYLE
    return ""


def _pick_rows(rows: list[PartitionRow], limit: int | None) -> tuple[list[PartitionRow], int]:
    """At most `limit` rows, keeping every problem row first and healthy rows as room allows
    (in their natural order); returns the rows and how many healthy ones were left out."""
    if limit is None or len(rows) <= limit:
        return rows, 0
    keep = {id(r) for r in rows if r.problems}
    room = max(limit - len(keep), 0)
    for row in rows:
        if room == 0:
            break
        if id(row) not in keep:
            keep.add(id(row))
            room -= 1
    shown = [r for r in rows if id(r) in keep]
    return shown, len(rows) - len(shown)


def _partitions_table(rows: list[PartitionRow], limit: int | None) -> Table:
    shown, hidden = _pick_rows(rows, limit)
    caption = f"... {hidden} healthy partitions not shown" if hidden else None
    table = Table(
        title="partitions (replica:LEO, * leader)",
        title_justify="left",
        caption=caption,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("TOPIC", no_wrap=True)
    table.add_column("P", justify="right")
    table.add_column("LEADER", justify="right")
    table.add_column("EPOCH", justify="right")
    table.add_column("ISR", no_wrap=True)
    table.add_column("HW", justify="right")
    table.add_column("REPLICAS")
    table.add_column("STATUS")
    for row in shown:
        replicas = Text("  ").join(_cell_text(c) for c in row.cells)
        status = ", ".join(row.problems) or "ok"
        if row.reassigning:
            status += " (moving)"
        if not row.from_controller:
            status += " (from brokers)"
        table.add_row(
            row.topic,
            str(row.partition),
            "none" if row.leader == NO_LEADER else str(row.leader),
            str(row.leader_epoch),
            "[" + ",".join(str(i) for i in row.isr) + "]",
            "?" if row.high_watermark is None else str(row.high_watermark),
            replicas,
            status,
            style=_row_style(row),
        )
    return table


def _events_table(events: list[ClusterEvent], rows: int) -> Table:
    table = Table(
        title="events (UTC)", title_justify="left", box=None, pad_edge=False, show_header=False
    )
    table.add_column("TIME", no_wrap=True, style="dim")
    table.add_column("KIND", no_wrap=True)
    table.add_column("EVENT")
    recent = events[-rows:] if rows > 0 else []
    for event in recent:
        style = _EVENT_STYLES.get(event.kind, "")
        table.add_row(
            format_time(event.timestamp_ms), Text(str(event.kind), style=style), event.text
        )
    if not recent:
        table.add_row("", "", Text("no events yet", style="dim"))
    return table


def _groups_table(rows: list[GroupRow]) -> Table:
    table = Table(
        title="consumer groups (lag: HW - committed offset)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("GROUP", no_wrap=True)
    table.add_column("STATE", no_wrap=True)
    table.add_column("MEMBERS", justify="right")
    table.add_column("STRATEGY")
    table.add_column("LAG", justify="right")
    for row in rows:
        state_style = "" if row.state in ("Stable", "Empty") else "yellow"
        lag = "-" if row.total_lag is None else str(row.total_lag)
        table.add_row(
            row.group_id,
            Text(row.state or "-", style=state_style),
            str(row.members),
            row.protocol or "-",
            Text(lag, style="yellow" if row.total_lag else ""),
        )
    return table


def render(
    model: WatchModel,
    now_ms: int,
    topic: str | None = None,
    event_rows: int = DEFAULT_EVENT_ROWS,
    max_partition_rows: int | None = None,
) -> RenderableType:
    """One frame: header, brokers, partitions (of `topic` only when given), consumer groups
    (state, members, total lag) when there are any, recent events."""
    rows = model.partition_rows(topic)
    events = model.events
    if topic is not None:
        # Broker-wide events (fencing, restarts) explain what happens to the topic's partitions.
        events = [e for e in events if e.topic is None or e.topic == topic]
    parts: list[RenderableType] = [
        _header(model, now_ms, rows),
        _brokers_table(model.broker_rows(), now_ms),
        _partitions_table(rows, max_partition_rows),
    ]
    groups = model.group_rows()
    if groups:  # shown once a group exists
        parts.append(_groups_table(groups))
    parts.append(_events_table(events, event_rows))
    return Group(*parts)


__all__ = ["format_time", "render"]
