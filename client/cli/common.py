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
    parser.add_argument(
        "--command-config",
        dest="command_config",
        default=argparse.SUPPRESS,
        metavar="FILE",
        help="Kafka client properties for the connection: security.protocol=SSL or "
        "SASL_SSL, ssl.ca.location, ssl.certificate.location, ssl.key.location, and for "
        "SASL_SSL sasl.mechanism=PLAIN, sasl.username, sasl.password (default: the "
        "client.properties of a `cluster up --tls` cluster when the brokers come from "
        ".minibroker/cluster.json)",
    )


def bootstrap_of(args: argparse.Namespace) -> str:
    return getattr(args, "bootstrap_server", None) or default_bootstrap()


def command_config_path(args: argparse.Namespace, cwd: pathlib.Path | None = None) -> str | None:
    """The client properties file: `--command-config`, else the `client_config` of
    .minibroker/cluster.json when the bootstrap servers come from that file too (neither
    `--bootstrap-server` nor $MINIBROKER_BOOTSTRAP_SERVER given)."""
    given = getattr(args, "command_config", None)
    if given:
        return str(given)
    if getattr(args, "bootstrap_server", None) or os.environ.get(ENV_BOOTSTRAP, "").strip():
        return None
    return cluster_client_config((cwd or pathlib.Path.cwd()) / CLUSTER_FILE.parent)


def cluster_client_config(cluster_dir: str | pathlib.Path) -> str | None:
    """The `client_config` (client.properties) a launcher's cluster.json names, if any."""
    try:
        data = json.loads((pathlib.Path(cluster_dir) / CLUSTER_FILE.name).read_text())
    except (OSError, ValueError):
        return None
    path = data.get("client_config") if isinstance(data, dict) else None
    return path if isinstance(path, str) and path else None


def security_from_file(path: str | None) -> dict[str, Any]:
    """A client properties file -> the Python client's keyword arguments (checked: the PEM
    files are read once here, so a wrong path fails before any connection)."""
    from minibroker.client.common.config import load_file
    from minibroker.client.common.tls import client_tls_from_properties

    if not path:
        return {}
    props = load_file(path)
    client_tls_from_properties(props)
    return {key.replace(".", "_"): value for key, value in props.items()}


def security_of(args: argparse.Namespace) -> dict[str, Any]:
    """`--command-config` (or the local cluster's client.properties) as client kwargs."""
    return security_from_file(command_config_path(args))


def tls_of(args: argparse.Namespace, cluster_dir: str | None = None) -> Any:
    """The same as TlsSettings for channels a command makes itself (watch); None: plaintext.
    `cluster_dir`: a launcher directory whose client.properties applies when no
    --command-config is given."""
    from minibroker.client.common.config import load_file
    from minibroker.client.common.tls import client_tls_from_properties

    path = getattr(args, "command_config", None) or (
        cluster_client_config(cluster_dir) if cluster_dir else command_config_path(args)
    )
    return client_tls_from_properties(load_file(path)) if path else None


def admin_of(args: argparse.Namespace) -> Any:
    """An AsyncAdmin for the command's bootstrap servers (use as `async with`)."""
    from minibroker.client.admin import AsyncAdmin

    return AsyncAdmin(bootstrap_of(args), default_api_timeout_ms=15_000, **security_of(args))


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
