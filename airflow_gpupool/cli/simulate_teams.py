"""``gpupool simulate --mode queue`` with teams: ``--teams FILE``, ``--scenario``, ``--teams-from qos``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import numpy as np

from airflow_gpupool.cli.simulate import forecast_watch
from airflow_gpupool.exceptions import SimulationError
from airflow_gpupool.sim.governed import POLICIES
from airflow_gpupool.sim.queue import NO_WATCH, check_queue_args
from airflow_gpupool.sim.team_runs import simulate_teams, trace_jobs
from airflow_gpupool.sim.teams import generate_jobs, load_teams_file, scenario
from airflow_gpupool.sim.trace import load_nodes, load_pods

__all__ = ["format_teams_table", "run_governed", "run_teams"]


def _one_source(args: argparse.Namespace) -> None:
    given = [
        o
        for o, v in (
            ("--teams", args.teams),
            ("--scenario", args.scenario),
            ("--teams-from", args.teams_from),
        )
        if v
    ]
    if len(given) > 1:
        raise SimulationError(" and ".join(given), "both", "one of --teams, --scenario, --teams-from")


def run_governed(args: argparse.Namespace) -> int:
    """Run queue mode with teams: the pipelines comparison, or the governance policies compared."""
    if args.pipelines or args.scenario == "pipelines":
        from airflow_gpupool.cli.simulate_pipelines import run_pipelines

        return run_pipelines(args)
    if args.pipeline_policy:
        raise SimulationError(
            "--pipeline-policy", args.pipeline_policy, "--pipelines FILE or --scenario pipelines"
        )
    return run_teams(args)


def run_teams(args: argparse.Namespace) -> int:
    """Compare the governance policies on the teams the arguments name; print JSON or a table."""
    _one_source(args)
    warm, window = args.warmup_hours * 3600, args.hours * 3600
    check_queue_args(
        load=args.load,
        sample_nodes=args.queue_nodes,
        arrivals=0,
        warmup_s=warm,
        window_s=window,
        max_overtakes=0,
    )
    names = args.policy or list(POLICIES)
    for name in names:
        if name not in POLICIES:
            raise SimulationError("--policy", name, f"one of {', '.join(POLICIES)} with teams")
    if args.teams_from:
        nodes = load_nodes(args.nodes)
        if 0 < args.queue_nodes < len(nodes):
            rng = np.random.default_rng(args.seed)
            nodes = tuple(
                nodes[int(i)] for i in sorted(rng.choice(len(nodes), args.queue_nodes, replace=False))
            )
        jobs, plan = trace_jobs(
            nodes, load_pods(args.pods), load=args.load, span_s=warm + window, seed=args.seed
        )
    else:
        plan = load_teams_file(args.teams) if args.teams else scenario(args.scenario)
        nodes = plan.cluster.build() if plan.cluster is not None else load_nodes(args.nodes)
        jobs = generate_jobs(plan, warm + window, args.seed, warmup_s=warm)
    rows = []
    for name in names:
        if not args.quiet:
            print(f"{name}: {len(jobs)} jobs ...", file=sys.stderr)
        watch = forecast_watch(args)
        out = simulate_teams(nodes, jobs, plan, name, warmup_s=warm, window_s=window, watch=watch or NO_WATCH)
        if watch is not None:
            out["forecast"] = watch.report()
        out["seed"] = args.seed
        rows.append(out)
        if args.json:
            print(json.dumps(out))
    if not args.json:
        print(format_teams_table(rows))
    return 0


def format_teams_table(rows: list[dict[str, Any]]) -> str:
    """Return one line per policy, then one per policy and team."""
    lines = [
        f"{'policy':<15}{'alloc %':>9}{'urgent p99 s':>14}{'lost GPU-s':>12}{'grace GPU-s':>13}"
        f"{'preempt':>9}{'jain':>8}"
    ]
    for r in rows:
        lines.append(
            f"{r['policy']:<15}{r['mean_alloc']:>9.2f}{r['high_priority_p99_wait_s']:>14.1f}"
            f"{r['lost_gpu_s_total']:>12.0f}{r['grace_gpu_s_total']:>13.0f}{r['preemptions_total']:>9}"
            f"{r['jain_fairness']:>8.3f}"
        )
    lines += [
        "",
        f"{'policy':<15}{'team':<12}{'mean wait s':>12}{'p99 wait s':>12}{'share':>8}{'nominal':>9}"
        f"{'demand':>8}{'of entitled':>12}{'borrowed GPU-s':>16}{'preempt':>9}{'lost GPU-s':>12}",
    ]
    for r in rows:
        for team, t in r["teams"].items():
            entitled = "-" if t["share_of_entitled"] is None else f"{t['share_of_entitled']:.3f}"
            lines.append(
                f"{r['policy']:<15}{team:<12}{t['mean_wait_s']:>12.0f}{t['p99_wait_s']:>12.0f}{t['share']:>8.3f}"
                f"{t['nominal_share']:>9.3f}{t['demand_share']:>8.3f}{entitled:>12}{t['borrowed_gpu_s']:>16.0f}"
                f"{t['preemptions']:>9}{t['lost_gpu_s']:>12.0f}"
            )
    return "\n".join(lines)
