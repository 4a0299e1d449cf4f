"""The log cleaner's rounds on real logs on disk (broker/cleaner/cleaner.py, issue 21): what a
rewrite keeps, tombstone expiry, emptied producer batches, a full offset map, codecs, aborts,
and the batch encoder the rewrite uses (client/records/builder.py `encode_placed_batch`).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib

import pytest

from minibroker.broker.cleaner.cleaner import STEPS, CleanAborted, Cleaner
from minibroker.broker.cleaner.offset_map import OffsetMap
from minibroker.broker.cleaner.selection import log_to_clean
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.log import PartitionLog
from minibroker.broker.storage.log_loader import GAPS_MARKER
from minibroker.client.batch import Compression, read_header
from minibroker.client.records import (
    decode_batch,
    encode_batch,
    encode_placed_batch,
    iter_decoded_batches,
)
from minibroker.client.types import TopicPartition
from tests.unit.cleaner_support import (
    CONFIG,
    MAP_BYTES,
    RETENTION_MS,
    clean,
    facts,
    latest,
    open_log,
    read_all,
    to_clean,
    write,
)


def batches_of(log: PartitionLog) -> list[bytes]:
    """The raw batches from the log start, in order."""
    out = []
    offset = log.log_start_offset
    while offset < log.leo:
        info = log.read(offset, 1 << 20)
        if not info.records:
            break
        view = memoryview(info.records)
        for batch in iter_decoded_batches(info.records):
            out.append(bytes(view[batch.position : batch.position + batch.size]))
        offset = info.next_offset
    return out


def no_cleaned_files(directory: pathlib.Path) -> bool:
    return not [n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap"))]


# -- the rewrite --------------------------------------------------------------------------------


def test_rewrite_keeps_the_latest_record_of_each_key_at_its_offset(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path / "changes-0")
    written: dict[int, tuple[bytes, bytes]] = {}
    for i in range(40):
        key, value = b"k%d" % (i % 5), b"v%d" % i
        written[write(log, [(key, value)])] = (key, value)
        if i % 8 == 7:
            log.roll(now_ms=1_000)
    active_base = log.active_segment.base_offset
    before = read_all(log)
    stats = clean(log, now_ms=2_000)
    after = read_all(log)

    assert latest(after) == latest(before)
    cleaned = [r for r in after if r.offset < active_base]
    assert len({r.key for r in cleaned}) == len(cleaned), "a key twice in the cleaned part"
    for r in after:  # every record is one that was written, at its own offset
        assert written[r.offset] == (r.key, r.value)
    offsets = [r.offset for r in after]
    assert offsets == sorted(set(offsets))
    assert stats.end_offset == active_base
    assert stats.first_dirty_offset == 0
    assert stats.segments_before == 5 and stats.segments_after >= 1
    assert stats.records_read >= 2 * active_base  # both passes
    assert stats.records_written == len(cleaned)
    assert 0 < stats.bytes_written < stats.bytes_read
    assert 0 < stats.map_utilization <= 1
    assert log.may_have_gaps and (log.directory / GAPS_MARKER).exists()
    assert no_cleaned_files(log.directory)
    log.close()


def test_rewritten_batch_keeps_offsets_producer_fields_and_epoch(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path / "changes-0")
    base = write(log, [(b"a", b"1"), (b"b", b"1"), (b"c", b"1")], producer=(7, 3, 40), epoch=4)
    write(log, [(b"a", b"2")], epoch=4)
    log.roll(now_ms=1_000)
    write(log, [(b"z", b"1")], epoch=4)
    clean(log, now_ms=2_000)

    first = read_header(batches_of(log)[0])
    assert (first.base_offset, first.last_offset) == (base, base + 2)
    assert (first.producer_id, first.producer_epoch, first.base_sequence) == (7, 3, 40)
    assert first.partition_leader_epoch == 4
    assert first.records_count == 2
    records = decode_batch(batches_of(log)[0]).records
    assert [(r.offset, r.key) for r in records] == [(base + 1, b"b"), (base + 2, b"c")]
    assert [r.timestamp for r in records] == [1_001, 1_002]  # record timestamps unchanged
    log.close()


def test_tombstone_kept_until_the_delete_horizon_then_removed(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path / "changes-0")
    write(log, [(b"gone", b"old"), (b"kept", b"v")])
    tombstone = write(log, [(b"gone", None)])
    log.roll(now_ms=1_000)
    write(log, [(b"x", b"1")])

    stats = clean(log, now_ms=5_000)
    records = read_all(log)
    assert [(r.key, r.value) for r in records if r.key == b"gone"] == [(b"gone", None)]
    horizon_batch = next(
        read_header(b) for b in batches_of(log) if read_header(b).base_offset == tombstone
    )
    assert horizon_batch.delete_horizon_ms == 5_000 + RETENTION_MS  # KIP-534, first cleaning
    checkpoint = stats.end_offset

    # Later rounds: the horizon stays where the first cleaning put it.
    log.roll(now_ms=1_000)
    write(log, [(b"y", b"1")])
    log.roll(now_ms=1_000)
    write(log, [(b"w", b"1")])
    checkpoint = clean(log, now_ms=5_000 + RETENTION_MS - 1, checkpoint=checkpoint).end_offset
    assert (b"gone", None) in [(r.key, r.value) for r in read_all(log)]
    horizon_batch = next(
        read_header(b) for b in batches_of(log) if read_header(b).base_offset == tombstone
    )
    assert horizon_batch.delete_horizon_ms == 5_000 + RETENTION_MS

    log.roll(now_ms=1_000)
    write(log, [(b"v", b"1")])
    clean(log, now_ms=5_000 + RETENTION_MS, checkpoint=checkpoint)
    after = read_all(log)
    assert b"gone" not in {r.key for r in after}
    assert latest(after)[b"kept"] == b"v"
    log.close()


def test_emptied_last_batch_of_a_producer_stays_as_an_empty_batch(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path / "changes-0")
    idempotent = write(log, [(b"a", b"1"), (b"b", b"1")], producer=(5, 2, 10), epoch=1)
    plain = write(log, [(b"c", b"1")], epoch=1)
    write(log, [(b"a", b"2"), (b"b", b"2"), (b"c", b"2"), (b"d", b"1")], epoch=1)
    log.roll(now_ms=1_000)
    write(log, [(b"e", b"1")], epoch=1)
    clean(log, now_ms=2_000)

    headers = [read_header(b) for b in batches_of(log)]
    by_base = {h.base_offset: h for h in headers}
    assert plain not in by_base  # emptied, no producer: dropped
    empty = by_base[idempotent]
    assert empty.records_count == 0
    assert (empty.base_offset, empty.last_offset) == (idempotent, idempotent + 1)
    assert (empty.producer_id, empty.producer_epoch, empty.base_sequence) == (5, 2, 10)
    assert empty.last_sequence == 11
    assert empty.partition_leader_epoch == 1
    assert empty.compression is Compression.NONE
    assert empty.max_timestamp == 1_001
    log.close()


def test_producer_batch_no_longer_its_last_is_dropped(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path / "changes-0")
    older = write(log, [(b"a", b"1")], producer=(5, 0, 0))
    write(log, [(b"a", b"2")], producer=(5, 0, 1))
    log.roll(now_ms=1_000)
    write(log, [(b"e", b"1")])
    clean(log, now_ms=2_000)
    assert older not in {read_header(b).base_offset for b in batches_of(log)}
    log.close()


def test_a_full_map_cleans_only_the_prefix_it_covered(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path / "changes-0")
    keys = [b"k%d" % (i % 5) for i in range(30)]  # 5 keys, 6 times each: offsets 0..29
    keys += [b"d%02d" % i for i in range(30, 60)]  # 30 distinct keys: 30..59
    keys += [b"k%d" % (i % 5) for i in range(5)]  # the 5 keys once more: 60..64
    for i, key in enumerate(keys):
        write(log, [(key, b"v%d" % i)])
        if i % 10 == 9:
            log.roll(now_ms=1_000)
    log.roll(now_ms=1_000)
    write(log, [(b"z", b"1")])
    before = read_all(log)
    small = OffsetMap(24 * 12, load_factor=0.75)  # 12 slots, 9 keys
    cleaner = Cleaner(small)
    stats = cleaner.clean(log, to_clean(log, 2_000), 2_000)
    after = read_all(log)

    # k0..k4 and d30..d33 fill the map; d34 finds it full: offsets from 34 on are not covered.
    assert small.size == small.max_entries == 9
    assert stats.end_offset == small.latest_offset + 1 == 34
    assert stats.map_utilization == pytest.approx(9 / 12)
    assert latest(after) == latest(before)
    assert [r for r in after if r.offset >= 34] == [r for r in before if r.offset >= 34]
    assert [r.offset for r in after if r.offset < 34] == [25, 26, 27, 28, 29, 30, 31, 32, 33]

    # Rounds from each checkpoint finish the job.
    checkpoint = stats.end_offset
    for _ in range(10):
        if checkpoint >= log.active_segment.base_offset:
            break
        checkpoint = cleaner.clean(log, to_clean(log, 3_000, checkpoint), 3_000).end_offset
    final = read_all(log)
    assert latest(final) == latest(before)
    cleaned = [r.key for r in final if r.offset < log.active_segment.base_offset]
    assert len(cleaned) == len(set(cleaned)) == 35
    log.close()


@pytest.mark.parametrize(
    "codec", [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]
)
def test_compressed_batches_are_written_back_with_their_codec(
    tmp_path: pathlib.Path, codec: Compression
) -> None:
    log = open_log(tmp_path / "changes-0")
    records = [(b"a", b"x" * 200), (b"b", b"y" * 200), (b"c", b"z" * 200)]
    base = write(log, records, compression=codec)
    write(log, [(b"b", b"new")])
    log.roll(now_ms=1_000)
    write(log, [(b"q", b"1")])
    clean(log, now_ms=2_000)

    first = batches_of(log)[0]
    header = read_header(first)
    assert header.base_offset == base and header.compression is codec
    assert [(r.key, r.value) for r in decode_batch(first).records] == [
        (b"a", b"x" * 200),
        (b"c", b"z" * 200),
    ]
    log.close()


def test_log_append_time_batches_keep_their_time(tmp_path: pathlib.Path) -> None:
    config = LogConfig(**{**_fields(CONFIG), "message_timestamp_type": "LogAppendTime"})
    log = open_log(tmp_path / "changes-0", config)
    write(log, [(b"a", b"1"), (b"b", b"1")], ts=1_000)
    write(log, [(b"a", b"2")], ts=1_500)
    log.roll(now_ms=1_000)
    write(log, [(b"z", b"1")])
    clean(log, now_ms=2_000)
    first = decode_batch(batches_of(log)[0])
    assert first.header.log_append_time
    assert [(r.key, r.timestamp) for r in first.records] == [(b"b", 1_000)]
    log.close()


def _fields(config: LogConfig) -> dict[str, object]:
    return {name: getattr(config, name) for name in config.__slots__}


# -- nothing to do, aborts, bad input -------------------------------------------------------


def test_a_log_without_dirty_segments_is_left_alone(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path / "changes-0")
    write(log, [(b"a", b"1")])
    write(log, [(b"a", b"2")])
    files = sorted(os.listdir(log.directory))
    stats = clean(log, now_ms=2_000)  # only the active segment
    assert (stats.segments_before, stats.segments_after, stats.end_offset) == (0, 0, 0)
    assert sorted(os.listdir(log.directory)) == files
    assert not log.may_have_gaps
    log.close()


@pytest.mark.parametrize("change", ["truncate", "retention", "log_start", "close"])
def test_the_swap_is_aborted_when_the_log_changed(tmp_path: pathlib.Path, change: str) -> None:
    log = open_log(tmp_path / "changes-0")
    for i in range(12):
        write(log, [(b"k%d" % (i % 3), b"v%d" % i)])
        if i % 4 == 3:
            log.roll(now_ms=1_000)
    ltc = to_clean(log, 2_000)
    before = read_all(log)
    calls = 0

    def on_loop(fn):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 2:  # after the snapshot, before the first swap
            if change == "truncate":
                log.truncate_to(2)
            elif change == "retention":
                log.maybe_increment_log_start_offset(8)
                log.delete_retention(2_000, high_watermark=log.leo)
            elif change == "log_start":  # raised past the group (all of it), not deleted yet
                log.maybe_increment_log_start_offset(log.active_segment.base_offset)
            else:
                log.close()
        return fn()

    with pytest.raises(CleanAborted):
        Cleaner(OffsetMap(MAP_BYTES)).clean(log, ltc, 2_000, on_loop)
    assert no_cleaned_files(log.directory)
    assert not log.may_have_gaps
    if change == "truncate":
        assert [r.offset for r in read_all(log)] == [r.offset for r in before][:2]
    if change == "close":
        with pytest.raises(CleanAborted):
            Cleaner(OffsetMap(MAP_BYTES)).clean(log, ltc, 2_000)
    else:
        log.close()


def test_should_abort_stops_the_round_before_any_swap(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path / "changes-0")
    for i in range(8):
        write(log, [(b"k", b"v%d" % i)])
        log.roll(now_ms=1_000)
    before = batches_of(log)
    with pytest.raises(CleanAborted):
        Cleaner(OffsetMap(MAP_BYTES)).clean(
            log, to_clean(log, 2_000), 2_000, should_abort=lambda: True
        )
    assert batches_of(log) == before
    assert no_cleaned_files(log.directory)
    log.close()


def test_a_log_that_does_not_compact_is_not_cleaned(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path / "changes-0", LogConfig(segment_bytes=4096))
    write(log, [(b"a", b"1")])
    write(log, [(None, b"keyless")])
    log.roll(now_ms=1_000)
    write(log, [(b"a", b"2")])
    before = batches_of(log)
    with pytest.raises(CleanAborted, match=r"cleanup\.policy does not compact"):
        clean(log, now_ms=2_000)
    assert batches_of(log) == before
    assert not log.may_have_gaps
    log.close()


def test_a_log_to_clean_of_another_partition_is_refused(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path / "changes-0")
    write(log, [(b"a", b"1")])
    log.roll(now_ms=1_000)
    write(log, [(b"a", b"2")])
    other = PartitionLog.open(tmp_path / "other-0", TopicPartition("other", 0), CONFIG, 0)
    before = batches_of(log)
    with pytest.raises(ValueError, match="log to clean is other-0"):
        Cleaner(OffsetMap(MAP_BYTES)).clean(log, to_clean(other, 2_000), 2_000)
    assert batches_of(log) == before
    log.close()
    other.close()


def test_step_names_are_reached_in_order(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path / "changes-0")
    for i in range(6):
        write(log, [(b"k%d" % (i % 2), b"v%d" % i)])
        if i % 2 == 1:
            log.roll(now_ms=1_000)
    seen: list[str] = []
    Cleaner(OffsetMap(MAP_BYTES), step_hook=seen.append).clean(log, to_clean(log, 2_000), 2_000)
    order = [name for name in STEPS if name in seen]
    assert order == list(STEPS)  # every step was reached
    assert [STEPS.index(name) for name in dict.fromkeys(seen)] == sorted(
        STEPS.index(name) for name in set(seen)
    )
    log.close()


def test_segment_descriptors_closed_by_the_lru_mid_round_do_not_matter(
    tmp_path: pathlib.Path,
) -> None:
    from minibroker.broker.storage.segment_files import INACTIVE_SEGMENT_FILES

    log = small_segments_log(tmp_path / "changes-0")
    for segment in log.segments[:-1]:  # every inactive segment's descriptor cached
        log.read(segment.base_offset, 100)
    before = read_all(log)
    capacity = INACTIVE_SEGMENT_FILES.capacity

    def on_loop(fn):  # type: ignore[no-untyped-def]
        INACTIVE_SEGMENT_FILES.capacity = 1  # the loop's LRU closes descriptors meanwhile
        try:
            return fn()
        finally:
            INACTIVE_SEGMENT_FILES.capacity = capacity

    stats = Cleaner(OffsetMap(MAP_BYTES)).clean(log, to_clean(log, 2_000), 2_000, on_loop)
    assert stats.segments_before == 3
    assert latest(read_all(log)) == latest(before)
    log.close()


def test_io_buffer_smaller_than_a_batch_still_cleans(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path / "changes-0")
    write(log, [(b"a", b"x" * 1500), (b"b", b"y" * 1500)])
    write(log, [(b"a", b"new")])
    log.roll(now_ms=1_000)
    write(log, [(b"c", b"1")])
    Cleaner(OffsetMap(MAP_BYTES), io_buffer_size=100).clean(log, to_clean(log, 2_000), 2_000)
    assert latest(read_all(log)) == {b"a": b"new", b"b": b"y" * 1500, b"c": b"1"}
    log.close()


def test_cleaner_refuses_a_buffer_below_a_header() -> None:
    with pytest.raises(ValueError, match="io_buffer_size"):
        Cleaner(OffsetMap(MAP_BYTES), io_buffer_size=10)


# -- the encoder the rewrite uses -----------------------------------------------------------


@pytest.mark.parametrize("codec", list(Compression))
def test_placed_batch_with_consecutive_offsets_is_encode_batch(codec: Compression) -> None:
    records = [(1_000 + i, b"k%d" % i, None if i == 2 else b"v" * i, ()) for i in range(5)]
    fields = dict(producer_id=3, producer_epoch=1, base_sequence=8, partition_leader_epoch=6)
    expected = encode_batch(records, compression=codec, base_offset=20, **fields)  # type: ignore[arg-type]
    placed = encode_placed_batch(
        [(20 + i, ts, k, v, h) for i, (ts, k, v, h) in enumerate(records)],
        base_offset=20,
        last_offset=24,
        base_timestamp=1_000,
        max_timestamp=1_004,
        compression=codec,
        **fields,  # type: ignore[arg-type]
    )
    assert placed == expected


def test_placed_batch_refuses_offsets_outside_or_out_of_order() -> None:
    common = dict(base_offset=10, last_offset=12, base_timestamp=0, max_timestamp=0)
    with pytest.raises(ValueError, match="not in"):
        encode_placed_batch([(13, 0, b"k", b"v", ())], **common)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not in"):
        encode_placed_batch(
            [(11, 0, b"k", b"v", ()), (11, 0, b"k", b"v", ())],
            **common,  # type: ignore[arg-type]
        )
    with pytest.raises(ValueError, match="does not fit"):
        encode_placed_batch([], base_offset=10, last_offset=9, base_timestamp=0, max_timestamp=0)


# -- disk failures during the swap, leftovers at load ---------------------------------------


def small_segments_log(directory: pathlib.Path) -> PartitionLog:
    log = open_log(directory)
    for i in range(9):
        write(log, [(b"k%d" % (i % 3), b"v%d" % i), (b"u%d" % i, b"once")])
        if i % 3 == 2:
            log.roll(now_ms=1_000)
    return log


def test_a_failed_rename_to_swap_is_undone_and_the_log_goes_on(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import minibroker.broker.cleaner.cleaner as cleaner_module
    from minibroker.client.errors import KafkaStorageError

    log = small_segments_log(tmp_path / "changes-0")
    before = batches_of(log)

    def failing(*args: object, **kwargs: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(cleaner_module, "rename_files", failing)
    with pytest.raises(KafkaStorageError, match="undone"):
        clean(log, now_ms=2_000)
    assert batches_of(log) == before
    assert no_cleaned_files(log.directory)
    write(log, [(b"after", b"1")])  # the log still works
    log.close()
    reloaded = open_log(log.directory)
    assert batches_of(reloaded)[: len(before)] == before
    reloaded.close()


def test_a_failed_marker_write_swaps_nothing(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from minibroker.client.errors import KafkaStorageError

    log = small_segments_log(tmp_path / "changes-0")
    before = batches_of(log)

    def failing() -> None:
        raise KafkaStorageError("writing the may-have-gaps marker failed")

    monkeypatch.setattr(log, "mark_may_have_gaps", failing)
    with pytest.raises(KafkaStorageError, match="marker"):
        clean(log, now_ms=2_000)
    assert batches_of(log) == before
    assert no_cleaned_files(log.directory)
    log.close()


def test_load_removes_cleaned_leftovers_and_completes_a_swap(tmp_path: pathlib.Path) -> None:
    directory = tmp_path / "changes-0"
    log = small_segments_log(directory)
    before = read_all(log)
    bases = [s.base_offset for s in log.segments]
    log.close()
    names = {base: f"{base:020d}" for base in bases}
    # A round that wrote its files and died before the swap: thrown away.
    (directory / f"{names[bases[0]]}.log.cleaned").write_bytes(b"partial")
    (directory / f"{names[bases[0]]}.index.cleaned").write_bytes(b"")
    # A swap of the second segment alone whose old files were not deleted yet: completed.
    (directory / f"{names[bases[1]]}.log").rename(directory / f"{names[bases[1]]}.log.swap")
    os.link(directory / f"{names[bases[1]]}.log.swap", directory / f"{names[bases[1]]}.log.keep")
    (directory / f"{names[bases[1]]}.log.keep").rename(directory / f"{names[bases[1]]}.log")
    (directory / f"{names[bases[1]]}.index").rename(directory / f"{names[bases[1]]}.index.swap")

    reloaded = open_log(directory)
    assert no_cleaned_files(directory)
    assert read_all(reloaded) == before
    assert [s.base_offset for s in reloaded.segments] == bases
    assert (directory / f"{names[bases[1]]}.index").exists()
    reloaded.close()


def test_records_above_the_hw_never_supersede_older_ones(tmp_path: pathlib.Path) -> None:
    """A record at or above the HW can still be truncated away (a follower's log diverged, a
    leader change): it must not enter the offset map, or the committed value of its key below
    the HW is dropped in its favour and then lost with it. The round stops at the base of the
    segment holding the HW (Kafka's calculateCleanableBytes), so that segment is not read."""
    log = open_log(tmp_path / "changes-0")
    committed = write(log, [(b"k", b"v1")])
    write(log, [(b"other", b"x")])
    log.roll(now_ms=1_000)
    write(log, [(b"filler", b"f")])  # the HW falls inside this non-active segment, after it
    hw = write(log, [(b"k", b"v2")])  # above the HW: not committed
    log.roll(now_ms=1_000)
    write(log, [(b"tail", b"t")])
    bounded = dataclasses.replace(facts(log), upper_bound=hw)
    stats = Cleaner(OffsetMap(MAP_BYTES)).clean(log, log_to_clean(bounded, 2_000)[0], 2_000)
    assert stats.end_offset <= hw
    log.truncate_to(hw)  # the uncommitted record goes
    assert latest(read_all(log))[b"k"] == b"v1"
    assert any(r.offset == committed for r in read_all(log))
    log.close()
