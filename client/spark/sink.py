"""The minibroker sink: `df.write.format("minibroker")` and `df.writeStream.format(...)`.

Does network I/O: each Spark task opens one blocking Producer (on the process's client loop, see
`produce`), sends its rows, flushes, and returns a commit message only when every record was
acknowledged; otherwise the task fails with the broker's error. Rows arrive as Arrow record
batches (DataSourceArrowWriter), so columns are converted to Python values a batch at a time,
and a batch with one topic and no partition or headers column goes to the producer in one
`send_batch` call (the per-record work in compiled code).

Columns, as in Spark's Kafka sink: `value` (required, string or binary), `key` (optional,
string or binary; missing or null means a null key), `topic` (string; the `topic` option, when
set, overrides it), `partition` (int; missing or null: the producer's partitioner), `headers`
(array<struct<key:string,value:binary>>). Producer settings pass through under Kafka's names
(`acks`, default all; `compression.type`; `linger.ms`; ...).

Delivery guarantee: at least once. With acks=all (the default) the producer is idempotent, so its
own retries within a task never store a record twice; but a record a task sent before it failed
is sent again when Spark retries the task or replays a micro-batch (a new producer session with a
new producer id), exactly as with Spark's Kafka sink. `abort` cannot take records back.

Concurrency: `write` runs in executor workers on unpickled copies of the writer; `commit` and
`abort` run in other processes on other copies (docs/design.md §11).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructType,
)

from minibroker.client.produce_result import FutureRecordMetadata, SentRecords
from minibroker.client.spark.options import (
    OptionError,
    bootstrap_servers,
    get_option,
    producer_config,
)
from minibroker.client.sync import Producer

log = logging.getLogger("minibroker.spark")


@dataclass(frozen=True)
class SinkOptions:
    bootstrap_servers: str
    topic: str | None
    producer: dict[str, Any]
    columns: tuple[str, ...]  # the input columns the sink uses


def parse_sink_options(options: Mapping[str, str], schema: StructType) -> SinkOptions:
    """Check the input DataFrame's columns the way Spark's Kafka sink does."""
    fields = {f.name.lower(): f for f in schema.fields}
    topic = get_option(options, "topic")
    if "value" not in fields:
        raise OptionError("the minibroker sink needs a 'value' column (string or binary)")
    for name in ("key", "value"):
        f = fields.get(name)
        if f is not None and not isinstance(f.dataType, StringType | BinaryType):
            raise OptionError(
                f"column {name!r} must be string or binary, not {f.dataType.simpleString()}; "
                "cast it first"
            )
    if topic is None:
        f = fields.get("topic")
        if f is None:
            raise OptionError(
                "topic option required when no 'topic' column is present in the input data"
            )
        if not isinstance(f.dataType, StringType):
            raise OptionError(f"column 'topic' must be string, not {f.dataType.simpleString()}")
    f = fields.get("partition")
    if f is not None and not isinstance(f.dataType, IntegerType):
        raise OptionError(f"column 'partition' must be int, not {f.dataType.simpleString()}")
    f = fields.get("headers")
    if f is not None and not _is_headers_type(f.dataType):
        raise OptionError(
            "column 'headers' must be array<struct<key:string,value:binary>>, not "
            f"{f.dataType.simpleString()}"
        )
    used = tuple(
        fields[name].name
        for name in ("key", "value", "topic", "partition", "headers")
        if name in fields
    )
    return SinkOptions(bootstrap_servers(options), topic, producer_config(options), used)


def _is_headers_type(data_type: Any) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    inner = {f.name: f.dataType for f in data_type.elementType.fields}
    return (
        set(inner) == {"key", "value"}
        and isinstance(inner["key"], StringType)
        and isinstance(inner["value"], StringType | BinaryType)
    )


@dataclass
class ProduceResult(WriterCommitMessage):
    """What one task wrote: records acknowledged, and the last offset per 'topic-partition'."""

    partition_id: int
    attempt: int
    batch_id: int | None
    records: int
    last_offsets: dict[str, int] = field(default_factory=dict)


class _Outcomes:
    """The futures of one task's records: `SentRecords` per Arrow batch, or one future per row
    for rows sent one at a time. Read once everything is flushed."""

    def __init__(self) -> None:
        self.sent = 0
        self.batches: list[SentRecords] = []
        self.singles: list[FutureRecordMetadata] = []

    def failed(self) -> BaseException | None:
        """The first error among the records that are done (fail fast: it stops the task)."""
        for batch in self.batches[-2:]:
            if batch.done():
                error = batch.exception(timeout=0)
                if error is not None:
                    return error
        return None

    def summary(self) -> tuple[int, dict[str, int]]:
        """(records acknowledged, last offset per 'topic-partition'); raises the first error."""
        last: dict[str, int] = {}
        count = 0
        for batch in self.batches:
            error = batch.exception(timeout=0)
            if error is not None:
                raise error
            for tp, offset in batch.last_offsets().items():
                key = f"{tp.topic}-{tp.partition}"
                if offset > last.get(key, -1):
                    last[key] = offset
            count += len(batch)
        for future in self.singles:
            md = future.result(timeout=0)
            key = f"{md.topic}-{md.partition}"
            if md.offset > last.get(key, -1):
                last[key] = md.offset
            count += 1
        return count, last


def _headers(value: list[dict[str, Any]] | None) -> list[tuple[str, Any]] | None:
    if not value:
        return None
    return [(h["key"], h["value"]) for h in value]


def produce(opts: SinkOptions, batches: Iterator[Any]) -> ProduceResult:
    """Send every row with one producer, flush, and fail unless all were acknowledged.

    The producer is the blocking Producer: its records are appended to their batches in this
    (the task's) thread, while the process's one client loop (a daemon thread) sends the batches
    already full. Not a private loop per task: Spark reuses a Python worker for task after task,
    and a loop closed at the end of a task while grpc.aio still had completions for it makes the
    next loop log "RuntimeError: Event loop is closed" (and drop the other completions it was
    handed).
    """
    ctx = TaskContext.get()
    batch_id_text = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
    producer = Producer(opts.bootstrap_servers, **opts.producer)
    outcomes = _Outcomes()
    finished = False
    try:
        for batch in batches:
            if batch.num_rows:
                _send(producer, opts, batch, outcomes)
                error = outcomes.failed()
                if error is not None:
                    raise error
        producer.flush()
        finished = True
    finally:
        # A failing task does not wait for the rest of its buffer to be delivered.
        producer.close(None if finished else 0)
    acknowledged, last_offsets = outcomes.summary()
    if acknowledged != outcomes.sent:
        raise RuntimeError(f"only {acknowledged} of {outcomes.sent} records were acknowledged")
    return ProduceResult(
        partition_id=ctx.partitionId() if ctx is not None else -1,
        attempt=ctx.attemptNumber() if ctx is not None else 0,
        batch_id=int(batch_id_text) if batch_id_text else None,
        records=outcomes.sent,
        last_offsets=last_offsets,
    )


def _send(producer: Producer, opts: SinkOptions, batch: Any, outcomes: _Outcomes) -> None:
    """One Arrow batch: in one `send_batch` when the rows share a topic and leave partition and
    headers to the producer, else row by row."""
    n = batch.num_rows
    cols = {name.lower(): batch.column(i) for i, name in enumerate(batch.schema.names)}
    values = cols["value"].to_pylist()
    key_col = cols.get("key")
    keys = key_col.to_pylist() if key_col is not None and key_col.null_count < n else None
    part_col = cols.get("partition")
    head_col = cols.get("headers")
    whole = (
        opts.topic is not None
        and (part_col is None or part_col.null_count == n)
        and (head_col is None or head_col.null_count == n)
    )
    if whole:
        assert opts.topic is not None
        outcomes.batches.append(producer.send_batch(opts.topic, values, keys=keys))
        outcomes.sent += n
        return
    topics: list[str | None] = (
        [opts.topic] * n if opts.topic is not None else cols["topic"].to_pylist()
    )
    parts = part_col.to_pylist() if part_col is not None else [None] * n
    heads = head_col.to_pylist() if head_col is not None else [None] * n
    send = producer.send
    for i in range(n):
        topic = topics[i]
        if topic is None:
            raise OptionError(
                "null topic present in the data; set the topic option or fill the topic column"
            )
        key = keys[i] if keys is not None else None
        outcomes.singles.append(send(topic, values[i], key, parts[i], _headers(heads[i])))
        outcomes.sent += 1


def _summary(messages: list[WriterCommitMessage | None]) -> tuple[int, int]:
    done = [m for m in messages if isinstance(m, ProduceResult)]
    return len(done), sum(m.records for m in done)


class MiniBrokerBatchWriter(DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return produce(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        tasks, records = _summary(messages)
        log.info("minibroker sink: %d tasks wrote %d records", tasks, records)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        tasks, records = _summary(messages)
        # Acknowledged records stay in the log: a produced record cannot be taken back.
        log.warning(
            "minibroker sink: job aborted; %d finished tasks had written %d records that stay "
            "in the topic (at-least-once)",
            tasks,
            records,
        )


class MiniBrokerStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return produce(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        tasks, records = _summary(messages)
        log.info("minibroker sink: batch %d: %d tasks wrote %d records", batchId, tasks, records)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _tasks, records = _summary(messages)
        log.warning(
            "minibroker sink: batch %d aborted; %d records already written stay (at-least-once)",
            batchId,
            records,
        )
