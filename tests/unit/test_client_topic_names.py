"""Illegal topic names fail at once in every client, before any connection (issue 11 follow-up).

Kafka's clients fail an illegal name at once (InvalidTopicException is not retriable); ours used
to wait `max_block_ms` (or the admin's `default_api_timeout_ms`) for metadata that could never
come. Every client here points at an address nobody listens on and is given ten minutes to
block: the error must come from the name check, well inside the test's own deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

import pytest

from minibroker.client import Admin, AsyncAdmin, AsyncConsumer, AsyncProducer, Producer
from minibroker.client.errors import InvalidTopicError
from minibroker.client.types import TopicPartition

NOBODY = "127.0.0.1:1"
TEN_MINUTES_MS = 600_000
DEADLINE_S = 20  # far below any client's blocking time above

ILLEGAL = ["bad\n", "x" * 250, "", "..", "a b", "émoji"]


def fails_at_once(awaitable: Awaitable[object]) -> InvalidTopicError:
    async def run() -> None:
        await asyncio.wait_for(awaitable, DEADLINE_S)

    with pytest.raises(InvalidTopicError) as caught:
        asyncio.run(run())
    return caught.value


@pytest.mark.parametrize("name", ILLEGAL)
def test_async_producer_send_refuses_an_illegal_name_at_once(name: str) -> None:
    async def run() -> None:
        producer = AsyncProducer(NOBODY, max_block_ms=TEN_MINUTES_MS)
        try:
            await producer.send(name, b"v")
        finally:
            await producer.close(timeout_ms=0)

    err = fails_at_once(run())
    assert "topic name" in str(err)
    assert not err.retriable


def test_the_name_check_says_what_is_wrong() -> None:
    async def send(name: str) -> None:
        producer = AsyncProducer(NOBODY, max_block_ms=TEN_MINUTES_MS)
        try:
            await producer.partitions_for(name)
        finally:
            await producer.close(timeout_ms=0)

    assert "only ASCII letters, digits" in str(fails_at_once(send("bad\n")))
    assert "250 characters long; the maximum is 249" in str(fails_at_once(send("x" * 250)))


def test_blocking_producer_send_refuses_an_illegal_name_and_queues_nothing() -> None:
    producer = Producer(NOBODY, max_block_ms=TEN_MINUTES_MS)
    try:
        with pytest.raises(InvalidTopicError, match="only ASCII letters"):
            producer.send("bad\n", b"v")
        acc = producer._async.accumulator
        assert not acc.has_incomplete() and acc.buffered_bytes == 0
    finally:
        producer.close(timeout_ms=0)


@pytest.mark.parametrize("name", ILLEGAL)
def test_consumer_assign_refuses_an_illegal_name(name: str) -> None:
    consumer = AsyncConsumer(NOBODY, max_block_ms=TEN_MINUTES_MS)
    with pytest.raises(InvalidTopicError):
        consumer.assign([TopicPartition("ok", 0), TopicPartition(name, 0)])
    assert consumer.assignment() == set(), "a refused assign changes nothing"
    assert consumer.cluster.metadata.interest == set()


def test_admin_create_refuses_an_illegal_name_at_once() -> None:
    async def run() -> None:
        async with AsyncAdmin(NOBODY, default_api_timeout_ms=TEN_MINUTES_MS) as admin:
            await admin.create_topic("bad\n", 1, 1)

    assert "only ASCII letters" in str(fails_at_once(run()))
    admin = Admin(NOBODY, default_api_timeout_ms=TEN_MINUTES_MS)
    with admin, pytest.raises(InvalidTopicError, match="the maximum is 249"):
        admin.create_topic("y" * 250)
