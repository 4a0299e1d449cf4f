"""SASL PLAIN (client/common/sasl.py): RFC 4616 messages in the x-minibroker-sasl header,
SaslVerifier against SCRAM credentials (either mechanism), its cache (hits skip PBKDF2; a
changed or deleted credential misses), refusals with clear messages, and a fuzz test: any
malformed header raises SaslAuthenticationFailedError and nothing else."""

from __future__ import annotations

import base64

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.client.common import sasl as sasl_module
from minibroker.client.common.sasl import (
    INVALID_CREDENTIALS,
    SASL_METADATA_KEY,
    SaslVerifier,
    decode_plain,
    encode_plain,
)
from minibroker.client.common.scram import ScramCredential, ScramMechanism, new_credential
from minibroker.client.errors import SaslAuthenticationFailedError
from minibroker.metadata.acl import Principal

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512


class Store:
    def __init__(self) -> None:
        self.creds: dict[tuple[str, int], ScramCredential] = {}
        self.lookups = 0

    def set(self, user: str, password: str, mechanism=SHA256, salt=b"salt") -> None:
        self.creds[(user, int(mechanism))] = new_credential(mechanism, password, salt, 4096)

    def lookup(self, user: str, mechanism: int) -> ScramCredential | None:
        self.lookups += 1
        return self.creds.get((user, mechanism))


def header(user: str, password: str, authzid: str = "") -> list[tuple[str, str]]:
    return [("user-agent", "x"), (SASL_METADATA_KEY, encode_plain(user, password, authzid))]


def raw(message: bytes, mechanism: str = "PLAIN") -> list[tuple[str, str]]:
    return [(SASL_METADATA_KEY, f"{mechanism} {base64.b64encode(message).decode()}")]


def test_plain_round_trip_and_rfc4616_layout() -> None:
    value = encode_plain("alice", "pä ss", "alice")
    assert value.startswith("PLAIN ")
    assert base64.b64decode(value[6:]) == b"alice\0alice\0p\xc3\xa4 ss"
    assert decode_plain(value) == ("alice", "alice", "pä ss")
    assert decode_plain(value.encode()) == ("alice", "alice", "pä ss")


def test_verifier_accepts_either_mechanism_and_refuses_wrong_passwords() -> None:
    store = Store()
    store.set("alice", "wonderland")
    store.set("bob", "builder", SHA512)
    verifier = SaslVerifier(store.lookup)
    assert verifier.principal([("user-agent", "x")]) is None
    assert verifier.principal(None) is None
    assert verifier.principal(header("alice", "wonderland")) == Principal("User", "alice")
    assert verifier.principal(header("bob", "builder", "bob")) == Principal("User", "bob")
    for user, password in [("alice", "builder"), ("bob", "wonderland"), ("carol", "x")]:
        with pytest.raises(SaslAuthenticationFailedError) as err:
            verifier.principal(header(user, password))
        assert str(err.value) == INVALID_CREDENTIALS


def test_node_names_never_authenticate_by_password() -> None:
    store = Store()
    for name in ("broker-1", "ANONYMOUS"):
        store.set(name, "pw")  # cannot be written through the controller; a second guard
        with pytest.raises(SaslAuthenticationFailedError, match="invalid username or password"):
            SaslVerifier(store.lookup).principal(header(name, "pw"))


def test_cache_skips_pbkdf2_and_follows_credential_changes(monkeypatch) -> None:
    store = Store()
    store.set("alice", "one")
    verifier = SaslVerifier(store.lookup, cache_size=2)
    calls = []
    real = sasl_module.verify_password
    monkeypatch.setattr(sasl_module, "verify_password", lambda c, p: calls.append(p) or real(c, p))
    for _ in range(3):
        assert verifier.principal(header("alice", "one")) == Principal("User", "alice")
    assert calls == ["one"] and verifier.cached() == 1
    # A wrong password is checked once, then refused from the negative cache.
    for _ in range(2):
        with pytest.raises(SaslAuthenticationFailedError):
            verifier.principal(header("alice", "two"))
    assert calls == ["one", "two"] and verifier.refused() == 1
    # The password changed: the old one no longer works, though it was cached.
    store.set("alice", "two", salt=b"new-salt")
    with pytest.raises(SaslAuthenticationFailedError):
        verifier.principal(header("alice", "one"))
    assert verifier.principal(header("alice", "two")) == Principal("User", "alice")
    # Deleted: refused at once.
    del store.creds[("alice", 1)]
    with pytest.raises(SaslAuthenticationFailedError):
        verifier.principal(header("alice", "two"))
    assert verifier.cached() <= 2 and verifier.refused() <= 2  # bounded


def test_refusal_cache_skips_pbkdf2_and_follows_credential_changes(monkeypatch) -> None:
    store = Store()
    store.set("alice", "right")
    verifier = SaslVerifier(store.lookup, cache_size=3)
    pbkdf2 = []
    real_verify, real_salted = sasl_module.verify_password, sasl_module.salted_password
    monkeypatch.setattr(
        sasl_module, "verify_password", lambda c, p: pbkdf2.append(p) or real_verify(c, p)
    )
    monkeypatch.setattr(
        sasl_module, "salted_password", lambda *a: pbkdf2.append("decoy") or real_salted(*a)
    )
    for _ in range(3):
        with pytest.raises(SaslAuthenticationFailedError, match="invalid username or password"):
            verifier.principal(header("alice", "wrong"))
        with pytest.raises(SaslAuthenticationFailedError, match="invalid username or password"):
            verifier.principal(header("carol", "x"))  # unknown: the decoy once, then cached
    assert pbkdf2 == ["wrong", "decoy"] and verifier.refused() == 2
    # The refused password becomes alice's: the changed credential misses the refusal cache.
    store.set("alice", "wrong", salt=b"other")
    assert verifier.principal(header("alice", "wrong")) == Principal("User", "alice")
    # carol is created with the refused password: no longer refused.
    store.set("carol", "x")
    assert verifier.principal(header("carol", "x")) == Principal("User", "carol")
    for n in range(5):
        with pytest.raises(SaslAuthenticationFailedError):
            verifier.principal(header("alice", f"guess-{n}"))
    assert verifier.refused() == 3  # bounded


def test_an_internal_error_is_logged_and_not_a_wrong_password(monkeypatch) -> None:
    store = Store()
    store.set("alice", "pw")
    verifier = SaslVerifier(store.lookup)
    logged = []
    monkeypatch.setattr(sasl_module._log, "exception", lambda event, **kw: logged.append(event))

    def broken(credential, password):
        raise KeyError("internal detail")

    monkeypatch.setattr(sasl_module, "verify_password", broken)
    with pytest.raises(SaslAuthenticationFailedError) as err:
        verifier.principal(header("alice", "pw"))
    assert str(err.value) == sasl_module.INTERNAL_ERROR
    assert "internal detail" not in str(err.value) and err.value.__cause__ is None
    assert logged == ["sasl_verification_failed"]
    assert verifier.refused() == 0  # not cached as a refusal


def test_concurrent_logins_share_the_caches() -> None:
    from concurrent.futures import ThreadPoolExecutor

    store = Store()
    store.set("alice", "pw")
    verifier = SaslVerifier(store.lookup, cache_size=8)

    def login(n: int) -> bool:
        try:
            return verifier.principal(header("alice", "pw" if n % 2 else f"bad{n % 6}")) is not None
        except SaslAuthenticationFailedError:
            return False

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(login, range(40)))
    assert results == [n % 2 == 1 for n in range(40)]
    assert verifier.cached() == 1 and verifier.refused() == 3


@pytest.mark.parametrize(
    ("metadata", "words"),
    [
        ([(SASL_METADATA_KEY, "SCRAM-SHA-256 abc")], "'SCRAM-SHA-256' is not supported"),
        ([(SASL_METADATA_KEY, "")], "'' is not supported"),
        ([(SASL_METADATA_KEY, "PLAIN not*base64")], "not base64"),
        ([(SASL_METADATA_KEY, "PLAIN")], "NUL separators"),
        ([(SASL_METADATA_KEY, "PLAIN " + "A" * 3000)], "over 2048 characters"),
        ([(SASL_METADATA_KEY, b"PLAIN \xff")], "not ASCII"),
        (raw(b"alice\0pw"), "1 NUL separators"),
        (raw(b"\0alice\0pw\0x"), "3 NUL separators"),
        (raw(b"\0\0pw"), "empty username"),
        (raw(b"\0alice\0"), "empty password"),
        (raw(b"\0al\xffice\0pw"), "not UTF-8"),
        (raw(b"\0" + b"a" * 256 + b"\0pw"), "over 255 bytes"),
        (raw(b"bob\0alice\0pw"), "authorization id 'bob' differs from username 'alice'"),
        (header("a", "b") + header("a", "b"), "2 x-minibroker-sasl headers"),
    ],
)
def test_malformed_headers_are_refused_clearly(metadata, words) -> None:
    store = Store()
    store.set("alice", "pw")
    with pytest.raises(SaslAuthenticationFailedError) as err:
        SaslVerifier(store.lookup).principal(metadata)
    assert words in str(err.value) and str(err.value).startswith("SASL authentication failed")
    assert "pw" not in str(err.value).replace("PLAIN", "")


@FUZZ
@given(
    value=st.one_of(
        st.text(max_size=300),
        st.binary(max_size=300),
        st.binary(max_size=300).map(lambda b: "PLAIN " + base64.b64encode(b).decode()),
        st.lists(st.binary(max_size=20), max_size=5).map(
            lambda parts: "PLAIN " + base64.b64encode(b"\0".join(parts)).decode()
        ),
    )
)
def test_fuzz_malformed_headers_raise_only_sasl_errors(value) -> None:
    store = Store()
    store.set("alice", "pw")
    try:
        got = SaslVerifier(store.lookup).principal([(SASL_METADATA_KEY, value)])
    except SaslAuthenticationFailedError:
        return
    assert got == Principal("User", "alice")  # only the one right login gets through
