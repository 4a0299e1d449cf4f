"""Interop of the record codec with independent implementations, both directions, every codec.

- Record layer: kafka-python 3.0.12's `DefaultRecordBatchBuilder` / `DefaultRecordBatch` (a
  separate Python implementation of Kafka's DefaultRecordBatch) reads what we write and we read
  what it writes, with the same records, offsets, timestamps, headers and header fields.
- Codecs under kafka-python: gzip is its own (stdlib gzip). It needs python-snappy, lz4 and
  zstandard for the others, which are not installed; the hooks it calls are pointed at
  independent implementations instead: for snappy its own xerial framing code over cramjam's raw
  snappy block (so the framing is checked independently, the block codec is not), for lz4 and
  zstd the reference `lz4` and `zstd` command-line tools (Debian's builds of liblz4/libzstd).
- Codecs under Java: Kafka's Java client compresses with xerial snappy-java
  (SnappyOutputStream/SnappyInputStream), lz4-java and zstd-jni; pyspark ships those exact jars,
  so a small Java program run on them reads our compressed sections and writes sections for us
  to read. For lz4 it also applies the frame-descriptor checks of Kafka's Lz4BlockInputStream
  (version 01, independent blocks, reserved bits, block size id 4-7, header checksum).
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import types
from collections.abc import Iterator

import cramjam
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import codec as kafka_codec
from kafka.record import default_records
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from minibroker.client.batch import Compression, read_header
from minibroker.client.compression import compress, decompress
from minibroker.client.records import DecodedRecord, decode_batch, encode_batch

HAVE_CLI_CODECS = shutil.which("lz4") is not None and shutil.which("zstd") is not None


def _cli(args: list[str], data: bytes) -> bytes:
    return subprocess.run(args, input=bytes(data), capture_output=True, check=True).stdout


@pytest.fixture(scope="module", autouse=True)
def _kafka_python_codecs() -> Iterator[None]:
    """Point kafka-python's missing codec hooks at independent implementations."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            kafka_codec,
            "snappy",
            types.SimpleNamespace(
                compress=lambda data: bytes(cramjam.snappy.compress_raw(data)),
                decompress=lambda data: bytes(cramjam.snappy.decompress_raw(data)),
            ),
        )
        if HAVE_CLI_CODECS:
            mp.setattr(kafka_codec, "lz4", types.SimpleNamespace())
            mp.setattr(kafka_codec, "zstd", types.SimpleNamespace())
            mp.setattr(default_records, "lz4_encode", lambda d: _cli(["lz4", "-q", "-c"], d))
            mp.setattr(default_records, "lz4_decode", lambda d: _cli(["lz4", "-d", "-q", "-c"], d))
            mp.setattr(default_records, "zstd_encode", lambda d: _cli(["zstd", "-q", "-c"], d))
            mp.setattr(
                default_records, "zstd_decode", lambda d: _cli(["zstd", "-d", "-q", "-c"], d)
            )
        yield


def _codecs() -> list[Compression]:
    if HAVE_CLI_CODECS:
        return list(Compression)
    return [Compression.NONE, Compression.GZIP, Compression.SNAPPY]


def test_every_codec_is_covered_here() -> None:
    """The lz4 and zstd checks need Debian's lz4 and zstd tools (in the project's image)."""
    assert HAVE_CLI_CODECS, "install the lz4 and zstd command-line tools"


Headers = list[tuple[str, bytes | None]]
RecordIn = tuple[int, bytes | None, bytes | None, Headers]

# Values are padded with repetitive bytes: kafka-python silently sends a batch uncompressed when
# compression does not shrink it, and these tests must exercise the codec.
record_st = st.tuples(
    st.integers(0, 2**41),
    st.one_of(st.none(), st.binary(max_size=32)),
    st.one_of(st.none(), st.binary(max_size=64).map(lambda b: b + b"interop" * 40)),
    st.lists(
        st.tuples(st.text(max_size=6), st.one_of(st.none(), st.binary(max_size=8))), max_size=2
    ),
)
INTEROP = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _their_encode(
    records: list[RecordIn], compression: Compression, producer: tuple[int, int, int]
) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(compression),
        is_transactional=False,
        producer_id=producer[0],
        producer_epoch=producer[1],
        base_sequence=producer[2],
        batch_size=1 << 30,
    )
    for offset, (timestamp, key, value, headers) in enumerate(records):
        assert builder.append(offset, timestamp, key, value, headers) is not None
    return bytes(builder.build())


def _their_decode(buf: bytes) -> tuple[DefaultRecordBatch, list[DecodedRecord]]:
    batch = DefaultRecordBatch(buf)
    assert batch.validate_crc()
    records = [
        DecodedRecord(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch
    ]
    return batch, records


def _expected(records: list[RecordIn], base_offset: int = 0) -> list[DecodedRecord]:
    return [
        DecodedRecord(base_offset + i, ts, key, value, tuple(headers))
        for i, (ts, key, value, headers) in enumerate(records)
    ]


@pytest.mark.parametrize("compression", _codecs(), ids=lambda c: c.label)
@INTEROP
@given(records=st.lists(record_st, min_size=1, max_size=12), with_producer=st.booleans())
def test_ours_to_kafka_python(
    compression: Compression, records: list[RecordIn], with_producer: bool
) -> None:
    producer = (4242, 7, 1000) if with_producer else (-1, -1, -1)
    ours = encode_batch(
        records,
        compression=compression,
        base_offset=500,
        producer_id=producer[0],
        producer_epoch=producer[1],
        base_sequence=producer[2],
    )
    batch, decoded = _their_decode(ours)
    assert batch.compression_type == int(compression)
    assert (batch.base_offset, batch.last_offset_delta, batch.records_count) == (
        500,
        len(records) - 1,
        len(records),
    )
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == producer
    assert batch.first_timestamp == records[0][0]
    assert batch.max_timestamp == max(r[0] for r in records)
    assert decoded == _expected(records, 500)


@pytest.mark.parametrize("compression", _codecs(), ids=lambda c: c.label)
@INTEROP
@given(records=st.lists(record_st, min_size=1, max_size=12), with_producer=st.booleans())
def test_kafka_python_to_ours(
    compression: Compression, records: list[RecordIn], with_producer: bool
) -> None:
    producer = (4242, 7, 1000) if with_producer else (-1, -1, -1)
    records = [*records, (records[0][0], None, b"compressible" * 30, [])]
    theirs = _their_encode(records, compression, producer)
    header = read_header(theirs)
    assert header.compression is compression
    batch = decode_batch(theirs)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == producer
    assert header.max_timestamp == max(r[0] for r in records)
    assert batch.records == _expected(records)


def test_identical_bytes_without_compression() -> None:
    """With no codec in play both implementations produce the very same batch."""
    records: list[RecordIn] = [
        (1_700_000_000_000, b"k1", b"v1", [("trace", b"abc")]),
        (1_700_000_000_005, None, b"v2", []),
        (1_699_999_999_999, b"k3", None, [("a", None), ("b", b"")]),
    ]
    theirs = _their_encode(records, Compression.NONE, (-1, -1, -1))
    ours = encode_batch(records, partition_leader_epoch=0)
    assert ours == theirs


# ---------------------------------------------------------------------------------------------
# Java: the compression libraries Kafka's client itself uses.

JAVA_SOURCE = r"""
import java.io.*;
import java.nio.file.*;
import org.xerial.snappy.SnappyInputStream;
import org.xerial.snappy.SnappyOutputStream;
import net.jpountz.lz4.LZ4FrameInputStream;
import net.jpountz.lz4.LZ4FrameOutputStream;
import net.jpountz.xxhash.XXHashFactory;
import com.github.luben.zstd.ZstdInputStream;
import com.github.luben.zstd.ZstdOutputStream;

/** args: (read|write) codec in out. read: decompress `in` into `out`; write: compress. */
public class CodecCheck {
    static InputStream reader(String codec, InputStream in) throws IOException {
        switch (codec) {
            case "snappy": return new SnappyInputStream(in);
            case "lz4": return new LZ4FrameInputStream(in);
            case "zstd": return new ZstdInputStream(in);
            default: throw new IllegalArgumentException(codec);
        }
    }

    static OutputStream writer(String codec, OutputStream out) throws IOException {
        switch (codec) {
            case "snappy": return new SnappyOutputStream(out);
            // Kafka's own writer: 64 KiB blocks, independent.
            case "lz4": return new LZ4FrameOutputStream(out,
                LZ4FrameOutputStream.BLOCKSIZE.SIZE_64KB,
                LZ4FrameOutputStream.FLG.Bits.BLOCK_INDEPENDENCE);
            case "zstd": return new ZstdOutputStream(out);
            default: throw new IllegalArgumentException(codec);
        }
    }

    /** The frame-descriptor checks of Kafka's Lz4BlockInputStream.readHeader / FLG / BD. */
    static void kafkaLz4HeaderCheck(byte[] b) {
        if (b[0] != 0x04 || b[1] != 0x22 || b[2] != 0x4d || b[3] != 0x18)
            throw new IllegalStateException("lz4 magic");
        int flg = b[4] & 0xff, bd = b[5] & 0xff;
        if ((flg & 3) != 0) throw new IllegalStateException("Reserved bits must be 0");
        if (((flg >>> 5) & 1) != 1)
            throw new IllegalStateException("Dependent block stream is unsupported");
        if (((flg >>> 6) & 3) != 1) throw new IllegalStateException("Version is unsupported");
        if ((bd & 15) != 0 || (bd >>> 7) != 0) throw new IllegalStateException("BD reserved bits");
        int size = (bd >>> 4) & 7;
        if (size < 4 || size > 7)
            throw new IllegalStateException("Block size value must be between 4 and 7");
        int len = ((flg >>> 3) & 1) == 1 ? 10 : 2;
        int hash = XXHashFactory.fastestInstance().hash32().hash(b, 4, len, 0);
        if (b[4 + len] != (byte) ((hash >> 8) & 0xff))
            throw new IllegalStateException("Stream frame descriptor corrupted");
    }

    public static void main(String[] args) throws Exception {
        String mode = args[0], codec = args[1];
        byte[] input = Files.readAllBytes(Paths.get(args[2]));
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        if (mode.equals("read")) {
            if (codec.equals("lz4")) kafkaLz4HeaderCheck(input);
            try (InputStream in = reader(codec, new ByteArrayInputStream(input))) {
                in.transferTo(out);
            }
        } else {
            try (OutputStream w = writer(codec, out)) { w.write(input); }
        }
        Files.write(Paths.get(args[3]), out.toByteArray());
    }
}
"""


def _pyspark_jars() -> list[pathlib.Path]:
    try:
        import pyspark
    except ImportError:
        return []
    jars = pathlib.Path(pyspark.__file__).parent / "jars"
    wanted = ("snappy-java-", "lz4-java-", "zstd-jni-")
    return sorted(p for p in jars.glob("*.jar") if p.name.startswith(wanted))


@pytest.fixture(scope="module")
def java_codec_check(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, pathlib.Path]:
    jars = _pyspark_jars()
    # `make test` installs the spark extra and the project needs Java 17 (README), so a missing
    # JDK or jar is a broken environment to report, not a reason to skip the check.
    assert shutil.which("javac") and shutil.which("java"), "a JDK (javac, java) is needed"
    assert len(jars) == 3, f"pyspark's snappy-java, lz4-java and zstd-jni jars, found {jars}"
    work = tmp_path_factory.mktemp("java")
    (work / "CodecCheck.java").write_text(JAVA_SOURCE)
    classpath = ":".join([str(work), *map(str, jars)])
    subprocess.run(
        ["javac", "-cp", classpath, "-d", str(work), str(work / "CodecCheck.java")],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return classpath, work


def _java(check: tuple[str, pathlib.Path], mode: str, codec: str, data: bytes, name: str) -> bytes:
    classpath, work = check
    src, dst = work / f"{name}.in", work / f"{name}.out"
    src.write_bytes(data)
    result = subprocess.run(
        ["java", "-cp", classpath, "CodecCheck", mode, codec, str(src), str(dst)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return dst.read_bytes()


# Records-section-sized payloads: empty-ish, one block, and several blocks of every framing.
PAYLOADS = {
    "small": b"minibroker" * 3,
    "multi_block": b"".join(b"record-%06d|" % i + bytes(range(256)) for i in range(700)),
}


@pytest.mark.parametrize(
    "compression", [Compression.SNAPPY, Compression.LZ4, Compression.ZSTD], ids=lambda c: c.label
)
def test_java_kafka_codecs_both_directions(
    java_codec_check: tuple[str, pathlib.Path], compression: Compression
) -> None:
    for name, payload in PAYLOADS.items():
        ours = compress(compression, payload)
        tag = f"{compression.label}-{name}"
        assert _java(java_codec_check, "read", compression.label, ours, tag + "-r") == payload
        theirs = _java(java_codec_check, "write", compression.label, payload, tag + "-w")
        assert decompress(compression, theirs) == payload


def test_java_reads_a_whole_compressed_batch_section(
    java_codec_check: tuple[str, pathlib.Path],
) -> None:
    """The records section of a real batch, cut out after the 61-byte header."""
    records = [(1_000 + i, b"k%d" % i, b"v" * 1024, [("h", b"x")]) for i in range(16)]
    plain = encode_batch(records)[61:]
    for compression in (Compression.SNAPPY, Compression.LZ4, Compression.ZSTD):
        section = encode_batch(records, compression=compression)[61:]
        assert _java(java_codec_check, "read", compression.label, section, "sec") == plain
