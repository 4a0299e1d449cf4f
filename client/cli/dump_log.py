"""`minibroker dump-log`: print segment files the way Kafka's kafka-dump-log.sh does.

Does I/O: reads the named files, writes to stdout (and errors to stderr); runs in the CLI process
only. `.log` segments are read batch by batch (a whole segment is never held in memory) and
validated with `minibroker.client.batch` (length, magic, CRC32C); `--print-data-log` decodes the
records with `minibroker.client.records`. `.index` (int32 relative offset, int32 position) and
`.timeindex` (int64 timestamp, int32 relative offset) entries, laid out as
`minibroker.client.log_format` defines them for the broker's storage too, are printed up to the
preallocated zero tail. The first torn or corrupt batch stops the dump of its file: its position
and the reason go to stderr and the command exits 1. A batch whose length and magic are sound but
whose CRC is wrong is still printed first, with `isvalid: false` / `"crc_valid": false`, as
Kafka's tool does, so the damaged header can be read.

A compacted log has offset gaps (issue 21: a cleaned batch keeps its offsets, the batches and
segments between them are gone): where a batch starts above the offset after the previous one
(the segment's base offset for its first batch, or the end of the previous segment of the same
dir named before it) the dump prints `gap: offsets A..B absent` (`{"gap": [A, B]}` with
`--json`) before the batch. Gaps are not errors. The files a cleaning round leaves on the way
(`.log.cleaned`, `.log.swap` and their index files) are dumped like their plain kind.

Human output follows DumpLogSegments; `--json` prints one JSON object per line instead, per
batch: position, size, base_offset, last_offset, count, partition_leader_epoch, producer_id,
producer_epoch, base_sequence, compression, crc_valid (and `records` with --print-data-log, keys
and values base64, headers as [name, base64-or-null]); per index entry: offset, position; per
time index entry: timestamp, offset.
"""

from __future__ import annotations

import argparse
import base64
import json
import pathlib
import struct
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO, TextIO

from minibroker.client.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_LENGTH_MIN,
    LOG_OVERHEAD,
    BatchHeader,
    CorruptRecordError,
    crc_of,
    parse_header,
    read_header,
)
from minibroker.client.consumer_offsets import describe as describe_offsets_record
from minibroker.client.log_format import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    OFFSET_INDEX_ENTRY,
    TIME_INDEX_ENTRY,
    TIME_INDEX_SUFFIX,
    index_rows,
)
from minibroker.client.records import (
    DecodedBatch,
    DecodedRecord,
    compression_of,
    decode_records,
    parse_control_key,
)

_INT32 = struct.Struct(">i")
_CONTROL_TYPES = {0: "ABORT", 1: "COMMIT"}


class DumpError(Exception):
    """A file could not be dumped completely; the message names the position and reason."""


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "dump-log",
        help="print the batches of .log segments and the entries of .index/.timeindex files",
        description=(
            "Print log segments (.log), offset indexes (.index) and time indexes (.timeindex) "
            "like Kafka's kafka-dump-log.sh. Exits 1 at the first torn or corrupt batch."
        ),
    )
    parser.add_argument("--files", nargs="+", required=True, metavar="FILE", help="files to dump")
    parser.add_argument(
        "--print-data-log", action="store_true", help="also print every record of every batch"
    )
    parser.add_argument(
        "--offsets-decoder",
        action="store_true",
        help="decode the records as __consumer_offsets keys and values (implies "
        "--print-data-log), as Kafka's kafka-dump-log.sh does",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.set_defaults(func=run)


# What a cleaning round names its files on the way (the cleaner's `.cleaned`, then `.swap`).
_CLEANING_SUFFIXES = (".cleaned", ".swap")


def file_kind(path: pathlib.Path) -> str:
    """The segment file kind of `path` (`.log`, `.index`, `.timeindex`), also for the
    `.cleaned` / `.swap` files of a cleaning round; "" for anything else."""
    suffix = path.suffix
    if suffix in _CLEANING_SUFFIXES:
        suffix = pathlib.Path(path.stem).suffix
    return suffix if suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX) else ""


def run(args: argparse.Namespace) -> int:
    status = 0
    out = sys.stdout
    # The end offset of the last segment dumped from each dir: a segment named after it in the
    # same dir starts a gap there when its first batch starts later.
    ends: dict[pathlib.Path, tuple[int, int]] = {}
    for name in args.files:
        path = pathlib.Path(name)
        if not args.json:
            out.write(f"Dumping {path}\n")
        try:
            kind = file_kind(path)
            if kind == LOG_SUFFIX:
                expected = _expected_first_offset(path, ends.get(path.parent))
                end = dump_segment(
                    path,
                    out,
                    print_data_log=args.print_data_log or args.offsets_decoder,
                    as_json=args.json,
                    expected=expected,
                    offsets_decoder=args.offsets_decoder,
                )
                if end is not None and expected is not None:
                    ends[path.parent] = (base_offset_of(path), end)
            elif kind == INDEX_SUFFIX:
                dump_index(path, out, as_json=args.json)
            elif kind == TIME_INDEX_SUFFIX:
                dump_time_index(path, out, as_json=args.json)
            else:
                sys.stderr.write(f"Ignoring unknown file {path}\n")
        except DumpError as err:
            out.flush()
            sys.stderr.write(f"{path}: {err}\n")
            status = 1
        except BrokenPipeError:
            raise  # the reader went away (`| head`): the command's caller exits quietly
        except OSError as err:
            out.flush()
            sys.stderr.write(f"{path}: cannot read: {err}\n")
            status = 1
    out.flush()
    return status


def _expected_first_offset(path: pathlib.Path, previous: tuple[int, int] | None) -> int | None:
    """Where the first batch of segment `path` would start in a log without gaps: the end of
    the previous segment of its dir dumped before it (when that one's base is lower), else its
    own base offset; None when its name carries no base offset."""
    try:
        base = base_offset_of(path)
    except DumpError:
        return None
    if previous is not None and previous[0] < base and previous[1] <= base:
        return previous[1]
    return base


def base_offset_of(path: pathlib.Path) -> int:
    """The base offset a segment's file name carries (`<baseOffset:020d>.log`)."""
    try:
        return int(path.name.split(".")[0])
    except ValueError:
        raise DumpError(f"file name {path.name!r} does not start with a base offset") from None


# ---------------------------------------------------------------------------------------------
# .log


def read_segment_batches(stream: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """Yield (position, batch bytes) framed by batchLength; torn data raises DumpError.

    Only the framing is checked here; the caller validates magic and CRC.
    """
    pos = 0
    while True:
        head = stream.read(LOG_OVERHEAD)
        if not head:
            return
        if len(head) < LOG_OVERHEAD:
            raise DumpError(f"torn batch at position {pos}: {len(head)} trailing bytes")
        (batch_length,) = _INT32.unpack_from(head, 8)
        if batch_length < BATCH_LENGTH_MIN:
            raise DumpError(
                f"corrupt batch at position {pos}: batchLength {batch_length} is below the "
                f"minimum {BATCH_LENGTH_MIN}"
            )
        rest = stream.read(batch_length)
        if len(rest) < batch_length:
            raise DumpError(
                f"torn batch at position {pos}: batchLength {batch_length} needs "
                f"{batch_length + LOG_OVERHEAD} bytes, {len(rest) + LOG_OVERHEAD} left"
            )
        yield pos, head + rest
        pos += LOG_OVERHEAD + batch_length


def dump_segment(
    path: pathlib.Path,
    out: TextIO,
    *,
    print_data_log: bool = False,
    as_json: bool = False,
    expected: int | None = None,
    offsets_decoder: bool = False,
) -> int | None:
    """Print the batches of segment `path`; a batch starting above `expected` (then above the
    previous batch's next offset) is preceded by the gap. Returns the next offset of the last
    batch (`expected` when the segment is empty). `offsets_decoder`: records are shown as
    __consumer_offsets keys and values (client/consumer_offsets.py)."""
    with path.open("rb") as stream:
        if not as_json:
            # A copied segment may have lost its offset-bearing name; its batches still print.
            try:
                out.write(f"Log starting offset: {base_offset_of(path)}\n")
            except DumpError as err:
                sys.stderr.write(f"{path}: {err}\n")
        for pos, buf in read_segment_batches(stream):
            try:
                header = read_header(buf)
            except CorruptRecordError as err:
                _maybe_print_crc_failure(buf, pos, out, print_data_log, as_json)
                raise DumpError(f"corrupt batch at position {pos}: {err.reason}") from None
            try:
                compression_of(header)
                records: list[DecodedRecord] | None = (
                    decode_records(buf, 0, header) if print_data_log else None
                )
            except CorruptRecordError as err:
                raise DumpError(f"corrupt batch at position {pos}: {err.reason}") from None
            if expected is not None and header.base_offset > expected:
                last_absent = header.base_offset - 1
                if as_json:
                    out.write(json.dumps({"gap": [expected, last_absent]}) + "\n")
                else:
                    out.write(f"gap: offsets {expected}..{last_absent} absent\n")
            expected = header.last_offset + 1
            batch = DecodedBatch(pos, header, records or [])
            if as_json:
                out.write(_batch_json(batch, True, records is not None, offsets_decoder) + "\n")
            else:
                out.write(_batch_line(header, pos, True) + "\n")
                if records is not None:
                    out.writelines(_record_line(batch, r, offsets_decoder) + "\n" for r in records)
    return expected


def _maybe_print_crc_failure(
    buf: bytes, pos: int, out: TextIO, print_data_log: bool, as_json: bool
) -> None:
    """Print a batch whose framing and magic are sound but whose CRC is not (Kafka does too)."""
    try:
        header = parse_header(buf)
        compression_of(header)
    except CorruptRecordError:
        return
    if crc_of(buf, ATTRIBUTES_OFFSET, len(buf)) == header.crc:
        return
    if as_json:
        out.write(_batch_json(DecodedBatch(pos, header, []), False, print_data_log) + "\n")
    else:
        out.write(_batch_line(header, pos, False) + "\n")


def _timestamp_type(header: BatchHeader) -> str:
    return "LogAppendTime" if header.log_append_time else "CreateTime"


def _batch_line(header: BatchHeader, pos: int, crc_valid: bool) -> str:
    return (
        f"baseOffset: {header.base_offset} lastOffset: {header.last_offset} "
        f"count: {header.records_count} baseSequence: {header.base_sequence} "
        f"lastSequence: {header.last_sequence} producerId: {header.producer_id} "
        f"producerEpoch: {header.producer_epoch} "
        f"partitionLeaderEpoch: {header.partition_leader_epoch} "
        f"isTransactional: {_bool(header.is_transactional)} "
        f"isControl: {_bool(header.is_control)} position: {pos} "
        f"{_timestamp_type(header)}: {header.max_timestamp} size: {header.size} "
        f"magic: {header.magic} compresscodec: {compression_of(header).label} "
        f"crc: {header.crc} isvalid: {_bool(crc_valid)}"
    )


def _bool(flag: bool) -> str:
    return "true" if flag else "false"


def _text(data: bytes) -> str:
    # Kafka's default decoder is a UTF-8 StringDecoder, which replaces malformed input.
    return data.decode("utf-8", errors="replace")


def _record_line(batch: DecodedBatch, record: DecodedRecord, offsets: bool = False) -> str:
    header = batch.header
    parts = [
        f"| offset: {record.offset} {_timestamp_type(header)}: {record.timestamp} "
        f"keySize: {-1 if record.key is None else len(record.key)} "
        f"valueSize: {-1 if record.value is None else len(record.value)} "
        f"sequence: {batch.sequence_of(record)} "
        f"headerKeys: [{','.join(name for name, _ in record.headers)}]"
    ]
    if header.is_control:
        parts.append(_control_description(record))
    elif offsets:
        key, value = describe_offsets_record(record.key, record.value)
        parts.append(f" key: {key} payload: {value}")
    else:
        if record.key is not None:
            parts.append(f" key: {_text(record.key)}")
        if record.value is not None:
            parts.append(f" payload: {_text(record.value)}")
    return "".join(parts)


def _control_description(record: DecodedRecord) -> str:
    try:
        _version, control_type = parse_control_key(record.key)
    except CorruptRecordError:
        return " controlType: UNKNOWN(-1)"
    name = _CONTROL_TYPES.get(control_type)
    if name is None:
        return f" controlType: UNKNOWN({control_type})"
    coordinator_epoch = -1
    if record.value is not None and len(record.value) >= 6:
        # EndTransactionMarker value: int16 version, int32 coordinatorEpoch.
        (coordinator_epoch,) = _INT32.unpack_from(record.value, 2)
    return f" endTxnMarker: {name} coordinatorEpoch: {coordinator_epoch}"


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def _batch_json(
    batch: DecodedBatch, crc_valid: bool, with_records: bool, offsets: bool = False
) -> str:
    header = batch.header
    obj: dict[str, Any] = {
        "position": batch.position,
        "size": header.size,
        "base_offset": header.base_offset,
        "last_offset": header.last_offset,
        "count": header.records_count,
        "partition_leader_epoch": header.partition_leader_epoch,
        "producer_id": header.producer_id,
        "producer_epoch": header.producer_epoch,
        "base_sequence": header.base_sequence,
        "compression": compression_of(header).label,
        "crc_valid": crc_valid,
    }
    if with_records:
        obj["records"] = [
            {
                "offset": r.offset,
                "timestamp": r.timestamp,
                "key": _b64(r.key),
                "value": _b64(r.value),
                "headers": [[name, _b64(value)] for name, value in r.headers],
            }
            for r in batch.records
        ]
        if offsets and not header.is_control:
            for row, r in zip(obj["records"], batch.records, strict=True):
                row["decoded_key"], row["decoded_value"] = describe_offsets_record(r.key, r.value)
    return json.dumps(obj)


# ---------------------------------------------------------------------------------------------
# .index and .timeindex


def _check_whole_entries(size: int, leftover: int, entry_size: int) -> None:
    if leftover:
        raise DumpError(
            f"{leftover} trailing bytes at position {size - leftover} are not a "
            f"whole {entry_size}-byte entry"
        )


def dump_index(path: pathlib.Path, out: TextIO, *, as_json: bool = False) -> None:
    base_offset = base_offset_of(path)
    data = path.read_bytes()
    rows, leftover = index_rows(data, OFFSET_INDEX_ENTRY)
    if not rows and not as_json:
        out.write(f"{path} is empty.\n")
    for i, (relative_offset, position) in enumerate(rows):
        # Index files are preallocated with zeros; the first zero entry after entry 0 is the end
        # of what was written (DumpLogSegments stops there too).
        if i > 0 and relative_offset == 0:
            return
        offset = base_offset + relative_offset
        if as_json:
            out.write(json.dumps({"offset": offset, "position": position}) + "\n")
        else:
            out.write(f"offset: {offset} position: {position}\n")
    _check_whole_entries(len(data), leftover, OFFSET_INDEX_ENTRY.size)


def dump_time_index(path: pathlib.Path, out: TextIO, *, as_json: bool = False) -> None:
    base_offset = base_offset_of(path)
    data = path.read_bytes()
    rows, leftover = index_rows(data, TIME_INDEX_ENTRY)
    if not rows and not as_json:
        out.write(f"{path} is empty.\n")
    for i, (timestamp, relative_offset) in enumerate(rows):
        if i > 0 and relative_offset == 0:
            return
        offset = base_offset + relative_offset
        if as_json:
            out.write(json.dumps({"timestamp": timestamp, "offset": offset}) + "\n")
        else:
            out.write(f"timestamp: {timestamp} offset: {offset}\n")
    _check_whole_entries(len(data), leftover, TIME_INDEX_ENTRY.size)
