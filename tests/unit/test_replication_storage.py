"""The replica engine's `Storage` protocol (broker/replication/storage.py) fits both logs.

The engine runs over `PartitionLog` in the broker and over MemLog in the simulation and the
engine's unit tests; both must take every call the protocol names, with the arguments the
engine passes (positional, and the keyword-only ones by name), and have every property it
reads. mypy checks PartitionLog where the broker hosts it; this checks MemLog too, at run time,
so a protocol that changes without its logs (or a log that drifts from it) fails here.
"""

from __future__ import annotations

import inspect
import pathlib

import pytest
from memlog import MemLog

from minibroker.broker.replication.storage import Storage
from minibroker.broker.storage.config import LogConfig
from minibroker.broker.storage.log import PartitionLog
from minibroker.client.types import TopicPartition

MEMBERS = sorted(name for name in vars(Storage) if not name.startswith("_"))


def _log(kind: str, tmp_path: pathlib.Path) -> object:
    if kind == "memlog":
        return MemLog()
    tp = TopicPartition("storage", 0)
    return PartitionLog.open(tmp_path / "storage-0", tp, LogConfig(), now_ms=0)


def test_the_protocol_names_what_the_engine_uses() -> None:
    assert {"leo", "append_as_leader", "append_as_follower", "read", "truncate_to"} <= set(MEMBERS)


@pytest.mark.parametrize("kind", ["memlog", "partition_log"])
def test_a_log_takes_every_storage_call(kind: str, tmp_path: pathlib.Path) -> None:
    log = _log(kind, tmp_path)
    try:
        for name in MEMBERS:
            wanted = vars(Storage)[name]
            assert hasattr(log, name), f"{kind} has no {name}"
            if isinstance(wanted, property):
                assert not callable(getattr(log, name)), f"{kind}.{name} is not a value"
                continue
            params = list(inspect.signature(wanted).parameters.values())[1:]  # without self
            positional = [object() for p in params if p.kind is p.POSITIONAL_ONLY]
            keywords = {p.name: object() for p in params if p.kind is p.KEYWORD_ONLY}
            # Binding checks the call's shape without making it.
            inspect.signature(getattr(log, name)).bind(*positional, **keywords)
    finally:
        if isinstance(log, PartitionLog):
            log.close()
