"""minibroker.client: Kafka-shaped Producer, Consumer and Admin (blocking and asyncio).

    from minibroker.client import Producer, Consumer, TopicPartition

    with Producer("127.0.0.1:9092") as producer:
        producer.send("events", b"hello", key=b"user-1").result()

The value types and every error class are imported eagerly; the clients themselves (which pull
in grpc and the generated stubs) load on first use, so that broker and controller code importing
`minibroker.client.batch` or `.errors` does not pay for them. Nothing here imports pyspark or
rich.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minibroker.client import errors as _errors
from minibroker.client.errors import *  # noqa: F403 - the error classes are public API
from minibroker.client.errors import ErrorCode, MiniBrokerError, RetriableError
from minibroker.client.types import Record, RecordMetadata, TopicPartition

if TYPE_CHECKING:
    from minibroker.client.admin import (
        AlterConfigOp,
        AsyncAdmin,
        ConfigEntry,
        ConfigResource,
        NewTopic,
        PartitionReassignment,
    )
    from minibroker.client.consumer import AsyncConsumer
    from minibroker.client.produce_result import FutureRecordMetadata, SentRecords
    from minibroker.client.producer import AsyncProducer
    from minibroker.client.scram_admin import (
        ScramCredentialInfo,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )
    from minibroker.client.sync import Admin, Consumer, Producer

_LAZY = {
    "Producer": "minibroker.client.sync",
    "Consumer": "minibroker.client.sync",
    "Admin": "minibroker.client.sync",
    "AsyncProducer": "minibroker.client.producer",
    "AsyncConsumer": "minibroker.client.consumer",
    "AsyncAdmin": "minibroker.client.admin",
    "NewTopic": "minibroker.client.admin",
    "ConfigResource": "minibroker.client.admin",
    "AlterConfigOp": "minibroker.client.admin",
    "ConfigEntry": "minibroker.client.admin",
    "PartitionReassignment": "minibroker.client.admin",
    "FutureRecordMetadata": "minibroker.client.produce_result",
    "SentRecords": "minibroker.client.produce_result",
    "ScramCredentialInfo": "minibroker.client.scram_admin",
    "UserScramCredentialDeletion": "minibroker.client.scram_admin",
    "UserScramCredentialUpsertion": "minibroker.client.scram_admin",
}

_ERROR_NAMES = sorted(
    name
    for name, value in vars(_errors).items()
    if isinstance(value, type) and issubclass(value, MiniBrokerError)
)


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'minibroker.client' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


# The error names come from the errors module, so a new code exports itself.
__all__ = [
    "Admin",
    "AlterConfigOp",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "ConfigEntry",
    "ConfigResource",
    "Consumer",
    "ErrorCode",
    "FutureRecordMetadata",
    "MiniBrokerError",
    "NewTopic",
    "PartitionReassignment",
    "Producer",
    "Record",
    "RecordMetadata",
    "RetriableError",
    "ScramCredentialInfo",
    "SentRecords",
    "TopicPartition",
    "UserScramCredentialDeletion",
    "UserScramCredentialUpsertion",
    *_ERROR_NAMES,
]
