"""How far a batch's compressed records may expand: what a leader accepts, and so what a consumer
must be ready to decode.

Kafka streams through a batch and needs no bound; the leader here materialises the records, so a
few compressed bytes that expand to gigabytes must be refused, not allocated. Pure.
"""

from __future__ import annotations

# The records of a compressed batch may decompress to at most this many times the topic's
# max.message.bytes (itself counted as at least its 1 MiB default): 64 MiB by default.
UNCOMPRESSED_LIMIT_FACTOR = 64
DEFAULT_MAX_MESSAGE_BYTES = 1048588  # Kafka's max.message.bytes default


def uncompressed_limit(max_message_bytes: int) -> int:
    """The most a batch's records may decompress to on a topic with this max.message.bytes."""
    return UNCOMPRESSED_LIMIT_FACTOR * max(max_message_bytes, DEFAULT_MAX_MESSAGE_BYTES)
