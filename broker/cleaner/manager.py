"""The log cleaner's broker side: Kafka's LogCleanerManager and its cleaner threads (issue 21).

I/O shell. Three parts:
  * `CleanerBook` (Kafka's LogCleanerManager): which logs are being cleaned, paused or
    uncleanable, and the cleaner checkpoints (`cleaner-offset-checkpoint` in the data dir,
    Kafka's file and format: version 0, the entry count, `topic partition offset` lines; the
    offset is the first offset not cleaned yet). Thread-safe (one lock): the event loop and the
    cleaner threads both call it.
  * `log_facts`: a `PartitionLog` as selection.py's `LogFacts` (segments, sizes, timestamps,
    the HW as the upper bound, the checkpoint). Event loop only: PartitionLog is not
    thread-safe.
  * `LogCleaner`: `log.cleaner.threads` threads (none with `log.cleaner.enable=false` or 0
    threads), each with its own `OffsetMap` of `log.cleaner.dedupe.buffer.size / threads` bytes
    (and read buffer of `log.cleaner.io.buffer.size / threads / 2`, as Kafka splits them),
    allocated at the thread's first round (a broker without compacted topics holds none). A
    thread asks the event loop for the filthiest compacted log (`grab_filthiest_compacted_log`
    over facts built there), cleans it with `Cleaner.clean` off the loop, records the round,
    and sleeps `log.cleaner.backoff.ms` when nothing is due.

Abort and pause (Kafka's abortAndPauseCleaning), without ever blocking the event loop on a
cleaner thread: every change a round makes to a log goes through `on_loop`, which runs the
cleaner's swap on the event loop, and the same loop truncates, deletes and closes logs. So
`abort_and_pause(tp)` (event loop) marks the round aborted and pauses the log; from then on
`on_loop` refuses the round's swap (CleanAborted, before it starts: a swap that started runs
to its end within that one loop callback, so it never interleaves with the truncation or
deletion), and the Cleaner's `should_abort`, asked between batches, stops its reading and
writing (it then removes its `.cleaned` files). Nothing waits: a cleaner thread blocked in
`on_loop` polls for the abort (and for the broker stopping), and a round that fails after its
abort is counted as aborted, never as a reason to mark the log uncleanable (its files may have
been truncated or deleted under its reads). A paused log is never chosen; `resume` ends the
pause (pauses nest). Why not wait as Kafka does: the loop would block on a thread that may
itself be waiting for the loop, and the serialisation on the loop already gives what Kafka's
wait gives (no swap after the abort).

Checkpoint rules (Kafka's): a round that ends normally moves the log's checkpoint to the
round's end offset; an aborted or failed one leaves it. A truncation lowers it to the new log
end (`after_truncation`; a full truncation drops it), a deleted log's entry is dropped
(`forget`), and a checkpoint below the log start or above the log end is reset to the log start
when the log is next considered (selection.py's `cleanable_offsets`). The file is rewritten
atomically at each change; an unreadable file is a warning and an empty checkpoint (the next
rounds clean from the log start again, which is only slower).

Failures: an unexpected error in a round (not CleanAborted, not after an abort) marks the log
uncleanable (Kafka's markPartitionUncleanable: never chosen again until the log is deleted or
the broker restarts; counted by `kafka_log_LogCleanerManager_uncleanable_partitions_count`). A
disk error is handed to `on_disk_failure` (the broker takes its data dir offline). A thread that
dies of a bug is counted by `kafka_log_LogCleaner_DeadThreadCount`.

Stopping (`stop`, a coroutine on the event loop): aborts every round, wakes the threads and
joins them while the loop keeps running, so a thread waiting in `on_loop` is answered or
refused, never deadlocked; a thread still busy after `STOP_TIMEOUT_S` is left behind (daemon)
with a warning, its unfinished `.cleaned` files removed by the next start's recovery.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from minibroker.broker.cleaner.cleaner import STEPS, CleanAborted, Cleaner, CleanerStats
from minibroker.broker.cleaner.offset_map import OffsetMap
from minibroker.broker.cleaner.selection import (
    NO_TIMESTAMP,
    CompactionConfig,
    LogFacts,
    LogToClean,
    SegmentFacts,
    grab_filthiest_compacted_log,
    log_to_clean,
)
from minibroker.broker.storage.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.errors import CorruptCheckpointError, is_log_dir_failure
from minibroker.broker.storage.log import PartitionLog
from minibroker.client.common.clock import wall_clock_ms
from minibroker.client.common.log import get_logger
from minibroker.client.types import TopicPartition

T = TypeVar("T")

# How often a cleaner thread waiting for the event loop looks for an abort or a stop.
ON_LOOP_POLL_S = 0.05
# The smallest read buffer a cleaner thread gets.
MIN_IO_BUFFER_BYTES = 64 * 1024
# How long `stop` waits for each cleaner thread.
STOP_TIMEOUT_S = 10.0
# Bytes of index entries (client/log_format.py): offset index 8, time index 12.
OFFSET_INDEX_ENTRY_BYTES = 8
TIME_INDEX_ENTRY_BYTES = 12
# max.compaction.lag.ms at or above this is "never": no first-batch timestamp is read for it.
_NO_MAX_LAG = 2**62

_log = get_logger("minibroker.broker.cleaner")


class Outcome(enum.Enum):
    CLEANED = "cleaned"
    ABORTED = "aborted"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class CleanerRun:
    """One finished round, as `topics describe` and `watch` show the last one of a log."""

    timestamp_ms: int  # wall clock at the round's end
    outcome: Outcome
    first_dirty_offset: int
    end_offset: int  # the new checkpoint (the round's first dirty offset unless CLEANED)
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_written: int = 0
    elapsed_ms: int = 0
    error: str = ""


@dataclass
class _Round:
    first_dirty_offset: int
    aborted: bool = False


class CleanerBook:
    """Kafka's LogCleanerManager state: rounds in progress (and aborted), pauses, uncleanable
    logs, the checkpoints and each log's last round. Thread-safe."""

    def __init__(self, checkpoint_path: str | os.PathLike[str]) -> None:
        self._lock = threading.Lock()
        self._file = OffsetCheckpointFile(checkpoint_path)
        self._checkpoints: dict[TopicPartition, int] = {}
        self._rounds: dict[TopicPartition, _Round] = {}
        self._pauses: dict[TopicPartition, int] = {}
        self._uncleanable: set[TopicPartition] = set()
        self._last_runs: dict[TopicPartition, CleanerRun] = {}
        self._run_counts: dict[TopicPartition, int] = {}
        # The last look's largest delay past max.compaction.lag.ms (Kafka's
        # max-compaction-delay-secs), in ms.
        self.max_compaction_delay_ms = 0

    @property
    def path(self) -> str:
        return str(self._file.path)

    def load(self) -> dict[TopicPartition, int]:
        """Read the checkpoint file (missing: empty; unreadable: warned, empty)."""
        try:
            loaded = self._file.read()
        except CorruptCheckpointError as err:
            _log.warning("cleaner_checkpoint_unreadable", path=self.path, error=str(err))
            loaded = {}
        with self._lock:
            self._checkpoints = dict(loaded)
        return loaded

    # -- reads --------------------------------------------------------------------------------

    def checkpoint(self, tp: TopicPartition) -> int | None:
        with self._lock:
            return self._checkpoints.get(tp)

    def checkpoints(self) -> dict[TopicPartition, int]:
        with self._lock:
            return dict(self._checkpoints)

    def in_progress(self, tp: TopicPartition) -> bool:
        with self._lock:
            return tp in self._rounds

    def aborted(self, tp: TopicPartition) -> bool:
        """The round of `tp` was aborted (False when none runs)."""
        with self._lock:
            r = self._rounds.get(tp)
            return r is not None and r.aborted

    def paused(self, tp: TopicPartition) -> bool:
        with self._lock:
            return self._pauses.get(tp, 0) > 0

    def uncleanable(self) -> frozenset[TopicPartition]:
        with self._lock:
            return frozenset(self._uncleanable)

    def last_run(self, tp: TopicPartition) -> tuple[int, CleanerRun | None]:
        """(rounds finished for `tp` since this broker started, the last one)."""
        with self._lock:
            return self._run_counts.get(tp, 0), self._last_runs.get(tp)

    # -- the loop's side: choose, abort, pause, truncate, forget ---------------------------

    def grab(self, logs: Iterable[LogFacts], now_ms: int) -> tuple[LogToClean | None, float]:
        """The filthiest compacted log not in progress, paused or uncleanable, marked in
        progress; and the largest dirty ratio among the candidates (Kafka's max-dirty-percent).
        Checkpoints found invalid (below the log start, above the log end) are reset first.
        The look's largest compaction delay is kept in `max_compaction_delay_ms`."""
        with self._lock:
            busy = self._rounds.keys() | {tp for tp, n in self._pauses.items() if n > 0}
            choice = grab_filthiest_compacted_log(logs, now_ms, busy, self._uncleanable)
            if choice.checkpoint_resets:
                for tp, offset in choice.checkpoint_resets:
                    self._checkpoints[tp] = offset
                self._write_locked()
            self.max_compaction_delay_ms = choice.max_compaction_delay_ms
            chosen = choice.filthiest
            if chosen is not None:
                self._rounds[chosen.topic_partition] = _Round(chosen.first_dirty_offset)
            return chosen, choice.max_dirty_ratio

    def abort_and_pause(self, tp: TopicPartition) -> bool:
        """Abort the round of `tp` (its swap is refused from now on) and pause the log until
        `resume`; True when a round was running."""
        with self._lock:
            self._pauses[tp] = self._pauses.get(tp, 0) + 1
            r = self._rounds.get(tp)
            if r is None:
                return False
            r.aborted = True
            return True

    def resume(self, tp: TopicPartition) -> None:
        """End one pause of `tp`. Raises ValueError when it is not paused (a bug)."""
        with self._lock:
            n = self._pauses.get(tp, 0)
            if n <= 0:
                raise ValueError(f"cleaning of {tp} is not paused")
            if n == 1:
                del self._pauses[tp]
            else:
                self._pauses[tp] = n - 1

    def abort_all(self) -> None:
        with self._lock:
            for r in self._rounds.values():
                r.aborted = True

    def truncate_checkpoint(self, tp: TopicPartition, offset: int) -> bool:
        """Lower the checkpoint of `tp` to `offset` (Kafka's maybeTruncateCheckpoint);
        True when it changed (the file is rewritten)."""
        with self._lock:
            current = self._checkpoints.get(tp)
            if current is None or current <= offset:
                return False
            self._checkpoints[tp] = offset
            self._write_locked()
            return True

    def drop_checkpoint(self, tp: TopicPartition) -> bool:
        """Drop the checkpoint of `tp` (its log was truncated fully: it restarts elsewhere);
        True when there was one (the file is rewritten)."""
        with self._lock:
            if self._checkpoints.pop(tp, None) is None:
                return False
            self._write_locked()
            return True

    def forget(self, tp: TopicPartition) -> None:
        """`tp`'s log was deleted: abort its round, drop its checkpoint entry, its pauses and
        its uncleanable mark (a new log of the partition starts afresh)."""
        with self._lock:
            r = self._rounds.get(tp)
            if r is not None:
                r.aborted = True
            self._pauses.pop(tp, None)
            self._uncleanable.discard(tp)
            self._last_runs.pop(tp, None)
            self._run_counts.pop(tp, None)
            if self._checkpoints.pop(tp, None) is not None:
                self._write_locked()

    # -- the cleaner thread's side ----------------------------------------------------------

    def finish(
        self,
        tp: TopicPartition,
        stats: CleanerStats | None,
        error: BaseException | None,
        *,
        stopping: bool = False,
        now_ms: int | None = None,
    ) -> CleanerRun:
        """Record the end of the round of `tp`: the checkpoint moves to `stats.end_offset`
        when it ended normally and was not aborted; an unexpected error marks the log
        uncleanable. Returns the round as describe shows it. A failure to write the checkpoint
        file is raised after the state is updated (the checkpoint stays in memory)."""
        now = wall_clock_ms() if now_ms is None else now_ms
        with self._lock:
            r = self._rounds.pop(tp, None)
            first_dirty = r.first_dirty_offset if r is not None else -1
            aborted = (r is not None and r.aborted) or stopping or isinstance(error, CleanAborted)
            write = False
            if stats is not None and error is None and not aborted:
                run = CleanerRun(
                    now,
                    Outcome.CLEANED,
                    stats.first_dirty_offset,
                    stats.end_offset,
                    stats.bytes_read,
                    stats.bytes_written,
                    stats.records_read,
                    stats.records_written,
                    int(stats.elapsed_s * 1000),
                )
                if self._checkpoints.get(tp) != stats.end_offset:
                    self._checkpoints[tp] = stats.end_offset
                    write = True
            elif aborted:
                run = CleanerRun(
                    now, Outcome.ABORTED, first_dirty, first_dirty, error=_describe(error)
                )
            else:
                self._uncleanable.add(tp)
                run = CleanerRun(
                    now, Outcome.FAILED, first_dirty, first_dirty, error=_describe(error)
                )
            self._last_runs[tp] = run
            self._run_counts[tp] = self._run_counts.get(tp, 0) + 1
            if write:
                self._write_locked()
            return run

    def _write_locked(self) -> None:
        self._file.write(self._checkpoints)


def _describe(error: BaseException | None) -> str:
    if error is None:
        return ""
    text = str(error) or type(error).__name__
    return text[:300]


# -- facts --------------------------------------------------------------------------------------


def compaction_config(config: LogConfig) -> CompactionConfig:
    """selection.py's view of a topic's LogConfig."""
    policy = ",".join(p for p, on in (("compact", config.compact), ("delete", config.delete)) if on)
    return CompactionConfig(
        cleanup_policy=policy,
        min_cleanable_dirty_ratio=config.min_cleanable_dirty_ratio,
        min_compaction_lag_ms=config.min_compaction_lag_ms,
        max_compaction_lag_ms=config.max_compaction_lag_ms,
        delete_retention_ms=config.delete_retention_ms,
        segment_bytes=config.segment_bytes,
    )


def log_facts(log: PartitionLog, high_watermark: int, checkpoint: int | None) -> LogFacts:
    """`log` as the selection rules see it (event loop only). Timestamps are read only when the
    topic's compaction lags need them: the largest timestamp of each segment for
    `min.compaction.lag.ms` (the file's mtime when it has none, as Kafka's
    largestTimestamp), the first batch's timestamp for `max.compaction.lag.ms`."""
    config = compaction_config(log.config)
    min_lag = config.min_compaction_lag_ms > 0
    max_lag = config.max_compaction_lag_ms < _NO_MAX_LAG
    segments = log.segments
    facts = []
    for i, s in enumerate(segments):
        largest = s.largest_timestamp() if min_lag else NO_TIMESTAMP
        first = NO_TIMESTAMP
        if max_lag and s.size > 0 and i < len(segments) - 1:
            batch = s._walk_one(0)
            if batch is not None:
                first = batch.max_timestamp
        facts.append(
            SegmentFacts(
                s.base_offset,
                s.size,
                largest,
                first,
                len(s.index) * OFFSET_INDEX_ENTRY_BYTES,
                len(s.time_index) * TIME_INDEX_ENTRY_BYTES,
            )
        )
    return LogFacts(
        log.topic_partition,
        config,
        log.log_start_offset,
        log.leo,
        tuple(facts),
        upper_bound=min(high_watermark, log.leo),
        checkpoint=checkpoint,
    )


@dataclass(frozen=True, slots=True)
class CleanerPoint:
    """What `topics describe` shows of a compacted replica: offsets below `cleaner_point` are
    clean (the checkpoint, or the log start when none is valid), and the dirty ratio the
    cleaner weighs (dirty bytes over all bytes below the first uncleanable segment)."""

    cleaner_point: int
    dirty_ratio: float


# -- the threads --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CleanerSettings:
    """The broker's log.cleaner.* settings (Kafka's CleanerConfig)."""

    enabled: bool = True
    threads: int = 1
    dedupe_buffer_size: int = 16 * 1024 * 1024
    io_buffer_size: int = 512 * 1024
    load_factor: float = 0.9
    backoff_ms: int = 15_000

    @classmethod
    def from_config(cls, values: Mapping[str, Any]) -> CleanerSettings:
        return cls(
            enabled=bool(values["log.cleaner.enable"]),
            threads=int(values["log.cleaner.threads"]),
            dedupe_buffer_size=int(values["log.cleaner.dedupe.buffer.size"]),
            io_buffer_size=int(values["log.cleaner.io.buffer.size"]),
            load_factor=float(values["log.cleaner.io.buffer.load.factor"]),
            backoff_ms=int(values["log.cleaner.backoff.ms"]),
        )

    @property
    def active(self) -> bool:
        return self.enabled and self.threads > 0

    @property
    def map_bytes(self) -> int:
        """Each thread's share of the dedupe buffer (Kafka: dedupeBufferSize / numThreads)."""
        return self.dedupe_buffer_size // max(self.threads, 1)

    @property
    def io_bytes(self) -> int:
        """Each thread's read buffer: its share of log.cleaner.io.buffer.size, Kafka's
        ioBufferSize / numThreads / 2 (a read and a write buffer), at least 64 KiB (a batch
        header must fit; the cleaner grows it for a bigger batch)."""
        return max(self.io_buffer_size // max(self.threads, 1) // 2, MIN_IO_BUFFER_BYTES)


class RoundRunner(Protocol):
    """What a cleaner thread runs a round with (cleaner.py's Cleaner)."""

    def clean(
        self,
        log: PartitionLog,
        to_clean: LogToClean,
        now_ms: int,
        on_loop: Callable[[Callable[[], Any]], Any],
        *,
        should_abort: Callable[[], bool] | None = None,
    ) -> CleanerStats: ...


class CleanerObserver(Protocol):
    """Where the cleaner reports (broker/metrics.py's CleanerMetrics)."""

    def round_finished(self, thread: int, run: CleanerRun, stats: CleanerStats | None) -> None: ...

    def dirty_ratio(self, ratio: float, max_compaction_delay_ms: int = 0) -> None: ...

    def uncleanable(self, count: int) -> None: ...

    def thread_died(self) -> None: ...


class _NoObserver:
    def round_finished(self, thread: int, run: CleanerRun, stats: CleanerStats | None) -> None:
        pass

    def dirty_ratio(self, ratio: float, max_compaction_delay_ms: int = 0) -> None:
        pass

    def uncleanable(self, count: int) -> None:
        pass

    def thread_died(self) -> None:
        pass


LogsWithHighWatermarks = Callable[[], Iterable[tuple[PartitionLog, int]]]


def default_runner(settings: CleanerSettings) -> RoundRunner:
    """A Cleaner with its own OffsetMap of the thread's share of the dedupe buffer (and of the
    I/O buffer, as Kafka splits log.cleaner.io.buffer.size)."""
    offset_map = OffsetMap(settings.map_bytes, load_factor=settings.load_factor)
    return Cleaner(offset_map, io_buffer_size=settings.io_bytes, step_hook=_crash_hook())


# A fault for crash tests (tests/integration/test_cleaner_broker_crash.py), as the network
# faults file is one: with this variable set to a step name of cleaner.STEPS, the broker
# SIGKILLs itself when its cleaner reaches that step, so a test restarts a real broker from
# exactly that point of a swap. Unset (always, outside tests), the Cleaner gets no hook.
CRASH_AT_STEP_ENV = "MINIBROKER_TEST_CLEANER_CRASH_AT_STEP"


def _crash_hook() -> Callable[[str], None] | None:
    step = os.environ.get(CRASH_AT_STEP_ENV)
    if not step:
        return None
    if step not in STEPS:
        raise ValueError(f"{CRASH_AT_STEP_ENV}={step!r} is not a cleaner step: {', '.join(STEPS)}")

    def crash(name: str) -> None:
        if name == step:
            _log.warning("cleaner_crash_at_step", step=step)
            os.kill(os.getpid(), signal.SIGKILL)

    return crash


class LogCleaner:
    """The cleaner threads and the loop-side calls around them (see the module docstring).

    `logs()` (called on the loop) gives each hosted log with its HW; `runner_factory` builds a
    thread's round runner at its first round (default: a Cleaner with its own OffsetMap);
    `on_disk_failure(err, operation)` is called on the loop for a data dir failure."""

    def __init__(
        self,
        settings: CleanerSettings,
        data_dir: str | os.PathLike[str],
        logs: LogsWithHighWatermarks,
        *,
        observer: CleanerObserver | None = None,
        runner_factory: Callable[[CleanerSettings], RoundRunner] | None = None,
        on_disk_failure: Callable[[BaseException, str], object] | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.settings = settings
        self.book = CleanerBook(os.path.join(data_dir, CLEANER_OFFSET_CHECKPOINT))
        self._logs = logs
        self._observer: CleanerObserver = observer or _NoObserver()
        self._runner_factory = runner_factory or default_runner
        self._on_disk_failure = on_disk_failure
        self._clock_ms = clock_ms
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self.book.load()

    # -- lifecycle (event loop) ----------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the threads (none when the cleaner is disabled)."""
        if not self.settings.active or self._threads:
            return
        self._loop = loop or asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        for i in range(self.settings.threads):
            thread = threading.Thread(
                target=self._thread_main, args=(i,), name=f"log-cleaner-{i}", daemon=True
            )
            self._threads.append(thread)
            thread.start()
        _log.info(
            "log_cleaner_started",
            threads=self.settings.threads,
            map_bytes=self.settings.map_bytes,
            backoff_ms=self.settings.backoff_ms,
        )

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def wake(self) -> None:
        """End the threads' backoff now (a test, or a new compacted log)."""
        self._wake.set()

    async def stop(self) -> None:
        """Abort every round and join the threads while the loop keeps answering them."""
        self._stop.set()
        self._wake.set()
        self.book.abort_all()
        for thread in self._threads:
            await asyncio.to_thread(thread.join, STOP_TIMEOUT_S)
            if thread.is_alive():
                _log.warning("log_cleaner_thread_not_stopped", thread=thread.name)
        self._threads = [t for t in self._threads if t.is_alive()]

    # -- what the broker calls on the loop ------------------------------------------------

    def abort_and_pause(self, tp: TopicPartition) -> None:
        if self.book.abort_and_pause(tp):
            _log.info("log_cleaning_aborted", topic=tp.topic, partition=tp.partition)

    def resume(self, tp: TopicPartition) -> None:
        self.book.resume(tp)

    def after_truncation(self, tp: TopicPartition, new_end: int, fully: bool) -> None:
        """A follower truncation of `tp` happened (no loop turn since): abort a round of it,
        lower the checkpoint to the new log end (a full truncation drops it)."""
        self.book.abort_and_pause(tp)
        try:
            if fully:
                self.book.drop_checkpoint(tp)
            else:
                self.book.truncate_checkpoint(tp, new_end)
        except OSError as err:
            self._disk_failure(err, f"writing {CLEANER_OFFSET_CHECKPOINT}")
        finally:
            self.book.resume(tp)

    def forget(self, tp: TopicPartition) -> None:
        """`tp`'s log is deleted (called before the delete)."""
        try:
            self.book.forget(tp)
        except OSError as err:
            self._disk_failure(err, f"writing {CLEANER_OFFSET_CHECKPOINT}")

    def describe(self, log: PartitionLog, high_watermark: int, now_ms: int) -> CleanerPoint | None:
        """The cleaner point and dirty ratio of a compacted log (None for another)."""
        if not log.config.compact:
            return None
        facts = log_facts(log, high_watermark, self.book.checkpoint(log.topic_partition))
        ltc, _ = log_to_clean(facts, now_ms)
        return CleanerPoint(ltc.first_dirty_offset, ltc.cleanable_ratio)

    # -- the threads -------------------------------------------------------------------------

    def _grab(self) -> tuple[PartitionLog, LogToClean] | None:
        """On the loop: facts of every hosted compacted log, the filthiest one marked."""
        now = self._clock_ms()
        by_tp: dict[TopicPartition, PartitionLog] = {}
        facts = []
        for log, high_watermark in self._logs():
            if not log.config.compact:
                continue
            tp = log.topic_partition
            by_tp[tp] = log
            facts.append(log_facts(log, high_watermark, self.book.checkpoint(tp)))
        try:
            chosen, max_ratio = self.book.grab(facts, now)
        except OSError as err:
            self._disk_failure(err, f"writing {CLEANER_OFFSET_CHECKPOINT}")
            return None
        self._observer.dirty_ratio(max_ratio, self.book.max_compaction_delay_ms)
        self._observer.uncleanable(len(self.book.uncleanable()))
        if chosen is None:
            return None
        return by_tp[chosen.topic_partition], chosen

    def on_loop(self, fn: Callable[[], T], tp: TopicPartition | None = None) -> T:
        """Run `fn` on the event loop and return its result (cleaner threads only). Raises
        CleanAborted, without running `fn`, once the round of `tp` is aborted or the broker
        stops; never blocks on a loop that no longer runs."""
        loop = self._loop
        if loop is None:
            raise CleanAborted("the log cleaner is not started")
        self._check_abort(tp)
        done: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            if not done.set_running_or_notify_cancel():
                return
            try:
                self._check_abort(tp)
                result = fn()
            except BaseException as err:
                done.set_exception(err)
            else:
                done.set_result(result)

        try:
            loop.call_soon_threadsafe(run)
        except RuntimeError as err:  # the loop is closed
            raise CleanAborted(f"the event loop is gone: {err}") from err
        while True:
            try:
                return done.result(ON_LOOP_POLL_S)
            except TimeoutError:
                if (self._stop.is_set() or (tp is not None and self.book.aborted(tp))) and (
                    done.cancel()
                ):
                    raise CleanAborted(
                        "broker stopping" if self._stop.is_set() else f"cleaning of {tp} aborted"
                    ) from None

    def _round_on_loop(self, tp: TopicPartition) -> Callable[[Callable[[], Any]], Any]:
        def on_loop(fn: Callable[[], Any]) -> Any:
            return self.on_loop(fn, tp)

        return on_loop

    def _round_aborted(self, tp: TopicPartition) -> Callable[[], bool]:
        """What the Cleaner asks between batches: stop now (the broker stops, or the round
        of `tp` was aborted). It also yields the interpreter lock (`time.sleep(0)`): without
        that the event loop, which gives the lock up at every syscall, waits up to the 5 ms
        switch interval to get it back from a busy cleaner each time, and a broker's appends
        ran at a quarter of their idle rate while it cleaned (`bench cleaner`'s produce
        figure: about half with the yield, which costs an idle broker nothing)."""

        def should_abort() -> bool:
            time.sleep(0)
            return self._stop.is_set() or self.book.aborted(tp)

        return should_abort

    def _check_abort(self, tp: TopicPartition | None) -> None:
        if self._stop.is_set():
            raise CleanAborted("broker stopping")
        if tp is not None and self.book.aborted(tp):
            raise CleanAborted(f"cleaning of {tp} aborted")

    def _thread_main(self, index: int) -> None:
        try:
            self._thread_loop(index)
        except CleanAborted:
            pass  # stopping while waiting for the loop
        except BaseException:
            if not self._stop.is_set():
                _log.exception("log_cleaner_thread_died", thread=index)
                self._observer.thread_died()

    def _thread_loop(self, index: int) -> None:
        runner: RoundRunner | None = None
        backoff_s = self.settings.backoff_ms / 1000.0
        while not self._stop.is_set():
            grabbed = self.on_loop(self._grab)
            if grabbed is None:
                self._wake.wait(backoff_s)
                self._wake.clear()
                continue
            log, to_clean = grabbed
            tp = to_clean.topic_partition
            stats: CleanerStats | None = None
            error: BaseException | None = None
            if runner is None:
                try:
                    runner = self._runner_factory(self.settings)
                except Exception as err:  # MemoryError for the map: not the log's fault
                    _log.error(
                        "log_cleaner_map_unavailable",
                        thread=index,
                        map_bytes=self.settings.map_bytes,
                        error=repr(err),
                    )
                    self._record(index, tp, None, CleanAborted(f"no offset map: {err!r}"))
                    self._wake.wait(backoff_s)
                    self._wake.clear()
                    continue
            try:
                stats = runner.clean(
                    log,
                    to_clean,
                    self._clock_ms(),
                    self._round_on_loop(tp),
                    should_abort=self._round_aborted(tp),
                )
            except Exception as err:
                error = err
            self._record(index, tp, stats, error)

    def _record(
        self,
        index: int,
        tp: TopicPartition,
        stats: CleanerStats | None,
        error: BaseException | None,
    ) -> None:
        write_error: OSError | None = None
        try:
            run = self.book.finish(tp, stats, error, stopping=self._stop.is_set())
        except OSError as err:
            write_error = err
            run = self.book.last_run(tp)[1] or CleanerRun(self._clock_ms(), Outcome.CLEANED, -1, -1)
        counted = stats if run.outcome is Outcome.CLEANED else None
        self._observer.round_finished(index, run, counted)
        event = {
            "topic": tp.topic,
            "partition": tp.partition,
            "outcome": run.outcome.value,
            "first_dirty_offset": run.first_dirty_offset,
            "end_offset": run.end_offset,
        }
        if run.outcome is Outcome.CLEANED and stats is not None:
            _log.info(
                "cleaner_round",
                **event,
                bytes_read=stats.bytes_read,
                bytes_written=stats.bytes_written,
                records_read=stats.records_read,
                records_written=stats.records_written,
                segments_before=stats.segments_before,
                segments_after=stats.segments_after,
                map_utilization=round(stats.map_utilization, 4),
                seconds=round(stats.elapsed_s, 3),
            )
        elif run.outcome is Outcome.ABORTED:
            _log.info("cleaner_round", **event, reason=run.error)
        else:
            _log.error("cleaner_round", **event, error=run.error, exc_info=error)
            self._observer.uncleanable(len(self.book.uncleanable()))
        if write_error is not None:
            self._disk_failure(write_error, f"writing {CLEANER_OFFSET_CHECKPOINT}")
        elif error is not None and is_log_dir_failure(error) and run.outcome is Outcome.FAILED:
            self._disk_failure(error, f"cleaning {tp}")

    def _disk_failure(self, err: BaseException, operation: str) -> None:
        """Hand a data dir failure to the broker, on the loop (from any thread)."""
        handler = self._on_disk_failure
        if handler is None:
            _log.error("log_cleaner_disk_failure", operation=operation, error=str(err))
            return
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            handler(err, operation)
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(handler, err, operation)


__all__ = [
    "CLEANER_OFFSET_CHECKPOINT",
    "CleanerBook",
    "CleanerPoint",
    "CleanerRun",
    "CleanerSettings",
    "LogCleaner",
    "Outcome",
    "compaction_config",
    "log_facts",
]
