"""Running many seeds of the replication simulation: one seed in this process, or a list of
seeds spread over worker processes (one per core), so `make test` runs hundreds in CI's time.

`run_seed` is what a worker runs: it returns the seed's outcome (a failure's text with the
one-line reproduction, the last trace lines, the seed's options and fault counts) rather than
raising, so a pool can report every failing seed. Workers are spawned, not forked (the test
process may hold gRPC threads from other tests), and import this module by name: conftest.py and
pyproject's pythonpath put tests/sim on sys.path, which spawn hands to the children.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context

from replsim import Simulation

REPRODUCE = (
    "MINIBROKER_SIM_SEED={seed} .venv/bin/python -m pytest tests/sim/test_replication_sim.py -q"
)


@dataclass
class SeedResult:
    seed: int
    failure: str | None  # None: the seed passed
    stats: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def run_seed(seed: int) -> SeedResult:
    """Run seed `seed`'s simulation (safety then liveness phase, every invariant checked) and
    the run's own sanity checks: writes were acknowledged (a few dozen at least: a seed dense
    with partitions and offline episodes acknowledges under a hundred) and the controller was
    restarted from its journal at least once (one restart is scheduled per seed)."""
    started = time.perf_counter()
    sim = Simulation(seed)
    try:
        sim.run()
        assert len(sim.acked) > 50, f"only {len(sim.acked)} batches acknowledged"
        assert sim.controller.restarts >= 1, "the controller never restarted"
        failure = None
    except AssertionError as err:
        trace = "\n".join(sim.trace[-40:])
        failure = (
            f"seed {seed} failed at {sim.now_ms} ms: {err}\n"
            f"reproduce: {REPRODUCE.format(seed=seed)}\n"
            f"options: {sim.opt.describe()}\n"
            f"faults: {dict(sim.stats)}\n"
            f"last events:\n{trace}"
        )
    return SeedResult(seed, failure, dict(sim.stats), time.perf_counter() - started)


class SeedPool:
    """Every seed submitted at once to `workers` processes (the cores by default); `results`
    waits for some of them. With one worker, seeds run here, when asked for."""

    def __init__(self, seeds: list[int], workers: int | None = None) -> None:
        self.workers = min(workers or os.cpu_count() or 1, len(seeds)) or 1
        self._futures: dict[int, Future[SeedResult]] = {}
        self._executor: ProcessPoolExecutor | None = None
        if self.workers > 1:
            self._executor = ProcessPoolExecutor(self.workers, mp_context=get_context("spawn"))
            self._futures = {seed: self._executor.submit(run_seed, seed) for seed in seeds}

    def results(self, seeds: list[int]) -> list[SeedResult]:
        if self._executor is None:
            return [run_seed(seed) for seed in seeds]
        return [self._futures[seed].result() for seed in seeds]

    def close(self) -> None:
        if self._executor is not None:
            for future in self._futures.values():
                future.cancel()
            self._executor.shutdown(wait=True, cancel_futures=True)
