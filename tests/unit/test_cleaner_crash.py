"""Crash tests of the cleaner's swap (issue 21): a child process cleans a real log on disk and
SIGKILLs itself at one step of the round (tests/unit/cleaner_support.py); the test then loads
the log with the real loader, which completes or undoes the swap (segment_swap.py), and checks
that nothing was lost (each key's latest value, tombstones included, as before the round), no
batch is there twice, offsets strictly increase, the log is whole (same LEO, a second load
changes nothing) and it can be cleaned again.
"""

from __future__ import annotations

import itertools
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from minibroker.broker.cleaner.cleaner import (
    STEP_OLD_DELETED,
    STEP_OLD_SEGMENT_DELETED,
    STEP_SWAP_COMPLETED,
    STEP_SWAP_LOG_COMPLETED,
    STEP_SWAP_LOG_RENAMED,
    STEP_SWAP_RENAMED,
    STEPS,
)
from minibroker.broker.storage.log import PartitionLog
from tests.unit.cleaner_support import (
    CRASH_CONFIG,
    ReadRecord,
    build_crash_log,
    clean,
    latest,
    open_log,
    read_all,
    write,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHILD_DEADLINE_S = 120


def run_child(directory: pathlib.Path, step: str, occurrence: int, checkpoint: int | None) -> int:
    """Run the cleaning child; returns its exit status (-SIGKILL when it killed itself)."""
    args = [sys.executable, "-m", "tests.unit.cleaner_support", str(directory), step]
    args.append(str(occurrence))
    if checkpoint is not None:
        args.append(str(checkpoint))
    proc = subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        _, stderr = proc.communicate(timeout=CHILD_DEADLINE_S)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"child exited {proc.returncode}: {stderr}"
    return proc.returncode


def check_whole(
    log: PartitionLog, before: list[ReadRecord], written: dict[int, tuple[bytes, bytes | None]]
) -> list[ReadRecord]:
    after = read_all(log)  # asserts batch order
    assert latest(after) == latest(before), "a key's latest value changed"
    offsets = [r.offset for r in after]
    assert offsets == sorted(set(offsets)), "an offset twice or out of order"
    for r in after:
        assert written[r.offset] == (r.key, r.value), f"offset {r.offset} is not what was written"
    segments = log.segments
    for earlier, later in itertools.pairwise(segments):
        assert earlier.next_offset <= later.base_offset, "segments overlap"
    names = os.listdir(log.directory)
    assert not [n for n in names if n.endswith((".cleaned", ".swap"))], names
    return after


def crash_and_reload(
    directory: pathlib.Path, step: str, occurrence: int, checkpoint: int | None = None
) -> None:
    log = open_log(directory, CRASH_CONFIG)
    before = read_all(log)
    written = {r.offset: (r.key, r.value) for r in before}
    leo = log.leo
    log.close()

    run_child(directory, step, occurrence, checkpoint)

    reloaded = open_log(directory, CRASH_CONFIG)
    assert reloaded.leo == leo
    after = check_whole(reloaded, before, written)
    reloaded.close()
    again = open_log(directory, CRASH_CONFIG)  # a second load finds nothing to do
    assert read_all(again) == after and again.leo == leo
    clean(again, 6_000)  # and the log cleans again
    check_whole(again, before, written)
    again.close()


CASES = [(step, 1) for step in STEPS] + [
    (STEP_OLD_SEGMENT_DELETED, 2),  # the second segment of a merged group
    (STEP_SWAP_COMPLETED, 2),  # the second group: the first one is in
]


@pytest.mark.parametrize(("step", "occurrence"), CASES)
def test_sigkill_at_each_step_of_a_round(
    tmp_path: pathlib.Path, step: str, occurrence: int
) -> None:
    directory = tmp_path / "changes-0"
    build_crash_log(directory).close()
    crash_and_reload(directory, step, occurrence)


@pytest.mark.parametrize(
    "step",
    [
        STEP_SWAP_LOG_RENAMED,
        STEP_SWAP_RENAMED,
        STEP_OLD_SEGMENT_DELETED,
        STEP_OLD_DELETED,
        STEP_SWAP_LOG_COMPLETED,
    ],
)
def test_sigkill_in_a_second_round_over_a_log_with_gaps(tmp_path: pathlib.Path, step: str) -> None:
    directory = tmp_path / "changes-0"
    log = build_crash_log(directory)
    checkpoint = clean(log, 5_000).end_offset
    for i in range(9):
        write(log, [(b"k%d" % (i % 4), b"second-%d" % i), (b"n%d" % i, None)])
        if i % 3 == 2:
            log.roll(now_ms=1_000)
    assert log.may_have_gaps
    log.close()
    crash_and_reload(directory, step, 1, checkpoint)
