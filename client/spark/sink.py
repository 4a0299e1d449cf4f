"""The minibroker sink: `df.write.format("minibroker")` and `df.writeStream.format(...)`.

Does network I/O: each Spark task opens one AsyncProducer (on the process's client loop, see
`produce`), sends its rows, flushes, and returns a commit message only when every record was
acknowledged; otherwise the task fails with the broker's error. Rows arrive as Arrow record
batches (DataSourceArrowWriter), so columns are converted to Python values a batch at a time.

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

import asyncio
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

from minibroker.client.producer import AsyncProducer
from minibroker.client.spark.options import (
    OptionError,
    bootstrap_servers,
    get_option,
    producer_config,
)
from minibroker.client.sync import run_on_client_loop
from minibroker.client.types import RecordMetadata

log = logging.getLogger("minibroker.spark")

# Rows a task sends between checks for a failed record (fail fast) and chances for the
# producer's sender task to run.
_YIELD_EVERY_ROWS = 1024


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


class _Acks:
    """Collects acknowledgements (done-callbacks on the client loop; read by the task's thread
    once the loop has answered)."""

    def __init__(self) -> None:
        self.count = 0
        self.error: BaseException | None = None
        self.last_offsets: dict[str, int] = {}

    def on_done(self, future: asyncio.Future[RecordMetadata]) -> None:
        if future.cancelled():
            if self.error is None:
                self.error = RuntimeError("a send was cancelled before it was acknowledged")
            return
        error = future.exception()
        if error is not None:
            if self.error is None:
                self.error = error
            return
        md = future.result()
        self.count += 1
        key = f"{md.topic}-{md.partition}"
        if md.offset > self.last_offsets.get(key, -1):
            self.last_offsets[key] = md.offset

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error


def _headers(value: list[dict[str, Any]] | None) -> list[tuple[str, Any]] | None:
    if not value:
        return None
    return [(h["key"], h["value"]) for h in value]


def produce(opts: SinkOptions, batches: Iterator[Any]) -> ProduceResult:
    """Send every row with one producer, flush, and fail unless all were acknowledged.

    The producer is an AsyncProducer on the process's one client loop (the blocking clients'
    loop, a daemon thread), handed a whole Arrow batch at a time: about 4x the rate of the
    blocking facade, whose per-record hand-over between threads dominates (measured here).
    Not a private loop per task: Spark reuses a Python worker for task after task, and a loop
    closed at the end of a task while grpc.aio still had completions for it makes the next loop
    log "RuntimeError: Event loop is closed" (and drop the other completions it was handed).
    """
    ctx = TaskContext.get()
    batch_id_text = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
    task = _Task(opts)
    finished = False
    try:
        run_on_client_loop(task.start())
        # Spark's batches are read, and their columns converted, in the task's own thread, while
        # the loop thread keeps sending the records already handed over.
        for batch in batches:
            if batch.num_rows:
                run_on_client_loop(task.send(_rows(opts, batch)))
        run_on_client_loop(task.flush())
        finished = True
    finally:
        # A failing task does not wait for the rest of its buffer to be delivered.
        run_on_client_loop(task.close(None if finished else 0))
    if task.acks.count != task.sent:
        raise RuntimeError(f"only {task.acks.count} of {task.sent} records were acknowledged")
    return ProduceResult(
        partition_id=ctx.partitionId() if ctx is not None else -1,
        attempt=ctx.attemptNumber() if ctx is not None else 0,
        batch_id=int(batch_id_text) if batch_id_text else None,
        records=task.sent,
        last_offsets=task.acks.last_offsets,
    )


# One Arrow batch as rows: (topic, value, key, partition, headers).
_Row = tuple[str | None, Any, Any, int | None, list[tuple[str, Any]] | None]


def _rows(opts: SinkOptions, batch: Any) -> list[_Row]:
    n = batch.num_rows
    cols = {name.lower(): batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}
    values = cols["value"]
    keys = cols.get("key") or [None] * n
    parts = cols.get("partition") or [None] * n
    heads = cols.get("headers") or [None] * n
    topics: list[str | None] = [opts.topic] * n if opts.topic is not None else cols["topic"]
    return [(topics[i], values[i], keys[i], parts[i], _headers(heads[i])) for i in range(n)]


class _Task:
    """One task's producer and its acknowledgements; its coroutines run on the client loop."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts
        self.acks = _Acks()
        self.sent = 0
        self.producer: AsyncProducer | None = None

    async def start(self) -> None:
        # Made on the loop it runs on: its channels and tasks belong to that loop.
        self.producer = AsyncProducer(self.opts.bootstrap_servers, **self.opts.producer)
        await self.producer.start()

    async def send(self, rows: list[_Row]) -> None:
        assert self.producer is not None
        send = self.producer.send
        on_done = self.acks.on_done
        for topic, value, key, partition, headers in rows:
            if topic is None:
                raise OptionError(
                    "null topic present in the data; set the topic option or fill the topic column"
                )
            # Waits while the producer's buffer is full; the sender task runs meanwhile.
            future = await send(topic, value, key, partition, headers)
            future.add_done_callback(on_done)
            self.sent += 1
            if self.sent % _YIELD_EVERY_ROWS == 0:
                self.acks.raise_if_failed()
                await asyncio.sleep(0)

    async def flush(self) -> None:
        assert self.producer is not None
        await self.producer.flush()
        # Done-callbacks run one loop iteration after their future completes.
        await asyncio.sleep(0)
        self.acks.raise_if_failed()

    async def close(self, timeout_ms: int | None) -> None:
        if self.producer is not None:
            await self.producer.close(timeout_ms)


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
