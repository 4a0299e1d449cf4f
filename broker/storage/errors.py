"""Errors raised by the storage layer that are not one of Kafka's wire error codes.

Pure: no I/O. Data-dir errors stop a broker at start-up (the message says what to fix); log
errors subclass the shared `MiniBrokerError` classes so a servicer can map them to a code.
"""

from __future__ import annotations

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
    """A follower append does not start at the LEO, or its batches are not contiguous.

    Kafka's UnexpectedAppendOffsetException: the fetcher should re-check its fetch state rather
    than write a gap or an overlap into the log.
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
