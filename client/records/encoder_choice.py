"""Which record encoder `BatchBuilder` uses: the compiled `_encoder` module, or the pure path.

Reads one environment variable, once, at import: `MINIBROKER_PURE_CODEC=1` forces the pure
Python path (for tests and comparisons); so does a build without the compiled module (a machine
without a C compiler). No other I/O. `COMPILED` says which is in use.
"""

from __future__ import annotations

import os
from typing import Any


class PureByteCount:
    """`_encoder.ByteCount` for the pure path: a count of bytes with `add` and `value`."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def add(self, delta: int) -> None:
        self.value += delta


RecordsBuilder: Any = None
ByteCount: Any = None
murmur2: Any = None
try:
    from minibroker.client.records import _encoder
except ImportError:  # built without a C compiler: the pure path is the fallback
    pass
else:
    RecordsBuilder, ByteCount, murmur2 = (
        _encoder.RecordsBuilder,
        _encoder.ByteCount,
        _encoder.murmur2,
    )

if os.environ.get("MINIBROKER_PURE_CODEC", "") not in ("", "0"):
    RecordsBuilder = None
if RecordsBuilder is None:
    ByteCount = PureByteCount
    murmur2 = None

COMPILED: bool = RecordsBuilder is not None
