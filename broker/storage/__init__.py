"""minibroker.broker.storage: Kafka's on-disk log layout for one broker (docs/design.md §4).

Does file I/O only; makes no replication decision and imports nothing from
minibroker.broker.replication (tests/unit/test_layering.py). One job per module:
  data_dir.py     meta.properties, the `.lock`, the clean-shutdown marker, partition dirs
  log_manager.py  every PartitionLog of the data dir and its three offset checkpoints
  log.py          PartitionLog: segments, appends (leader and follower), reads, truncation,
                  retention, flush, the persisted leader-epoch cache, recovery on open
  segment.py      one `.log` segment with its sparse indexes
  index.py        `.index` and `.timeindex`
  epoch_cache.py  the pure leader-epoch cache rules (Kafka's LeaderEpochFileCache), no I/O
  checkpoint.py   Kafka's checkpoint text files, written atomically
  config.py       LogConfig (topic-level settings with Kafka's names)
  errors.py       storage-specific errors
  bench.py        `minibroker bench log`

log.py persists the epoch cache and keeps it in step with the log, as Kafka keeps
LeaderEpochFileCache in storage. Concurrency contract: not thread-safe; one owner thread per
data dir.
"""
