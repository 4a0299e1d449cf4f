"""Session-wide safety net: no process a test started outlives the test session.

Every multi-process test already stops what it starts, by PID, in its own teardown. This catches
what a broken teardown would leave behind: at the end of the session, any process whose command
line names a path under this session's pytest temp dir (every broker and controller data dir a
test creates lives there) is killed.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
from collections.abc import Iterator

import pytest


def _processes_under(root: str) -> list[int]:
    pids = []
    marker = root.encode()
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(entry.name))
    return pids


@pytest.fixture(scope="session", autouse=True)
def _no_process_outlives_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    root = str(tmp_path_factory.getbasetemp())
    yield
    for pid in _processes_under(root):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
