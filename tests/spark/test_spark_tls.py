"""The Spark source and sink on a TLS cluster: Kafka's `kafka.security.protocol` and
`kafka.ssl.*` options reach every client they open (issue 16 B)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cluster_harness import LocalCluster, local_cluster

from minibroker.client import Admin
from minibroker.deploy import cluster as launcher

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def tls_cluster(
    tmp_path_factory: pytest.TempPathFactory, cluster_settings: dict[str, str]
) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("spark-tls") / "cluster"
    with local_cluster(str(directory), brokers=3, settings=cluster_settings, tls=True) as c:
        yield c


def test_round_trip_over_tls(spark: Any, tls_cluster: LocalCluster) -> None:
    props = launcher.client_properties(tls_cluster.state)
    with Admin(tls_cluster.bootstrap, **launcher.client_kwargs(tls_cluster.state)) as admin:
        admin.create_topic("tls-rt", 2, 3)
    rows = [(f"k{i}", f"v{i}".encode()) for i in range(20)]
    writer = (
        spark.createDataFrame(rows, "key string, value binary")
        .write.format("minibroker")
        .option("kafka.bootstrap.servers", tls_cluster.bootstrap)
        .option("topic", "tls-rt")
    )
    for key, value in props.items():
        writer = writer.option(f"kafka.{key}", value)
    writer.mode("append").save()

    reader = (
        spark.read.format("minibroker")
        .option("kafka.bootstrap.servers", tls_cluster.bootstrap)
        .option("subscribe", "tls-rt")
    )
    for key, value in props.items():
        reader = reader.option(f"kafka.{key}", value)
    out = reader.load().collect()
    assert sorted((r.key, r.value) for r in out) == sorted((k.encode(), v) for k, v in rows)
