"""Seeded whole-cluster simulation of the brokers' replica engine and the controller core
(docs/design.md §2, §6, §8; the second test layer of §8).

Each seed runs a safety phase (drops, delays, reordering, crashes that lose unflushed tails,
paused brokers and session timeouts, broken heartbeat streams, leader moves through the real
ControllerCore, controller crashes and restarts from its journal, offline partitions with
unclean election disabled, acks=all producers, consumers, and for most seeds replicas moving:
KIP-455 reassignments started and cancelled, brokers decommissioned, replicas rebuilt after a
long fence) with the §8 invariants checked after every event, then a liveness phase with every
fault healed (every decommission cancelled) that must converge to completed reassignments, full
ISRs, preferred leaders and identical logs holding every acknowledged batch. Each seed draws its own
options (tests/sim/options.py: brokers, partitions, min.insync.replicas, replica.lag.time.max.ms,
network loss and delay, each fault's rate, some faults off), TigerBeetle style.
`MINIBROKER_SIM_SEEDS` bounds the seed count (default 30; `make sim SEEDS=N`);
`MINIBROKER_SIM_SEED` runs one seed.
"""

from __future__ import annotations

import os

import pytest
from replsim import SimOptions, Simulation

SEEDS = int(os.environ.get("MINIBROKER_SIM_SEEDS", "30"))
ONE_SEED = os.environ.get("MINIBROKER_SIM_SEED")
SEED_LIST = [int(ONE_SEED)] if ONE_SEED else list(range(SEEDS))


@pytest.mark.sim
@pytest.mark.parametrize("seed", SEED_LIST)
def test_replication_invariants_hold(seed: int) -> None:
    sim = Simulation(seed)
    try:
        sim.run()
    except AssertionError as err:
        trace = "\n".join(sim.trace[-40:])
        pytest.fail(
            f"seed {seed} failed at {sim.now_ms} ms: {err}\n"
            f"reproduce: MINIBROKER_SIM_SEED={seed} .venv/bin/python -m pytest "
            f"tests/sim/test_replication_sim.py -q\noptions: {sim.opt.describe()}\n"
            f"faults: {dict(sim.stats)}\n"
            f"last events:\n{trace}",
            pytrace=False,
        )
    # The run must have exercised the protocol, not idled: writes were acknowledged, the
    # controller was restarted from its journal at least once (one restart is scheduled per
    # seed), and the liveness phase converged (checked inside run()).
    assert len(sim.acked) > 100
    assert sim.controller.restarts >= 1


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
