"""The SCRAM admin pieces off the network: the AlterUserScramCredentials request the client
builds (salted password, never the password), the answers it reads, the controller's wire
conversions, `minibroker users` output and input errors, and UNAUTHENTICATED mapped to
SaslAuthenticationFailedError with the server's message."""

from __future__ import annotations

import grpc
import pytest

from minibroker.client.cli.users import list_lines
from minibroker.client.common.scram import ScramMechanism, salted_password
from minibroker.client.errors import (
    ErrorCode,
    InvalidRequestError,
    ResourceNotFoundError,
    SaslAuthenticationFailedError,
    UnacceptableCredentialError,
)
from minibroker.client.scram_admin import (
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
    alter_request,
    alter_results,
    described,
)
from minibroker.client.stream import rpc_error
from minibroker.client.wire import error_from_rpc
from minibroker.controller import scram_wire
from minibroker.controller.core.scram_control import (
    AlterScramResult,
    DescribeScramResult,
)
from minibroker.controller.core.scram_control import (
    ScramCredentialInfo as CoreInfo,
)
from minibroker.deploy.cli import build_parser
from minibroker.proto import minibroker_pb2 as pb


def test_alter_request_sends_the_salted_password_only() -> None:
    request = alter_request(
        [
            UserScramCredentialUpsertion("alice", "s3cret-pw", "SCRAM-SHA-512", 5000),
            UserScramCredentialUpsertion("bob", "pw2", salt=b"fixed-salt"),
            UserScramCredentialDeletion("carol", 2),
        ]
    )
    assert b"s3cret-pw" not in request.SerializeToString()
    alice, bob = request.upsertions
    assert (alice.name, alice.mechanism, alice.iterations, len(alice.salt)) == (
        "alice",
        2,
        5000,
        32,
    )
    assert alice.salted_password == salted_password(
        ScramMechanism.SCRAM_SHA_512, "s3cret-pw", alice.salt, 5000
    )
    assert bob.salt == b"fixed-salt" and bob.mechanism == 1 and bob.iterations == 4096
    assert [(d.name, d.mechanism) for d in request.deletions] == [("carol", 2)]
    # Two requests salt differently: equal passwords do not show in the log.
    again = alter_request([UserScramCredentialUpsertion("alice", "s3cret-pw", "SCRAM-SHA-512")])
    assert again.upsertions[0].salt != alice.salt
    assert "s3cret" not in repr(UserScramCredentialUpsertion("alice", "s3cret"))


@pytest.mark.parametrize(
    ("alteration", "error", "words"),
    [
        (UserScramCredentialUpsertion("a", ""), ValueError, "non-empty"),
        (UserScramCredentialUpsertion("a", "p", "PLAIN"), ValueError, "unknown SCRAM mechanism"),
        (UserScramCredentialDeletion("a", 3), ValueError, "SCRAM-SHA-256 or SCRAM-SHA-512"),
        (UserScramCredentialUpsertion("a", "p", iterations="9"), TypeError, "iterations"),  # type: ignore[arg-type]
        ("alice", TypeError, "alterations must be"),
    ],
)
def test_alter_request_refuses_what_cannot_be_sent(alteration, error, words) -> None:
    with pytest.raises(error, match=words):
        alter_request([alteration])


def test_answers_are_typed_errors() -> None:
    resp = pb.AlterUserScramCredentialsResponse(
        results=[
            pb.AlterUserScramCredentialsResult(user="a"),
            pb.AlterUserScramCredentialsResult(
                user="b", error_code=pb.UNACCEPTABLE_CREDENTIAL, error_message="too few"
            ),
        ]
    )
    results = alter_results(resp)
    assert results["a"] is None and isinstance(results["b"], UnacceptableCredentialError)
    listing = described(
        scram_wire.describe_scram_reply(
            [
                DescribeScramResult(
                    "a", ErrorCode.NONE, "", (CoreInfo(1, 4096), CoreInfo(2, 8192))
                ),
                DescribeScramResult("z", ErrorCode.RESOURCE_NOT_FOUND, "no such user"),
            ]
        )
    )
    assert listing["a"] == [
        ScramCredentialInfo("SCRAM-SHA-256", 4096),
        ScramCredentialInfo("SCRAM-SHA-512", 8192),
    ]
    assert isinstance(listing["z"], ResourceNotFoundError)
    assert list_lines({"a": listing["a"]}) == [  # type: ignore[dict-item]
        "SCRAM credential configs for user-principal 'a' are "
        "SCRAM-SHA-256=iterations=4096,SCRAM-SHA-512=iterations=8192"
    ]


def test_controller_wire() -> None:
    request = pb.AlterUserScramCredentialsRequest(
        deletions=[pb.ScramCredentialDeletion(name="a", mechanism=1)],
        upsertions=[
            pb.ScramCredentialUpsertion(
                name="b", mechanism=2, iterations=4096, salt=b"s", salted_password=b"p"
            )
        ],
    )
    deletions, upsertions = scram_wire.alter_scram_request(request)
    assert (deletions[0].name, upsertions[0].salted_password) == ("a", b"p")
    reply = scram_wire.alter_scram_reply([AlterScramResult("a", ErrorCode.DUPLICATE_RESOURCE, "x")])
    assert (reply.results[0].user, reply.results[0].error_code) == ("a", pb.DUPLICATE_RESOURCE)
    big = pb.AlterUserScramCredentialsRequest(
        deletions=[pb.ScramCredentialDeletion(name="u", mechanism=1)] * 1001
    )
    with pytest.raises(InvalidRequestError, match="at most 1000") as err:
        scram_wire.alter_scram_request(big)
    refused = scram_wire.alter_scram_error(big, err.value)
    assert [r.user for r in refused.results] == ["u"]
    assert scram_wire.describe_scram_request(pb.DescribeUserScramCredentialsRequest()) is None


def test_unauthenticated_maps_to_sasl_authentication_failed() -> None:
    err = rpc_error(
        grpc.StatusCode.UNAUTHENTICATED,
        "SASL authentication failed: invalid username or password",
    )
    mapped = error_from_rpc(err, "127.0.0.1:9092")
    assert isinstance(mapped, SaslAuthenticationFailedError)
    assert "invalid username or password" in str(mapped) and not mapped.retriable


def test_users_command_line() -> None:
    parser = build_parser()
    args = parser.parse_args(["users", "--add", "alice", "--mechanism", "scram-sha-512"])
    assert (args.add, args.mechanism, args.iterations) == ("alice", "SCRAM-SHA-512", 4096)
    with pytest.raises(SystemExit):
        parser.parse_args(["users", "--add", "a", "--delete", "b"])
    with pytest.raises(SystemExit):
        parser.parse_args(["users", "--delete", "b", "--mechanism", "PLAIN"])
    args = parser.parse_args(["users", "--delete", "b", "--password", "x"])
    assert args.func(args) == 1  # --password only goes with --add: nothing sent


def test_command_config_with_a_sasl_login(tmp_path) -> None:
    from minibroker.client.cli.common import security_from_file
    from minibroker.deploy import tls as certs

    ca = certs.make_ca(tmp_path)
    path = tmp_path / "sasl.properties"
    path.write_text(
        "security.protocol=SASL_SSL\n"
        f"ssl.ca.location={ca.cert}\n"
        "sasl.mechanism=PLAIN\nsasl.username=alice\nsasl.password=pw\n"
    )
    assert security_from_file(str(path)) == {
        "security_protocol": "SASL_SSL",
        "ssl_ca_location": str(ca.cert),
        "sasl_mechanism": "PLAIN",
        "sasl_username": "alice",
        "sasl_password": "pw",
    }
    path.write_text("security.protocol=SASL_SSL\nsasl.username=alice\n")
    with pytest.raises(ValueError, match=r"SASL_SSL needs sasl\.password"):
        security_from_file(str(path))


def test_password_from_stdin_when_it_is_not_a_terminal(monkeypatch) -> None:
    import io

    from minibroker.client.cli.users import UsersInputError, read_password

    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret\n"))
    assert read_password("alice") == "s3cret"
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    with pytest.raises(UsersInputError, match="no --password and no password on stdin"):
        read_password("alice")
