"""The one `minibroker` command: assembles the subcommands of every component.

This is the only module (with the rest of `minibroker.deploy`) allowed to import broker,
controller and client alike (docs/design.md §1). Each command module exposes
`register(subparsers) -> None`, which adds its parser and sets `func(args) -> int`.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from minibroker.client.common.runtime import tune_process

# Order is the order of `minibroker --help`.
COMMAND_MODULES: tuple[str, ...] = (
    "minibroker.client.cli.topics",
    "minibroker.client.cli.produce",
    "minibroker.client.cli.consume",
    "minibroker.client.cli.consumer_groups",
    "minibroker.client.cli.leader_election",
    "minibroker.client.cli.brokers",
    "minibroker.client.cli.reassign",
    "minibroker.client.cli.configs",
    "minibroker.client.cli.acls",
    "minibroker.client.cli.users",
    "minibroker.client.cli.watch",
    "minibroker.client.cli.dump_log",
    "minibroker.deploy.bench",
    "minibroker.deploy.cluster_cli",
    "minibroker.deploy.demo",
    "minibroker.deploy.verify",
    "minibroker.broker.cli",
    "minibroker.controller.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="minibroker",
        description="minibroker: a small replicated log broker that follows Kafka's protocol.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    tune_process()
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
