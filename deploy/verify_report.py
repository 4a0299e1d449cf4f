"""`minibroker verify`'s report: the table per fault kind, the totals, the violations, and a
terminal chart of throughput with the faults marked. Pure: text from figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MARKS = {"kill": "K", "pause": "P", "partition": "N", "controller": "C", "disk": "D"}
_EIGHTHS = " ▁▂▃▄▅▆▇█"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def fault_table(table: Mapping[str, Mapping[str, Any]], kinds: Sequence[str]) -> list[str]:
    lines = [
        f"  {'fault':<12} {'count':>5} {'recovered':>9} {'median':>8} {'p95':>8} {'max':>8}",
    ]
    for kind in kinds:
        row = table.get(kind)
        if row is None:
            lines.append(f"  {kind:<12} {0:>5} {'-':>9} {'-':>8} {'-':>8} {'-':>8}")
            continue
        lines.append(
            f"  {kind:<12} {row['count']:>5} {row['recovered']:>9} {_s(row['median_s']):>8} "
            f"{_s(row['p95_s']):>8} {_s(row['max_s']):>8}"
        )
    return lines


def chart(
    rates: Sequence[float],
    span_s: float,
    faults: Sequence[tuple[float, float, str]],
    height: int = 6,
) -> list[str]:
    """A bar chart of `rates` (acks/s per column), `height` rows, and under it one row marking
    each fault: its kind's letter where it started, `─` while it lasted. `faults` are
    (start, end, kind) in seconds since the chart's start."""
    width = len(rates)
    if width == 0:
        return []
    top = max(rates) or 1.0
    label_w = max(len(f"{top:.0f}"), 1)
    lines = []
    for row in range(height, 0, -1):
        cells = []
        for rate in rates:
            eighths = round(rate / top * height * 8) - (row - 1) * 8
            cells.append(_EIGHTHS[max(0, min(8, eighths))])
        label = f"{top:.0f}" if row == height else ("0" if row == 1 else "")
        lines.append(f"  {label:>{label_w}} │{''.join(cells)}")
    marks = [" "] * width
    column_s = span_s / width if span_s > 0 else 1.0
    for start, end, kind in faults:
        first = min(width - 1, max(0, int(start / column_s)))
        last = min(width - 1, max(first, int(end / column_s)))
        for col in range(first + 1, last + 1):
            if marks[col] == " ":
                marks[col] = "─"
        letter = MARKS.get(kind, "?")
        marks[first] = letter if marks[first] in (" ", "─", letter) else "*"
    lines.append(f"  {'':>{label_w}} └{''.join(marks)}")
    end_label = f"{span_s:.0f}s"
    lines.append(f"  {'':>{label_w}}  0s{end_label:>{max(width - 2, len(end_label))}}")
    used = sorted({kind for _, _, kind in faults}, key=list(MARKS).index)
    legend = "  ".join(f"{MARKS[k]} {k}" for k in used if k in MARKS)
    lines.append(f"  {'':>{label_w}}  acks/s over time; {legend}; ─ fault held; * several")
    return lines


def render(result: Mapping[str, Any]) -> str:
    """The human report of a run (`result` as `--json` prints it)."""
    t = result["totals"]
    lines = [
        f"verify: {result['rounds']} fault round(s) in {result['elapsed_s']:.0f}s, "
        f"seed {result['seed']}",
        "",
        *fault_table(result["faults"], result["fault_kinds"]),
        "",
        f"  writes acknowledged {t['acked']}, failed {t['failed']} "
        f"({t['indeterminate_stored']} of them stored anyway), read by consumers {t['read']}, "
        f"in the final logs {t['final_records']}, lost {t['lost']}, duplicated "
        f"{t['duplicated']}",
        "",
        *result.get("chart", []),
        "",
    ]
    violations = result["violations"]
    if violations:
        lines.append(f"VIOLATIONS ({sum(result['violation_counts'].values())}):")
        lines += [f"  {v}" for v in violations]
        lines.append(f"reproduce with: minibroker verify --seed {result['seed']} ...")
        lines.append(f"  ({result['command']})")
    else:
        lines.append("no violation: every invariant held")
    return "\n".join(lines)
