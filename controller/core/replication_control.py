"""The topic and partition commands of the controller (Kafka's ReplicationControlManager):
AlterPartition, manual and automatic leader elections, topic creation and deletion.

Pure. Rules and where they come from (docs/protocol.md): elections and the epochs they bump §17
(`election.py`); AlterPartition §9 (`isr.py`); placement and topic validation (`placement.py`,
`topics.py`); partition limits, KIP-578 (`partition_limits.py`); the automatic preferred-leader
rebalance §19 (`rebalance.py`).
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterable, Sequence

from minibroker.client.common.config import ConfigError, config_str
from minibroker.client.errors import ErrorCode
from minibroker.client.topic_config import resolve_topic_config, validate_topic_configs
from minibroker.client.types import NO_LEADER
from minibroker.controller.core.control_base import ControlBase
from minibroker.controller.core.election import (
    Election,
    build_partition_change,
    check_partition_change,
)
from minibroker.controller.core.isr import validate_alter_partition
from minibroker.controller.core.messages import (
    AlterPartitionReply,
    AlterPartitionRequest,
    AlterPartitionResult,
    CreatableTopic,
    CreateTopicResult,
    DeleteTopicResult,
    ElectionResult,
    Outcome,
)
from minibroker.controller.core.partition_limits import (
    assignment_problem,
    brokers_with_room,
    cluster_problem,
    hosted_replicas,
    replica_room_problem,
)
from minibroker.controller.core.placement import PlacementError, place_replicas
from minibroker.controller.core.rebalance import partitions_to_rebalance
from minibroker.controller.core.topics import collision_key, invalid_topic_name
from minibroker.metadata.records import PartitionRecord, RemoveTopicRecord, TopicRecord


class ReplicationControl(ControlBase):
    """Topic and partition commands."""

    def _rebalance(self, now_ms: int) -> None:
        acceptable = self._acceptable()
        topics = {t.topic_id: t for t in self.image.topics_by_id.values()}
        parts = [p for _, p in self.image.partitions()]
        chosen = partitions_to_rebalance(
            parts, acceptable, self.settings.leader_imbalance_per_broker_percentage
        )
        for p in chosen:
            change = build_partition_change(
                p,
                acceptable=acceptable,
                election=Election.PREFERRED,
                reason="automatic preferred leader rebalance",
            )
            if change is not None:
                self._apply_change(topics[p.topic_id], change, now_ms)

    # -- partitions ---------------------------------------------------------------------------

    def alter_partition(
        self, req: AlterPartitionRequest, now_ms: int
    ) -> Outcome[AlterPartitionReply]:
        reg = self.image.brokers.get(req.broker_id)
        top: tuple[ErrorCode, str] | None = None
        if reg is None:
            top = (ErrorCode.BROKER_ID_NOT_REGISTERED, f"broker {req.broker_id} is not registered")
        elif reg.broker_epoch != req.broker_epoch:
            top = (
                ErrorCode.STALE_BROKER_EPOCH,
                f"broker {req.broker_id} epoch {req.broker_epoch} is stale "
                f"(current {reg.broker_epoch})",
            )
        if top is not None:
            results = tuple(
                AlterPartitionResult(p.topic_id, p.partition, top[0], top[1]) for p in req.proposals
            )
            return self._done(AlterPartitionReply(top[0], top[1], results))
        out: list[AlterPartitionResult] = []
        for proposal in req.proposals:
            topic = self.image.topics_by_id.get(proposal.topic_id)
            current = topic.partitions.get(proposal.partition) if topic else None
            rejection = validate_alter_partition(
                req.broker_id, proposal, current, topic is not None, self.image.brokers
            )
            if rejection is not None or topic is None or current is None:
                code = rejection.code if rejection else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                message = rejection.message if rejection else "unknown partition"
                out.append(
                    AlterPartitionResult(proposal.topic_id, proposal.partition, code, message)
                )
                continue
            new_isr = tuple(m.broker_id for m in proposal.new_isr)
            if (
                set(new_isr) == set(current.isr)
                and proposal.leader_recovery_state == current.leader_recovery_state
            ):
                out.append(
                    AlterPartitionResult(
                        proposal.topic_id, proposal.partition, ErrorCode.NONE, "", current
                    )
                )
                continue
            change = build_partition_change(
                current,
                acceptable=self._acceptable(),
                election=Election.ONLINE,
                target_isr=new_isr,
                leader_recovery_state=proposal.leader_recovery_state,
                reason=f"AlterPartition from leader {req.broker_id}",
            )
            if change is not None:
                self._apply_change(topic, change, now_ms)
            # The leader is answered with the record of ITS change. A reassignment that this
            # ISR completes is the next record, which the leader applies from the metadata
            # log like any change (replicas, maybe leadership): the answer carries only the ISR,
            # so answering with the completed record would leave the leader with the old
            # replica set at the new partition epoch, and it would skip that record as applied.
            committed = topic.partitions[proposal.partition]
            if change is not None:
                # KIP-455: an ISR that now holds every target replica completes a reassignment.
                self._maybe_complete_reassignment(topic, proposal.partition, now_ms)
            out.append(
                AlterPartitionResult(
                    proposal.topic_id, proposal.partition, ErrorCode.NONE, "", committed
                )
            )
        return self._done(AlterPartitionReply(ErrorCode.NONE, "", tuple(out)))

    def elect_leaders(
        self,
        election: Election,
        partitions: Sequence[tuple[str, int]] | None,
        now_ms: int,
    ) -> Outcome[tuple[ElectionResult, ...]]:
        """Manual PREFERRED or UNCLEAN election, per partition or (None) for every partition."""
        if election is Election.ONLINE:
            raise ValueError("manual elections are PREFERRED or UNCLEAN")
        targets: Iterable[tuple[str, int]]
        if partitions is None:
            targets = [(t.name, p.partition) for t, p in self.image.partitions()]
        else:
            targets = partitions
        results = [self._elect_one(election, name, index, now_ms) for name, index in targets]
        return self._done(tuple(results))

    def _elect_one(self, election: Election, name: str, index: int, now_ms: int) -> ElectionResult:
        topic = self.image.topic(name)
        current = topic.partitions.get(index) if topic else None
        if topic is None or current is None:
            return ElectionResult(
                name,
                index,
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"unknown partition {name}-{index}",
            )
        acceptable = self._acceptable()
        if election is Election.PREFERRED:
            preferred = current.preferred_leader
            if current.leader == preferred:
                return ElectionResult(
                    name,
                    index,
                    ErrorCode.ELECTION_NOT_NEEDED,
                    f"broker {preferred} already leads {name}-{index}",
                )
            if preferred not in current.isr or not acceptable(preferred):
                return ElectionResult(
                    name,
                    index,
                    ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
                    f"preferred replica {preferred} of {name}-{index} is not "
                    + ("in the ISR" if preferred not in current.isr else "alive and unfenced"),
                )
            change = build_partition_change(
                current,
                acceptable=acceptable,
                election=Election.PREFERRED,
                reason="preferred leader election",
            )
        else:
            if current.leader != NO_LEADER:
                return ElectionResult(
                    name,
                    index,
                    ErrorCode.ELECTION_NOT_NEEDED,
                    f"{name}-{index} has a leader ({current.leader})",
                )
            change = build_partition_change(
                current,
                acceptable=acceptable,
                election=Election.UNCLEAN,
                reason="unclean leader election",
            )
            if change is None or change.record.leader == NO_LEADER:
                return ElectionResult(
                    name,
                    index,
                    ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
                    f"no replica of {name}-{index} is alive and unfenced",
                )
        if change is not None:
            self._apply_change(topic, change, now_ms)
        return ElectionResult(name, index, ErrorCode.NONE, "")

    # -- topics -------------------------------------------------------------------------------

    def create_topics(
        self, topics: Sequence[CreatableTopic], validate_only: bool, now_ms: int
    ) -> Outcome[tuple[CreateTopicResult, ...]]:
        """Create each valid topic atomically (its TopicRecord and every PartitionRecord go in
        this command's entries together); an invalid topic writes nothing."""
        counts: dict[str, int] = {}
        for t in topics:
            counts[t.name] = counts.get(t.name, 0) + 1
        # Replicas per broker, kept up to date as this request creates topics.
        hosted = hosted_replicas(
            p.replicas
            for topic in self.image.topics_by_id.values()
            for p in topic.partitions.values()
        )
        results = []
        for t in topics:
            if counts[t.name] > 1:
                results.append(
                    CreateTopicResult(
                        t.name,
                        ErrorCode.INVALID_REQUEST,
                        f"topic {t.name!r} appears more than once in the request",
                    )
                )
                continue
            results.append(self._create_one(t, validate_only, now_ms, hosted))
        return self._done(tuple(results))

    def _create_one(
        self, t: CreatableTopic, validate_only: bool, now_ms: int, hosted: Counter[int]
    ) -> CreateTopicResult:
        def fail(code: ErrorCode, message: str) -> CreateTopicResult:
            return CreateTopicResult(t.name, code, message)

        problem = invalid_topic_name(t.name)
        if problem:
            return fail(ErrorCode.INVALID_TOPIC_EXCEPTION, problem)
        if self.image.topic(t.name) is not None:
            return fail(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {t.name!r} already exists")
        key = collision_key(t.name)
        clash = next((n for n in self.image.topic_ids_by_name if collision_key(n) == key), None)
        if clash is not None:
            return fail(
                ErrorCode.INVALID_TOPIC_EXCEPTION,
                f"topic {t.name!r} collides with existing topic {clash!r} ('.' and '_' "
                "map to the same metric names)",
            )
        num_partitions = (
            self.settings.num_partitions if t.num_partitions == -1 else t.num_partitions
        )
        if num_partitions < 1:
            return fail(
                ErrorCode.INVALID_PARTITIONS,
                f"number of partitions must be at least 1 (or -1 for the default), got "
                f"{t.num_partitions}",
            )
        rf = (
            self.settings.default_replication_factor
            if t.replication_factor == -1
            else t.replication_factor
        )
        if rf < 1:
            return fail(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor must be at least 1 (or -1 for the default), got "
                f"{t.replication_factor}",
            )
        usable = self._placeable_brokers()
        if rf > len(usable):
            return fail(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor {rf} is larger than the number of available (unfenced) "
                f"brokers that are not decommissioning: {len(usable)}",
            )
        try:
            validate_topic_configs(t.configs, self.settings.topic_defaults)
        except ConfigError as err:
            return fail(ErrorCode.INVALID_CONFIG, f"topic {t.name!r}: {err}")
        # Counted before any placement is built: a million partitions cost nothing to refuse.
        limits = self.partition_limits
        existing = self.image.partition_count()
        with_room = brokers_with_room(usable, hosted, limits)
        problem = cluster_problem(existing, num_partitions, limits) or replica_room_problem(
            num_partitions, rf, usable, with_room, hosted, limits
        )
        if problem:
            return fail(ErrorCode.POLICY_VIOLATION, f"topic {t.name!r}: {problem}")
        try:
            assignment = place_replicas(with_room, num_partitions, rf, existing)
        except PlacementError as err:
            return fail(ErrorCode.INVALID_REPLICATION_FACTOR, str(err))
        problem = assignment_problem(assignment, hosted, limits)
        if problem:
            return fail(ErrorCode.POLICY_VIOLATION, f"topic {t.name!r}: {problem}")
        effective = {
            k: config_str(v)
            for k, v in resolve_topic_config(t.configs, self.settings.topic_defaults).items()
        }
        topic_id = (
            "" if validate_only else str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        )
        if not validate_only:
            hosted.update(hosted_replicas(assignment))
            self._append(TopicRecord(t.name, topic_id, dict(t.configs)), now_ms)
            for index, replicas in enumerate(assignment):
                record = PartitionRecord(
                    topic_id=topic_id,
                    partition=index,
                    replicas=replicas,
                    isr=replicas,
                    leader=replicas[0],
                    leader_epoch=0,
                    partition_epoch=0,
                    reason="topic created",
                )
                check_partition_change(None, record)
                self._append(record, now_ms)
            self._event(
                "topic_created",
                topic=t.name,
                topic_id=topic_id,
                num_partitions=num_partitions,
                replication_factor=rf,
                configs=dict(t.configs),
                assignment=[list(r) for r in assignment],
            )
        return CreateTopicResult(
            t.name, ErrorCode.NONE, "", topic_id, num_partitions, rf, effective
        )

    def delete_topics(
        self, names: Sequence[str], now_ms: int
    ) -> Outcome[tuple[DeleteTopicResult, ...]]:
        results = []
        for name in names:
            topic = self.image.topic(name)
            if topic is None:
                results.append(
                    DeleteTopicResult(
                        name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic {name!r}"
                    )
                )
                continue
            self._append(RemoveTopicRecord(topic.topic_id), now_ms)
            self._event("topic_deleted", topic=name, topic_id=topic.topic_id)
            results.append(DeleteTopicResult(name, ErrorCode.NONE, "", topic.topic_id))
        return self._done(tuple(results))
