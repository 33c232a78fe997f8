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

Given the quotas (a :class:`~airflow_gpupool.governance.queue_pass.Governance` counting the
running grants), each pass serves the queue by the ledger's quota rules too: the teams' fair
order, a request placed only where its team's quota and its pool's headroom admit it, what each
team holds moving with every start and end.

What it leaves out, by design or for now: requests that arrive later (the forecast is for the
queue as it stands), preemption, the nodes already held, and gangs (their members are marked
``unknown``). Each waiting request starts with the overtakes it has counted (``Waiting.overtakes``:
the controller passes the ledger's, the backtest the simulation's). A request that starts in fewer
than half the runs (it fits no node, or the queue stops in front of it once the running tasks end)
says ``never``, on the current nodes.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from airflow_gpupool.ledger import StartForecast
from airflow_gpupool.placement.fit import choices
from airflow_gpupool.placement.pools import UNCONSTRAINED, PoolBindings
from airflow_gpupool.placement.queue import QueueEntry, hold_node, serve
from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.sim.queue import QueueSim

if TYPE_CHECKING:
    from airflow_gpupool.forecast.durations import RemainingTime
    from airflow_gpupool.governance.queue_pass import Governance

__all__ = ["NEVER", "SAMPLES", "SEED", "Running", "Waiting", "forecast_starts", "start_quantiles"]

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
    """A waiting request, in service order: its run time once started, the overtakes it has counted."""

    reservation_id: str
    request: GpuRequest
    run_time: RemainingTime
    overtakes: int = 0


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
    governance: Governance | None = None,
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
    :param governance: the quotas and what the running grants hold (None: no quotas)
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
        starts[s] = _replay(now, nodes, empty, on_nodes, waiting, place, max_overtakes, rng, governance)
    out = []
    started = np.isfinite(starts).mean(axis=0)
    quantiles = start_quantiles(starts)
    for i, w in enumerate(waiting):
        if started[i] < 0.5:
            out.append(StartForecast(w.reservation_id, now, "never", None, None, None, i + 1, total, NEVER))
            continue
        p10, p50, p90 = (float(q) for q in quantiles[:, i])
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


def start_quantiles(starts: np.ndarray) -> np.ndarray:
    """Return p10, p50 and p90 of each column of replayed starts (inf: that replay never started it).

    Interpolating beside an inf gives NaN (inf - inf); there the quantile is its lower neighbour
    instead: a start, or inf where that one never started either. Never NaN.
    """
    with np.errstate(invalid="ignore"):
        quantiles: np.ndarray = np.quantile(starts, [0.1, 0.5, 0.9], axis=0)
    unset = np.isnan(quantiles)
    if unset.any():
        quantiles[unset] = np.quantile(starts, [0.1, 0.5, 0.9], axis=0, method="lower")[unset]
    return quantiles


class _ReplaySim(QueueSim):
    """The simulator's queue with two caches for replays: they change what is computed, never the rule.

    - A held node is marked unschedulable instead of left out of the snapshot, so the policy's
      node table keeps its rows and refreshes only the held ones (leaving one out changes the
      table's length, and the policy rebuilds all of it: a thousand nodes' rows per placement).
    - ``hold_node``'s fit checks are remembered per node state and request shape (both
      immutable), so a hold looks again only at the nodes that changed since.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fits: dict[tuple[int, int], tuple[NodeState, GpuRequest, Any]] = {}
        self._shapes: dict[GpuRequest, GpuRequest] = {}
        self._closed: dict[int, tuple[NodeState, NodeState]] = {}

    def _snapshot(self, held: frozenset[str]) -> ClusterSnapshot:
        if not held:
            return ClusterSnapshot(tuple(self.nodes))
        nodes = list(self.nodes)
        for name in held:
            i = self.where[name]
            # The same copy while the node is unchanged: the policy's table sees no change in its row.
            copy = self._closed.get(id(nodes[i]))
            if copy is None or copy[0] is not nodes[i]:
                copy = self._closed[id(nodes[i])] = (nodes[i], replace(nodes[i], schedulable=False))
            nodes[i] = copy[1]
        return ClusterSnapshot(tuple(nodes))

    def _fit(self, node: NodeState, request: GpuRequest, bindings: PoolBindings = UNCONSTRAINED) -> Any:
        key = (id(node), id(request))
        found = self._fits.get(key)
        if found is not None and found[0] is node and found[1] is request:
            return found[2]
        answer = choices(node, request, bindings)
        self._fits[key] = (node, request, answer)
        return answer

    def _hold(self, entry: QueueEntry, held: frozenset[str]) -> str | None:
        # Equal requests share their fit checks: the cache is keyed by one object per request shape.
        request = self._shapes.setdefault(entry.request, entry.request)
        eligible = self._eligible(request)
        return hold_node(
            [self.nodes[i] for i in eligible], [self.empty[i] for i in eligible], request, held, fit=self._fit
        )


class _GovernedReplaySim(_ReplaySim):
    """The replay under quotas: each pass as the ledger's (:meth:`WriteCycle.serve` under quotas).

    A request its team's quota refuses on every node waits outside the pass; the others go in
    the teams' fair order, each placed only on the nodes that admit it; every start and end
    moves what its team holds. Preemption is not replayed.
    """

    def __init__(self, *args: Any, governance: Governance, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.governance = governance.without(())  # this replay's own count
        self._static = {n.name: n for n in self.empty}  # pools and models: all the rules read

    def depart(self, k: int) -> None:
        request, assignment, _ = self.running[k]
        super().depart(k)
        self.governance = self.governance.without([(request, assignment)])

    def serve(self, now: float) -> list[int]:
        if not self.waiting:
            return []
        quota = self.governance
        entries = quota.order([e for e in self.waiting.values() if not quota.refused_everywhere(e.request)])

        def try_place(entry: QueueEntry, held: frozenset[str]) -> Assignment | None:
            request = entry.request
            verdict = self.place(self._snapshot(held | quota.refused(request, self.empty)), request)
            if not isinstance(verdict, Assignment):
                return None
            self._take(self.where[verdict.node], request, verdict)
            quota.record(request, verdict, self._static[verdict.node])
            return verdict

        return self._served(serve(entries, try_place, self.max_overtakes, self._hold, now=now), now)


def _replay(
    now: float,
    nodes: Sequence[NodeState],
    empty: Sequence[NodeState],
    running: Sequence[Running],
    waiting: Sequence[Waiting],
    place: Callable[..., Any],
    max_overtakes: int,
    rng: np.random.Generator,
    governance: Governance | None = None,
) -> np.ndarray:
    """Run one replay; return each waiting request's start time (inf: it never started)."""
    sim = (
        _ReplaySim(list(nodes), place, (), max_overtakes, empty=empty)
        if governance is None
        else _GovernedReplaySim(list(nodes), place, (), max_overtakes, empty=empty, governance=governance)
    )
    ends: list[tuple[float, int]] = []
    for k, grant in enumerate(running):
        sim.adopt(-(k + 1), grant.request, grant.assignment)
        ends.append((now + grant.remaining.draw(rng), -(k + 1)))
    heapq.heapify(ends)
    for j, w in enumerate(waiting):
        sim.arrive(j, w.request, now, 0)
        if w.overtakes:  # past the bound, nothing may pass it: the queue rule reads the count
            sim.waiting[str(j)] = replace(sim.waiting[str(j)], overtakes=w.overtakes)
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
