"""Consumer groups for minibroker's own client: Kafka's group protocol (FindCoordinator,
JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit/Fetch, and the admin calls) spoken over
gRPC `BrokerService.KafkaGroupCall`, which carries Kafka request frames written with kio.

- kafka_call.py: writing a request frame and reading its answer (kio), with version choice.
- protocol.py: the "consumer" protocol's Subscription and Assignment bytes (kio's schemas).
- assignors.py: Kafka's RangeAssignor and RoundRobinAssignor (pure).
- coordinator.py: the member's join/sync/heartbeat state machine (Kafka's ConsumerCoordinator).
"""
