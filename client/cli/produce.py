"""`minibroker produce TOPIC`: Kafka's console producer, one record per stdin line.

Does I/O: reads stdin, writes to stdout/stderr, sends through the blocking Producer. Each line
(without its line ending) is a value; with `--key-separator SEP` the text before the first SEP is
the key, as with Kafka's `parse.key=true`. With `--json`, one `{"partition": P, "offset": O}`
line is printed per acknowledged record, in input order, as soon as it is acknowledged (a
printer thread waits on the futures in order, so interactive use sees each ack at once).
A failed record prints an error line (one for consecutive records failing with the same error,
as the records of one refused batch do); the command then exits 1.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import queue
import sys
import threading
from typing import Any, BinaryIO, TextIO

from minibroker.client.cli.common import add_bootstrap_argument, bootstrap_of, fail, guarded


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "produce",
        help="send stdin lines as records",
        description="Send one record per stdin line (kafka-console-producer.sh).",
    )
    parser.add_argument("topic")
    parser.add_argument("--acks", default="all", choices=["all", "-1", "1", "0"])
    parser.add_argument(
        "--key-separator", default=None, metavar="SEP", help="split each line into KEY SEP VALUE"
    )
    parser.add_argument("--partition", type=int, default=None, help="send to this partition")
    parser.add_argument(
        "--json", action="store_true", help="print {partition, offset} per acknowledged record"
    )
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument(
        "--compression-type", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"]
    )
    add_bootstrap_argument(parser)
    parser.set_defaults(func=guarded(_produce))


def split_line(line: bytes, separator: bytes | None, lineno: int) -> tuple[bytes | None, bytes]:
    """(key, value) of one input line, line ending removed."""
    if line.endswith(b"\n"):
        line = line[:-1]
        if line.endswith(b"\r"):
            line = line[:-1]
    if separator is None:
        return None, line
    key, sep, value = line.partition(separator)
    if not sep:
        raise ValueError(f"line {lineno} has no key separator {separator.decode()!r}")
    return key, value


def _printer(
    futures: queue.Queue[concurrent.futures.Future[Any] | None],
    out: TextIO,
    as_json: bool,
    failures: list[str],
) -> None:
    last_error = ""
    while True:
        future = futures.get()
        if future is None:
            return
        try:
            md = future.result()
        except Exception as err:  # every failure is reported, the rest still print
            message = f"{type(err).__name__}: {err}"
            failures.append(message)
            if message != last_error:
                # The records of a refused batch share its error: one line for all of them.
                print(f"error: {message}", file=sys.stderr, flush=True)
                last_error = message
            continue
        if as_json:
            out.write(json.dumps({"partition": md.partition, "offset": md.offset}) + "\n")
            out.flush()


def produce_lines(
    producer: Any,
    topic: str,
    lines: BinaryIO,
    *,
    separator: bytes | None,
    partition: int | None,
    as_json: bool,
    out: TextIO,
) -> list[str]:
    """Send every line; returns the failure messages (empty when all were acknowledged)."""
    pending: queue.Queue[concurrent.futures.Future[Any] | None] = queue.Queue()
    failures: list[str] = []
    printer = threading.Thread(target=_printer, args=(pending, out, as_json, failures), daemon=True)
    printer.start()
    try:
        for lineno, line in enumerate(iter(lines.readline, b""), 1):
            key, value = split_line(line, separator, lineno)
            pending.put(producer.send(topic, value, key=key, partition=partition))
        producer.flush()
    finally:
        pending.put(None)
        printer.join()
    return failures


def _produce(args: argparse.Namespace) -> int:
    from minibroker.client.sync import Producer

    separator = args.key_separator.encode() if args.key_separator else None
    with Producer(
        bootstrap_of(args),
        acks=args.acks,
        linger_ms=args.linger_ms,
        compression_type=args.compression_type,
    ) as producer:
        failures = produce_lines(
            producer,
            args.topic,
            sys.stdin.buffer,
            separator=separator,
            partition=args.partition,
            as_json=args.json,
            out=sys.stdout,
        )
    if failures:
        return fail(f"{len(failures)} record(s) were not acknowledged")
    return 0
