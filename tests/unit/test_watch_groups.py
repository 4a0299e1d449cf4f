"""`watch` shows consumer groups: state, members, strategy and total lag (HW - committed)."""

from __future__ import annotations

from rich.console import Console

from minibroker.client.watch.model import WatchModel
from minibroker.client.watch.render import render
from minibroker.client.watch.rows import group_lag


def test_group_lag_sums_known_partitions_and_never_goes_negative() -> None:
    committed = {("t", 0): 5, ("t", 1): 12, ("u", 0): 3}
    hws: dict[tuple[str, int], int | None] = {("t", 0): 10, ("t", 1): 10, ("u", 0): None}
    assert group_lag(committed, hws) == 5  # 10-5, max(0, 10-12); u-0 has no known HW
    assert group_lag({("u", 0): 3}, hws) is None
    assert group_lag({}, hws) is None


def frame_text(model: WatchModel) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(render(model, 0))
    return console.export_text()


def test_groups_table_appears_once_a_group_exists() -> None:
    model = WatchModel()
    assert "consumer groups" not in frame_text(model)
    model.observe_groups(
        {"billing": ("Stable", 3, "range"), "idle": ("Empty", 0, "")},
        {"billing": {("t", 0): 4}},
    )
    text = frame_text(model)
    assert "consumer groups" in text
    billing = next(line for line in text.splitlines() if line.strip().startswith("billing"))
    assert billing.split() == ["billing", "Stable", "3", "range", "-"]  # no HW known: no lag
    idle = next(line for line in text.splitlines() if line.strip().startswith("idle"))
    assert idle.split()[:3] == ["idle", "Empty", "0"]
