"""``gpupool bench ledger``, ``bench queue`` and ``bench operator``: the project's benchmarks."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

from airflow_gpupool.argtypes import integer, number
from airflow_gpupool.bench import operator_bench
from airflow_gpupool.cli.common import ledger_url, require_extra, url_arg

__all__ = [
    "cmd_bench_forecast",
    "cmd_bench_heartbeats",
    "cmd_bench_ledger",
    "cmd_bench_operator",
    "cmd_bench_queue",
    "cmd_bench_ui",
    "register",
]


def cmd_bench_ledger(args: argparse.Namespace) -> int:
    """Measure ledger throughput and check its invariants under contention."""
    from airflow_gpupool.bench.ledger_bench import run_ledger_bench

    url = ledger_url(args)
    result = run_ledger_bench(
        url,
        clients=args.clients,
        seconds=args.seconds,
        nodes=args.nodes,
        hold_ms=args.hold_ms,
        concurrent=not args.serialized,
    )
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:>20}: {value}")
    return 1 if result["violations"] else 0


def cmd_bench_operator(args: argparse.Namespace) -> int:
    """Measure the wall time GpuPodOperator adds over a plain KubernetesPodOperator (emulated cluster)."""
    require_extra("kmock", "testing", "gpupool bench operator")
    # The operators log (and print pod logs) to stdout; keep stdout for the result alone.
    with contextlib.redirect_stdout(sys.stderr):
        result = operator_bench.run_operator_bench(tasks=args.tasks, duration_s=args.pod_seconds)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:>16}: {value}")
    return 0


def cmd_bench_queue(args: argparse.Namespace) -> int:
    """Measure client cycles on a nearly full pool while many tasks wait, and how fast waiters wake."""
    from airflow_gpupool.bench.queue_bench import run_queue_bench

    result = run_queue_bench(
        ledger_url(args),
        waiters=args.waiters,
        clients=args.clients,
        seconds=args.seconds,
        nodes=args.nodes,
        min_wakeups=args.min_wakeups,
        baseline=args.baseline,
        phase_s=args.phase_s,
    )
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:>22}: {value}")
    return 1 if result["violations"] else 0


def cmd_bench_heartbeats(args: argparse.Namespace) -> int:
    """Measure the ledger's cost of node-agent heartbeats next to reserve/release load, and one agent's cost."""
    from airflow_gpupool.bench.heartbeat_bench import run_heartbeat_bench

    result = run_heartbeat_bench(
        ledger_url(args),
        nodes=args.nodes,
        interval=args.interval,
        seconds=args.seconds,
        clients=args.clients,
        writers=args.writers,
        rounds_count=args.rounds,
    )
    print(json.dumps(result, sort_keys=True) if args.json else json.dumps(result, indent=2, sort_keys=True))
    return 0


def cmd_bench_forecast(args: argparse.Namespace) -> int:
    """Measure the CPU one forecast pass costs (the controller's replays) on a full cluster with a long queue."""
    from airflow_gpupool.bench.forecast_bench import run_forecast_bench

    result = run_forecast_bench(args.nodes, args.waiting, samples=args.samples, seed=args.seed)
    if args.ledger_seconds > 0:
        from airflow_gpupool.bench.forecast_bench import ledger_cycles_beside_forecaster

        result.update(
            ledger_cycles_beside_forecaster(
                ledger_url(args),
                seconds=args.ledger_seconds,
                nodes=args.nodes,
                clients=args.ledger_clients,
                every_s=args.forecast_every,
                rounds=args.ledger_rounds,
            )
        )
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:>28}: {value}")
    return 0


def _register_forecast(bench: Any) -> None:
    # Issue 39 (the forecast's cost).
    p = bench.add_parser(
        "forecast",
        help="CPU of one forecast pass; with --ledger-seconds, the ledger's cycle rate with and without it",
        description=cmd_bench_forecast.__doc__,
    )
    url_arg(p)
    p.add_argument("--nodes", type=integer(1, 100_000), default=1000, help="nodes, filled by running grants")
    p.add_argument("--waiting", type=integer(0, 100_000), default=1000, help="requests waiting behind them")
    p.add_argument("--samples", type=integer(1, 4096), default=64, help="replays in the pass")
    p.add_argument("--seed", type=integer(0, 2**31 - 1), default=42, help="the state's seed")
    p.add_argument(
        "--ledger-seconds",
        type=number(0),
        default=0.0,
        help="also run the ledger bench this long without, then beside, the controller's forecast step "
        "(each phase; 0: skip)",
    )
    p.add_argument(
        "--ledger-rounds",
        type=integer(1, 100),
        default=1,
        help="without/with pairs, alternating in one run, so the ratio's spread shows (1-100)",
    )
    p.add_argument(
        "--forecast-every",
        type=number(0, above=True),
        default=30.0,
        help="the forecaster's interval in the with phases (default 30: forecast_interval_seconds' default)",
    )
    p.add_argument(
        "--ledger-clients",
        type=integer(1, 256),
        default=8,
        help="client processes of the ledger bench (1-256)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_bench_forecast)


def _register_heartbeats(bench: Any) -> None:
    # Issue 17 (the node agent).
    p = bench.add_parser(
        "heartbeats",
        help="heartbeat write cost beside reserve/release load",
        description=cmd_bench_heartbeats.__doc__,
    )
    url_arg(p)
    p.add_argument(
        "--nodes", type=integer(1, 100_000), default=1000, help="nodes sending heartbeats (1-100000)"
    )
    p.add_argument(
        "--interval",
        type=number(0, above=True),
        default=30,
        help="each node's heartbeat interval, seconds (> 0)",
    )
    p.add_argument(
        "--seconds", type=number(0, above=True), default=20, help="measured duration of each phase (> 0)"
    )
    p.add_argument(
        "--clients", type=integer(1, 256), default=4, help="reserve/release client processes (1-256)"
    )
    p.add_argument("--writers", type=integer(1, 64), default=2, help="heartbeat writer processes (1-64)")
    p.add_argument(
        "--rounds", type=integer(1, 100), default=3, help="rounds of the three phases, interleaved"
    )
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.set_defaults(func=cmd_bench_heartbeats)


def register(subparsers: Any) -> None:
    """Add ``gpupool bench ledger`` and ``bench operator``.

    :param subparsers: the top-level subparsers
    """
    bench = subparsers.add_parser("bench", help="benchmarks").add_subparsers(
        dest="bench_command", metavar="WHAT"
    )
    bench.required = True
    p = bench.add_parser(
        "ledger",
        help="ledger throughput and invariants under contention",
        description=cmd_bench_ledger.__doc__,
    )
    url_arg(p)
    p.add_argument("--clients", type=integer(1, 256), default=16, help="concurrent client processes (1-256)")
    p.add_argument("--seconds", type=number(0, above=True), default=10, help="measured duration")
    p.add_argument("--nodes", type=integer(1, 100_000), default=1000, help="nodes in the bench inventory")
    p.add_argument("--hold-ms", type=number(0), default=2.0, help="how long each grant is held")
    p.add_argument(
        "--serialized",
        action="store_true",
        help="on PostgreSQL, every write takes the exclusive lock (for comparison with the concurrent path)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_bench_ledger)
    p = bench.add_parser(
        "queue",
        help="client cycles while many tasks wait (triggers), wake-up latency, connections",
        description=cmd_bench_queue.__doc__,
    )
    url_arg(p)
    p.add_argument(
        "--waiters", type=integer(0, 100_000), default=1000, help="waiting requests, each with its trigger"
    )
    p.add_argument(
        "--clients", type=integer(1, 256), default=8, help="client processes doing reserve/release cycles"
    )
    p.add_argument("--seconds", type=number(0, above=True), default=10, help="measured duration (> 0)")
    p.add_argument(
        "--nodes", type=integer(1, 10_000), default=32, help="nodes of 8 GPUs in the bench inventory"
    )
    p.add_argument(
        "--min-wakeups",
        type=integer(0, 100_000),
        default=0,
        help="after the measured window, keep freeing nodes (clients stopped) until this many waiters "
        "were woken, at most 120 s more; wakeup_wait_s says how long (default: 0, wait 1 s)",
    )
    p.add_argument(
        "--baseline",
        action="store_true",
        help="interleave a run without waiters on a second ledger, in phases of --phase-s, and report "
        "baseline_cycles_per_s and ratio: both runs see the machine's load alike (--seconds each)",
    )
    p.add_argument(
        "--phase-s", type=number(0, above=True), default=1.0, help="seconds per phase with --baseline (> 0)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_bench_queue)
    p = bench.add_parser(
        "operator",
        help="GpuPodOperator wall time over a plain KubernetesPodOperator (needs airflow-gpupool[testing])",
        description=operator_bench.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tasks", type=integer(1, 1000), default=10, help="pairs of tasks to run")
    p.add_argument("--pod-seconds", type=number(0), default=0.5, help="how long each emulated pod runs")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_bench_operator)
    _register_heartbeats(bench)
    _register_forecast(bench)
    _register_ui(bench)


def cmd_bench_ui(args: argparse.Namespace) -> int:
    """Measure the GPU pool page's refresh (size, time) on a big cluster against the ungrouped page."""
    from airflow_gpupool.bench.ui_bench import run_ui_bench

    def make_app(ledger: Any) -> Any:
        from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser
        from airflow.api_fastapi.core_api.security import get_user

        from airflow_gpupool.plugins.app import create_app

        app = create_app(lambda: ledger)
        # Login is Airflow's; the bench measures the page behind it.
        app.dependency_overrides[get_user] = lambda: SimpleAuthManagerUser(username="bench", role="viewer")
        return app

    with contextlib.redirect_stdout(sys.stderr):
        result = run_ui_bench(
            make_app, nodes=args.nodes, grants=args.grants, waiting=args.waiting, requests=args.requests
        )
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in result.items():
            print(f"{key:>14}: {value}")
    return 0


def _register_ui(bench: Any) -> None:
    p = bench.add_parser(
        "ui",
        help="the GPU pool page's size and time per refresh on a big cluster, against the ungrouped page",
        description=cmd_bench_ui.__doc__,
    )
    p.add_argument("--nodes", type=integer(1, 100_000), default=1000, help="nodes (1,000: 7,200 GPUs)")
    p.add_argument("--grants", type=integer(0, 100_000), default=2000, help="live grants")
    p.add_argument("--waiting", type=integer(0, 100_000), default=50, help="waiting requests")
    p.add_argument("--requests", type=integer(1, 1000), default=20, help="requests measured per case")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_bench_ui)
