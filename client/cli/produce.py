"""`minibroker produce TOPIC`: Kafka's console producer, one record per stdin line.

Does I/O: reads stdin, writes to stdout/stderr, sends through the blocking Producer. Each line
(without its line ending) is a value; with `--key-separator SEP` the text before the first SEP is
the key, as with Kafka's `parse.key=true`. Input is read as it comes (whatever one read returns,
up to 1 MiB): the lines of each read go to the producer in one `send_batch`, so a file sends a
batch at a time and a person typing sends each line at once. With `--json`, one
`{"partition": P, "offset": O}` line is printed per acknowledged record, in input order, as soon
as it is acknowledged (a printer thread waits on the records in order).
A failed record prints an error line (one for consecutive records failing with the same error,
as the records of one refused batch do); the command then exits 1.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO, TextIO

from minibroker.client.cli.common import (
    add_bootstrap_argument,
    bootstrap_of,
    fail,
    guarded,
    security_of,
)


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


# The most one read of stdin takes: the lines it holds become one send_batch.
READ_BYTES = 1 << 20


def read_lines(stream: BinaryIO, size: int = READ_BYTES) -> Iterator[list[bytes]]:
    """The lines of `stream` (line endings kept), in lists of what each read returned: a pipe's
    burst or a file's next MiB, without waiting for more (`read1`). A last line without an
    ending is yielded at the end."""
    read1 = getattr(stream, "read1", stream.read)
    tail = b""
    while True:
        data = read1(size)
        if not data:
            if tail:
                yield [tail]
            return
        lines = (tail + data).split(b"\n")
        tail = lines.pop()
        if lines:
            yield [line + b"\n" for line in lines]


def _printer(
    pending: queue.Queue[Sequence[Any] | None],
    out: TextIO,
    as_json: bool,
    failures: list[str],
) -> None:
    last_error = ""
    while True:
        sent = pending.get()
        if sent is None:
            return
        if not as_json and _all_acknowledged(sent):
            continue  # nothing to print, and nothing per record to look at
        for future in sent:
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


def _all_acknowledged(sent: Sequence[Any]) -> bool:
    wait = getattr(sent, "exception", None)
    return wait is not None and wait() is None


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
    pending: queue.Queue[Sequence[Any] | None] = queue.Queue()
    failures: list[str] = []
    printer = threading.Thread(target=_printer, args=(pending, out, as_json, failures), daemon=True)
    printer.start()
    lineno = 0
    try:
        for chunk in read_lines(lines):
            pairs = [split_line(line, separator, lineno + i) for i, line in enumerate(chunk, 1)]
            lineno += len(chunk)
            values = [value for _, value in pairs]
            keys = [key for key, _ in pairs] if separator is not None else None
            pending.put(producer.send_batch(topic, values, keys=keys, partition=partition))
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
        **security_of(args),
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
