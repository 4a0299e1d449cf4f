"""Kafka's admin APIs that the controller answers: CreatePartitions, DescribeConfigs,
IncrementalAlterConfigs, ElectLeaders. Each is one forward to the controller's gRPC RPC of the
same name (ControllerService), its answers copied into the Kafka version asked; error codes pass
through one for one (the controller's are Kafka's). A controller that does not answer gives
REQUEST_TIMED_OUT per resource or partition, as for CreateTopics (handlers.py).

AlterConfigs (the non-incremental API) is not served: kafka-python and librdkafka both use
IncrementalAlterConfigs when ApiVersions offers it.

I/O shell, event-loop thread only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from minibroker.broker.kafka import codec
from minibroker.broker.kafka.codec import make, nested
from minibroker.client.errors import ErrorCode
from minibroker.proto import minibroker_pb2 as pb

CREATE_PARTITIONS, DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS, ELECT_LEADERS = 37, 32, 44, 43

# api key -> (min, max) version served (handlers.SUPPORTED takes these).
ADMIN_SUPPORTED: dict[int, tuple[int, int]] = {
    CREATE_PARTITIONS: (0, 3),
    DESCRIBE_CONFIGS: (1, 4),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    ELECT_LEADERS: (0, 2),
}

# Kafka's ConfigResource types the controller keeps configs for.
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
CONFIG_RESOURCES = (TOPIC_RESOURCE, BROKER_RESOURCE)
DEFAULT_ELECT_TIMEOUT_MS = 60_000

Forward = Callable[[str, Any, int], Awaitable[Any]]


def _timed_out(err: Exception) -> tuple[int, str]:
    return int(ErrorCode.REQUEST_TIMED_OUT), f"the controller did not answer: {err}"


def _not_a_config_resource(resource_type: int) -> tuple[int, str]:
    return (
        int(ErrorCode.INVALID_REQUEST),
        f"resource type {resource_type}: only topics (2) and brokers (4) have configs here",
    )


class AdminHandlers:
    """`forward(method, request, timeout_ms)`: KafkaHandlers._forward (the controller link)."""

    def __init__(self, forward: Forward) -> None:
        self._forward = forward

    def by_key(self) -> dict[int, Callable[[codec.Request], Awaitable[Any]]]:
        return {
            CREATE_PARTITIONS: self.create_partitions,
            DESCRIBE_CONFIGS: self.describe_configs,
            INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
            ELECT_LEADERS: self.elect_leaders,
        }

    # -- CreatePartitions --------------------------------------------------------------------

    async def create_partitions(self, request: codec.Request) -> Any:
        version = request.api_version
        body = request.body
        result_cls = nested(
            codec.response_module(CREATE_PARTITIONS, version), "CreatePartitionsTopicResult"
        )
        assert result_cls is not None
        timeout_ms = int(body.timeout.total_seconds() * 1000)
        forwarded = pb.CreatePartitionsRequest(
            timeout_ms=timeout_ms, validate_only=bool(body.validate_only)
        )
        for topic in body.topics:
            forwarded.topics.add(
                name=topic.name,
                count=int(topic.count),
                assignments=[
                    pb.ReplicaList(broker_ids=[int(b) for b in a.broker_ids])
                    for a in topic.assignments or ()
                ],
            )
        answers: dict[str, tuple[int, str]] = {}
        failure: tuple[int, str] | None = None
        if forwarded.topics:
            try:
                response = await self._forward("CreatePartitions", forwarded, timeout_ms)
                answers = {r.name: (int(r.error_code), r.error_message) for r in response.results}
            except Exception as err:
                failure = _timed_out(err)
        results = []
        for topic in body.topics:
            code, message = answers.get(
                topic.name,
                failure or (int(ErrorCode.UNKNOWN_SERVER_ERROR), "no answer for this topic"),
            )
            results.append(
                make(result_cls, name=topic.name, error_code=code, error_message=message or None)
            )
        return make(
            codec.response_class(CREATE_PARTITIONS, version),
            throttle_time=0,
            results=tuple(results),
        )

    # -- DescribeConfigs ---------------------------------------------------------------------

    async def describe_configs(self, request: codec.Request) -> Any:
        version = request.api_version
        body = request.body
        module = codec.response_module(DESCRIBE_CONFIGS, version)
        result_cls = nested(module, "DescribeConfigsResult")
        entry_cls = nested(module, "DescribeConfigsResourceResult")
        synonym_cls = nested(module, "DescribeConfigsSynonym")
        assert result_cls and entry_cls and synonym_cls
        synonyms = bool(getattr(body, "include_synonyms", False))
        documentation = bool(getattr(body, "include_documentation", False))
        forwarded = pb.DescribeConfigsRequest()
        for r in body.resources:
            if int(r.resource_type) in CONFIG_RESOURCES:
                forwarded.resources.add(
                    resource_type=int(r.resource_type),
                    resource_name=r.resource_name,
                    configuration_keys=list(r.configuration_keys or ()),
                )
        answers: dict[tuple[int, str], Any] = {}
        failure: tuple[int, str] | None = None
        if forwarded.resources:
            try:
                response = await self._forward("DescribeConfigs", forwarded, 0)
                answers = {(r.resource_type, r.resource_name): r for r in response.results}
            except Exception as err:
                failure = _timed_out(err)
        results = []
        for r in body.resources:
            kind = int(r.resource_type)
            answer = answers.get((kind, r.resource_name))
            configs: tuple[Any, ...] = ()
            if answer is not None:
                code, message = int(answer.error_code), answer.error_message
                configs = tuple(
                    make(
                        entry_cls,
                        name=e.name,
                        value=None if e.is_sensitive or not e.HasField("value") else e.value,
                        read_only=e.read_only,
                        config_source=e.config_source,
                        is_sensitive=e.is_sensitive,
                        # Kafka lists the entry itself first among its synonyms; the
                        # controller names no others (a topic's broker-level defaults).
                        synonyms=(
                            make(
                                synonym_cls,
                                name=e.name,
                                value=e.value if e.HasField("value") else None,
                                source=e.config_source,
                            ),
                        )
                        if synonyms
                        else (),
                        config_type=0,  # UNKNOWN: the controller does not give types
                        documentation=(e.documentation or None) if documentation else None,
                    )
                    for e in answer.configs
                )
            elif kind not in CONFIG_RESOURCES:
                code, message = _not_a_config_resource(kind)
            else:
                code, message = failure or (
                    int(ErrorCode.UNKNOWN_SERVER_ERROR),
                    "no answer for this resource",
                )
            results.append(
                make(
                    result_cls,
                    error_code=code,
                    error_message=message or None,
                    resource_type=kind,
                    resource_name=r.resource_name,
                    configs=configs,
                )
            )
        return make(
            codec.response_class(DESCRIBE_CONFIGS, version),
            throttle_time=0,
            results=tuple(results),
        )

    # -- IncrementalAlterConfigs -------------------------------------------------------------

    async def incremental_alter_configs(self, request: codec.Request) -> Any:
        version = request.api_version
        body = request.body
        result_cls = nested(
            codec.response_module(INCREMENTAL_ALTER_CONFIGS, version),
            "AlterConfigsResourceResponse",
        )
        assert result_cls is not None
        forwarded = pb.IncrementalAlterConfigsRequest(validate_only=bool(body.validate_only))
        for r in body.resources:
            if int(r.resource_type) not in CONFIG_RESOURCES:
                continue
            resource = forwarded.resources.add(
                resource_type=int(r.resource_type), resource_name=r.resource_name
            )
            for c in r.configs:
                config = resource.configs.add(name=c.name, config_operation=int(c.config_operation))
                if c.value is not None:
                    config.value = c.value
        answers: dict[tuple[int, str], tuple[int, str]] = {}
        failure: tuple[int, str] | None = None
        if forwarded.resources:
            try:
                response = await self._forward("IncrementalAlterConfigs", forwarded, 0)
                answers = {
                    (r.resource_type, r.resource_name): (int(r.error_code), r.error_message)
                    for r in response.results
                }
            except Exception as err:
                failure = _timed_out(err)
        results = []
        for r in body.resources:
            kind = int(r.resource_type)
            if kind not in CONFIG_RESOURCES:
                code, message = _not_a_config_resource(kind)
            else:
                code, message = answers.get(
                    (kind, r.resource_name),
                    failure or (int(ErrorCode.UNKNOWN_SERVER_ERROR), "no answer"),
                )
            results.append(
                make(
                    result_cls,
                    error_code=code,
                    error_message=message or None,
                    resource_type=kind,
                    resource_name=r.resource_name,
                )
            )
        return make(
            codec.response_class(INCREMENTAL_ALTER_CONFIGS, version),
            throttle_time=0,
            responses=tuple(results),
        )

    # -- ElectLeaders ------------------------------------------------------------------------

    async def elect_leaders(self, request: codec.Request) -> Any:
        version = request.api_version
        body = request.body
        module = codec.response_module(ELECT_LEADERS, version)
        topic_cls = nested(module, "ReplicaElectionResult")
        partition_cls = nested(module, "PartitionResult")
        assert topic_cls and partition_cls
        # v0 has no election type: preferred (0); 1 is unclean.
        election = int(getattr(body, "election_type", 0))
        timeout = getattr(body, "timeout", None)
        timeout_ms = (
            int(timeout.total_seconds() * 1000) if timeout is not None else DEFAULT_ELECT_TIMEOUT_MS
        )
        asked = body.topic_partitions
        forwarded = pb.ElectLeadersRequest(
            election_type=pb.ElectionType.ValueType(election),
            all_partitions=asked is None,
            timeout_ms=timeout_ms,
        )
        for t in asked or ():
            forwarded.topic_partitions.add(topic=t.topic, partitions=[int(p) for p in t.partitions])
        top = int(ErrorCode.NONE)
        # (topic, partition) -> (code, message), in the order answered.
        outcome: dict[tuple[str, int], tuple[int, str]] = {}
        try:
            response = await self._forward("ElectLeaders", forwarded, timeout_ms)
        except Exception as err:
            top, message = _timed_out(err)
            outcome = {(t.topic, int(p)): (top, message) for t in asked or () for p in t.partitions}
        else:
            top = int(response.error_code)
            outcome = {
                (r.topic, r.partition): (int(r.error_code), r.error_message)
                for r in response.results
            }
            if top != ErrorCode.NONE and not outcome:
                # The whole request refused: v0 has no top-level code, so each partition asked
                # carries it (as Kafka answers).
                outcome = {
                    (t.topic, int(p)): (top, response.error_message)
                    for t in asked or ()
                    for p in t.partitions
                }
        by_topic: dict[str, list[Any]] = {}
        for (topic, partition), (code, message) in outcome.items():
            by_topic.setdefault(topic, []).append(
                make(
                    partition_cls,
                    partition_id=partition,
                    error_code=code,
                    error_message=message or None,
                )
            )
        return make(
            codec.response_class(ELECT_LEADERS, version),
            throttle_time=0,
            error_code=top,
            replica_election_results=tuple(
                make(topic_cls, topic=topic, partition_result=tuple(parts))
                for topic, parts in by_topic.items()
            ),
        )
