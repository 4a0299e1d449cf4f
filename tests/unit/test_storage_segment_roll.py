"""Time-based segment rolls (segment.ms) with record timestamps far from the broker's clock.

A segment rolls by time when the (clamped) timestamp of a new append is more than segment.ms
after the segment's roll clock start (broker/storage/segment.py, `roll_clock`). Timestamps count
for at most the broker's clock and at least the clock minus retention.ms, so:
  * a stream of batches each 8 days after the last (the issue's case) rolls by the broker's
    clock, not once per batch;
  * batches far in the past, in any order or mixed with recent ones, do not roll each batch;
  * an ordinary stream (timestamps near the clock) rolls every segment.ms as before, and a
    follower catching up history rolls by record time, as Kafka's followers do.
The far-from-now cases go through follower appends too: the leader's timestamp validation
(message.timestamp.*.max.ms) never applies there.
"""

from __future__ import annotations

import os
import pathlib
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.log import PartitionLog
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition

TP = TopicPartition("orders", 0)
NOW = 1_700_000_000_000
HOUR = 3_600_000
DAY = 24 * HOUR
WEEK = 7 * DAY
# Hypothesis runs many logs: tmpfs keeps their files off a loaded CI disk.
SCRATCH = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def batch(ts: int, *, base_offset: int = 0, epoch: int = 0, count: int = 1) -> bytes:
    return encode_batch(
        [(ts, None, b"v", ()) for _ in range(count)],
        base_offset=base_offset,
        partition_leader_epoch=epoch,
    )


def open_log(path: pathlib.Path, now_ms: int = NOW, **config: int) -> PartitionLog:
    return PartitionLog.open(path / "orders-0", TP, LogConfig(**config), now_ms=now_ms)


class Feeder:
    """Appends batches with given timestamps as a leader or as a follower, clock injected."""

    def __init__(self, log: PartitionLog, follower: bool) -> None:
        self.log = log
        self.follower = follower

    def append(self, timestamps: list[int], now_ms: int) -> None:
        if self.follower:
            chunk = b"".join(
                batch(ts, base_offset=self.log.leo + i) for i, ts in enumerate(timestamps)
            )
            self.log.append_as_follower(chunk, now_ms=now_ms)
        else:
            records = b"".join(batch(ts) for ts in timestamps)
            self.log.append_as_leader(records, leader_epoch=0, now_ms=now_ms)


def test_batches_stamped_8_days_apart_do_not_roll_a_segment_each(tmp_path: pathlib.Path) -> None:
    # The case on a follower (no timestamp validation there): 300 batches, each
    # stamped 8 days after the last, arriving 10 ms apart. Kafka's rule rolled before each.
    log = open_log(tmp_path)
    feeder = Feeder(log, follower=True)
    for k in range(300):
        feeder.append([NOW + (k + 1) * 8 * DAY], now_ms=NOW + 10 * k)
    assert len(log.segments) == 1
    assert log.leo == 300


def test_future_stamped_batches_roll_by_the_broker_clock(tmp_path: pathlib.Path) -> None:
    # Still a time roll once segment.ms of broker time has passed: 3 days of appends an hour
    # apart, each stamped ever further ahead, with segment.ms = 1 day.
    log = open_log(tmp_path, segment_ms=DAY)
    feeder = Feeder(log, follower=True)
    for k in range(72):
        feeder.append([NOW + (k + 1) * 8 * DAY], now_ms=NOW + k * HOUR)
    assert [s.base_offset for s in log.segments] == [0, 25, 50]


def test_a_far_future_first_batch_does_not_hold_the_segment_open(tmp_path: pathlib.Path) -> None:
    # Kafka measured from the first batch's timestamp: one stamped a century ahead kept the
    # segment from ever rolling by time.
    log = open_log(tmp_path, segment_ms=DAY)
    feeder = Feeder(log, follower=True)
    feeder.append([NOW + 100 * 365 * DAY], now_ms=NOW)
    for k in range(1, 30):
        feeder.append([NOW + k * HOUR], now_ms=NOW + k * HOUR)
    assert [s.base_offset for s in log.segments] == [0, 25]


def test_batches_far_in_the_past_in_any_order_do_not_roll_each(tmp_path: pathlib.Path) -> None:
    # retention.ms (a week): anything older counts as a week old. Kafka's rule rolled before
    # every batch more than segment.ms after the segment's first one.
    log = open_log(tmp_path)
    feeder = Feeder(log, follower=True)
    for k in range(200):
        ts = (k * 7_919 % 200) * 30 * DAY  # 0 .. 16 years after 1970, shuffled
        feeder.append([ts], now_ms=NOW + k)
    assert len(log.segments) == 1


def test_batches_far_in_the_past_roll_by_the_broker_clock(tmp_path: pathlib.Path) -> None:
    # 1970 timestamps arriving an hour apart for 3 days, segment.ms = 1 day: a roll a day.
    log = open_log(tmp_path, segment_ms=DAY)
    feeder = Feeder(log, follower=True)
    for k in range(72):
        feeder.append([k], now_ms=NOW + k * HOUR)
    assert [s.base_offset for s in log.segments] == [0, 25, 50]


def test_appends_mixing_old_and_new_batches_roll_at_most_once(tmp_path: pathlib.Path) -> None:
    # Each append holds a 30-day-old batch and a current one. Kafka decided on the append's
    # largest timestamp but restarted the clock at its first batch (the old one): a roll
    # before every append.
    for follower in (False, True):
        log = open_log(tmp_path / str(follower), retention_ms=-1)
        feeder = Feeder(log, follower=follower)
        for k in range(50):
            feeder.append([NOW - 30 * DAY + k, NOW + k], now_ms=NOW + k)
        assert len(log.segments) <= 2, follower


def test_ordinary_stream_rolls_every_segment_ms(tmp_path: pathlib.Path) -> None:
    # Timestamps = the broker's clock, one batch every 10 minutes, segment.ms = 1 hour: the
    # batch at 70 minutes rolls (70 > 60), then the one at 140.
    for follower in (False, True):
        log = open_log(tmp_path / str(follower), segment_ms=HOUR)
        feeder = Feeder(log, follower=follower)
        for k in range(15):
            now = NOW + k * 10 * 60_000
            feeder.append([now], now_ms=now)
        assert [s.base_offset for s in log.segments] == [0, 7, 14], follower


def test_quiet_segment_rolls_on_the_first_batch_after_segment_ms(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path, segment_ms=HOUR)
    feeder = Feeder(log, follower=False)
    feeder.append([NOW], now_ms=NOW)
    feeder.append([NOW + HOUR], now_ms=NOW + HOUR)  # waited exactly segment.ms: no roll
    assert len(log.segments) == 1
    feeder.append([NOW + HOUR + 1], now_ms=NOW + HOUR + 1)
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_batches_without_timestamps_roll_by_the_broker_clock(tmp_path: pathlib.Path) -> None:
    log = open_log(tmp_path, segment_ms=HOUR)
    feeder = Feeder(log, follower=True)
    for k in range(9):
        feeder.append([-1], now_ms=NOW + k * 10 * 60_000)
    assert [s.base_offset for s in log.segments] == [0, 7]


def test_follower_catching_up_history_rolls_by_record_time(tmp_path: pathlib.Path) -> None:
    # 10 days of history (one batch an hour) fetched in chunks of 6 within a second, with
    # retention.ms -1: the segments split the history by day, as the leader's did.
    log = open_log(tmp_path, segment_ms=DAY, retention_ms=-1)
    feeder = Feeder(log, follower=True)
    start = NOW - 10 * DAY
    stamps = [start + h * HOUR for h in range(240)]
    for i in range(0, 240, 6):
        feeder.append(stamps[i : i + 6], now_ms=NOW + i)
    assert 9 <= len(log.segments) <= 11
    for segment in log.segments[:-1]:
        first = stamps[segment.base_offset]
        assert segment.max_timestamp_so_far - first <= DAY + 6 * HOUR


_TIMESTAMPS = st.one_of(
    st.just(-1),
    st.integers(0, 2**62),
    st.integers(-3 * WEEK, 3 * WEEK).map(lambda d: NOW + d),
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    appends=st.lists(
        st.tuples(st.lists(_TIMESTAMPS, min_size=1, max_size=4), st.integers(0, 2 * DAY)),
        min_size=1,
        max_size=60,
    ),
    follower=st.booleans(),
    segment_ms=st.sampled_from([HOUR, DAY, WEEK]),
    retention_ms=st.sampled_from([0, DAY, WEEK]),
)
def test_time_rolls_are_bounded_by_the_broker_clock(
    appends: list[tuple[list[int], int]],
    follower: bool,
    segment_ms: int,
    retention_ms: int,
) -> None:
    """Whatever the timestamps: at most 1 + (elapsed broker time + retention.ms) / segment.ms
    segments (no size rolls here)."""
    with tempfile.TemporaryDirectory(dir=SCRATCH) as scratch:
        log = open_log(pathlib.Path(scratch), segment_ms=segment_ms, retention_ms=retention_ms)
        feeder = Feeder(log, follower=follower)
        now = NOW
        for timestamps, step in appends:
            now += step
            if not follower:
                # The leader's validation refuses timestamps ahead of its clock (beyond
                # message.timestamp.after.max.ms); followers take what the leader stored.
                timestamps = [min(ts, now) for ts in timestamps]
            feeder.append(timestamps, now_ms=now)
        elapsed = now - NOW
        assert len(log.segments) <= 1 + (elapsed + retention_ms) // segment_ms
        log.close()


def test_one_append_into_an_empty_segment_splits_by_record_time(tmp_path: pathlib.Path) -> None:
    # A follower's one fetch holding batches 2 days apart, segment.ms one day: the empty active
    # segment's clock starts at the first batch, so each batch begins a segment of its own.
    log = open_log(tmp_path, segment_ms=DAY, retention_ms=-1)
    start = NOW - 10 * DAY
    chunk = b"".join(batch(start + 2 * DAY * i, base_offset=i) for i in range(3))
    log.append_as_follower(chunk, now_ms=NOW)
    assert [s.base_offset for s in log.segments] == [0, 1, 2]
    assert log.leo == 3


def test_a_batch_past_the_segment_index_range_rolls_first(tmp_path: pathlib.Path) -> None:
    # Offsets are indexed relative to the segment base in an int32: a batch whose last offset
    # does not fit starts a new segment (Kafka's LogSegment.shouldRoll, canConvertToRelative).
    import struct

    from minibroker.client.batch import ATTRIBUTES_OFFSET, CRC_OFFSET, crc_of

    log = open_log(tmp_path)
    log.append_as_follower(batch(NOW, base_offset=0), now_ms=NOW)
    wide = bytearray(batch(NOW, base_offset=1))
    struct.pack_into(">i", wide, ATTRIBUTES_OFFSET + 2, 2**31 - 1)  # lastOffsetDelta
    struct.pack_into(">I", wide, CRC_OFFSET, crc_of(wide, ATTRIBUTES_OFFSET, len(wide)))
    log.append_as_follower(bytes(wide), now_ms=NOW)
    assert [s.base_offset for s in log.segments] == [0, 1]
    assert log.leo == 2**31 + 1
