"""Topic names from the network that no topic can have (issue 11 item 3).

Kafka's rules: 1-249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`. A Metadata request for
such a name is answered INVALID_TOPIC_EXCEPTION, as Kafka's broker answers it (a legal name
that does not exist stays UNKNOWN_TOPIC_OR_PARTITION). On a real ReplicaManager with no
metadata applied; no sockets.
"""

from __future__ import annotations

from pathlib import Path

from minibroker.broker.config import build_config
from minibroker.broker.metrics import BrokerMetrics
from minibroker.broker.replicas.manager import ReplicaManager
from minibroker.broker.storage.data_dir import DataDir
from minibroker.broker.storage.log_manager import LogManager
from minibroker.client.errors import ErrorCode

ME = 1


def test_metadata_for_a_name_no_topic_can_have_is_invalid_topic(tmp_path: Path) -> None:
    config = build_config({"node.id": ME, "log.dirs": str(tmp_path / "data")})
    with DataDir.open(config.data_dir, config.node_id) as data_dir:
        logs = LogManager.open(data_dir)
        rm = ReplicaManager(config, logs, BrokerMetrics(), config.controller)
        response = rm.metadata_response(["orders\n", "x" * 250, "..", "missing"], False)
        assert [(t.name, t.error_code) for t in response.topics] == [
            ("orders\n", ErrorCode.INVALID_TOPIC_EXCEPTION),
            ("x" * 250, ErrorCode.INVALID_TOPIC_EXCEPTION),
            ("..", ErrorCode.INVALID_TOPIC_EXCEPTION),
            ("missing", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ]
        logs.close()
