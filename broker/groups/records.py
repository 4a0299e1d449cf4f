"""The `__consumer_offsets` keys and values in Kafka's formats (the group coordinator's name for
them): the codec itself is `minibroker.client.consumer_offsets`, shared with `dump-log`.

Pure, no I/O.
"""

from __future__ import annotations

from minibroker.client.consumer_offsets import (
    GROUP_KEY_VERSION,
    GROUP_VALUE_WRITTEN,
    OFFSET_KEY_VERSIONS,
    OFFSET_VALUE_WRITTEN,
    GroupMetadataKey,
    GroupMetadataValue,
    Key,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    RecordFormatError,
    decode_group_value,
    decode_key,
    decode_offset_value,
    decode_value,
    describe,
    encode_group_value,
    encode_key,
    encode_offset_value,
)

__all__ = [
    "GROUP_KEY_VERSION",
    "GROUP_VALUE_WRITTEN",
    "OFFSET_KEY_VERSIONS",
    "OFFSET_VALUE_WRITTEN",
    "GroupMetadataKey",
    "GroupMetadataValue",
    "Key",
    "MemberMetadata",
    "OffsetCommitKey",
    "OffsetCommitValue",
    "RecordFormatError",
    "decode_group_value",
    "decode_key",
    "decode_offset_value",
    "decode_value",
    "describe",
    "encode_group_value",
    "encode_key",
    "encode_offset_value",
]
