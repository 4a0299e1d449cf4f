"""SASL PLAIN over gRPC metadata (RFC 4616), checked against SCRAM credentials.

A client that logs in with a user name and password (`security.protocol=SASL_SSL`,
`sasl.mechanism=PLAIN`) sends, on every call, one metadata entry

    x-minibroker-sasl: PLAIN <base64 of: authzid NUL authcid NUL passwd>

through `grpc.metadata_call_credentials` composed with the channel's SSL credentials
(`call_credentials`, used by client/common/tls.py), so it never goes out over plaintext.

Server side, `SaslVerifier.principal(metadata)` finds that entry and answers `User:<authcid>`
when the password derives the user's stored SCRAM key (either mechanism the user has a
credential for), None when the call carries no SASL entry, and raises
SaslAuthenticationFailedError with a clear message for anything else: a malformed entry, an
authorization id other than the user (no impersonation), an unknown user or a wrong password
(one message for both: "invalid username or password"). Successful checks are cached, keyed by
the user, the mechanism, a SHA-256 of the password and the credential itself, so a repeated call
does not pay the PBKDF2 iterations again, and a changed or deleted credential misses the cache.
Refusals are cached too (bounded LRU), keyed by the user, the password's SHA-256 and all the
user's credentials, so a repeated wrong password costs no PBKDF2 either. Any other exception
while checking a login (a bug) is logged with its traceback and reported to the caller as
"internal error", never as a wrong password nor with internal text.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from minibroker.client.common.log import get_logger
from minibroker.client.common.scram import (
    MECHANISMS,
    MIN_ITERATIONS,
    ScramCredential,
    ScramMechanism,
    salted_password,
    verify_password,
)
from minibroker.client.errors import SaslAuthenticationFailedError
from minibroker.metadata.acl import ANONYMOUS, Principal, node_of

SASL_METADATA_KEY = "x-minibroker-sasl"
PLAIN = "PLAIN"
SASL_MECHANISMS = (PLAIN,)
MAX_HEADER_CHARS = 2048  # base64 of a 255-byte authzid, user and password, with room
MAX_FIELD_BYTES = 255  # RFC 4616: authzid, authcid and passwd are at most 255 octets each
INVALID_CREDENTIALS = "SASL authentication failed: invalid username or password"
INTERNAL_ERROR = "SASL authentication failed: internal error (see the server's log)"
CACHE_SIZE = 4096

_log = get_logger(__name__)

ScramLookup = Callable[[str, int], ScramCredential | None]


@dataclass(frozen=True, slots=True)
class SaslPlain:
    """A client's SASL PLAIN login (librdkafka's sasl.username / sasl.password)."""

    username: str
    password: str = field(repr=False)


def encode_plain(username: str, password: str, authzid: str = "") -> str:
    """The metadata value for a PLAIN login: `PLAIN <base64(authzid NUL user NUL password)>`."""
    message = b"\0".join(s.encode() for s in (authzid, username, password))
    return f"{PLAIN} {base64.b64encode(message).decode()}"


def _fail(why: str) -> SaslAuthenticationFailedError:
    return SaslAuthenticationFailedError(f"SASL authentication failed: {why}")


def decode_plain(value: str | bytes) -> tuple[str, str, str]:
    """(authzid, authcid, passwd) of a metadata value; SaslAuthenticationFailedError saying
    what is wrong with a malformed one (the password is never part of a message)."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            raise _fail(f"the {SASL_METADATA_KEY} header is not ASCII") from None
    if len(value) > MAX_HEADER_CHARS:
        raise _fail(f"the {SASL_METADATA_KEY} header is over {MAX_HEADER_CHARS} characters")
    mechanism, _, payload = value.strip().partition(" ")
    if mechanism.upper() != PLAIN:
        raise _fail(
            f"SASL mechanism {mechanism[:32]!r} is not supported (only PLAIN, over TLS; "
            "PLAIN is checked against the users' SCRAM credentials)"
        )
    try:
        message = base64.b64decode(payload.strip(), validate=True)
    except (binascii.Error, ValueError):
        raise _fail(f"the {SASL_METADATA_KEY} PLAIN message is not base64") from None
    parts = message.split(b"\0")
    if len(parts) != 3:
        raise _fail(
            "a PLAIN message is authzid NUL username NUL password (RFC 4616); this one has "
            f"{len(parts) - 1} NUL separators"
        )
    try:
        authzid, authcid, passwd = (p.decode("utf-8") for p in parts)
    except UnicodeDecodeError:
        raise _fail("the PLAIN message is not UTF-8") from None
    if not authcid:
        raise _fail("the PLAIN message has an empty username")
    if not passwd:
        raise _fail("the PLAIN message has an empty password")
    if any(len(p) > MAX_FIELD_BYTES for p in parts):
        raise _fail(f"a PLAIN field is over {MAX_FIELD_BYTES} bytes (RFC 4616)")
    if authzid and authzid != authcid:
        raise _fail(
            f"authorization id {authzid!r} differs from username {authcid!r} (acting as "
            "another user is not supported)"
        )
    return authzid, authcid, passwd


def sasl_header(metadata: Sequence[tuple[str, str | bytes]] | None) -> str | bytes | None:
    """The one SASL metadata value of a call, None when there is none."""
    values = [v for k, v in metadata or () if k.lower() == SASL_METADATA_KEY]
    if len(values) > 1:
        raise _fail(f"the call carries {len(values)} {SASL_METADATA_KEY} headers (one expected)")
    return values[0] if values else None


class SaslVerifier:
    """Who a call's SASL PLAIN login is. `lookup(user, mechanism)` reads the user's SCRAM
    credential for Kafka's mechanism number from the node's metadata image (a broker: the image
    it follows; a controller: its own). Thread-safe: `principal` may be called from worker
    threads (asyncio.to_thread) as well as the event loop; the caches are guarded by a lock."""

    def __init__(self, lookup: ScramLookup, cache_size: int = CACHE_SIZE) -> None:
        self._lookup = lookup
        self._cache: OrderedDict[tuple[str, int, bytes, ScramCredential], None] = OrderedDict()
        # Refused logins, keyed by the user, the password's SHA-256 and every credential the
        # user had (None for a mechanism without one), so a repeated wrong password (or an
        # unknown user) is refused without PBKDF2 and a changed credential misses the cache.
        self._refused: OrderedDict[tuple[str, bytes, tuple[ScramCredential | None, ...]], None] = (
            OrderedDict()
        )
        self._cache_size = cache_size
        self._lock = threading.Lock()
        # Checked for an unknown user, so that it costs as much as a wrong password.
        self._decoy = ScramCredential(
            ScramMechanism.SCRAM_SHA_256, b"decoy", b"", b"", MIN_ITERATIONS
        )

    def principal(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> Principal | None:
        """`User:NAME` for a call with a valid SASL login, None for a call without one;
        SaslAuthenticationFailedError otherwise (INTERNAL_ERROR, with the cause in the node's
        log, when checking the login itself failed)."""
        try:
            value = sasl_header(metadata)
            if value is None:
                return None
            _, user, password = decode_plain(value)
            return self.authenticate(user, password)
        except SaslAuthenticationFailedError:
            raise
        except Exception:
            _log.exception("sasl_verification_failed")
            raise SaslAuthenticationFailedError(INTERNAL_ERROR) from None

    def authenticate(self, user: str, password: str) -> Principal:
        principal = Principal("User", user)
        if node_of(principal) is not None or principal == ANONYMOUS:
            # Node identities come from certificates only, and ANONYMOUS is nobody's (no
            # credential can have these names: a second guard).
            raise SaslAuthenticationFailedError(INVALID_CREDENTIALS)
        digest = hashlib.sha256(password.encode()).digest()
        credentials = tuple(self._lookup(user, int(m)) for m in MECHANISMS)
        refused_key = (user, digest, credentials)
        with self._lock:
            for mechanism, credential in zip(MECHANISMS, credentials, strict=True):
                if credential is None:
                    continue
                key = (user, int(mechanism), digest, credential)
                if key in self._cache:
                    self._cache.move_to_end(key)
                    return principal
            if refused_key in self._refused:
                self._refused.move_to_end(refused_key)
                raise SaslAuthenticationFailedError(INVALID_CREDENTIALS)
        for mechanism, credential in zip(MECHANISMS, credentials, strict=True):
            if credential is not None and verify_password(credential, password):
                self._remember(self._cache, (user, int(mechanism), digest, credential))
                return principal
        if all(c is None for c in credentials):
            salted_password(self._decoy.mechanism, password, self._decoy.salt, MIN_ITERATIONS)
        self._remember(self._refused, refused_key)
        raise SaslAuthenticationFailedError(INVALID_CREDENTIALS)

    def _remember(self, cache: OrderedDict[Any, None], key: Any) -> None:
        with self._lock:
            cache[key] = None
            cache.move_to_end(key)
            while len(cache) > self._cache_size:
                cache.popitem(last=False)

    def cached(self) -> int:
        """How many verified logins are cached (tests)."""
        with self._lock:
            return len(self._cache)

    def refused(self) -> int:
        """How many refused logins are cached (tests)."""
        with self._lock:
            return len(self._refused)


class _PlainPlugin(grpc.AuthMetadataPlugin):
    def __init__(self, value: str) -> None:
        self._metadata = ((SASL_METADATA_KEY, value),)

    def __call__(
        self,
        context: grpc.AuthMetadataContext,
        callback: grpc.AuthMetadataPluginCallback,
    ) -> None:
        callback(self._metadata, None)


def call_credentials(login: SaslPlain) -> grpc.CallCredentials:
    """Per-call credentials that send the PLAIN login; gRPC sends call credentials only over a
    secure channel, which is what keeps the password off plaintext connections."""
    return grpc.metadata_call_credentials(
        _PlainPlugin(encode_plain(login.username, login.password)), name="sasl-plain"
    )


__all__ = [
    "INTERNAL_ERROR",
    "INVALID_CREDENTIALS",
    "PLAIN",
    "SASL_MECHANISMS",
    "SASL_METADATA_KEY",
    "SaslPlain",
    "SaslVerifier",
    "ScramLookup",
    "call_credentials",
    "decode_plain",
    "encode_plain",
    "sasl_header",
]
