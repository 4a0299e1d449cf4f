"""Idempotent-producer state (broker/replication/producer_state.py).

Reference: docs/design.md §8.5 (a retried batch is stored once), docs/protocol.md §5,
Kafka's ProducerAppendInfo sequence/epoch rules, KIP-360 for unknown producers.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.broker.replication.producer_state import (
    BATCHES_PER_PRODUCER,
    ProducerStateManager,
    assign_offsets,
)
from minibroker.client.batch import iter_batches
from minibroker.client.errors import ErrorCode
from minibroker.client.records import encode_batch

PID = 42


def state_with(*batches: tuple[int, int, int, int, int]) -> ProducerStateManager:
    """(epoch, first seq, last seq, first offset, last offset) per batch of producer PID."""
    state = ProducerStateManager()
    for epoch, first_seq, last_seq, first_offset, last_offset in batches:
        state.record(PID, epoch, first_seq, last_seq, first_offset, last_offset)
    return state


def check(state: ProducerStateManager, epoch: int, first_seq: int, last_seq: int):  # type: ignore[no-untyped-def]
    verdict, _ = state.check_batches([(PID, epoch, first_seq, last_seq)])
    return verdict


def test_next_in_sequence_is_accepted_and_a_gap_is_refused() -> None:
    state = state_with((0, 0, 4, 0, 4))
    assert check(state, 0, 5, 9).error == ErrorCode.NONE
    assert check(state, 0, 7, 9).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_duplicate_of_one_of_the_last_five_returns_the_original_offsets() -> None:
    state = state_with(*[(0, 2 * i, 2 * i + 1, 100 + 2 * i, 101 + 2 * i) for i in range(6)])
    entry = state.entry(PID)
    assert entry is not None and len(entry.batches) == BATCHES_PER_PRODUCER
    verdict = check(state, 0, 4, 5)
    assert verdict.duplicate is not None
    assert (verdict.duplicate.first_offset, verdict.duplicate.last_offset) == (104, 105)
    # The oldest batch fell out of the window: a retry of it is out of sequence, not a dup.
    assert check(state, 0, 0, 1).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_epoch_rules() -> None:
    state = state_with((3, 0, 9, 0, 9))
    assert check(state, 2, 10, 10).error == ErrorCode.INVALID_PRODUCER_EPOCH
    assert check(state, 4, 0, 0).error == ErrorCode.NONE
    assert check(state, 4, 10, 10).error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_unknown_producer_is_accepted_at_any_sequence_kip_360() -> None:
    assert check(ProducerStateManager(), 0, 17, 20).error == ErrorCode.NONE


def test_sequences_wrap_at_int32_max() -> None:
    top = (1 << 31) - 1
    state = state_with((0, top - 1, top, 0, 1))
    assert check(state, 0, 0, 3).error == ErrorCode.NONE


def test_batches_of_one_request_are_checked_in_order() -> None:
    state = state_with((0, 0, 0, 0, 0))
    verdict, index = state.check_batches([(PID, 0, 1, 2), (PID, 0, 3, 3), (PID, 0, 9, 9)])
    assert verdict.error == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and index == 2
    verdict, index = state.check_batches([(PID, 0, 1, 2), (PID, 0, 3, 3), (-1, -1, -1, -1)])
    assert verdict.error == ErrorCode.NONE and index == -1
    assert state.entry(PID).last_seq == 0  # type: ignore[union-attr]  # checking changes nothing


def test_rebuild_from_log_headers_and_truncate() -> None:
    log = b"".join(
        encode_batch(
            [(0, None, b"v", ())] * 2,
            base_offset=2 * i,
            producer_id=PID,
            producer_epoch=0,
            base_sequence=2 * i,
        )
        for i in range(3)
    )
    state = ProducerStateManager()
    state.rebuild(h for _, h in iter_batches(log))
    assert state.entry(PID).last_seq == 5  # type: ignore[union-attr]
    state.truncate_to(4)
    assert state.entry(PID).last_seq == 3  # type: ignore[union-attr]
    assert check(state, 0, 4, 5).error == ErrorCode.NONE
    state.truncate_to(0)
    assert state.entry(PID) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=20), st.data())
def test_a_retried_batch_is_stored_once(sizes: list[int], data: st.DataObject) -> None:
    """docs/design.md §8.5: replaying any recent batch never appends it a second time."""
    state = ProducerStateManager()
    seq = offset = 0
    log: list[tuple[int, int, int, int]] = []
    for size in sizes:
        verdict, _ = state.check_batches([(PID, 0, seq, seq + size - 1)])
        assert verdict.error == ErrorCode.NONE and verdict.duplicate is None
        state.record(PID, 0, seq, seq + size - 1, offset, offset + size - 1)
        log.append((seq, seq + size - 1, offset, offset + size - 1))
        seq += size
        offset += size
    recent = log[-BATCHES_PER_PRODUCER:]
    first_seq, last_seq, first_offset, last_offset = data.draw(st.sampled_from(recent))
    verdict, _ = state.check_batches([(PID, 0, first_seq, last_seq)])
    assert verdict.duplicate is not None
    assert (verdict.duplicate.first_offset, verdict.duplicate.last_offset) == (
        first_offset,
        last_offset,
    )


def test_a_leader_append_stamps_consecutive_offsets_and_records_client_batches_only() -> None:
    raw = (
        encode_batch([(0, None, b"a", ())] * 3, producer_id=PID, producer_epoch=1, base_sequence=5)
        + encode_batch([(0, None, b"b", ())] * 2)  # no producer id: not recorded
        + encode_batch([(0, None, b"c", ())], producer_id=PID, producer_epoch=1, base_sequence=8)
    )
    headers = [h for _, h in iter_batches(raw)]
    next_offset, stamped = assign_offsets(10, headers)
    assert next_offset == 16
    assert stamped == ((PID, 1, 5, 7, 10, 12), (PID, 1, 8, 8, 15, 15))
