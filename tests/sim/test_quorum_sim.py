"""Seeded simulation of the controller quorum: real QuorumCores over in-memory logs, a lossy
network, partitions, pauses, restarts and graceful shutdowns (tests/sim/quorum_sim.py), with
Raft's safety properties checked after every event and a liveness phase that must converge.

Seeds: `MINIBROKER_QUORUM_SIM_SEEDS`, else `MINIBROKER_SIM_SEEDS` (`make sim SEEDS=2000`),
else 300 (CI); `MINIBROKER_QUORUM_SIM_SEED=N` runs one seed. A failure prints its seed, its
options and the one command that reproduces it.

Mutation testing: `MINIBROKER_QUORUM_CORE=/tmp/mutant/core.py` runs the same seeds against a
copy of controller/quorum/core.py (the checks must fail for a broken rule).
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
from quorum_sim import QuorumSim

SEEDS = int(
    os.environ.get("MINIBROKER_QUORUM_SIM_SEEDS") or os.environ.get("MINIBROKER_SIM_SEEDS") or 300
)
ONE_SEED = os.environ.get("MINIBROKER_QUORUM_SIM_SEED")
SEED_LIST = [int(ONE_SEED)] if ONE_SEED else list(range(SEEDS))


def _run(seed: int) -> QuorumSim:
    sim = QuorumSim(seed)
    try:
        sim.run()
    except AssertionError as err:
        trace = "\n".join(sim.trace[-40:])
        core = os.environ.get("MINIBROKER_QUORUM_CORE")
        prefix = f"MINIBROKER_QUORUM_CORE={core} " if core else ""
        pytest.fail(
            f"seed {seed} failed at {sim.now_ms} ms: {err}\n"
            f"reproduce: {prefix}MINIBROKER_QUORUM_SIM_SEED={seed} .venv/bin/python -m pytest "
            f"tests/sim/test_quorum_sim.py -q -k invariants\n"
            f"options: {sim.opt.describe()}\n"
            f"stats: {dict(sim.stats)}\n"
            f"last events:\n{trace}",
            pytrace=False,
        )
    return sim


@pytest.mark.sim
@pytest.mark.parametrize("seed", SEED_LIST)
def test_quorum_invariants_hold(seed: int) -> None:
    sim = _run(seed)
    # The run did something: a leader committed its LeaderChange, values were acknowledged.
    assert sim.stats["role_leader"] >= 1
    assert len(sim.acked) >= 1


@pytest.mark.sim
def test_the_faults_and_paths_are_exercised() -> None:
    """Over 60 seeds every fault and every shell path happens: the checks are not vacuous."""
    total: Counter[str] = Counter()
    voters: Counter[int] = Counter()
    for seed in range(60):
        sim = _run(seed)
        total.update(sim.stats)
        voters[sim.opt.voters] += 1
    assert set(voters) == {1, 3, 5}
    for key in (
        "pauses",
        "restarts",
        "shutdowns",
        "shutdowns_of_leader",
        "partition_split",
        "partition_leader_isolated",
        "partition_link_cut",
        "dropped",
        "duplicated",
        "snapshots_taken",
        "snapshot_installed",
        "fetch_diverging",
        "truncations",
        "fetch_snapshot",
        "fetch_error",
        "role_resigned",
        "quorum_election_won",
        "end_epoch_sent",
        "acked",
    ):
        assert total[key] > 0, f"no {key} in 60 seeds: {dict(total)}"
