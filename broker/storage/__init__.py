"""minibroker.broker.storage: Kafka's on-disk log layout for one broker (docs/design.md §4).

Does file I/O only; makes no replication decision. One job per module:
  data_dir.py     meta.properties, the `.lock`, the clean-shutdown marker, partition dirs
  log_manager.py  every PartitionLog of the data dir and its three offset checkpoints
  log.py          PartitionLog: segments, appends (leader and follower), reads, truncation,
                  retention, flush, the persisted leader-epoch cache, recovery on open
  segment.py      one `.log` segment with its sparse indexes
  index.py        `.index` and `.timeindex`
  checkpoint.py   Kafka's checkpoint text files, written atomically
  config.py       LogConfig (topic-level settings with Kafka's names)
  errors.py       storage-specific errors
  bench.py        `minibroker bench log`

The pure epoch-cache rules live in minibroker.broker.replication.epoch_cache; this package
persists them. Concurrency contract: not thread-safe; one owner thread per data dir.
"""
