"""The controller data dir's identity and the frame format of its metadata log.

Does disk I/O (blocking). `DataDir` owns `meta.properties` (cluster.id, node.id, version,
written once, atomically, into a dir without a metadata log; never rewritten) and the `.lock`
(fcntl: two processes never share a data dir). A frame is `length:u32 | crc32c(payload):u32 |
payload`, the payload one serialized `MetadataBatch`; `RaftLog` (controller/quorum/raft_log.py)
writes and reads the segments and snapshots made of them. `write_atomically` is the temp file,
fsync, rename, directory fsync sequence every small file of the dir goes through.
"""

from __future__ import annotations

import base64
import fcntl
import os
import pathlib
import re
import struct
import uuid

import crc32c

_FRAME = struct.Struct(">II")
# The journal's own files (and their `.tmp` forms): a dir holding one is a metadata log.
_JOURNAL_FILE = re.compile(r"(metadata-\d+\.log|snapshot-\d+\.snap)(\.tmp)?")
# What a cluster id may be: Kafka's are 22 characters of URL-safe base64.
_CLUSTER_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
MAX_FRAME_BYTES = 256 * 1024 * 1024


class JournalError(Exception):
    """The metadata log on disk is unusable (corruption before the tail, wrong identity)."""


def _fsync_dir(path: pathlib.Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: pathlib.Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _frame(payload: bytes) -> bytes:
    return _FRAME.pack(len(payload), crc32c.crc32c(payload)) + payload


def _read_frame_spans(data: bytes) -> tuple[list[tuple[int, int]], int]:
    """(start, end) byte spans of the frames of the valid frame prefix (a frame's payload is
    data[start + 8 : end]) and the byte length of that prefix."""
    spans: list[tuple[int, int]] = []
    pos = 0
    view = memoryview(data)
    while pos + _FRAME.size <= len(data):
        length, crc = _FRAME.unpack_from(data, pos)
        end = pos + _FRAME.size + length
        if length > MAX_FRAME_BYTES or end > len(data):
            break
        if crc32c.crc32c(view[pos + _FRAME.size : end]) != crc:
            break
        spans.append((pos, end))
        pos = end
    return spans, pos


def _read_frames(data: bytes) -> tuple[list[bytes], int]:
    """Payloads of the valid frame prefix and the byte length of that prefix."""
    spans, valid = _read_frame_spans(data)
    return [data[start + _FRAME.size : end] for start, end in spans], valid


class DataDir:
    """The controller's data dir: its lock and its identity (cluster id)."""

    def __init__(self, path: str | pathlib.Path) -> None:
        self.path = pathlib.Path(path)
        self._lock_fd: int | None = None

    def lock(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalError(f"data dir {self.path} is in use by another process") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def load_or_create_cluster_id(self, node_id: int) -> tuple[str, bool]:
        """(cluster id, created now). The id is made once, on first start, and kept.

        A meta.properties that does not parse, or a metadata log without one, is a JournalError
        that says what to do; the files are left as they are.
        """
        meta = self.path / "meta.properties"
        if os.path.lexists(meta):
            return _read_cluster_id(meta, self.path, node_id), False
        journal = sorted(
            p.name for p in self.path.glob("*") if _JOURNAL_FILE.fullmatch(p.name) is not None
        )
        if journal:
            raise JournalError(
                f"metadata log dir {self.path} has no meta.properties but holds a metadata log "
                f"({', '.join(journal[:3])}{', ...' if len(journal) > 3 else ''}); its cluster "
                "id is unknown, so it is not adopted: remove the directory or restore its "
                f"meta.properties (cluster.id=<its cluster>, node.id={node_id}, version=1)"
            )
        # Kafka's format: a random UUID as 22 characters of URL-safe base64.
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        text = f"#minibroker controller\ncluster.id={cluster_id}\nnode.id={node_id}\nversion=1\n"
        write_atomically(meta, text.encode())
        return cluster_id, True


def _read_cluster_id(meta: pathlib.Path, root: pathlib.Path, node_id: int) -> str:
    def unusable(why: str) -> JournalError:
        return JournalError(
            f"{meta} {why}; restore it (cluster.id=<the cluster's id>, node.id={node_id}, "
            f"version=1) or remove the metadata log dir {root} to start a new, empty cluster"
        )

    try:
        text = meta.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise unusable("is not a properties file (not UTF-8 text)") from None
    except OSError as err:
        raise unusable(f"cannot be read ({err.strerror})") from None
    props = dict(
        line.split("=", 1)
        for line in text.splitlines()
        if "=" in line and not line.lstrip().startswith(("#", "!"))
    )
    cluster_id = props.get("cluster.id", "").strip()
    if not cluster_id:
        raise unusable("has no cluster.id")
    if _CLUSTER_ID.fullmatch(cluster_id) is None:
        raise unusable(
            f"has an invalid cluster.id {cluster_id[:40]!r} (1-64 letters, digits, '-', '_', '.')"
        )
    return cluster_id


__all__ = ["DataDir", "JournalError", "write_atomically"]
