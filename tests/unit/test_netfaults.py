"""The network fault table (client/common/netfaults.py): parsing the launcher's faults.json,
rejecting bad files, link lookup, delays and the seeded loss schedule, and the process's view of
the file (reload on change, a bad file keeps the previous table)."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
from typing import Any

import grpc
import pytest

from minibroker.broker.config import build_config as broker_config
from minibroker.client.common import netfaults
from minibroker.client.common.netfaults import (
    EMPTY,
    MAX_RETRANSMISSIONS,
    RTO_S,
    FaultFileError,
    Link,
    NetFaults,
    load_faults,
    parse_faults,
    retransmission_s,
)
from minibroker.controller.config import build_config as controller_config

NODES = {
    "broker-1": "127.0.0.1:40001",
    "broker-2": "127.0.0.1:40002",
    "broker-3": "127.0.0.1:40003",
    "controller-1": "127.0.0.1:40100",
}


def text(**fields: object) -> str:
    data: dict[str, object] = {"version": 1, "generation": 3, "nodes": NODES}
    data.update(fields)
    return json.dumps(data)


def test_the_spec_example_parses() -> None:
    table = parse_faults(
        text(
            cut=[["broker-1", "controller-1"], ["broker-1", "broker-2"]],
            no_clients=["broker-1"],
            slow={"broker-2": {"delay_ms": 200, "loss": 0.1}},
            events=[{"at": 1790000000.5, "text": "broker 1 isolated from every other node"}],
        )
    )
    assert table.generation == 3
    assert not table.empty
    assert table.is_cut("broker-1", "controller-1") and table.is_cut("controller-1", "broker-1")
    assert table.is_cut("broker-2", "broker-1")
    assert not table.is_cut("broker-2", "broker-3")
    assert table.no_clients == {"broker-1"}
    assert table.slow["broker-2"].delay_ms == 200 and table.slow["broker-2"].loss == 0.1
    assert table.events == ((1790000000.5, "broker 1 isolated from every other node"),)
    assert table.cut_from("broker-1") == ["broker-2", "controller-1"]
    assert table.cut_from("broker-3") == []
    assert "cut broker-1|broker-2, broker-1|controller-1" in table.summary()


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"cut": [], "no_clients": [], "slow": {}},
        {"slow": {"broker-1": {"delay_ms": 0, "loss": 0}}},  # a slow of nothing is no fault
    ],
)
def test_no_fault_tables_are_empty(fields: dict[str, object]) -> None:
    assert parse_faults(text(**fields)).empty


@pytest.mark.parametrize(
    ("raw", "complaint"),
    [
        ("{", "not JSON"),
        ("[]", "JSON object"),
        (json.dumps({"version": 2, "nodes": {}}), "version 2"),
        (text(generation=-1), "generation"),
        (text(generation="7"), "generation"),
        (json.dumps({"version": 1, "nodes": {"broker-1": "nowhere"}}), "host:port"),
        (text(cut=[["broker-1"]]), "pair"),
        (text(cut=[["broker-1", "broker-1"]]), "itself"),
        (text(cut=[["broker-1", "broker-9"]]), "'broker-9' is not in nodes"),
        (text(cut="broker-1"), "cut"),
        (text(no_clients=["broker-9"]), "not in nodes"),
        (text(slow={"broker-1": {"delay_ms": -1}}), "delay_ms: must be >= 0"),
        (text(slow={"broker-1": {"delay_ms": "200"}}), "expected a number"),
        (text(slow={"broker-1": {"loss": 1.0}}), "loss: must be in [0, 1)"),
        (text(slow={"broker-1": {"loss": -0.1}}), "loss: must be in [0, 1)"),
        (text(slow={"broker-1": 200}), "delay_ms, loss"),
        (text(events=[{"at": 1}]), "events"),
    ],
)
def test_bad_files_are_refused_with_the_reason(raw: str, complaint: str) -> None:
    with pytest.raises(FaultFileError, match=re.escape(complaint)):
        parse_faults(raw)


def test_link_lookup_by_address_then_by_port() -> None:
    table = parse_faults(text())
    assert table.node_at("127.0.0.1:40002") == "broker-2"
    # localhost and 127.0.0.1 are the same machine: the port alone names the process.
    assert table.node_at("localhost:40100") == "controller-1"
    assert table.node_at("127.0.0.1:1") is None
    shared = parse_faults(
        json.dumps({"version": 1, "nodes": {"a": "10.0.0.1:5000", "b": "10.0.0.2:5000"}})
    )
    assert shared.node_at("10.0.0.2:5000") == "b"
    assert shared.node_at("localhost:5000") is None  # ambiguous: never guessed


def test_delays_add_and_losses_combine_over_both_ends() -> None:
    table = parse_faults(
        text(
            cut=[["broker-1", "broker-2"]],
            slow={
                "broker-2": {"delay_ms": 200, "loss": 0.1},
                "broker-3": {"delay_ms": 50, "loss": 0.5},
            },
        )
    )
    assert table.link("broker-1", "broker-3") == Link(cut=False, delay_s=0.05, loss=0.5)
    both = table.link("broker-2", "broker-3")
    assert both.delay_s == pytest.approx(0.25)
    assert both.loss == pytest.approx(1 - 0.9 * 0.5)
    assert table.link("broker-3", "broker-2") == both
    cut = table.link("broker-1", "broker-2")
    assert cut.cut and cut.delay_s == pytest.approx(0.2)
    assert table.link("broker-1", "controller-1") == Link(cut=False, delay_s=0.0, loss=0.0)
    assert table.link("broker-2", "broker-2") == Link(cut=False, delay_s=0.0, loss=0.0)


class Scripted(random.Random):
    """An rng that returns the given draws."""

    def __init__(self, draws: list[float]) -> None:
        super().__init__(0)
        self.draws = list(draws)

    def random(self) -> float:
        return self.draws.pop(0)


def test_each_consecutive_loss_costs_a_doubled_rto() -> None:
    assert retransmission_s(Scripted([0.5]), 0.1) == 0.0  # sent at once
    assert retransmission_s(Scripted([0.05, 0.5]), 0.1) == pytest.approx(RTO_S)
    assert retransmission_s(Scripted([0.05, 0.05, 0.05, 0.5]), 0.1) == pytest.approx(
        RTO_S * (1 + 2 + 4)
    )
    assert retransmission_s(Scripted([]), 0.0) == 0.0  # no loss: no draw at all
    # Bounded: a message is never lost for good.
    worst = retransmission_s(Scripted([0.0] * MAX_RETRANSMISSIONS), 0.99)
    assert worst == pytest.approx(RTO_S * (2**MAX_RETRANSMISSIONS - 1))


def test_the_loss_schedule_is_seeded_and_about_the_rate() -> None:
    link = Link(cut=False, delay_s=0.01, loss=0.2)
    first = [link.message_delay_s(random.Random(42)) for _ in range(3)]
    again = [link.message_delay_s(random.Random(42)) for _ in range(3)]
    assert first == again
    rng = random.Random(7)
    delays = [link.message_delay_s(rng) for _ in range(2000)]
    assert min(delays) == pytest.approx(0.01)
    retransmitted = sum(1 for d in delays if d > 0.011)
    assert 300 < retransmitted < 500  # about 20% of 2000


def test_missing_file_is_no_fault(tmp_path: os.PathLike[str]) -> None:
    assert load_faults(os.path.join(tmp_path, "faults.json")) is EMPTY


def write(path: str, content: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(content)
    os.replace(tmp, path)


def test_the_process_view_reloads_on_change_and_keeps_the_table_on_a_bad_file(
    tmp_path: os.PathLike[str],
) -> None:
    path = os.path.join(tmp_path, "faults.json")
    faults = NetFaults(path, "broker-1")
    assert not faults.load() and faults.active is None  # no file yet
    write(path, text(cut=[["broker-1", "broker-2"]]))
    assert faults.load()
    assert faults.active is not None and faults.link_to("127.0.0.1:40002").cut
    assert not faults.link_to("127.0.0.1:40003").cut
    assert not faults.link_to("127.0.0.1:9").cut  # not a launcher process: never faulted
    assert not faults.load()  # unchanged file: nothing to do
    write(path, "{ half a file")
    assert not faults.load()
    assert faults.link_to("127.0.0.1:40002").cut  # the previous table is kept
    write(path, text(generation=4))
    assert faults.load()
    assert faults.active is None and faults.table.generation == 4
    os.remove(path)
    write(path, text(generation=5, no_clients=["broker-1"]))
    assert faults.load() and faults.active is not None
    os.remove(path)
    assert faults.load() and faults.active is None  # file removed (cluster down): no fault


def test_a_same_size_rewrite_within_one_mtime_tick_is_seen(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "faults.json")
    faults = NetFaults(path, "broker-1")
    write(path, text(cut=[["broker-1", "broker-2"]]))
    assert faults.load() and faults.link_to("127.0.0.1:40002").cut
    before = os.stat(path)
    with open(path, "r+") as f:  # same file, same size, same mtime: only the bytes differ
        f.write(text(cut=[["broker-1", "broker-3"]]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
        before.st_size,
        before.st_mtime_ns,
        before.st_ino,
    )
    assert faults.load()
    assert faults.link_to("127.0.0.1:40003").cut and not faults.link_to("127.0.0.1:40002").cut


class Recorder:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.lines.append((level, event, kw))


def test_a_table_that_does_not_name_this_node_is_warned_about(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorder = Recorder()
    monkeypatch.setattr(netfaults, "log", recorder)
    faults = NetFaults("unused", "broker-9")  # a launcher bug: never faulted, silently
    faults.set_table(parse_faults(text(cut=[["broker-1", "broker-2"]])))
    warned = [kw for level, event, kw in recorder.lines if event == "network_faults_node_unknown"]
    assert warned and warned[0]["node"] == "broker-9" and recorder.lines[-1][0] == "warning"
    recorder.lines.clear()
    NetFaults("unused", "broker-1").set_table(parse_faults(text()))
    NetFaults("unused", "broker-9").set_table(EMPTY)  # no file: no nodes to be missing from
    assert [event for _, event, _ in recorder.lines] == ["network_faults_changed"] * 2


# -- holding, without grpc ----------------------------------------------------------------


def cut_12() -> NetFaults:
    faults = NetFaults("unused", "broker-1")
    faults.set_table(parse_faults(text(cut=[["broker-1", "broker-2"]])))
    return faults


async def test_held_messages_share_one_waiter_and_leave_none_behind() -> None:
    faults = cut_12()
    held = [
        asyncio.ensure_future(faults.hold("127.0.0.1:40002", time.monotonic() + 30))
        for _ in range(3)
    ]
    while faults.held < 3:
        await asyncio.sleep(0.005)
    assert len(faults._aio_changed) == 1  # one future for the loop, not one per message
    for _ in range(5):  # held, then timed out: nothing stays registered for them
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await faults.hold("127.0.0.1:40002", time.monotonic() + 0.01)
        assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert len(faults._aio_changed) == 1 and faults.held == 3
    faults.set_table(parse_faults(text()))  # heal
    await asyncio.wait_for(asyncio.gather(*held), 10)
    assert faults._aio_changed == {} and faults.held == 0


async def test_a_slow_links_delay_ends_when_the_call_does() -> None:
    faults = NetFaults("unused", "broker-1")
    faults.set_table(parse_faults(text(slow={"broker-2": {"delay_ms": 600_000}})))
    done = asyncio.get_running_loop().create_future()
    done.set_result(None)  # the call ended: its message is not delayed any more
    # The deadline is shorter than the delay: the hold still ends with the call, not at it.
    await asyncio.wait_for(faults.hold("127.0.0.1:40002", time.monotonic() + 300, done), 10)


class Counting(NetFaults):
    lookups = 0

    def link_to(self, address: str) -> Link:
        self.lookups += 1
        return super().link_to(address)


async def test_a_message_looks_its_link_up_once() -> None:
    faults = Counting("unused", "broker-1")
    faults.set_table(parse_faults(text(slow={"broker-2": {"delay_ms": 1}})))
    await faults.hold("127.0.0.1:40002")
    assert faults.lookups == 1
    faults.hold_sync("127.0.0.1:40002")
    assert faults.lookups == 2
    await faults.hold("127.0.0.1:40003")  # an open link
    assert faults.lookups == 3


@pytest.mark.parametrize("build", [broker_config, controller_config])
def test_both_processes_take_the_settings(build: object, tmp_path: os.PathLike[str]) -> None:
    base = {"node.id": "1"}
    if build is broker_config:
        base["log.dirs"] = str(tmp_path)
    config = build(base)  # type: ignore[operator]
    assert NetFaults.from_config(config) is None  # the default: no layer at all
    config = build(  # type: ignore[operator]
        {
            **base,
            "network.faults.file": "/x/faults.json",
            "network.faults.node": "broker-1",
            "network.faults.poll.ms": "50",
        }
    )
    faults = NetFaults.from_config(config)
    assert faults is not None
    assert (faults.path, faults.node, faults._poll_s) == ("/x/faults.json", "broker-1", 0.05)
