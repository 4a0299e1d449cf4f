"""AsyncAdmin: topics, cluster description, leader elections, broker unregistration and
decommissioning, partition reassignments (KIP-455), CreatePartitions, dynamic configs
(IncrementalAlterConfigs, DescribeConfigs), ACLs (CreateAcls, DeleteAcls, DescribeAcls) and
consumer groups (ListGroups, DescribeGroups, OffsetFetch, OffsetCommit, DeleteGroups over
KafkaGroupCall: client/groups/admin.py).

Does network I/O through `ClusterClient`. Metadata comes from any broker (BrokerService.Metadata);
the Metadata response names the controller's address, and topic creation and deletion, cluster
description and elections go to the ControllerService there directly (Kafka forwards admin
requests through a broker; calling the controller is one hop less). With a quorum of
controllers, one that is not the active one answers NOT_CONTROLLER naming the leader (and its
epoch): the call is re-sent there at once, and retried until default_api_timeout_ms; a hint
of an older epoch than one already followed is ignored. `describe_topics` adds each
replica's log end offset and the leader's high watermark from every broker's DescribeReplicas.

Concurrency: every method runs on the caller's event loop; no background tasks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from minibroker.client import scram_admin, wire
from minibroker.client.common.tls import client_tls
from minibroker.client.controller_finder import LeaderHint
from minibroker.client.errors import (
    ErrorCode,
    MiniBrokerError,
    NetworkExceptionError,
    NoReassignmentInProgressError,
    ReassignmentInProgressError,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownServerError,
)
from minibroker.client.groups.admin import (
    GroupAdmin,
    GroupDescription,
    GroupListing,
)
from minibroker.client.groups.coordinator import CommittedOffset
from minibroker.client.scram_admin import (
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from minibroker.client.transport import (
    DEFAULT_BOOTSTRAP,
    ClientClosedError,
    ClusterClient,
    check_topic_name,
    now_ms,
    topic_metadata_error,
    unknown_topic_error,
)
from minibroker.client.types import TopicPartition
from minibroker.metadata import acl_wire
from minibroker.metadata.acl import ANY_ACL, AclBinding, AclBindingFilter


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create. -1 partitions / replication factor: the controller's defaults."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PartitionDescription:
    """One partition: the controller's record plus each replica's live offsets.

    `high_watermark` comes from the leader (-1 when it did not answer); `log_end_offsets` maps
    each replica to its LEO, None for a replica whose broker did not answer.
    """

    topic: str
    partition: int
    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...]
    high_watermark: int = -1
    log_end_offsets: Mapping[int, int | None] = field(default_factory=dict)
    # A compacted topic's log cleaner per replica (issue 21): offsets below the cleaner point
    # are clean; the dirty ratio is what the cleaner weighs against min.cleanable.dirty.ratio.
    # Empty for other topics; None for a replica whose broker did not answer.
    cleaner_points: Mapping[int, int | None] = field(default_factory=dict)
    dirty_ratios: Mapping[int, float | None] = field(default_factory=dict)
    # A reassignment in progress (KIP-455): `replicas` is the target followed by the replicas
    # being removed; () when none runs.
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    topic_id: str
    partitions: tuple[PartitionDescription, ...]
    configs: Mapping[str, str] = field(default_factory=dict)

    @property
    def replication_factor(self) -> int:
        return len(self.partitions[0].replicas) if self.partitions else 0


@dataclass(frozen=True, slots=True)
class BrokerDescription:
    broker_id: int
    host: str
    port: int
    rack: str
    fenced: bool
    in_controlled_shutdown: bool
    broker_epoch: int
    last_heartbeat_ms_ago: int
    decommissioning: bool = False  # marked: its replicas move away, it gets no new ones
    replica_count: int = 0  # partitions whose replicas (adding ones too) name it
    leader_count: int = 0


@dataclass(frozen=True, slots=True)
class ClusterDescription:
    cluster_id: str
    controller_id: int
    metadata_offset: int
    brokers: tuple[BrokerDescription, ...]


@dataclass(frozen=True, slots=True)
class CreatedTopic:
    name: str
    topic_id: str
    num_partitions: int
    replication_factor: int


_MAX_INT32 = 2**31 - 1


@dataclass(frozen=True, slots=True)
class PartitionReassignment:
    """A reassignment in progress: `replicas` is the target followed by the replicas being
    removed (Kafka's PartitionReassignment)."""

    replicas: tuple[int, ...]
    adding_replicas: tuple[int, ...]
    removing_replicas: tuple[int, ...]

    @property
    def target_replicas(self) -> tuple[int, ...]:
        return tuple(b for b in self.replicas if b not in self.removing_replicas)


def _broker_resource_name(name: str) -> bool:
    """A broker id in canonical decimal form, or "" (the cluster-wide default)."""
    return name == "" or (
        len(name) <= 10
        and name.isascii()
        and name.isdigit()
        and str(int(name)) == name
        and int(name) <= _MAX_INT32
    )


@dataclass(frozen=True, slots=True)
class ConfigResource:
    """What a config belongs to (Kafka's ConfigResource): type "topic" (name: the topic) or
    "broker" (name: a broker id such as "1", or "" for the default of every broker)."""

    type: str
    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.type, str):
            raise TypeError(f"ConfigResource type must be a str, got {self.type!r}")
        kind = self.type.lower()
        if kind not in wire.CONFIG_RESOURCE_TYPES:
            raise ValueError(f"ConfigResource type must be 'topic' or 'broker', got {self.type!r}")
        object.__setattr__(self, "type", kind)
        if not isinstance(self.name, str):
            raise TypeError(f"ConfigResource name must be a str, got {self.name!r}")
        if kind == "topic":
            check_topic_name(self.name)
        elif not _broker_resource_name(self.name):
            raise ValueError(
                f"a broker ConfigResource's name is a broker id ('1') or '' for every broker, "
                f"got {self.name!r}"
            )


@dataclass(frozen=True, slots=True)
class AlterConfigOp:
    """One change of IncrementalAlterConfigs (Kafka's AlterConfigOp): op "set" (value), "delete"
    (back to the default; value ignored), "append" / "subtract" (an item of a list-valued
    config such as leader.replication.throttled.replicas)."""

    name: str
    op: str
    value: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"AlterConfigOp name must be a str, got {self.name!r}")
        if not self.name:
            raise ValueError("AlterConfigOp name must not be empty")
        if not isinstance(self.op, str):
            raise TypeError(f"AlterConfigOp op must be a str, got {self.op!r}")
        op = self.op.lower()
        if op not in wire.CONFIG_OPS:
            raise ValueError(
                f"AlterConfigOp op must be 'set', 'delete', 'append' or 'subtract', got {self.op!r}"
            )
        object.__setattr__(self, "op", op)
        if self.value is not None and not isinstance(self.value, str):
            raise TypeError(f"AlterConfigOp value must be a str or None, got {self.value!r}")
        if op != "delete" and self.value is None:
            raise ValueError(f"AlterConfigOp {op!r} of {self.name!r} needs a value")


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One config as DescribeConfigs answers it. `source` is Kafka's ConfigSource name:
    DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG,
    STATIC_BROKER_CONFIG or DEFAULT_CONFIG."""

    name: str
    value: str | None
    source: str
    read_only: bool = False
    documentation: str = ""


def _check_int(what: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if not low <= value <= _MAX_INT32:
        raise ValueError(f"{what} must be between {low} and {_MAX_INT32}, got {value}")
    return value


def _check_bool(what: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{what} must be a bool, got {value!r}")
    return value


def _topic_partition(tp: object) -> TopicPartition:
    """A TopicPartition (or a (topic, partition) pair), checked."""
    if not isinstance(tp, tuple) or len(tp) != 2:
        raise TypeError(f"expected a TopicPartition, got {tp!r}")
    topic, partition = tp
    check_topic_name(topic)
    _check_int(f"partition of {topic!r}", partition, 0)
    return TopicPartition(topic, partition)


def _replica_ids(what: str, replicas: object) -> tuple[int, ...]:
    """A replica list: a sequence of broker ids (ints 0..2**31-1). Empty lists, duplicates and
    unknown brokers are the controller's INVALID_REPLICA_ASSIGNMENT."""
    if isinstance(replicas, (str, bytes)) or not isinstance(replicas, Sequence):
        raise TypeError(f"{what} must be a sequence of broker ids, got {replicas!r}")
    return tuple(_check_int(f"a broker id in {what}", b, 0) for b in replicas)


def _check_mapping(what: str, value: object) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must be a mapping, got {type(value).__name__}")
    return value


class AsyncAdmin:
    """Kafka-shaped admin client for asyncio code."""

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str] = DEFAULT_BOOTSTRAP,
        *,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = 100,
        default_api_timeout_ms: int = 60_000,
        security_protocol: str = "PLAINTEXT",
        ssl_ca_location: str | None = None,
        ssl_certificate_location: str | None = None,
        ssl_key_location: str | None = None,
        sasl_mechanism: str | None = None,
        sasl_username: str | None = None,
        sasl_password: str | None = None,
    ) -> None:
        self.request_timeout_ms = request_timeout_ms
        self.default_api_timeout_ms = default_api_timeout_ms
        self.cluster = ClusterClient(
            bootstrap_servers,
            request_timeout_ms=request_timeout_ms,
            retry_backoff_ms=retry_backoff_ms,
            tls=client_tls(
                security_protocol,
                ssl_ca_location,
                ssl_certificate_location,
                ssl_key_location,
                sasl_mechanism,
                sasl_username,
                sasl_password,
            ),
        )
        # The newest NOT_CONTROLLER hint that named the active controller (preferred over the
        # brokers' metadata, which may lag an election), and the newest quorum epoch seen.
        self._controller_hint: LeaderHint | None = None
        self._controller_epoch = -1
        self._groups: GroupAdmin | None = None

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.cluster.close()

    def _check_open(self) -> None:
        if self.cluster.closed:
            raise ClientClosedError("the admin client is closed; create a new one")

    # -- controller calls ----------------------------------------------------------------------

    async def _controller_call(self, method: str, request: Any) -> Any:
        return (await self._controller_call_sent(method, request))[0]

    def _follow_hint(self, address: str, hint: LeaderHint | None) -> bool:
        """`address` answered NOT_CONTROLLER with `hint`; True when the hint names another
        controller to call at once."""
        if self._controller_hint is not None and self._controller_hint.address == address:
            self._controller_hint = None
        if hint is None or hint.epoch < self._controller_epoch:
            return False  # no hint, or older news than a leader already followed
        self._controller_epoch = hint.epoch
        if hint.address and hint.address != address:
            self._controller_hint = hint
            return True
        return False

    async def _controller_call_sent(self, method: str, request: Any) -> tuple[Any, bool]:
        """Call the active controller, finding it through broker metadata and NOT_CONTROLLER
        hints; retries retriable failures until default_api_timeout_ms (the controller may be
        restarting, or a quorum electing a new leader). Returns the answer and whether an
        earlier attempt may have reached a controller (it got no answer, or NOT_CONTROLLER
        from a leader that lost its leadership while the command was pending)."""
        self._check_open()
        deadline = now_ms() + self.default_api_timeout_ms
        last: MiniBrokerError | None = None
        resent = False
        while now_ms() < deadline:
            hinted = self._controller_hint
            address = hinted.address if hinted else self.cluster.metadata.controller_address()
            if address is None:
                try:
                    self.cluster.metadata.update(await self.cluster.fetch_metadata(), now_ms())
                except MiniBrokerError as err:
                    last = err
                address = self.cluster.metadata.controller_address()
                if address is None:
                    # No broker answered, or none knows the controller yet (it may be
                    # restarting): try again until the deadline.
                    last = last or NetworkExceptionError(
                        "the brokers do not know the controller's address yet"
                    )
                    await asyncio.sleep(self.cluster.retry_backoff_ms / 1000)
                    continue
            stub = self.cluster.controller_stub(address)
            timeout_ms = max(min(self.request_timeout_ms, deadline - now_ms()), 1)
            pending = getattr(stub, method)(request, timeout=timeout_ms / 1000)
            try:
                return await wire.call(pending, f"controller {address}"), resent
            except wire.CallFailed as failed:
                last = failed.error
                if not last.retriable:
                    raise last from None
                resent = resent or not failed.unreachable
                if failed.leader_hint is not None:
                    if self._follow_hint(address, failed.leader_hint):
                        continue  # the active controller is named: call it now
                elif self._controller_hint is not None and self._controller_hint.address == address:
                    self._controller_hint = None  # the hinted leader is gone
                # The controller may have moved or restarted: ask the brokers again.
                self.cluster.metadata.controller_host = ""
                await asyncio.sleep(self.cluster.retry_backoff_ms / 1000)
        raise last or RequestTimedOutError("the controller did not answer in time")

    async def create_topics(
        self, new_topics: Iterable[NewTopic], *, validate_only: bool = False
    ) -> dict[str, CreatedTopic]:
        """Create topics; raises the typed error of the first failure (others are named in
        its message). Returns what was created, by name."""
        topics = list(new_topics)
        for topic in topics:
            # The controller refuses these too; refusing here needs no cluster to answer.
            check_topic_name(topic.name)
        request = wire.create_topics_request(
            [(t.name, t.num_partitions, t.replication_factor, t.configs) for t in topics],
            self.request_timeout_ms,
            validate_only,
        )
        resp, resent = await self._controller_call_sent("CreateTopics", request)
        created: dict[str, CreatedTopic] = {}
        failures: list[tuple[str, MiniBrokerError]] = []
        for r in wire.created_topics(resp):
            if r.error is not None:
                error = r.error
                if resent and isinstance(error, TopicAlreadyExistsError):
                    # An attempt before a controller failover may have created it, its answer
                    # lost with the old leader. Kafka's admin client reports
                    # TopicExistsException in that case too, and so do we: the topic may also
                    # be someone else's, with other settings, and only the caller can judge
                    # (describe it). The message says a retry happened.
                    error = TopicAlreadyExistsError(
                        f"{error} (the request was re-sent after a controller failover or "
                        "timeout: an earlier attempt may have created it)"
                    )
                failures.append((r.name, error))
            else:
                created[r.name] = CreatedTopic(
                    r.name, r.topic_id, r.num_partitions, r.replication_factor
                )
        _raise_first(failures, "create topic")
        if created and not validate_only:
            await self._wait_for_leaders(created)
        return created

    async def _wait_for_leaders(self, created: Mapping[str, CreatedTopic]) -> None:
        """Best effort: wait (up to 10 s) until the brokers' metadata shows every new partition
        with a leader, so that a describe or produce right after creation finds the topic.
        The controller has committed the topic either way; a slow broker only delays this."""
        await self._wait_for_metadata(
            sorted(created),
            lambda name, info: (
                info.topic_id == created[name].topic_id
                and len(info.partitions) == created[name].num_partitions
            ),
        )

    async def _wait_for_metadata(
        self, names: Sequence[str], ready: Callable[[str, Any], bool]
    ) -> None:
        """Best effort: wait (up to 10 s) until the brokers' metadata shows every topic of
        `names` without error, `ready(name, info)`, and every partition with a leader."""
        deadline = now_ms() + min(self.default_api_timeout_ms, 10_000)
        while now_ms() < deadline:
            try:
                snapshot = await self.cluster.fetch_metadata(list(names))
            except MiniBrokerError:
                snapshot = None
            if snapshot is not None and all(
                (info := snapshot.topics.get(name)) is not None
                and info.error_code == ErrorCode.NONE
                and ready(name, info)
                and all(p.leader >= 0 for p in info.partitions.values())
                for name in names
            ):
                self.cluster.metadata.update(snapshot, now_ms())
                return
            await asyncio.sleep(self.cluster.retry_backoff_ms / 1000)

    async def create_topic(
        self,
        name: str,
        num_partitions: int = -1,
        replication_factor: int = -1,
        configs: Mapping[str, str] | None = None,
    ) -> CreatedTopic:
        created = await self.create_topics(
            [NewTopic(name, num_partitions, replication_factor, dict(configs or {}))]
        )
        return created[name]

    async def delete_topics(self, names: Iterable[str]) -> None:
        names = list(names)
        request = wire.delete_topics_request(names, self.request_timeout_ms)
        resp = await self._controller_call("DeleteTopics", request)
        _raise_first(wire.delete_topics_failures(resp), "delete topic")

    async def describe_cluster(self) -> ClusterDescription:
        resp = await self._controller_call("DescribeCluster", wire.describe_cluster_request())
        error = wire.answer_error(resp)
        if error is not None:
            raise error
        cluster = wire.cluster_answer(resp)
        return ClusterDescription(
            cluster_id=cluster.cluster_id,
            controller_id=cluster.controller_id,
            metadata_offset=cluster.metadata_offset,
            brokers=tuple(BrokerDescription(*b) for b in cluster.brokers),
        )

    async def alter_partition_reassignments(
        self, reassignments: Mapping[TopicPartition, Sequence[int] | None]
    ) -> dict[TopicPartition, MiniBrokerError | None]:
        """Move partitions to new replicas (Kafka's Admin.alterPartitionReassignments, KIP-455):
        each target is a list of broker ids, preferred leader first; None cancels the running
        reassignment of that partition.

        Returns each partition's outcome: None when the move started (or completed at once,
        or there was nothing to do, or the cancel took effect), else its error:
        UnknownTopicOrPartitionError, InvalidReplicaAssignmentError (empty target,
        duplicates, unregistered or decommissioning brokers, fewer than min.insync.replicas),
        ReassignmentInProgressError, NoReassignmentInProgressError. A malformed request is
        refused whole (InvalidRequestError for every partition). Raises TypeError/ValueError
        for bad arguments before anything is sent.
        """
        moves: list[tuple[TopicPartition, tuple[int, ...] | None]] = []
        for tp, replicas in _check_mapping("reassignments", reassignments).items():
            checked = _topic_partition(tp)
            target = None if replicas is None else _replica_ids(f"target of {checked}", replicas)
            moves.append((checked, target))
        if not moves:
            return {}
        request = wire.alter_reassignments_request(moves, self.request_timeout_ms)
        resp, resent = await self._controller_call_sent("AlterPartitionReassignments", request)
        answered = wire.reassignment_results(resp)
        top = wire.answer_error(resp)
        out: dict[TopicPartition, MiniBrokerError | None] = {}
        for tp, _ in moves:
            if tp in answered:
                error = answered[tp]
            else:
                error = top or UnknownServerError(f"the controller did not answer for {tp}")
            if resent and isinstance(
                error, (ReassignmentInProgressError, NoReassignmentInProgressError)
            ):
                # An attempt lost in a controller failover may have started (or cancelled) it.
                error = type(error)(
                    f"{error} (the request was re-sent after a controller failover or timeout: "
                    "an earlier attempt may have done it)"
                )
            out[tp] = error
        return out

    async def list_partition_reassignments(
        self, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, PartitionReassignment]:
        """The reassignments in progress (Kafka's Admin.listPartitionReassignments), of
        `partitions` or (None) of every partition. A partition that is not being reassigned,
        or does not exist, is left out."""
        wanted: list[TopicPartition] | None = None
        if partitions is not None:
            if isinstance(partitions, (str, bytes)) or not isinstance(partitions, Iterable):
                raise TypeError(f"partitions must be TopicPartitions, got {partitions!r}")
            wanted = list(dict.fromkeys(_topic_partition(tp) for tp in partitions))
            if not wanted:
                return {}
        resp = await self._controller_call(
            "ListPartitionReassignments", wire.list_reassignments_request(wanted)
        )
        error = wire.answer_error(resp)
        if error is not None:
            raise error
        asked = None if wanted is None else set(wanted)
        return {
            tp: PartitionReassignment(*answer)
            for tp, answer in sorted(wire.ongoing_reassignments(resp).items())
            if asked is None or tp in asked
        }

    async def create_partitions(
        self,
        new_counts: Mapping[str, int],
        assignments: Mapping[str, Sequence[Sequence[int]]] | None = None,
        validate_only: bool = False,
    ) -> None:
        """Grow topics to a new total number of partitions (Kafka's Admin.createPartitions).
        `assignments[topic]`, when given, holds one replica list per new partition; otherwise
        the controller places them. Raises the typed error of the first failure (others named
        in its message): InvalidPartitionsError (the count does not grow),
        InvalidReplicaAssignmentError, UnknownTopicOrPartitionError. TypeError/ValueError for
        bad arguments, before anything is sent. Waits (best effort, up to 10 s) until the
        brokers' metadata shows the new partitions with leaders."""
        counts: dict[str, int] = {}
        for name, count in _check_mapping("new_counts", new_counts).items():
            check_topic_name(name)
            counts[name] = _check_int(f"new partition count of {name!r}", count, 1)
        placed: dict[str, tuple[tuple[int, ...], ...]] = {}
        for name, lists in _check_mapping("assignments", assignments or {}).items():
            if name not in counts:
                raise ValueError(f"assignments name topic {name!r}, which new_counts does not")
            if isinstance(lists, (str, bytes)) or not isinstance(lists, Sequence):
                raise TypeError(f"assignments of {name!r} must be a sequence of replica lists")
            placed[name] = tuple(
                _replica_ids(f"assignment {i} of {name!r}", r) for i, r in enumerate(lists)
            )
        _check_bool("validate_only", validate_only)
        if not counts:
            return
        request = wire.create_partitions_request(
            [(name, count, placed.get(name)) for name, count in counts.items()],
            self.request_timeout_ms,
            validate_only,
        )
        resp = await self._controller_call("CreatePartitions", request)
        answered = wire.create_partitions_results(resp)
        failures: list[tuple[str, MiniBrokerError]] = []
        for name in counts:
            if name not in answered:
                failures.append((name, UnknownServerError("the controller did not answer")))
            elif (error := answered[name]) is not None:
                failures.append((name, error))
        _raise_first(failures, "create partitions of")
        if not validate_only:
            await self._wait_for_partitions(counts)

    async def _wait_for_partitions(self, counts: Mapping[str, int]) -> None:
        """Best effort: wait (up to 10 s) until the brokers' metadata shows every topic with at
        least its new partition count, each with a leader."""
        await self._wait_for_metadata(
            sorted(counts), lambda name, info: len(info.partitions) >= counts[name]
        )

    async def incremental_alter_configs(
        self,
        changes: Mapping[ConfigResource, Sequence[AlterConfigOp]],
        validate_only: bool = False,
    ) -> None:
        """Change dynamic configs (Kafka's Admin.incrementalAlterConfigs): topic configs, and
        the broker throttle rates (per broker id, or "" for every broker). Raises the typed
        error of the first failure (others named in its message): InvalidConfigError (unknown
        key, bad value), UnknownTopicOrPartitionError, InvalidRequestError. TypeError/ValueError
        for bad arguments (a config changed twice for one resource), before anything is sent."""
        resources: list[tuple[ConfigResource, tuple[AlterConfigOp, ...]]] = []
        for resource, ops in _check_mapping("changes", changes).items():
            if not isinstance(resource, ConfigResource):
                raise TypeError(f"changes are keyed by ConfigResource, got {resource!r}")
            if isinstance(ops, (str, bytes)) or not isinstance(ops, Sequence):
                raise TypeError(f"changes of {resource} must be a sequence of AlterConfigOp")
            seen: set[str] = set()
            for op in ops:
                if not isinstance(op, AlterConfigOp):
                    raise TypeError(f"changes of {resource} must be AlterConfigOps, got {op!r}")
                if op.name in seen:
                    raise ValueError(f"config {op.name!r} changed twice for {resource}")
                seen.add(op.name)
            resources.append((resource, tuple(ops)))
        _check_bool("validate_only", validate_only)
        if not resources:
            return
        request = wire.alter_configs_request(
            [((r.type, r.name), [(o.name, o.op, o.value) for o in ops]) for r, ops in resources],
            validate_only,
        )
        resp = await self._controller_call("IncrementalAlterConfigs", request)
        answered = wire.alter_configs_results(resp)
        failures: list[tuple[str, MiniBrokerError]] = []
        for resource, _ in resources:
            key = (resource.type, resource.name)
            if key not in answered:
                failures.append((_label(resource), UnknownServerError("no answer")))
            elif (error := answered[key]) is not None:
                failures.append((_label(resource), error))
        _raise_first(failures, "alter configs of")

    async def describe_configs(
        self, resources: Iterable[ConfigResource], keys: Iterable[str] = ()
    ) -> dict[ConfigResource, list[ConfigEntry]]:
        """Every config of each resource (or only `keys`), with its effective value and where
        it comes from (Kafka's Admin.describeConfigs). Raises the typed error of the first
        resource that failed (UnknownTopicOrPartitionError, InvalidRequestError, ...)."""
        if isinstance(resources, (str, bytes)) or not isinstance(resources, Iterable):
            raise TypeError(f"resources must be ConfigResources, got {resources!r}")
        wanted = list(dict.fromkeys(resources))
        for resource in wanted:
            if not isinstance(resource, ConfigResource):
                raise TypeError(f"resources must be ConfigResources, got {resource!r}")
        if isinstance(keys, (str, bytes)) or not isinstance(keys, Iterable):
            raise TypeError(f"keys must be an iterable of config names, got {keys!r}")
        names = list(dict.fromkeys(keys))
        for key in names:
            if not isinstance(key, str) or not key:
                raise TypeError(f"config names must be non-empty strs, got {key!r}")
        if not wanted:
            return {}
        request = wire.describe_configs_request([(r.type, r.name) for r in wanted], names)
        resp = await self._controller_call("DescribeConfigs", request)
        answered = wire.described_configs(resp)
        out: dict[ConfigResource, list[ConfigEntry]] = {}
        failures: list[tuple[str, MiniBrokerError]] = []
        for resource in wanted:
            described = answered.get((resource.type, resource.name))
            if described is None:
                failures.append((_label(resource), UnknownServerError("no answer")))
            elif described.error is not None:
                failures.append((_label(resource), described.error))
            else:
                out[resource] = [ConfigEntry(*e) for e in described.entries]
        _raise_first(failures, "describe configs of")
        return out

    # -- ACLs ----------------------------------------------------------------------------------

    async def create_acls(self, acls: Iterable[AclBinding]) -> None:
        """Create ACLs (Kafka's Admin.createAcls); one identical to a stored ACL is a success
        that changes nothing. Raises the typed error of the first ACL refused
        (InvalidRequestError: an invalid binding, which is not created; the valid ones are)."""
        bindings = _acl_items("acls", acls, AclBinding)
        if not bindings:
            return
        resp = await self._controller_call("CreateAcls", acl_wire.create_request(bindings))
        answered = acl_wire.create_results(resp)
        failures: list[tuple[str, MiniBrokerError]] = []
        for i, binding in enumerate(bindings):
            error = answered[i] if i < len(answered) else UnknownServerError("no answer")
            if error is not None:
                failures.append((f"{binding.pattern_str()} {binding.entry_str()}", error))
        _raise_first(failures, "create ACL")

    async def delete_acls(self, filters: Iterable[AclBindingFilter]) -> list[list[AclBinding]]:
        """Delete every ACL any filter matches (Kafka's Admin.deleteAcls); returns, per
        filter in order, the ACLs it matched. Raises the first filter's error (an UNKNOWN
        value: InvalidRequestError)."""
        wanted = _acl_items("filters", filters, AclBindingFilter)
        if not wanted:
            return []
        resp = await self._controller_call("DeleteAcls", acl_wire.delete_request(wanted))
        answered = acl_wire.delete_results(resp)
        failures: list[tuple[str, MiniBrokerError]] = []
        out: list[list[AclBinding]] = []
        for i, flt in enumerate(wanted):
            error, matching = (
                answered[i] if i < len(answered) else (UnknownServerError("no answer"), [])
            )
            if error is not None:
                failures.append((repr(flt), error))
            out.append(matching)
        _raise_first(failures, "delete ACLs matching")
        return out

    async def describe_acls(self, flt: AclBindingFilter = ANY_ACL) -> list[AclBinding]:
        """The ACLs `flt` matches (Kafka's Admin.describeAcls); every ACL by default."""
        if not isinstance(flt, AclBindingFilter):
            raise TypeError(f"filter must be an AclBindingFilter, got {flt!r}")
        resp = await self._controller_call("DescribeAcls", acl_wire.describe_request(flt))
        return acl_wire.described(resp)

    async def decommission_broker(self, broker_id: int, cancel: bool = False) -> int:
        """Mark a broker for decommissioning: its leaderships move off it first, then every
        replica it holds is reassigned (racks honoured, leaders balanced), and it gets no new
        ones; once it holds nothing it can be stopped. `cancel` removes the mark (moves already
        started go on). Returns how many reassignments this call started.

        Raises BrokerIdNotRegisteredError for an unknown broker and InvalidRequestError when the
        other brokers cannot hold some topic's replication factor (nothing changes then)."""
        _check_int("broker_id", broker_id, 0)
        _check_bool("cancel", cancel)
        resp = await self._controller_call(
            "DecommissionBroker", wire.decommission_request(broker_id, cancel)
        )
        error = wire.answer_error(resp)
        if error is not None:
            raise error
        return resp.partitions_moving

    async def alter_user_scram_credentials(
        self,
        alterations: Iterable[UserScramCredentialUpsertion | UserScramCredentialDeletion],
    ) -> dict[str, MiniBrokerError | None]:
        """Set or delete users' SCRAM credentials (Kafka's Admin.alterUserScramCredentials).
        The password is salted here (PBKDF2) and never sent. Returns each user's outcome: None
        for success, else its error (UnacceptableCredentialError, ResourceNotFoundError,
        DuplicateResourceError, UnsupportedSaslMechanismError); a user with any refused
        alteration changes nothing."""
        wanted = list(alterations)
        if not wanted:
            return {}
        request = scram_admin.alter_request(wanted)
        resp = await self._controller_call("AlterUserScramCredentials", request)
        return scram_admin.alter_results(resp)

    async def describe_user_scram_credentials(
        self, users: Iterable[str] | None = None
    ) -> dict[str, list[ScramCredentialInfo]]:
        """Each user's SCRAM mechanisms and iteration counts (None: every user with a
        credential); never a salt or a key. Raises the typed error of the first user that
        failed (ResourceNotFoundError for a user without credentials)."""
        if isinstance(users, (str, bytes)):
            raise TypeError(f"users must be an iterable of names, got {users!r}")
        request = scram_admin.describe_request(users)
        resp = await self._controller_call("DescribeUserScramCredentials", request)
        out: dict[str, list[ScramCredentialInfo]] = {}
        failures: list[tuple[str, MiniBrokerError]] = []
        for user, answer in scram_admin.described(resp).items():
            if isinstance(answer, MiniBrokerError):
                failures.append((user, answer))
            else:
                out[user] = answer
        _raise_first(failures, "describe SCRAM credentials of")
        return out

    async def elect_leaders(
        self,
        election_type: str = "preferred",
        partitions: Iterable[TopicPartition] | None = None,
    ) -> dict[TopicPartition, MiniBrokerError | None]:
        """Run a preferred or unclean election for `partitions` (None: every partition).

        Returns each partition's outcome: None for success, else its error
        (ElectionNotNeededError when the wanted leader already leads).
        """
        kind = str(election_type).lower()
        if kind not in wire.ELECTION_TYPES:
            raise ValueError(
                f"election_type must be 'preferred' or 'unclean', got {election_type!r}"
            )
        request = wire.elect_leaders_request(kind, partitions, self.request_timeout_ms)
        resp = await self._controller_call("ElectLeaders", request)
        error = wire.answer_error(resp)
        if error is not None:
            raise error
        return wire.election_results(resp)

    async def unregister_broker(self, broker_id: int) -> None:
        """Remove the registration of a broker that is gone for good (Kafka's
        Admin.unregisterBroker, KIP-500). Replica lists keep naming it (offline replicas).

        Raises BrokerIdNotRegisteredError for an unknown id and InvalidRequestError while the
        broker is alive (unfenced or heartbeating: stop it first).
        """
        if isinstance(broker_id, bool) or not isinstance(broker_id, int):
            raise TypeError(f"broker_id must be an int, got {broker_id!r}")
        if not 0 <= broker_id <= _MAX_INT32:
            raise ValueError(f"broker_id must be between 0 and {_MAX_INT32}, got {broker_id}")
        resp = await self._controller_call(
            "UnregisterBroker", wire.unregister_broker_request(broker_id)
        )
        error = wire.answer_error(resp)
        if error is not None:
            raise error

    # -- broker calls --------------------------------------------------------------------------

    # -- consumer groups (client/groups/admin.py) -----------------------------------------------

    @property
    def groups(self) -> GroupAdmin:
        if self._groups is None:
            self._groups = GroupAdmin(
                self.cluster,
                request_timeout_ms=self.cluster.request_timeout_ms,
                retry_backoff_ms=self.cluster.retry_backoff_ms,
                default_api_timeout_ms=self.default_api_timeout_ms,
            )
        return self._groups

    async def list_groups(self, states: Iterable[str] = ()) -> list[GroupListing]:
        """Every group of every broker (Kafka's listConsumerGroups), optionally by state."""
        self._check_open()
        return await self.groups.list_groups(states)

    async def describe_groups(self, group_ids: Iterable[str]) -> dict[str, GroupDescription]:
        self._check_open()
        return await self.groups.describe_groups(list(group_ids))

    async def list_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition] | None = None
    ) -> dict[TopicPartition, CommittedOffset]:
        self._check_open()
        return await self.groups.list_group_offsets(group_id, partitions)

    async def alter_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, int | CommittedOffset]
    ) -> None:
        """OffsetCommit with generation -1 (the group must be Empty), as --reset-offsets."""
        self._check_open()
        await self.groups.alter_group_offsets(group_id, offsets)

    async def delete_groups(self, group_ids: Iterable[str]) -> dict[str, MiniBrokerError | None]:
        self._check_open()
        return await self.groups.delete_groups(list(group_ids))

    async def list_topics(self) -> list[str]:
        self._check_open()
        snapshot = await self.cluster.fetch_metadata(all_topics=True)
        self.cluster.metadata.update(snapshot, now_ms())
        return sorted(snapshot.topics)

    async def describe_topics(
        self, names: Iterable[str] | None = None, *, include_offsets: bool = True
    ) -> list[TopicDescription]:
        """Describe `names` (None: every topic), sorted by name. Unknown names raise
        UnknownTopicOrPartitionError. With `include_offsets`, every live broker is asked for
        its replicas' HW and LEO (one DescribeReplicas call each, in parallel)."""
        self._check_open()
        wanted = None if names is None else list(names)
        if wanted is None:
            snapshot = await self.cluster.fetch_metadata(all_topics=True)
        else:
            snapshot = await self.cluster.fetch_metadata(wanted)
        self.cluster.metadata.update(snapshot, now_ms())
        for name in wanted or ():
            info = snapshot.topics.get(name)
            if info is None:
                raise unknown_topic_error(name)
            if info.error_code != ErrorCode.NONE:
                raise topic_metadata_error(name, info.error_code)
        replica_state: dict[tuple[str, int, int], wire.ReplicaOffsets] = {}
        if include_offsets:
            topics = sorted(snapshot.topics)
            calls = [self._describe_replicas(b.address, topics) for b in snapshot.brokers.values()]
            for replicas in await asyncio.gather(*calls):
                for rep in replicas:
                    replica_state[(rep.topic, rep.partition, rep.broker_id)] = rep
        out: list[TopicDescription] = []
        for name in sorted(snapshot.topics):
            info = snapshot.topics[name]
            if info.error_code != ErrorCode.NONE:
                continue
            parts = []
            for p in sorted(info.partitions):
                pi = info.partitions[p]
                hw = -1
                leos: dict[int, int | None] = {}
                points: dict[int, int | None] = {}
                ratios: dict[int, float | None] = {}
                for replica in pi.replicas:
                    state = replica_state.get((name, p, replica))
                    leos[replica] = state.log_end_offset if state is not None else None
                    points[replica] = state.cleaner_point if state is not None else None
                    ratios[replica] = state.dirty_ratio if state is not None else None
                    if state is not None and replica == pi.leader and state.is_leader:
                        hw = state.high_watermark
                if all(point is None for point in points.values()):
                    points, ratios = {}, {}  # not a compacted log (or no replica answered)
                parts.append(
                    PartitionDescription(
                        topic=name,
                        partition=p,
                        leader=pi.leader,
                        leader_epoch=pi.leader_epoch,
                        partition_epoch=pi.partition_epoch,
                        replicas=pi.replicas,
                        isr=pi.isr,
                        offline_replicas=pi.offline_replicas,
                        high_watermark=hw,
                        log_end_offsets=leos if include_offsets else {},
                        cleaner_points=points,
                        dirty_ratios=ratios,
                        adding_replicas=pi.adding_replicas,
                        removing_replicas=pi.removing_replicas,
                    )
                )
            out.append(TopicDescription(name, info.topic_id, tuple(parts), dict(info.configs)))
        return out

    async def _describe_replicas(
        self, address: str, topics: list[str]
    ) -> list[wire.ReplicaOffsets]:
        pending = self.cluster.broker_stub(address).DescribeReplicas(
            wire.describe_replicas_request(topics),
            timeout=min(self.request_timeout_ms, 5_000) / 1000,
        )
        try:
            return list(wire.replica_offsets(await wire.call(pending, address)))
        except wire.CallFailed:
            return []  # a down broker: its replicas show no LEO


def _label(resource: ConfigResource) -> str:
    if resource.type == "broker":
        return f"broker {resource.name}" if resource.name else "the default of every broker"
    return f"topic {resource.name}"


def _acl_items(what: str, items: Any, kind: type) -> list[Any]:
    if isinstance(items, (str, bytes, kind)) or not isinstance(items, Iterable):
        raise TypeError(f"{what} must be an iterable of {kind.__name__}, got {items!r}")
    out = list(items)
    for item in out:
        if not isinstance(item, kind):
            raise TypeError(f"{what} must be {kind.__name__}s, got {item!r}")
    if len(out) > acl_wire.MAX_ACL_ITEMS:
        raise ValueError(f"at most {acl_wire.MAX_ACL_ITEMS} {what} per call, got {len(out)}")
    return out


def _raise_first(failures: list[tuple[str, MiniBrokerError]], what: str) -> None:
    if not failures:
        return
    name, first = failures[0]
    if len(failures) == 1:
        detail = f"{what} {name!r}: {first}"
    else:
        detail = "; ".join(f"{what} {n!r}: {e}" for n, e in failures)
    raise type(first)(detail)


__all__ = [
    "AlterConfigOp",
    "AsyncAdmin",
    "BrokerDescription",
    "ClusterDescription",
    "ConfigEntry",
    "ConfigResource",
    "CreatedTopic",
    "NewTopic",
    "PartitionDescription",
    "PartitionReassignment",
    "TopicDescription",
]
