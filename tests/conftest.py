"""Session-wide safety net: no process a test started outlives the test session.

Every multi-process test already stops what it starts, by PID, in its own teardown. This catches
what a broken teardown would leave behind: at the end of the session, any process whose command
line names a path under this session's pytest temp dir (every broker and controller data dir a
test creates lives there) is killed. Matching is on `<basetemp>/` so another session's dir that
merely shares the prefix (pytest-1 vs pytest-12, or --basetemp=/tmp/run-1 vs /tmp/run-10) is left
alone, and pytest's own ancestors are never killed: a shell or `make` that launched pytest names
the base temp dir on its command line when run with --basetemp.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
from collections.abc import Iterator

import pytest


def _ancestors() -> set[int]:
    """This process and every parent up to init, read from /proc/<pid>/stat."""
    pids: set[int] = set()
    pid = os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        # The command name in field 2 may contain spaces and parentheses: split after the last ")".
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return pids


def _processes_under(root: str) -> list[int]:
    pids = []
    marker = os.path.join(root, "").encode()
    spared = _ancestors()
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
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
