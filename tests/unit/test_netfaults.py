"""The network fault table (client/common/netfaults.py): parsing the launcher's faults.json,
rejecting bad files, link lookup, delays and the seeded loss schedule, and the process's view of
the file (reload on change, a bad file keeps the previous table)."""

from __future__ import annotations

import json
import os
import random
import re

import pytest

from minibroker.broker.config import build_config as broker_config
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
