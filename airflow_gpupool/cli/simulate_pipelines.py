"""``gpupool simulate --mode queue --pipelines FILE`` (or ``--scenario pipelines``): the pipeline policies compared."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from airflow_gpupool.exceptions import SimulationError
from airflow_gpupool.sim.pipelines.engine import PIPELINE_POLICIES
from airflow_gpupool.sim.pipelines.runs import simulate_pipelines
from airflow_gpupool.sim.pipelines.spec import draw_runs, load_pipelines_file
from airflow_gpupool.sim.queue import check_queue_args
from airflow_gpupool.sim.teams import generate_jobs

__all__ = ["format_pipelines_table", "run_pipelines"]


def run_pipelines(args: argparse.Namespace) -> int:
    """Compare the pipeline policies on the file's runs and background; print JSON or a table."""
    if args.pipelines and args.scenario:
        raise SimulationError("--pipelines and --scenario", "both", "one of them")
    if args.teams or args.teams_from:
        raise SimulationError(
            "--teams/--teams-from", "with --pipelines", "the pipelines file's background key"
        )
    warm, window = args.warmup_hours * 3600, args.hours * 3600
    check_queue_args(
        load=args.load,
        sample_nodes=args.queue_nodes,
        arrivals=0,
        warmup_s=warm,
        window_s=window,
        max_overtakes=0,
    )
    governance = args.policy or ["gpupool"]
    if len(governance) != 1:
        raise SimulationError("--policy", governance, "one governance policy with --pipelines")
    plan = load_pipelines_file(args.pipelines or args.scenario)
    if plan.teams.cluster is None:
        raise SimulationError(
            "--pipelines cluster", None, "a cluster, in the pipelines file or its background"
        )
    nodes = plan.teams.cluster.build()
    if not args.quiet:
        print(f"{len(plan.pipelines)} pipelines, seed {args.seed} ...", file=sys.stderr)
    out = simulate_pipelines(
        nodes,
        generate_jobs(plan.teams, warm + window, args.seed, warmup_s=warm),
        draw_runs(plan, warm + window, args.seed),
        plan,
        governance=governance[0],
        policies=args.pipeline_policy or tuple(PIPELINE_POLICIES),
        warmup_s=warm,
        window_s=window,
    )
    out["seed"] = args.seed
    print(json.dumps(out) if args.json else format_pipelines_table(out))
    return 0


def format_pipelines_table(out: dict[str, Any]) -> str:
    """Return one line per pipeline policy."""
    lines = [
        f"{out['policy']} governance, seed {out.get('seed')}, {out['hours']} h after {out['warmup_hours']} h, "
        f"{out['gpus']} GPUs",
        f"{'pipeline policy':<36}{'run p50 s':>10}{'run p99 s':>10}{'step p50 s':>11}{'step p99 s':>11}"
        f"{'idle held %':>12}{'bg wait s':>10}",
    ]
    for name, p in out["pipelines"].items():
        lines.append(
            f"{name:<36}{p['run_latency_p50_s']:>10.0f}{p['run_latency_p99_s']:>10.0f}"
            f"{p['inter_step_wait_p50_s']:>11.0f}{p['inter_step_wait_p99_s']:>11.0f}"
            f"{p['idle_held_pct']:>12.3f}{p['background_mean_wait_s']:>10.0f}"
        )
    return "\n".join(lines)
