"""The compiled record encoder (client/records/_encoder.c) against the pure path it replaces.

The pure Python path of `BatchBuilder` is the reference: for the same appends the compiled one
must give the very same bytes (records section and whole batch, every codec), refuse a record at
the same point of the batch_size limit, and refuse bad input with the same exception and message
while leaving itself unchanged. kafka-python's DefaultRecordBatch (an independent implementation
of Kafka's DefaultRecordBatch, as in test_records_interop.py) reads what it writes. Odd objects
(non-contiguous or released memoryviews, iterators that run Python code mid-append) must raise,
never crash the process. Run these under `python -X dev` too: it checks reference counting and
the memory allocator's bounds.
"""

from __future__ import annotations

import array
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

from minibroker.client.batch import HEADER_SIZE, Compression
from minibroker.client.records import DecodedRecord, builder, decode_batch, encoder_choice
from minibroker.client.records._encoder import HEADER_SIZE as C_HEADER_SIZE
from minibroker.client.records._encoder import RecordsBuilder
from minibroker.client.records.builder import BatchBuilder

INT64_MAX = 2**63 - 1
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _builder(native: type | None, batch_size: int, **kwargs: Any) -> BatchBuilder:
    saved = encoder_choice.RecordsBuilder
    encoder_choice.RecordsBuilder = native
    try:
        made = BatchBuilder(batch_size, **kwargs)
    finally:
        encoder_choice.RecordsBuilder = saved
    assert (made._native is not None) == (native is not None)
    return made


def pure(batch_size: int = 1 << 30, **kwargs: Any) -> BatchBuilder:
    return _builder(None, batch_size, **kwargs)


def compiled(batch_size: int = 1 << 30, **kwargs: Any) -> BatchBuilder:
    return _builder(RecordsBuilder, batch_size, **kwargs)


def records_of(b: BatchBuilder) -> bytes:
    """The records section so far (the compiled builder's, or the pure path's parts joined)."""
    return b._native.records() if b._native is not None else b"".join(b._parts)


def state(b: BatchBuilder) -> tuple[int, int, int, int, bytes]:
    return (b.record_count, b.estimated_size, b.base_timestamp, b.max_timestamp, records_of(b))


def as_expected(data: object) -> bytes | None:
    """What a key or value becomes on the wire."""
    if data is None:
        return None
    if isinstance(data, str):
        return data.encode("utf-8")
    return bytes(data)  # type: ignore[call-overload]


# ---------------------------------------------------------------------------------------------
# Strategies: sizes cross the varint length boundaries (64 and 8192 for zig-zag lengths).

_boundary_sizes = st.one_of(
    st.integers(0, 70),
    st.integers(8150, 8200),
    st.sampled_from([127, 128, 129, 8191, 8192, 8193, 16383, 16384]),
)
_payload = st.one_of(
    st.binary(max_size=80),
    st.builds(lambda n, c: bytes([c]) * n, _boundary_sizes, st.integers(0, 255)),
)
data_st = st.one_of(
    st.none(),
    _payload,
    _payload.map(bytearray),
    _payload.map(memoryview),
    st.text(max_size=40),  # non-ASCII included: UTF-8 is longer than len(str)
    st.builds(lambda n: "é" * n, _boundary_sizes),
)
headers_st = st.one_of(
    st.none(),
    st.just(()),
    st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), data_st)), max_size=3),
    st.lists(st.tuples(st.text(max_size=8), data_st), max_size=2).map(tuple),
)
timestamp_st = st.one_of(
    st.integers(0, INT64_MAX),
    st.integers(1_700_000_000_000 - 10_000, 1_700_000_000_000 + 10_000),
    st.sampled_from([0, 1, 8191, 8192, 2**31, 2**62, INT64_MAX]),
)
record_st = st.tuples(timestamp_st, data_st, data_st, headers_st)
batch_size_st = st.one_of(st.integers(0, 40_000), st.just(1 << 30))


def test_the_compiled_encoder_is_in_use() -> None:
    """On the dev and CI path (make install) the compiled module must be what BatchBuilder uses,
    unless MINIBROKER_PURE_CODEC asks for the pure path."""
    forced_pure = os.environ.get("MINIBROKER_PURE_CODEC", "") not in ("", "0")
    assert builder.COMPILED is not forced_pure
    assert (BatchBuilder()._native is None) is forced_pure
    assert C_HEADER_SIZE == HEADER_SIZE


@pytest.mark.parametrize(("env", "expected"), [("1", "False"), ("0", "True"), ("", "True")])
def test_environment_variable_forces_the_pure_path(env: str, expected: str) -> None:
    code = (
        "from minibroker.client.records import builder as b; "
        "print(b.COMPILED, b.BatchBuilder()._native is not None)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "MINIBROKER_PURE_CODEC": env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == [expected, expected]


# ---------------------------------------------------------------------------------------------
# Byte identity and interop


def _kafka_python_records(batch: bytes) -> list[DecodedRecord]:
    parsed = DefaultRecordBatch(batch)
    assert parsed.validate_crc()
    return [DecodedRecord(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in parsed]


@SETTINGS
@given(
    records=st.lists(record_st, min_size=1, max_size=12),
    batch_size=batch_size_st,
    compression=st.sampled_from(list(Compression)),
)
def test_compiled_bytes_equal_the_pure_path(
    records: list[tuple[int, Any, Any, Any]], batch_size: int, compression: Compression
) -> None:
    ours, reference = compiled(batch_size, compression=compression), pure(batch_size)
    taken = []
    for record in records:
        accepted = ours.append(*record)
        assert accepted == reference.append(*record)
        assert state(ours) == state(reference)
        if accepted:
            taken.append(record)
    assert ours._native.last_record_size > 0
    built = ours.build()
    uncompressed = reference.build()
    if compression is Compression.NONE:
        assert built == uncompressed
    else:
        again = pure(batch_size, compression=compression)
        for record in taken:
            assert again.append(*record)
        assert built == again.build()
    expected = [
        DecodedRecord(
            i,
            ts,
            as_expected(key),
            as_expected(value),
            tuple((name, as_expected(v)) for name, v in headers or ()),
        )
        for i, (ts, key, value, headers) in enumerate(taken)
    ]
    assert _kafka_python_records(uncompressed) == expected
    assert decode_batch(built).records == expected
    assert ours.estimated_size == len(uncompressed)


def test_varint_boundaries_by_hand() -> None:
    """Record lengths and deltas right at the one/two/three byte varint steps, both ways."""
    ours, reference = compiled(), pure()
    base = 1 << 40
    for ts, n in [
        (base, 0),
        (base - 64, 50),
        (base + 63, 51),
        (base + 8191, 52),
        (base - 8192, 8180),
        (base - 8193, 8181),
        (0, 8190),
        (INT64_MAX, 8191),
    ]:
        assert ours.append(ts, None, b"v" * n) and reference.append(ts, None, b"v" * n)
    assert records_of(ours) == records_of(reference)
    assert ours.build() == reference.build()


# ---------------------------------------------------------------------------------------------
# The batch_size limit


def _record_size(*record: Any) -> int:
    one = compiled()
    one.append(*record)
    return one.estimated_size - HEADER_SIZE


@pytest.mark.parametrize("make", [pure, compiled], ids=["pure", "compiled"])
@pytest.mark.parametrize("slack", [-1, 0, 1])
def test_refused_exactly_past_batch_size(make: Callable[..., BatchBuilder], slack: int) -> None:
    first = (1000, b"k", b"v" * 100, [("h", b"x")])
    second = (1003, None, b"w" * 60, None)
    limit = HEADER_SIZE + _record_size(*first) + _record_size(*second) + slack
    b = make(limit)
    assert b.append(*first)
    assert b.append(*second) is (slack >= 0)
    assert b.estimated_size <= limit


@pytest.mark.parametrize("make", [pure, compiled], ids=["pure", "compiled"])
def test_an_empty_builder_takes_one_oversized_record(make: Callable[..., BatchBuilder]) -> None:
    b = make(100)
    assert b.append(1, None, b"x" * 500, [("h", "y" * 300)])
    before = state(b)
    assert not b.append(2, None, b"")
    assert state(b) == before
    native = RecordsBuilder(0)
    assert native.append(5, None, b"x" * 10) == 0
    assert native.append(5, None, b"") == -1
    assert native.count == 1


def test_native_api() -> None:
    native = RecordsBuilder(1 << 20)
    assert (native.count, native.size, native.batch_size, native.records()) == (0, 61, 1 << 20, b"")
    assert native.append(10, None, b"a") == 0
    assert native.append(7, b"k", "b", [("h", None)]) == 1
    assert native.append(12, None, None) == 2
    assert (native.count, native.base_timestamp, native.max_timestamp) == (3, 10, 12)
    size = native.size
    assert native.append(11, None, b"x" * 70) == 3
    # length 2 (zig-zag 77 > 63) | attributes, deltas, null key 4 | value length 2 | 70 | 1
    assert native.last_record_size == native.size - size == 2 + 4 + 2 + 70 + 1
    assert native.size == HEADER_SIZE + len(native.records())
    assert RecordsBuilder(2**70).batch_size == INT64_MAX
    with pytest.raises(TypeError):
        native.append(1, None)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        RecordsBuilder("big")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# append_values


@SETTINGS
@given(
    timestamp=timestamp_st,
    values=st.lists(data_st, max_size=30),
    with_keys=st.booleans(),
    keys_seed=st.lists(data_st, min_size=30, max_size=30),
    batch_size=batch_size_st,
    as_tuple=st.booleans(),
    prefix=st.lists(record_st, max_size=2),
)
def test_append_values_equals_a_loop_of_append(
    timestamp: int,
    values: list[Any],
    with_keys: bool,
    keys_seed: list[Any],
    batch_size: int,
    as_tuple: bool,
    prefix: list[tuple[int, Any, Any, Any]],
) -> None:
    keys = keys_seed[: len(values)] if with_keys else None
    seq_values: Sequence[Any] = tuple(values) if as_tuple else values
    looped = compiled(batch_size)
    for record in prefix:
        looped.append(*record)
    expected = 0
    for i, value in enumerate(values):
        if not looped.append(timestamp, None if keys is None else keys[i], value):
            break
        expected += 1
    for make in (compiled, pure):
        b = make(batch_size)
        for record in prefix:
            b.append(*record)
        assert b.append_values(timestamp, seq_values, keys) == expected
        assert state(b) == state(looped)


def test_append_values_stops_at_the_first_value_that_does_not_fit() -> None:
    for make in (compiled, pure):
        b = make(HEADER_SIZE + 3 * 20)
        assert b.append_values(5, [b"x" * 200, b"y"]) == 1  # an empty builder takes one
        b = make(HEADER_SIZE + 3 * 20)
        assert b.append_values(5, [b"a" * 10, b"b" * 10, b"c" * 10, b"d"], [b"k"] * 4) == 3
        assert b.append_values(5, []) == 0


# ---------------------------------------------------------------------------------------------
# Bad input: same exception, same message, builder unchanged


class Weird:
    pass


class Index:
    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


def _non_contiguous() -> memoryview:
    return memoryview(b"abcdef")[::2]


def _released() -> memoryview:
    view = memoryview(b"abc")
    view.release()
    return view


BAD_APPENDS: dict[str, Callable[[], tuple[Any, ...]]] = {
    "bool timestamp": lambda: (True, None, b"v"),
    "negative timestamp": lambda: (-1, None, b"v"),
    "timestamp past int64": lambda: (2**63, None, b"v"),
    "huge negative timestamp": lambda: (-(2**80), None, b"v"),
    "str timestamp": lambda: ("1", None, b"v"),
    "float timestamp": lambda: (1.5, None, b"v"),
    "None timestamp": lambda: (None, None, b"v"),
    "negative __index__ timestamp": lambda: (Index(-3), None, b"v"),
    "int key": lambda: (1, 5, b"v"),
    "object value": lambda: (1, None, Weird()),
    "Decimal value": lambda: (1, None, Decimal(1)),
    "list value": lambda: (1, None, [1, 2]),
    "non-contiguous key": lambda: (1, _non_contiguous(), b"v"),
    "non-contiguous value": lambda: (1, None, _non_contiguous()),
    "released value": lambda: (1, None, _released()),
    "surrogate key": lambda: (1, "\ud800", b"v"),
    "int header name": lambda: (1, None, b"v", [(1, b"x")]),
    "bytes header name": lambda: (1, None, b"v", [(b"h", b"x")]),
    "surrogate header name": lambda: (1, None, b"v", [("\udfff", b"x")]),
    "int header value": lambda: (1, None, b"v", [("h", b"x"), ("g", 3)]),
    "non-contiguous header value": lambda: (1, None, b"v", [("h", _non_contiguous())]),
    "surrogate header value": lambda: (1, None, b"v", [("h", "\ud800")]),
    "short header pair": lambda: (1, None, b"v", [("h",)]),
    "long header pair": lambda: (1, None, b"v", [("h", b"x", b"y")]),
    "long header list pair": lambda: (1, None, b"v", [["h", b"x", b"y"]]),
    "header not a pair": lambda: (1, None, b"v", [5]),
    "header pair from an iterator": lambda: (1, None, b"v", [iter(["h"])]),
    "headers without len": lambda: (1, None, b"v", (p for p in [("h", b"x")])),
    "headers an int": lambda: (1, None, b"v", 7),
    "key error before value error": lambda: (1, 5, Weird()),
    "value error before header error": lambda: (1, None, Weird(), [(1, 2)]),
}


def _outcome(call: Callable[[], object]) -> tuple[type, str]:
    with pytest.raises(Exception) as caught:
        call()
    return type(caught.value), str(caught.value)


@pytest.mark.parametrize("case", list(BAD_APPENDS))
def test_bad_append_raises_as_the_pure_path_and_changes_nothing(case: str) -> None:
    outcomes = []
    for make in (pure, compiled):
        b = make()
        assert b.append(5, b"k", b"first", [("h", b"1")])
        before = state(b)
        outcomes.append(_outcome(lambda b=b: b.append(*BAD_APPENDS[case]())))
        assert state(b) == before
        assert b.append(6, None, b"after")
    assert outcomes[0] == outcomes[1]
    native = RecordsBuilder(1 << 20)
    assert _outcome(lambda: native.append(*BAD_APPENDS[case]())) == outcomes[0]
    assert (native.count, native.size, native.records()) == (0, HEADER_SIZE, b"")


BAD_APPEND_VALUES: dict[str, Callable[[], tuple[Any, ...]]] = {
    "bool timestamp": lambda: (False, [b"v"]),
    "negative timestamp": lambda: (-5, [b"v"]),
    "negative timestamp, no values": lambda: (-5, []),
    "values a generator": lambda: (1, (v for v in [b"v"])),
    "values bytes": lambda: (1, b"abc"),
    "keys a str": lambda: (1, [b"v"], "k"),
    "fewer keys": lambda: (1, [b"v", b"w"], [b"k"]),
    "bad value third": lambda: (1, [b"v", "w", 3, b"x"]),
    "bad key second": lambda: (1, [b"v", b"w"], [None, Weird()]),
    "non-contiguous value": lambda: (1, [b"v", _non_contiguous()]),
}


@pytest.mark.parametrize("case", list(BAD_APPEND_VALUES))
def test_bad_append_values_raises_as_the_pure_path(case: str) -> None:
    outcomes = []
    states = []
    for make in (pure, compiled):
        b = make()
        outcomes.append(_outcome(lambda b=b: b.append_values(*BAD_APPEND_VALUES[case]())))
        states.append(state(b))  # values before the bad one stay appended, as with append
    assert outcomes[0] == outcomes[1]
    assert states[0] == states[1]


def test_a_closed_builder_refuses_appends() -> None:
    for make in (pure, compiled):
        b = make()
        b.append(1, None, b"v")
        built = b.build()
        assert (b.record_count, b.estimated_size, b.max_timestamp) == (1, len(built), 1)
        with pytest.raises(RuntimeError):
            b.append(1, None, b"v")
        with pytest.raises(RuntimeError):
            b.append_values(1, [b"v"])


# ---------------------------------------------------------------------------------------------
# Odd objects: an exception or a record, never a crash


def _views() -> list[memoryview]:
    raw = bytes(range(48))
    base = memoryview(raw)
    return [
        base,
        base[::-1],
        base[::3],
        base[5:5],
        base.cast("i"),
        base.cast("B", shape=[6, 8]),
        base.cast("i", shape=[3, 4]),
        memoryview(array.array("d", [1.5, 2.5])),
        memoryview(bytearray(b"mutable")),
        memoryview(b"x").cast("B", shape=[]),
        _released(),
    ]


class PairMutatingHeaders:
    """A header pair whose iteration empties the header list the builder is reading."""

    def __init__(self, headers: list[Any]) -> None:
        self.headers = headers

    def __iter__(self) -> Iterator[Any]:
        self.headers.clear()
        yield "h"
        yield b"x"


class PairReentering:
    """A header pair whose iteration appends to the builder that is encoding it."""

    def __init__(self) -> None:
        self.target: Any = None

    def __iter__(self) -> Iterator[Any]:
        if self.target is not None:
            self.target.append(1, None, b"inner")
        yield "h"
        yield b"x"


class Falsy:
    def __bool__(self) -> bool:
        raise ZeroDivisionError("no truth")


def _odd_objects() -> list[Any]:
    return [
        *_views(),
        None,
        0,
        -1,
        2**64,
        "",
        "é",
        b"",
        bytearray(),
        Weird(),
        Index(5),
        Falsy(),
        [],
        ["h", b"x"],
        {"h": b"x"},
        "ab",
        b"ab",
        [("h", v) for v in _views()],
        [("h", b"x")] * 3,
        (("", None),),
        [iter(["h", b"x"])],
    ]


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_odd_objects_never_crash(data: st.DataObject) -> None:
    pick = st.sampled_from(range(len(_odd_objects())))
    native = RecordsBuilder(data.draw(st.integers(0, 300)))
    reference = pure(native.batch_size)
    for _ in range(data.draw(st.integers(1, 6))):
        timestamp = data.draw(st.sampled_from([0, 5, INT64_MAX, -1, True]))
        picks = [data.draw(pick) for _ in range(data.draw(st.integers(2, 3)))]
        # Fresh objects for each builder: an iterator is used up by the first one.
        args, same_args = ([timestamp] + [_odd_objects()[i] for i in picks] for _ in range(2))
        before = (native.count, native.size, native.records())
        try:
            index = native.append(*args)
        except Exception as err:
            assert (native.count, native.size, native.records()) == before
            with pytest.raises(type(err)):
                reference.append(*same_args)
        else:
            assert reference.append(*same_args) is (index >= 0)
            assert native.records() == records_of(reference)
    values = [_odd_objects()[data.draw(pick)] for _ in range(data.draw(st.integers(0, 5)))]
    try:
        native.append_values(7, values)
    except Exception:
        pass
    assert native.size == HEADER_SIZE + len(native.records())


def test_python_code_inside_an_append_cannot_corrupt_it() -> None:
    native = RecordsBuilder(1 << 20)
    headers: list[Any] = []
    headers += [PairMutatingHeaders(headers), ("g", b"y")]
    with pytest.raises(RuntimeError, match="changed size"):
        native.append(1, None, b"v", headers)
    pair = PairReentering()
    pair.target = native
    with pytest.raises(RuntimeError, match="already appending"):
        native.append(1, None, b"v", [pair])
    assert (native.count, native.records()) == (0, b"")
    pair.target = None
    assert native.append(1, None, b"v", [pair]) == 0
    assert native.append(2, None, b"w", [iter(["h", b"x"])]) == 1


# -- the producer's interface: bind, append_future, ByteCount --------------------------------------


def _bound(make: Callable[..., BatchBuilder], batch_size: int) -> tuple[Any, Any, Any]:
    from minibroker.client.produce_result import FutureRecordMetadata, ProduceRequestResult
    from minibroker.client.records._encoder import ByteCount
    from minibroker.client.types import TopicPartition

    encoder = make(batch_size).encoder
    result = ProduceRequestResult(TopicPartition("t", 0))
    counter = ByteCount() if make is compiled else encoder_choice.PureByteCount()
    encoder.bind(FutureRecordMetadata, result, counter)
    return encoder, result, counter


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**40),
            st.none() | st.binary(max_size=30),
            st.none() | st.binary(max_size=300),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(100, 3000),
)
def test_append_future_and_its_byte_count_agree_on_both_paths(
    records: list[tuple[int, bytes | None, bytes | None]], batch_size: int
) -> None:
    """The accumulator appends through append_future: the record's future (result, index,
    timestamp), or None when full; the counter holds the batch's size (header included) on
    both paths, so buffer_memory means the same whatever was built."""
    outcomes = []
    for make in (pure, compiled):
        encoder, result, counter = _bound(make, batch_size)
        got = []
        for ts, key, value in records:
            future = encoder.append_future(ts, key, value)
            got.append(None if future is None else (future[0] is result, future[1], future[2]))
        assert counter.value == (encoder.size if encoder.count else 0)
        outcomes.append((got, counter.value, encoder.count))
    assert outcomes[0] == outcomes[1]
    got, _, count = outcomes[1]
    assert [g[1] for g in got if g is not None] == list(range(count))


def test_append_future_needs_bind_and_bind_is_once() -> None:
    from minibroker.client.produce_result import FutureRecordMetadata

    for make in (pure, compiled):
        encoder = make(1000).encoder
        with pytest.raises(RuntimeError, match="needs bind"):
            encoder.append_future(1, None, b"v")
        encoder.bind(FutureRecordMetadata, object(), None)
        with pytest.raises(RuntimeError, match="new, unbound builder"):
            encoder.bind(FutureRecordMetadata, object(), None)


def test_a_refused_record_leaves_the_byte_count_alone() -> None:
    for make in (pure, compiled):
        encoder, _, counter = _bound(make, 1000)
        encoder.append_future(1, None, b"v")
        before = counter.value
        with pytest.raises(TypeError, match="serialize it first"):
            encoder.append_future(1, None, 42)
        assert counter.value == before and encoder.count == 1


def test_bind_checks_its_arguments() -> None:
    encoder = compiled(100).encoder
    with pytest.raises(TypeError, match="subclass of tuple"):
        encoder.bind(list, object(), None)
    with pytest.raises(TypeError, match="ByteCount or None"):
        encoder.bind(tuple, object(), 5)
