"""`minibroker bench ...`: benchmarks in the shape of Kafka's perf-test tools (docs/design.md §9).

Assembles the bench subcommands of each component; each bench module exposes
`register(bench_subparsers)`. Benchmarks are separate from tests: they measure, never assert.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

BENCH_MODULES: tuple[str, ...] = (
    "minibroker.deploy.bench_failover",
    "minibroker.deploy.bench_reassign",
    "minibroker.deploy.bench_scale",
    "minibroker.deploy.bench_kafka",
    "minibroker.broker.storage.bench",
    "minibroker.broker.cleaner.bench",
    "minibroker.client.cli.bench",
)


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "bench",
        help="run a benchmark (log, cleaner, produce, consume, e2e, failover, metadata, reassign, "
        "scale, kafka)",
        description="Benchmarks that print measured figures; they never assert.",
    )
    bench_sub = parser.add_subparsers(dest="bench", metavar="BENCH")
    for name in BENCH_MODULES:
        importlib.import_module(name).register(bench_sub)

    def _no_bench(args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=_no_bench)
