"""`minibroker controller`: start the controller process.

I/O shell: parses flags, loads the config file, configures logging and runs the controller's
composition root (`minibroker.controller.app`) until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from minibroker.client.common.config import ConfigError, command_line_layers, describe
from minibroker.controller.config import ALL_KEYS, build_config

EPILOG = (
    "Settings (--set key=value or the --config file; topic configs such as "
    "min.insync.replicas and unclean.leader.election.enable set the defaults for topics that "
    "do not set them):\n" + describe(ALL_KEYS)
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", help="the metadata log's data dir (metadata.log.dir)")
    parser.add_argument(
        "--listen",
        help="[NAME://]HOST:PORT to serve on (listeners; HOST:PORT is PLAINTEXT); port 0: any",
    )
    parser.add_argument("--node-id", type=int, help="the controller's id (node.id)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus port (0: any, -1: off)")
    parser.add_argument("--config", help="a .properties or .toml file")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting"
    )
    parser.add_argument("--port-file", help="write the bound gRPC port here once serving")
    parser.add_argument(
        "--log-format",
        choices=("json", "console"),
        default=None,
        help="log format (default: json unless stderr is a terminal)",
    )
    parser.set_defaults(func=main)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "controller",
        help="run the controller process",
        description="Run the controller: owns cluster metadata (brokers, topics, leaders, "
        "epochs, ISRs) in an fsynced metadata log, runs every election, serves "
        "ControllerService over gRPC. SIGTERM stops it cleanly.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)


def main(args: argparse.Namespace) -> int:
    flag_keys = (
        ("data_dir", "metadata.log.dir"),
        ("listen", "listeners"),
        ("node_id", "node.id"),
        ("metrics_port", "metrics.port"),
    )
    try:
        config = build_config(*command_line_layers(args, flag_keys))
    except ConfigError as err:
        print(f"minibroker controller: {err}", file=sys.stderr)
        return 2
    if not config["metadata.log.dir"]:
        print("minibroker controller: --data-dir is required", file=sys.stderr)
        return 2
    from minibroker.client.common.log import configure
    from minibroker.controller.app import run_controller
    from minibroker.controller.journal import JournalError

    json = None if args.log_format is None else args.log_format == "json"
    configure("controller", node_id=config["node.id"], json=json)
    try:
        return run_controller(config, port_file=args.port_file)
    except JournalError as err:
        print(f"minibroker controller: {err}", file=sys.stderr)
        return 1


__all__ = ["add_arguments", "main", "register"]
