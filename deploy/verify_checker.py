"""`minibroker verify`'s checker: what a run's history must satisfy (docs/design.md §8).

Pure: no I/O, no clock. The runner (`minibroker.deploy.verify`) records a `History` (every
write the producers sent and how it ended, every record the live consumers were given, the
final contents of every partition read after the run, a digest of each replica's log up to the
high watermark, the ISR as the controller committed it, the faults) and `check` reports every
violation of:

- durability: every acknowledged write is in the final log, at the offset it was acknowledged
  with (`lost`, `moved`), and no two acknowledgements name the same offset (`acked_twice`);
- idempotence: no value is stored twice (`duplicate`: the final log; a consumer given one value
  at two offsets is one too);
- contiguity: the final log's offsets are contiguous from its first one (`gap`); each consumer's
  offsets of a partition are contiguous, ascending and never repeated (`read_order`);
- visibility: no consumer is given a record at or above the high watermark it was told
  (`read_above_hw`), nor a record that is not in the final log at that offset (`read_lost`:
  the only way to see a record that is later truncated away is to read above the HW);
- log matching: every replica holds the same bytes up to the high watermark
  (`replica_divergence`);
- min ISR: no acks=all write is acknowledged while the ISR the controller committed had fewer
  than min.insync.replicas members for the whole time from its send to its ack
  (`ack_under_min_isr`). The committed ISR lags the leader's own view by the time an
  AlterPartition or a metadata update takes; `isr_grace_s` after the ack covers it.

`recovery` times each fault: from its start to the first acknowledgement of a write sent after
it to a partition it affected (Kafka's "time to the next successful write").
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# A partition as "topic-partition" text: histories are JSON-friendly.
Partition = str

VIOLATION_KINDS = (
    "lost",
    "moved",
    "acked_twice",
    "duplicate",
    "gap",
    "read_order",
    "read_above_hw",
    "read_lost",
    "replica_divergence",
    "ack_under_min_isr",
)


@dataclass(frozen=True, slots=True)
class Write:
    """One record a producer sent. `acked` (wall seconds) and `offset` when it was
    acknowledged; `error` when it failed (it may still be in the log: indeterminate)."""

    value: str
    partition: Partition
    sent: float
    acked: float | None = None
    offset: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Read:
    """One record a live consumer was given. `hw` is the highest high watermark the consumer had
    been told for the partition when it returned the record (-1: none yet); `restart` marks the
    first record after the consumer (re)positioned itself, where contiguity starts over."""

    consumer: str
    partition: Partition
    offset: int
    value: str
    at: float
    hw: int = -1
    restart: bool = False


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault the nemesis caused: `started`/`ended` in wall seconds; `partitions` it affected
    (empty: every partition)."""

    kind: str
    label: str
    started: float
    ended: float
    partitions: tuple[Partition, ...] = ()


@dataclass(slots=True)
class History:
    writes: list[Write] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    # After the run: every partition's records from its log start up to its high watermark.
    final: dict[Partition, list[tuple[int, str]]] = field(default_factory=dict)
    final_hw: dict[Partition, int] = field(default_factory=dict)
    # After the run: per partition, per broker id, a digest of its log's bytes below the HW.
    replicas: dict[Partition, dict[int, str]] = field(default_factory=dict)
    # The ISR the controller committed: per partition, (wall seconds, ISR) in time order; the
    # first entry is the ISR at creation.
    isr: dict[Partition, list[tuple[float, tuple[int, ...]]]] = field(default_factory=dict)
    min_insync: int = 1
    faults: list[Fault] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    partition: Partition
    offset: int | None
    detail: str

    def text(self) -> str:
        where = self.partition + ("" if self.offset is None else f"@{self.offset}")
        return f"{self.kind} {where}: {self.detail}"


@dataclass(slots=True)
class Verdict:
    violations: list[Violation]
    acked: int
    failed: int
    indeterminate_stored: int  # failed (not acknowledged) writes found in the log anyway
    read: int  # distinct records the live consumers were given
    final_records: int
    lost: int
    duplicated: int

    @property
    def ok(self) -> bool:
        return not self.violations

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for v in self.violations:
            out[v.kind] += 1
        return dict(out)


# Room the committed ISR is given to catch up with the leader's own view (see the docstring).
ISR_GRACE_S = 2.0
# At most this many violations of one kind are kept with their details (counts stay exact).
MAX_DETAILS_PER_KIND = 50


def check(history: History, isr_grace_s: float = ISR_GRACE_S) -> Verdict:
    found: list[Violation] = []
    found += _check_final_logs(history)
    lost, moved = _check_acks(history, found)
    found += _check_reads(history)
    found += _check_replicas(history)
    found += _check_min_isr(history, isr_grace_s)
    stored = {value for records in history.final.values() for _, value in records}
    acked = sum(1 for w in history.writes if w.acked is not None)
    failed = [w for w in history.writes if w.acked is None]
    duplicated = sum(1 for v in found if v.kind == "duplicate")
    return Verdict(
        violations=_bounded(found),
        acked=acked,
        failed=len(failed),
        indeterminate_stored=sum(1 for w in failed if w.value in stored),
        read=len({(r.partition, r.value) for r in history.reads}),
        final_records=sum(len(records) for records in history.final.values()),
        lost=lost + moved,
        duplicated=duplicated,
    )


def _bounded(found: list[Violation]) -> list[Violation]:
    kept: list[Violation] = []
    per_kind: dict[str, int] = defaultdict(int)
    for v in found:
        per_kind[v.kind] += 1
        if per_kind[v.kind] <= MAX_DETAILS_PER_KIND:
            kept.append(v)
    # Counts stay honest: one summary line per kind for what was left out.
    for kind, n in per_kind.items():
        if n > MAX_DETAILS_PER_KIND:
            kept.append(Violation(kind, "*", None, f"{n - MAX_DETAILS_PER_KIND} more not shown"))
    return kept


def _check_final_logs(history: History) -> list[Violation]:
    out: list[Violation] = []
    where: dict[str, tuple[Partition, int]] = {}
    for tp in sorted(history.final):
        records = history.final[tp]
        previous: int | None = None
        for offset, value in records:
            if previous is not None and offset != previous + 1:
                kind = "gap" if offset > previous + 1 else "read_order"
                out.append(
                    Violation(
                        kind, tp, offset, f"final log goes from offset {previous} to {offset}"
                    )
                )
            previous = offset
            if value in where:
                first_tp, first_offset = where[value]
                out.append(
                    Violation(
                        "duplicate",
                        tp,
                        offset,
                        f"value {value!r} stored twice: also at {first_tp}@{first_offset}",
                    )
                )
            else:
                where[value] = (tp, offset)
        hw = history.final_hw.get(tp)
        if hw is not None and records and records[-1][0] != hw - 1:
            out.append(
                Violation(
                    "gap",
                    tp,
                    records[-1][0],
                    f"final read ends at offset {records[-1][0]} but the high watermark is {hw}",
                )
            )
    return out


def _check_acks(history: History, out: list[Violation]) -> tuple[int, int]:
    at: dict[Partition, dict[int, str]] = {
        tp: dict(records) for tp, records in history.final.items()
    }
    where: dict[str, tuple[Partition, int]] = {}
    for tp, records in history.final.items():
        for offset, value in records:
            where.setdefault(value, (tp, offset))
    acked_at: dict[tuple[Partition, int], str] = {}
    lost = moved = 0
    for w in history.writes:
        if w.acked is None or w.offset is None:
            continue
        key = (w.partition, w.offset)
        if key in acked_at and acked_at[key] != w.value:
            out.append(
                Violation(
                    "acked_twice",
                    w.partition,
                    w.offset,
                    f"{w.value!r} and {acked_at[key]!r} were both acknowledged at this offset",
                )
            )
        acked_at.setdefault(key, w.value)
        stored = at.get(w.partition, {}).get(w.offset)
        if stored == w.value:
            continue
        found = where.get(w.value)
        if found is None:
            lost += 1
            out.append(
                Violation(
                    "lost",
                    w.partition,
                    w.offset,
                    f"acknowledged {w.value!r} is not in the final log"
                    + ("" if stored is None else f" (that offset holds {stored!r})"),
                )
            )
        else:
            moved += 1
            out.append(
                Violation(
                    "moved",
                    w.partition,
                    w.offset,
                    f"acknowledged {w.value!r} is at {found[0]}@{found[1]} instead",
                )
            )
    return lost, moved


def _check_reads(history: History) -> list[Violation]:
    out: list[Violation] = []
    at: dict[Partition, dict[int, str]] = {
        tp: dict(records) for tp, records in history.final.items()
    }
    last: dict[tuple[str, Partition], int] = {}
    seen: dict[tuple[str, str], int] = {}  # (consumer, value) -> offset
    for r in history.reads:
        key = (r.consumer, r.partition)
        previous = last.get(key)
        if previous is not None and not r.restart and r.offset != previous + 1:
            out.append(
                Violation(
                    "gap" if r.offset > previous + 1 else "read_order",
                    r.partition,
                    r.offset,
                    f"consumer {r.consumer} was given offset {r.offset} right after {previous}",
                )
            )
        last[key] = r.offset
        if r.hw >= 0 and r.offset >= r.hw:
            out.append(
                Violation(
                    "read_above_hw",
                    r.partition,
                    r.offset,
                    f"consumer {r.consumer} was given {r.value!r} while the highest high "
                    f"watermark it had been told was {r.hw}",
                )
            )
        final = at.get(r.partition)
        if final is not None and final.get(r.offset) != r.value:
            stored = final.get(r.offset)
            out.append(
                Violation(
                    "read_lost",
                    r.partition,
                    r.offset,
                    f"consumer {r.consumer} was given {r.value!r}, which the final log does not "
                    "hold there"
                    + (" (the offset is past its end)" if stored is None else f" ({stored!r})")
                    + ": it read above the high watermark, or a committed record was lost",
                )
            )
        first = seen.setdefault((r.consumer, r.value), r.offset)
        if first != r.offset:
            out.append(
                Violation(
                    "duplicate",
                    r.partition,
                    r.offset,
                    f"consumer {r.consumer} was given {r.value!r} at offsets {first} and "
                    f"{r.offset}",
                )
            )
    return out


def _check_replicas(history: History) -> list[Violation]:
    out: list[Violation] = []
    for tp in sorted(history.replicas):
        digests = history.replicas[tp]
        if len(set(digests.values())) > 1:
            described = ", ".join(f"broker {b}: {d[:12]}" for b, d in sorted(digests.items()))
            out.append(
                Violation(
                    "replica_divergence",
                    tp,
                    history.final_hw.get(tp),
                    f"replicas differ below the high watermark ({described})",
                )
            )
    return out


def isr_size_max(
    timeline: Sequence[tuple[float, tuple[int, ...]]], start: float, end: float
) -> int | None:
    """The largest committed ISR at any moment of [start, end]; None without a timeline."""
    if not timeline:
        return None
    best: int | None = None
    current: tuple[int, ...] | None = None
    for at, isr in timeline:
        if at <= start:
            current = isr
            continue
        if at > end:
            break
        if current is not None:
            best = max(best or 0, len(current))
        current = isr
    if current is not None:
        best = max(best or 0, len(current))
    return best


def _check_min_isr(history: History, grace_s: float) -> list[Violation]:
    out: list[Violation] = []
    for w in history.writes:
        if w.acked is None or w.offset is None:
            continue
        size = isr_size_max(history.isr.get(w.partition, []), w.sent, w.acked + grace_s)
        if size is not None and size < history.min_insync:
            out.append(
                Violation(
                    "ack_under_min_isr",
                    w.partition,
                    w.offset,
                    f"{w.value!r} was acknowledged while the committed ISR had at most {size} "
                    f"member(s) (min.insync.replicas {history.min_insync})",
                )
            )
    return out


# -- recovery and throughput ---------------------------------------------------------------------


def recovery(history: History) -> list[float | None]:
    """Per fault (in `history.faults` order): seconds from its start to the first
    acknowledgement of a write sent at or after it to a partition it affected; None when no
    such write was acknowledged."""
    acks = sorted(
        (w for w in history.writes if w.acked is not None and w.offset is not None),
        key=lambda w: w.acked or 0.0,
    )
    out: list[float | None] = []
    for fault in history.faults:
        wanted = set(fault.partitions)
        first = next(
            (
                w
                for w in acks
                if (w.acked or 0.0) >= fault.started
                and w.sent >= fault.started
                and (not wanted or w.partition in wanted)
            ),
            None,
        )
        out.append(None if first is None else (first.acked or 0.0) - fault.started)
    return out


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest rank: the smallest value with at least `p` (0..1) of them at or below it."""
    ordered = sorted(values)
    rank = max(1, math.ceil(p * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def recovery_table(history: History) -> dict[str, dict[str, Any]]:
    """Per fault kind: count, and recovery median / p95 / max in seconds (None: not seen)."""
    times = recovery(history)
    by_kind: dict[str, list[float | None]] = defaultdict(list)
    for fault, t in zip(history.faults, times, strict=True):
        by_kind[fault.kind].append(t)
    table: dict[str, dict[str, Any]] = {}
    for kind, values in by_kind.items():
        seen = [v for v in values if v is not None]
        table[kind] = {
            "count": len(values),
            "recovered": len(seen),
            "median_s": round(statistics.median(seen), 3) if seen else None,
            "p95_s": round(percentile(seen, 0.95), 3) if seen else None,
            "max_s": round(max(seen), 3) if seen else None,
        }
    return table


def throughput(writes: Iterable[Write], start: float, end: float, buckets: int) -> list[float]:
    """Acknowledged writes per second in `buckets` equal slices of [start, end]."""
    span = max(end - start, 1e-9)
    width = span / buckets
    counts = [0] * buckets
    for w in writes:
        if w.acked is None or w.offset is None or not start <= w.acked <= end:
            continue
        counts[min(buckets - 1, int((w.acked - start) / width))] += 1
    return [c / width for c in counts]
