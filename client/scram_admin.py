"""The admin client's SCRAM credentials (Kafka's Admin.alterUserScramCredentials and
describeUserScramCredentials, KIP-554): the alterations a caller builds, and their requests and
answers on the wire.

The password never leaves the client: an upsertion is sent as the salted password (PBKDF2 over
the password with a fresh random salt, `client/common/scram.py`); the controller keeps only the
stored and server keys derived from it. A description carries mechanisms and iteration counts,
never a salt or a key.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

from minibroker.client.common.scram import (
    DEFAULT_ITERATIONS,
    ScramMechanism,
    salted_password,
)
from minibroker.client.errors import MiniBrokerError, error_for
from minibroker.proto import minibroker_pb2 as pb

SALT_BYTES = 32


def _mechanism(value: str | int) -> ScramMechanism:
    if isinstance(value, str):
        return ScramMechanism.from_name(value)
    if isinstance(value, int) and not isinstance(value, bool):
        mechanism = ScramMechanism.of(value)
        if mechanism is not ScramMechanism.UNKNOWN:
            return mechanism
    raise ValueError(f"mechanism must be SCRAM-SHA-256 or SCRAM-SHA-512 (or 1, 2), got {value!r}")


@dataclass(frozen=True)
class UserScramCredentialUpsertion:
    """Set `user`'s credential for `mechanism` to `password` (Kafka's
    UserScramCredentialUpsertion). `salt` None: a fresh random one."""

    user: str
    password: str = field(repr=False)
    mechanism: str | int = "SCRAM-SHA-256"
    iterations: int = DEFAULT_ITERATIONS
    salt: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True)
class UserScramCredentialDeletion:
    """Delete `user`'s credential for `mechanism`."""

    user: str
    mechanism: str | int = "SCRAM-SHA-256"


@dataclass(frozen=True, slots=True)
class ScramCredentialInfo:
    """A mechanism a user has a credential for, and its iteration count."""

    mechanism: str  # SCRAM-SHA-256 / SCRAM-SHA-512
    iterations: int


def alter_request(
    alterations: Iterable[UserScramCredentialUpsertion | UserScramCredentialDeletion],
) -> pb.AlterUserScramCredentialsRequest:
    """The request; raises TypeError/ValueError for an alteration that cannot be sent (the
    controller judges the rest: names, iteration bounds, duplicates)."""
    request = pb.AlterUserScramCredentialsRequest()
    for a in alterations:
        if isinstance(a, UserScramCredentialDeletion):
            if not isinstance(a.user, str):
                raise TypeError(f"user must be a str, got {a.user!r}")
            request.deletions.add(name=a.user, mechanism=int(_mechanism(a.mechanism)))
        elif isinstance(a, UserScramCredentialUpsertion):
            if not isinstance(a.user, str):
                raise TypeError(f"user must be a str, got {a.user!r}")
            if not isinstance(a.password, str) or not a.password:
                raise ValueError(f"user {a.user!r}: the password must be a non-empty str")
            if not isinstance(a.iterations, int) or isinstance(a.iterations, bool):
                raise TypeError(f"iterations must be an int, got {a.iterations!r}")
            mechanism = _mechanism(a.mechanism)
            salt = a.salt if a.salt is not None else secrets.token_bytes(SALT_BYTES)
            # Bounded before PBKDF2 runs: the controller refuses out-of-range counts anyway.
            rounds = min(max(a.iterations, 1), 1 << 20)
            request.upsertions.add(
                name=a.user,
                mechanism=int(mechanism),
                iterations=a.iterations,
                salt=salt,
                salted_password=salted_password(mechanism, a.password, salt, rounds),
            )
        else:
            raise TypeError(
                "alterations must be UserScramCredentialUpsertion or "
                f"UserScramCredentialDeletion, got {a!r}"
            )
    return request


def alter_results(
    resp: pb.AlterUserScramCredentialsResponse,
) -> dict[str, MiniBrokerError | None]:
    return {
        r.user: (error_for(r.error_code, r.error_message) if r.error_code else None)
        for r in resp.results
    }


def describe_request(users: Iterable[str] | None) -> pb.DescribeUserScramCredentialsRequest:
    names = [] if users is None else list(dict.fromkeys(users))
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"users must be strs, got {name!r}")
    return pb.DescribeUserScramCredentialsRequest(users=[pb.UserName(name=n) for n in names])


def described(
    resp: pb.DescribeUserScramCredentialsResponse,
) -> dict[str, list[ScramCredentialInfo] | MiniBrokerError]:
    if resp.error_code:
        raise error_for(resp.error_code, resp.error_message)
    out: dict[str, list[ScramCredentialInfo] | MiniBrokerError] = {}
    for r in resp.results:
        if r.error_code:
            out[r.user] = error_for(r.error_code, r.error_message)
        else:
            out[r.user] = [
                ScramCredentialInfo(ScramMechanism.of(c.mechanism).mechanism_name, c.iterations)
                for c in r.credential_infos
            ]
    return out


__all__ = [
    "ScramCredentialInfo",
    "UserScramCredentialDeletion",
    "UserScramCredentialUpsertion",
    "alter_request",
    "alter_results",
    "describe_request",
    "described",
]
