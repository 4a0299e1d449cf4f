"""The consumer over a compacted log (issue 21): offsets skipped between batches and inside
them, batches with no record left, records below the position. The position goes to the next
offset of the last batch read (Kafka's nextFetchOffset), with that batch's epoch, so polls move
past the gaps, never fetch them again, and a leader change validates the position with an
epoch the new leader knows (KIP-320)."""

from __future__ import annotations

from gapped_batches import cleaned_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.client.batch import read_header
from minibroker.client.completed_fetch import decode_into
from minibroker.client.records import decode_batch
from minibroker.client.subscription import FetchState, SubscriptionState, truncation_point
from minibroker.client.types import TopicPartition

TP = TopicPartition("changes", 0)
LIMIT = 1 << 26


def subscribed(position: int) -> SubscriptionState:
    subs = SubscriptionState("earliest")
    subs.assign([TP])
    subs.states[TP].seek(position)
    return subs


def test_trailing_removed_offsets_are_passed_once_everything_is_handed_out() -> None:
    subs = subscribed(0)
    state = subs.states[TP]
    raw = cleaned_batch(0, [(0, b"a", b"1"), (2, b"b", b"2")], 5, epoch=3)
    raw += cleaned_batch(9, [(9, b"c", b"3")], 12, epoch=4)
    assert decode_into(state, raw, LIMIT)
    assert state.fetch_offset == 13
    first = subs.drain(1)
    assert [r.offset for r in first] == [0]
    assert state.position == 1  # records are left: the position follows the record
    rest = subs.drain(10)
    assert [r.offset for r in rest] == [2, 9]
    assert state.position == 13  # the next offset of the last batch, past 10..12
    assert state.position_epoch == 4
    state.check()


def test_a_batch_with_no_record_left_moves_the_position() -> None:
    subs = subscribed(4)
    state = subs.states[TP]
    assert decode_into(state, cleaned_batch(4, [], 8, epoch=6), LIMIT)
    assert list(state.buffer) == []
    assert (state.position, state.position_epoch, state.fetch_offset) == (9, 6, 9)
    assert subs.drain(10) == []
    assert state.position == 9
    state.check()


def test_a_batch_whose_records_all_lie_below_the_position_moves_it() -> None:
    subs = subscribed(7)  # inside the batch, past its last record
    state = subs.states[TP]
    raw = cleaned_batch(3, [(3, b"a", b"1"), (5, b"b", b"2")], 10, epoch=2)
    assert decode_into(state, raw, LIMIT)
    assert list(state.buffer) == []
    assert (state.position, state.fetch_offset) == (11, 11)
    state.check()


def test_the_position_waits_for_records_still_buffered() -> None:
    subs = subscribed(0)
    state = subs.states[TP]
    decode_into(state, cleaned_batch(0, [(1, b"a", b"1")], 3, epoch=1), LIMIT)
    assert state.position == 0 and state.fetch_offset == 4
    # A later answer with an empty batch while a record waits: the position stays below it.
    decode_into(state, cleaned_batch(4, [], 6, epoch=1), LIMIT)
    assert state.position == 0 and state.fetch_offset == 7
    assert [r.offset for r in subs.drain(5)] == [1]
    assert state.position == 7
    state.check()


def test_a_leader_change_validates_with_the_epoch_of_the_last_batch() -> None:
    """Past an empty batch of epoch 6 the position carries epoch 6: the new leader's end of
    epoch 6 (at or above the position) does not look like a truncation. With the epoch of the
    last record (3, ending at 4 on the leader) it would."""
    subs = subscribed(0)
    state = subs.states[TP]
    decode_into(state, cleaned_batch(0, [(0, b"a", b"1")], 3, epoch=3), LIMIT)
    subs.drain(5)
    decode_into(state, cleaned_batch(4, [], 9, epoch=6), LIMIT)
    assert (state.position, state.position_epoch) == (10, 6)
    state.observe_leader_epoch(6)
    state.observe_leader_epoch(7)
    assert state.fetch_state is FetchState.AWAIT_VALIDATION
    assert state.fetch_offset == 10
    assert truncation_point(state.position, 6, 10) == (False, None)
    assert truncation_point(state.position, 3, 4)[0]


@st.composite
def gapped_logs(draw: st.DrawFn) -> list[bytes]:
    """Batches of a compacted log: gaps between batches, removed offsets inside them."""
    batches = []
    offset = draw(st.integers(0, 5))
    for _ in range(draw(st.integers(1, 12))):
        offset += draw(st.integers(0, 4))  # a gap before the batch
        span = draw(st.integers(1, 6))
        kept = draw(st.sets(st.integers(offset, offset + span - 1), max_size=span))
        records = [(o, b"k%d" % o, b"v%d" % o) for o in sorted(kept)]
        batches.append(cleaned_batch(offset, records, offset + span - 1, epoch=1))
        offset += span
    return batches


@settings(max_examples=120, deadline=None)
@given(batches=gapped_logs(), data=st.data())
def test_polls_over_a_gapped_log_give_every_record_once_and_end_past_it(
    batches: list[bytes], data: st.DataObject
) -> None:
    headers = [read_header(b) for b in batches]
    start = data.draw(st.integers(0, headers[-1].next_offset))
    subs = subscribed(start)
    state = subs.states[TP]
    got: list[int] = []
    while state.fetch_offset < headers[-1].next_offset:
        # The broker serves whole batches from the one holding the fetch offset (or the next
        # one when it falls in a gap), as many as the answer holds.
        first = next(i for i, h in enumerate(headers) if h.last_offset >= state.fetch_offset)
        count = data.draw(st.integers(1, len(batches) - first))
        assert decode_into(state, b"".join(batches[first : first + count]), LIMIT)
        while state.buffer:
            before = state.position
            taken = subs.drain(data.draw(st.integers(1, 4)))
            assert taken and before is not None and taken[0].offset >= before
            got += [r.offset for r in taken]
        state.check()
    expected = [r.offset for raw in batches for r in decode_batch(raw).records if r.offset >= start]
    assert got == expected
    assert state.position == headers[-1].next_offset
