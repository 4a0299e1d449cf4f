"""The quorum simulation's in-memory metadata log (a `RaftLogView`) and its snapshots.

A record is `(epoch, value)`; every append is durable at once (the view shows durable records
only). Besides the records the log keeps, for every offset it has ever covered (the snapshotted
part included), a *prefix id*: an integer naming the whole log prefix ending at that offset,
interned in one table shared by the run (`PrefixTable`). Two logs hold the same prefix up to an
offset iff their prefix ids there are equal, which turns log matching, leader completeness and
state machine safety into integer comparisons (tests/sim/quorum_sim.py's checker).
"""

from __future__ import annotations

from dataclasses import dataclass

from minibroker.controller.quorum.messages import OffsetAndEpoch

Record = tuple[int, object]  # (epoch, value)


class PrefixTable:
    """Interns (previous prefix id, epoch, value) -> prefix id; 0 is the empty prefix."""

    def __init__(self) -> None:
        self._ids: dict[tuple[int, int, object], int] = {}

    def extend(self, prev: int, epoch: int, value: object) -> int:
        key = (prev, epoch, value)
        pid = self._ids.get(key)
        if pid is None:
            pid = self._ids[key] = len(self._ids) + 1
        return pid


@dataclass(frozen=True)
class Snapshot:
    """The committed state up to `offset` (exclusive): the applied values and prefix ids."""

    offset: int
    epoch: int  # of the record at offset - 1
    values: tuple[object, ...]
    prefix: tuple[int, ...]

    @property
    def id(self) -> OffsetAndEpoch:
        return OffsetAndEpoch(self.offset, self.epoch)


class MemRaftLog:
    """Records from `start_offset` on, after an optional snapshot."""

    def __init__(self, table: PrefixTable) -> None:
        self._table = table
        self._start = 0
        self._snap_epoch = 0
        self.snapshot: Snapshot | None = None
        self.records: list[Record] = []
        self.prefix: list[int] = []  # prefix id at every offset 0..end-1 (snapshotted part too)
        self._epochs: list[tuple[int, int]] = []  # (epoch, start offset) of the records held

    # -- RaftLogView -------------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        return self._start

    @property
    def end_offset(self) -> int:
        return self._start + len(self.records)

    def last_fetched_epoch(self) -> int:
        return self.records[-1][0] if self.records else self._snap_epoch

    def end_offset_for_epoch(self, epoch: int) -> OffsetAndEpoch:
        best = -1
        for i, (e, _) in enumerate(self._epochs):
            if e > epoch:
                break
            best = i
        if best < 0:
            if self._start > 0:
                return OffsetAndEpoch(self._start, self._snap_epoch)
            return OffsetAndEpoch(-1, -1)
        e = self._epochs[best][0]
        end = self._epochs[best + 1][1] if best + 1 < len(self._epochs) else self.end_offset
        return OffsetAndEpoch(end, e)

    def epoch_of(self, offset: int) -> int:
        if self._start <= offset < self.end_offset:
            return self.records[offset - self._start][0]
        if offset == self._start - 1:
            return self._snap_epoch
        return -1

    # -- changes (the shell's) ---------------------------------------------------------------

    def prefix_at(self, end: int) -> int:
        """The prefix id of the log up to `end` (exclusive); -1 when the log does not reach it."""
        if end == 0:
            return 0
        if end > self.end_offset:
            return -1
        return self.prefix[end - 1]

    def append(self, epoch: int, value: object) -> int:
        """Append one record; return its offset."""
        if self.records or self._start > 0:
            assert epoch >= self.last_fetched_epoch(), "record epochs never decrease along a log"
        offset = self.end_offset
        prev = self.prefix[-1] if self.prefix else 0
        self.records.append((epoch, value))
        self.prefix.append(self._table.extend(prev, epoch, value))
        if not self._epochs or self._epochs[-1][0] != epoch:
            self._epochs.append((epoch, offset))
        return offset

    def truncate(self, offset: int) -> None:
        assert self._start <= offset <= self.end_offset, (offset, self._start, self.end_offset)
        del self.records[offset - self._start :]
        del self.prefix[offset:]
        self._epochs = [(e, s) for e, s in self._epochs if s < offset]

    def take_snapshot(self, offset: int, values: tuple[object, ...]) -> Snapshot:
        """Snapshot the state machine `values` (the applied records below `offset`) and drop
        the records it covers."""
        assert self._start < offset <= self.end_offset and len(values) == offset
        epoch = self.epoch_of(offset - 1)
        snap = Snapshot(offset, epoch, values, tuple(self.prefix[:offset]))
        del self.records[: offset - self._start]
        self._start, self._snap_epoch, self.snapshot = offset, epoch, snap
        self._rebuild_epochs()
        return snap

    def install(self, snap: Snapshot) -> None:
        """Replace the whole log by the leader's snapshot (FetchSnapshot)."""
        self.records = []
        self.prefix = list(snap.prefix)
        self._start, self._snap_epoch, self.snapshot = snap.offset, snap.epoch, snap
        self._epochs = []

    def epoch_start(self, epoch: int) -> int:
        """The offset of the first record of `epoch` held (a leader's LeaderChange), or -1."""
        for e, start in self._epochs:
            if e == epoch:
                return start
        return -1

    def _rebuild_epochs(self) -> None:
        self._epochs = []
        for i, (e, _) in enumerate(self.records):
            if not self._epochs or self._epochs[-1][0] != e:
                self._epochs.append((e, self._start + i))
