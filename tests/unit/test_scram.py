"""SCRAM credentials (client/common/scram.py): the RFC 7677 SCRAM-SHA-256 test vector, Kafka's
mechanism numbers and iteration bounds, and round trips of derive-then-verify."""

from __future__ import annotations

import base64

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.client.common.scram import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    ScramMechanism,
    client_proof,
    credential_from_salted,
    iterations_problem,
    new_credential,
    salted_password,
    server_signature,
    verify_password,
)

SHA256 = ScramMechanism.SCRAM_SHA_256
SHA512 = ScramMechanism.SCRAM_SHA_512

# RFC 7677 §3: user "user", password "pencil".
RFC7677_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC7677_AUTH_MESSAGE = (
    b"n=user,r=rOprNGfwEbeRWgbNEkqO,"
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,"
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
)
RFC7677_PROOF = "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
RFC7677_SERVER_SIGNATURE = "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="

FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_rfc7677_scram_sha_256_vector() -> None:
    salted = salted_password(SHA256, "pencil", RFC7677_SALT, 4096)
    proof = client_proof(SHA256, salted, RFC7677_AUTH_MESSAGE)
    assert base64.b64encode(proof).decode() == RFC7677_PROOF
    signature = server_signature(SHA256, salted, RFC7677_AUTH_MESSAGE)
    assert base64.b64encode(signature).decode() == RFC7677_SERVER_SIGNATURE
    # The stored credential checks the same password, and no other.
    credential = credential_from_salted(SHA256, RFC7677_SALT, salted, 4096)
    assert verify_password(credential, "pencil")
    assert not verify_password(credential, "pencil ")
    assert new_credential(SHA256, "pencil", RFC7677_SALT, 4096) == credential


def test_kafka_numbers_and_names() -> None:
    assert (int(SHA256), int(SHA512)) == (1, 2)
    assert SHA256.mechanism_name == "SCRAM-SHA-256"
    assert ScramMechanism.from_name("scram-sha-512") is SHA512
    assert ScramMechanism.of(7) is ScramMechanism.UNKNOWN
    assert (SHA256.digest_size, SHA512.digest_size) == (32, 64)
    with pytest.raises(ValueError, match="unknown SCRAM mechanism 'PLAIN'"):
        ScramMechanism.from_name("PLAIN")
    with pytest.raises(ValueError, match="unknown SCRAM mechanism 0"):
        salted_password(ScramMechanism.UNKNOWN, "x", b"salt", 4096)


@pytest.mark.parametrize(
    ("iterations", "problem"),
    [
        (MIN_ITERATIONS - 1, "too few iterations"),
        (MIN_ITERATIONS, None),
        (MAX_ITERATIONS, None),
        (MAX_ITERATIONS + 1, "too many iterations"),
        (0, "too few"),
        (-5, "too few"),
    ],
)
def test_iteration_bounds_are_kafkas(iterations: int, problem: str | None) -> None:
    got = iterations_problem(SHA256, iterations)
    assert got is None if problem is None else problem in (got or "")


def test_credential_repr_hides_keys() -> None:
    credential = new_credential(SHA512, "secret", b"0123456789abcdef", 4096)
    assert repr(credential) == "ScramCredential(SCRAM-SHA-512, iterations=4096)"


@FAST
@given(
    mechanism=st.sampled_from([SHA256, SHA512]),
    password=st.text(min_size=0, max_size=40),
    other=st.text(min_size=0, max_size=40),
    salt=st.binary(min_size=1, max_size=32),
)
def test_round_trip(mechanism: ScramMechanism, password: str, other: str, salt: bytes) -> None:
    credential = new_credential(mechanism, password, salt, MIN_ITERATIONS)
    assert len(credential.stored_key) == len(credential.server_key) == mechanism.digest_size
    assert verify_password(credential, password)
    assert verify_password(credential, other) == (other == password)
