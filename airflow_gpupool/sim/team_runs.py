"""Run the governed queue simulation: the three-teams scenario, a teams file, or the trace by QoS class.

:func:`simulate_teams` replays jobs through :class:`~airflow_gpupool.sim.governed.TeamsSim` for
one policy and returns what ``gpupool simulate --mode queue --json`` prints: per team
``mean_wait_s``, ``p99_wait_s``, ``share`` (GPU time over capacity, in the window),
``nominal_share``, ``demand_share`` (GPU time its jobs would use in the window if each started
on arrival),
``share_of_entitled`` (share over min(nominal, demand): what "gets its nominal share when it has
the demand" measures), ``share_of_instant_entitled`` (share over ``instant_entitled_share``, the
window's mean of min(nominal, demand at each instant): a quota bounds what a team holds at once),
``borrowed_gpu_s``, ``preemptions``, ``lost_gpu_s`` and ``grace_gpu_s``;
overall ``jain_fairness`` (Jain's index of ``share_of_entitled``, each capped at 1: a team above
its entitlement is not unfairly served), ``high_priority_p99_wait_s`` (urgent work), ``lost_gpu_s_total``
and ``mean_alloc``, with the window's idle capacity split in ``idle_queue_empty_pct`` (nothing
waited: no policy could have used it) and ``idle_while_waiting_pct`` (some try waited: quotas,
headroom, class exclusivity or fragmentation kept it out); the three add up to 100.
:func:`trace_jobs` turns a trace into jobs, one team per QoS class.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from airflow_gpupool.exceptions import SimulationError
from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState
from airflow_gpupool.sim.governed import ARRIVE, POLICIES, RELEASE, TeamsSim
from airflow_gpupool.sim.queue import NO_WATCH, QueueWatch, offered_rate, usable_workload
from airflow_gpupool.sim.teams import Job, TeamsPlan, teams_from_qos, trace_preemption
from airflow_gpupool.sim.trace import TracePod

__all__ = ["simulate_teams", "trace_jobs"]


def simulate_teams(
    nodes: Sequence[NodeState],
    jobs: Sequence[Job],
    plan: TeamsPlan,
    policy: str,
    *,
    warmup_s: float,
    window_s: float,
    watch: QueueWatch = NO_WATCH,
) -> dict[str, Any]:
    """Run one policy over ``jobs`` and return the measures of the window after the warm-up.

    Waits are those of the tries queued in the window (a retry after a preemption is a try);
    shares and allocation are time averages over the window, in GPU time over capacity.
    ``watch`` (the forecast backtest) is told of every try, every successful end, and after
    each pass of the try the event queued (an arrival or a preempted task's retry).

    :raises SimulationError: an unknown policy
    """
    if policy not in POLICIES:
        raise SimulationError("--policy", policy, f"one of {', '.join(POLICIES)} with --teams or --scenario")
    sim = TeamsSim(list(nodes), plan, POLICIES[policy], warmup_s)
    horizon = warmup_s + window_s
    sim.watch = watch
    mean_run = float(np.mean([j.work_s for j in jobs] or [3600.0]))
    watch.start(mean_run_s=mean_run, gpus=sim.capacity / 1000, warm_s=warmup_s)
    for job in jobs:
        heapq.heappush(sim.events, (job.arrival, ARRIVE, job.seq))
    while sim.events:
        now, kind, k = heapq.heappop(sim.events)
        if now > horizon:
            break
        sim.advance(now, warmup_s)
        arrived = sim.next_try
        if kind == ARRIVE:
            sim.enqueue(jobs[k], now, jobs[k].work_s)
        elif kind == RELEASE:
            sim.release(k, now)
        elif not sim.finish(k, now):
            continue
        sim.pass_(now)
        # A try queued by this event (an arrival, or a preempted task's retry) is the next number.
        watch.waiting(now, sim, arrived, sim.ordered, lambda j: sim.tries[j].remaining_s)
    sim.advance(horizon, warmup_s)
    for rid in sim.waiting:
        t = sim.tries[int(rid)]
        if t.queued_at >= warmup_s:
            sim.waited[t.job.team].append((horizon - t.queued_at, sim.urgent(t.job)))
    return _measures(sim, jobs, plan, policy, warmup_s, window_s)


def _p99(values: Sequence[float]) -> float:
    return round(float(np.percentile(values, 99)), 1) if values else 0.0


def _measures(
    sim: TeamsSim, jobs: Sequence[Job], plan: TeamsPlan, policy: str, warm: float, window: float
) -> dict[str, Any]:
    gpu_window = sim.capacity * window
    demand: dict[str, float] = defaultdict(float)
    for job in jobs:  # the GPU time each job would use in the window if it started on arrival
        overlap = min(job.arrival + job.work_s, warm + window) - max(job.arrival, warm)
        demand[job.team] += job.request.total_gpu_milli * max(0.0, overlap)
    instant = _instant_entitled(jobs, sim.nominal, sim.capacity, warm, window)
    teams: dict[str, dict[str, Any]] = {}
    ratios = []
    for team in sorted(set(plan.teams) | set(demand)):
        waits = [w for w, _ in sim.waited[team]]
        share = sim.area[team] / gpu_window
        nominal = sim.nominal.get(team, 0) / sim.capacity
        wanted = demand[team] / gpu_window
        entitled = min(nominal, wanted)
        if entitled > 0:
            ratios.append(share / entitled)
        teams[team] = {
            "mean_wait_s": round(float(np.mean(waits)), 1) if waits else 0.0,
            "p99_wait_s": _p99(waits),
            "share": round(share, 4),
            "nominal_share": round(nominal, 4),
            "demand_share": round(wanted, 4),
            "share_of_entitled": round(share / entitled, 3) if entitled > 0 else None,
            "instant_entitled_share": round(instant[team], 4),
            "share_of_instant_entitled": round(share / instant[team], 3) if instant[team] > 0 else None,
            "borrowed_gpu_s": round(sim.borrowed_area[team] / 1000, 1),
            "preemptions": sim.preemptions[team],
            "lost_gpu_s": round(sim.lost[team], 1),
            "grace_gpu_s": round(sim.grace[team], 1),
            "still_waiting": sum(1 for k in sim.waiting if sim.tries[int(k)].job.team == team),
        }
    urgent = [w for team in sim.waited for w, u in sim.waited[team] if u]
    capped = [min(r, 1.0) for r in ratios]
    return {
        "policy": policy,
        "jobs": sum(1 for j in jobs if j.arrival >= warm),
        "hours": round(window / 3600, 1),
        "warmup_hours": round(warm / 3600, 1),
        "gpus": sim.capacity / 1000,
        "offered_load": round(sum(demand.values()) / gpu_window, 3),
        "mean_alloc": round(sim.alloc_area / window * 100 / sim.capacity, 2),
        "idle_queue_empty_pct": round(sim.idle_area[0] / window * 100 / sim.capacity, 2),
        "idle_while_waiting_pct": round(sim.idle_area[1] / window * 100 / sim.capacity, 2),
        "teams": teams,
        "jain_fairness": round(sum(capped) ** 2 / (len(capped) * sum(c * c for c in capped)), 4)
        if capped
        else 1.0,
        "high_priority_p99_wait_s": _p99(urgent),
        "high_priority_mean_wait_s": round(float(np.mean(urgent)), 1) if urgent else 0.0,
        "lost_gpu_s_total": round(sum(sim.lost.values()), 1),
        "grace_gpu_s_total": round(sum(sim.grace.values()), 1),
        "preemptions_total": sum(sim.preemptions.values()),
    }


def _instant_entitled(
    jobs: Sequence[Job], nominal: dict[str, int], capacity: int, warm: float, window: float
) -> dict[str, float]:
    """Return per team the integral over the window of min(nominal, demand at t), over capacity.

    Demand at t is what the team's jobs would hold at t had each started on arrival. A nominal
    quota bounds what a team holds at once: asking above it at one time (borrowing, which is not
    guaranteed) does not make up for asking below it at another, as min(nominal, demand) over
    the window's averages lets it.
    """
    steps: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for job in jobs:
        milli = job.request.total_gpu_milli
        steps[job.team] += [(job.arrival, milli), (job.arrival + job.work_s, -milli)]
    end = warm + window
    out: dict[str, float] = defaultdict(float)
    for team, changes in steps.items():
        cap, level, last, area = nominal.get(team, 0), 0, warm, 0.0
        for at, delta in sorted(changes):
            t = min(max(at, warm), end)
            area += min(cap, level) * (t - last)
            last, level = t, level + delta
        out[team] = area / (capacity * window)
    return out


def trace_jobs(
    nodes: Sequence[NodeState], pods: Sequence[TracePod], *, load: float, span_s: float, seed: int
) -> tuple[list[Job], TeamsPlan]:
    """Return Poisson arrivals of the trace's pods offering ``load`` over ``span_s``, and the teams.

    As :func:`airflow_gpupool.sim.queue.simulate_queue` draws them (durations from the trace,
    capped at 24 h); each pod's team is its QoS class (:func:`teams_from_qos`).
    """
    usable, durations = usable_workload(pods)
    if not usable:
        raise SimulationError("--pods", "(trace)", "queue mode needs pods with creation_time < deletion_time")
    capacity = ClusterSnapshot(tuple(nodes)).gpu_capacity_milli
    milli = np.array([p.gpu_milli for p in usable], dtype=np.float64)
    rate = offered_rate(capacity, milli, durations, load)
    rng = np.random.default_rng(seed)
    count = max(int(rate * span_s), 1)
    times = np.cumsum(rng.exponential(1 / rate, count))
    picks = rng.integers(len(usable), size=count)
    plan = teams_from_qos(usable, [float(d) for d in durations], capacity)
    jobs = []
    for seq, (at, i) in enumerate(zip(times, picks, strict=True)):
        pod = usable[int(i)]
        team = pod.qos or "none"
        preemptible, interval, emergency = trace_preemption(team)
        request = replace(pod.request, team=team, preemptible=preemptible)
        jobs.append(Job(seq, team, request, float(at), float(durations[int(i)]), interval, emergency))
    return [j for j in jobs if j.arrival < span_s], plan
