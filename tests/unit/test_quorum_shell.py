"""The quorum shell's follower side over a real RaftLog in a tmp dir and a stand-in leader stub
(no sockets): what it does with a leader's snapshot (controller/quorum/shell.py)."""

from __future__ import annotations

import asyncio
import pathlib
import random
from collections.abc import Sequence
from typing import Any

from minibroker.controller.quorum.core import QuorumCore
from minibroker.controller.quorum.messages import (
    Event,
    OffsetAndEpoch,
    QuorumSettings,
    QuorumState,
    RoleChanged,
)
from minibroker.controller.quorum.raft_log import RaftBatch, RaftLog
from minibroker.controller.quorum.shell import QuorumShell
from minibroker.metadata.records import LogEntry, MetadataRecord, NoOpRecord, TopicRecord
from minibroker.metadata.wire import record_to_pb
from minibroker.proto import minibroker_pb2 as pb


class Listener:
    def __init__(self) -> None:
        self.installed: list[OffsetAndEpoch] = []

    def on_role_changed(self, change: RoleChanged) -> None: ...

    def on_committed(self, entries: Sequence[LogEntry], high_watermark: int) -> None: ...

    def on_snapshot_installed(
        self, records: Sequence[MetadataRecord], snapshot_id: OffsetAndEpoch
    ) -> None:
        self.installed.append(snapshot_id)

    def on_quorum_event(self, event: Event) -> None: ...

    def on_quorum_state(self, state: QuorumState) -> None: ...

    def on_quorum_failed(self, error: BaseException) -> None:
        raise AssertionError(f"the shell failed: {error!r}")


class LeaderStub:
    """Answers FetchSnapshot with one snapshot."""

    def __init__(self, snapshot_id: OffsetAndEpoch, records: list[MetadataRecord]) -> None:
        self.snapshot_id = snapshot_id
        self.records = records
        self.calls = 0

    async def FetchSnapshot(self, request: Any, timeout: float) -> pb.FetchSnapshotResponse:
        self.calls += 1
        return pb.FetchSnapshotResponse(
            leader_epoch=4,
            leader_id=2,
            snapshot_id=pb.SnapshotId(
                end_offset=self.snapshot_id.offset, epoch=self.snapshot_id.epoch
            ),
            records=[record_to_pb(r) for r in self.records],
        )


def _batch(epoch: int, start: int, end: int) -> RaftBatch:
    return RaftBatch(epoch, tuple(LogEntry(o, o, NoOpRecord()) for o in range(start, end)))


def test_a_snapshot_over_a_divergent_tail_is_installed(tmp_path: pathlib.Path) -> None:
    """The follower's log reaches past the snapshot's offset with an uncommitted tail of an
    older epoch (epoch 3 at 5..7) than the snapshot's last record (epoch 4 at 7): the leader
    answers SNAPSHOT for as long as that tail is there, so the shell must install it (it
    skipped it before: found by review)."""

    async def scenario() -> None:
        log = RaftLog(tmp_path)
        log.load()
        log.append([_batch(1, 0, 5), _batch(3, 5, 8)])
        listener = Listener()
        settings = QuorumSettings(node_id=1, voters=(1, 2, 3))
        shell = QuorumShell(
            settings=settings,
            voters=(),
            cluster_id="c",
            raft_log=log,
            listener=listener,  # type: ignore[arg-type]
            header_voters="",
        )
        shell._core = QuorumCore(settings, QuorumState(4, -1, 2), log, random.Random(1), 0)
        shell.applied_offset = 5  # committed through epoch 1
        snapshot = OffsetAndEpoch(8, 4)
        stub = LeaderStub(snapshot, [TopicRecord("t", "id-t", {})])
        await shell._fetch_snapshot(stub, snapshot)  # type: ignore[arg-type]
        assert listener.installed == [snapshot]
        assert (log.start_offset, log.end_offset) == (8, 8)
        assert log.last_fetched_epoch() == 4
        assert shell.applied_offset == 8
        # Held already (its last record's epoch matches): not installed again.
        await shell._fetch_snapshot(stub, snapshot)  # type: ignore[arg-type]
        assert listener.installed == [snapshot]
        log.close()

    asyncio.run(scenario())


def test_a_failing_background_task_stops_the_voter(tmp_path: pathlib.Path) -> None:
    """A disk error or a bug in the tick loop must reach the app (which stops the process so
    the others re-elect), not end the task silently and leave a zombie voter."""

    async def scenario() -> None:
        log = RaftLog(tmp_path)
        log.load()
        failures: list[BaseException] = []
        listener = Listener()
        listener.on_quorum_failed = failures.append  # type: ignore[method-assign]
        settings = QuorumSettings(node_id=1, voters=(1, 2, 3))
        shell = QuorumShell(
            settings=settings,
            voters=(),
            cluster_id="c",
            raft_log=log,
            listener=listener,  # type: ignore[arg-type]
            header_voters="",
        )
        core = QuorumCore(settings, QuorumState(4, -1, 2), log, random.Random(1), 0)
        shell._core = core

        def broken(now_ms: int) -> list[Any]:
            raise OSError(28, "No space left on device")

        core.tick = broken  # type: ignore[method-assign]
        task = asyncio.create_task(shell._tick_loop())
        await asyncio.wait_for(task, 10)  # ends, having reported the failure
        assert len(failures) == 1 and isinstance(failures[0], OSError)
        log.close()

    asyncio.run(scenario())
