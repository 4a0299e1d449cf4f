"""`minibroker consume TOPIC`: Kafka's console consumer (manual assignment, no group).

Does I/O: network through AsyncConsumer, records to stdout, the final count to stderr. Without
`--partition` every partition of the topic is read. The start is the end of the log (Kafka's
default), `--from-beginning`, or `--offset N` (with `--partition`). It stops after
`--max-messages`, after `--timeout-ms` without a record, or on Ctrl-C.

Plain output is each value's raw bytes and a newline (`null` for a null value). `--json` prints
one object per record: `{topic, partition, offset, timestamp, key, value, headers}` with key,
value and header values as UTF-8 text; when any of them is not valid UTF-8, all of them are
base64 and the object has `"encoding": "base64"`. `headers` is an object (name -> value; a
repeated name keeps its last value).
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any, BinaryIO

from minibroker.client.cli.common import (
    add_bootstrap_argument,
    bootstrap_of,
    guarded,
    run_async,
    security_of,
)
from minibroker.client.types import Record, TopicPartition


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "consume",
        help="print records of a topic",
        description="Print records of a topic (kafka-console-consumer.sh).",
    )
    parser.add_argument("topic")
    parser.add_argument("--partition", type=int, default=None, help="read only this partition")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true", help="start at the log start")
    start.add_argument("--offset", type=int, default=None, help="start here (needs --partition)")
    parser.add_argument("--max-messages", type=int, default=None, help="stop after N records")
    parser.add_argument(
        "--timeout-ms", type=int, default=None, help="stop after T ms without a record"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per record")
    parser.add_argument("--client-rack", default=None, help="read from a replica in this rack")
    add_bootstrap_argument(parser)
    parser.set_defaults(func=guarded(_consume))


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8")


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def record_json(record: Record) -> dict[str, Any]:
    """The `--json` form of one record (see the module docstring)."""
    out: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
    }
    try:
        out["key"] = _text(record.key)
        out["value"] = _text(record.value)
        out["headers"] = {name: _text(value) for name, value in record.headers}
    except UnicodeDecodeError:
        out["key"] = _b64(record.key)
        out["value"] = _b64(record.value)
        out["headers"] = {name: _b64(value) for name, value in record.headers}
        out["encoding"] = "base64"
    return out


def write_record(record: Record, out: BinaryIO, as_json: bool) -> None:
    if as_json:
        out.write(json.dumps(record_json(record)).encode() + b"\n")
    else:
        out.write((b"null" if record.value is None else record.value) + b"\n")


async def consume(args: argparse.Namespace, out: BinaryIO, progress: list[int]) -> int:
    """Consume per the parsed arguments; returns the number of records printed (also kept in
    progress[0], so an interrupted run can still report it)."""
    from minibroker.client.consumer import AsyncConsumer

    if args.offset is not None and args.partition is None:
        raise ValueError("--offset needs --partition")
    count = 0
    async with AsyncConsumer(
        bootstrap_of(args),
        auto_offset_reset="earliest" if args.from_beginning else "latest",
        client_rack=args.client_rack,
        **security_of(args),
    ) as consumer:
        if args.partition is None:
            info = await consumer.cluster.wait_for_topic(args.topic, consumer.max_block_ms)
            tps = [TopicPartition(args.topic, p) for p in sorted(info.partitions)]
        else:
            tps = [TopicPartition(args.topic, args.partition)]
        consumer.assign(tps)
        if args.offset is not None:
            consumer.seek(tps[0], args.offset)
        # Resolve the start positions now so records produced after this point are seen.
        for tp in tps:
            await consumer.position(tp)
        idle_ms = args.timeout_ms
        while args.max_messages is None or count < args.max_messages:
            wait_ms = 1000 if idle_ms is None else idle_ms
            left = None if args.max_messages is None else args.max_messages - count
            records = await consumer.poll(wait_ms, max_records=left)
            if not records:
                if idle_ms is not None:
                    break
                continue
            for record in records:
                write_record(record, out, args.json)
            out.flush()
            count += len(records)
            progress[0] = count
    return count


def _consume(args: argparse.Namespace) -> int:
    progress = [0]
    try:
        run_async(consume(args, sys.stdout.buffer, progress))
    except KeyboardInterrupt:
        pass
    print(f"Processed a total of {progress[0]} messages", file=sys.stderr)
    return 0
