"""The ``gpupool simulate`` command: replay a trace through the placement (and queue) code."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_gpupool.cli.common import require_extra
from airflow_gpupool.exceptions import GpuPoolError, SimulationError
from airflow_gpupool.forecast.backtest import SAMPLES as FORECAST_SAMPLES
from airflow_gpupool.forecast.backtest import Backtest
from airflow_gpupool.placement.policy import DEFAULT_POLICY, policy_names
from airflow_gpupool.sim.plot import plot_queue, plot_replay
from airflow_gpupool.sim.replay import (
    REPORT_POINTS,
    ReplayResult,
    replay,
    scale_cluster,
    stderr_progress,
    trace_shapes,
)
from airflow_gpupool.sim.trace import TRACES, load_nodes, load_pods

#: Policies compared by ``--policy all``.
ALL_POLICIES = ("random", "dotprod", "clustering", "packing", "bestfit", "fgd", DEFAULT_POLICY)


def register(subparsers: Any) -> None:
    """Add the ``simulate`` subcommand to an argparse ``subparsers`` object."""
    parser = subparsers.add_parser(
        "simulate",
        help="replay a GPU workload trace through the placement policies",
        description=(
            "Replay a workload trace. Mode 'fgd' (default) follows the FGD paper's protocol: pods "
            "arrive until 130%% of the GPU capacity was asked for, nothing departs; it reports "
            "allocation and fragmentation by arrived %%. Mode 'queue' replays arrivals and "
            "departures over time through the ledger's queue rule and reports waits and allocation."
        ),
    )
    parser.add_argument("--mode", choices=("fgd", "queue"), default="fgd", help="protocol (default: fgd)")
    parser.add_argument(
        "--nodes",
        default="nodes",
        help="node list CSV (default: the Alibaba cluster under $GPUPOOL_TRACE_DIR)",
    )
    parser.add_argument(
        "--pods",
        default="default",
        help=f"pod list CSV or an Alibaba trace under $GPUPOOL_TRACE_DIR: {', '.join(TRACES)} (default: default)",
    )
    parser.add_argument(
        "--policy",
        action="append",
        help=f"placement policy, repeatable, or 'all' (default: {DEFAULT_POLICY}; "
        f"queue mode also accepts airflow-pool); one of {', '.join(policy_names())}",
    )
    parser.add_argument(
        "--seed", type=int, default=42, help="shuffle, arrival and tie-break seed (default: 42)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object per policy (one line each)"
    )
    parser.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw allocation vs arrived %% (fgd mode), or the wait distribution and allocation over time (queue mode)",
    )
    parser.add_argument(
        "--scale",
        type=int,
        default=1,
        help="fgd mode: replicate the cluster K times, the pods to match (default: 1)",
    )
    parser.add_argument("--load", type=float, default=1.0, help="queue mode: offered GPU load (default: 1.0)")
    parser.add_argument(
        "--queue-nodes",
        type=int,
        default=100,
        help="queue mode: nodes sampled from the cluster (default: 100; 0 = all)",
    )
    parser.add_argument(
        "--arrivals",
        type=int,
        default=0,
        help="queue mode: number of arrivals, the first 20%% of their span a warm-up "
        "(default: 0 = as many as --warmup-hours + --hours need)",
    )
    parser.add_argument(
        "--warmup-hours",
        type=float,
        default=24.0,
        help="queue mode: simulated hours before the measured window (default: 24, the longest duration)",
    )
    parser.add_argument(
        "--hours", type=float, default=48.0, help="queue mode: simulated hours measured (default: 48)"
    )
    parser.add_argument(
        "--max-overtakes",
        type=int,
        default=None,
        help="queue mode: overtakes a blocked request tolerates in the project's queue "
        "(default: the ledger's, 8; airflow-pool has no bound)",
    )
    parser.add_argument(
        "--teams",
        metavar="FILE",
        help="queue mode: a teams file (quotas, workloads, governance; see airflow_gpupool/sim/teams.py); "
        "compares the governance policies gpupool, kueue-like, no-preemption and airflow-pool",
    )
    parser.add_argument(
        "--scenario",
        choices=("three-teams", "pipelines"),
        help="queue mode: a built-in teams file (three-teams: three teams share 8 A100s) or pipelines file "
        "(pipelines: DAG runs of chained GPU steps beside the three-teams background)",
    )
    parser.add_argument(
        "--pipelines",
        metavar="FILE",
        help="queue mode: a pipelines file (DAG runs of chained GPU steps on schedules, beside a teams "
        "background; see airflow_gpupool/sim/pipelines/spec.py); compares the pipeline policies per-task, "
        "hand-on, hand-on+queue-ahead and hand-on+queue-ahead+run-admission under --policy (default gpupool)",
    )
    parser.add_argument(
        "--pipeline-policy",
        action="append",
        help="with --pipelines: a pipeline policy to run, repeatable (default: the four compared; "
        "also the yardsticks ideal-queue-ahead and ideal-reserve)",
    )
    parser.add_argument(
        "--teams-from",
        choices=("qos",),
        help="queue mode: teams drawn from the trace (qos: one team per QoS class, quotas by its GPU time)",
    )
    parser.add_argument(
        "--forecast",
        action="store_true",
        help="queue mode: backtest the start-time forecast: forecast each request that waits on arrival, "
        "score against its actual start and the declared/naive/oracle baselines, and again at each change "
        "of the queue or the grants while it waits (JSON key 'forecast', its 'at_changes'); "
        "with the trace, --teams, --scenario three-teams or --teams-from (not --pipelines); slow: use a "
        "small run (--queue-nodes, --arrivals, --hours)",
    )
    parser.add_argument(
        "--forecast-samples",
        type=int,
        default=None,
        help=f"with --forecast: replays per forecast (default: {FORECAST_SAMPLES})",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    parser.set_defaults(func=run)


def check_forecast_args(args: argparse.Namespace) -> None:
    """Check ``--forecast`` and ``--forecast-samples`` against the mode and the other options.

    :raises SimulationError: ``--forecast`` outside queue mode or with pipelines, or
        ``--forecast-samples`` without ``--forecast`` or below 1
    """
    forecast = getattr(args, "forecast", False)
    samples = getattr(args, "forecast_samples", None)
    if samples is not None and not forecast:
        raise SimulationError(
            "--forecast-samples", samples, "--forecast beside it (it sets the backtest's replays)"
        )
    if not forecast:
        return
    if args.mode != "queue":
        raise SimulationError(
            "--forecast", f"--mode {args.mode}", "--mode queue (the backtest needs a queue)"
        )
    if args.pipelines or args.scenario == "pipelines" or args.pipeline_policy:
        raise SimulationError(
            "--forecast",
            "with pipelines",
            "the trace, --teams, --scenario three-teams or --teams-from (the pipelines comparison has no backtest)",
        )
    if samples is not None and samples < 1:
        raise SimulationError("--forecast-samples", samples, "a positive number of replays")


def forecast_watch(args: argparse.Namespace) -> Backtest | None:
    """Return a fresh forecast backtest for one policy's run when ``--forecast`` asks for one."""
    if not getattr(args, "forecast", False):
        return None
    samples = FORECAST_SAMPLES if args.forecast_samples is None else args.forecast_samples
    return Backtest(samples=samples)


def _policies(args: argparse.Namespace) -> list[str]:
    chosen = args.policy or [DEFAULT_POLICY]
    if "all" in chosen:
        return list(ALL_POLICIES)
    return chosen


def run(args: argparse.Namespace) -> int:
    """Run the simulation the arguments describe; print results; return the exit code."""
    try:
        check_forecast_args(args)
        if args.mode == "queue":
            return _run_queue(args)
        if args.teams or args.scenario or args.teams_from or args.pipelines:
            raise SimulationError("--teams/--scenario/--teams-from/--pipelines", "--mode fgd", "--mode queue")
        return _run_fgd(args)
    except GpuPoolError as e:
        print(f"gpupool simulate: {e}", file=sys.stderr)
        return 2


def check_plot_path(path: str | None) -> None:
    """Check ``--plot`` before a run that can take minutes: matplotlib, and a folder that exists.

    :raises SimulationError: the folder of ``path`` does not exist
    """
    if not path:
        return
    require_extra("matplotlib", "plot", "--plot")
    folder = Path(path).expanduser().resolve().parent
    if not folder.is_dir():
        raise SimulationError("--plot", path, f"a PNG file in an existing folder ({folder} does not exist)")


def _run_fgd(args: argparse.Namespace) -> int:
    check_plot_path(args.plot)
    if args.scale < 1:
        raise SimulationError("--scale", args.scale, "a positive whole number of copies of the cluster")
    nodes, pods = scale_cluster(load_nodes(args.nodes), load_pods(args.pods), args.scale)
    shapes = trace_shapes(pods)
    results = []
    for name in _policies(args):
        if name not in policy_names():
            print(
                f"gpupool simulate: unknown policy {name!r}: choose among {policy_names()}", file=sys.stderr
            )
            return 2
        progress = None if args.quiet else stderr_progress(f"{name} seed {args.seed}")
        result = replay(nodes, pods, name, args.seed, shapes=shapes, progress=progress)
        if progress is not None:
            sys.stderr.write("\r" + " " * 40 + "\r")
        results.append(result)
        if args.json:
            print(json.dumps(result.summary()))
    if not args.json:
        print(format_table(results))
    if args.plot:
        plot_replay(results, args.plot, title=f"{args.pods}, seed {args.seed}")
    return 0


#: What a table shows for a point the trace does not reach.
UNREACHED = "–"


def _cell(value: float | None) -> str:
    return f"{UNREACHED:>8}" if value is None else f"{value:8.2f}"


def format_table(results: Sequence[ReplayResult]) -> str:
    """Return a text table of allocation and fragmentation % by arrived % for each run.

    A point the trace does not reach shows ``–``.
    """
    head = "policy".ljust(12) + "".join(f"{p:>7}%" for p in REPORT_POINTS)
    lines = ["GPU allocation % at arrived %", head]
    for r in results:
        lines.append(r.policy.ljust(12) + "".join(_cell(r.alloc_at(p)) for p in REPORT_POINTS))
    lines += ["", "fragmentation % at arrived %", head]
    for r in results:
        lines.append(r.policy.ljust(12) + "".join(_cell(r.frag_at(p)) for p in REPORT_POINTS))
    lines += ["", "policy".ljust(12) + "    pods  failed  seconds  decision ms p50/p99"]
    for r in results:
        s = r.summary()
        lines.append(
            f"{r.policy:<12}{r.pods:>8}{r.failed:>8}{r.seconds:>9.1f}  {s['decision_ms_p50']:.3f}/{s['decision_ms_p99']:.3f}"
        )
    return "\n".join(lines)


def _run_queue(args: argparse.Namespace) -> int:
    from airflow_gpupool.sim.queue import (
        MAX_OVERTAKES,
        NO_WATCH,
        QUEUE_BASELINE,
        check_queue_args,
        simulate_queue,
    )

    if args.pipelines or args.scenario or args.teams or args.teams_from or args.pipeline_policy:
        from airflow_gpupool.cli.simulate_teams import run_governed

        return run_governed(args)

    max_overtakes = MAX_OVERTAKES if args.max_overtakes is None else args.max_overtakes
    check_queue_args(
        load=args.load,
        sample_nodes=args.queue_nodes,
        arrivals=args.arrivals,
        warmup_s=args.warmup_hours * 3600,
        window_s=args.hours * 3600,
        max_overtakes=max_overtakes,
    )
    check_plot_path(args.plot)
    nodes = load_nodes(args.nodes)
    pods = load_pods(args.pods)
    names = args.policy or [DEFAULT_POLICY, QUEUE_BASELINE]
    rows = []
    series: list[dict[str, Any]] = []
    for name in names:
        if name != QUEUE_BASELINE and name not in policy_names():
            print(f"gpupool simulate: unknown policy {name!r}", file=sys.stderr)
            return 2
        progress = None if args.quiet else stderr_progress(f"{name} load {args.load}")
        drawn: dict[str, Any] = {}
        series.append(drawn)
        watch = forecast_watch(args)
        out = simulate_queue(
            nodes,
            pods,
            name,
            load=args.load,
            seed=args.seed,
            sample_nodes=args.queue_nodes,
            arrivals=args.arrivals,
            warmup_s=args.warmup_hours * 3600,
            window_s=args.hours * 3600,
            max_overtakes=max_overtakes,
            progress=progress,
            series=drawn,
            watch=watch or NO_WATCH,
        )
        if watch is not None:
            out["forecast"] = watch.report()
        if progress is not None:
            sys.stderr.write("\r" + " " * 40 + "\r")
        rows.append(out)
        if args.json:
            print(json.dumps(out))
    if not args.json:
        print(
            f"{'policy':<14}{'load':>6}{'offered':>9}{'mean wait s':>13}{'p99 wait s':>13}{'mean alloc %':>14}"
            f"{'frag mean %':>13}{'waiting':>9}"
        )
        for r in rows:
            print(
                f"{r['policy']:<14}{r['load']:>6}{r['offered_load']:>9.3f}{r['mean_wait_s']:>13.0f}"
                f"{r['p99_wait_s']:>13.0f}{r['mean_alloc']:>14.2f}{r['frag_mean']:>13.2f}{r['still_waiting']:>9}"
            )
    if args.plot:
        plot_queue(rows, series, args.plot, title=f"{args.pods}, load {args.load}, seed {args.seed}")
    return 0
