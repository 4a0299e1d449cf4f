"""The file formats of a partition dir besides the batches: segment file names and the
`.index` / `.timeindex` entry layouts (Kafka's LogFileUtils, OffsetIndex and TimeIndex).

Pure: no I/O. Big-endian entries:

    .index      8 bytes: int32 relative offset (a batch's LAST offset - the segment's base
                offset), int32 file position of that batch in the `.log`
    .timeindex  12 bytes: int64 largest timestamp so far, int32 relative offset of the batch
                (its last offset) where that timestamp was reached

The broker's storage writes and reads these files (broker/storage/segment.py, index.py) and
`minibroker dump-log` prints them (client/cli/dump_log.py); both take the layout from here, so it
is written down once. It sits in `client/` beside the record batch format (client/batch.py) for
the same reason: the client side must not import the broker, and the broker builds on these.
"""

from __future__ import annotations

import struct

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)

OFFSET_INDEX_ENTRY = struct.Struct(">ii")  # relative offset, file position
TIME_INDEX_ENTRY = struct.Struct(">qi")  # timestamp, relative offset
# Offsets in a segment are stored relative to its base offset in an int32.
RELATIVE_OFFSET_MAX = 2**31 - 1
_BASE_OFFSET_DIGITS = 20


def segment_file_name(base_offset: int, suffix: str) -> str:
    """`<baseOffset:020d><suffix>`, e.g. `00000000000000000042.log`."""
    return f"{base_offset:0{_BASE_OFFSET_DIGITS}d}{suffix}"


def parse_segment_file_name(name: str) -> tuple[int, str] | None:
    """(base offset, suffix) of a name `segment_file_name` makes, for any suffix; else None."""
    stem, dot, rest = name.partition(".")
    if not dot or len(stem) != _BASE_OFFSET_DIGITS or not stem.isdigit():
        return None
    return int(stem), dot + rest


def fits_relative_offset(base_offset: int, offset: int) -> bool:
    """Whether `offset` can be stored in an index of the segment at `base_offset`."""
    return 0 <= offset - base_offset <= RELATIVE_OFFSET_MAX


def index_rows(data: bytes, entry: struct.Struct) -> tuple[list[tuple[int, int]], int]:
    """The whole entries in an index file's bytes, as stored (relative offsets), and how many
    bytes follow the last whole entry (0 for a sound file)."""
    leftover = len(data) % entry.size
    rows: list[tuple[int, int]] = list(entry.iter_unpack(data[: len(data) - leftover]))
    return rows, leftover
