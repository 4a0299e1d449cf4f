"""Topic name rules (Kafka's `Topic.validate`), shared by the controller and the broker.

Pure. A name is 1-249 characters of `[a-zA-Z0-9._-]` and not `.` or `..`. The whole name must
match: a `^...$` search would let a trailing newline through, and such a name breaks every
line-based file that holds it (checkpoints) and every log line that prints it.
"""

from __future__ import annotations

import re

MAX_NAME_LENGTH = 249
LEGAL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def invalid_topic_name(name: str) -> str | None:
    """Why `name` is not a legal topic name, or None."""
    if not name:
        return "topic name is empty"
    if name in (".", ".."):
        return f"topic name cannot be {name!r}"
    if len(name) > MAX_NAME_LENGTH:
        return f"topic name is {len(name)} characters long; the maximum is {MAX_NAME_LENGTH}"
    if _LEGAL.fullmatch(name) is None:
        return (
            f"topic name {name!r} is illegal: only ASCII letters, digits, '.', '_' and '-' "
            "are allowed"
        )
    return None


__all__ = ["LEGAL_CHARS", "MAX_NAME_LENGTH", "invalid_topic_name"]
