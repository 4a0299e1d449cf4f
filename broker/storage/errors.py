"""Errors raised by the storage layer that are not one of Kafka's wire error codes.

Pure: no I/O. Data-dir errors stop a broker at start-up (the message says what to fix); log
errors subclass the shared `MiniBrokerError` classes so a servicer can map them to a code.
`is_log_dir_failure` and `disk_error_advice` classify a failed disk operation for the broker,
which takes its data dir offline on one (Kafka's LogDirFailureChannel).
"""

from __future__ import annotations

import errno

from minibroker.client.errors import (
    ErrorCode,
    InvalidRecordError,
    KafkaStorageError,
    MiniBrokerError,
)


class DataDirError(Exception):
    """The data dir cannot be used as it is (start-up error; the message says why)."""


class DataDirInUseError(DataDirError):
    """Another live process holds the data dir's `.lock`."""


class MetaPropertiesError(DataDirError):
    """`meta.properties` is malformed or names another node or cluster."""


class CorruptCheckpointError(KafkaStorageError):
    """A checkpoint file does not parse (wrong version, count or entry)."""


class UnexpectedAppendOffsetError(InvalidRecordError):
    """A follower append does not start at the LEO, or its batches are not contiguous (in a
    log that may have gaps, a compacted one: starts below the LEO, or a batch starts below the
    previous one's next offset).

    Kafka's UnexpectedAppendOffsetException: the fetcher should re-check its fetch state rather
    than write a gap (where gaps are not allowed) or an overlap into the log.
    """

    def __init__(self, message: str, *, first_offset: int, expected_offset: int) -> None:
        self.first_offset = first_offset
        self.expected_offset = expected_offset
        super().__init__(message)


class InconsistentTopicIdError(MiniBrokerError):
    """A partition dir on disk belongs to a topic with another id (deleted and re-created)."""

    code = ErrorCode.UNKNOWN_TOPIC_ID

    def __init__(self, message: str, *, on_disk: str, expected: str) -> None:
        self.on_disk = on_disk
        self.expected = expected
        super().__init__(message)


def os_error_of(err: BaseException) -> OSError | None:
    """The OSError behind a storage error: `err` itself or the one it was raised from."""
    current: BaseException | None = err
    for _ in range(8):  # cause chains here are one or two links; bound the walk anyway
        if current is None:
            return None
        if isinstance(current, OSError):
            return current
        current = current.__cause__ or current.__context__
    return None


def is_log_dir_failure(err: BaseException) -> bool:
    """True when `err` means the data dir failed (Kafka: any IOException of a log dir): a
    KafkaStorageError raised by the storage layer, or an OSError from a file in the dir."""
    return isinstance(err, KafkaStorageError | OSError)


def disk_error_advice(err: BaseException) -> str:
    """What the operator should do about a failed data-dir operation, from its errno."""
    os_err = os_error_of(err)
    code = os_err.errno if os_err is not None else None
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return (
            "free space on its disk (or raise the quota, or the file size limit `ulimit -f`), "
            "then start the broker again"
        )
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return (
            "make it writable by this user (or use another data dir), then start the broker again"
        )
    if code in (errno.EMFILE, errno.ENFILE):
        return "raise the open-file limit (`ulimit -n`), then start the broker again"
    return (
        "check the disk (`dmesg`), repair or replace it or move the data dir, then start the "
        "broker again"
    )
