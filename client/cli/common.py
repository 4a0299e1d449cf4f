"""Shared pieces of the client CLI commands: the bootstrap server option and error reporting.

Does I/O: reads `.minibroker/cluster.json` in the current directory (written by
`minibroker cluster up`) and the environment, writes one error line to stderr. The bootstrap
servers come from, in order: `--bootstrap-server`, `$MINIBROKER_BOOTSTRAP_SERVER`, the
`bootstrap_servers` of `.minibroker/cluster.json`, and `127.0.0.1:9092`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from minibroker.client.common.config import ConfigError
from minibroker.client.errors import MiniBrokerError

ENV_BOOTSTRAP = "MINIBROKER_BOOTSTRAP_SERVER"
CLUSTER_FILE = pathlib.Path(".minibroker") / "cluster.json"
FALLBACK_BOOTSTRAP = "127.0.0.1:9092"

T = TypeVar("T")


def default_bootstrap(
    cwd: pathlib.Path | None = None, environ: dict[str, str] | os._Environ[str] | None = None
) -> str:
    """The bootstrap servers to use when `--bootstrap-server` is not given."""
    env = os.environ if environ is None else environ
    from_env = env.get(ENV_BOOTSTRAP, "").strip()
    if from_env:
        return from_env
    path = (cwd or pathlib.Path.cwd()) / CLUSTER_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return FALLBACK_BOOTSTRAP
    servers = data.get("bootstrap_servers") if isinstance(data, dict) else None
    if isinstance(servers, str) and servers.strip():
        return servers.strip()
    return FALLBACK_BOOTSTRAP


def add_bootstrap_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap-server",
        dest="bootstrap_server",
        # SUPPRESS: the option may be given before or after a sub-action without the inner
        # parser's default overwriting the outer value.
        default=argparse.SUPPRESS,
        metavar="HOST:PORT[,HOST:PORT]",
        help=f"brokers to connect to (default: ${ENV_BOOTSTRAP}, then "
        f".minibroker/cluster.json, then {FALLBACK_BOOTSTRAP})",
    )


def bootstrap_of(args: argparse.Namespace) -> str:
    return getattr(args, "bootstrap_server", None) or default_bootstrap()


def admin_of(args: argparse.Namespace) -> Any:
    """An AsyncAdmin for the command's bootstrap servers (use as `async with`)."""
    from minibroker.client.admin import AsyncAdmin

    return AsyncAdmin(bootstrap_of(args), default_api_timeout_ms=15_000)


def help_when_no_action(parser: argparse.ArgumentParser) -> None:
    """A command group run without a subcommand prints its help and exits 2."""

    def no_action(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=no_action)


def fail(message: str) -> int:
    """Print one error line to stderr; returns the exit status 1."""
    print(f"error: {message}", file=sys.stderr)
    return 1


def guarded(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Wrap a command so expected errors print one line (no traceback) and exit 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except MiniBrokerError as err:
            return fail(f"{type(err).__name__}: {err}")
        except (ConfigError, ValueError, TypeError) as err:
            return fail(str(err))

    run.__name__ = getattr(fn, "__name__", "command")
    run.__doc__ = fn.__doc__
    return run


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """Run a command's coroutine on a fresh event loop (uvloop where available)."""
    from minibroker.client.common.runtime import new_event_loop

    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


def parse_config_pairs(pairs: list[str] | None) -> dict[str, str]:
    """`["a=1", "b=2"]` -> {"a": "1", "b": "2"} for `--config` options."""
    out: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--config expects key=value, got {pair!r}")
        out[key.strip()] = value.strip()
    return out
