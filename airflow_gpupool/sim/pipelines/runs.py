"""Run the pipeline policies on one background and one draw of DAG runs, and measure them.

:func:`simulate_pipelines` returns what ``gpupool simulate --mode queue --pipelines FILE --json``
prints: the governance policy, the window, ``bounds`` (:func:`run_bounds`: what no policy can
beat) and ``pipelines``, one object per pipeline policy:

- ``run_latency_p50_s``/``run_latency_p99_s``: a run's first arrival to its last step's end
  (runs arriving in the window; one still running at the end counts its time so far);
- ``inter_step_wait_p50_s``/``inter_step_wait_p99_s``: from the moment a step asks for its slice
  (its upstream's end plus the start gap, the same in every policy) to its work's start;
- ``idle_held_pct``: GPU time held unused by hand-on and queue-ahead, over the window's
  capacity-time (split in ``idle_hand_on_pct`` and ``idle_queue_ahead_pct``);
- ``background_mean_wait_s``: the background teams' tries' mean queue wait (those queued in the
  window; one still waiting counts its wait so far);
- ``runs``, ``runs_unfinished``, ``steps_measured``, and ``inter_step_wait_by_step`` (per
  ``pipeline.step``: ``p50_s``, ``p99_s``, ``steps``), which shows which steps the p99 comes from.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from airflow_gpupool.exceptions import SimulationError
from airflow_gpupool.sim.governed import POLICIES
from airflow_gpupool.sim.pipelines.engine import PIPELINE_POLICIES, YARDSTICKS, PipelineSim

if TYPE_CHECKING:
    from airflow_gpupool.placement.snapshot import NodeState
    from airflow_gpupool.sim.pipelines.spec import PipelinesPlan, RunDraw
    from airflow_gpupool.sim.teams import Job

__all__ = ["pipeline_measures", "run_bounds", "simulate_pipelines"]


def simulate_pipelines(
    nodes: Sequence[NodeState],
    jobs: Sequence[Job],
    runs: Sequence[RunDraw],
    plan: PipelinesPlan,
    *,
    governance: str = "gpupool",
    policies: Sequence[str] = tuple(PIPELINE_POLICIES),
    warmup_s: float,
    window_s: float,
) -> dict[str, Any]:
    """Run each pipeline policy over the same background jobs and runs; return the measures.

    :raises SimulationError: an unknown governance or pipeline policy
    """
    if governance not in POLICIES:
        raise SimulationError("--policy", governance, f"one of {', '.join(POLICIES)} with --pipelines")
    for name in policies:
        if name not in PIPELINE_POLICIES and name not in YARDSTICKS:
            choices = ", ".join((*PIPELINE_POLICIES, *YARDSTICKS))
            raise SimulationError("--pipeline-policy", name, f"one of {choices}")
    out: dict[str, Any] = {}
    for name in policies:
        sim = PipelineSim(
            list(nodes),
            plan,
            PIPELINE_POLICIES.get(name) or YARDSTICKS[name],
            runs,
            governance=governance,
            warm=warmup_s,
            horizon=warmup_s + window_s,
        )
        sim.run(jobs)
        out[name] = pipeline_measures(sim)
    return {
        "policy": governance,
        "bounds": run_bounds(runs, plan, sum(len(n.gpus) for n in nodes) * 1000, warmup_s, window_s),
        "hours": round(window_s / 3600, 1),
        "warmup_hours": round(warmup_s / 3600, 1),
        "gpus": sum(len(n.gpus) for n in nodes),
        "background_jobs": sum(1 for j in jobs if j.arrival >= warmup_s),
        "pipelines": out,
    }


def _pct(values: Sequence[float], q: float) -> float:
    return round(float(np.percentile(values, q)), 1) if values else 0.0


def pipeline_measures(sim: PipelineSim) -> dict[str, Any]:
    """Return one policy's measures from a finished :class:`PipelineSim` (see the module docstring)."""
    latencies, waits, unfinished = [], [], 0
    by_step: dict[str, list[float]] = defaultdict(list)
    for run in sim.draws:
        if run.arrival < sim.warm:
            continue
        spec = sim.pplan.pipelines[run.pipeline]
        steps = [sim.steps[(run.seq, i)] for i in range(len(run.work_s))]
        steps = [s for s in steps if not s.skipped]
        last = steps[-1].ended
        unfinished += last is None
        latencies.append((last if last is not None else sim.horizon) - run.arrival)
        for step in steps[1:]:
            if step.ready is not None:
                wait = (step.started if step.started is not None else sim.horizon) - step.ready
                waits.append(wait)
                by_step[f"{spec.name}.{spec.steps[step.index].name}"].append(wait)
    capacity_time = sim.capacity * (sim.horizon - sim.warm)
    hand, ahead = (100 * sim.idle_held[k] / capacity_time for k in ("hand-on", "queue-ahead"))
    return {
        "run_latency_p50_s": _pct(latencies, 50),
        "run_latency_p99_s": _pct(latencies, 99),
        "inter_step_wait_p50_s": _pct(waits, 50),
        "inter_step_wait_p99_s": _pct(waits, 99),
        "idle_held_pct": round(hand + ahead, 3),
        "idle_hand_on_pct": round(hand, 3),
        "idle_queue_ahead_pct": round(ahead, 3),
        "background_mean_wait_s": round(float(np.mean(sim.bg_waits)), 1) if sim.bg_waits else 0.0,
        "runs": len(latencies),
        "runs_unfinished": unfinished,
        "steps_measured": len(waits),
        "inter_step_wait_by_step": {
            name: {"p50_s": _pct(w, 50), "p99_s": _pct(w, 99), "steps": len(w)}
            for name, w in sorted(by_step.items())
        },
    }


def run_bounds(
    runs: Sequence[RunDraw], plan: PipelinesPlan, capacity_milli: int, warmup_s: float, window_s: float
) -> dict[str, float]:
    """Return what no policy can beat, from the runs alone (the same for every policy).

    ``run_latency_floor_p50_s``/``_p99_s``: a run's latency if no step ever waited (its steps' work
    plus the start gaps); ``whole_run_reservation_idle_pct``: the capacity-time a policy that keeps
    each run's peak slice from its first step to its last (no inter-step wait by construction)
    would hold unused, over the window's capacity-time.
    """
    floors, idle = [], 0.0
    for run in runs:
        if run.arrival < warmup_s:
            continue
        spec = plan.pipelines[run.pipeline]
        steps = range(run.skipped_from if run.skipped_from is not None else len(run.work_s))
        floor = sum(run.work_s[i] for i in steps) + plan.start_gap_s * (len(steps) - 1)
        floors.append(floor)
        peak = max(spec.steps[i].request.total_gpu_milli for i in steps)
        idle += peak * floor - sum(spec.steps[i].request.total_gpu_milli * run.work_s[i] for i in steps)
    return {
        "run_latency_floor_p50_s": _pct(floors, 50),
        "run_latency_floor_p99_s": _pct(floors, 99),
        "whole_run_reservation_idle_pct": round(100 * idle / (capacity_milli * window_s), 3),
    }
