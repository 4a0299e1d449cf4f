"""Seeded whole-cluster simulation of the brokers' replica engine and the controller core
(docs/design.md §2, §6, §8; the second test layer of §8).

Each seed runs a safety phase (drops, delays, reordering, crashes that lose unflushed tails,
paused brokers and session timeouts, broken heartbeat streams, leader moves through the real
ControllerCore, controller crashes and restarts from its journal, offline partitions with
unclean election disabled, acks=all producers, consumers, for most seeds replicas moving:
KIP-455 reassignments started and cancelled, brokers decommissioned, replicas rebuilt after a
long fence, and network partitions: zombie leaders whose clients still reach them, followers cut
from their leader, brokers cut from the controller, one broker split from the rest) with the §8
invariants checked after every event, then a liveness phase with every fault healed (every
decommission cancelled, every link healed) that must converge to completed reassignments, full
ISRs, preferred leaders and identical logs holding every acknowledged batch. Each seed draws its
own options (tests/sim/options.py: brokers, partitions, min.insync.replicas,
replica.lag.time.max.ms, network loss and delay, each fault's rate, some faults off, network
partitions), TigerBeetle style.

`MINIBROKER_SIM_SEEDS` sets the seed count (default 200, what `make test` runs: seeds 0-199
play every scenario the coverage test names; `make sim` runs 500, `make sim SEEDS=N` any number);
the seeds are spread over one worker process per core (`MINIBROKER_SIM_WORKERS` overrides; 1
runs them in this process) and checked in chunks of 100, each failing seed reported
with its one-line reproduction. `MINIBROKER_SIM_SEED` runs one seed, in this process.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator

import pytest
from replsim import SimOptions, Simulation
from seeds import SeedPool, SeedResult

SEEDS = int(os.environ.get("MINIBROKER_SIM_SEEDS", "200"))
ONE_SEED = os.environ.get("MINIBROKER_SIM_SEED")
WORKERS = int(os.environ.get("MINIBROKER_SIM_WORKERS", "0")) or None
SEED_LIST = [int(ONE_SEED)] if ONE_SEED else list(range(SEEDS))
CHUNK = 100
CHUNKS = [SEED_LIST[i : i + CHUNK] for i in range(0, len(SEED_LIST), CHUNK)]
RESULTS: dict[int, SeedResult] = {}  # every seed's result so far, for the coverage test


@pytest.fixture(scope="module")
def pool() -> Iterator[SeedPool]:
    seed_pool = SeedPool(SEED_LIST, 1 if ONE_SEED else WORKERS)
    try:
        yield seed_pool
    finally:
        seed_pool.close()


@pytest.mark.sim
@pytest.mark.parametrize("seeds", CHUNKS, ids=[f"seeds-{c[0]}-{c[-1]}" for c in CHUNKS])
def test_replication_invariants_hold(seeds: list[int], pool: SeedPool) -> None:
    results = pool.results(seeds)
    RESULTS.update((r.seed, r) for r in results)
    failures = [r.failure for r in results if r.failure is not None]
    if failures:
        shown = "\n\n".join(failures[:3])
        more = f"\n({len(failures) - 3} more failing seeds)" if len(failures) > 3 else ""
        failing = [r.seed for r in results if r.failure is not None]
        pytest.fail(f"failing seeds {failing}\n{shown}{more}", pytrace=False)


@pytest.mark.sim
def test_the_seeds_cover_every_partition_scenario() -> None:
    """Over many seeds the nemesis plays every partition scenario, cuts hold what they carry
    (running brokers are fenced by the session timeout across a cut controller link), zombie
    leaders take writes from their clients (and must not acknowledge them on their own), and
    isolated leaders move their HW over what their ISR held before the cut (checked in
    checker.py)."""
    if len(RESULTS) < 200:
        pytest.skip(f"coverage is asserted over 200 seeds or more ({len(RESULTS)} ran)")
    total: Counter[str] = Counter()
    for result in RESULTS.values():
        total.update(result.stats)
    for kind in ("zombie", "follower", "controller", "split"):
        assert total[f"partition_{kind}"] > 0, f"no {kind} partition in {len(RESULTS)} seeds"
    assert total["running_brokers_fenced_across_a_cut"] > 0
    assert total["appends_by_leader_cut_from_controller"] > 0
    assert total["hw_moves_by_isolated_leaders"] > 0


@pytest.mark.sim
def test_offline_partition_never_elects_the_live_out_of_sync_replica() -> None:
    """docs/protocol.md §17 with unclean.leader.election.enable=false: broker 3 leaves every ISR (it
    asks to be fenced) and is unfenced again at its next heartbeat; at the same moment brokers 1 and
    2, the whole ISR, stop past the session timeout. Every partition goes offline with broker 3
    up, unfenced and out of sync, and must stay offline until an ISR member returns; then the
    cluster converges with nothing acknowledged lost. The checker fails the run if any record
    elects a leader from outside the previous ISR (docs/protocol.md §17; Jepsen 2013's scenario)."""
    quiet = SimOptions(
        crash_rate=0.0,
        move_leader_rate=0.0,
        pause_rate=0.0,
        controller_crash_rate=0.0,
        offline_rate=0.0,
        shutdown_rate=0.0,
        stream_break_rate=0.0,
        drop_rate=0.0,
        scheduled_faults=False,
    )
    sim = Simulation(7, quiet)
    brokers = sim.brokers

    def fence_broker_3_and_stop_the_isr() -> None:
        brokers[3].send_heartbeat(want_fence=True)
        for broker_id in (1, 2):
            brokers[broker_id].paused_until_ms = sim.now_ms + 1_500

    sim.at(1_500, fence_broker_3_and_stop_the_isr)
    sim.run()
    assert sim.stats["offline_with_live_out_of_sync_replica"] >= 1
    assert len(sim.acked) > 100
