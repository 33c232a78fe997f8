"""The backtest's forecasts at arrival and at each later change, on a queue whose starts are known exactly."""

from __future__ import annotations

import heapq

from airflow_gpupool.forecast.backtest import Backtest
from airflow_gpupool.ledger import FinishedRun
from airflow_gpupool.placement.policy import get_policy
from airflow_gpupool.placement.snapshot import GpuState, NodeState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.sim.queue import MAX_OVERTAKES, QueueSim, by_priority
from airflow_gpupool.sim.replay import quick

RUN_S = 600.0
ARRIVALS = (0.0, 10.0, 20.0, 30.0)


def _one_gpu_queue() -> Backtest:
    """One GPU, four 600 s tasks arriving 10 s apart, a history of exactly 600 s: every start is known."""
    node = NodeState("n1", 64000, 262144, (GpuState(0, "A100", 81920, 1000, 81920),))
    sim = QueueSim([node], quick(get_policy("bestfit")), (), MAX_OVERTAKES)
    backtest = Backtest(samples=4)
    backtest.start(mean_run_s=RUN_S, gpus=1, warm_s=0.0)
    backtest.done = [FinishedRun("sim", "fit", "team", "batch", RUN_S) for _ in range(5)]
    events = [(t, 1, k) for k, t in enumerate(ARRIVALS)]
    while events:
        now, kind, k = heapq.heappop(events)
        if kind == 1:
            backtest.label(k, "fit", "team", "batch")
            sim.arrive(k, GpuRequest(gpus=1), now, 0)
        else:
            sim.depart(k)
            backtest.ended(k, RUN_S)
        for started in sim.serve(now):
            heapq.heappush(events, (now + RUN_S, 0, started))
        backtest.waiting(now, sim, k, by_priority(sim), lambda j: RUN_S)
        # A second event in the same instant that changed nothing (a stale timer): no new forecast.
        backtest.waiting(now, sim, k, by_priority(sim), lambda j: RUN_S)
    return backtest


def test_each_change_forecasts_every_request_still_waiting_and_the_fixed_queue_is_exact() -> None:
    backtest = _one_gpu_queue()
    # Request k starts at k x 600 s. At 20 s and 30 s (arrivals) and at 600 s and 1,200 s (ends) the
    # requests that already waited are forecast again: 1; 1, 2; 2, 3; 3.
    assert [(k, at) for k, at, *_ in backtest.later] == [
        (1, 20.0),
        (1, 30.0),
        (2, 30.0),
        (2, 600.0),
        (3, 600.0),
        (3, 1200.0),
    ]
    # Fewer than MIN_SCORED starts: the calibration leaves the replay's own range.
    assert all(
        p10 == p50 == p90 == k * RUN_S and own == (p10, p50, p90)
        for k, _, p10, p50, p90, own in backtest.later
    )
    report = backtest.report()
    assert report["requests"] == 3 and report["coverage_p10_p90"] == 1.0
    assert report["at_changes"] == {
        "forecasts": 6,
        "requests": 3,
        "coverage_p10_p90": 1.0,
        "width_median_s": 0.0,
        "p50_abs_error_median_s": 0.0,
        "remaining_wait_median_s": 600.0,  # 580, 570; 1,170, 600; 1,200, 600
        "replay_only": {"coverage_p10_p90": 1.0, "width_median_s": 0.0, "p50_abs_error_median_s": 0.0},
    }
