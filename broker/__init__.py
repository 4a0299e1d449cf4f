"""minibroker.broker: one broker process (docs/design.md §3.3-§5).

What it owns, by folder:
  storage/       the bytes on disk: data dir, segments, indexes, checkpoints, recovery
                 (`PartitionLog`, `LogManager`); file I/O only, no replication decisions
  replication/   the pure replication rules (leader, follower, epoch cache, acks): events in,
                 decisions out, no I/O
  the rest       the thin shells: gRPC service, follower fetchers, controller link, and the
                 replica manager that applies the replication cores' decisions to storage

It imports minibroker.client (record format, errors) and minibroker.proto, never the controller.
"""
