"""The log cleaner's pure rules (broker/cleaner/selection.py): which log and range to clean
(Kafka's LogCleanerManager), how segments are grouped and which records and batches a cleaning
round keeps (Kafka's Cleaner). Table tests per rule, then property tests of whole rounds."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.cleaner.offset_map import OffsetMap
from minibroker.broker.cleaner.selection import (
    DEFAULT_DELETE_RETENTION_MS,
    DEFAULT_MAX_COMPACTION_LAG_MS,
    DEFAULT_MIN_CLEANABLE_DIRTY_RATIO,
    DEFAULT_MIN_COMPACTION_LAG_MS,
    RELATIVE_OFFSET_MAX,
    BatchAction,
    BatchFacts,
    BatchRetention,
    CompactionConfig,
    LogFacts,
    LogToClean,
    RecordFacts,
    SegmentFacts,
    add_batch_to_offset_map,
    batch_retention,
    calculate_cleanable_bytes,
    cleanable_offsets,
    delete_horizon_for,
    filter_batch,
    grab_filthiest_compacted_log,
    group_segments_by_size,
    log_segments,
    max_compaction_delay,
    non_active_segments_from,
    should_retain_record,
)
from minibroker.client.types import TopicPartition

TP = TopicPartition("t", 0)
COMPACT = CompactionConfig(cleanup_policy="compact")
NOW = 1_000_000


def seg(base: int, size: int = 100, largest: int = -1, first: int = -1) -> SegmentFacts:
    return SegmentFacts(base, size, largest_timestamp=largest, first_batch_timestamp=first)


def log(
    segments: list[SegmentFacts],
    *,
    checkpoint: int | None = None,
    start: int | None = None,
    end: int | None = None,
    upper: int | None = None,
    config: CompactionConfig = COMPACT,
    tp: TopicPartition = TP,
) -> LogFacts:
    end = segments[-1].base_offset + 10 if end is None else end
    return LogFacts(
        topic_partition=tp,
        config=config,
        log_start_offset=segments[0].base_offset if start is None else start,
        log_end_offset=end,
        segments=tuple(segments),
        upper_bound=end if upper is None else upper,
        checkpoint=checkpoint,
    )


# --- Defaults and config --------------------------------------------------------------------------


def test_defaults_are_kafkas() -> None:
    assert DEFAULT_MIN_CLEANABLE_DIRTY_RATIO == 0.5
    assert DEFAULT_MIN_COMPACTION_LAG_MS == 0
    assert DEFAULT_MAX_COMPACTION_LAG_MS == 2**63 - 1
    assert DEFAULT_DELETE_RETENTION_MS == 86_400_000
    config = CompactionConfig()
    assert (config.compact, config.delete) == (False, True)


@pytest.mark.parametrize(
    ("policy", "compact", "delete"),
    [
        ("delete", False, True),
        ("compact", True, False),
        ("compact,delete", True, True),
        ("delete, compact", True, True),
    ],
)
def test_cleanup_policy_words(policy: str, compact: bool, delete: bool) -> None:
    config = CompactionConfig(cleanup_policy=policy)
    assert (config.compact, config.delete) == (compact, delete)


def test_log_facts_need_ordered_segments() -> None:
    with pytest.raises(ValueError):
        LogFacts(TP, COMPACT, 0, 0, (), upper_bound=0)
    with pytest.raises(ValueError):
        log([seg(10), seg(0)])
    with pytest.raises(ValueError):
        log([seg(0), seg(0)])


# --- Segment ranges -------------------------------------------------------------------------------

SEGS = [seg(0), seg(10), seg(20), seg(30)]


@pytest.mark.parametrize(
    ("lo", "hi", "bases"),
    [
        (0, 40, [0, 10, 20, 30]),
        (5, 25, [0, 10, 20]),  # from the segment holding 5, to the last base below 25
        (10, 20, [10]),
        (10, 21, [10, 20]),
        (15, 15, []),
        (-1, 10, [0]),  # below the first base: from the first segment
        (35, 100, [30]),
    ],
)
def test_log_segments(lo: int, hi: int, bases: list[int]) -> None:
    assert [s.base_offset for s in log_segments(SEGS, lo, hi)] == bases


def test_log_segments_refuses_a_reversed_range() -> None:
    with pytest.raises(ValueError):
        log_segments(SEGS, 20, 10)


@pytest.mark.parametrize(("lo", "bases"), [(0, [0, 10, 20]), (15, [10, 20]), (30, []), (31, [])])
def test_non_active_segments_from(lo: int, bases: list[int]) -> None:
    assert [s.base_offset for s in non_active_segments_from(SEGS, lo)] == bases


# --- cleanable_offsets ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("checkpoint", "start", "first_dirty", "force"),
    [
        (None, 0, 0, False),  # never cleaned: from the log start
        (None, 5, 5, False),
        (12, 0, 12, False),  # the checkpoint
        (3, 5, 5, True),  # below the log start (retention deleted it): reset
        (41, 0, 0, True),  # past the log end (a truncation): reset to the log start
        (40, 0, 40, False),  # at the log end: valid
    ],
)
def test_first_dirty_offset(
    checkpoint: int | None, start: int, first_dirty: int, force: bool
) -> None:
    offsets = cleanable_offsets(log(SEGS, checkpoint=checkpoint, start=start, end=40), NOW)
    assert (offsets.first_dirty_offset, offsets.force_update_checkpoint) == (first_dirty, force)


def test_never_the_active_segment() -> None:
    offsets = cleanable_offsets(log(SEGS, end=40, upper=40), NOW)
    assert offsets.first_uncleanable_dirty_offset == 30


def test_never_above_the_upper_bound() -> None:
    offsets = cleanable_offsets(log(SEGS, end=40, upper=17), NOW)
    assert offsets.first_uncleanable_dirty_offset == 17


def test_min_compaction_lag_stops_at_the_first_segment_too_new() -> None:
    lag = 1000
    segments = [
        seg(0, largest=NOW - 5000),
        seg(10, largest=NOW - lag),  # exactly at the lag: cleanable
        seg(20, largest=NOW - lag + 1),  # newer than now - lag: not
        seg(30, largest=NOW - 9000),  # older again, but after a too-new one
        seg(40),
    ]
    config = CompactionConfig(cleanup_policy="compact", min_compaction_lag_ms=lag)
    offsets = cleanable_offsets(log(segments, config=config), NOW)
    assert offsets.first_uncleanable_dirty_offset == 20


def test_min_compaction_lag_looks_only_at_dirty_segments() -> None:
    segments = [seg(0, largest=NOW), seg(10, largest=NOW - 5000), seg(20)]
    config = CompactionConfig(cleanup_policy="compact", min_compaction_lag_ms=1000)
    offsets = cleanable_offsets(log(segments, config=config, checkpoint=10), NOW)
    assert (offsets.first_dirty_offset, offsets.first_uncleanable_dirty_offset) == (10, 20)


def test_zero_min_compaction_lag_ignores_timestamps() -> None:
    segments = [seg(0, largest=NOW + 10**9), seg(10)]
    assert cleanable_offsets(log(segments), NOW).first_uncleanable_dirty_offset == 10


def test_uncleanable_offset_never_below_the_first_dirty_offset() -> None:
    offsets = cleanable_offsets(log(SEGS, checkpoint=35, end=40), NOW)
    assert (offsets.first_dirty_offset, offsets.first_uncleanable_dirty_offset) == (35, 35)


# --- max.compaction.lag.ms ------------------------------------------------------------------------


def lagged(max_lag: int, segments: list[SegmentFacts], checkpoint: int | None = None) -> int:
    config = CompactionConfig(cleanup_policy="compact", max_compaction_lag_ms=max_lag)
    facts = log(segments, config=config, checkpoint=checkpoint)
    return max_compaction_delay(facts, cleanable_offsets(facts, NOW).first_dirty_offset, NOW)


def test_max_compaction_delay() -> None:
    segments = [seg(0, first=NOW - 5000), seg(10, first=NOW - 8000), seg(20, first=NOW)]
    assert lagged(3000, segments) == 5000  # earliest first batch (NOW - 8000) vs NOW - 3000
    assert lagged(8000, segments) == 0  # not past: earliest == now - lag
    assert lagged(DEFAULT_MAX_COMPACTION_LAG_MS, segments) == 0
    # The active segment's timestamp and clean segments' do not count.
    assert lagged(3000, segments, checkpoint=10) == 5000
    assert lagged(3000, [seg(0, first=NOW - 8000), seg(10, first=NOW - 4000), seg(20)], 10) == 1000
    assert lagged(3000, [seg(0), seg(10, first=NOW - 9000)]) == 0


def test_max_compaction_delay_skips_unknown_timestamps() -> None:
    assert lagged(3000, [seg(0, first=-1), seg(10, first=0), seg(20)]) == 0


# --- Dirty ratio ----------------------------------------------------------------------------------


def test_calculate_cleanable_bytes_rounds_to_a_segment_base() -> None:
    segments = [seg(0, 100), seg(10, 200), seg(20, 400), seg(30, 800)]
    facts = log(segments)
    assert calculate_cleanable_bytes(facts, 10, 25) == (20, 200)
    assert calculate_cleanable_bytes(facts, 10, 20) == (20, 200)
    assert calculate_cleanable_bytes(facts, 0, 30) == (30, 700)
    assert calculate_cleanable_bytes(facts, 0, 99) == (30, 700)  # past the active base: active


def test_log_to_clean_ratio() -> None:
    segments = [seg(0, 100), seg(10, 300), seg(20, 600), seg(30, 9999)]
    ltc = LogToClean(log(segments, checkpoint=10), 10, 30)
    assert (ltc.clean_bytes, ltc.cleanable_bytes, ltc.total_bytes) == (100, 900, 1000)
    assert ltc.cleanable_ratio == 0.9
    assert ltc.first_uncleanable_offset == 30
    assert LogToClean(log([seg(0, 0), seg(10)]), 0, 10).cleanable_ratio == 0.0


# --- grab_filthiest_compacted_log -----------------------------------------------------------------


def partition(
    n: int,
    clean: int,
    dirty: int,
    *,
    policy: str = "compact",
    ratio: float = 0.5,
    max_lag: int = DEFAULT_MAX_COMPACTION_LAG_MS,
    first: int = -1,
    checkpoint: int | None = 10,
) -> LogFacts:
    config = CompactionConfig(
        cleanup_policy=policy, min_cleanable_dirty_ratio=ratio, max_compaction_lag_ms=max_lag
    )
    segments = [seg(0, clean), seg(10, dirty, first=first), seg(20, 50)]
    return log(segments, checkpoint=checkpoint, config=config, tp=TopicPartition("t", n))


def test_picks_the_filthiest_above_its_ratio() -> None:
    logs = [partition(0, 40, 60), partition(1, 20, 80), partition(2, 60, 40)]
    choice = grab_filthiest_compacted_log(logs, NOW)
    assert choice.filthiest is not None
    assert choice.filthiest.topic_partition == TopicPartition("t", 1)
    assert choice.max_dirty_ratio == 0.8
    assert choice.cleanable_logs == 2


def test_ratio_must_exceed_the_minimum() -> None:
    choice = grab_filthiest_compacted_log([partition(0, 50, 50)], NOW)
    assert choice.filthiest is None
    assert choice.max_dirty_ratio == 0.5  # still reported
    assert grab_filthiest_compacted_log([partition(0, 50, 50, ratio=0.49)], NOW).filthiest


def test_equal_ratios_pick_the_first() -> None:
    choice = grab_filthiest_compacted_log([partition(0, 20, 80), partition(1, 20, 80)], NOW)
    assert choice.filthiest is not None
    assert choice.filthiest.topic_partition == TopicPartition("t", 0)


def test_skips_delete_only_in_progress_uncleanable_and_empty_logs() -> None:
    logs = [
        partition(0, 10, 90, policy="delete"),
        partition(1, 10, 90),
        partition(2, 10, 90),
        partition(3, 0, 0),
        partition(4, 30, 70, policy="compact,delete"),
    ]
    in_progress = {TopicPartition("t", 1)}
    uncleanable = {TopicPartition("t", 2)}
    choice = grab_filthiest_compacted_log(logs, NOW, in_progress, uncleanable)
    assert choice.filthiest is not None
    assert choice.filthiest.topic_partition == TopicPartition("t", 4)
    assert choice.max_dirty_ratio == 0.7


def test_max_compaction_lag_forces_a_log_below_its_ratio() -> None:
    lazy = partition(0, 90, 10, max_lag=1000, first=NOW - 5000)
    choice = grab_filthiest_compacted_log([lazy], NOW)
    assert choice.filthiest is not None
    assert choice.filthiest.need_compaction_now
    assert (choice.max_compaction_delay_ms, choice.delayed_logs) == (4000, 1)


def test_max_compaction_lag_needs_cleanable_bytes() -> None:
    lazy = partition(0, 90, 0, max_lag=1000, first=NOW - 5000)
    assert grab_filthiest_compacted_log([lazy], NOW).filthiest is None


def test_max_compaction_lag_not_yet_reached() -> None:
    lazy = partition(0, 90, 10, max_lag=10_000, first=NOW - 5000)
    choice = grab_filthiest_compacted_log([lazy], NOW)
    assert choice.filthiest is None
    assert choice.delayed_logs == 0


def test_the_filthiest_by_ratio_wins_over_a_forced_log() -> None:
    # Kafka orders candidates by ratio alone, forced or not.
    lazy = partition(0, 90, 10, max_lag=1000, first=NOW - 5000)
    dirty = partition(1, 10, 90)
    choice = grab_filthiest_compacted_log([lazy, dirty], NOW)
    assert choice.filthiest is not None
    assert choice.filthiest.topic_partition == TopicPartition("t", 1)


def test_invalid_checkpoints_are_reported_for_reset() -> None:
    logs = [partition(0, 10, 90, checkpoint=999), partition(1, 10, 90, checkpoint=10)]
    choice = grab_filthiest_compacted_log(logs, NOW)
    assert choice.checkpoint_resets == ((TopicPartition("t", 0), 0),)


# --- group_segments_by_size -----------------------------------------------------------------------


def grouped(
    segments: list[SegmentFacts], max_size: int, max_index: int, end: int
) -> list[list[int]]:
    groups = group_segments_by_size(segments, max_size, max_index, end)
    return [[s.base_offset for s in g] for g in groups]


def test_groups_up_to_max_size_inclusive() -> None:
    segments = [seg(0, 40), seg(10, 60), seg(20, 30), seg(30, 70), seg(40, 100)]
    assert grouped(segments, 100, 10**9, 50) == [[0, 10], [20, 30], [40]]
    assert grouped(segments, 99, 10**9, 50) == [[0], [10, 20], [30], [40]]


def test_a_segment_larger_than_max_size_is_a_group_of_its_own() -> None:
    assert grouped([seg(0, 500), seg(10, 1)], 100, 10**9, 20) == [[0], [10]]


def test_groups_within_max_index_size() -> None:
    def s(base: int, index: int, time_index: int) -> SegmentFacts:
        return SegmentFacts(base, 1, offset_index_bytes=index, time_index_bytes=time_index)

    assert grouped([s(0, 60, 0), s(10, 40, 0), s(20, 1, 0)], 10**9, 100, 30) == [[0, 10], [20]]
    assert grouped([s(0, 0, 60), s(10, 0, 41), s(20, 0, 1)], 10**9, 100, 30) == [[0], [10, 20]]


def test_groups_within_an_int32_of_offsets() -> None:
    big = RELATIVE_OFFSET_MAX
    segments = [seg(0, 1), seg(big - 10, 1), seg(big + 1, 1)]
    # Adding the second segment: its last offset is the third's base - 1 = big, exactly 2**31 - 1
    # from the group's last base (0): allowed. The third's last offset (end - 1) is far past.
    assert grouped(segments, 10**9, 10**9, 3 * big) == [[0, big - 10], [big + 1]]
    assert grouped(segments, 10**9, 10**9, big + 2) == [[0, big - 10, big + 1]]
    assert grouped([seg(0, 1), seg(10, 1)], 10**9, 10**9, big + 2) == [[0], [10]]


def test_an_empty_segment_skips_the_offset_span_check() -> None:
    assert grouped([seg(0, 1), seg(10, 0)], 10**9, 10**9, 2**40) == [[0, 10]]


# --- should_retain_record -------------------------------------------------------------------------


def map_of(entries: dict[bytes, int], latest: int) -> OffsetMap:
    m = OffsetMap(24 * 100)
    for k, o in sorted(entries.items(), key=lambda kv: kv[1]):
        m.put(k, o)
    m.update_latest_offset(latest)
    return m


@pytest.mark.parametrize(
    ("offset", "key", "has_value", "horizon", "kept", "why"),
    [
        (5, b"a", True, None, True, "the latest record of its key"),
        (2, b"a", True, None, False, "an older record of a key in the map"),
        (3, b"b", True, None, True, "a key not in the map (only in the clean part)"),
        (4, None, True, None, False, "no key"),
        (11, b"a", True, None, True, "above the map's latest offset: untouched"),
        (11, None, False, None, True, "above the map's latest offset, even without a key"),
        (10, b"c", False, None, True, "a tombstone never cleaned (no horizon)"),
        (10, b"c", False, NOW + 1, True, "a tombstone before its horizon"),
        (10, b"c", False, NOW, False, "a tombstone at its horizon"),
        (10, b"c", False, NOW - 1, False, "a tombstone past its horizon"),
        (5, b"a", True, NOW - 1, True, "a value past the horizon is kept"),
        (1, b"c", False, None, False, "an older tombstone"),
    ],
)
def test_should_retain_record(
    offset: int, key: bytes | None, has_value: bool, horizon: int | None, kept: bool, why: str
) -> None:
    m = map_of({b"a": 5, b"c": 10}, latest=10)
    assert should_retain_record(m, offset, key, has_value, horizon, NOW) is kept, why


@pytest.mark.parametrize(
    ("horizon", "tombstone", "result"),
    [(None, True, NOW + 500), (None, False, None), (42, True, 42), (42, False, 42)],
)
def test_delete_horizon_is_set_on_the_first_clean_only(
    horizon: int | None, tombstone: bool, result: int | None
) -> None:
    assert delete_horizon_for(horizon, tombstone, NOW, 500) == result


# --- Batches --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "last_data", "upper", "retention"),
    [
        (BatchFacts(0, 4), {}, 100, BatchRetention.DELETE_EMPTY),
        (BatchFacts(0, 4, producer_id=7), {7: 4}, 100, BatchRetention.RETAIN_EMPTY),
        (BatchFacts(0, 4, producer_id=7), {7: 9}, 100, BatchRetention.DELETE_EMPTY),
        (BatchFacts(0, 4, producer_id=7), {8: 4}, 100, BatchRetention.DELETE_EMPTY),
        (BatchFacts(0, 4, producer_id=-1), {-1: 4}, 100, BatchRetention.DELETE_EMPTY),
        (BatchFacts(0, 4), {}, 5, BatchRetention.RETAIN_EMPTY),  # ends the round
        (BatchFacts(0, 4), {}, 4, BatchRetention.DELETE_EMPTY),
    ],
)
def test_batch_retention(
    batch: BatchFacts, last_data: dict[int, int], upper: int, retention: BatchRetention
) -> None:
    assert batch_retention(batch, last_data, upper) is retention


def decide(
    batch: BatchFacts, records: list[RecordFacts], last_data: dict[int, int] | None = None
) -> tuple[BatchAction, list[int], int | None]:
    m = map_of({b"a": 5, b"b": 1, b"c": 6}, latest=20)
    d = filter_batch(batch, records, m, NOW, 500, last_data or {}, 100)
    return d.action, [r.offset for r in d.retained], d.delete_horizon_ms


def test_filter_batch_keeps_a_batch_of_latest_records_as_it_is() -> None:
    records = [RecordFacts(5, b"a"), RecordFacts(6, b"c")]
    assert decide(BatchFacts(5, 6), records) == (BatchAction.KEEP, [5, 6], None)


def test_filter_batch_rewrites_a_batch_that_loses_records() -> None:
    records = [RecordFacts(4, b"a"), RecordFacts(5, b"a"), RecordFacts(6, b"c")]
    assert decide(BatchFacts(4, 6), records) == (BatchAction.REWRITE, [5, 6], None)


def test_filter_batch_sets_the_horizon_of_a_kept_tombstone() -> None:
    records = [RecordFacts(5, b"a", has_value=False), RecordFacts(6, b"c")]
    assert decide(BatchFacts(5, 6), records) == (BatchAction.REWRITE, [5, 6], NOW + 500)
    horizon = NOW + 1
    kept = decide(BatchFacts(5, 6, delete_horizon_ms=horizon), records)
    assert kept == (BatchAction.KEEP, [5, 6], horizon)
    expired = decide(BatchFacts(5, 6, delete_horizon_ms=NOW), records)
    assert expired == (BatchAction.REWRITE, [6], NOW)


def test_filter_batch_drops_an_emptied_batch() -> None:
    assert decide(BatchFacts(3, 4), [RecordFacts(3, b"a"), RecordFacts(4, b"c")]) == (
        BatchAction.DROP,
        [],
        None,
    )


def test_filter_batch_keeps_an_emptied_batch_of_an_active_producer() -> None:
    batch = BatchFacts(3, 4, producer_id=9)
    records = [RecordFacts(3, b"a"), RecordFacts(4, b"c")]
    assert decide(batch, records, {9: 4})[0] is BatchAction.EMPTY
    assert decide(batch, records, {9: 40})[0] is BatchAction.DROP


# --- add_batch_to_offset_map ----------------------------------------------------------------------


def test_offset_map_covers_keyed_records_from_the_start_offset() -> None:
    m = OffsetMap(24 * 100)
    records = [RecordFacts(10, b"a"), RecordFacts(11, None), RecordFacts(12, b"b")]
    assert add_batch_to_offset_map(m, BatchFacts(10, 13), records, 11) is False
    assert (m.get(b"a"), m.get(b"b"), m.size, m.latest_offset) == (-1, 12, 1, 13)
    assert add_batch_to_offset_map(m, BatchFacts(0, 5), [RecordFacts(0, b"c")], 11) is False
    assert (m.get(b"c"), m.latest_offset) == (-1, 13)  # wholly below the start: no change


def test_offset_map_stops_at_its_load_factor() -> None:
    m = OffsetMap(24 * 10, load_factor=0.2)  # 2 entries
    records = [RecordFacts(0, b"a"), RecordFacts(1, b"b"), RecordFacts(2, b"a")]
    assert add_batch_to_offset_map(m, BatchFacts(0, 3), records, 0) is True
    # Even a key already in the map is not put once full (Kafka checks before the lookup).
    assert (m.get(b"a"), m.latest_offset) == (0, 1)


# --- Properties: whole cleaning rounds ------------------------------------------------------------

KEYS = [b"k0", b"k1", b"k2", b"k3", b"k4"]
RETENTION = 1000


@st.composite
def writes(draw: st.DrawFn, first_offset: int, max_size: int) -> list[list[RecordFacts]]:
    """Batches of keyed writes and tombstones from `first_offset` (a few without keys)."""
    batches: list[list[RecordFacts]] = []
    offset = first_offset
    for _ in range(draw(st.integers(0, max_size))):
        batch = []
        for _ in range(draw(st.integers(1, 4))):
            key = draw(
                st.sampled_from([*KEYS, None]) if draw(st.booleans()) else st.sampled_from(KEYS)
            )
            tombstone = key is not None and draw(st.integers(0, 3)) == 0
            batch.append(RecordFacts(offset, key, has_value=not tombstone))
            offset += 1
        batches.append(batch)
    return batches


Batch = tuple[BatchFacts, list[RecordFacts]]


def as_batches(groups: list[list[RecordFacts]], producer_id: int = -1) -> list[Batch]:
    return [(BatchFacts(g[0].offset, g[-1].offset, producer_id), g) for g in groups]


def clean_round(
    log_batches: list[Batch], dirty_start: int, dirty_end: int, now: int, m: OffsetMap
) -> list[Batch]:
    """One round the way the cleaner runs it: map [dirty_start, dirty_end), then filter every
    batch of the log below the map's latest offset; batches above it are not read."""
    m.clear()
    for batch, records in log_batches:
        in_range = dirty_start <= batch.base_offset < dirty_end
        if in_range and add_batch_to_offset_map(m, batch, records, dirty_start):
            break
    out: list[Batch] = []
    for batch, records in log_batches:
        if batch.base_offset > m.latest_offset:
            out.append((batch, records))
            continue
        d = filter_batch(batch, records, m, now, RETENTION, {}, m.latest_offset + 1)
        written = BatchFacts(batch.base_offset, batch.last_offset, -1, d.delete_horizon_ms)
        if d.action is BatchAction.KEEP:  # the writer copies the batch's bytes as they are
            assert d.delete_horizon_ms == batch.delete_horizon_ms
            out.append((batch, records))
        elif d.action is BatchAction.REWRITE:
            out.append((written, list(d.retained)))
        elif d.action is BatchAction.EMPTY:
            out.append((written, []))
    return out


def records_of(batches: list[Batch]) -> list[RecordFacts]:
    return [r for _, rs in batches for r in rs]


def latest_per_key(records: list[RecordFacts]) -> dict[bytes, RecordFacts]:
    latest: dict[bytes, RecordFacts] = {}
    for r in records:
        if r.key is not None:
            latest[r.key] = r
    return latest


@settings(max_examples=300, deadline=None)
@given(
    first=writes(0, 12),
    second=writes(1000, 8),
    tail=writes(2000, 3),
    t2_after=st.integers(-2 * RETENTION, 2 * RETENTION),
)
def test_rounds_keep_each_keys_latest_record_and_expire_tombstones_after_the_horizon(
    first: list[list[RecordFacts]],
    second: list[list[RecordFacts]],
    tail: list[list[RecordFacts]],
    t2_after: int,
) -> None:
    m = OffsetMap(24 * 64)  # holds every key: each round covers its whole dirty range
    t1 = NOW
    t2 = t1 + RETENTION + t2_after

    # Round 1 over the first writes, all dirty; the tail is uncleanable (above the round).
    log_batches = as_batches(first) + as_batches(tail)
    after1 = clean_round(log_batches, 0, 1000, t1, m)
    kept1 = records_of(after1)
    expected1 = sorted(
        latest_per_key(records_of(as_batches(first))).values(), key=lambda r: r.offset
    )
    tail_records = records_of(as_batches(tail))
    if first:
        assert kept1 == expected1 + tail_records  # tombstones stay: none had a horizon yet
    else:
        assert kept1 == tail_records
    # A batch carries a delete horizon, t1 + delete.retention.ms, iff it kept a tombstone.
    for batch, records in after1:
        if batch.base_offset < 1000:
            tombstone = any(not r.has_value for r in records)
            assert batch.delete_horizon_ms == (t1 + RETENTION if tombstone else None)

    # Round 2: more writes, dirty from 1000; the round-1 output is the clean part.
    cleaned1 = [b for b in after1 if b[0].base_offset < 1000]
    log2 = cleaned1 + as_batches(second) + as_batches(tail)
    after2 = clean_round(log2, 1000, 2000, t2, m)
    kept2 = records_of(after2)
    below_tail = records_of(cleaned1) + records_of(as_batches(second))
    survivors = [
        r
        for r in latest_per_key(below_tail).values()
        # A tombstone from round 1 goes once t2 reaches its horizon; round 2's keep theirs.
        if r.has_value or r.offset >= 1000 or t2 < t1 + RETENTION
    ]
    if second:
        assert kept2 == sorted(survivors, key=lambda r: r.offset) + tail_records
    else:
        assert kept2 == kept1  # nothing dirty: the round covers nothing and changes nothing
    offsets = [r.offset for r in kept2]
    assert offsets == sorted(set(offsets))
    # A horizon, once set, stays: round 1's tombstones keep t1's, round 2's get t2's.
    for batch, records in after2:
        if any(not r.has_value for r in records) and batch.base_offset < 2000:
            assert batch.delete_horizon_ms == (t1 if batch.base_offset < 1000 else t2) + RETENTION


@settings(max_examples=200, deadline=None)
@given(batches=writes(0, 15), slots=st.integers(2, 6))
def test_a_full_map_cleans_only_what_it_covered(
    batches: list[list[RecordFacts]], slots: int
) -> None:
    # A map of `slots` slots at load factor 0.5 covers a prefix of the dirty part; every record
    # after its latest offset is untouched, and within the prefix each key keeps its latest.
    m = OffsetMap(24 * slots * 2, load_factor=0.5)
    log_batches = as_batches(batches)
    after = records_of(clean_round(log_batches, 0, 1000, NOW, m))
    covered = m.latest_offset
    all_records = records_of(log_batches)
    prefix = [r for r in all_records if r.offset <= covered]
    rest = [r for r in all_records if r.offset > covered]
    assert m.size <= m.max_entries
    assert after == sorted(latest_per_key(prefix).values(), key=lambda r: r.offset) + rest
    # The round made progress whenever there was a keyed record to map.
    if any(r.key is not None for r in all_records):
        assert covered >= min(r.offset for r in all_records if r.key is not None)
