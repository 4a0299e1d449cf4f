"""The simulation's controller process: the real `ControllerCore` behind a simulated journal.

This is the controller shell of `controller/app.py` reduced to what the simulation needs, with the
same ordering rules (Outcome contract, docs/design.md §3.1): a command runs on the core at once, its
entries become durable at the next group commit (`flush`), and only then are they published to
watchers and the command answered. A crash loses the entries not yet flushed (nobody saw them), and
a restart rebuilds the core from the durable journal the way `ControllerApp.start` does: the latest
snapshot, then the entries after it. The rebuilt image is compared with a replay of the whole
journal and with the image the durable entries built, so a restart that changes the state fails the
run.

Pure apart from the core's own rules: no clock (now_ms comes in), randomness from the
simulation's generator. Single-threaded, driven by tests/sim/replsim.py (the Simulation).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from minibroker.client.common.invariant import invariant
from minibroker.controller.core.controller import ControllerCore, ControllerSettings
from minibroker.controller.core.messages import Event, Outcome
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import LogEntry, MetadataRecord


class ControllerDown(Exception):
    """A request reached a controller that is not running (the connection was refused)."""


class SimControllerNode:
    """One controller process across restarts: core, journal, snapshot, group commit.

    `generation` counts process starts; heartbeat streams and metadata watches belong to one
    generation and break when it ends. `journal` holds every durable entry (the sim keeps the
    whole log; the real journal drops what a snapshot covers, which `read_from` mimics by
    answering a watcher below `retained_start` with a snapshot).
    """

    def __init__(
        self,
        settings: ControllerSettings,
        cluster_id: str,
        rng: random.Random,
        now_ms: int,
        snapshot_every: int = 16,
    ) -> None:
        self.settings = settings
        self.cluster_id = cluster_id
        self._rng = rng
        self.snapshot_every = snapshot_every
        self.journal: list[LogEntry] = []
        self.durable_image = MetadataImage()  # the image the durable entries build
        self.snapshot: tuple[tuple[MetadataRecord, ...], int] | None = None
        self.retained_start = 0
        self.generation = 0
        self.core: ControllerCore | None = self._new_core(MetadataImage(), now_ms)
        self._pending: list[LogEntry] = []
        self.events: list[Event] = []
        self.restarts = 0
        self.lost_entries = 0

    def _new_core(self, image: MetadataImage, now_ms: int) -> ControllerCore:
        # A fresh random source per process start, drawn from the seeded generator.
        source = random.Random(self._rng.getrandbits(64))
        return ControllerCore(self.settings, self.cluster_id, source, now_ms, image)

    # -- state ------------------------------------------------------------------------------

    @property
    def up(self) -> bool:
        return self.core is not None

    @property
    def image(self) -> MetadataImage:
        """What the controller believes now: its core's image when up, else the durable one."""
        return self.core.image if self.core is not None else self.durable_image

    @property
    def has_pending(self) -> bool:
        return bool(self._pending)

    @property
    def pending_count(self) -> int:
        """Entries applied to the core but not yet durable (lost if the process dies now)."""
        return len(self._pending)

    @property
    def durable_offset(self) -> int:
        return self.durable_image.next_offset

    # -- commands ---------------------------------------------------------------------------

    def execute(self, command: Callable[[ControllerCore, int], Outcome[Any]], now_ms: int) -> Any:
        """Run one command; its entries wait for the next `flush`. Raises ControllerDown."""
        core = self.core
        if core is None:
            raise ControllerDown
        try:
            outcome = command(core, now_ms)
        except Exception as err:
            # The core's always-on invariants (or any other bug) fired: that is a finding.
            raise AssertionError(f"controller core raised {err!r}") from err
        self._pending.extend(outcome.entries)
        self.events.extend(outcome.events)
        return outcome.reply

    def flush(self) -> list[LogEntry]:
        """Group commit: make the pending entries durable; returns them for publishing."""
        entries, self._pending = self._pending, []
        for entry in entries:
            invariant(
                entry.offset == self.durable_image.next_offset,
                f"journal gap: entry {entry.offset} after {self.durable_image.next_offset}",
            )
            self.journal.append(entry)
            self.durable_image.apply(entry)
        if entries and self.snapshot_due():
            self.snapshot = (tuple(self.durable_image.to_records()), self.durable_offset)
        return entries

    def snapshot_due(self) -> bool:
        last = self.snapshot[1] if self.snapshot is not None else 0
        return self.durable_offset - last >= self.snapshot_every

    def read_from(self, offset: int) -> tuple[bool, tuple[Any, ...], int]:
        """What a WatchMetadata from `offset` gets first: (is_snapshot, records or entries,
        offset). A watcher behind what this process retains, or ahead of the log, gets the
        whole durable image as a snapshot (controller/app.py `watch`)."""
        if offset < self.retained_start or offset > self.durable_offset:
            return True, tuple(self.durable_image.to_records()), self.durable_offset
        return False, tuple(self.journal[offset:]), offset

    # -- process lifecycle ------------------------------------------------------------------

    def crash(self) -> None:
        """The process dies: entries not yet flushed are gone, and so is every session."""
        self.lost_entries += len(self._pending)
        self._pending = []
        self.core = None
        self.generation += 1

    def restart(self, now_ms: int) -> None:
        """Start again from the journal (snapshot + tail), like ControllerApp.start."""
        image = MetadataImage()
        if self.snapshot is not None:
            records, snapshot_offset = self.snapshot
            image.replace_with_snapshot(records, snapshot_offset)
        for entry in self.journal[image.next_offset :]:
            image.apply(entry)
        full = MetadataImage()
        for entry in self.journal:
            full.apply(entry)
        invariant(image == full, "snapshot + tail replay differs from a full journal replay")
        invariant(image == self.durable_image, "replayed image differs from the durable image")
        self.core = self._new_core(image, now_ms)
        # The new process holds only the entries after its snapshot in memory.
        self.retained_start = self.snapshot[1] if self.snapshot is not None else 0
        self.restarts += 1
