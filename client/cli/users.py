"""`minibroker users`: the SCRAM credentials that SASL PLAIN checks passwords against
(kafka-configs.sh --entity-type users --add-config 'SCRAM-SHA-256=[...]', as one command).

Does network I/O through AsyncAdmin (AlterUserScramCredentials, DescribeUserScramCredentials on
the controller); reads a password from the terminal when --password is not given; writes to
stdout.

    minibroker users --add alice [--password P] [--mechanism SCRAM-SHA-256] [--iterations 4096]
    minibroker users --delete alice [--mechanism SCRAM-SHA-256]
    minibroker users --list

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
from collections.abc import Mapping
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
    action.add_argument("--add", metavar="NAME", help="set NAME's credential (add or replace)")
    action.add_argument("--delete", metavar="NAME", help="delete NAME's credential")
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
        default=MECHANISM_NAMES[0],
        type=str.upper,
        choices=MECHANISM_NAMES,
        help=f"--add/--delete: the SCRAM mechanism (default {MECHANISM_NAMES[0]})",
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


def _run(args: argparse.Namespace) -> int:
    from minibroker.client.scram_admin import (
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

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
        alteration: Any = UserScramCredentialUpsertion(
            args.add, password, args.mechanism, args.iterations
        )
        user, done = args.add, "Completed updating"
    else:
        if args.password is not None:
            raise UsersInputError("--password only goes with --add")
        alteration = UserScramCredentialDeletion(args.delete, args.mechanism)
        user, done = args.delete, "Deleted"

    async def main() -> Mapping[str, Any]:
        async with admin_of(args) as admin:
            return await admin.alter_user_scram_credentials([alteration])

    results = run_async(main())
    error = results.get(user)
    if error is not None:
        raise error
    print(f"{done} {args.mechanism} credential of user {user}.")
    return 0


def _list(args: argparse.Namespace) -> int:
    async def main() -> Mapping[str, list[Any]]:
        async with admin_of(args) as admin:
            return await admin.describe_user_scram_credentials()

    lines = list_lines(run_async(main()))
    for line in lines or ["No SCRAM users."]:
        print(line)
    return 0


__all__ = ["UsersInputError", "list_lines", "read_password", "register"]
