"""The broker's fetch purgatory (broker/purgatory.py): KeySignals for long-poll fetches.

asyncio tests on one event loop, no sockets. What they prove (bounded purgatories,
docs/protocol.md §12):
- KeySignals.wait_any returns True when one of its keys is notified and False at its timeout;
  `notify(key)` wakes every waiter on that key and only those; a notify with nobody waiting is
  not remembered (the fetch loop re-reads before it parks, so nothing is lost);
- the capacity bound raises PurgatoryFullError instead of parking, and a slot frees when a
  waiter leaves by any exit (notified, timed out, cancelled);
- no key keeps an empty waiter set after its waiters left (a long-running broker sees many
  partitions come and go).
"""

from __future__ import annotations

import asyncio

import pytest

from minibroker.broker.purgatory import KeySignals, PurgatoryFullError

# Long enough never to pass in a test that expects a wake-up; the tests that expect a timeout
# use a short one and assert only the outcome, never how long it took.
NEVER_S = 60.0
SHORT_S = 0.01
DEADLINE_S = 10.0


async def until(predicate: object, what: str) -> None:
    """Yield to the loop until `predicate()` holds (a deadline, never a fixed sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not predicate():  # type: ignore[operator]
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0)


def start_wait(
    signals: KeySignals, keys: list[str], timeout_s: float = NEVER_S
) -> asyncio.Task[bool]:
    return asyncio.ensure_future(signals.wait_any(keys, timeout_s))


# -- KeySignals ---------------------------------------------------------------------------------


async def test_notify_wakes_every_waiter_on_the_key_with_true() -> None:
    signals = KeySignals(capacity=10)
    waiters = [start_wait(signals, ["a"]) for _ in range(3)]
    await until(lambda: len(signals) == 3, "three parked waiters")
    signals.notify("a")
    assert await asyncio.wait_for(asyncio.gather(*waiters), DEADLINE_S) == [True, True, True]
    assert len(signals) == 0


async def test_notify_wakes_only_the_waiters_of_that_key() -> None:
    signals = KeySignals(capacity=10)
    on_a = start_wait(signals, ["a"])
    on_b = start_wait(signals, ["b"])
    await until(lambda: len(signals) == 2, "two parked waiters")
    signals.notify("a")
    assert await asyncio.wait_for(on_a, DEADLINE_S) is True
    assert not on_b.done(), "a notify on 'a' woke a waiter on 'b'"
    assert len(signals) == 1
    signals.notify("b")
    assert await asyncio.wait_for(on_b, DEADLINE_S) is True


async def test_a_waiter_on_several_keys_wakes_on_any_and_leaves_every_key() -> None:
    signals = KeySignals(capacity=10)
    both = start_wait(signals, ["a", "b", "c"])
    only_a = start_wait(signals, ["a"])
    await until(lambda: len(signals) == 2, "two parked waiters")
    signals.notify("b")
    assert await asyncio.wait_for(both, DEADLINE_S) is True
    assert len(signals) == 1
    # The woken waiter is gone from 'a' and 'c' too: only the other waiter is left on 'a', and
    # 'b' and 'c' keep no empty sets behind (checked on the private map: nothing else shows it).
    assert signals._waiting == {"a": signals._waiting["a"]}
    assert len(signals._waiting["a"]) == 1
    # Notifying a key twice, or two keys of the same waiter, is harmless.
    signals.notify("c")
    signals.notify("a")
    signals.notify("a")
    assert await asyncio.wait_for(only_a, DEADLINE_S) is True
    assert signals._waiting == {}


async def test_timeout_returns_false_and_frees_the_slot() -> None:
    signals = KeySignals(capacity=1)
    assert await signals.wait_any(["a"], SHORT_S) is False
    assert len(signals) == 0
    assert signals._waiting == {}
    # The slot is free again: a second wait parks (and is woken) instead of raising.
    again = start_wait(signals, ["a"])
    await until(lambda: len(signals) == 1, "the second waiter parked")
    signals.notify("a")
    assert await asyncio.wait_for(again, DEADLINE_S) is True


@pytest.mark.parametrize("timeout_s", [0.0, -1.0])
async def test_no_time_left_returns_false_without_parking(timeout_s: float) -> None:
    signals = KeySignals(capacity=1)
    holder = start_wait(signals, ["a"])
    await until(lambda: len(signals) == 1, "the purgatory full")
    # Even a full purgatory answers a wait with no time left (the fetch answers with what it has).
    assert await signals.wait_any(["a"], timeout_s) is False
    assert len(signals) == 1
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder


async def test_a_notify_with_nobody_waiting_is_not_remembered() -> None:
    signals = KeySignals(capacity=10)
    signals.notify("a")
    assert signals._waiting == {}
    assert await signals.wait_any(["a"], SHORT_S) is False


async def test_capacity_raises_purgatory_full_and_frees_on_each_exit() -> None:
    signals = KeySignals(capacity=2)
    first = start_wait(signals, ["a"])
    second = start_wait(signals, ["b"])
    await until(lambda: len(signals) == 2, "the purgatory full")
    with pytest.raises(PurgatoryFullError) as raised:
        await asyncio.wait_for(signals.wait_any(["c"], NEVER_S), DEADLINE_S)
    assert "already waiting" in str(raised.value)
    assert len(signals) == 2, "a refused wait was counted"
    assert set(signals._waiting) == {"a", "b"}, "a refused wait left its key behind"

    signals.notify("a")  # exit by notify
    assert await asyncio.wait_for(first, DEADLINE_S) is True
    third = start_wait(signals, ["c"], SHORT_S)  # exit by timeout
    assert await asyncio.wait_for(third, DEADLINE_S) is False
    second.cancel()  # exit by cancellation
    with pytest.raises(asyncio.CancelledError):
        await second
    assert len(signals) == 0
    assert signals._waiting == {}


async def test_cancellation_cleans_up_and_a_later_notify_or_timer_is_harmless() -> None:
    signals = KeySignals(capacity=1)
    task = start_wait(signals, ["a", "b"], timeout_s=SHORT_S * 5)
    await until(lambda: len(signals) == 1, "the waiter parked")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(signals) == 0
    assert signals._waiting == {}
    signals.notify("a")
    # The cancelled wait's timer was cancelled with it; a new wait on the freed slot sees only
    # its own outcome (a stale timer firing would be swallowed by the done() check either way).
    assert await signals.wait_any(["a"], SHORT_S * 10) is False
    assert len(signals) == 0


async def test_notified_and_cancelled_in_the_same_turn_still_cleans_up() -> None:
    signals = KeySignals(capacity=1)
    task = start_wait(signals, ["a"])
    await until(lambda: len(signals) == 1, "the waiter parked")
    signals.notify("a")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(signals) == 0
    assert signals._waiting == {}


async def test_many_rounds_leave_nothing_behind() -> None:
    """A long poll per round, woken or timed out alternately: the count and the map stay empty."""
    signals = KeySignals(capacity=3)
    for i in range(50):
        keys = [f"p{i % 7}", f"p{(i + 1) % 7}"]
        if i % 2:
            assert await signals.wait_any(keys, 0.001) is False
        else:
            task = start_wait(signals, keys)
            await until(lambda: len(signals) == 1, "the waiter parked")
            signals.notify(keys[1])
            assert await asyncio.wait_for(task, DEADLINE_S) is True
        assert len(signals) == 0
        assert signals._waiting == {}
