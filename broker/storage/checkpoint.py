"""Kafka's checkpoint files, written atomically: offsets per partition and the epoch cache.

Does file I/O (small files only). Text format (research/kafka-replication.md §2.13): line 1 the
version `0`, line 2 the entry count, then one entry per line with fields separated by spaces:
`topic partition offset` for `replication-offset-checkpoint`, `recovery-point-offset-checkpoint`
and `log-start-offset-checkpoint`; `epoch startOffset` for a partition's
`leader-epoch-checkpoint`.

Every write goes to `<file>.tmp`, is fsynced, renamed over the file and the directory fsynced, so a
crash leaves either the old or the new content, never a mix (DESIGN.md §4).

Concurrency contract: one writer per file (the owning PartitionLog or LogManager).
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterable, Mapping

from minibroker.broker.replication.epoch_cache import EpochEntry
from minibroker.broker.storage.errors import CorruptCheckpointError
from minibroker.client.types import TopicPartition

CHECKPOINT_VERSION = 0
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so a rename or a new or deleted file in it survives a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace `path` with `data`: temp file, fsync, rename, fsync the directory.

    A failure before the rename leaves `path` as it was and removes the temp file (best effort:
    loading removes leftover `.tmp` files too). A failure of the directory fsync raises with the
    new content in place.
    """
    target = pathlib.Path(path)
    tmp = target.with_name(target.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(target.parent)


def format_checkpoint(entries: Iterable[Iterable[object]]) -> bytes:
    rows = [" ".join(str(field) for field in entry) for entry in entries]
    lines = [str(CHECKPOINT_VERSION), str(len(rows)), *rows]
    return ("\n".join(lines) + "\n").encode()


def parse_checkpoint(path: str | os.PathLike[str], text: str, fields: int) -> list[list[str]]:
    """The entries of a checkpoint text, each split into `fields` strings."""
    lines = text.splitlines()
    if len(lines) < 2:
        raise CorruptCheckpointError(f"checkpoint {path}: missing version or count line")
    if lines[0].strip() != str(CHECKPOINT_VERSION):
        raise CorruptCheckpointError(
            f"checkpoint {path}: unsupported version {lines[0].strip()!r}, "
            f"expected {CHECKPOINT_VERSION}"
        )
    try:
        count = int(lines[1].strip())
    except ValueError:
        raise CorruptCheckpointError(f"checkpoint {path}: bad count {lines[1]!r}") from None
    rows = [line.split() for line in lines[2:] if line.strip()]
    if count != len(rows):
        raise CorruptCheckpointError(
            f"checkpoint {path}: expected {count} entries but found {len(rows)}"
        )
    for lineno, row in enumerate(rows, 3):
        if len(row) != fields:
            raise CorruptCheckpointError(
                f"checkpoint {path}:{lineno}: expected {fields} fields, got {' '.join(row)!r}"
            )
    return rows


def _read_text(path: pathlib.Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise CorruptCheckpointError(f"checkpoint {path}: not text") from None


class OffsetCheckpointFile:
    """`topic partition offset` per line: HW, recovery point or log start offset per partition."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        entries = [(tp.topic, tp.partition, offset) for tp, offset in sorted(offsets.items())]
        write_atomic(self.path, format_checkpoint(entries))

    def read(self) -> dict[TopicPartition, int]:
        """The entries; empty when the file does not exist. Raises CorruptCheckpointError."""
        text = _read_text(self.path)
        if text is None:
            return {}
        result: dict[TopicPartition, int] = {}
        for topic, partition, offset in parse_checkpoint(self.path, text, 3):
            try:
                result[TopicPartition(topic, int(partition))] = int(offset)
            except ValueError:
                raise CorruptCheckpointError(
                    f"checkpoint {self.path}: bad entry {topic} {partition} {offset}"
                ) from None
        return result


class LeaderEpochCheckpointFile:
    """`epoch startOffset` per line: one partition's epoch cache."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)

    def write(self, entries: Iterable[EpochEntry]) -> None:
        write_atomic(self.path, format_checkpoint(entries))

    def read(self) -> list[EpochEntry] | None:
        """The entries, or None when the file does not exist. Raises CorruptCheckpointError."""
        text = _read_text(self.path)
        if text is None:
            return None
        entries: list[EpochEntry] = []
        for epoch, start in parse_checkpoint(self.path, text, 2):
            try:
                entries.append(EpochEntry(int(epoch), int(start)))
            except ValueError:
                raise CorruptCheckpointError(
                    f"checkpoint {self.path}: bad entry {epoch} {start}"
                ) from None
        return entries
