"""`minibroker broker`: start one broker process.

I/O shell: parses flags, loads the config file, configures logging and runs the broker's
composition root (`minibroker.broker.app`) until SIGTERM (controlled shutdown) or SIGINT.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Any

from minibroker.broker.config import BROKER_ALIASES, BROKER_KEYS, build_config
from minibroker.client.common.config import ConfigError, command_line_layers, describe
from minibroker.client.topic_config import TOPIC_CONFIG_KEYS

EPILOG = (
    "Settings (--set key=value or the --config file; topic configs such as "
    "min.insync.replicas set the broker's defaults for topics):\n"
    + describe(BROKER_KEYS)
    + "\n\n"
    + textwrap.fill(
        "Defaults for topic configs (a topic's own setting wins), under the topic name or "
        "Kafka's broker name: "
        + ", ".join(f"{alias} for {name}" for alias, name in BROKER_ALIASES.items())
        + ".",
        width=100,
    )
    + "\n"
    + describe(TOPIC_CONFIG_KEYS)
)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "broker",
        help="run a broker process",
        description="Run one broker: hosts partition replicas, serves BrokerService over gRPC, "
        "registers and heartbeats with the controller. SIGTERM is a controlled shutdown.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--node-id", type=int, help="this broker's id (node.id)")
    parser.add_argument("--data-dir", help="data dir for logs and checkpoints (log.dirs)")
    parser.add_argument(
        "--listen",
        help="[NAME://]HOST:PORT to serve on (listeners; HOST:PORT is PLAINTEXT); port 0: any",
    )
    parser.add_argument(
        "--controller", help="HOST:PORT of the controller (a comma-separated list: a quorum)"
    )
    parser.add_argument("--rack", help="rack id (broker.rack)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus port (0: any, -1: off)")
    parser.add_argument("--config", help="a .properties or .toml file")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a setting (repeatable)",
    )
    parser.add_argument("--port-file", help="write the bound gRPC port here once serving")
    parser.add_argument(
        "--log-format",
        choices=("json", "console"),
        default=None,
        help="log format (default: json unless stderr is a terminal)",
    )
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    flag_keys = (
        ("node_id", "node.id"),
        ("data_dir", "log.dirs"),
        ("listen", "listeners"),
        ("controller", "controller.quorum.bootstrap.servers"),
        ("rack", "broker.rack"),
        ("metrics_port", "metrics.port"),
    )
    try:
        config = build_config(*command_line_layers(args, flag_keys))
    except ConfigError as err:
        print(f"minibroker broker: {err}", file=sys.stderr)
        return 2
    from minibroker.broker import app

    return app.main(config, port_file=args.port_file, log_format=args.log_format)
