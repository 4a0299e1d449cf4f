"""ControllerCore: the whole control plane as one sans-I/O state machine (docs/design.md §2, §6).

Pure: no I/O, no clock, no randomness of its own (`now_ms` comes in with every command, a
random source for topic ids at construction). The state is a `MetadataImage` plus broker
liveness. Every command returns an `Outcome`: the reply, the log entries written (already
applied to the image) and the events to log. The caller must make the entries durable before it
sends the reply (see `Outcome`). Single-threaded: one caller feeds commands one at a time.

Its commands are split by job, as Kafka's QuorumController delegates to its control managers:
`control_base.py` holds the state and the plumbing every command shares (collecting entries and
events, the one partition-change write), `cluster_control.py` the broker commands (Kafka's
ClusterControlManager), `replication_control.py` the topic and partition commands (Kafka's
ReplicationControlManager); `ControllerCore` joins them and runs the timers.

The rules and where they come from (sections of docs/protocol.md):
- registration, heartbeats, fencing, controlled shutdown: §15, §16 (Kafka's
  ClusterControlManager, BrokerHeartbeatManager);
  what a registration may contain: `registration.py`; unregistration: Kafka's
  ReplicationControlManager.unregisterBroker;
- a heartbeat reporting the broker's log dir offline (Kafka's OfflineLogDirs, KIP-858) fences
  it at once, which moves its leaderships to in-sync replicas (`_log_dirs_offline`);
- elections and the epochs they bump: §17 (`election.py`);
- AlterPartition: §9 (`isr.py`);
- placement and topic validation: `placement.py`, `topics.py`;
- partition limits (KIP-578's max.partitions, max.broker.partitions): `partition_limits.py`;
- automatic preferred-leader rebalance: §19 (`rebalance.py`);
- reassignment (KIP-455), CreatePartitions, decommissioning, rebuilding lost replicas:
  "Reassignment (KIP-455)" (`reassignment.py`, `move_control.py`,
  `minibroker.metadata.assignment_plan`); dynamic configs (`config_control.py`); ACLs
  (`acl_control.py`, Kafka's AclControlManager); SCRAM credentials (`scram_control.py`, Kafka's
  ScramControlManager).
"""

from __future__ import annotations

from minibroker.controller.core.acl_control import AclControl
from minibroker.controller.core.cluster_control import ClusterControl, invalid_offline_log_dirs
from minibroker.controller.core.config_control import ConfigControl
from minibroker.controller.core.control_base import ControllerSettings, RandomSource
from minibroker.controller.core.messages import Outcome
from minibroker.controller.core.move_control import MoveControl
from minibroker.controller.core.replication_control import ReplicationControl
from minibroker.controller.core.scram_control import ScramControl


class ControllerCore(
    ClusterControl, ReplicationControl, MoveControl, ConfigControl, AclControl, ScramControl
):
    """The whole control plane: the broker commands (`ClusterControl`), the topic and partition
    commands (`ReplicationControl`), replica moves (`MoveControl`), dynamic configs
    (`ConfigControl`), ACLs (`AclControl`), SCRAM credentials (`ScramControl`), and the timers
    that drive them."""

    def tick(self, now_ms: int) -> Outcome[None]:
        """Timers: the session timeout (one stale broker per tick, as Kafka), the automatic
        preferred-leader rebalance, failure decommissioning (replicas of a broker fenced for
        `replica_rebuild_delay_ms` are rebuilt elsewhere) and the decommissioning sweep."""
        unfenced = [b.broker_id for b in self.image.brokers.values() if not b.fenced]
        stale = self.liveness.oldest_expired(unfenced, now_ms)
        if stale is not None:
            session = self.liveness.get(stale)
            silent_ms = now_ms - session.last_contact_ms if session else -1
            self._fence(stale, now_ms, reason=f"session timed out after {silent_ms} ms")
        if self.settings.auto_leader_rebalance_enable and now_ms >= self.next_rebalance_ms:
            self.next_rebalance_ms = now_ms + self.settings.leader_imbalance_check_interval_ms
            self._rebalance(now_ms)
        self._rebuild_lost_replicas(now_ms)
        if self.image.decommissioning:
            self._decommission_sweep(now_ms)
        return self._done(None)


__all__ = ["ControllerCore", "ControllerSettings", "RandomSource", "invalid_offline_log_dirs"]
