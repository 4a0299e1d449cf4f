"""The broker's data dir: identity, exclusive lock, clean-shutdown marker, partition dirs.

Does file I/O in the data dir (docs/design.md §4.1; Kafka's LogManager and MetaProperties):

    meta.properties        version, node.id, cluster.id (Java properties text; Kafka's KRaft
                           format is version 1, the one that names `node.id`)
    .lock                  held with fcntl.flock for the life of the process, holds its pid
    .kafka_cleanshutdown   JSON {"version":0,"brokerEpoch":N}: written at clean shutdown, read
                           and deleted at start-up (no marker: recover the logs)
    .boot_id               the OS boot id at the last start: another one now means the machine
                           restarted, and files written without fsync may have lost content
    <topic>-<partition>/   one dir per partition replica (the LogManager's)

A dir without meta.properties is formatted (meta.properties written) only when it holds no
broker data: Kafka refuses any dir that `kafka-storage format` did not format, and a dir whose
identity is lost but whose partitions, checkpoints or clean-shutdown marker remain may belong to
another node or cluster, so it is refused too. A meta.properties that does not parse is an error
naming the file and what to do; it is never rewritten.

Concurrency contract: one DataDir per process per directory; the lock makes a second process
fail at once with DataDirInUseError instead of corrupting the logs. A file of the dir that cannot
be written or read at start-up (a full disk, a read-only dir) is a DataDirError naming the path
and what to do, never a bare OSError.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pathlib
import re
import shutil
from collections.abc import Iterator

from minibroker.broker.storage.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    fsync_dir,
    write_atomic,
)
from minibroker.broker.storage.errors import (
    DataDirError,
    DataDirInUseError,
    MetaPropertiesError,
    disk_error_advice,
)
from minibroker.client.common.log import get_logger
from minibroker.client.types import TopicPartition

META_PROPERTIES = "meta.properties"
LOCK_FILE = ".lock"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
# The boot id of the machine when the broker last started here: a different one at the next
# start means the OS restarted in between (a power loss, say), so files written without fsync
# may have lost their latest content (the leader-epoch checkpoints; log_loader.py).
BOOT_ID_FILE = ".boot_id"
_BOOT_ID_SOURCE = "/proc/sys/kernel/random/boot_id"
META_VERSION = 1
NO_BROKER_EPOCH = -1
DELETE_DIR_SUFFIX = "-delete"
# Kafka's legal topic names; the partition dir is `<topic>-<partition>`.
_PARTITION_DIR = re.compile(r"([a-zA-Z0-9._-]+)-([0-9]+)")

# Files a broker writes at the top of its data dir (with their `.tmp` forms): their presence
# means the dir holds a broker's data.
_BROKER_FILES = frozenset(
    {
        REPLICATION_OFFSET_CHECKPOINT,
        RECOVERY_POINT_CHECKPOINT,
        LOG_START_OFFSET_CHECKPOINT,
        CLEANER_OFFSET_CHECKPOINT,
        CLEAN_SHUTDOWN_FILE,
    }
)
_MAX_QUOTED = 40  # characters of a malformed line quoted in an error

_log = get_logger("minibroker.broker.storage")


def parse_partition_dir(name: str) -> TopicPartition | None:
    """`orders-3` -> TopicPartition("orders", 3); None for anything else."""
    if name.endswith(DELETE_DIR_SUFFIX):
        return None
    match = _PARTITION_DIR.fullmatch(name)
    if match is None:
        return None
    return TopicPartition(match.group(1), int(match.group(2)))


def partition_dir_name(tp: TopicPartition) -> str:
    return f"{tp.topic}-{tp.partition}"


def read_properties(path: pathlib.Path) -> dict[str, str]:
    """Java properties text: `key=value` lines, `#` and `!` comments.

    Raises MetaPropertiesError (naming the file) when it cannot be read or is not such text.
    """
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise MetaPropertiesError(f"{path} is not a properties file (not UTF-8 text)") from None
    except OSError as err:
        raise MetaPropertiesError(f"cannot read {path}: {err.strerror}") from None
    values: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        key, sep, value = stripped.partition("=")
        if not sep:
            raise MetaPropertiesError(
                f"{path}: expected key=value, got {stripped[:_MAX_QUOTED]!r}"
                + ("..." if len(stripped) > _MAX_QUOTED else "")
            )
        values[key.strip()] = value.strip()
    return values


class DataDir:
    """An opened, locked data dir. Use `DataDir.open(...)`; `close()` releases the lock."""

    def __init__(
        self,
        path: pathlib.Path,
        lock_fd: int,
        node_id: int,
        cluster_id: str | None,
        had_clean_shutdown: bool,
        previous_broker_epoch: int,
        system_restarted: bool = True,
    ) -> None:
        self.path = path
        self.node_id = node_id
        self._cluster_id = cluster_id
        self._lock_fd = lock_fd
        self.had_clean_shutdown = had_clean_shutdown
        self.previous_broker_epoch = previous_broker_epoch
        # The OS may have restarted since the broker's last start here (or it is not known).
        self.system_restarted = system_restarted

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], node_id: int, cluster_id: str | None = None
    ) -> DataDir:
        """Lock the dir (creating it), check or write meta.properties, consume the marker.

        Raises DataDirInUseError when another process holds the lock and MetaPropertiesError
        when meta.properties names another node or cluster.
        """
        root = pathlib.Path(path)
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise DataDirError(f"cannot create data dir {root}: {err.strerror}") from None
        with _unusable_if_failing(root, root / LOCK_FILE):
            lock_fd = _lock(root)
        try:
            with _unusable_if_failing(root, root / META_PROPERTIES):
                stored_cluster_id = _check_meta(root, node_id, cluster_id)
            with _unusable_if_failing(root, root / CLEAN_SHUTDOWN_FILE):
                had_clean, epoch = _consume_clean_shutdown_marker(root)
            with _unusable_if_failing(root, root / BOOT_ID_FILE):
                restarted = _system_restarted(root)
            with _unusable_if_failing(root, root):
                data_dir = cls(
                    root, lock_fd, node_id, stored_cluster_id, had_clean, epoch, restarted
                )
                data_dir._remove_deleted_partition_dirs()
        except BaseException:
            os.close(lock_fd)
            raise
        return data_dir

    @property
    def cluster_id(self) -> str | None:
        return self._cluster_id

    def adopt_cluster_id(self, cluster_id: str) -> None:
        """Record the cluster id once it is known (a fresh dir learns it from the controller).

        Raises MetaPropertiesError when the dir already belongs to another cluster.
        """
        if self._cluster_id == cluster_id:
            return
        if self._cluster_id is not None:
            raise MetaPropertiesError(
                f"data dir {self.path} belongs to cluster {self._cluster_id}, not {cluster_id}"
            )
        with _unusable_if_failing(self.path, self.path / META_PROPERTIES):
            _write_meta(self.path, self.node_id, cluster_id)
        self._cluster_id = cluster_id

    def partition_dirs(self) -> dict[TopicPartition, pathlib.Path]:
        """Every `<topic>-<partition>/` dir in the data dir."""
        found: dict[TopicPartition, pathlib.Path] = {}
        for entry in sorted(self.path.iterdir()):
            tp = parse_partition_dir(entry.name)
            if tp is not None and entry.is_dir():
                found[tp] = entry
        return found

    def partition_path(self, tp: TopicPartition) -> pathlib.Path:
        return self.path / partition_dir_name(tp)

    def mark_clean_shutdown(self, broker_epoch: int) -> None:
        """Write `.kafka_cleanshutdown` (after every log is flushed and checkpointed)."""
        body = json.dumps({"version": 0, "brokerEpoch": broker_epoch}, separators=(",", ":"))
        write_atomic(self.path / CLEAN_SHUTDOWN_FILE, body.encode())

    def close(self) -> None:
        """Release the lock (the `.lock` file stays, as in Kafka)."""
        if self._lock_fd < 0:
            return
        with contextlib.suppress(OSError):
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)
        self._lock_fd = -1

    def __enter__(self) -> DataDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _remove_deleted_partition_dirs(self) -> None:
        """Finish deletions a crash interrupted (`<topic>-<p>.<uuid>-delete` dirs)."""
        for entry in self.path.iterdir():
            if entry.is_dir() and entry.name.endswith(DELETE_DIR_SUFFIX):
                shutil.rmtree(entry, ignore_errors=True)


@contextlib.contextmanager
def _unusable_if_failing(root: pathlib.Path, path: pathlib.Path) -> Iterator[None]:
    """Turn an OSError of a data-dir file (a full disk, a read-only or unwritable dir, an I/O
    error) into a DataDirError that says what failed, on which path, and what to do."""
    try:
        yield
    except OSError as err:
        what = err.strerror or str(err)
        name = errno.errorcode.get(err.errno, str(err.errno)) if err.errno else "?"
        raise DataDirError(
            f"cannot use data dir {root}: {err.filename or path}: {what} ({name}); "
            f"{disk_error_advice(err)}"
        ) from None


def _lock(root: pathlib.Path) -> int:
    lock_path = root / LOCK_FILE
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise DataDirInUseError(
            f"data dir {root} is in use by another process (pid {holder})"
        ) from None
    except OSError as err:
        os.close(fd)
        raise DataDirError(f"cannot lock data dir {root}: {err.strerror}") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as err:
        os.close(fd)
        err.filename = err.filename or str(lock_path)
        raise
    return fd


def _write_meta(root: pathlib.Path, node_id: int, cluster_id: str | None) -> None:
    lines = [
        "#",
        "# minibroker data dir identity (Kafka's KRaft meta.properties format)",
        f"version={META_VERSION}",
        f"node.id={node_id}",
    ]
    if cluster_id is not None:
        lines.append(f"cluster.id={cluster_id}")
    write_atomic(root / META_PROPERTIES, ("\n".join(lines) + "\n").encode())


def _check_meta(root: pathlib.Path, node_id: int, cluster_id: str | None) -> str | None:
    """Validate meta.properties against this broker (writing it for a new, empty dir)."""
    path = root / META_PROPERTIES
    if not os.path.lexists(path):
        data = _broker_data(root)
        if data:
            shown = ", ".join(data[:5]) + (f" and {len(data) - 5} more" if len(data) > 5 else "")
            raise MetaPropertiesError(
                f"data dir {root} has no meta.properties but holds broker data ({shown}); it "
                "may belong to another node or cluster, so it is not adopted: remove the "
                "directory or restore its meta.properties "
                f"(version={META_VERSION}, node.id=<its node>, cluster.id=<its cluster>)"
            )
        _write_meta(root, node_id, cluster_id)
        return cluster_id
    try:
        props = read_properties(path)
        if props.get("version") != str(META_VERSION):
            raise MetaPropertiesError(
                f"{path}: unsupported version {props.get('version')!r}, expected {META_VERSION}"
            )
        try:
            stored_node = int(props["node.id"])
        except (KeyError, ValueError):
            raise MetaPropertiesError(f"{path}: missing or invalid node.id") from None
    except MetaPropertiesError as err:
        # The file is left as it is: it may be the only record of which cluster the logs are.
        raise MetaPropertiesError(
            f"{err}; restore it (version={META_VERSION}, node.id={node_id}, cluster.id=<the "
            f"cluster's id>) or remove the data dir {root} to start node {node_id} with no data"
        ) from None
    if stored_node != node_id:
        raise MetaPropertiesError(
            f"data dir {root} belongs to node {stored_node} (meta.properties), but this broker "
            f"is node {node_id}: use another data dir or node.id={stored_node}"
        )
    stored_cluster = props.get("cluster.id")
    if cluster_id is not None and stored_cluster is not None and stored_cluster != cluster_id:
        raise MetaPropertiesError(
            f"data dir {root} belongs to cluster {stored_cluster} (meta.properties), but this "
            f"broker is configured for cluster {cluster_id}"
        )
    if stored_cluster is None and cluster_id is not None:
        _write_meta(root, node_id, cluster_id)
        return cluster_id
    return stored_cluster


def _broker_data(root: pathlib.Path) -> list[str]:
    """Names of the entries in `root` that only a broker writes: partition dirs (live or being
    deleted), checkpoint files and the clean-shutdown marker. Our own `.lock` and a
    `meta.properties.tmp` left by a crashed first start are not data."""
    found = []
    for entry in sorted(root.iterdir()):
        name = entry.name
        if name.removesuffix(".tmp") in _BROKER_FILES or (
            entry.is_dir()
            and (parse_partition_dir(name) is not None or name.endswith(DELETE_DIR_SUFFIX))
        ):
            found.append(name)
    return found


def current_boot_id() -> str | None:
    """This boot's id (Linux), or None where the OS does not say."""
    try:
        with open(_BOOT_ID_SOURCE) as f:
            return f.read().strip() or None
    except OSError:
        return None


def _system_restarted(root: pathlib.Path) -> bool:
    """Whether the OS may have restarted since the last start here (True when unknown); records
    this boot's id for the next start."""
    boot_id = current_boot_id()
    path = root / BOOT_ID_FILE
    try:
        previous: str | None = path.read_text().strip()
    except FileNotFoundError:
        previous = None
    except (OSError, UnicodeDecodeError):
        previous = None
    if boot_id is None:
        return True
    if previous != boot_id:
        write_atomic(path, (boot_id + "\n").encode())
    return previous != boot_id


def _consume_clean_shutdown_marker(root: pathlib.Path) -> tuple[bool, int]:
    """(had clean shutdown, previous broker epoch); the marker is deleted either way."""
    path = root / CLEAN_SHUTDOWN_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return False, NO_BROKER_EPOCH
    clean, epoch = False, NO_BROKER_EPOCH
    try:
        body = json.loads(text)
        if isinstance(body, dict) and body.get("version") == 0:
            epoch = int(body.get("brokerEpoch", NO_BROKER_EPOCH))
            clean = True
    except (ValueError, TypeError):
        _log.warning("clean_shutdown_marker_unreadable", path=str(path))
    # A marker that survives this start would claim a clean shutdown after a later crash.
    os.unlink(path)
    fsync_dir(root)
    return clean, epoch
