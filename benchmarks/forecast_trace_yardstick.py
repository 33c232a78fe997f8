"""Forecast yardstick on the Alibaba-trace queue: what knowing each task's run-time distribution gives p50.

The queue study (``gpupool simulate --mode queue --forecast``) draws each arrival from the trace's
pods, so a task (its QoS class and GPU milli, the backtest's key) runs for the duration of a pod of
that key picked at random: its true run-time distribution is those pods' durations. This runs the
same backtest with the forecast drawing from that distribution instead of the history of runs
ended so far (*declared* then takes its true mean too): a forecast that knows each distribution but
not the run each task will have. If its p50 error is still above half of *declared*'s, no duration
model reaches the issue's 0.5 bar on this queue. A yardstick, not a test: it reads the trace from
``GPUPOOL_TRACE_DIR``.

Usage::

    GPUPOOL_TRACE_DIR=/work/shared/traces PYTHONPATH=. .venv/bin/python \\
        benchmarks/forecast_trace_yardstick.py --seed 43
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

from airflow_gpupool.forecast.backtest import SAMPLES, Backtest
from airflow_gpupool.forecast.durations import DurationModel
from airflow_gpupool.sim.queue import MAX_DURATION_S, simulate_queue, usable_workload
from airflow_gpupool.sim.trace import load_nodes, load_pods


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--load", type=float, default=1.2)
    parser.add_argument("--queue-nodes", type=int, default=10)
    parser.add_argument("--arrivals", type=int, default=800)
    parser.add_argument("--samples", type=int, default=SAMPLES)
    args = parser.parse_args()
    nodes, pods = load_nodes(), load_pods()
    usable, durations = usable_workload(pods)
    by_task: dict[tuple[str, str], list[float]] = defaultdict(list)
    for pod, seconds in zip(usable, durations, strict=True):
        by_task[("sim", f"{pod.qos}:{pod.gpu_milli}")].append(float(seconds))
    out = {}
    for known in (False, True):
        backtest = Backtest(samples=args.samples)
        if known:
            backtest.known = DurationModel(float(durations.mean()), dict(by_task))
        simulate_queue(
            nodes,
            pods,
            "gpupool",
            load=args.load,
            seed=args.seed,
            sample_nodes=args.queue_nodes,
            arrivals=args.arrivals,
            warmup_s=MAX_DURATION_S,
            watch=backtest,
        )
        report = backtest.report()
        out["known_distributions" if known else "history"] = {
            "requests": report["requests"],
            "coverage_p10_p90": report["coverage_p10_p90"],
            "p50_abs_error_median_s": report["p50_abs_error_median_s"],
            "declared_p50_abs_error_median_s": report["baselines"]["declared"]["p50_abs_error_median_s"],
            "naive_p50_abs_error_median_s": report["baselines"]["naive"]["p50_abs_error_median_s"],
        }
    print(json.dumps({"seed": args.seed, **out}, indent=1))


if __name__ == "__main__":
    main()
