"""The v2 record-batch codec: records in, Kafka's RecordBatch bytes out, and back.

Pure: no I/O. Header-level work (parsing, CRC32C validation, restamping offsets and epochs) lives
in `minibroker.client.batch` and is called from here, never re-implemented; compression framing
lives in `minibroker.client.compression`. Layout (docs/protocol.md §23, Kafka's
DefaultRecordBatch and DefaultRecord): a 61-byte header, then `recordsCount` records, each

    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
    keyLength varint | key | valueLength varint | value | headersCount varint |
    (headerKeyLength varint | headerKey utf8 | headerValueLength varint | headerValue)*

where varints are zig-zag encoded (Kafka's ByteUtils) and -1 lengths mean null. With compression
the whole records section (after `recordsCount`) is one compressed blob.

One module per job, and this package names the API its callers use:
- `varint`: the zig-zag varints;
- `builder`: encoding (`BatchBuilder`, the producer's accumulator's; `encode_batch`), with its
  per-record work in C (`_encoder`, client/records/_encoder.c) when that module is built, and in
  Python otherwise (`encoder_choice` picks; both give the same bytes);
- `decode`: decoding (`iter_records`, `iter_decoded_batches`, `decode_records_sized`, ...);
- `bounds`: how far compressed records may expand (`uncompressed_limit`);
- `validator`: the leader's check of produced records (`validate_producer_records`, Kafka's
  LogValidator), so that every batch it stores decodes with `decode`.
"""

from __future__ import annotations

from minibroker.client.records.bounds import UNCOMPRESSED_LIMIT_FACTOR, uncompressed_limit
from minibroker.client.records.builder import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    BatchBuilder,
    HeaderList,
    PlacedRecord,
    RecordInput,
    encode_batch,
    encode_placed_batch,
)
from minibroker.client.records.decode import (
    DecodedBatch,
    DecodedRecord,
    compression_of,
    decode_batch,
    decode_records,
    decode_records_sized,
    is_partial_tail,
    iter_decoded_batches,
    iter_records,
    parse_control_key,
)
from minibroker.client.records.validator import (
    DEFAULT_TIMESTAMP_AFTER_MAX_MS,
    NO_TIMESTAMP,
    RecordValidation,
    validate_producer_records,
)
from minibroker.client.records.varint import (
    decode_varint,
    decode_varlong,
    encode_varint,
    encode_varlong,
)

__all__ = [
    "CREATE_TIME",
    "DEFAULT_TIMESTAMP_AFTER_MAX_MS",
    "LOG_APPEND_TIME",
    "NO_TIMESTAMP",
    "UNCOMPRESSED_LIMIT_FACTOR",
    "BatchBuilder",
    "DecodedBatch",
    "DecodedRecord",
    "HeaderList",
    "PlacedRecord",
    "RecordInput",
    "RecordValidation",
    "compression_of",
    "decode_batch",
    "decode_records",
    "decode_records_sized",
    "decode_varint",
    "decode_varlong",
    "encode_batch",
    "encode_placed_batch",
    "encode_varint",
    "encode_varlong",
    "is_partial_tail",
    "iter_decoded_batches",
    "iter_records",
    "parse_control_key",
    "uncompressed_limit",
    "validate_producer_records",
]
