"""Kafka's checkpoint files, written atomically: offsets per partition and the epoch cache.

Does file I/O (small files only). Text format (docs/design.md §4.3): line 1 the
version `0`, line 2 the entry count, then one entry per line with fields separated by spaces:
`topic partition offset` for `replication-offset-checkpoint`, `recovery-point-offset-checkpoint`,
`log-start-offset-checkpoint` and the log cleaner's `cleaner-offset-checkpoint`;
`epoch startOffset` for a partition's `leader-epoch-checkpoint`.

Every write goes to `<file>.tmp`, is fsynced, renamed over the file and the directory fsynced, so a
crash leaves either the old or the new content, never a mix (docs/design.md §4.3).

No topic name can make an offset checkpoint unreadable. The writer escapes every character
outside Kafka's legal set as `%XX` (UTF-8 bytes; a legal name has no `%`, so legal names are
written as they are, in Kafka's format), so an entry is always one line of three fields. The
reader keeps every entry it can parse and skips, with a warning, one it cannot (a file written
before names were matched in full holds `orders\n 0 5` on two lines): losing one entry is
safe (HW from replication, recovery from 0, log start from the first segment), losing the file
would cost every partition of the broker its HW, recovery point and log start.

Concurrency contract: one writer per file (the owning PartitionLog or LogManager).
"""

from __future__ import annotations

import os
import pathlib
import re
from collections.abc import Iterable, Mapping

from minibroker.broker.storage.epoch_cache import EpochEntry
from minibroker.broker.storage.errors import CorruptCheckpointError
from minibroker.client.common.log import get_logger
from minibroker.client.topic_name import LEGAL_CHARS
from minibroker.client.types import TopicPartition

CHECKPOINT_VERSION = 0
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
# The log cleaner's (broker/cleaner/manager.py): the first offset not yet cleaned per partition.
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
# A topic field as the writer makes it: legal characters and %XX escapes, nothing else.
_TOPIC_FIELD = re.compile(r"(?:[a-zA-Z0-9._-]|%[0-9A-F]{2})+")

_log = get_logger("minibroker.broker.storage")


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so a rename or a new or deleted file in it survives a power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """fsync a file written earlier (by `write_new_file`) so its content survives a power loss."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_new_file(path: str | os.PathLike[str], data: bytes) -> None:
    """Create `path` (it must not exist) holding `data`, without fsync.

    For the files of a new partition dir, made durable together afterwards (`fsync_file` for
    each, then `fsync_dir`) before anything depends on them: one fsync per file instead of the
    two of `write_atomic`, and none on the way. A crash before then leaves the file missing,
    empty or cut short, which its reader refuses. A failed write removes the file.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
    except BaseException:
        try:
            os.unlink(path)
        except OSError:
            pass
        raise


def write_atomic(path: str | os.PathLike[str], data: bytes, *, sync: bool = True) -> None:
    """Replace `path` with `data`: temp file, fsync, rename, fsync the directory.

    A failure before the rename leaves `path` as it was and removes the temp file (best effort:
    loading removes leftover `.tmp` files too). A failure of the directory fsync raises with the
    new content in place. With `sync=False` neither fsync is done: the rename still leaves the
    old or the new content after a process crash, but a power loss may leave either, or an
    empty file; the caller makes it durable later (`fsync_file` and `fsync_dir`).
    """
    target = pathlib.Path(path)
    tmp = target.with_name(target.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            _write_all(fd, data)
            if sync:
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
    if sync:
        fsync_dir(target.parent)


def format_checkpoint(entries: Iterable[Iterable[object]]) -> bytes:
    rows = [" ".join(str(field) for field in entry) for entry in entries]
    lines = [str(CHECKPOINT_VERSION), str(len(rows)), *rows]
    return ("\n".join(lines) + "\n").encode()


def _split_header(path: str | os.PathLike[str], text: str) -> tuple[int, list[str]]:
    """(the entry count, the entry lines) of a checkpoint text; raises for another format."""
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
    return count, [line for line in lines[2:] if line.strip()]


def parse_checkpoint(path: str | os.PathLike[str], text: str, fields: int) -> list[list[str]]:
    """The entries of a checkpoint text, each split into `fields` strings (all or nothing)."""
    count, lines = _split_header(path, text)
    rows = [line.split() for line in lines]
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


def escape_topic(topic: str) -> str:
    """The topic as one checkpoint field: characters outside the legal set become `%XX`."""
    if all(c in LEGAL_CHARS for c in topic) and topic:
        return topic
    return "".join(
        c if c in LEGAL_CHARS else "".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogatepass"))
        for c in topic
    )


def unescape_topic(field: str) -> str | None:
    """The topic a field written by `escape_topic` names, or None when no writer made it."""
    if _TOPIC_FIELD.fullmatch(field) is None:
        return None
    if "%" not in field:
        return field
    raw = bytearray()
    i = 0
    while i < len(field):
        if field[i] == "%":
            raw.append(int(field[i + 1 : i + 3], 16))
            i += 3
        else:
            raw.append(ord(field[i]))
            i += 1
    try:
        return raw.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return None


def _parse_offset_entry(line: str) -> tuple[TopicPartition, int] | None:
    fields = line.split()
    if len(fields) != 3:
        return None
    topic = unescape_topic(fields[0])
    try:
        partition, offset = int(fields[1]), int(fields[2])
    except ValueError:
        return None
    if topic is None or partition < 0:
        return None
    return TopicPartition(topic, partition), offset


class OffsetCheckpointFile:
    """`topic partition offset` per line: HW, recovery point or log start offset per partition."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        entries = [
            (escape_topic(tp.topic), tp.partition, offset) for tp, offset in sorted(offsets.items())
        ]
        write_atomic(self.path, format_checkpoint(entries))

    def read(self) -> dict[TopicPartition, int]:
        """The entries; empty when the file does not exist.

        Raises CorruptCheckpointError when the file is not a version-0 checkpoint at all. An
        entry that does not parse is skipped (logged), and so is a count that does not match
        the entries: the other entries are kept.
        """
        text = _read_text(self.path)
        if text is None:
            return {}
        count, lines = _split_header(self.path, text)
        result: dict[TopicPartition, int] = {}
        skipped: list[str] = []
        for line in lines:
            entry = _parse_offset_entry(line)
            if entry is None:
                skipped.append(line)
            else:
                result[entry[0]] = entry[1]
        if skipped or count != len(result):
            _log.warning(
                "checkpoint_entries_skipped",
                path=str(self.path),
                expected=count,
                loaded=len(result),
                skipped=[line[:300] for line in skipped[:10]],
            )
        return result


class LeaderEpochCheckpointFile:
    """`epoch startOffset` per line: one partition's epoch cache."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = pathlib.Path(path)

    def write(self, entries: Iterable[EpochEntry], *, sync: bool = True) -> None:
        write_atomic(self.path, format_checkpoint(entries), sync=sync)

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
