"""Option parsing and offset planning of the Spark connector (pure; no Spark, no cluster).

The rules are Spark's Kafka connector's (its Structured Streaming + Kafka Integration Guide): option
names, precedence of timestamps over offsets, -2/-1 sentinels, minPartitions splitting
(KafkaOffsetRangeCalculator) and maxOffsetsPerTrigger's proportional split (rateLimit).
"""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minibroker.client.spark.options import (
    OffsetRange,
    OffsetSpec,
    OptionError,
    consumer_config,
    offsets_from_json,
    offsets_to_json,
    parse_selection,
    parse_source_options,
    producer_config,
    rate_limit,
    resolve_offsets,
    split_ranges,
    timestamp_targets,
)
from minibroker.client.types import TopicPartition as TP

BASE = {"bootstrap.servers": "127.0.0.1:1"}


def test_bootstrap_is_required_and_accepts_the_kafka_prefix() -> None:
    with pytest.raises(OptionError, match=r"bootstrap\.servers"):
        parse_source_options({"subscribe": "a"}, streaming=False)
    opts = parse_source_options(
        {"kafka.bootstrap.servers": "h:1", "subscribe": "a"}, streaming=False
    )
    assert opts.bootstrap_servers == "h:1"


def test_exactly_one_selection() -> None:
    with pytest.raises(OptionError, match="exactly one"):
        parse_selection({})
    with pytest.raises(OptionError, match="exactly one"):
        parse_selection({"subscribe": "a", "subscribePattern": "a.*"})
    sel = parse_selection({"subscribe": "a, b"})
    assert sel.partitions({"a": 2, "b": 1, "c": 3}) == [TP("a", 0), TP("a", 1), TP("b", 0)]
    pat = parse_selection({"subscribePattern": "ev.*"})
    # Java's matches(): the whole name, so "prev" does not match "ev.*".
    assert pat.partitions({"events": 1, "prev": 1}) == [TP("events", 0)]
    assigned = parse_selection({"assign": '{"t": [1, 0], "u": [2]}'})
    assert assigned.partitions({}) == [TP("t", 0), TP("t", 1), TP("u", 2)]
    with pytest.raises(OptionError, match="assign"):
        parse_selection({"assign": '{"t": "0"}'})


def test_options_are_case_insensitive_like_sparks_mapping() -> None:
    # Spark may hand a dict whose keys were lower-cased.
    opts = parse_source_options(
        {**BASE, "subscribepattern": "x.*", "includeheaders": "true", "maxoffsetspertrigger": "7"},
        streaming=True,
    )
    assert opts.selection.pattern == "x.*"
    assert opts.include_headers is True
    assert opts.max_offsets_per_trigger == 7


def test_defaults_differ_for_batch_and_streaming() -> None:
    batch = parse_source_options({**BASE, "subscribe": "a"}, streaming=False)
    stream = parse_source_options({**BASE, "subscribe": "a"}, streaming=True)
    assert batch.starting.kind == "earliest" and batch.ending.kind == "latest"
    assert stream.starting.kind == "latest"
    assert batch.fail_on_data_loss is True and batch.include_headers is False


def test_batch_and_streaming_only_options_are_refused_in_the_wrong_mode() -> None:
    with pytest.raises(OptionError, match="latest is not allowed"):
        parse_source_options(
            {**BASE, "subscribe": "a", "startingOffsets": "latest"}, streaming=False
        )
    with pytest.raises(OptionError, match="streaming"):
        parse_source_options(
            {**BASE, "subscribe": "a", "maxOffsetsPerTrigger": "5"}, streaming=False
        )
    with pytest.raises(OptionError, match="batch"):
        parse_source_options({**BASE, "subscribe": "a", "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(OptionError, match="-2"):
        parse_source_options(
            {**BASE, "subscribe": "a", "endingOffsets": '{"a": {"0": -2}}'}, streaming=False
        )


def test_json_offsets_and_timestamp_precedence() -> None:
    opts = parse_source_options(
        {**BASE, "subscribe": "a", "startingOffsets": '{"a": {"0": 23, "1": -2}}'},
        streaming=False,
    )
    assert opts.starting == OffsetSpec("offsets", {TP("a", 0): 23, TP("a", 1): -2})
    both = parse_source_options(
        {
            **BASE,
            "subscribe": "a",
            "startingOffsets": "earliest",
            "startingOffsetsByTimestamp": '{"a": {"0": 1000}}',
        },
        streaming=False,
    )
    assert both.starting.kind == "timestamps"
    assert timestamp_targets(both.starting, [TP("a", 0), TP("a", 1)]) == {TP("a", 0): 1000}
    everything = parse_source_options(
        {**BASE, "subscribe": "a", "startingTimestamp": "5", "startingOffsetsByTimestamp": "{}"},
        streaming=True,
    )
    assert timestamp_targets(everything.starting, [TP("a", 0)]) == {TP("a", 0): 5}


def test_resolve_offsets_sentinels_missing_partitions_and_timestamps() -> None:
    tps = [TP("a", 0), TP("a", 1), TP("a", 2)]
    earliest = {TP("a", 0): 5, TP("a", 1): 0, TP("a", 2): 1}
    latest = {TP("a", 0): 50, TP("a", 1): 10, TP("a", 2): 20}
    spec = OffsetSpec("offsets", {TP("a", 0): 7, TP("a", 1): -1})
    assert resolve_offsets(spec, tps, earliest, latest, missing="earliest") == {
        TP("a", 0): 7,
        TP("a", 1): 10,
        TP("a", 2): 1,
    }
    ts = OffsetSpec("timestamps", all_timestamp_ms=100)
    found = {TP("a", 0): 30, TP("a", 1): None, TP("a", 2): 2}
    assert resolve_offsets(ts, tps, earliest, latest, found, missing="earliest")[TP("a", 1)] == 10
    with pytest.raises(OptionError, match="timestamp"):
        resolve_offsets(ts, tps, earliest, latest, found, missing="earliest", no_match="error")


def test_refused_client_settings_and_passthrough() -> None:
    with pytest.raises(OptionError, match=r"group\.id"):
        consumer_config({"kafka.group.id": "g"})
    with pytest.raises(OptionError, match="startingOffsets"):
        consumer_config({"kafka.auto.offset.reset": "earliest"})
    assert consumer_config({"kafka.client.rack": "r1", "fetch.max.wait.ms": "50"}) == {
        "client_rack": "r1",
        "fetch_max_wait_ms": 50,
    }
    assert producer_config({}) == {"acks": "all"}
    cfg = producer_config({"acks": "1", "kafka.compression.type": "zstd", "linger.ms": "20"})
    assert cfg == {"acks": "1", "compression_type": "zstd", "linger_ms": 20}
    with pytest.raises(OptionError, match="integer"):
        producer_config({"linger.ms": "soon"})
    with pytest.raises(OptionError, match="serializer"):
        producer_config({"kafka.value.serializer": "x"})


def test_split_ranges_follows_kafkas_range_calculator() -> None:
    ranges = [OffsetRange("a", 0, 0, 90), OffsetRange("a", 1, 0, 10), OffsetRange("a", 2, 3, 3)]
    # Enough partitions already (empty ranges dropped): one task per partition.
    assert split_ranges(ranges, None) == ranges[:2]
    assert split_ranges(ranges, 2) == ranges[:2]
    split = split_ranges(ranges, 10)
    assert [r for r in split if r.partition == 1] == [ranges[1]]
    big = [r for r in split if r.partition == 0]
    assert len(big) == 9 and big[0].start == 0 and big[-1].end == 90
    assert all(a.end == b.start for a, b in itertools.pairwise(big))


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 500), min_size=1, max_size=6),
    min_partitions=st.integers(1, 20),
)
def test_split_ranges_covers_every_offset_exactly_once(sizes: list[int], min_partitions: int):
    ranges = [OffsetRange("t", p, 10, 10 + size) for p, size in enumerate(sizes)]
    split = split_ranges(ranges, min_partitions)
    covered = sorted((r.partition, o) for r in split for o in range(r.start, r.end))
    expected = sorted((r.partition, o) for r in ranges for o in range(r.start, r.end))
    assert covered == expected
    assert all(r.size > 0 for r in split)


@settings(max_examples=80, deadline=None)
@given(
    lags=st.lists(st.integers(0, 1000), min_size=1, max_size=6),
    max_rows=st.integers(1, 2000),
)
def test_rate_limit_never_passes_the_hw_and_admits_about_max_rows(lags: list[int], max_rows: int):
    start = {TP("t", p): 100 for p in range(len(lags))}
    latest = {TP("t", p): 100 + lag for p, lag in enumerate(lags)}
    end = rate_limit(start, latest, max_rows)
    admitted = sum(end[tp] - start[tp] for tp in start)
    assert all(start[tp] <= end[tp] <= latest[tp] for tp in start)
    if sum(lags) <= max_rows:
        assert end == latest
    else:
        # floor() per partition, or 1 for a partition whose share is below one record.
        assert admitted <= max_rows + len(lags)
        assert admitted > 0


def test_offsets_json_uses_string_partition_keys() -> None:
    offsets = {TP("b", 1): 3, TP("a", 0): 5}
    data = offsets_to_json(offsets)
    assert data == {"a": {"0": 5}, "b": {"1": 3}}
    assert offsets_from_json(data) == offsets
    assert offsets_from_json('{"a": {"0": 5}}') == {TP("a", 0): 5}


def test_client_and_options_import_without_pyspark() -> None:
    # pyspark is an optional extra: the client and the pure planning code must not need it.
    code = (
        "import sys, minibroker.client, minibroker.client.spark.options; "
        "assert 'pyspark' not in sys.modules, 'pyspark was imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_tls_options_pass_through_to_every_client() -> None:
    from minibroker.client.spark.options import security_kwargs

    options = {
        "kafka.security.protocol": "SSL",
        "kafka.ssl.ca.location": "/d/ca.pem",
        "ssl.certificate.location": "/d/u.pem",
        "kafka.ssl.key.location": "/d/u.key",
        "kafka.client.rack": "r1",
    }
    tls = {
        "security_protocol": "SSL",
        "ssl_ca_location": "/d/ca.pem",
        "ssl_certificate_location": "/d/u.pem",
        "ssl_key_location": "/d/u.key",
    }
    consumer = consumer_config(options)
    assert consumer == {**tls, "client_rack": "r1"}
    assert producer_config(options) == {**tls, "acks": "all"}
    assert security_kwargs(consumer) == tls
    assert security_kwargs({"client_rack": "r1"}) == {}


def test_sasl_options_pass_through_to_every_client() -> None:
    from minibroker.client.spark.options import security_kwargs

    options = {
        "kafka.security.protocol": "SASL_SSL",
        "kafka.ssl.ca.location": "/d/ca.pem",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.username": "alice",
        "kafka.sasl.password": "pw",
    }
    sasl = {
        "security_protocol": "SASL_SSL",
        "ssl_ca_location": "/d/ca.pem",
        "sasl_mechanism": "PLAIN",
        "sasl_username": "alice",
        "sasl_password": "pw",
    }
    consumer = consumer_config(options)
    assert consumer == sasl
    assert producer_config(options) == {**sasl, "acks": "all"}
    assert security_kwargs(consumer) == sasl
