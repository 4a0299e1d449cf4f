"""The broker's asyncio shell around the replica engine (broker/replication/engine.py).

manager.py holds the `ReplicaManager` (shared state and the one place the engine's outputs are
carried out); the other modules are its jobs: metadata_apply.py, produce.py, fetch.py,
producer_ids.py and background.py. They keep futures, gRPC calls, timers, threads and I/O only.
"""
