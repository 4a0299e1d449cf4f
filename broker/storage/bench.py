"""`minibroker bench log`: PartitionLog append and read throughput beside a raw file loop.

Does file I/O in a scratch directory (removed afterwards). Measures, never asserts. Each run
writes the same pre-built v2 batches (`--record-bytes` values, `--batch-bytes` per batch) three
ways and reads them back:

    append (leader)     PartitionLog.append_as_leader, one batch per call, as a produce does
    append (follower)   PartitionLog.append_as_follower, `--read-bytes` of batches per call
    raw write           os.write of the same bytes (per batch, or per chunk for the follower) to
                        a plain O_APPEND file
    read (sequential)   PartitionLog.read(offset, --read-bytes) from offset 0 to the LEO
    raw pread           os.pread of --read-bytes chunks over the raw file

Log and raw steps (about 1 MiB each) are interleaved, alternating which goes first, so both see
the same machine (page-cache state and the load of other processes change fast here). Prints
MB/s (10^6 bytes) and the ratio log/raw, median of `--runs` runs. The goal for the log is
>= 50% of the raw loop for both append and sequential read.
"""

from __future__ import annotations

import argparse
import logging
import os
import pathlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import structlog

from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.log import PartitionLog
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition

_TP = TopicPartition("bench", 0)


def register(bench_sub: Any) -> None:
    parser = bench_sub.add_parser(
        "log",
        help="storage engine append/read throughput vs a raw os.write/os.pread loop",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--total-mb", type=int, default=256, help="MiB written per run")
    parser.add_argument("--record-bytes", type=int, default=1024, help="record value size")
    parser.add_argument("--batch-bytes", type=int, default=16384, help="approximate batch size")
    parser.add_argument("--read-bytes", type=int, default=1 << 20, help="max bytes per read")
    parser.add_argument("--segment-bytes", type=int, default=64 << 20, help="segment.bytes")
    parser.add_argument("--runs", type=int, default=3, help="runs; the median is reported")
    parser.add_argument("--dir", default=None, help="scratch dir (default: a temp dir)")
    parser.set_defaults(func=run)


def _build_batches(record_bytes: int, batch_bytes: int, count: int) -> list[bytes]:
    per_batch = max(1, batch_bytes // record_bytes)
    batches = []
    for i in range(count):
        value = bytes([i % 251]) * record_bytes
        records = [(1_700_000_000_000 + i, None, value, ()) for _ in range(per_batch)]
        batches.append(encode_batch(records))
    return batches


class _Clock:
    """Accumulates the time of interleaved steps, so both sides see the same machine."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.bytes = 0

    def time(self, fn: Callable[[], int]) -> None:
        start = time.perf_counter()
        self.bytes += fn()
        self.seconds += time.perf_counter() - start

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds else 0.0


def _interleave(steps: list[tuple[Callable[[], int], Callable[[], int]]]) -> tuple[float, float]:
    """Run (log step, raw step) pairs, alternating which goes first; (log MB/s, raw MB/s)."""
    log_clock, raw_clock = _Clock(), _Clock()
    for i, (log_step, raw_step) in enumerate(steps):
        if i % 2:
            raw_clock.time(raw_step)
            log_clock.time(log_step)
        else:
            log_clock.time(log_step)
            raw_clock.time(raw_step)
    return log_clock.mb_per_s, raw_clock.mb_per_s


def _writer(fd: int, batches: list[bytes]) -> Callable[[], int]:
    def step() -> int:
        for b in batches:
            os.write(fd, b)
        return sum(len(b) for b in batches)

    return step


def _one_run(root: pathlib.Path, args: argparse.Namespace, pool: list[bytes]) -> dict[str, float]:
    total = args.total_mb << 20
    count = max(1, total // len(pool[0]))
    batches = [pool[i % len(pool)] for i in range(count)]
    config = LogConfig(segment_bytes=args.segment_bytes)
    now_ms = 1_700_000_000_000
    block = 64  # batches per interleaved step (about 1 MiB)
    results: dict[str, float] = {}
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    # Leader appends, one batch per call, against os.write of the same batches.
    log = PartitionLog.open(root / "leader", _TP, config, now_ms)
    raw_fd = os.open(root / "raw.bin", flags, 0o644)

    def leader_step(part: list[bytes]) -> Callable[[], int]:
        def step() -> int:
            for b in part:
                log.append_as_leader(b, 0, now_ms)
            return sum(len(b) for b in part)

        return step

    parts = [batches[i : i + block] for i in range(0, len(batches), block)]
    steps = [(leader_step(part), _writer(raw_fd, part)) for part in parts]
    results["leader_append"], results["raw_write"] = _interleave(steps)
    os.close(raw_fd)

    # Sequential reads of the same bytes: PartitionLog.read against os.pread.
    raw_fd = os.open(root / "raw.bin", os.O_RDONLY)
    cursor = {"offset": 0, "position": 0}
    chunks: list[bytes] = []

    def log_read() -> int:
        info = log.read(cursor["offset"], args.read_bytes)
        cursor["offset"] = info.next_offset
        chunks.append(info.records)
        return len(info.records)

    def raw_read() -> int:
        data = os.pread(raw_fd, args.read_bytes, cursor["position"])
        cursor["position"] += len(data)
        return len(data)

    reads = (log.size_bytes + args.read_bytes - 1) // args.read_bytes + 1
    results["log_read"], results["raw_read"] = _interleave([(log_read, raw_read)] * reads)
    os.close(raw_fd)
    log.close()
    shutil.rmtree(root / "leader")
    os.unlink(root / "raw.bin")

    # Follower appends of whole fetched chunks (the leader's offsets) against os.write.
    follower = PartitionLog.open(root / "follower", _TP, config, now_ms)
    raw_fd = os.open(root / "raw.bin", flags, 0o644)
    chunks = [c for c in chunks if c]

    def follower_step(chunk: bytes) -> Callable[[], int]:
        def step() -> int:
            follower.append_as_follower(chunk, now_ms)
            return len(chunk)

        return step

    steps = [(follower_step(c), _writer(raw_fd, [c])) for c in chunks]
    results["follower_append"], results["raw_write_chunks"] = _interleave(steps)
    os.close(raw_fd)
    follower.close()
    return results


def run(args: argparse.Namespace) -> int:
    # Quiet the storage's info events (segment_rolled, ...) without touching where logs go.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    pool = _build_batches(args.record_bytes, args.batch_bytes, 64)
    base = pathlib.Path(args.dir) if args.dir else None
    runs: list[dict[str, float]] = []
    for _ in range(args.runs):
        root = pathlib.Path(tempfile.mkdtemp(prefix="mb-bench-log-", dir=base))
        try:
            runs.append(_one_run(root, args, pool))
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def median(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    batch_size = len(pool[0])
    print(
        f"minibroker bench log: {args.total_mb} MiB per run, {args.record_bytes} B records, "
        f"{batch_size} B batches, reads of {args.read_bytes} B, median of {len(runs)} runs"
    )
    print(f"{'':24}{'log MB/s':>10}{'raw MB/s':>10}{'ratio':>8}")
    rows = [
        ("append (leader, 1/call)", "leader_append", "raw_write"),
        ("append (follower)", "follower_append", "raw_write_chunks"),
        ("read (sequential)", "log_read", "raw_read"),
    ]
    for label, key, raw_key in rows:
        value, raw = median(key), median(raw_key)
        print(f"{label:24}{value:>10.1f}{raw:>10.1f}{value / raw:>8.2f}")
    return 0
