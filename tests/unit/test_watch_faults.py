"""`watch` and the local launcher's network faults (SPEC-15 §2), without processes.

The launcher writes faults.json (`cluster partition/isolate/slow/heal`); `watch` reads it next
to cluster.json: each command is a timeline event at the time it was given, a heal is "network
healed", and the header has a line while any fault is set.
"""

from __future__ import annotations

import pathlib

from rich.console import Console

from minibroker.client.watch.events import EventKind
from minibroker.client.watch.live import Watcher, WatchOptions, read_faults_file
from minibroker.client.watch.model import WatchModel
from minibroker.client.watch.observations import FaultsInfo, faults_from_json
from minibroker.client.watch.render import render
from minibroker.deploy import cluster as launcher

T0 = 1_790_000_000_000


def frame_text(model: WatchModel, now_ms: int) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(render(model, now_ms))
    return console.export_text()


def network_events(model: WatchModel) -> list[tuple[int, str]]:
    return [(e.timestamp_ms, e.text) for e in model.events if e.kind == EventKind.NETWORK]


def test_faults_from_json() -> None:
    data = {
        "version": 1,
        "generation": 3,
        "cut": [["broker-1", "controller-1"]],
        "events": [{"at": T0 / 1000, "text": "broker 1 isolated from the controllers"}],
    }
    assert faults_from_json(data) == FaultsInfo(
        3, True, ((T0, "broker 1 isolated from the controllers"),)
    )
    assert faults_from_json({**data, "cut": []}) == FaultsInfo(
        3, False, ((T0, "broker 1 isolated from the controllers"),)
    )
    assert faults_from_json({"version": 1, "slow": {"broker-2": {}}}).active  # type: ignore[union-attr]
    for bad in ([], {"version": 2}, {"version": 1, "events": [{"text": "x"}]}):
        assert faults_from_json(bad) is None


def test_commands_are_events_at_their_time_once_and_a_heal_is_one_event() -> None:
    model = WatchModel()
    model.observe_faults(FaultsInfo(), T0)
    assert network_events(model) == []
    one = FaultsInfo(2, True, ((T0 + 5, "broker 1 isolated from every other node"),))
    model.observe_faults(one, T0 + 100)
    model.observe_faults(one, T0 + 200)  # the same table again: nothing new
    two = FaultsInfo(3, True, (*one.events, (T0 + 300, "broker 2 slow: +200 ms, 10% loss")))
    model.observe_faults(two, T0 + 400)
    model.observe_faults(FaultsInfo(4, False, ()), T0 + 500)
    model.observe_faults(FaultsInfo(4, False, ()), T0 + 600)  # healed once
    assert network_events(model) == [
        (T0 + 5, "broker 1 isolated from every other node"),
        (T0 + 300, "broker 2 slow: +200 ms, 10% loss"),
        (T0 + 500, "network healed"),
    ]


def test_faults_already_set_at_the_first_look_are_on_the_timeline_and_no_heal_without_faults() -> (
    None
):
    model = WatchModel()
    model.observe_faults(FaultsInfo(7, True, ((T0, "network partition: broker 1 | broker 2"),)), T0)
    assert network_events(model) == [(T0, "network partition: broker 1 | broker 2")]
    fresh = WatchModel()
    fresh.observe_faults(FaultsInfo(1, False, ()), T0)
    fresh.observe_faults(FaultsInfo(2, False, ()), T0 + 1)
    assert network_events(fresh) == []


def test_header_line_while_faults_are_set() -> None:
    model = WatchModel()
    assert "network faults" not in frame_text(model, T0)
    model.observe_faults(
        FaultsInfo(
            3,
            True,
            (
                (T0, "broker 1 isolated from every other node"),
                (T0 + 1, "broker 2 slow: +200 ms, 10% loss"),
            ),
        ),
        T0 + 2,
    )
    text = frame_text(model, T0 + 2)
    header = text.split("brokers")[0]
    assert (
        "network faults: broker 1 isolated from every other node; broker 2 slow: +200 ms, "
        "10% loss" in header
    )
    events = text.split("events (UTC)")[1]
    assert "network" in events and "broker 1 isolated from every other node" in events
    model.observe_faults(FaultsInfo(4, False, ()), T0 + 3)
    text = frame_text(model, T0 + 3)
    assert "network faults:" not in text and "network healed" in text.split("events (UTC)")[1]


def test_watch_reads_the_launchers_file_next_to_cluster_json(tmp_path: pathlib.Path) -> None:
    directory = str(tmp_path / "mb")
    pathlib.Path(directory).mkdir()
    state = launcher.plan_cluster(directory, 3, 0, 9092, {}, controllers=3)
    launcher.save_state(state)
    assert read_faults_file(directory) == FaultsInfo()  # no file: no fault
    watcher = Watcher(WatchOptions(bootstrap=("127.0.0.1:9092",), cluster_dir=directory))
    watcher._read_local()
    launcher.reset_faults(state)
    launcher.isolate(directory, "1")
    launcher.slow(directory, "2", 200, 0.1)
    watcher._read_local()
    texts = [text for _, text in network_events(watcher.model)]
    assert texts == ["broker 1 isolated from every other node", "broker 2 slow: +200 ms, 10% loss"]
    (pathlib.Path(directory) / "faults.json").write_text("{half")  # kept: the last view stays
    assert read_faults_file(directory) is None
    watcher._read_local()
    assert watcher.model.fault_texts() == texts
    launcher.heal(directory)
    watcher._read_local()
    assert network_events(watcher.model)[-1][1] == "network healed"
    assert watcher.model.fault_texts() == []
