"""`minibroker dump-log` reads real segment files and prints what was written, Kafka-style.

Segments are written by kafka-python's DefaultRecordBatchBuilder (an independent encoder) and by
ours; the command runs as a subprocess (`python -m minibroker.deploy dump-log ...`), its JSON
lines are compared with what was written, and damaged files must exit 1 naming the position.
"""

from __future__ import annotations

import base64
import json
import pathlib
import struct
import subprocess
import sys
from typing import Any

import pytest
from gapped_batches import cleaned_batch
from kafka.record.default_records import DefaultRecordBatchBuilder

from minibroker.client.batch import Compression, set_base_offset, set_partition_leader_epoch
from minibroker.client.records import encode_batch

BATCH_FIELDS = {
    "position",
    "size",
    "base_offset",
    "last_offset",
    "count",
    "partition_leader_epoch",
    "producer_id",
    "producer_epoch",
    "base_sequence",
    "compression",
    "crc_valid",
}

Headers = list[tuple[str, bytes | None]]
RecordIn = tuple[int, bytes | None, bytes | None, Headers]


def _dump(*args: str | pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "minibroker.deploy", "dump-log", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _json_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def _records_for(batch_no: int, count: int) -> list[RecordIn]:
    return [
        (
            1_700_000_000_000 + 10 * batch_no + i,
            None if i % 3 == 0 else b"key-%d-%d" % (batch_no, i),
            None if i == count - 1 and batch_no % 2 else b"value %d/%d " % (batch_no, i) * 20,
            [("trace", b"t%d" % i), ("empty", None)] if i % 2 else [],
        )
        for i in range(count)
    ]


def _kafka_python_batch(records: list[RecordIn], compression: Compression) -> bytearray:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(compression),
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for offset, (timestamp, key, value, headers) in enumerate(records):
        builder.append(offset, timestamp, key, value, headers)
    return bytearray(builder.build())


def _write_segment(
    directory: pathlib.Path, base_offset: int, writer: str, epoch: int = 3
) -> tuple[pathlib.Path, list[dict[str, Any]]]:
    """A segment like a leader writes it: consecutive offsets, the leader epoch stamped."""
    path = directory / f"{base_offset:020d}.log"
    codecs = (
        [Compression.NONE, Compression.GZIP]
        if writer == "kafka-python"
        else list(Compression)  # every codec through our encoder
    )
    out = bytearray()
    expected: list[dict[str, Any]] = []
    offset = base_offset
    for batch_no, compression in enumerate(codecs * 2):
        records = _records_for(batch_no, 2 + batch_no)
        if writer == "kafka-python":
            batch = _kafka_python_batch(records, compression)
            producer = (-1, -1, -1)
        else:
            producer = (1000 + batch_no, 2, 50 * batch_no)
            batch = bytearray(
                encode_batch(
                    records,
                    compression=compression,
                    producer_id=producer[0],
                    producer_epoch=producer[1],
                    base_sequence=producer[2],
                )
            )
        set_base_offset(batch, 0, offset)
        set_partition_leader_epoch(batch, 0, epoch)
        expected.append(
            {
                "position": len(out),
                "size": len(batch),
                "base_offset": offset,
                "last_offset": offset + len(records) - 1,
                "count": len(records),
                "partition_leader_epoch": epoch,
                "producer_id": producer[0],
                "producer_epoch": producer[1],
                "base_sequence": producer[2],
                "compression": compression.label,
                "crc_valid": True,
                "records": [
                    {
                        "offset": offset + i,
                        "timestamp": ts,
                        "key": key,
                        "value": value,
                        "headers": [list(h) for h in headers],
                    }
                    for i, (ts, key, value, headers) in enumerate(records)
                ],
            }
        )
        out += batch
        offset += len(records)
    path.write_bytes(bytes(out))
    return path, expected


def _unb64(record: dict[str, Any]) -> dict[str, Any]:
    def dec(value: str | None) -> bytes | None:
        return None if value is None else base64.b64decode(value)

    return {
        **record,
        "key": dec(record["key"]),
        "value": dec(record["value"]),
        "headers": [[name, dec(value)] for name, value in record["headers"]],
    }


@pytest.mark.parametrize("writer", ["kafka-python", "minibroker"])
def test_json_dump_matches_what_was_written(tmp_path: pathlib.Path, writer: str) -> None:
    path, expected = _write_segment(tmp_path, 1000, writer)
    result = _dump("--json", "--print-data-log", "--files", path)
    assert result.returncode == 0, result.stderr
    got = _json_lines(result.stdout)
    assert [set(b) for b in got] == [BATCH_FIELDS | {"records"}] * len(expected)
    for batch in got:
        batch["records"] = [_unb64(r) for r in batch["records"]]
    assert got == expected


def test_json_without_data_has_exactly_the_batch_fields(tmp_path: pathlib.Path) -> None:
    path, expected = _write_segment(tmp_path, 0, "minibroker")
    result = _dump("--json", "--files", path)
    assert result.returncode == 0, result.stderr
    got = _json_lines(result.stdout)
    assert [set(b) for b in got] == [BATCH_FIELDS] * len(expected)
    assert got == [{k: v for k, v in b.items() if k != "records"} for b in expected]


def test_human_output_follows_kafka_dump_log(tmp_path: pathlib.Path) -> None:
    records: list[RecordIn] = [
        (1_000, b"k", b"hello", [("h1", b"x"), ("h2", None)]),
        (1_001, None, b"world", []),
    ]
    path = tmp_path / "00000000000000000042.log"
    batch = bytearray(encode_batch(records, producer_id=7, producer_epoch=1, base_sequence=5))
    set_base_offset(batch, 0, 42)
    set_partition_leader_epoch(batch, 0, 0)
    path.write_bytes(bytes(batch))
    result = _dump("--print-data-log", "--files", path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"Dumping {path}"
    assert lines[1] == "Log starting offset: 42"
    crc = struct.unpack_from(">I", batch, 17)[0]
    assert lines[2] == (
        "baseOffset: 42 lastOffset: 43 count: 2 baseSequence: 5 lastSequence: 6 producerId: 7 "
        "producerEpoch: 1 partitionLeaderEpoch: 0 isTransactional: false isControl: false "
        f"position: 0 CreateTime: 1001 size: {len(batch)} magic: 2 compresscodec: none "
        f"crc: {crc} isvalid: true"
    )
    assert lines[3] == (
        "| offset: 42 CreateTime: 1000 keySize: 1 valueSize: 5 sequence: 5 headerKeys: [h1,h2] "
        "key: k payload: hello"
    )
    assert lines[4] == (
        "| offset: 43 CreateTime: 1001 keySize: -1 valueSize: 5 sequence: 6 headerKeys: [] "
        "payload: world"
    )
    assert len(lines) == 5


def test_corrupt_batch_exits_1_naming_the_position(tmp_path: pathlib.Path) -> None:
    path, expected = _write_segment(tmp_path, 0, "minibroker")
    data = bytearray(path.read_bytes())
    bad = expected[2]
    data[bad["position"] + bad["size"] - 3] ^= 0x40  # inside the CRC'd records of batch 2
    path.write_bytes(bytes(data))
    result = _dump("--json", "--files", path)
    assert result.returncode == 1
    assert f"position {bad['position']}" in result.stderr and "CRC" in result.stderr
    got = _json_lines(result.stdout)
    # The batches before it, then the damaged one flagged crc_valid false, then nothing.
    assert [b["crc_valid"] for b in got] == [True, True, False]
    assert [b["position"] for b in got] == [b["position"] for b in expected[:3]]


def test_torn_tail_exits_1_after_the_whole_batches(tmp_path: pathlib.Path) -> None:
    path, expected = _write_segment(tmp_path, 0, "kafka-python")
    data = path.read_bytes()
    last = expected[-1]
    path.write_bytes(data[: last["position"] + 20])
    result = _dump("--files", path)
    assert result.returncode == 1
    assert f"torn batch at position {last['position']}" in result.stderr
    batch_lines = [line for line in result.stdout.splitlines() if line.startswith("baseOffset")]
    assert len(batch_lines) == len(expected) - 1


def test_index_and_time_index_stop_at_preallocated_zeros(tmp_path: pathlib.Path) -> None:
    base = 500
    index = tmp_path / f"{base:020d}.index"
    index.write_bytes(
        struct.pack(">ii", 0, 0)
        + struct.pack(">ii", 7, 4096)
        + struct.pack(">ii", 15, 8200)
        + bytes(8 * 20)
    )
    time_index = tmp_path / f"{base:020d}.timeindex"
    time_index.write_bytes(
        struct.pack(">qi", 1_700_000_000_010, 6)
        + struct.pack(">qi", 1_700_000_000_020, 14)
        + bytes(12 * 20)
    )
    result = _dump("--files", index, time_index)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"Dumping {index}",
        "offset: 500 position: 0",
        "offset: 507 position: 4096",
        "offset: 515 position: 8200",
        f"Dumping {time_index}",
        "timestamp: 1700000000010 offset: 506",
        "timestamp: 1700000000020 offset: 514",
    ]
    result = _dump("--json", "--files", index, time_index)
    assert _json_lines(result.stdout) == [
        {"offset": 500, "position": 0},
        {"offset": 507, "position": 4096},
        {"offset": 515, "position": 8200},
        {"timestamp": 1_700_000_000_010, "offset": 506},
        {"timestamp": 1_700_000_000_020, "offset": 514},
    ]


def test_missing_file_exits_1_and_other_files_still_print(tmp_path: pathlib.Path) -> None:
    path, expected = _write_segment(tmp_path, 0, "minibroker")
    result = _dump("--json", "--files", tmp_path / f"{7:020d}.log", path)
    assert result.returncode == 1
    assert "cannot read" in result.stderr
    assert len(_json_lines(result.stdout)) == len(expected)


def test_index_layouts_are_defined_once_for_storage_and_dump_log() -> None:
    # The broker writes the index files and dump-log reads them: both take the entry layouts
    # and file suffixes from client/log_format.py, so they cannot drift apart.
    import inspect

    from minibroker.broker.storage import index, segment
    from minibroker.client import log_format
    from minibroker.client.cli import dump_log

    assert index.OffsetIndex.entry is log_format.OFFSET_INDEX_ENTRY
    assert index.TimeIndex.entry is log_format.TIME_INDEX_ENTRY
    assert dump_log.OFFSET_INDEX_ENTRY is log_format.OFFSET_INDEX_ENTRY
    assert dump_log.TIME_INDEX_ENTRY is log_format.TIME_INDEX_ENTRY
    assert segment.LOG_SUFFIX is log_format.LOG_SUFFIX
    for module in (index, dump_log):
        source = inspect.getsource(module)
        assert 'Struct(">ii")' not in source and 'Struct(">qi")' not in source


def test_gaps_of_a_compacted_log_are_printed_not_errors(tmp_path: pathlib.Path) -> None:
    """A cleaned log (issue 21): a gap at a segment's start, between batches, inside a batch's
    kept offsets (not a gap: its offsets are the batch's), and between two segments."""
    first = tmp_path / f"{0:020d}.log"
    first.write_bytes(
        cleaned_batch(2, [(2, b"a", b"1")], 3)  # offsets 0..1 absent
        # offset 4 absent
        + cleaned_batch(5, [(7, b"b", b"2")], 8)  # records removed inside: no gap line
        + cleaned_batch(12, [], 13)  # 9..11 absent; an emptied batch
    )
    second = tmp_path / f"{20:020d}.log.cleaned"  # a cleaning round's file
    second.write_bytes(cleaned_batch(25, [(25, b"c", b"3")], 25))  # 14..24 absent
    result = _dump("--files", first, second)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    gaps = [line for line in lines if line.startswith("gap:")]
    assert gaps == [
        "gap: offsets 0..1 absent",
        "gap: offsets 4..4 absent",
        "gap: offsets 9..11 absent",
        "gap: offsets 14..24 absent",
    ]
    # Each gap line comes right before the batch after it.
    for gap in gaps:
        after = lines[lines.index(gap) + 1]
        assert after.startswith(f"baseOffset: {int(gap.split('..')[1].split()[0]) + 1} ")
    result = _dump("--json", "--files", first, second)
    assert result.returncode == 0, result.stderr
    got = _json_lines(result.stdout)
    assert [g["gap"] for g in got if "gap" in g] == [[0, 1], [4, 4], [9, 11], [14, 24]]
    assert [b["base_offset"] for b in got if "gap" not in b] == [2, 5, 12, 25]


def test_a_segment_without_gaps_prints_none(tmp_path: pathlib.Path) -> None:
    path, _ = _write_segment(tmp_path, 1000, "minibroker")
    result = _dump("--files", path)
    assert result.returncode == 0, result.stderr
    assert not [line for line in result.stdout.splitlines() if line.startswith("gap:")]
