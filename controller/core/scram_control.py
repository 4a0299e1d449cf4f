"""SCRAM credentials (Kafka's ScramControlManager, KIP-554): AlterUserScramCredentials and
DescribeUserScramCredentials.

Pure. The client sends the salted password (PBKDF2 over the password, which never leaves it);
the controller derives the stored key and the server key (RFC 5802) and writes them with the
salt and the iteration count as a `UserScramCredentialRecord`, one per (user, mechanism).

Validation, per user named in the request (Kafka's rules and codes; a user with any refused
entry changes nothing, the others proceed):
- an empty user name, or one a SASL PLAIN message cannot carry (a NUL or other control
  character) or longer than MAX_USER_NAME_BYTES -> UNACCEPTABLE_CREDENTIAL;
- a name that looks like a node's (`broker-1`, `controller-3000`, `metadata.acl.node_of`) ->
  UNACCEPTABLE_CREDENTIAL: node identities come from certificates only, never from a password;
  likewise `ANONYMOUS`, the principal of unauthenticated callers;
- a mechanism that is not SCRAM-SHA-256 (1) or SCRAM-SHA-512 (2) -> UNSUPPORTED_SASL_MECHANISM;
- iterations outside 4096..16384, an empty or overlong salt, a salted password that is not
  one digest long -> UNACCEPTABLE_CREDENTIAL;
- the same (user, mechanism) twice in one request (deletions and upsertions together) ->
  DUPLICATE_RESOURCE (Kafka: "A user credential cannot be altered twice in the same request");
- deleting a credential that does not exist -> RESOURCE_NOT_FOUND.
Describe answers names, mechanisms and iteration counts only: never a salt or a key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from minibroker.client.common.scram import (
    ScramMechanism,
    credential_from_salted,
    iterations_problem,
)
from minibroker.client.errors import ErrorCode
from minibroker.controller.core.control_base import ControlBase
from minibroker.controller.core.messages import Outcome
from minibroker.metadata.acl import ANONYMOUS, Principal, node_of
from minibroker.metadata.records import (
    RemoveUserScramCredentialRecord,
    UserScramCredentialRecord,
)

MAX_USER_NAME_BYTES = 255
MAX_SALT_BYTES = 1024


@dataclass(frozen=True, slots=True)
class ScramDeletion:
    name: str
    mechanism: int


@dataclass(frozen=True, slots=True)
class ScramUpsertion:
    name: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes

    def __repr__(self) -> str:  # the salted password stays out of log lines
        return (
            f"ScramUpsertion(name={self.name!r}, mechanism={self.mechanism}, "
            f"iterations={self.iterations})"
        )


@dataclass(frozen=True, slots=True)
class AlterScramResult:
    user: str
    error: ErrorCode
    message: str = ""


@dataclass(frozen=True, slots=True)
class ScramCredentialInfo:
    mechanism: int
    iterations: int


@dataclass(frozen=True, slots=True)
class DescribeScramResult:
    user: str
    error: ErrorCode
    message: str = ""
    credentials: tuple[ScramCredentialInfo, ...] = ()


class _Refused(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def check_user_name(name: str) -> None:
    """Raise _Refused(UNACCEPTABLE_CREDENTIAL) for a name no credential may have."""
    if not name:
        raise _Refused(ErrorCode.UNACCEPTABLE_CREDENTIAL, "user name must not be empty")
    if len(name.encode()) > MAX_USER_NAME_BYTES:
        raise _Refused(
            ErrorCode.UNACCEPTABLE_CREDENTIAL,
            f"user name of {len(name.encode())} bytes (at most {MAX_USER_NAME_BYTES})",
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise _Refused(
            ErrorCode.UNACCEPTABLE_CREDENTIAL,
            f"user name {name!r} contains a control character",
        )
    if Principal("User", name) == ANONYMOUS:
        raise _Refused(
            ErrorCode.UNACCEPTABLE_CREDENTIAL,
            f"user name {name!r} is the principal of unauthenticated callers",
        )
    if node_of(Principal("User", name)) is not None:
        raise _Refused(
            ErrorCode.UNACCEPTABLE_CREDENTIAL,
            f"user name {name!r} is a node's name (broker-N / controller-N): nodes "
            "authenticate with their certificates only",
        )


def _mechanism(number: int) -> ScramMechanism:
    mechanism = ScramMechanism.of(number)
    if mechanism is ScramMechanism.UNKNOWN:
        raise _Refused(
            ErrorCode.UNSUPPORTED_SASL_MECHANISM,
            f"unknown SCRAM mechanism {number} (1 SCRAM-SHA-256, 2 SCRAM-SHA-512)",
        )
    return mechanism


def _check_upsertion(u: ScramUpsertion) -> ScramMechanism:
    check_user_name(u.name)
    mechanism = _mechanism(u.mechanism)
    problem = iterations_problem(mechanism, u.iterations)
    if problem is not None:
        raise _Refused(ErrorCode.UNACCEPTABLE_CREDENTIAL, problem)
    if not u.salt or len(u.salt) > MAX_SALT_BYTES:
        raise _Refused(
            ErrorCode.UNACCEPTABLE_CREDENTIAL,
            f"a salt of {len(u.salt)} bytes (1 to {MAX_SALT_BYTES})",
        )
    if len(u.salted_password) != mechanism.digest_size:
        raise _Refused(
            ErrorCode.UNACCEPTABLE_CREDENTIAL,
            f"a salted password of {len(u.salted_password)} bytes ({mechanism.mechanism_name} "
            f"needs {mechanism.digest_size})",
        )
    return mechanism


class ScramControl(ControlBase):
    """AlterUserScramCredentials and DescribeUserScramCredentials."""

    def alter_user_scram_credentials(
        self,
        deletions: Sequence[ScramDeletion],
        upsertions: Sequence[ScramUpsertion],
        now_ms: int,
    ) -> Outcome[tuple[AlterScramResult, ...]]:
        users = list(dict.fromkeys([d.name for d in deletions] + [u.name for u in upsertions]))
        refused: dict[str, _Refused] = {}

        def refuse(user: str, why: _Refused) -> None:
            refused.setdefault(user, why)

        pairs: dict[tuple[str, int], int] = {}
        for key in [(d.name, d.mechanism) for d in deletions] + [
            (u.name, u.mechanism) for u in upsertions
        ]:
            pairs[key] = pairs.get(key, 0) + 1
        for d in deletions:
            try:
                check_user_name(d.name)
                mechanism = _mechanism(d.mechanism)
                if self.image.scram_credential(d.name, mechanism) is None:
                    raise _Refused(
                        ErrorCode.RESOURCE_NOT_FOUND,
                        f"user {d.name!r} has no {mechanism.mechanism_name} credential to delete",
                    )
            except _Refused as why:
                refuse(d.name, why)
        for u in upsertions:
            try:
                _check_upsertion(u)
            except _Refused as why:
                refuse(u.name, why)
        for (name, number), count in pairs.items():
            if count > 1 and name not in refused:
                refuse(
                    name,
                    _Refused(
                        ErrorCode.DUPLICATE_RESOURCE,
                        f"a user credential cannot be altered twice in the same request "
                        f"(user {name!r}, mechanism {ScramMechanism.of(number).mechanism_name})",
                    ),
                )
        for d in deletions:
            if d.name not in refused:
                self._append(RemoveUserScramCredentialRecord(d.name, d.mechanism), now_ms)
                self._event(
                    "scram_credential_deleted",
                    user=d.name,
                    mechanism=ScramMechanism.of(d.mechanism).mechanism_name,
                )
        for u in upsertions:
            if u.name not in refused:
                mechanism = ScramMechanism(u.mechanism)
                c = credential_from_salted(mechanism, u.salt, u.salted_password, u.iterations)
                self._append(
                    UserScramCredentialRecord(
                        u.name, u.mechanism, c.salt, c.stored_key, c.server_key, c.iterations
                    ),
                    now_ms,
                )
                self._event(
                    "scram_credential_set",
                    user=u.name,
                    mechanism=mechanism.mechanism_name,
                    iterations=u.iterations,
                )
        return self._done(
            tuple(
                AlterScramResult(user, refused[user].code, refused[user].message)
                if user in refused
                else AlterScramResult(user, ErrorCode.NONE)
                for user in users
            )
        )

    def describe_user_scram_credentials(
        self, users: Sequence[str] | None
    ) -> tuple[DescribeScramResult, ...]:
        """Each named user's mechanisms and iteration counts (None or empty: every user with a
        credential, by name); read-only. Unknown users: RESOURCE_NOT_FOUND, a user named twice:
        DUPLICATE_RESOURCE (Kafka's)."""
        credentials = self.image.scram_credentials
        if not users:
            users = sorted(credentials)
        counts: dict[str, int] = {}
        for user in users:
            counts[user] = counts.get(user, 0) + 1
        out = []
        for user in dict.fromkeys(users):
            if counts[user] > 1:
                out.append(
                    DescribeScramResult(
                        user,
                        ErrorCode.DUPLICATE_RESOURCE,
                        f"cannot describe SCRAM credentials for the same user twice in a "
                        f"single request (user {user!r})",
                    )
                )
            elif user not in credentials:
                out.append(
                    DescribeScramResult(
                        user,
                        ErrorCode.RESOURCE_NOT_FOUND,
                        f"user {user!r} has no SCRAM credential",
                    )
                )
            else:
                infos = tuple(
                    ScramCredentialInfo(int(m), c.iterations)
                    for m, c in sorted(credentials[user].items())
                )
                out.append(DescribeScramResult(user, ErrorCode.NONE, "", infos))
        return tuple(out)


__all__ = [
    "MAX_SALT_BYTES",
    "MAX_USER_NAME_BYTES",
    "AlterScramResult",
    "DescribeScramResult",
    "ScramControl",
    "ScramCredentialInfo",
    "ScramDeletion",
    "ScramUpsertion",
    "check_user_name",
]
