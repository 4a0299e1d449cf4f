"""`minibroker watch [--topic T] [--once]`: a live terminal view of the cluster.

Does network I/O and terminal output through `minibroker.client.watch.live`. Brokers (alive,
fenced, paused, rack), per partition the leader, leader epoch, ISR, HW and each replica's LEO and
lag, and a timeline of elections, ISR changes, fencing, truncations and log cleaner rounds (of
compacted topics). For a cluster started by
`minibroker cluster up` (its `cluster.json` in `--cluster-dir`, by default `.minibroker` when it
describes the cluster being watched) it also shows process states. Truncations come from the
brokers' DescribeReplicas answers, and so do cleaner rounds, so a remote cluster shows them
too. `--once` prints one frame and exits: 0 if the controller or any broker answered, 1 if
nothing did.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from minibroker.client.cli.common import (
    CLUSTER_FILE,
    add_bootstrap_argument,
    bootstrap_of,
    guarded,
    tls_of,
)

# Wide enough for three replicas with lags on one line; a pipe has no terminal width to ask.
ONCE_WIDTH_NOT_A_TTY = 160


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "watch",
        help="live view of brokers, partitions and cluster events",
        description="A live terminal view of the cluster: brokers, partitions (leader, epoch, "
        "ISR, HW, LEO and lag per replica) and a timeline of elections, ISR changes, fencing, "
        "truncations and log cleaner rounds. Ctrl-C to quit.",
    )
    parser.add_argument("--topic", help="show only this topic's partitions and events")
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument(
        "--cluster-dir",
        help="directory of a local cluster's cluster.json, for process states "
        "(default: .minibroker when it describes the watched cluster)",
    )
    parser.add_argument(
        "--width", type=int, help="frame width in columns (default: the terminal's, or 160)"
    )
    add_bootstrap_argument(parser)
    parser.set_defaults(func=guarded(_watch))


def _cluster_dir(args: argparse.Namespace, bootstrap: str) -> str | None:
    """The launcher directory to read, if any. The default one counts only when it describes
    the cluster being watched, so `--bootstrap-server` elsewhere never shows local processes."""
    from minibroker.client.watch.live import read_cluster_file

    if args.cluster_dir:
        if read_cluster_file(args.cluster_dir) is None:
            raise ValueError(f"no readable cluster.json in {args.cluster_dir!r}")
        return str(args.cluster_dir)
    default_dir = str(CLUSTER_FILE.parent)
    data = read_cluster_file(default_dir)
    if data is not None and data.get("bootstrap_servers") == bootstrap:
        return default_dir
    return None


def _watch(args: argparse.Namespace) -> int:
    from rich.console import Console

    from minibroker.client.common.runtime import run

    # Imported here, not at the top: rich's live view is the heaviest import of every
    # `minibroker` command, and only `watch` needs it.
    from minibroker.client.watch.live import options_for, read_cluster_file, watch

    bootstrap = bootstrap_of(args)
    cluster_dir = _cluster_dir(args, bootstrap)
    if args.cluster_dir and not getattr(args, "bootstrap_server", None):
        # The cluster named by --cluster-dir is the one to watch.
        data = read_cluster_file(args.cluster_dir) or {}
        bootstrap = str(data.get("bootstrap_servers") or bootstrap)
    options = options_for(bootstrap, args.topic, cluster_dir, tls_of(args, cluster_dir))
    width = args.width or (None if sys.stdout.isatty() else ONCE_WIDTH_NOT_A_TTY)
    console = Console(width=width, highlight=False)

    async def main(stop: asyncio.Event) -> int:
        return await watch(options, console, once=args.once, stop=stop)

    return run(main)


__all__ = ["register"]
