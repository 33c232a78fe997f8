"""Replay the queue as it stands, forward in time, to forecast when each waiting request starts.

The replay is the simulator's :class:`~airflow_gpupool.sim.queue.QueueSim`, driven from the
ledger's current state: its nodes with the running grants taken, the waiting requests in
service order, the ledger's placement policy and ``max_overtakes``. Its passes are the queue
rule the ledger serves with (:func:`airflow_gpupool.placement.queue.serve`), so there is no
second copy of the rules. Each of :data:`SAMPLES` runs (seeded with :data:`SEED`) draws every
running grant's remaining time and every started request's run time from the
:class:`~airflow_gpupool.forecast.durations.DurationModel`, then advances from departure to
departure until the queue is empty or nothing runs; a request's p10 / p50 / p90 are the
quantiles of its start times over the runs.

What it leaves out, by design or for now: requests that arrive later (the forecast is for the
queue as it stands), team quotas and preemption, the overtakes already counted and the nodes
already held (every waiting request starts the replay with none), and gangs (their members are
marked ``unknown``). A request that starts in fewer than half the runs (it fits no node, or the
queue stops in front of it once the running tasks end) says ``never``, on the current nodes.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from airflow_gpupool.ledger import StartForecast
from airflow_gpupool.sim.queue import QueueSim

if TYPE_CHECKING:
    from airflow_gpupool.forecast.durations import RemainingTime
    from airflow_gpupool.placement.snapshot import NodeState
    from airflow_gpupool.placement.verdict import Assignment
    from airflow_gpupool.resources import GpuRequest

__all__ = ["NEVER", "SAMPLES", "SEED", "Running", "Waiting", "forecast_starts"]

#: Replays per forecast pass: p10 and p90 each rest on about 6 of them.
SAMPLES = 64
#: The replays' seed: the same ledger state gives the same forecast.
SEED = 39
NEVER = "never, on the current nodes"


@dataclass(frozen=True)
class Running:
    """A running grant: what it holds and how long it may have left."""

    reservation_id: str
    request: GpuRequest
    assignment: Assignment
    remaining: RemainingTime


@dataclass(frozen=True)
class Waiting:
    """A waiting request, in service order: its run time once started."""

    reservation_id: str
    request: GpuRequest
    run_time: RemainingTime


def forecast_starts(
    now: float,
    nodes: Sequence[NodeState],
    empty: Sequence[NodeState],
    running: Sequence[Running],
    waiting: Sequence[Waiting],
    place: Callable[..., Any],
    max_overtakes: int,
    *,
    samples: int = SAMPLES,
    seed: int = SEED,
) -> list[StartForecast]:
    """Return one forecast per waiting request, in the order given.

    :param now: the ledger's clock when the state was read
    :param nodes: the nodes as they are (running grants taken)
    :param empty: the same nodes with nothing granted, in the same order
    :param running: the running grants on ``nodes``
    :param waiting: the waiting requests in service order
    :param place: the ledger's placement, ``place(snapshot, request) -> verdict``
    :param max_overtakes: the ledger's no-starvation bound
    :param samples: replays
    :param seed: the replays' seed
    """
    if not waiting:
        return []
    total = len(waiting)
    if not nodes:
        return [
            StartForecast(w.reservation_id, now, "unknown", None, None, None, i + 1, total, "no GPU nodes")
            for i, w in enumerate(waiting)
        ]
    rng = np.random.default_rng(seed)
    names = {n.name for n in nodes}
    on_nodes = [g for g in running if g.assignment.node in names]
    starts = np.full((samples, total), np.inf)
    for s in range(samples):
        starts[s] = _replay(now, nodes, empty, on_nodes, waiting, place, max_overtakes, rng)
    out = []
    for i, w in enumerate(waiting):
        column = starts[:, i]
        if np.isfinite(column).mean() < 0.5:
            out.append(StartForecast(w.reservation_id, now, "never", None, None, None, i + 1, total, NEVER))
            continue
        p10, p50, p90 = (float(q) for q in np.quantile(column, [0.1, 0.5, 0.9]))
        out.append(
            StartForecast(
                w.reservation_id,
                now,
                "forecast",
                p10,
                p50,
                p90 if np.isfinite(p90) else None,
                i + 1,
                total,
                f"{samples} replays of the queue as it stands (later arrivals ignored)",
            )
        )
    return out


def _replay(
    now: float,
    nodes: Sequence[NodeState],
    empty: Sequence[NodeState],
    running: Sequence[Running],
    waiting: Sequence[Waiting],
    place: Callable[..., Any],
    max_overtakes: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """Run one replay; return each waiting request's start time (inf: it never started)."""
    sim = QueueSim(list(nodes), place, (), max_overtakes, empty=empty)
    ends: list[tuple[float, int]] = []
    for k, grant in enumerate(running):
        sim.adopt(-(k + 1), grant.request, grant.assignment)
        ends.append((now + grant.remaining.draw(rng), -(k + 1)))
    heapq.heapify(ends)
    for j, w in enumerate(waiting):
        sim.arrive(j, w.request, now, 0)
    starts = np.full(len(waiting), np.inf)
    t = now
    while True:
        for j in sim.serve(t):
            starts[j] = t
            heapq.heappush(ends, (t + waiting[j].run_time.draw(rng), j))
        if not sim.waiting or not ends:
            return starts
        t, k = heapq.heappop(ends)
        sim.depart(k)
