"""What every server's protobuf translation shares (broker/wire.py, controller/wire.py,
controller/scram_wire.py, metadata/acl_wire.py). Pure."""

from __future__ import annotations

from typing import cast

from minibroker.client.errors import InvalidRequestError
from minibroker.proto import minibroker_pb2 as pb

# What an authorization refusal answers, per item (a topic) or for the whole call (the cluster).
TOPIC_DENIED = pb.TOPIC_AUTHORIZATION_FAILED
CLUSTER_DENIED = pb.CLUSTER_AUTHORIZATION_FAILED


def pb_error_code(code: int) -> pb.ErrorCode:
    """A Kafka error code as the value of a protobuf `ErrorCode` field.

    The numbers are the same (tests/unit/test_proto.py) and protobuf takes any int for an enum
    field; only the generated stubs type the field as `pb.ErrorCode`, which no Python value is.
    """
    return cast("pb.ErrorCode", int(code))


def check_count(what: str, count: int, bound: int) -> None:
    """InvalidRequestError when a request carries more than `bound` of something."""
    if count > bound:
        raise InvalidRequestError(f"too many {what} in one request: {count} (at most {bound})")


__all__ = ["CLUSTER_DENIED", "TOPIC_DENIED", "check_count", "pb_error_code"]
