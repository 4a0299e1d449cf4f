"""`minibroker users` (client/cli/users.py): one password per user. --add stores the password
under one mechanism and deletes the user's other mechanism's credential in the same request;
--delete without --mechanism deletes every credential."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from minibroker.client.cli.users import alter_user, alterations, done_lines
from minibroker.client.errors import ResourceNotFoundError
from minibroker.client.scram_admin import (
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from minibroker.deploy.cli import build_parser

SHA256, SHA512 = "SCRAM-SHA-256", "SCRAM-SHA-512"


def plain(wanted: list[Any]) -> list[tuple[str, str]]:
    return [
        ("upsert" if isinstance(a, UserScramCredentialUpsertion) else "delete", str(a.mechanism))
        for a in wanted
    ]


@pytest.mark.parametrize(
    ("existing", "password", "mechanism", "want"),
    [
        ([], "pw", None, [("upsert", SHA256)]),
        ([SHA256], "pw", None, [("upsert", SHA256)]),
        ([SHA512], "pw", None, [("upsert", SHA256), ("delete", SHA512)]),
        ([SHA256, SHA512], "pw", SHA512, [("upsert", SHA512), ("delete", SHA256)]),
        ([SHA256, SHA512], None, None, [("delete", SHA256), ("delete", SHA512)]),
        ([SHA512], None, None, [("delete", SHA512)]),
        ([SHA256, SHA512], None, SHA512, [("delete", SHA512)]),
        ([], None, SHA256, [("delete", SHA256)]),  # the controller says it is not there
    ],
)
def test_one_password_per_user(
    existing: list[str], password: str | None, mechanism: str | None, want: Any
) -> None:
    wanted = alterations("alice", existing, password=password, mechanism=mechanism)
    assert plain(wanted) == want and all(a.user == "alice" for a in wanted)


class FakeAdmin:
    def __init__(self, creds: dict[str, list[str]]) -> None:
        self.creds = creds
        self.requests: list[list[Any]] = []

    async def describe_user_scram_credentials(self, users: list[str]) -> Any:
        (user,) = users
        if user not in self.creds:
            raise ResourceNotFoundError(f"user {user!r} has no SCRAM credential")
        return {user: [ScramCredentialInfo(m, 4096) for m in self.creds[user]]}

    async def alter_user_scram_credentials(self, wanted: list[Any]) -> Any:
        self.requests.append(wanted)
        for a in wanted:
            if isinstance(a, UserScramCredentialDeletion) and a.mechanism not in self.creds.get(
                a.user, []
            ):
                return {a.user: ResourceNotFoundError("no such credential")}
        for a in wanted:
            mechs = self.creds.setdefault(a.user, [])
            if isinstance(a, UserScramCredentialUpsertion):
                mechs.append(str(a.mechanism))
            else:
                mechs.remove(str(a.mechanism))
        return {a.user: None for a in wanted}


def test_a_changed_password_replaces_the_other_mechanism_in_one_request() -> None:
    admin = FakeAdmin({"alice": [SHA512]})
    done = asyncio.run(alter_user(admin, "alice", password="new", mechanism=None))
    assert len(admin.requests) == 1 and admin.creds == {"alice": [SHA256]}
    assert done_lines("alice", done) == [
        f"Completed updating {SHA256} credential of user alice.",
        f"Deleted {SHA512} credential of user alice (one password per user).",
    ]
    # A new user: described as unknown, then added.
    done = asyncio.run(alter_user(admin, "bob", password="pw", mechanism=SHA512))
    assert admin.creds["bob"] == [SHA512]
    assert done_lines("bob", done) == [f"Completed updating {SHA512} credential of user bob."]


def test_delete_without_a_mechanism_deletes_every_credential() -> None:
    admin = FakeAdmin({"alice": [SHA256, SHA512]})
    done = asyncio.run(alter_user(admin, "alice", password=None, mechanism=None))
    assert admin.creds == {"alice": []}
    assert done_lines("alice", done) == [f"Deleted {SHA256}, {SHA512} credential of user alice."]
    with pytest.raises(ResourceNotFoundError):
        asyncio.run(alter_user(admin, "nobody", password=None, mechanism=None))
    with pytest.raises(ResourceNotFoundError):
        asyncio.run(alter_user(admin, "nobody", password=None, mechanism=SHA256))


def test_command_line_defaults_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    assert parser.parse_args(["users", "--delete", "alice"]).mechanism is None
    assert parser.parse_args(["users", "--add", "alice"]).mechanism is None
    with pytest.raises(SystemExit):
        parser.parse_args(["users", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "one password per user" in text
    assert "every mechanism's, or only --mechanism's" in text
