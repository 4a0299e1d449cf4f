"""The process tuning every `minibroker` command starts with (client/common/runtime.py).

tune_malloc exists because a broker that builds and drops a 1 MiB message per request paid a
page fault per 4 KiB of every message; the test counts those faults in a fresh interpreter.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")

# Allocates and fills eight 1 MiB buffers (requests, responses, their copies), frees them, 100
# times, and prints the minor page faults taken.
_CHURN = """
import resource, sys
from minibroker.client.common.runtime import tune_malloc
if sys.argv[1] == "tuned":
    assert tune_malloc()
chunk = b"x" * (1024 * 1024)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(100):
    bufs = [bytearray(chunk) for _ in range(8)]
    del bufs
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout)


def test_tuned_malloc_reuses_freed_message_buffers_instead_of_faulting_them_in_again() -> None:
    untuned, tuned = _faults("default"), _faults("tuned")
    one_round = 8 * 256  # 4 KiB pages
    # Tuned, the first round's pages are reused by the other 99 (measured: 2,048 faults).
    assert tuned <= 2 * one_round, tuned
    # Untuned, glibc trims the freed buffers off the heap and faults them in again in later
    # rounds (measured: 18,216 faults here, 201,662 from a plain shell: it depends on the layout).
    assert untuned > 4 * tuned, (untuned, tuned)


def test_every_minibroker_command_is_tuned() -> None:
    # The entry point of the CLI and of every broker/controller process tunes before it parses.
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import unittest.mock as m, minibroker.deploy.cli as c\n"
            "with m.patch.object(c, 'tune_process') as t:\n"
            "    try: c.main(['--help'])\n"
            "    except SystemExit: pass\n"
            "    print(t.call_count)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == "1"


# Lowers this fresh interpreter's open-file limits (soft 1024, as many systems give processes,
# hard as given), runs the code under test, and prints the limits it ends with.
_NOFILE = """
import resource, sys
soft, hard = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
exec(sys.argv[3])
print(*resource.getrlimit(resource.RLIMIT_NOFILE))
"""


def _limits_after(code: str, soft: int, hard: int) -> tuple[int, int]:
    out = subprocess.run(
        [sys.executable, "-c", _NOFILE, str(soft), str(hard), code],
        capture_output=True,
        text=True,
        check=True,
    )
    after_soft, after_hard = out.stdout.split()[-2:]
    return int(after_soft), int(after_hard)


def _hard_limit() -> int:
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return 1 << 20 if hard == resource.RLIM_INFINITY else hard


@pytest.mark.skipif(_hard_limit() < 4096, reason="needs a hard open-file limit of 4096")
def test_the_open_file_limit_is_raised_to_the_hard_limit() -> None:
    # Kafka's JVM does the same (-XX:+MaxFDLimit): a broker at the default partition and
    # connection limits holds about 2,100 files, more than a soft limit of 1024 allows.
    raise_it = (
        "from minibroker.client.common.runtime import raise_open_file_limit\n"
        "limit = raise_open_file_limit()\n"
        "assert (limit.was, limit.soft, limit.hard) == (1024, 4096, 4096), limit"
    )
    assert _limits_after(raise_it, 1024, 4096) == (4096, 4096)
    # Never lowered, and the hard limit is never touched.
    assert _limits_after(raise_it.replace("(1024,", "(4096,"), 4096, 4096) == (4096, 4096)


@pytest.mark.skipif(_hard_limit() < 4096, reason="needs a hard open-file limit of 4096")
def test_every_minibroker_process_starts_with_the_raised_open_file_limit() -> None:
    # The one entry point of the CLI, the brokers and the controller.
    start = (
        "import minibroker.deploy.cli as c\n"
        "try: c.main(['--help'])\n"
        "except SystemExit: pass\n"
        "from minibroker.client.common.runtime import open_file_limit\n"
        "assert open_file_limit().was == 1024, open_file_limit()"
    )
    assert _limits_after(start, 1024, 4096) == (4096, 4096)
