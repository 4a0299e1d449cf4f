"""AlterUserScramCredentials / DescribeUserScramCredentials: protobuf <-> the core's messages
(controller/core/scram_control.py).

Pure conversions. Only the request's size is checked here (a malformed request is refused as a
whole with INVALID_REQUEST); every per-user rule is the core's.
"""

from __future__ import annotations

from collections.abc import Sequence

from minibroker.client.common.pbwire import check_count, pb_error_code
from minibroker.client.errors import MiniBrokerError
from minibroker.controller.core.scram_control import (
    AlterScramResult,
    DescribeScramResult,
    ScramDeletion,
    ScramUpsertion,
)
from minibroker.proto import minibroker_pb2 as pb

MAX_SCRAM_ENTRIES = 1_000  # deletions + upsertions, or users described, in one request


def alter_scram_request(
    msg: pb.AlterUserScramCredentialsRequest,
) -> tuple[list[ScramDeletion], list[ScramUpsertion]]:
    check_count("credential changes", len(msg.deletions) + len(msg.upsertions), MAX_SCRAM_ENTRIES)
    return (
        [ScramDeletion(d.name, d.mechanism) for d in msg.deletions],
        [
            ScramUpsertion(u.name, u.mechanism, u.iterations, u.salt, u.salted_password)
            for u in msg.upsertions
        ],
    )


def alter_scram_reply(
    results: Sequence[AlterScramResult],
) -> pb.AlterUserScramCredentialsResponse:
    return pb.AlterUserScramCredentialsResponse(
        results=[
            pb.AlterUserScramCredentialsResult(
                user=r.user, error_code=pb_error_code(r.error), error_message=r.message
            )
            for r in results
        ]
    )


def alter_scram_error(
    msg: pb.AlterUserScramCredentialsRequest, err: MiniBrokerError
) -> pb.AlterUserScramCredentialsResponse:
    """The whole request refused: its error for each user it names (the first
    MAX_SCRAM_ENTRIES; one nameless result when it names none)."""
    names = [e.name for e in (*msg.deletions, *msg.upsertions)][:MAX_SCRAM_ENTRIES]
    return pb.AlterUserScramCredentialsResponse(
        results=[
            pb.AlterUserScramCredentialsResult(
                user=name, error_code=pb_error_code(err.code), error_message=str(err)
            )
            for name in list(dict.fromkeys(names)) or [""]
        ]
    )


def describe_scram_request(msg: pb.DescribeUserScramCredentialsRequest) -> list[str] | None:
    """The users to describe; None (no users named): every user."""
    check_count("users", len(msg.users), MAX_SCRAM_ENTRIES)
    return [u.name for u in msg.users] or None


def describe_scram_reply(
    results: Sequence[DescribeScramResult],
) -> pb.DescribeUserScramCredentialsResponse:
    return pb.DescribeUserScramCredentialsResponse(
        error_code=pb.NONE,
        results=[
            pb.DescribeUserScramCredentialsResult(
                user=r.user,
                error_code=pb_error_code(r.error),
                error_message=r.message,
                credential_infos=[
                    pb.CredentialInfo(mechanism=c.mechanism, iterations=c.iterations)
                    for c in r.credentials
                ],
            )
            for r in results
        ],
    )


def describe_scram_error(err: MiniBrokerError) -> pb.DescribeUserScramCredentialsResponse:
    return pb.DescribeUserScramCredentialsResponse(
        error_code=pb_error_code(err.code), error_message=str(err)
    )


__all__ = [
    "MAX_SCRAM_ENTRIES",
    "alter_scram_error",
    "alter_scram_reply",
    "alter_scram_request",
    "describe_scram_error",
    "describe_scram_reply",
    "describe_scram_request",
]
