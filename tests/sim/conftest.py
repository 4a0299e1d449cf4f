"""tests/sim: the seeded replication simulation; its harness module sits beside the tests."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
