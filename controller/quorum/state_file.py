"""The `quorum-state` file in the controller's data dir: what a voter must remember across a
restart (epoch, vote, known leader, the wiped-voter catch-up target).

Blocking disk I/O. Written atomically (temp file, fsync, rename, dir fsync) before the vote or
epoch it records is sent to anyone. JSON in the shape of Kafka's `quorum-state` file:

    {"leaderId": 1001, "leaderEpoch": 7, "votedId": -1, "appliedOffset": 0,
     "currentVoters": null, "data_version": 0, "catchingUpTo": -1}

`catchingUpTo` is ours (absent in Kafka's: read as CAUGHT_UP). A file that cannot be read or
parsed is a QuorumStateError naming it: never silently reset, since a forgotten vote lets this
voter vote twice in one epoch.
"""

from __future__ import annotations

import json
import pathlib

from minibroker.controller.journal import JournalError, write_atomically
from minibroker.controller.quorum.messages import CATCH_UP_UNKNOWN, CAUGHT_UP, QuorumState

FILE_NAME = "quorum-state"
DATA_VERSION = 0


class QuorumStateError(JournalError):
    """The quorum-state file is unusable."""


def quorum_state_path(data_dir: str | pathlib.Path) -> pathlib.Path:
    return pathlib.Path(data_dir) / FILE_NAME


def _unusable(path: pathlib.Path, why: str) -> QuorumStateError:
    return QuorumStateError(
        f"{path} is not a usable quorum-state file ({why}); restore it from a backup or fix it "
        "by hand: removing it makes this voter forget its vote, which may let it vote twice in "
        "one epoch"
    )


def read_quorum_state(data_dir: str | pathlib.Path) -> QuorumState | None:
    """The persisted state; None when the file does not exist."""
    path = quorum_state_path(data_dir)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _unusable(path, f"cannot be read: {err.strerror}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise _unusable(path, f"not JSON: {err}") from None
    if not isinstance(doc, dict):
        raise _unusable(path, "not a JSON object")

    def number(key: str, minimum: int, default: int | None = None) -> int:
        value = doc.get(key, default)
        if value is None:
            raise _unusable(path, f"no {key}")
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise _unusable(path, f"{key} is {value!r}, not an integer >= {minimum}")
        return value

    version = number("data_version", 0)
    if version != DATA_VERSION:
        raise _unusable(path, f"data_version {version} is not {DATA_VERSION}")
    return QuorumState(
        epoch=number("leaderEpoch", 0),
        voted_for=number("votedId", -1),
        leader_id=number("leaderId", -1),
        catching_up_to=number("catchingUpTo", CATCH_UP_UNKNOWN, CAUGHT_UP),
    )


def write_quorum_state(data_dir: str | pathlib.Path, state: QuorumState) -> None:
    """Persist `state` atomically and durably."""
    doc = {
        "leaderId": state.leader_id,
        "leaderEpoch": state.epoch,
        "votedId": state.voted_for,
        "appliedOffset": 0,
        "currentVoters": None,
        "data_version": DATA_VERSION,
        "catchingUpTo": state.catching_up_to,
    }
    write_atomically(quorum_state_path(data_dir), (json.dumps(doc) + "\n").encode())


__all__ = [
    "FILE_NAME",
    "QuorumStateError",
    "quorum_state_path",
    "read_quorum_state",
    "write_quorum_state",
]
