"""The source's and sink's conversations with the cluster, through the blocking client facade.

Does network I/O (minibroker.client.sync). Two sides:

- the driver side (`OffsetReader`): which partitions a selection covers and their log start
  offsets, high watermarks and offsets by timestamp, for planning batches and micro-batches;
- the executor side (`read_range`): the records of one offset range [start, end), where `end`
  was a high watermark when the range was planned, so nothing above it is ever returned.

Leader changes while reading are the consumer's business (it refreshes metadata and retries
NOT_LEADER_OR_FOLLOWER, fenced epochs and a new leader's OFFSET_NOT_AVAILABLE); this module only
gives up when a range makes no progress for `kafkaConsumer.pollTimeoutMs`, like Kafka's source.

Concurrency: Spark reuses Python workers across tasks, one task at a time per worker process, so
each process keeps one consumer per configuration (`cached_consumer`) and uses it from one thread.
Nothing here is pickled: clients are made lazily where they are used.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from minibroker.client.errors import MiniBrokerError, OffsetOutOfRangeError
from minibroker.client.spark.options import (
    OffsetRange,
    OffsetSpec,
    SourceOptions,
    TopicSelection,
    resolve_offsets,
    security_kwargs,
    timestamp_targets,
)
from minibroker.client.sync import Admin, Consumer
from minibroker.client.types import Record, TopicPartition

log = logging.getLogger("minibroker.spark")


class DataLossError(RuntimeError):
    """Records the query should read are gone (retention, a deleted topic, an unclean election).

    Raised only with failOnDataLoss=true; otherwise the source logs a warning and skips them.
    """


def data_loss(message: str, fail_on_data_loss: bool) -> None:
    """Kafka's reportDataLoss: raise, or warn and go on, per failOnDataLoss."""
    if fail_on_data_loss:
        raise DataLossError(
            f"{message}. Some data may have been lost because it is no longer available in "
            "minibroker (retention, a deleted topic, or an unclean leader election). If you "
            "want the query to go on in this case, set the option failOnDataLoss to false."
        )
    log.warning("%s. Some data may have been lost; failOnDataLoss=false, so going on.", message)


class OffsetReader:
    """Driver-side offset lookups for a source; opens its clients on first use."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._admin: Admin | None = None
        self._consumer: Consumer | None = None

    def _clients(self) -> tuple[Admin, Consumer]:
        if self._admin is None or self._consumer is None:
            self._admin = Admin(self.opts.bootstrap_servers, **security_kwargs(self.opts.consumer))
            self._consumer = Consumer(
                self.opts.bootstrap_servers, auto_offset_reset="none", **self.opts.consumer
            )
        return self._admin, self._consumer

    def close(self) -> None:
        for client in (self._consumer, self._admin):
            if client is not None:
                client.close()
        self._admin = self._consumer = None

    def partitions(self, selection: TopicSelection | None = None) -> list[TopicPartition]:
        """The partitions the selection covers now (new topics and partitions included)."""
        selection = selection or self.opts.selection
        admin, _ = self._clients()
        if selection.kind == "assign":
            return selection.partitions({})
        counts = {
            d.name: len(d.partitions)
            for d in admin.describe_topics(include_offsets=False)
            if selection.matches(d.name)
        }
        return selection.partitions(counts)

    def earliest(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        wanted = list(tps)
        if not wanted:
            return {}
        return self._clients()[1].beginning_offsets(wanted)

    def latest(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """High watermarks: the end of what is committed, the most any plan may read."""
        wanted = list(tps)
        if not wanted:
            return {}
        return self._clients()[1].end_offsets(wanted)

    def by_timestamp(self, targets: dict[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        if not targets:
            return {}
        found = self._clients()[1].offsets_for_times(targets)
        return {tp: (None if hit is None else hit[0]) for tp, hit in found.items()}

    def resolve(
        self,
        spec: OffsetSpec,
        tps: list[TopicPartition],
        *,
        missing: str,
        no_match: str,
        earliest: dict[TopicPartition, int] | None = None,
        latest: dict[TopicPartition, int] | None = None,
    ) -> dict[TopicPartition, int]:
        earliest = earliest if earliest is not None else self.earliest(tps)
        latest = latest if latest is not None else self.latest(tps)
        found = self.by_timestamp(timestamp_targets(spec, tps))
        return resolve_offsets(
            spec, tps, earliest, latest, found, missing=missing, no_match=no_match
        )

    def plan_batch(self) -> list[OffsetRange]:
        """Ranges of a batch query: startingOffsets .. endingOffsets, both captured now."""
        tps = self.partitions()
        earliest = self.earliest(tps)
        latest = self.latest(tps)
        start = self.resolve(
            self.opts.starting,
            tps,
            missing="earliest",
            no_match=self.opts.starting_by_timestamp_strategy,
            earliest=earliest,
            latest=latest,
        )
        end = self.resolve(
            self.opts.ending,
            tps,
            missing="latest",
            no_match="latest",
            earliest=earliest,
            latest=latest,
        )
        ranges = []
        for tp in tps:
            # Never past the HW: a JSON endingOffsets beyond it would read uncommitted data.
            stop = min(end[tp], latest[tp])
            begin = start[tp]
            if begin < earliest[tp]:
                data_loss(
                    f"{tp}: startingOffsets {begin} is below the log start offset {earliest[tp]}",
                    self.opts.fail_on_data_loss,
                )
                begin = earliest[tp]
            ranges.append(OffsetRange(tp.topic, tp.partition, begin, max(begin, stop)))
        return ranges


# ---------------------------------------------------------------------------------------------
# Executor side

_consumers: dict[tuple[str, tuple[tuple[str, Any], ...]], Consumer] = {}
_consumers_lock = threading.Lock()


def cached_consumer(opts: SourceOptions) -> Consumer:
    """One consumer per worker process and configuration, reused by the tasks it runs."""
    key = (opts.bootstrap_servers, tuple(sorted(opts.consumer.items())))
    with _consumers_lock:
        consumer = _consumers.get(key)
        if consumer is None:
            consumer = Consumer(opts.bootstrap_servers, auto_offset_reset="none", **opts.consumer)
            _consumers[key] = consumer
        return consumer


def drop_cached_consumer(opts: SourceOptions) -> None:
    key = (opts.bootstrap_servers, tuple(sorted(opts.consumer.items())))
    with _consumers_lock:
        consumer = _consumers.pop(key, None)
    if consumer is not None:
        try:
            consumer.close()
        except MiniBrokerError as err:
            log.warning("closing a minibroker consumer failed: %s", err)


def read_range(opts: SourceOptions, rng: OffsetRange) -> Iterator[list[Record]]:
    """The records of `rng` in offset order, in chunks as the consumer returns them.

    Offsets below the log start offset (deleted by retention while the query was behind) are
    data loss: an error, or a warning and a skip, per failOnDataLoss. A range that makes no
    progress for pollTimeoutMs fails, except when its end is above the current HW because the
    log was truncated (data loss again).

    A compacted log has no record at some offsets (gaps between batches, records removed
    inside them), so the range may end where no record is: it is done once the consumer's
    position (the next offset of the last batch read) reaches its end, never by waiting for a
    record at end - 1; a position moving past a gap is progress.
    """
    if rng.start >= rng.end:
        return
    consumer = cached_consumer(opts)
    tp = TopicPartition(rng.topic, rng.partition)
    try:
        yield from _read_range(consumer, opts, tp, rng)
    except BaseException:
        # A consumer in an unknown state (an error mid-fetch, a task killed) is not reused.
        drop_cached_consumer(opts)
        raise
    consumer.assign([])


def _read_range(
    consumer: Consumer, opts: SourceOptions, tp: TopicPartition, rng: OffsetRange
) -> Iterator[list[Record]]:
    position = rng.start
    end = rng.end
    consumer.assign([tp])
    consumer.seek(tp, position)
    last_progress = time.monotonic()
    while position < end:
        try:
            records = consumer.poll(timeout_ms=500)
        except OffsetOutOfRangeError:
            log_start = consumer.beginning_offsets([tp])[tp]
            if position >= log_start:
                raise
            data_loss(
                f"{tp}: offsets {position}..{min(log_start, end) - 1} were deleted before they "
                f"were read (log start offset {log_start})",
                opts.fail_on_data_loss,
            )
            position = log_start
            if position >= end:
                return
            consumer.seek(tp, position)
            last_progress = time.monotonic()
            continue
        if not records:
            # Past a gap (a compacted log), the consumer's position moves without a record;
            # at or past the end the range is done.
            moved_to = consumer.position(tp)
            if moved_to > position:
                position = moved_to
                last_progress = time.monotonic()
                continue
            if (time.monotonic() - last_progress) * 1000 < opts.poll_timeout_ms:
                continue
            high_watermark = consumer.end_offsets([tp])[tp]
            if high_watermark < end:
                data_loss(
                    f"{tp}: the planned range ends at {end} but the high watermark is now "
                    f"{high_watermark} (the log was truncated)",
                    opts.fail_on_data_loss,
                )
                return
            raise TimeoutError(
                f"{tp}: no records at offset {position} (range ends at {end}) within "
                f"kafkaConsumer.pollTimeoutMs={opts.poll_timeout_ms}"
            )
        last_progress = time.monotonic()
        if records[-1].offset >= end:
            records = [r for r in records if r.offset < end]
        if records:
            position = records[-1].offset + 1
            yield records
        else:
            position = end
