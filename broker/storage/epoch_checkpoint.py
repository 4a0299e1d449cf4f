"""`EpochCheckpoint`: one log's leader epoch cache and its `leader-epoch-checkpoint`, in step.

Does file I/O on that one file (checkpoint.py writes it atomically). The file must name the epoch
of every batch in the log, so it is written before the first batch of a new epoch (KIP-279).
Until then it may lag the cache (`dirty`): a new leader's epoch at its LEO is recorded in the
cache only, and written with the first batch of that epoch, at a flush or at close; after the
log shrank the file names epochs no batch has any more (which loading trims), so a failed write
there is only logged. An append that fails is undone with `snapshot` / `restore`, which put the
cache back and leave the file as the cache says.

Durability: the writes are renames without fsync (`unsynced`), which a process crash cannot
tear. What a power loss could lose is made durable by `sync`, which the log calls before its
recovery point moves past the batches the new entries describe: after an OS restart loading
trusts the file only below the recovery point and learns every epoch above it from the batches
themselves (log_loader.py). A new leader takes over hundreds of partitions at once, and writing
(and fsyncing) one file for each was most of the time a leadership move took (docs/design.md
§4.3).

Concurrency contract: not thread-safe; owned by one PartitionLog.
"""

from __future__ import annotations

import os
import pathlib
from typing import NamedTuple

from minibroker.broker.storage.checkpoint import LeaderEpochCheckpointFile, fsync_dir, fsync_file
from minibroker.broker.storage.epoch_cache import EpochCache, EpochEntry
from minibroker.broker.storage.errors import CorruptCheckpointError
from minibroker.client.common.log import get_logger
from minibroker.client.types import TopicPartition

_log = get_logger("minibroker.broker.storage")


class EpochSnapshot(NamedTuple):
    """The epoch cache before a change that may be undone, and whether its file existed."""

    entries: tuple[EpochEntry, ...]
    file_existed: bool


class EpochCheckpoint:
    """The cache (read it freely) and its file; every change to the file goes through here."""

    def __init__(
        self, cache: EpochCache, path: pathlib.Path, topic_partition: TopicPartition
    ) -> None:
        self.cache = cache
        self.file = LeaderEpochCheckpointFile(path)
        self.topic_partition = topic_partition
        # The file may differ from the cache (a new leader's epoch, not written yet, or a
        # write failed): it is rewritten before the next batch goes to disk, so that it always
        # names every batch's epoch.
        self.dirty = False
        # The file was replaced since its last fsync: `sync` makes it durable.
        self.unsynced = False
        # Whether the file exists, once known: a new leader takes a `snapshot` for each of the
        # hundreds of partitions it takes over, and a stat for each was not free.
        self._exists: bool | None = None

    def persist(self) -> None:
        """Write the cache to the file, without fsync; OSError when that fails (the file is
        then `dirty`)."""
        self.dirty = True
        self.unsynced = True
        self._exists = None  # a failed write may or may not have left the file
        self.file.write(self.cache.entries, sync=False)
        self.dirty = False
        self._exists = True

    def sync(self) -> None:
        """Make the file durable as the cache says (the log's flush calls it before moving
        its recovery point); OSError when that fails, and `sync` is then still needed."""
        if self.dirty:
            self._exists = None
            self.file.write(self.cache.entries)
            self.dirty = self.unsynced = False
            self._exists = True
            return
        if not self.unsynced:
            return
        if self.exists():
            fsync_file(self.file.path)
        fsync_dir(self.file.path.parent)
        self.unsynced = False

    def persist_after_shrink(self) -> None:
        """Persist when the file may lag the cache harmlessly until the next batch is written
        (module docstring); a failure is logged, not raised."""
        try:
            self.persist()
        except OSError as err:
            _log.warning(
                "epoch_checkpoint_write_failed",
                topic=self.topic_partition.topic,
                partition=self.topic_partition.partition,
                error=str(err),
            )

    def exists(self) -> bool:
        """Whether the file exists (a stat only the first time and after a failed write)."""
        if self._exists is None:
            self._exists = self.file.path.exists()
        return self._exists

    def snapshot(self) -> EpochSnapshot:
        return EpochSnapshot(self.cache.entries, self.exists())

    def restore(self, snapshot: EpochSnapshot) -> None:
        """Put back a snapshot of the cache (an undo); the file follows, best effort."""
        cache = self.cache
        if snapshot.entries != cache.entries:
            cache.clear()
            for entry in snapshot.entries:
                cache.assign(entry.epoch, entry.start_offset)
            self.dirty = True
        if not self.dirty:
            return
        # No file and an empty cache load the same (no batch carries an epoch).
        if not snapshot.file_existed and not snapshot.entries and self._remove():
            self.dirty = False
            self.unsynced = True  # the unlink
        elif self._file_matches_cache():
            # The failed write never reached the file: leave it alone.
            self.dirty = False
        else:
            self.persist_after_shrink()

    def _remove(self) -> bool:
        """Unlink the file; True when it is gone (or was never there)."""
        self._exists = None
        try:
            os.unlink(self.file.path)
        except FileNotFoundError:
            self._exists = False
            return True
        except OSError:
            return False
        self._exists = False
        return True

    def _file_matches_cache(self) -> bool:
        try:
            stored = self.file.read()
        except (OSError, CorruptCheckpointError):
            return False
        return stored is not None and tuple(stored) == self.cache.entries
