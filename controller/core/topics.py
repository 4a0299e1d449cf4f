"""Topic name rules (Kafka's `Topic.validate` and collision check).

Pure. A name is 1-249 characters of `[a-zA-Z0-9._-]` and not `.` or `..` (the rule itself is
`minibroker.client.topic_name`'s, which brokers apply to names from the network too); two names
that differ only by `.` versus `_` collide because both map to the same metric names.
"""

from __future__ import annotations

from minibroker.client.topic_name import MAX_NAME_LENGTH, invalid_topic_name


def collision_key(name: str) -> str:
    return name.replace(".", "_")


__all__ = ["MAX_NAME_LENGTH", "collision_key", "invalid_topic_name"]
