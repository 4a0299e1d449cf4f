"""Topic name rules (Kafka's `Topic.validate` and collision check).

Pure. A name is 1-249 characters of `[a-zA-Z0-9._-]` and not `.` or `..`; two names that differ
only by `.` versus `_` collide because both map to the same metric names.
"""

from __future__ import annotations

import re

MAX_NAME_LENGTH = 249
_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")


def invalid_topic_name(name: str) -> str | None:
    """Why `name` is not a legal topic name, or None."""
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return f"topic name cannot be {name!r}"
    if len(name) > MAX_NAME_LENGTH:
        return f"topic name is {len(name)} characters long; the maximum is {MAX_NAME_LENGTH}"
    if not _LEGAL.match(name):
        return (
            f"topic name {name!r} is illegal: only ASCII letters, digits, '.', '_' and '-' "
            "are allowed"
        )
    return None


def collision_key(name: str) -> str:
    return name.replace(".", "_")


__all__ = ["MAX_NAME_LENGTH", "collision_key", "invalid_topic_name"]
