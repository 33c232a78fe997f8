"""Forecast backtest (issue 39 item 5, a first cut): forecasts made at submission against actual starts.

A synthetic queue (no third-party trace): ``--nodes`` nodes of 4 GPUs, five tasks whose run times
are log-normal around their own medians, requests of 1 or 2 GPUs arriving as a Poisson stream at
``--load`` of the capacity, served by the simulator's :class:`~airflow_gpupool.sim.queue.QueueSim`
(the ledger's queue rule). When a request must wait, the forecast is made as the controller
makes it (:func:`~airflow_gpupool.forecast.replay.forecast_starts` over the running tasks and the
queue, durations from :class:`~airflow_gpupool.forecast.durations.DurationModel` fed with the
runs completed so far); at the end its p10 / p50 / p90 are compared with the actual start.
Printed as JSON: coverage of [p10, p90], the median width, p50's median absolute error of the
wait, and two baselines from the same run: *oracle* (the same replay given each running task's
true remaining time: what a forecast that ignores later arrivals can do at best) and *naive*
(position × mean run time / GPUs). Not yet: the Alibaba trace, the *declared* baseline, the
three-teams scenario, ``gpupool simulate --forecast``.

Usage::

    PYTHONPATH=. python benchmarks/forecast_backtest.py --seed 42 --nodes 6 --arrivals 300
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics

import numpy as np

from airflow_gpupool.forecast.durations import DurationModel, RemainingTime, TaskKey
from airflow_gpupool.forecast.replay import Running, Waiting, forecast_starts
from airflow_gpupool.ledger import FinishedRun
from airflow_gpupool.placement.policy import get_policy
from airflow_gpupool.placement.snapshot import GpuState, NodeState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.sim.queue import MAX_OVERTAKES, QueueSim
from airflow_gpupool.sim.replay import quick

TASKS = ((600.0, 1), (1200.0, 1), (1800.0, 2), (3600.0, 1), (900.0, 2))  # (median seconds, GPUs)


def _fixed(seconds: float) -> RemainingTime:
    return RemainingTime("oracle", (max(seconds, 1.0),), 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--arrivals", type=int, default=300)
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument("--samples", type=int, default=32)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    empty = [
        NodeState(f"n{i}", 64000, 262144, tuple(GpuState(g, "A100", 81920, 1000, 81920) for g in range(4)))
        for i in range(args.nodes)
    ]
    gpus_total = 4 * args.nodes
    picks = rng.integers(len(TASKS), size=args.arrivals)
    runs = np.array([TASKS[int(p)][0] * float(rng.lognormal(0.0, 0.4)) for p in picks])
    gpus = np.array([TASKS[int(p)][1] for p in picks])
    rate = args.load * gpus_total / float(np.mean(runs * gpus))
    times = np.cumsum(rng.exponential(1 / rate, args.arrivals))
    place = quick(get_policy("bestfit"))
    sim = QueueSim(list(empty), place, (), MAX_OVERTAKES)
    events = [(float(t), 1, k) for k, t in enumerate(times)]
    heapq.heapify(events)
    done: list[FinishedRun] = []
    made: dict[
        int, tuple[float, list[float], list[float], float]
    ] = {}  # k: (arrival, forecast, oracle, naive)
    mean_run = float(np.mean([m for m, _ in TASKS]))

    def key(k: int) -> TaskKey:
        return TaskKey("bench", f"task{int(picks[k])}", "team", "batch")

    while events:
        now, kind, k = heapq.heappop(events)
        if kind == 1:
            sim.arrive(k, GpuRequest(gpus=int(gpus[k])), now, 0)
        else:
            sim.depart(k)
            done.insert(0, FinishedRun("bench", f"task{int(picks[k])}", "team", "batch", float(runs[k])))
        for started in sim.serve(now):
            heapq.heappush(events, (now + float(runs[started]), 0, started))
        if kind == 1 and str(k) in sim.waiting:
            model = DurationModel.from_runs(done, prior_seconds=mean_run)
            order = sorted(sim.waiting.values(), key=lambda e: (-e.request.priority, e.seq))
            waiting = [Waiting(e.request_id, e.request, model.sampler(key(e.seq))) for e in order]
            oracle_waiting = [Waiting(e.request_id, e.request, _fixed(float(runs[e.seq]))) for e in order]
            running, oracle_running = [], []
            for j, (request, assignment, _) in sim.running.items():
                elapsed = now - sim.started_at[j]
                running.append(Running(str(j), request, assignment, model.sampler(key(j), elapsed)))
                oracle_running.append(Running(str(j), request, assignment, _fixed(float(runs[j]) - elapsed)))
            common = (now, sim.nodes, empty)
            mine = {
                f.reservation_id: f
                for f in forecast_starts(
                    *common, running, waiting, place, MAX_OVERTAKES, samples=args.samples
                )
            }[str(k)]
            best = {
                f.reservation_id: f
                for f in forecast_starts(
                    *common, oracle_running, oracle_waiting, place, MAX_OVERTAKES, samples=1
                )
            }[str(k)]
            position = [e.request_id for e in order].index(str(k)) + 1
            if mine.p50 is not None and best.p50 is not None:
                made[k] = (
                    now,
                    [mine.p10 or now, mine.p50, mine.p90 or float("inf")],
                    [best.p50],
                    now + position * mean_run / gpus_total,
                )
    waits, covered, widths, errors, oracle_errors, naive_errors = [], 0, [], [], [], []
    for k, (arrived, (p10, p50, p90), (oracle_p50,), naive) in made.items():
        if k not in sim.started_at:
            continue
        actual = sim.started_at[k]
        waits.append(actual - arrived)
        covered += p10 <= actual <= p90
        widths.append(p90 - p10)
        errors.append(abs(p50 - actual))
        oracle_errors.append(abs(oracle_p50 - actual))
        naive_errors.append(abs(naive - actual))
    n = len(errors)
    print(
        json.dumps(
            {
                "seed": args.seed,
                "nodes": args.nodes,
                "arrivals": args.arrivals,
                "samples": args.samples,
                "forecast": {
                    "requests": n,
                    "coverage_p10_p90": round(covered / n, 3) if n else None,
                    "width_median_s": round(statistics.median(widths), 1) if n else None,
                    "p50_abs_error_median_s": round(statistics.median(errors), 1) if n else None,
                    "wait_median_s": round(statistics.median(waits), 1) if n else None,
                    "baselines": {
                        "oracle": {
                            "p50_abs_error_median_s": round(statistics.median(oracle_errors), 1)
                            if n
                            else None
                        },
                        "naive": {
                            "p50_abs_error_median_s": round(statistics.median(naive_errors), 1) if n else None
                        },
                    },
                },
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
