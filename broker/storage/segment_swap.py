"""Replacing segments with cleaned ones on disk: the `.cleaned` / `.swap` file sequence of Kafka's
log cleaner (LocalLog.replaceSegments) and its completion when loading (Kafka's LogLoader).

Does file I/O in one partition dir. A cleaned segment is written as `<base>.log.cleaned` (with
`.index.cleaned` and `.timeindex.cleaned`), fsynced, then swapped in on the event loop:

  1. `.cleaned` -> `.swap` for the log, then the two indexes (the `.log` first, as Kafka renames
     it first), and the dir is fsynced: from here loading completes the swap;
  2. the replaced segments' files are deleted;
  3. `.swap` -> final name for the log, then the indexes, and the dir is fsynced.

Loading (`complete_interrupted_swaps`, run before the segment files are listed):
  * every `.cleaned` file is deleted (a swap that never reached step 1 did not happen);
  * for each `<base>.log.swap`, its batches are read to find its next offset; every other
    segment file whose base offset is in [least swap base, greatest swap next offset) is deleted
    (segments the swap replaces whose deletion did not finish; a replaced segment whose base is
    at or past the cleaned segment's end may stay: it holds only offsets above every offset of
    the cleaned segment, so the log stays ordered and nothing is lost, it is only less clean);
  * every `.swap` file is renamed to its final name (an index `.swap` whose `.log` is gone is
    then removed with the other orphan index files by the loader).
Every step is idempotent, so a crash during loading itself is completed by the next load.

Concurrency contract: the swap steps run on the log owner's thread (the event loop); loading
runs before the log has an owner.
"""

from __future__ import annotations

import os
import pathlib

from minibroker.broker.storage.checkpoint import fsync_dir
from minibroker.client.batch import LOG_OVERHEAD, CorruptRecordError, read_header
from minibroker.client.common.log import get_logger
from minibroker.client.log_format import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    parse_segment_file_name,
    segment_file_name,
)

_log = get_logger("minibroker.broker.storage")

CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
# The log is renamed first in both renaming steps (Kafka's LogSegment.changeFileSuffixes): a
# `.log.swap` then always has its cleaned content whole, whatever state its indexes are in.
SWAPPED_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)
_SCAN_CHUNK = 1024 * 1024


def segment_file(directory: pathlib.Path, base_offset: int, suffix: str) -> pathlib.Path:
    return directory / segment_file_name(base_offset, suffix)


def remove_files(directory: pathlib.Path, base_offset: int, extra_suffix: str) -> None:
    """Remove the segment files of `base_offset` ending in `extra_suffix` (".cleaned" or
    ".swap"), ignoring the ones already gone."""
    for suffix in SWAPPED_SUFFIXES:
        try:
            os.unlink(segment_file(directory, base_offset, suffix + extra_suffix))
        except FileNotFoundError:
            pass


def rename_files(
    directory: pathlib.Path, base_offset: int, old: str, new: str, *, log: bool = True
) -> None:
    """Rename the segment files of `base_offset` from suffix + `old` to suffix + `new`, the log
    first (`log=False`: the indexes only); a missing index is skipped (loading rebuilds it). Not
    durable until the caller fsyncs the dir. Raises OSError (files renamed before it stay so)."""
    for suffix in SWAPPED_SUFFIXES:
        source = segment_file(directory, base_offset, suffix + old)
        if suffix == LOG_SUFFIX and not log:
            continue
        if suffix != LOG_SUFFIX and not source.exists():
            continue
        os.replace(source, segment_file(directory, base_offset, suffix + new))


def sync_dir(directory: pathlib.Path) -> None:
    fsync_dir(directory)


def next_offset_of(path: pathlib.Path, base_offset: int) -> int:
    """The offset after the last whole, CRC-clean batch of the `.log` file at `path` (its base
    offset when it holds none): Kafka's readNextOffset for a `.swap` segment."""
    next_offset = base_offset
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        position = 0
        want = _SCAN_CHUNK
        while position < size:
            chunk = os.pread(fd, min(want, size - position), position)
            view = memoryview(chunk)
            at = 0
            while len(chunk) - at >= LOG_OVERHEAD:
                total = int.from_bytes(chunk[at + 8 : at + 12], "big", signed=True) + LOG_OVERHEAD
                if at + total > len(chunk):
                    break
                try:
                    header = read_header(view, at)
                except CorruptRecordError:
                    return next_offset
                next_offset = header.next_offset
                at += total
            if at == 0:
                if len(chunk) < LOG_OVERHEAD or want >= size - position:
                    return next_offset  # a torn batch: the valid prefix ends here
                want = max(want * 2, total)
                continue
            position += at
            want = _SCAN_CHUNK
    finally:
        os.close(fd)
    return next_offset


def complete_interrupted_swaps(directory: pathlib.Path) -> bool:
    """Finish or undo what a crash left of segment swaps in `directory` (module docstring).
    Returns whether any file was changed. Raises OSError when the dir cannot be changed."""
    names = os.listdir(directory)
    changed = False
    swap_ranges: list[tuple[int, int]] = []
    for name in names:
        parsed = parse_segment_file_name(name)
        if parsed is None:
            continue
        base, suffix = parsed
        if suffix.endswith(CLEANED_SUFFIX):
            os.unlink(directory / name)
            changed = True
        elif suffix == LOG_SUFFIX + SWAP_SUFFIX:
            swap_ranges.append((base, next_offset_of(directory / name, base)))
    if swap_ranges:
        low = min(base for base, _ in swap_ranges)
        high = max(next_offset for _, next_offset in swap_ranges)
        for name in os.listdir(directory):
            parsed = parse_segment_file_name(name)
            if parsed is None or parsed[1].endswith(SWAP_SUFFIX):
                continue
            if low <= parsed[0] < high:
                os.unlink(directory / name)
                changed = True
        _log.info(
            "segment_swap_completed_on_load",
            path=str(directory),
            swaps=[base for base, _ in sorted(swap_ranges)],
            replaced_range=[low, high],
        )
    for name in os.listdir(directory):
        parsed = parse_segment_file_name(name)
        if parsed is not None and parsed[1].endswith(SWAP_SUFFIX):
            final = parsed[1][: -len(SWAP_SUFFIX)]
            os.replace(directory / name, segment_file(directory, parsed[0], final))
            changed = True
    if changed:
        fsync_dir(directory)
    return changed
