"""Blocking Producer, Consumer and Admin for scripts and Spark tasks.

Does I/O by delegation: every object's async counterpart lives on one event loop per process
(uvloop where available) running in a daemon thread. Methods block the calling thread
until the loop has answered, except `Producer.send` and `send_batch`, which run the async
producer's record path in the caller's thread: the record is checked (bad input raises at once,
with the same typed errors as the async API) and appended to its batch under the accumulator's
lock, with no hand-over between threads per record. `send` returns the record's
`FutureRecordMetadata` (a concurrent.futures-style future over its batch's result).

Thread safety: a Producer may be shared by threads (sends from several threads interleave);
Consumer and Admin are meant for one thread at a time, like Kafka's. Never call these objects
from their own loop thread (e.g. inside a future's done-callback): that would wait on itself, so
it raises RuntimeError instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from minibroker.client.admin import (
    AlterConfigOp,
    AsyncAdmin,
    ClusterDescription,
    ConfigEntry,
    ConfigResource,
    CreatedTopic,
    NewTopic,
    PartitionReassignment,
    TopicDescription,
)
from minibroker.client.common.runtime import new_event_loop
from minibroker.client.consumer import AsyncConsumer
from minibroker.client.errors import MiniBrokerError, RequestTimedOutError
from minibroker.client.groups.admin import GroupDescription, GroupListing
from minibroker.client.groups.coordinator import CommittedOffset
from minibroker.client.metadata_cache import TopicInfo
from minibroker.client.produce_result import FutureRecordMetadata, SentRecords
from minibroker.client.producer import AsyncProducer
from minibroker.client.producer_record import HeadersIn
from minibroker.client.scram_admin import (
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from minibroker.client.transport import DEFAULT_BOOTSTRAP, ClientClosedError
from minibroker.client.types import Record, TopicPartition
from minibroker.metadata.acl import ANY_ACL, AclBinding, AclBindingFilter

T = TypeVar("T")

_SHARED: tuple[int, _LoopThread] | None = None
_SHARED_LOCK = threading.Lock()


def _shared_or_none() -> _LoopThread | None:
    return _SHARED[1] if _SHARED is not None else None


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()
        ready = threading.Event()

        def main() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.call_soon(ready.set)
            self.loop.run_forever()

        self.thread = threading.Thread(target=main, name=name, daemon=True)
        self.thread.start()
        ready.wait()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        if threading.current_thread() is self.thread:
            raise RuntimeError("blocking minibroker call from its own event-loop thread")
        if self.loop.is_closed():
            raise ClientClosedError("the client is closed")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise RequestTimedOutError(f"no answer within {timeout_s} s") from None

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a plain function on the loop thread and return its result."""

        async def wrapper() -> T:
            return fn(*args)

        return self.run(wrapper())

    @classmethod
    def shared(cls) -> _LoopThread:
        """The process's one client loop, started on first use.

        Every blocking client shares it: grpc.aio keeps process-wide state tied to the loops it
        has seen, and a second loop that is later closed leaves callbacks aimed at a dead loop
        ("Event loop is closed" after a client closes). A forked child (a Spark worker) gets a
        fresh loop, since threads do not survive fork.
        """
        global _SHARED
        with _SHARED_LOCK:
            if _SHARED is None or _SHARED[0] != os.getpid() or not _SHARED[1].thread.is_alive():
                _SHARED = (os.getpid(), cls("minibroker-client-loop"))
            return _SHARED[1]

    def stop(self) -> None:
        if self.loop.is_closed() or self is _shared_or_none():
            return  # the shared loop lives as long as the process
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        if not self.thread.is_alive():
            self.loop.close()


class Producer:
    """Blocking Kafka-shaped producer: `send` returns a `FutureRecordMetadata`
    (`.result(timeout)`, `.add_done_callback`, like a concurrent.futures.Future).

    Takes the same keyword arguments as AsyncProducer (acks, enable_idempotence, linger_ms,
    batch_size, compression_type, max_in_flight, retries, request_timeout_ms,
    delivery_timeout_ms, retry_backoff_ms, max_request_size, buffer_memory, max_block_ms, ...).
    `send` blocks only while the buffer is full (up to max_block_ms, then raises).
    """

    def __init__(
        self, bootstrap_servers: str | Sequence[str] = DEFAULT_BOOTSTRAP, **config: Any
    ) -> None:
        self._async = AsyncProducer(bootstrap_servers, **config)
        self._lt = _LoopThread.shared()
        self._lt.run(self._async.start())
        self._closed = False

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _info(self, topic: str) -> TopicInfo:
        p = self._async
        info = p.cluster.metadata.topics.get(topic) if type(topic) is str else None
        if info is None:
            if self._closed:
                raise ClientClosedError("send() after close(): the producer is closed")
            info = self._lt.run(p._topic(topic))
        return info

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int | None = None,
        headers: HeadersIn = None,
        timestamp_ms: int | None = None,
    ) -> FutureRecordMetadata:
        """Buffer one record; the returned future resolves to its RecordMetadata or error."""
        p = self._async
        info = p.cluster.metadata.topics.get(topic) if type(topic) is str else None
        if info is None:
            info = self._info(topic)
        if p._buffered.value >= p.buffer_memory:
            p._block_for_space()
        return p._append(topic, value, key, partition, headers, timestamp_ms, info)

    def send_batch(
        self,
        topic: str,
        values: Sequence[Any],
        keys: Sequence[Any] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> SentRecords:
        """Buffer many records in one call (see AsyncProducer.send_batch); `.result(timeout)`
        on the returned SentRecords gives every RecordMetadata in order."""
        p = self._async
        info = self._info(topic)
        out = p._new_sent(values, keys, partition, timestamp_ms, topic, info)
        start, total = 0, len(values)
        while start < total:
            if p.accumulator.buffered_bytes >= p.buffer_memory:
                p._block_for_space()
            start += p._append_batch(topic, values, keys, partition, None, info, out, start)
        return out

    def flush(self, timeout_ms: int | None = None) -> None:
        """Block until every record sent so far is acknowledged or failed."""
        self._lt.run(self._async.flush(timeout_ms))

    def partitions_for(self, topic: str) -> list[int]:
        return self._lt.run(self._async.partitions_for(topic))

    def close(self, timeout_ms: int | None = None) -> None:
        """Send what is buffered (up to `timeout_ms`), then release the loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._lt.run(self._async.close(timeout_ms))
        finally:
            self._lt.stop()


class Consumer:
    """Blocking Kafka-shaped consumer: manual `assign`, or `subscribe` with a `group_id` (see
    AsyncConsumer for options).

    Iterating over a Consumer yields records forever (poll in a loop).
    """

    def __init__(
        self, bootstrap_servers: str | Sequence[str] = DEFAULT_BOOTSTRAP, **config: Any
    ) -> None:
        self._async = AsyncConsumer(bootstrap_servers, **config)
        self._lt = _LoopThread.shared()
        self._lt.run(self._async.start())
        self._closed = False

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Record]:
        """Records one at a time, for ever. The position follows what was yielded, as
        kafka-python's iterator does: leaving the loop early (break) seeks each partition back
        to its first record not yet yielded, so a commit (or close's auto-commit) never marks
        as consumed a record the loop did not see."""
        while True:
            records = self.poll(1000)
            for i, record in enumerate(records):
                try:
                    yield record
                except GeneratorExit:
                    self._rewind(records[i + 1 :])
                    raise

    def _rewind(self, unseen: Sequence[Record]) -> None:
        first: dict[TopicPartition, int] = {}
        for record in unseen:
            tp = TopicPartition(record.topic, record.partition)
            if tp not in first or record.offset < first[tp]:
                first[tp] = record.offset
        if self._closed:
            return
        assigned = self.assignment()
        for tp, offset in first.items():
            if tp in assigned:  # else revoked by a rebalance since: no longer ours to rewind
                self.seek(tp, offset)

    def assign(self, partitions: Iterable[TopicPartition | tuple[str, int]]) -> None:
        self._lt.call(self._async.assign, list(partitions))

    def assignment(self) -> set[TopicPartition]:
        return self._lt.call(self._async.assignment)

    def subscribe(
        self,
        topics: Iterable[str],
        on_assign: Callable[[set[TopicPartition]], Any] | None = None,
        on_revoke: Callable[[set[TopicPartition]], Any] | None = None,
    ) -> None:
        """Join the consumer group for `topics` (needs group_id); poll() does the joining.
        The callbacks run on the client's event-loop thread: they must not call this Consumer."""
        topic_list = [topics] if isinstance(topics, str) else list(topics)
        self._lt.call(self._async.subscribe, topic_list, on_assign, on_revoke)

    def subscription(self) -> set[str]:
        return self._lt.call(self._async.subscription)

    def unsubscribe(self) -> None:
        self._lt.run(self._async.unsubscribe())

    def commit(self, offsets: Mapping[TopicPartition, int | tuple[int, str]] | None = None) -> None:
        """Commit positions (or the given offsets) synchronously."""
        self._lt.run(self._async.commit(dict(offsets) if offsets is not None else None))

    def committed(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        return self._lt.run(self._async.committed(list(partitions)))

    def member_id(self) -> str | None:
        return self._lt.call(self._async.member_id)

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._lt.call(self._async.seek, tp, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._lt.call(self._async.seek_to_beginning, *partitions)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._lt.call(self._async.seek_to_end, *partitions)

    def position(self, tp: TopicPartition) -> int:
        return self._lt.run(self._async.position(tp))

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> list[Record]:
        return self._lt.run(self._async.poll(timeout_ms, max_records))

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._lt.run(self._async.beginning_offsets(list(partitions)))

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._lt.run(self._async.end_offsets(list(partitions)))

    def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, tuple[int, int] | None]:
        return self._lt.run(self._async.offsets_for_times(dict(timestamps)))

    def partitions_for_topic(self, topic: str) -> set[int]:
        async def run() -> set[int]:
            info = await self._async.cluster.wait_for_topic(topic, self._async.max_block_ms)
            return set(info.partitions)

        return self._lt.run(run())

    def highwater(self, tp: TopicPartition) -> int | None:
        return self._lt.call(self._async.highwater, tp)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._lt.run(self._async.close())
        finally:
            self._lt.stop()


class Admin:
    """Blocking admin client (see AsyncAdmin)."""

    def __init__(
        self, bootstrap_servers: str | Sequence[str] = DEFAULT_BOOTSTRAP, **config: Any
    ) -> None:
        self._async = AsyncAdmin(bootstrap_servers, **config)
        self._lt = _LoopThread.shared()
        self._closed = False

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create_topics(
        self, new_topics: Iterable[NewTopic], *, validate_only: bool = False
    ) -> dict[str, CreatedTopic]:
        return self._lt.run(
            self._async.create_topics(list(new_topics), validate_only=validate_only)
        )

    def create_topic(
        self,
        name: str,
        num_partitions: int = -1,
        replication_factor: int = -1,
        configs: Mapping[str, str] | None = None,
    ) -> CreatedTopic:
        return self._lt.run(
            self._async.create_topic(name, num_partitions, replication_factor, configs)
        )

    def delete_topics(self, names: Iterable[str]) -> None:
        self._lt.run(self._async.delete_topics(list(names)))

    def list_topics(self) -> list[str]:
        return self._lt.run(self._async.list_topics())

    def describe_topics(
        self, names: Iterable[str] | None = None, *, include_offsets: bool = True
    ) -> list[TopicDescription]:
        wanted = None if names is None else list(names)
        return self._lt.run(self._async.describe_topics(wanted, include_offsets=include_offsets))

    def describe_cluster(self) -> ClusterDescription:
        return self._lt.run(self._async.describe_cluster())

    def elect_leaders(
        self,
        election_type: str = "preferred",
        partitions: Iterable[TopicPartition] | None = None,
    ) -> dict[TopicPartition, MiniBrokerError | None]:
        wanted = None if partitions is None else list(partitions)
        return self._lt.run(self._async.elect_leaders(election_type, wanted))

    def unregister_broker(self, broker_id: int) -> None:
        self._lt.run(self._async.unregister_broker(broker_id))

    def alter_partition_reassignments(
        self, reassignments: Mapping[TopicPartition, Sequence[int] | None]
    ) -> dict[TopicPartition, MiniBrokerError | None]:
        return self._lt.run(self._async.alter_partition_reassignments(reassignments))

    def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, PartitionReassignment]:
        return self._lt.run(self._async.list_partition_reassignments(partitions))

    def create_partitions(
        self,
        new_counts: Mapping[str, int],
        assignments: Mapping[str, Sequence[Sequence[int]]] | None = None,
        validate_only: bool = False,
    ) -> None:
        self._lt.run(self._async.create_partitions(new_counts, assignments, validate_only))

    def incremental_alter_configs(
        self,
        changes: Mapping[ConfigResource, Sequence[AlterConfigOp]],
        validate_only: bool = False,
    ) -> None:
        self._lt.run(self._async.incremental_alter_configs(changes, validate_only))

    def describe_configs(
        self, resources: Iterable[ConfigResource], keys: Iterable[str] = ()
    ) -> dict[ConfigResource, list[ConfigEntry]]:
        return self._lt.run(self._async.describe_configs(resources, keys))

    def decommission_broker(self, broker_id: int, cancel: bool = False) -> int:
        return self._lt.run(self._async.decommission_broker(broker_id, cancel))

    def create_acls(self, acls: Iterable[AclBinding]) -> None:
        self._lt.run(self._async.create_acls(acls))

    def delete_acls(self, filters: Iterable[AclBindingFilter]) -> list[list[AclBinding]]:
        return self._lt.run(self._async.delete_acls(filters))

    def list_groups(self, states: Iterable[str] = ()) -> list[GroupListing]:
        return self._lt.run(self._async.list_groups(list(states)))

    def describe_groups(self, group_ids: Iterable[str]) -> dict[str, GroupDescription]:
        return self._lt.run(self._async.describe_groups(list(group_ids)))

    def list_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, CommittedOffset]:
        wanted = list(partitions) if partitions is not None else None
        return self._lt.run(self._async.list_group_offsets(group_id, wanted))

    def alter_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int | CommittedOffset]
    ) -> None:
        self._lt.run(self._async.alter_group_offsets(group_id, dict(offsets)))

    def delete_groups(self, group_ids: Iterable[str]) -> dict[str, MiniBrokerError | None]:
        return self._lt.run(self._async.delete_groups(list(group_ids)))

    def describe_acls(self, flt: AclBindingFilter = ANY_ACL) -> list[AclBinding]:
        return self._lt.run(self._async.describe_acls(flt))

    def alter_user_scram_credentials(
        self,
        alterations: Iterable[UserScramCredentialUpsertion | UserScramCredentialDeletion],
    ) -> dict[str, MiniBrokerError | None]:
        return self._lt.run(self._async.alter_user_scram_credentials(list(alterations)))

    def describe_user_scram_credentials(
        self, users: Iterable[str] | None = None
    ) -> dict[str, list[ScramCredentialInfo]]:
        wanted = None if users is None or isinstance(users, str) else list(users)
        if isinstance(users, str):
            raise TypeError(f"users must be an iterable of names, got {users!r}")
        return self._lt.run(self._async.describe_user_scram_credentials(wanted))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._lt.run(self._async.close())
        finally:
            self._lt.stop()


def run_on_client_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on the process's one client loop (the blocking clients' loop) and wait for it.

    For code that drives the async API from a thread of its own, such as a Spark task: a private
    loop per call that is then closed leaves grpc.aio completions aimed at a closed loop (see
    `_LoopThread.shared`). Never call it from a coroutine on that loop.
    """
    return _LoopThread.shared().run(coro)


__all__ = ["Admin", "Consumer", "Producer", "run_on_client_loop"]
