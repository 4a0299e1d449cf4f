"""free_port's MINIBROKER_PORT_SLICE: each of make test's concurrent pytest processes picks
ports from its own part of the range, so no two of them ever pick the same port."""

from __future__ import annotations

import itertools

import pytest

from minibroker.deploy import cluster as launcher


def test_the_slices_split_the_range_without_overlap() -> None:
    parts = [launcher.port_slice(10_000, 32_768, f"{i}/3") for i in range(3)]
    assert parts[0][0] == 10_000
    for (_, end), (start, _) in itertools.pairwise(parts):
        assert end == start  # adjacent, no port in two slices
    assert all(end - start == (32_768 - 10_000) // 3 for start, end in parts)


def test_no_slice_is_the_whole_range() -> None:
    assert launcher.port_slice(10_000, 32_768, "") == (10_000, 32_768)


@pytest.mark.parametrize("spec", ["3/3", "-1/3", "0/0", "a/b", "1"])
def test_a_bad_slice_is_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="MINIBROKER_PORT_SLICE"):
        launcher.port_slice(10_000, 32_768, spec)


def test_free_port_keeps_to_its_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINIBROKER_PORT_SLICE", "2/3")
    low, _ = launcher._ephemeral_port_range()
    start, end = launcher.port_slice(launcher._LOWEST_FREE_PORT, low, "2/3")
    for _ in range(20):
        assert start <= launcher.free_port() < end
