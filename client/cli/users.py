"""`minibroker users`: the SCRAM credentials that SASL PLAIN checks passwords against
(kafka-configs.sh --entity-type users --add-config 'SCRAM-SHA-256=[...]', as one command).

Does network I/O through AsyncAdmin (AlterUserScramCredentials, DescribeUserScramCredentials on
the controller); reads a password from the terminal when --password is not given; writes to
stdout.

    minibroker users --add alice [--password P] [--mechanism SCRAM-SHA-256] [--iterations 4096]
    minibroker users --delete alice [--mechanism SCRAM-SHA-256]
    minibroker users --list

One password per user: a SASL PLAIN login is accepted when its password matches either of the
user's credentials, so `--add` sets the given mechanism's credential and deletes the user's
credential for the other mechanism in the same request (atomically: both or neither), and
`--delete` without `--mechanism` deletes every credential of the user. A changed or deleted
password therefore stops working at once.

The password is salted on this side (PBKDF2) and never sent; the controller stores the salt, the
iteration count and two keys derived from it. `--list` shows names, mechanisms and iteration
counts only. Clients then log in with security.protocol=SASL_SSL, sasl.mechanism=PLAIN,
sasl.username, sasl.password (PLAIN over TLS; the server checks the password against either
mechanism's credential).
"""

from __future__ import annotations

import argparse
import getpass
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from minibroker.client.cli.common import add_bootstrap_argument, admin_of, guarded, run_async
from minibroker.client.common.scram import (
    DEFAULT_ITERATIONS,
    MAX_ITERATIONS,
    MECHANISM_NAMES,
    MIN_ITERATIONS,
)


class UsersInputError(ValueError):
    """A bad command line: nothing was sent."""


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "users",
        help="add, delete or list SCRAM users (SASL passwords)",
        description="Add, delete or list the users that SASL PLAIN logins are checked against "
        "(SCRAM credentials in the metadata log; the password itself is never sent nor stored).",
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument(
        "--add",
        metavar="NAME",
        help="set NAME's password (add or replace): its credential for --mechanism, and its "
        "credential for the other mechanism, if any, deleted (one password per user)",
    )
    action.add_argument(
        "--delete",
        metavar="NAME",
        help="delete NAME's credentials: every mechanism's, or only --mechanism's",
    )
    action.add_argument(
        "--list", action="store_true", help="list users with their mechanisms and iterations"
    )
    parser.add_argument(
        "--password",
        default=None,
        help="--add: the password (default: asked for on the terminal without echo, or read "
        "as one line of stdin when that is not a terminal)",
    )
    parser.add_argument(
        "--mechanism",
        default=None,
        type=str.upper,
        choices=MECHANISM_NAMES,
        help=f"--add: the SCRAM mechanism to store the password with (default "
        f"{MECHANISM_NAMES[0]}); --delete: only this mechanism's credential (default: all)",
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=DEFAULT_ITERATIONS,
        help=f"--add: PBKDF2 iterations, {MIN_ITERATIONS} to {MAX_ITERATIONS} "
        f"(default {DEFAULT_ITERATIONS})",
    )
    add_bootstrap_argument(parser)
    parser.set_defaults(func=guarded(_run))


def read_password(user: str) -> str:
    """The password from the terminal (twice, when it is one), or one line of stdin."""
    if not sys.stdin.isatty():
        line = sys.stdin.readline().rstrip("\n")
        if not line:
            raise UsersInputError("no --password and no password on stdin")
        return line
    first = getpass.getpass(f"Password for {user}: ")
    if not first:
        raise UsersInputError("the password must not be empty")
    if getpass.getpass(f"Retype the password for {user}: ") != first:
        raise UsersInputError("the passwords do not match")
    return first


def list_lines(described: Mapping[str, list[Any]]) -> list[str]:
    """kafka-configs --describe --entity-type users, one line per user."""
    lines = []
    for user in sorted(described):
        creds = ",".join(f"{c.mechanism}=iterations={c.iterations}" for c in described[user])
        lines.append(f"SCRAM credential configs for user-principal '{user}' are {creds}")
    return lines


def alterations(
    user: str,
    existing: Sequence[str],
    *,
    password: str | None,
    mechanism: str | None,
    iterations: int = DEFAULT_ITERATIONS,
) -> list[Any]:
    """The one request for `--add` (password given) or `--delete` (password None), given the
    mechanisms the user has credentials for: --add upserts `mechanism` (default the first) and
    deletes every other existing one; --delete deletes `mechanism`, or every existing one."""
    from minibroker.client.scram_admin import (
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    if password is not None:
        chosen = mechanism or MECHANISM_NAMES[0]
        upsert = UserScramCredentialUpsertion(user, password, chosen, iterations)
        return [upsert] + [UserScramCredentialDeletion(user, m) for m in existing if m != chosen]
    if mechanism is not None:
        # Sent even when not listed: the controller's RESOURCE_NOT_FOUND says why.
        return [UserScramCredentialDeletion(user, mechanism)]
    return [UserScramCredentialDeletion(user, m) for m in existing]


async def alter_user(
    admin: Any,
    user: str,
    *,
    password: str | None,
    mechanism: str | None,
    iterations: int = DEFAULT_ITERATIONS,
) -> list[Any]:
    """Read the user's mechanisms, then send `alterations` as one request: the controller
    refuses only the same (user, mechanism) twice (Kafka's rule), and applies a user's changes
    in full or not at all, so a password is never left set under two mechanisms. Raises the
    user's error (ResourceNotFoundError for deleting a user without credentials, or when a
    credential read here was deleted meanwhile: nothing changed, run it again). Returns what was
    done."""
    from minibroker.client.errors import ResourceNotFoundError

    try:
        described = await admin.describe_user_scram_credentials([user])
    except ResourceNotFoundError:
        if password is None and mechanism is None:
            raise
        described = {}
    existing = [c.mechanism for c in described.get(user, [])]
    wanted = alterations(
        user, existing, password=password, mechanism=mechanism, iterations=iterations
    )
    results = await admin.alter_user_scram_credentials(wanted)
    error = results.get(user)
    if error is not None:
        raise error
    return wanted


def done_lines(user: str, done: Sequence[Any]) -> list[str]:
    """What `--add` / `--delete` did, for stdout."""
    from minibroker.client.scram_admin import UserScramCredentialUpsertion

    lines = [
        f"Completed updating {a.mechanism} credential of user {user}."
        for a in done
        if isinstance(a, UserScramCredentialUpsertion)
    ]
    deleted = [str(a.mechanism) for a in done if not isinstance(a, UserScramCredentialUpsertion)]
    if deleted:
        also = " (one password per user)" if lines else ""
        lines.append(f"Deleted {', '.join(deleted)} credential of user {user}{also}.")
    return lines


def _run(args: argparse.Namespace) -> int:
    if args.list:
        if args.password is not None:
            raise UsersInputError("--password only goes with --add")
        return _list(args)
    if args.add is not None:
        if not args.add:
            raise UsersInputError("--add needs a user name")
        password = args.password if args.password is not None else read_password(args.add)
        if not password:
            raise UsersInputError("the password must not be empty")
        user: str = args.add
    else:
        if args.password is not None:
            raise UsersInputError("--password only goes with --add")
        password, user = None, args.delete

    async def main() -> list[Any]:
        async with admin_of(args) as admin:
            return await alter_user(
                admin,
                user,
                password=password,
                mechanism=args.mechanism,
                iterations=args.iterations,
            )

    for line in done_lines(user, run_async(main())):
        print(line)
    return 0


def _list(args: argparse.Namespace) -> int:
    async def main() -> Mapping[str, list[Any]]:
        async with admin_of(args) as admin:
            return await admin.describe_user_scram_credentials()

    lines = list_lines(run_async(main()))
    for line in lines or ["No SCRAM users."]:
        print(line)
    return 0


__all__ = [
    "UsersInputError",
    "alter_user",
    "alterations",
    "done_lines",
    "list_lines",
    "read_password",
    "register",
]
