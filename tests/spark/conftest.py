"""tests/spark: one SparkSession (local[2]) and one live 3-broker cluster for the whole session.

The Spark workers must run this venv's Python (it has pyarrow and minibroker installed) and bind
to loopback (SPARK_LOCAL_IP; docs/design.md §11). The cluster comes from the integration harness
(real processes, killed by PID when the session ends); tests that break brokers start their own.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_harness import LocalCluster, local_cluster

# Fast failure detection so failover tests finish quickly.
CLUSTER_SETTINGS = {
    "replica.lag.time.max.ms": "1500",
    "broker.session.timeout.ms": "2500",
    "leader.imbalance.check.interval.seconds": "3600",
    # Retention runs often, so data-loss tests see segments deleted within a second.
    "log.retention.check.interval.ms": "200",
    # The cleaner looks for dirty compacted logs often, so compaction tests see it run at once.
    "log.cleaner.backoff.ms": "200",
}


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    from minibroker.client.spark import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("minibroker-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.pyspark.python", sys.executable)
        # A planner or streaming-source worker must connect back within this; the default 15 s
        # is too short on two busy cores ("Timed out while waiting for the Python worker").
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def cluster_settings() -> dict[str, str]:
    """Settings for tests that start a cluster of their own (to break it)."""
    return dict(CLUSTER_SETTINGS)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("spark-cluster") / "cluster"
    with local_cluster(str(directory), brokers=3, settings=CLUSTER_SETTINGS) as c:
        yield c
