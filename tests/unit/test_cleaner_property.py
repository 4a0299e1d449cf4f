"""Property test of the log cleaner (issue 21): for any sequence of keyed writes, tombstones,
segment rolls and cleaner rounds (with a map large or small enough to fill, and tombstones kept
for no time, a while, or ever), reading the log from the start gives each key's latest value,
or nothing once its tombstone may have expired, with strictly increasing offsets, every record
the one written at its offset; and the log loads back the same.
"""

from __future__ import annotations

import dataclasses
import pathlib
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minibroker.broker.cleaner.cleaner import Cleaner
from minibroker.broker.cleaner.offset_map import OffsetMap
from tests.unit.cleaner_support import CONFIG, open_log, read_all, to_clean, write

KEYS = [b"a", b"b", b"c", b"d", b"e", b"f"]
FOREVER = 10**12
records = st.lists(
    st.tuples(st.sampled_from(KEYS), st.one_of(st.none(), st.binary(min_size=1, max_size=6))),
    min_size=1,
    max_size=4,
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("write"), records, st.booleans()),
        st.tuples(st.just("roll")),
        st.tuples(st.just("clean"), st.integers(0, 300), st.booleans()),
    ),
    max_size=40,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=operations,
    retention=st.sampled_from([0, 100, FOREVER]),
    map_slots=st.sampled_from([3, 1000]),
)
def test_reading_from_the_start_gives_each_keys_latest_value(
    ops: list[tuple[object, ...]], retention: int, map_slots: int
) -> None:
    config = dataclasses.replace(CONFIG, segment_bytes=400, delete_retention_ms=retention)
    with tempfile.TemporaryDirectory() as tmp:
        directory = pathlib.Path(tmp) / "changes-0"
        log = open_log(directory, config)
        cleaner = Cleaner(OffsetMap(24 * map_slots, load_factor=0.9))
        written: dict[int, tuple[bytes, bytes | None]] = {}
        latest: dict[bytes, tuple[int, bytes | None]] = {}
        now = 1_000
        sequence = 0
        checkpoint: int | None = None
        for op in ops:
            if op[0] == "write":
                batch, idempotent = op[1], op[2]
                assert isinstance(batch, list)
                producer = (4, 0, sequence) if idempotent else None
                base = write(log, batch, ts=now, producer=producer)
                sequence += len(batch) if idempotent else 0
                for i, (key, value) in enumerate(batch):
                    written[base + i] = (key, value)
                    latest[key] = (base + i, value)
            elif op[0] == "roll":
                log.roll(now_ms=now)
            else:
                advance, roll_first = op[1], op[2]
                assert isinstance(advance, int)
                now += advance
                if roll_first:  # all written so far becomes cleanable
                    log.roll(now_ms=now)
                stats = cleaner.clean(log, to_clean(log, now, checkpoint), now)
                checkpoint = stats.end_offset if stats.segments_after else checkpoint
                check(log, written, latest, retention)
        after = check(log, written, latest, retention)
        log.flush()
        log.close()
        reloaded = open_log(directory, config)
        assert read_all(reloaded) == after
        reloaded.close()


def check(
    log: object,
    written: dict[int, tuple[bytes, bytes | None]],
    latest: dict[bytes, tuple[int, bytes | None]],
    retention: int,
) -> list[object]:
    records = read_all(log)  # type: ignore[arg-type]
    offsets = [r.offset for r in records]
    assert offsets == sorted(set(offsets))
    last_read: dict[bytes | None, tuple[int, bytes | None]] = {}
    for r in records:
        assert written[r.offset] == (r.key, r.value)
        last_read[r.key] = (r.offset, r.value)
    for key, (offset, value) in latest.items():
        if value is not None or retention == FOREVER:
            assert last_read.get(key) == (offset, value), key
        else:  # a tombstone: read last, or gone with everything before it
            assert last_read.get(key, (offset, None)) == (offset, None), key
    assert set(last_read) <= set(latest)
    return records
