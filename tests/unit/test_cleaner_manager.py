"""The log cleaner's broker side (broker/cleaner/manager.py): the `cleaner-offset-checkpoint` file
in Kafka's format, the state machine of Kafka's LogCleanerManager (in progress, aborted, paused,
uncleanable, checkpoint updates and clamping), the facts built from a real PartitionLog, and the
threads: a round runs off the loop and its `on_loop` calls run on the loop; an abort refuses the
round's swap; a failure marks the log uncleanable; stopping never waits on a loop that does not
answer. The rounds here are a fake runner's (the Cleaner's own rewrite is tested with it)."""

from __future__ import annotations

import asyncio
import pathlib
import threading
from collections.abc import Callable
from typing import Any

import pytest

from minibroker.broker.cleaner.cleaner import CleanAborted, CleanerStats
from minibroker.broker.cleaner.manager import (
    CLEANER_OFFSET_CHECKPOINT,
    CleanerBook,
    CleanerSettings,
    LogCleaner,
    Outcome,
    log_facts,
)
from minibroker.broker.cleaner.selection import CompactionConfig, LogFacts, LogToClean, SegmentFacts
from minibroker.broker.metrics import BrokerMetrics
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.log import PartitionLog
from minibroker.client.records import encode_batch
from minibroker.client.types import TopicPartition

TP = TopicPartition("changelog", 0)
OTHER = TopicPartition("changelog", 1)
TS = 1_700_000_000_000
COMPACT = CompactionConfig(cleanup_policy="compact")


def facts(
    tp: TopicPartition = TP,
    sizes: tuple[int, ...] = (1000, 1000, 0),
    checkpoint: int | None = None,
    log_start: int = 0,
) -> LogFacts:
    """A compacted log of segments 100 offsets each, the last one active; HW at the LEO."""
    segments = tuple(SegmentFacts(100 * i, size) for i, size in enumerate(sizes))
    leo = 100 * (len(sizes) - 1)
    return LogFacts(tp, COMPACT, log_start, leo, segments, upper_bound=leo, checkpoint=checkpoint)


def stats_for(to_clean: LogToClean, end_offset: int | None = None) -> CleanerStats:
    end = to_clean.first_uncleanable_offset if end_offset is None else end_offset
    return CleanerStats(
        to_clean.topic_partition, to_clean.first_dirty_offset, end, 2000, 500, 40, 10, 0.4,
        0.5, 2, 1,
    )  # fmt: skip


# -- the checkpoint file ---------------------------------------------------------------------


def test_checkpoint_file_is_kafkas_format_and_survives_a_restart(tmp_path: pathlib.Path) -> None:
    path = tmp_path / CLEANER_OFFSET_CHECKPOINT
    book = CleanerBook(path)
    assert book.load() == {}
    chosen, _ = book.grab([facts()], TS)
    assert chosen is not None and chosen.first_dirty_offset == 0
    book.finish(TP, stats_for(chosen), None)
    assert path.read_text() == "0\n1\nchangelog 0 200\n"
    again = CleanerBook(path)
    assert again.load() == {TP: 200}
    assert again.checkpoint(TP) == 200


def test_a_checkpoint_written_by_kafka_is_read(tmp_path: pathlib.Path) -> None:
    path = tmp_path / CLEANER_OFFSET_CHECKPOINT
    path.write_text("0\n2\n__consumer_offsets 7 1234\nchangelog 0 99\n")
    assert CleanerBook(path).load() == {TopicPartition("__consumer_offsets", 7): 1234, TP: 99}


def test_an_unreadable_checkpoint_is_an_empty_one(tmp_path: pathlib.Path) -> None:
    path = tmp_path / CLEANER_OFFSET_CHECKPOINT
    path.write_text("3\n1\nchangelog 0 99\n")  # another version
    book = CleanerBook(path)
    assert book.load() == {}
    chosen, _ = book.grab([facts()], TS)
    assert chosen is not None and chosen.first_dirty_offset == 0


# -- the state machine -----------------------------------------------------------------------


def test_a_log_in_progress_is_not_chosen_again_until_its_round_ends(tmp_path: pathlib.Path) -> None:
    book = CleanerBook(tmp_path / CLEANER_OFFSET_CHECKPOINT)
    first, ratio = book.grab([facts(), facts(OTHER, (1000, 0))], TS)
    assert first is not None and first.topic_partition == TP
    assert ratio == 1.0
    second, _ = book.grab([facts(), facts(OTHER, (1000, 0))], TS)
    assert second is not None and second.topic_partition == OTHER
    assert book.grab([facts(), facts(OTHER, (1000, 0))], TS)[0] is None
    run = book.finish(TP, stats_for(first), None)
    assert run.outcome is Outcome.CLEANED and run.end_offset == 200
    assert book.checkpoint(TP) == 200 and not book.in_progress(TP)
    assert book.last_run(TP) == (1, run)


def test_an_aborted_round_leaves_the_checkpoint_and_the_log_paused(tmp_path: pathlib.Path) -> None:
    book = CleanerBook(tmp_path / CLEANER_OFFSET_CHECKPOINT)
    chosen, _ = book.grab([facts()], TS)
    assert chosen is not None
    assert book.abort_and_pause(TP) is True
    assert book.aborted(TP) and book.paused(TP)
    # The round still returned stats (its swap was refused, or came before the abort): not
    # counted as cleaned, the checkpoint does not move.
    run = book.finish(TP, stats_for(chosen), None)
    assert run.outcome is Outcome.ABORTED
    assert book.checkpoint(TP) is None
    assert TP not in book.uncleanable()
    assert book.grab([facts()], TS)[0] is None  # paused
    book.resume(TP)
    assert not book.paused(TP)
    again, _ = book.grab([facts()], TS)
    assert again is not None and again.topic_partition == TP


def test_pauses_nest_and_resume_without_a_pause_is_refused(tmp_path: pathlib.Path) -> None:
    book = CleanerBook(tmp_path / CLEANER_OFFSET_CHECKPOINT)
    assert book.abort_and_pause(TP) is False  # nothing running: paused only
    book.abort_and_pause(TP)
    book.resume(TP)
    assert book.paused(TP)
    assert book.grab([facts()], TS)[0] is None
    book.resume(TP)
    assert book.grab([facts()], TS)[0] is not None
    with pytest.raises(ValueError, match="not paused"):
        book.resume(OTHER)


def test_an_unexpected_error_makes_the_log_uncleanable_until_it_is_deleted(
    tmp_path: pathlib.Path,
) -> None:
    book = CleanerBook(tmp_path / CLEANER_OFFSET_CHECKPOINT)
    book.grab([facts()], TS)
    run = book.finish(TP, None, ValueError("bad batch"))
    assert run.outcome is Outcome.FAILED and run.error == "bad batch"
    assert book.uncleanable() == {TP}
    assert book.grab([facts()], TS)[0] is None
    # CleanAborted, or any error once the round was aborted, is no reason to give up.
    other, _ = book.grab([facts(OTHER)], TS)
    assert other is not None
    book.abort_and_pause(OTHER)
    assert book.finish(OTHER, None, OSError("file gone")).outcome is Outcome.ABORTED
    assert book.uncleanable() == {TP}
    book.forget(TP)
    assert book.uncleanable() == frozenset()
    assert book.grab([facts()], TS)[0] is not None


def test_checkpoint_is_clamped_by_truncation_reset_below_log_start_dropped_on_delete(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / CLEANER_OFFSET_CHECKPOINT
    book = CleanerBook(path)
    chosen, _ = book.grab([facts()], TS)
    assert chosen is not None
    book.finish(TP, stats_for(chosen), None)
    assert book.truncate_checkpoint(TP, 300) is False  # above the checkpoint: unchanged
    assert book.truncate_checkpoint(TP, 150) is True
    assert CleanerBook(path).load() == {TP: 150}
    # Retention moved the log start past the checkpoint: the next look resets it (Kafka).
    segments = (SegmentFacts(200, 1000), SegmentFacts(300, 1000), SegmentFacts(400, 0))
    moved = LogFacts(TP, COMPACT, 250, 400, segments, upper_bound=400, checkpoint=150)
    chosen, _ = book.grab([moved], TS)
    assert chosen is not None and chosen.first_dirty_offset == 250
    assert CleanerBook(path).load() == {TP: 250}
    book.finish(TP, None, CleanAborted("test"))
    book.forget(TP)
    assert CleanerBook(path).load() == {}
    assert book.drop_checkpoint(TP) is False


# -- facts from a real log -------------------------------------------------------------------


def keyed_batch(keys: range, ts: int) -> bytes:
    return encode_batch([(ts, b"k%d" % k, b"v" * 40, ()) for k in keys])


def compacted_log(path: pathlib.Path, batches: int = 12, **config: Any) -> PartitionLog:
    log = PartitionLog.open(
        path / "changelog-0",
        TP,
        LogConfig(compact=True, delete=False, segment_bytes=600, **config),
        now_ms=TS,
    )
    for i in range(batches):
        log.append_as_leader(keyed_batch(range(i % 3 * 5, i % 3 * 5 + 5), TS + i), 1, TS + i)
    return log


def test_a_log_past_max_compaction_lag_is_chosen_and_its_delay_reported(
    tmp_path: pathlib.Path,
) -> None:
    """Below its dirty ratio, but its first dirty batch is older than max.compaction.lag.ms:
    cleaned anyway (Kafka), and max_compaction_delay_secs says by how much."""
    lagged = CompactionConfig(
        cleanup_policy="compact", min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=1000
    )
    segments = (
        SegmentFacts(0, 1000, TS, TS),
        SegmentFacts(100, 1000, TS, TS),
        SegmentFacts(200, 0),
    )
    log = LogFacts(TP, lagged, 0, 200, segments, upper_bound=200, checkpoint=100)
    book = CleanerBook(tmp_path / CLEANER_OFFSET_CHECKPOINT)
    metrics = BrokerMetrics()
    chosen, ratio = book.grab([log], TS + 6000)
    assert chosen is not None and chosen.need_compaction_now and ratio == 0.5
    assert book.max_compaction_delay_ms == 5000
    metrics.cleaner.dirty_ratio(ratio, book.max_compaction_delay_ms)
    sample = metrics.registry.get_sample_value
    assert sample("kafka_log_LogCleanerManager_max_compaction_delay_secs") == 5.0
    assert sample("kafka_log_LogCleanerManager_max_dirty_percent") == 50.0


def test_log_facts_are_the_logs_segments_offsets_and_high_watermark(tmp_path: pathlib.Path) -> None:
    log = compacted_log(tmp_path)
    try:
        f = log_facts(log, high_watermark=40, checkpoint=10)
        assert [(s.base_offset, s.size_bytes) for s in f.segments] == [
            (s.base_offset, s.size) for s in log.segments
        ]
        assert len(f.segments) >= 3
        assert (f.log_start_offset, f.log_end_offset) == (0, log.leo) == (0, 60)
        assert f.upper_bound == 40 and f.checkpoint == 10
        assert f.config.compact and not f.config.delete
        assert f.segments[0].offset_index_bytes == 8 * len(log.segments[0].index)
        # No compaction lag configured: no timestamps read.
        assert {s.largest_timestamp for s in f.segments} == {-1}
        assert log_facts(log, high_watermark=10_000, checkpoint=None).upper_bound == 60
        lagged = compacted_log(tmp_path / "lag", min_compaction_lag_ms=5, max_compaction_lag_ms=9)
        g = log_facts(lagged, 60, None)
        assert g.segments[0].largest_timestamp == TS + max(
            i for i in range(12) if lagged.segments[1].base_offset > i * 5
        )
        assert g.segments[0].first_batch_timestamp == TS
        assert g.segments[-1].first_batch_timestamp == -1  # never for the active segment
        lagged.close()
    finally:
        log.close()


# -- the threads -----------------------------------------------------------------------------


class FakeRunner:
    """Stands in for cleaner.py's Cleaner: each round, `script(log, to_clean, on_loop)`."""

    def __init__(self, script: Callable[[PartitionLog, LogToClean, Any], CleanerStats]) -> None:
        self.script = script
        self.rounds: list[LogToClean] = []
        self.should_abort: Callable[[], bool] | None = None

    def clean(
        self,
        log: PartitionLog,
        to_clean: LogToClean,
        now_ms: int,
        on_loop: Any,
        *,
        should_abort: Callable[[], bool] | None = None,
    ) -> CleanerStats:
        self.rounds.append(to_clean)
        self.should_abort = should_abort
        return self.script(log, to_clean, on_loop)


def settings(threads: int = 1) -> CleanerSettings:
    return CleanerSettings(threads=threads, dedupe_buffer_size=1 << 16, backoff_ms=60_000)


async def until(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Yield to the loop until `predicate` holds (the cleaner threads need it to answer)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def make_cleaner(
    tmp_path: pathlib.Path,
    log: PartitionLog,
    runner: FakeRunner,
    metrics: BrokerMetrics | None = None,
    hw: int = 60,
) -> LogCleaner:
    return LogCleaner(
        settings(),
        tmp_path,
        lambda: [(log, hw)],
        observer=metrics.cleaner if metrics is not None else None,
        runner_factory=lambda _settings: runner,
    )


def test_a_round_runs_off_the_loop_and_its_swap_on_it(tmp_path: pathlib.Path) -> None:
    log = compacted_log(tmp_path)
    metrics = BrokerMetrics()
    threads: dict[str, int] = {}

    def script(log: PartitionLog, to_clean: LogToClean, on_loop: Any) -> CleanerStats:
        threads["round"] = threading.get_ident()
        # Set by the look that chose this log (a later look finds it clean: 0).
        dirty = metrics.registry.get_sample_value("kafka_log_LogCleanerManager_max_dirty_percent")
        threads["dirty"] = int(dirty or 0)
        threads["swap"] = on_loop(threading.get_ident)
        return stats_for(to_clean)

    runner = FakeRunner(script)

    async def main() -> None:
        threads["loop"] = threading.get_ident()
        cleaner = make_cleaner(tmp_path, log, runner, metrics)
        cleaner.start()
        try:
            await until(lambda: cleaner.book.last_run(TP)[0] >= 1, "a round")
        finally:
            await cleaner.stop()
        assert not cleaner.running

    asyncio.run(main())
    log.close()
    assert threads["swap"] == threads["loop"] != threads["round"]
    to_clean = runner.rounds[0]
    assert to_clean.first_dirty_offset == 0
    assert to_clean.first_uncleanable_offset == log.segments[-1].base_offset
    expected = to_clean.first_uncleanable_offset
    assert (tmp_path / CLEANER_OFFSET_CHECKPOINT).read_text() == f"0\n1\nchangelog 0 {expected}\n"
    sample = metrics.registry.get_sample_value
    assert sample("minibroker_log_cleaner_rounds_total", {"outcome": "cleaned"}) == 1
    assert sample("kafka_log_LogCleaner_cleaner_recopy_percent") == 25.0
    assert sample("kafka_log_LogCleaner_max_buffer_utilization_percent") == 40.0
    assert sample("kafka_log_LogCleaner_max_clean_time_secs") == 0.5
    assert threads["dirty"] == 100
    assert sample("kafka_log_LogCleanerManager_uncleanable_partitions_count") == 0


def test_an_abort_refuses_the_swap_and_the_log_is_cleaned_after_resume(
    tmp_path: pathlib.Path,
) -> None:
    log = compacted_log(tmp_path)
    started = threading.Event()
    go_on = threading.Event()
    swapped: list[int] = []

    def script(log: PartitionLog, to_clean: LogToClean, on_loop: Any) -> CleanerStats:
        started.set()
        go_on.wait(10)
        on_loop(lambda: swapped.append(to_clean.first_dirty_offset))
        return stats_for(to_clean)

    runner = FakeRunner(script)

    async def main() -> LogCleaner:
        cleaner = make_cleaner(tmp_path, log, runner)
        cleaner.start()
        try:
            await until(started.is_set, "the round to start")
            assert runner.should_abort is not None and not runner.should_abort()
            cleaner.abort_and_pause(TP)  # e.g. before a truncation
            assert runner.should_abort()  # the Cleaner stops between two batches
            go_on.set()
            await until(lambda: cleaner.book.last_run(TP)[0] == 1, "the aborted round")
            run = cleaner.book.last_run(TP)[1]
            assert run is not None and run.outcome is Outcome.ABORTED
            assert swapped == [] and cleaner.book.checkpoint(TP) is None
            cleaner.resume(TP)
            cleaner.wake()
            await until(lambda: cleaner.book.last_run(TP)[0] == 2, "the next round")
        finally:
            await cleaner.stop()
        return cleaner

    cleaner = asyncio.run(main())
    log.close()
    assert swapped == [0]
    assert TP not in cleaner.book.uncleanable()
    assert cleaner.book.checkpoint(TP) == runner.rounds[1].first_uncleanable_offset


def test_a_failing_round_makes_the_log_uncleanable_and_is_counted(tmp_path: pathlib.Path) -> None:
    log = compacted_log(tmp_path)
    metrics = BrokerMetrics()

    def script(log: PartitionLog, to_clean: LogToClean, on_loop: Any) -> CleanerStats:
        raise RuntimeError("a bug in the rewrite")

    runner = FakeRunner(script)

    async def main() -> LogCleaner:
        cleaner = make_cleaner(tmp_path, log, runner, metrics)
        cleaner.start()
        try:
            await until(lambda: cleaner.book.last_run(TP)[0] == 1, "the failed round")
            cleaner.wake()
            # The thread looks again (and finds nothing: the only log is uncleanable).
            await until(
                lambda: (
                    metrics.registry.get_sample_value(
                        "kafka_log_LogCleanerManager_uncleanable_partitions_count"
                    )
                    == 1
                ),
                "the gauge",
            )
        finally:
            await cleaner.stop()
        return cleaner

    cleaner = asyncio.run(main())
    log.close()
    assert len(runner.rounds) == 1
    assert cleaner.book.uncleanable() == {TP}
    run = cleaner.book.last_run(TP)[1]
    assert run is not None and run.outcome is Outcome.FAILED
    assert "a bug in the rewrite" in run.error
    sample = metrics.registry.get_sample_value
    assert sample("minibroker_log_cleaner_rounds_total", {"outcome": "failed"}) == 1
    assert sample("kafka_log_LogCleaner_DeadThreadCount") == 0


def test_stop_never_waits_on_a_loop_that_does_not_answer(tmp_path: pathlib.Path) -> None:
    """A round blocked in on_loop while the loop never runs the call (it is shutting down):
    stopping the cleaner ends the wait with CleanAborted, and the swap never runs."""
    log = compacted_log(tmp_path)
    idle = asyncio.new_event_loop()  # never run: what is queued on it never happens
    cleaner = LogCleaner(settings(), tmp_path, lambda: [(log, 60)])
    cleaner._loop = idle
    ran: list[str] = []
    outcome: list[BaseException] = []

    def round_thread() -> None:
        try:
            cleaner.on_loop(lambda: ran.append("swap"), TP)
        except BaseException as err:
            outcome.append(err)

    thread = threading.Thread(target=round_thread)
    thread.start()
    thread.join(0.2)
    assert thread.is_alive()  # waiting for the loop
    cleaner._stop.set()
    thread.join(5)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], CleanAborted)
    idle.run_until_complete(asyncio.sleep(0))  # the queued call, cancelled, does nothing
    idle.close()
    assert ran == []
    with pytest.raises(CleanAborted, match="event loop is gone"):
        cleaner._stop.clear()
        cleaner.on_loop(lambda: ran.append("late"), TP)
    log.close()


def test_an_abort_while_the_swap_waits_in_the_loops_queue_refuses_it(
    tmp_path: pathlib.Path,
) -> None:
    """The round's call is queued on the loop, then the loop aborts the round before it gets to
    the call: the call must not run (the loop checks again when it runs it)."""
    log = compacted_log(tmp_path)

    class QueueLoop:
        def __init__(self) -> None:
            self.queued: list[Callable[[], None]] = []
            self.ready = threading.Event()

        def call_soon_threadsafe(self, callback: Callable[[], None]) -> None:
            self.queued.append(callback)
            self.ready.set()

    loop = QueueLoop()
    cleaner = LogCleaner(settings(), tmp_path, lambda: [(log, 60)])
    cleaner._loop = loop  # type: ignore[assignment]
    cleaner.book.grab([log_facts(log, 60, None)], TS)
    ran: list[str] = []
    outcome: list[BaseException] = []

    def round_thread() -> None:
        try:
            cleaner.on_loop(lambda: ran.append("swap"), TP)
        except BaseException as err:
            outcome.append(err)

    thread = threading.Thread(target=round_thread)
    thread.start()
    assert loop.ready.wait(5)
    cleaner.abort_and_pause(TP)  # on "the loop", before it runs the queued call
    loop.queued[0]()
    thread.join(5)
    assert ran == []
    assert len(outcome) == 1 and isinstance(outcome[0], CleanAborted)
    log.close()


def test_stop_ends_a_long_round_between_batches(tmp_path: pathlib.Path) -> None:
    """A round still reading when the broker stops: should_abort turns true, the Cleaner raises
    CleanAborted, and stop returns long before its timeout, the round counted as aborted."""
    log = compacted_log(tmp_path)
    reading = threading.Event()

    def script(log: PartitionLog, to_clean: LogToClean, on_loop: Any) -> CleanerStats:
        reading.set()
        assert runner.should_abort is not None
        while not runner.should_abort():  # batch after batch
            threading.Event().wait(0.005)
        raise CleanAborted("asked to stop between two batches")

    runner = FakeRunner(script)

    async def main() -> tuple[float, LogCleaner]:
        cleaner = make_cleaner(tmp_path, log, runner)
        cleaner.start()
        await until(reading.is_set, "the round to read")
        started = asyncio.get_running_loop().time()
        await cleaner.stop()
        return asyncio.get_running_loop().time() - started, cleaner

    took, cleaner = asyncio.run(main())
    log.close()
    assert took < 5.0 and not cleaner.running
    run = cleaner.book.last_run(TP)[1]
    assert run is not None and run.outcome is Outcome.ABORTED
    assert cleaner.book.checkpoint(TP) is None and TP not in cleaner.book.uncleanable()


def test_no_memory_for_the_map_is_not_the_logs_fault(tmp_path: pathlib.Path) -> None:
    log = compacted_log(tmp_path)
    made: list[int] = []

    def factory(_settings: CleanerSettings) -> FakeRunner:
        made.append(1)
        raise MemoryError("no 16 MiB today")

    async def main() -> LogCleaner:
        cleaner = LogCleaner(settings(), tmp_path, lambda: [(log, 60)], runner_factory=factory)
        cleaner.start()
        try:
            await until(lambda: cleaner.book.last_run(TP)[0] >= 1, "the round")
        finally:
            await cleaner.stop()
        return cleaner

    cleaner = asyncio.run(main())
    log.close()
    run = cleaner.book.last_run(TP)[1]
    assert run is not None and run.outcome is Outcome.ABORTED and "no offset map" in run.error
    assert TP not in cleaner.book.uncleanable() and made == [1]


def test_a_disabled_cleaner_starts_no_thread(tmp_path: pathlib.Path) -> None:
    log = compacted_log(tmp_path)

    async def main() -> None:
        for disabled in (CleanerSettings(enabled=False), CleanerSettings(threads=0)):
            cleaner = LogCleaner(disabled, tmp_path, lambda: [(log, 60)])
            cleaner.start()
            assert not cleaner.running
            await cleaner.stop()

    asyncio.run(main())
    log.close()


def test_map_bytes_is_each_threads_share() -> None:
    assert CleanerSettings(threads=4, dedupe_buffer_size=1000).map_bytes == 250


def test_the_crash_fault_exists_only_when_its_variable_names_a_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from minibroker.broker.cleaner import manager

    monkeypatch.delenv(manager.CRASH_AT_STEP_ENV, raising=False)
    assert manager._crash_hook() is None
    monkeypatch.setenv(manager.CRASH_AT_STEP_ENV, "no_such_step")
    with pytest.raises(ValueError, match="not a cleaner step"):
        manager._crash_hook()
    monkeypatch.setenv(manager.CRASH_AT_STEP_ENV, "swap_renamed")
    hook = manager._crash_hook()
    assert hook is not None
    hook("swap_checked")  # another step: nothing happens (this process is still here)
