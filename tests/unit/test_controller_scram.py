"""SCRAM credentials in the controller core (controller/core/scram_control.py): Kafka's
validation table for AlterUserScramCredentials, the per-user atomicity, the records written
(stored/server keys derived from the salted password, never the password), Describe (no keys
or salts), and credentials surviving a restart (replay) and a snapshot."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.client.common.scram import (
    ScramMechanism,
    salted_password,
    verify_password,
)
from minibroker.client.errors import ErrorCode
from minibroker.controller.core.controller import ControllerCore, ControllerSettings
from minibroker.controller.core.scram_control import (
    AlterScramResult,
    DescribeScramResult,
    ScramCredentialInfo,
    ScramDeletion,
    ScramUpsertion,
)
from minibroker.metadata.image import MetadataImage
from minibroker.metadata.records import (
    RemoveUserScramCredentialRecord,
    UserScramCredentialRecord,
)
from minibroker.metadata.wire import record_from_pb, record_to_pb

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512
SALT = b"0123456789abcdef"


def up(name="alice", mechanism=1, iterations=4096, salt=SALT, password="pw", salted=None):
    if salted is None:
        m = ScramMechanism.of(mechanism)
        salted = salted_password(m if m else SHA256, password, salt or b"x", max(iterations, 1))
    return ScramUpsertion(name, mechanism, iterations, salt, salted)


def new_core() -> ControllerCore:
    return ControllerCore(ControllerSettings(), "cluster", random.Random(1), 0)


def alter(core, deletions=(), upsertions=()):
    outcome = core.alter_user_scram_credentials(list(deletions), list(upsertions), 1)
    return outcome.reply, [e.record for e in outcome.entries]


@pytest.mark.parametrize(
    ("upsertion", "code", "words"),
    [
        (up(name=""), ErrorCode.UNACCEPTABLE_CREDENTIAL, "must not be empty"),
        (up(name="broker-1"), ErrorCode.UNACCEPTABLE_CREDENTIAL, "node's name"),
        (up(name="controller-3000"), ErrorCode.UNACCEPTABLE_CREDENTIAL, "node's name"),
        (up(name="a\x00b"), ErrorCode.UNACCEPTABLE_CREDENTIAL, "control character"),
        (up(name="ANONYMOUS"), ErrorCode.UNACCEPTABLE_CREDENTIAL, "unauthenticated callers"),
        (up(name="x" * 256), ErrorCode.UNACCEPTABLE_CREDENTIAL, "at most 255"),
        (up(mechanism=0), ErrorCode.UNSUPPORTED_SASL_MECHANISM, "unknown SCRAM mechanism 0"),
        (up(mechanism=3), ErrorCode.UNSUPPORTED_SASL_MECHANISM, "unknown SCRAM mechanism 3"),
        (up(iterations=4095), ErrorCode.UNACCEPTABLE_CREDENTIAL, "too few iterations"),
        (up(iterations=16385), ErrorCode.UNACCEPTABLE_CREDENTIAL, "too many iterations"),
        (up(salt=b""), ErrorCode.UNACCEPTABLE_CREDENTIAL, "salt of 0 bytes"),
        (up(salt=b"s" * 1025), ErrorCode.UNACCEPTABLE_CREDENTIAL, "salt of 1025 bytes"),
        (up(salted=b"short"), ErrorCode.UNACCEPTABLE_CREDENTIAL, "needs 32"),
        (up(mechanism=2, salted=b"z" * 32), ErrorCode.UNACCEPTABLE_CREDENTIAL, "needs 64"),
    ],
)
def test_refused_upsertions_write_nothing(upsertion, code, words) -> None:
    core = new_core()
    reply, records = alter(core, upsertions=[upsertion])
    assert records == []
    [result] = reply
    assert result.user == upsertion.name and result.error == code
    assert words in result.message


@pytest.mark.parametrize(
    ("deletion", "code", "words"),
    [
        (ScramDeletion("", 1), ErrorCode.UNACCEPTABLE_CREDENTIAL, "must not be empty"),
        (ScramDeletion("alice", 9), ErrorCode.UNSUPPORTED_SASL_MECHANISM, "mechanism 9"),
        (ScramDeletion("bob", 1), ErrorCode.RESOURCE_NOT_FOUND, "no SCRAM-SHA-256 credential"),
        (ScramDeletion("alice", 2), ErrorCode.RESOURCE_NOT_FOUND, "no SCRAM-SHA-512 credential"),
    ],
)
def test_refused_deletions_write_nothing(deletion, code, words) -> None:
    core = new_core()
    alter(core, upsertions=[up()])
    reply, records = alter(core, deletions=[deletion])
    assert records == [] and reply == (AlterScramResult(deletion.name, code, reply[0].message),)
    assert words in reply[0].message
    assert core.image.scram_credential("alice", 1) is not None


def test_upsert_derives_keys_and_never_stores_the_password() -> None:
    core = new_core()
    reply, records = alter(core, upsertions=[up(password="s3cret", iterations=5000)])
    assert reply == (AlterScramResult("alice", ErrorCode.NONE),)
    [record] = records
    assert isinstance(record, UserScramCredentialRecord)
    assert (record.name, record.mechanism, record.salt, record.iterations) == (
        "alice",
        1,
        SALT,
        5000,
    )
    salted = salted_password(SHA256, "s3cret", SALT, 5000)
    assert salted not in (record.stored_key, record.server_key)
    credential = core.image.scram_credential("alice", 1)
    assert credential is not None
    assert verify_password(credential, "s3cret") and not verify_password(credential, "other")
    # The records that leave the controller carry no password nor salted password.
    wire = record_to_pb(record).SerializeToString()
    assert b"s3cret" not in wire and salted not in wire


def test_duplicates_and_per_user_atomicity() -> None:
    core = new_core()
    alter(core, upsertions=[up("carol")])
    reply, records = alter(
        core,
        deletions=[ScramDeletion("carol", 1), ScramDeletion("dave", 1)],
        upsertions=[
            up("alice"),
            up("alice", mechanism=2),  # another mechanism: fine
            up("bob"),
            up("bob"),  # the same (user, mechanism) twice
            up("carol"),  # deleted and set in one request
            up("dave", mechanism=2),  # dave's deletion is refused: nothing for dave
        ],
    )
    by_user = {r.user: r for r in reply}
    assert [r.user for r in reply] == ["carol", "dave", "alice", "bob"]
    assert by_user["alice"].error == ErrorCode.NONE
    assert by_user["bob"].error == ErrorCode.DUPLICATE_RESOURCE
    assert "altered twice" in by_user["bob"].message
    assert by_user["carol"].error == ErrorCode.DUPLICATE_RESOURCE
    assert by_user["dave"].error == ErrorCode.RESOURCE_NOT_FOUND
    assert {(type(r).__name__, r.name, r.mechanism) for r in records} == {
        ("UserScramCredentialRecord", "alice", 1),
        ("UserScramCredentialRecord", "alice", 2),
    }
    assert sorted(core.image.scram_credentials) == ["alice", "carol"]


def test_delete_then_describe_and_describe_shapes() -> None:
    core = new_core()
    alter(core, upsertions=[up("alice"), up("alice", mechanism=2, iterations=8192), up("bob")])
    everyone = core.describe_user_scram_credentials(None)
    assert everyone == (
        DescribeScramResult(
            "alice",
            ErrorCode.NONE,
            "",
            (ScramCredentialInfo(1, 4096), ScramCredentialInfo(2, 8192)),
        ),
        DescribeScramResult("bob", ErrorCode.NONE, "", (ScramCredentialInfo(1, 4096),)),
    )
    named = core.describe_user_scram_credentials(["bob", "nobody", "alice", "alice"])
    assert [(r.user, r.error) for r in named] == [
        ("bob", ErrorCode.NONE),
        ("nobody", ErrorCode.RESOURCE_NOT_FOUND),
        ("alice", ErrorCode.DUPLICATE_RESOURCE),
    ]
    reply, records = alter(core, deletions=[ScramDeletion("alice", 1)])
    assert reply == (AlterScramResult("alice", ErrorCode.NONE),)
    assert records == [RemoveUserScramCredentialRecord("alice", 1)]
    assert [r.credentials for r in core.describe_user_scram_credentials(["alice"])] == [
        (ScramCredentialInfo(2, 8192),)
    ]


def test_credentials_survive_restart_and_snapshot() -> None:
    core = new_core()
    log = []
    for upsertions in ([up("alice", password="one")], [up("alice", password="two")]):
        outcome = core.alter_user_scram_credentials([], upsertions, 1)
        log.extend(outcome.entries)
    # A restarted controller replays its log.
    replayed = MetadataImage()
    for entry in log:
        replayed.apply(entry)
    restarted = ControllerCore(ControllerSettings(), "cluster", random.Random(1), 0, replayed)
    credential = restarted.image.scram_credential("alice", 1)
    assert credential is not None and verify_password(credential, "two")
    assert not verify_password(credential, "one")
    # ... or loads a snapshot (through the wire).
    snap = MetadataImage()
    snap.replace_with_snapshot(
        [record_from_pb(record_to_pb(r)) for r in core.image.to_records()],
        core.image.next_offset,
    )
    assert snap == core.image and snap.scram_credentials == core.image.scram_credentials
    reply, _ = alter(restarted, deletions=[ScramDeletion("alice", 1)])
    assert reply[0].error == ErrorCode.NONE and restarted.image.scram_credentials == {}


_NAMES = st.sampled_from(["alice", "bob", "broker-2", ""])
_OPS = st.lists(
    st.one_of(
        st.builds(ScramDeletion, _NAMES, st.sampled_from([1, 2, 3])),
        st.builds(
            lambda n, m, i: up(n, m, i, salted=b"p" * (64 if m == 2 else 32)),
            _NAMES,
            st.sampled_from([1, 2, 3]),
            st.sampled_from([4096, 100]),
        ),
    ),
    max_size=6,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests=st.lists(_OPS, max_size=5))
def test_any_requests_replay_and_snapshot_to_the_same_image(requests) -> None:
    core = new_core()
    log = []
    for ops in requests:
        deletions = [o for o in ops if isinstance(o, ScramDeletion)]
        upsertions = [o for o in ops if isinstance(o, ScramUpsertion)]
        outcome = core.alter_user_scram_credentials(deletions, upsertions, 1)
        log.extend(outcome.entries)
        # One result per user named; the users that succeeded are exactly those written.
        assert [r.user for r in outcome.reply] == list(
            dict.fromkeys([d.name for d in deletions] + [u.name for u in upsertions])
        )
        ok = {r.user for r in outcome.reply if r.error == ErrorCode.NONE}
        assert {e.record.name for e in outcome.entries} == ok
    assert not {"", "broker-2"} & set(core.image.scram_credentials)
    replayed = MetadataImage()
    for entry in log:
        replayed.apply(entry)
    assert replayed == core.image
    snap = MetadataImage()
    snap.replace_with_snapshot(
        [record_from_pb(record_to_pb(r)) for r in core.image.to_records()],
        core.image.next_offset,
    )
    assert snap.scram_credentials == core.image.scram_credentials
