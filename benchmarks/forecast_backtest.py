"""Forecast backtest on a synthetic queue (issue 39 item 5): a thin wrapper.

The logic is :func:`airflow_gpupool.forecast.backtest.synthetic_backtest` (its docstring and
:class:`~airflow_gpupool.forecast.backtest.Backtest`'s say what is measured); on the Alibaba
trace and the three-teams scenario, ``gpupool simulate --mode queue --forecast``.

Usage::

    PYTHONPATH=. python benchmarks/forecast_backtest.py --seed 42 --nodes 6 --arrivals 300
"""

from __future__ import annotations

import argparse
import json

from airflow_gpupool.forecast.backtest import SAMPLES, synthetic_backtest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--arrivals", type=int, default=300)
    parser.add_argument("--load", type=float, default=0.9)
    parser.add_argument("--samples", type=int, default=SAMPLES)
    parser.add_argument(
        "--warm-history",
        type=int,
        default=0,
        help="runs per task in the history before the first arrival, drawn from the true distribution "
        "(a separate seed: the queue is the same); 0: the history holds only the runs ended so far",
    )
    parser.add_argument(
        "--known-distributions",
        action="store_true",
        help="the forecast draws from each task's true run-time distribution instead of the history "
        "(a yardstick: the best p50 a forecast that knows the distributions but not the runs can give)",
    )
    args = parser.parse_args()
    out = synthetic_backtest(
        seed=args.seed,
        nodes=args.nodes,
        arrivals=args.arrivals,
        load=args.load,
        samples=args.samples,
        warm_history=args.warm_history,
        known_distributions=args.known_distributions,
    )
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
