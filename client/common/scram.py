"""SCRAM credentials (RFC 5802, RFC 7677), as Kafka stores them for its users.

Pure: hashlib/hmac only. A user's password is never stored: the client derives the salted
password (PBKDF2-HMAC over the password, a random salt and an iteration count) and sends only
that; the controller derives the stored key and the server key from it and writes those, with
the salt and the iteration count, to the metadata log (`UserScramCredentialRecord`). A password
is later checked by deriving the salted password again and comparing stored keys.

Mechanisms carry Kafka's numbers (ScramMechanism.java: SCRAM-SHA-256 = 1, SCRAM-SHA-512 = 2)
and Kafka's iteration bounds (4096..16384).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from dataclasses import dataclass

MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 4096


class ScramMechanism(enum.IntEnum):
    UNKNOWN = 0
    SCRAM_SHA_256 = 1
    SCRAM_SHA_512 = 2

    @property
    def mechanism_name(self) -> str:
        """`SCRAM-SHA-256`, Kafka's (and the IANA registry's) spelling."""
        return self.name.replace("_", "-")

    @property
    def digest_size(self) -> int:
        return hashlib.new(_HASH[self]).digest_size

    @classmethod
    def from_name(cls, name: str) -> ScramMechanism:
        """`SCRAM-SHA-256` (any case, `_` for `-`) -> the mechanism; a clear ValueError else."""
        key = name.strip().upper().replace("-", "_")
        if key in ("SCRAM_SHA_256", "SCRAM_SHA_512"):
            return cls[key]
        raise ValueError(f"unknown SCRAM mechanism {name!r} (use {', '.join(MECHANISM_NAMES)})")

    @classmethod
    def of(cls, number: int) -> ScramMechanism:
        """The mechanism with Kafka's number `number`, UNKNOWN for any other number."""
        try:
            return cls(number)
        except ValueError:
            return cls.UNKNOWN


_HASH = {ScramMechanism.SCRAM_SHA_256: "sha256", ScramMechanism.SCRAM_SHA_512: "sha512"}
MECHANISMS = (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)
MECHANISM_NAMES = tuple(m.mechanism_name for m in MECHANISMS)


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the server keeps of one user's password for one mechanism (Kafka's
    ScramCredential). Never the password nor the salted password."""

    mechanism: ScramMechanism
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    def __repr__(self) -> str:  # keys stay out of log lines
        return f"ScramCredential({self.mechanism.mechanism_name}, iterations={self.iterations})"


def _known(mechanism: ScramMechanism) -> str:
    if mechanism not in _HASH:
        raise ValueError(f"unknown SCRAM mechanism {int(mechanism)}")
    return _HASH[mechanism]


def salted_password(
    mechanism: ScramMechanism, password: str | bytes, salt: bytes, iterations: int
) -> bytes:
    """RFC 5802 Hi(Normalize(password), salt, i): PBKDF2-HMAC with the mechanism's hash.
    (No SASLprep: as Kafka's ScramFormatter, the password's UTF-8 bytes as they are.)"""
    data = password.encode() if isinstance(password, str) else password
    return hashlib.pbkdf2_hmac(_known(mechanism), data, salt, iterations)


def _hmac(mechanism: ScramMechanism, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, _known(mechanism)).digest()


def client_key(mechanism: ScramMechanism, salted: bytes) -> bytes:
    return _hmac(mechanism, salted, b"Client Key")


def stored_key(mechanism: ScramMechanism, client_key_: bytes) -> bytes:
    return hashlib.new(_known(mechanism), client_key_).digest()


def server_key(mechanism: ScramMechanism, salted: bytes) -> bytes:
    return _hmac(mechanism, salted, b"Server Key")


def credential_from_salted(
    mechanism: ScramMechanism, salt: bytes, salted: bytes, iterations: int
) -> ScramCredential:
    """The credential the server stores, from what the client sent (the controller's job)."""
    return ScramCredential(
        mechanism,
        salt,
        stored_key(mechanism, client_key(mechanism, salted)),
        server_key(mechanism, salted),
        iterations,
    )


def new_credential(
    mechanism: ScramMechanism, password: str | bytes, salt: bytes, iterations: int
) -> ScramCredential:
    return credential_from_salted(
        mechanism, salt, salted_password(mechanism, password, salt, iterations), iterations
    )


def verify_password(credential: ScramCredential, password: str | bytes) -> bool:
    """Does `password` derive `credential`'s stored key? Constant-time comparison."""
    salted = salted_password(credential.mechanism, password, credential.salt, credential.iterations)
    derived = stored_key(credential.mechanism, client_key(credential.mechanism, salted))
    return hmac.compare_digest(derived, credential.stored_key)


# -- the SCRAM exchange's proofs (RFC 5802 §3), for the RFC test vectors ------------------------


def client_proof(mechanism: ScramMechanism, salted: bytes, auth_message: bytes) -> bytes:
    """ClientKey XOR HMAC(StoredKey, AuthMessage)."""
    key = client_key(mechanism, salted)
    signature = _hmac(mechanism, stored_key(mechanism, key), auth_message)
    return bytes(a ^ b for a, b in zip(key, signature, strict=True))


def server_signature(mechanism: ScramMechanism, salted: bytes, auth_message: bytes) -> bytes:
    """HMAC(ServerKey, AuthMessage)."""
    return _hmac(mechanism, server_key(mechanism, salted), auth_message)


def iterations_problem(mechanism: ScramMechanism, iterations: int) -> str | None:
    """Kafka's bounds on the iteration count, or None when it is acceptable."""
    if iterations < MIN_ITERATIONS:
        return (
            f"too few iterations for {mechanism.mechanism_name}: {iterations} "
            f"(at least {MIN_ITERATIONS})"
        )
    if iterations > MAX_ITERATIONS:
        return (
            f"too many iterations for {mechanism.mechanism_name}: {iterations} "
            f"(at most {MAX_ITERATIONS})"
        )
    return None


__all__ = [
    "DEFAULT_ITERATIONS",
    "MAX_ITERATIONS",
    "MECHANISMS",
    "MECHANISM_NAMES",
    "MIN_ITERATIONS",
    "ScramCredential",
    "ScramMechanism",
    "client_key",
    "client_proof",
    "credential_from_salted",
    "iterations_problem",
    "new_credential",
    "salted_password",
    "server_key",
    "server_signature",
    "stored_key",
    "verify_password",
]
