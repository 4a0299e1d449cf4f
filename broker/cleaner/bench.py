"""`minibroker bench cleaner`: the log cleaner's throughput, offset-map memory, produce impact.

Does file I/O in a scratch directory (removed afterwards), in this one process. Measures, never
asserts. Three figures (issue 21's):

  clean vs read      A compacted log of `--total-mb` MiB of keyed records (`--keys` distinct
                     keys, `--record-bytes` values, `--segment-bytes` segments), cleaned once
                     by `Cleaner.clean` over its whole dirty part (every segment but the active
                     one): MB/s of dirty log cleaned (dirty bytes / wall time of the round,
                     which reads the dirty part twice, builds the map, rewrites and swaps).
                     Against it, a plain sequential read of the same segment files (os.pread
                     of `log.cleaner.io.buffer.size` chunks), right after, from the page cache
                     as the cleaner read them. Median of `--runs` runs.
  offset map         Bytes an `OffsetMap` holds per key at the load factor (24 a slot with
                     MD5), the MB it needs for a million keys, and one sized for `--map-keys`
                     keys: tracemalloc's peak when it is made (all its memory), and the time
                     per put filling it to the load factor.
  produce            Leader appends (`PartitionLog.append_as_leader`, one `--batch-bytes` batch
                     per call, as a produce does) on the event loop of this process, while a
                     `LogCleaner` thread (broker/cleaner/manager.py, as the broker runs it) cleans
                     another compacted log of the same size, against the same appends with the
                     cleaner idle for as long. The cleaner shares the interpreter lock with the
                     event loop: this is the cost it puts on a broker's request path (gRPC and
                     replication excluded: in-process, no cluster).

MB/s are 10^6 bytes a second; the machine this runs on is shared (see docs/design.md §9).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pathlib
import shutil
import statistics
import tempfile
import time
import tracemalloc
from typing import Any

import structlog

from minibroker.broker.cleaner.cleaner import Cleaner, CleanerStats
from minibroker.broker.cleaner.manager import CleanerSettings, LogCleaner, log_facts
from minibroker.broker.cleaner.offset_map import (
    DEFAULT_DEDUPE_BUFFER_LOAD_FACTOR,
    DEFAULT_DEDUPE_BUFFER_SIZE,
    OffsetMap,
)
from minibroker.broker.cleaner.selection import LogToClean, log_to_clean
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.log import PartitionLog
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition

_TP = TopicPartition("bench-compacted", 0)
_PRODUCE_TP = TopicPartition("bench-produce", 0)
_NOW_MS = 1_700_000_000_000


def register(bench_sub: Any) -> None:
    parser = bench_sub.add_parser(
        "cleaner",
        help="log cleaner MB/s vs a sequential read, offset-map memory, produce while cleaning",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--total-mb", type=int, default=32, help="MiB of dirty log per run")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct keys in the log")
    parser.add_argument("--record-bytes", type=int, default=100, help="record value size")
    parser.add_argument(
        "--records-per-batch", type=int, default=50, help="records per batch of the log"
    )
    parser.add_argument("--segment-bytes", type=int, default=4 << 20, help="segment.bytes")
    parser.add_argument(
        "--dedupe-buffer-bytes",
        type=int,
        default=DEFAULT_DEDUPE_BUFFER_SIZE,
        help="log.cleaner.dedupe.buffer.size (the cleaner's offset map)",
    )
    parser.add_argument(
        "--io-buffer-bytes", type=int, default=512 * 1024, help="log.cleaner.io.buffer.size"
    )
    parser.add_argument(
        "--map-keys", type=int, default=1_000_000, help="keys put into the measured offset map"
    )
    parser.add_argument(
        "--batch-bytes", type=int, default=16384, help="produce batch size (produce figure)"
    )
    parser.add_argument("--runs", type=int, default=3, help="runs; the median is reported")
    parser.add_argument(
        "--skip", default="", help="comma-separated figures to skip: clean, map, produce"
    )
    parser.add_argument("--dir", default=None, help="scratch dir (default: a temp dir)")
    parser.set_defaults(func=run)


def _check(args: argparse.Namespace) -> str | None:
    for name in (
        "total_mb",
        "keys",
        "record_bytes",
        "records_per_batch",
        "segment_bytes",
        "dedupe_buffer_bytes",
        "io_buffer_bytes",
        "map_keys",
        "batch_bytes",
        "runs",
    ):
        if getattr(args, name) <= 0:
            return f"--{name.replace('_', '-')} must be > 0"
    unknown = set(_skipped(args)) - {"clean", "map", "produce"}
    if unknown:
        return f"--skip: unknown figure(s) {', '.join(sorted(unknown))} (clean, map, produce)"
    return None


def _skipped(args: argparse.Namespace) -> list[str]:
    return [s.strip() for s in args.skip.split(",") if s.strip()]


def build_compacted_log(
    directory: pathlib.Path, args: argparse.Namespace, tp: TopicPartition = _TP
) -> PartitionLog:
    """A compacted log of about `--total-mb` MiB: keys cycle over `--keys`, each batch
    `--records-per-batch` records, then a roll so that everything written is cleanable."""
    config = LogConfig(compact=True, delete=False, segment_bytes=args.segment_bytes)
    log = PartitionLog.open(directory, tp, config, _NOW_MS)
    value = b"v" * args.record_bytes
    target = args.total_mb << 20
    key = 0
    while log.size_bytes < target:
        records = []
        for _ in range(args.records_per_batch):
            records.append((_NOW_MS, b"key-%08d" % (key % args.keys), value, ()))
            key += 1
        log.append_as_leader(encode_batch(records), 0, _NOW_MS)
    log.roll(_NOW_MS)
    return log


def _to_clean(log: PartitionLog) -> LogToClean:
    facts = log_facts(log, log.leo, None)
    return log_to_clean(facts, _NOW_MS)[0]


def _sequential_read(log: PartitionLog, to_clean: LogToClean, chunk: int) -> tuple[int, float]:
    """os.pread of every non-active segment file below the first uncleanable offset."""
    total = 0
    start = time.perf_counter()
    for segment in log.segments[:-1]:
        if segment.base_offset >= to_clean.first_uncleanable_offset:
            break
        path = segment.directory / f"{segment.base_offset:020d}.log"
        fd = os.open(path, os.O_RDONLY)
        try:
            position = 0
            while True:
                data = os.pread(fd, chunk, position)
                if not data:
                    break
                position += len(data)
        finally:
            os.close(fd)
        total += position
    return total, time.perf_counter() - start


def clean_vs_read(root: pathlib.Path, args: argparse.Namespace) -> dict[str, float]:
    """One run of the first figure (and the round's stats)."""
    log = build_compacted_log(root / "clean", args)
    try:
        to_clean = _to_clean(log)
        dirty = to_clean.cleanable_bytes
        offset_map = OffsetMap(args.dedupe_buffer_bytes)
        cleaner = Cleaner(offset_map, io_buffer_size=args.io_buffer_bytes)
        started = time.perf_counter()
        stats: CleanerStats = cleaner.clean(log, to_clean, _NOW_MS)
        clean_s = time.perf_counter() - started
        # The same bytes, now the cleaned segments, would be less to read: read the dirty bytes
        # of a second, identical log instead, as the cleaner found them (page cache warm).
        twin = build_compacted_log(root / "read", args, TopicPartition("bench-read", 0))
        try:
            read_bytes, read_s = _sequential_read(twin, _to_clean(twin), args.io_buffer_bytes)
        finally:
            twin.close()
        return {
            "dirty_bytes": dirty,
            "clean_mb_s": dirty / clean_s / 1e6,
            "read_mb_s": read_bytes / read_s / 1e6,
            "clean_s": clean_s,
            "recopy_percent": 100.0 * stats.bytes_written / max(stats.bytes_read, 1),
            "records_read": stats.records_read,
            "records_written": stats.records_written,
            "map_utilization": stats.map_utilization,
            "end_offset": stats.end_offset,
        }
    finally:
        log.close()


def offset_map_memory(keys: int) -> dict[str, float]:
    """The map's own sizing for a million keys, and a map sized for `keys` keys filled."""
    per_million = OffsetMap(1 << 20)  # any size: the per-slot cost is what matters
    bytes_per_slot = per_million.bytes_per_entry
    slots_needed = int(1_000_000 / DEFAULT_DEDUPE_BUFFER_LOAD_FACTOR) + 1
    # The map allocates all its memory when made; puts allocate nothing that stays. Traced
    # around the allocation only (tracemalloc would slow every put many times over).
    tracemalloc.start()
    try:
        offset_map = OffsetMap(int(keys / DEFAULT_DEDUPE_BUFFER_LOAD_FACTOR + 2) * bytes_per_slot)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    started = time.perf_counter()
    for i in range(keys):
        offset_map.put(b"key-%012d" % i, i)
    put_s = time.perf_counter() - started
    return {
        "bytes_per_slot": bytes_per_slot,
        "mb_per_million_keys": slots_needed * bytes_per_slot / 1e6,
        "measured_peak_mb": peak / 1e6,
        "measured_keys": keys,
        "put_us": put_s / keys * 1e6,
        "utilization": offset_map.utilization,
    }


async def _produce_for(
    log: PartitionLog, batch: bytes, until: Any, max_s: float
) -> tuple[int, float]:
    """Append `batch` as a leader, yielding to the loop after each one, until `until()` or
    `max_s` seconds; (bytes appended, seconds)."""
    appended = 0
    started = time.perf_counter()
    while not until() and time.perf_counter() - started < max_s:
        log.append_as_leader(batch, 0, _NOW_MS)
        appended += len(batch)
        await asyncio.sleep(0)
    return appended, time.perf_counter() - started


async def produce_while_cleaning(root: pathlib.Path, args: argparse.Namespace) -> dict[str, float]:
    big = build_compacted_log(root / "big", args)
    produce_log = PartitionLog.open(
        root / "produce", _PRODUCE_TP, LogConfig(segment_bytes=64 << 20), _NOW_MS
    )
    per_batch = max(1, args.batch_bytes // max(args.record_bytes, 1))
    batch = encode_batch(
        [(_NOW_MS, b"p-%d" % i, b"x" * args.record_bytes, ()) for i in range(per_batch)]
    )
    settings = CleanerSettings(
        threads=1,
        dedupe_buffer_size=args.dedupe_buffer_bytes,
        io_buffer_size=args.io_buffer_bytes,
        backoff_ms=3_600_000,
    )
    cleaner = LogCleaner(settings, root, lambda: [(big, big.leo)])
    try:
        cleaner.start()
        cleaning_bytes, cleaning_s = await _produce_for(
            produce_log, batch, lambda: cleaner.book.last_run(_TP)[0] >= 1, 600.0
        )
        await cleaner.stop()
        run = cleaner.book.last_run(_TP)[1]
        idle_bytes, idle_s = await _produce_for(produce_log, batch, lambda: False, cleaning_s)
    finally:
        await cleaner.stop()
        big.close()
        produce_log.close()
    return {
        "cleaning_mb_s": cleaning_bytes / cleaning_s / 1e6,
        "idle_mb_s": idle_bytes / idle_s / 1e6,
        "window_s": cleaning_s,
        "round_outcome": 1.0 if run is not None and run.outcome.value == "cleaned" else 0.0,
    }


def run(args: argparse.Namespace) -> int:
    problem = _check(args)
    if problem is not None:
        print(f"minibroker bench cleaner: {problem}")
        return 2
    # Quiet the storage's and cleaner's info events without touching where logs go.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    skipped = set(_skipped(args))
    base = pathlib.Path(args.dir) if args.dir else None
    print(
        f"minibroker bench cleaner: {args.total_mb} MiB dirty log, {args.keys} keys, "
        f"{args.record_bytes} B values, {args.records_per_batch} records a batch, "
        f"{args.segment_bytes} B segments, map {args.dedupe_buffer_bytes} B, "
        f"median of {args.runs} runs"
    )
    if "clean" not in skipped:
        runs = []
        for _ in range(args.runs):
            root = pathlib.Path(tempfile.mkdtemp(prefix="mb-bench-cleaner-", dir=base))
            try:
                runs.append(clean_vs_read(root, args))
            finally:
                shutil.rmtree(root, ignore_errors=True)

        def median(key: str) -> float:
            return statistics.median(r[key] for r in runs)

        clean, read = median("clean_mb_s"), median("read_mb_s")
        print(
            f"clean vs read:  cleaner {clean:.1f} MB/s of dirty log, sequential read "
            f"{read:.1f} MB/s, ratio {clean / read:.4f} ({median('dirty_bytes') / 1e6:.1f} MB "
            f"dirty in {median('clean_s'):.2f} s; records {int(median('records_read'))} read "
            f"-> {int(median('records_written'))} written, recopy "
            f"{median('recopy_percent'):.1f}%, map {100 * median('map_utilization'):.1f}% full)"
        )
    if "map" not in skipped:
        m = offset_map_memory(args.map_keys)
        print(
            f"offset map:     {m['bytes_per_slot']:.0f} B a slot, "
            f"{m['mb_per_million_keys']:.1f} MB per million keys at load factor "
            f"{DEFAULT_DEDUPE_BUFFER_LOAD_FACTOR}; measured "
            f"{m['measured_peak_mb']:.1f} MB peak for {int(m['measured_keys'])} keys "
            f"({100 * m['utilization']:.0f}% full), {m['put_us']:.2f} us a put"
        )
    if "produce" not in skipped:
        root = pathlib.Path(tempfile.mkdtemp(prefix="mb-bench-cleaner-", dir=base))
        try:
            p = asyncio.run(produce_while_cleaning(root, args))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        ratio = p["cleaning_mb_s"] / p["idle_mb_s"] if p["idle_mb_s"] else 0.0
        print(
            f"produce:        {p['cleaning_mb_s']:.1f} MB/s while the cleaner runs, "
            f"{p['idle_mb_s']:.1f} MB/s idle, ratio {ratio:.2f} (leader appends of "
            f"{args.batch_bytes} B batches on the event loop, {p['window_s']:.2f} s each"
            f"{'' if p['round_outcome'] else '; the round did not complete'})"
        )
    return 0
