"""`minibroker watch` against a real local cluster, through kills and restarts.

What a person watching a failover must see (docs/design.md §3, §6, §7): the killed broker as stopped
and fenced, the election that replaced it with its epochs, under-replicated and offline partitions
named as such, the controller's outage and return (the metadata stream reconnects and keeps
delivering records), and the truncation a restarted ex-leader does when it rejoins after an
unclean election, which the broker describes (a watch without the launcher's files sees it too).
Frames are rendered to a recorded console and asserted on as text.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import pathlib
import subprocess
import sys
import time
from collections.abc import Callable

import grpc
import pytest
from cluster_harness import LocalCluster, local_cluster
from rich.console import Console

from minibroker.client.watch.events import EventKind
from minibroker.client.watch.live import Watcher, WatchOptions, options_for
from minibroker.client.watch.model import WatchModel
from minibroker.client.watch.rows import PartitionRow
from minibroker.proto import minibroker_pb2 as pb
from minibroker.proto import minibroker_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

SETTINGS = {
    "leader.imbalance.check.interval.seconds": "3600",  # no automatic moves between our steps
    "auto.leader.rebalance.enable": "false",
}


def create_topic(cluster: LocalCluster, name: str, partitions: int, **configs: str) -> None:
    with grpc.insecure_channel(cluster.controller_address) as channel:
        reply = pb_grpc.ControllerServiceStub(channel).CreateTopics(
            pb.CreateTopicsRequest(
                topics=[
                    pb.CreatableTopic(
                        name=name,
                        num_partitions=partitions,
                        replication_factor=3,
                        configs=configs,
                    )
                ],
                timeout_ms=10_000,
            ),
            timeout=15,
        )
    assert reply.topics[0].error_code == pb.NONE, reply.topics[0].error_message


def produce(cluster: LocalCluster, topic: str, count: int, acks: str, partition: int) -> None:
    """Through the `produce` command: its own process, its own client."""
    lines = "".join(f"record-{i}\n" for i in range(count))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "minibroker.deploy",
            "produce",
            topic,
            "--acks",
            acks,
            "--partition",
            str(partition),
            "--bootstrap-server",
            cluster.bootstrap,
        ],
        input=lines,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def frame_text(watcher: Watcher, width: int = 220) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), color_system=None)
    console.print(watcher.frame(event_rows=500))
    return console.export_text()


def row(model: WatchModel, topic: str, partition: int) -> PartitionRow | None:
    return next((r for r in model.partition_rows(topic) if r.partition == partition), None)


def line_with(text: str, *needles: str) -> str:
    for line in text.splitlines():
        if all(n in line for n in needles):
            return line
    raise AssertionError(f"no line with {needles!r} in:\n{text}")


async def until(predicate: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        await asyncio.sleep(0.05)


async def test_once_frame_after_the_leader_is_killed(tmp_path: pathlib.Path) -> None:
    directory = str(tmp_path / "cluster")
    with local_cluster(directory, brokers=3, settings=SETTINGS) as cluster:
        await asyncio.to_thread(create_topic, cluster, "orders", 2)
        await asyncio.to_thread(produce, cluster, "orders", 20, "all", 0)
        options = WatchOptions(bootstrap=(cluster.bootstrap,), cluster_dir=directory)

        async def once() -> tuple[str, WatchModel]:
            async with Watcher(options) as watcher:
                assert await watcher.run_once(Console(file=io.StringIO()))
                return frame_text(watcher), watcher.model

        _, model = await once()
        before = row(model, "orders", 0)
        assert before is not None and before.high_watermark == 20
        leader = before.leader
        await asyncio.to_thread(cluster.kill, leader)

        deadline = time.monotonic() + 30
        while True:
            text, model = await once()
            now = row(model, "orders", 0)
            # Right after the election the new leader's HW may lag the old one's (docs/design.md §5)
            # until its followers fetch again; wait for both.
            if now is not None and now.leader not in (leader, -1) and now.high_watermark == 20:
                break
            assert time.monotonic() < deadline, f"no new leader of orders-0:\n{text}"
            await asyncio.sleep(0.1)
        new_leader = now.leader
        broker = line_with(text, f"127.0.0.1:{cluster.spec(leader).port} ")
        assert "stopped" in broker and "UNREACHABLE" in broker
        p0 = line_with(text, "orders", f"{new_leader}*:")
        assert "under-replicated" in p0
        assert f"{leader}:" in p0 and "stopped" in p0
        assert " 20 " in p0  # the HW survived the failover (acks=all)
        assert f"orders-0 leader {leader} -> {new_leader}" in text
        assert f"out [{leader}]" in text
        assert "2 partitions: 0 offline, 2 under-replicated" in text

        # The command itself, as a script would run it.
        cli = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "minibroker.deploy",
                "watch",
                "--once",
                "--cluster-dir",
                directory,
                "--width",
                "220",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode == 0, cli.stderr
        assert f"orders-0 leader {leader} -> {new_leader}" in cli.stdout
        assert "stopped" in line_with(cli.stdout, f"127.0.0.1:{cluster.spec(leader).port} ")


async def test_live_watch_across_controller_restart_unclean_election_and_truncation(
    tmp_path: pathlib.Path,
) -> None:
    directory = str(tmp_path / "cluster")
    with local_cluster(directory, brokers=3, settings=SETTINGS) as cluster:
        options = WatchOptions(
            bootstrap=(cluster.bootstrap,),
            cluster_dir=directory,
            poll_interval_s=0.1,
            rpc_timeout_s=0.5,
        )
        stop = asyncio.Event()
        async with Watcher(options) as watcher:
            model = watcher.model
            console = Console(file=io.StringIO(), width=200)
            live = asyncio.create_task(watcher.run_live(console, stop))
            try:
                await asyncio.to_thread(
                    create_topic, cluster, "t", 1, **{"unclean.leader.election.enable": "true"}
                )
                await asyncio.to_thread(produce, cluster, "t", 10, "all", 0)
                await until(
                    lambda: (r := row(model, "t", 0)) is not None and r.high_watermark == 10,
                    30,
                    "HW 10 on t-0",
                )
                first = row(model, "t", 0)
                assert first is not None
                leader = first.leader
                followers = [b for b in first.replicas if b != leader]

                # The controller dies and comes back: shown as such, and the stream resumes.
                await asyncio.to_thread(cluster.kill, "controller")
                await until(lambda: model.controller.reachable is False, 30, "controller down")
                await asyncio.to_thread(cluster.start, "controller")
                await until(lambda: model.controller.reachable, 30, "controller back")

                # Followers die: the ISR shrinks to the leader, which takes 5 more alone.
                for b in followers:
                    await asyncio.to_thread(cluster.kill, b)
                await until(
                    lambda: (r := row(model, "t", 0)) is not None and r.isr == (leader,),
                    30,
                    "ISR shrunk to the leader",
                )
                await asyncio.to_thread(produce, cluster, "t", 5, "1", 0)
                await until(
                    lambda: (
                        (r := row(model, "t", 0)) is not None
                        and r.cells[r.replicas.index(leader)].leo == 15
                    ),
                    30,
                    "LEO 15 on the leader",
                )
                # The leader dies: the partition is offline (the ISR keeps its last member).
                await asyncio.to_thread(cluster.kill, leader)
                await until(
                    lambda: (r := row(model, "t", 0)) is not None and r.offline,
                    30,
                    "t-0 offline",
                )
                # A follower returns and leads uncleanly with 10 records; the old leader comes
                # back, finds its log diverged and truncates its 5 unreplicated records.
                for b in followers:
                    await asyncio.to_thread(cluster.start, b)
                await asyncio.to_thread(cluster.start, leader)
                await until(
                    lambda: any(
                        e.kind is EventKind.TRUNCATION and e.broker_id == leader
                        for e in model.events
                    ),
                    60,
                    f"a truncation on broker {leader}",
                )
                await until(
                    lambda: (r := row(model, "t", 0)) is not None and leader in r.isr,
                    60,
                    f"broker {leader} back in the ISR",
                )
                # A watch without the launcher's directory (a remote cluster: no log files to
                # read) learns of the truncation too: the broker describes it.
                async with Watcher(options_for(cluster.bootstrap, None, None)) as remote:
                    assert await remote.run_once(Console(file=io.StringIO()))
                    remote_text = frame_text(remote)
            finally:
                stop.set()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait_for(live, 10)
            assert live.exception() is None
            text = frame_text(watcher)

    events = text.split("events (UTC)")[1]
    assert "controller unreachable" in events
    assert "controller reachable again" in events
    # Killed and restarted between two looks at /proc, it shows as a restart.
    assert "controller process exited" in events or "controller process restarted" in events
    assert "t-0 offline: leader" in events
    new_leader = next(
        e for e in model.events if e.kind is EventKind.ELECTION and "UNCLEAN" in e.text
    )
    assert "leader none ->" in new_leader.text
    assert f"t-0 on broker {leader} truncated 15 -> 10, 5 offsets removed" in events
    assert f"t-0 on broker {leader} truncated 15 -> 10, 5 offsets removed" in remote_text
    assert f"in [{leader}]" in events  # the ISR expansion that brought it back
    # Ordered as they happened: offline before the unclean election before the truncation.
    kinds = [e.kind for e in model.events if e.topic == "t"]
    assert kinds.index(EventKind.OFFLINE) < kinds.index(EventKind.TRUNCATION)
    final = row(model, "t", 0)
    assert final is not None and not final.offline and leader in final.isr
    assert "offline" not in line_with(text, f"{final.leader}*:")
