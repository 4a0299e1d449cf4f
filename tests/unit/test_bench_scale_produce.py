"""`bench scale`'s produce figures (pure): the ratios to the 3-partition rate and their cells."""

from __future__ import annotations

from minibroker.deploy import bench_scale


def test_produce_ratios_use_the_deadline_rate_of_a_run_past_it_and_none_without_a_rate() -> None:
    three = {"records_per_sec": 1000.0}
    assert bench_scale.produce_ratio({"records_per_sec": 250.0}, three) == 0.25
    late = {"timed_out": True, "records_per_sec": None, "records_per_sec_by_deadline": 50.0}
    assert bench_scale.produce_ratio(late, three) == 0.05
    assert bench_scale.produce_ratio({"skipped": True}, three) is None
    assert bench_scale.produce_ratio(three, {"skipped": True}) is None


def test_the_table_shows_round_robin_and_sticky_rates_and_both_ratios() -> None:
    def run(rate: float) -> dict[str, object]:
        return {"s": 1.0, "timed_out": False, "records_per_sec": rate}

    size = {
        "partitions": 3000,
        "create": {"s": 1.0, "timed_out": False},
        "produce": {
            "all": run(1234.0),
            "sticky": run(45678.0),
            "three": run(90000.0),
            "ratio": 0.014,
            "sticky_ratio": 0.508,
        },
    }
    row = bench_scale.table_row(size)
    assert row.count("|") == bench_scale.TABLE_HEADER.count("|"), (row, bench_scale.TABLE_HEADER)
    cells = [c.strip() for c in row.strip("|").split("|")]
    header = [c.strip() for c in bench_scale.TABLE_HEADER.strip("|").split("|")]
    by_name = dict(zip(header, cells, strict=True))
    assert by_name["produce all round-robin, rec/s"] == "1234"
    assert by_name["produce all keyless sticky, rec/s"] == "45678"
    assert by_name["produce 3, rec/s"] == "90000"
    assert by_name["all / 3"] == "0.01" and by_name["sticky / 3"] == "0.51"
