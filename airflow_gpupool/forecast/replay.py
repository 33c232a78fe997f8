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

Given the preemption rules (:class:`~airflow_gpupool.governance.victim_nodes.PreemptionRules`),
each pass then lets the first waiting requests preempt as the ledger's does, by the same code
(:func:`~airflow_gpupool.governance.victim_nodes.offer_victims`): the victims' checkpoints, ages,
headroom loans and teams' borrowing as the ledger reads them. A victim's slice passes on some
time within its grace: drawn from how long the ledger's newest victims took to end once told
(``victim_exits``, :meth:`~airflow_gpupool.ledger.LedgerForecasts.victim_exits`; uniformly within
the grace while fewer than :data:`MIN_EXITS` are known); a grant the ledger already told to end
passes on by its deadline. The victim's retry is not replayed (it queues later, as a new request).

What it leaves out, by design or for now: requests that arrive later (the forecast is for the
queue as it stands), preempted tries' retries, the nodes already held, and gangs (their members
are marked ``unknown``). Each waiting request starts with the overtakes it has counted (``Waiting.overtakes``:
the controller passes the ledger's, the backtest the simulation's). A request that starts in fewer
than half the runs (it fits no node, or the queue stops in front of it once the running tasks end)
says ``never``, on the current nodes.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from airflow_gpupool.governance.preemption import VictimCandidate
from airflow_gpupool.governance.victim_nodes import LiveGrant, PreemptionRules, held_milli, offer_victims
from airflow_gpupool.ledger import StartForecast
from airflow_gpupool.placement.fit import choices
from airflow_gpupool.placement.pools import UNCONSTRAINED, PoolBindings
from airflow_gpupool.placement.queue import QueueEntry, hold_node, serve
from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest, WorkloadClass
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
#: Victims' exits known before the replay draws from them instead of uniformly within the grace.
MIN_EXITS = 3
#: The replay's own event: a grant comes of age as a victim (no task has this number).
_WAKE = -(2**62)


@dataclass(frozen=True)
class Running:
    """A running grant: what it holds and how long it may have left.

    What preemption reads of it (replayed only given the rules): ``granted_at`` (None: never a
    victim here), its newest checkpoint, whether it runs on a headroom loan; ``ends_by``: a victim
    already told to end, by then, for the waiting request ``preempted_for``.
    """

    reservation_id: str
    request: GpuRequest
    assignment: Assignment
    remaining: RemainingTime
    granted_at: float | None = None
    checkpoint_at: float | None = None
    on_headroom_loan: bool = False
    ends_by: float | None = None
    preempted_for: str | None = None


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
    preemption: PreemptionRules | None = None,
    victim_exits: Sequence[float] = (),
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
    :param preemption: the ledger's preemption rules (None: preemption is not replayed)
    :param victim_exits: how long the newest victims took to end once told, in seconds
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
    exits = tuple(victim_exits) if len(victim_exits) >= MIN_EXITS else ()
    names = {n.name for n in nodes}
    on_nodes = [g for g in running if g.assignment.node in names]
    starts = np.full((samples, total), np.inf)
    for s in range(samples):
        starts[s] = _replay(
            now, nodes, empty, on_nodes, waiting, place, max_overtakes, rng, governance, preemption, exits
        )
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
                f"{samples} replays of the queue as it stands (later arrivals ignored"
                + ("; preemption replayed)" if preemption is not None else ")"),
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


class _Preempting(QueueSim):
    """The simulator's queue, preempting after each pass as the ledger's does (given the rules)."""

    def __init__(self, *args: Any, preemption: PreemptionRules | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rules = preemption
        # What preemption reads of each running task: (granted at, newest checkpoint, on a headroom loan).
        self.facts: dict[int, tuple[float, float | None, bool]] = {}
        self.told: set[int] = set()  # victims told to end, holding their slices until they do
        self.pending: dict[str, set[int]] = {}  # preemptor -> its victims still holding
        self.wake_at = math.inf  # when a grant too young to be a victim comes of age
        self.preemptible = 0  # running grants that might be victims: none, and preemption costs nothing

    def adopt(self, k: int, request: GpuRequest, assignment: Assignment) -> None:
        super().adopt(k, request, assignment)
        self.preemptible += request.preemptible

    def depart(self, k: int) -> None:
        self.preemptible -= self.running[k][0].preemptible
        super().depart(k)
        if k in self.told:
            self.told.discard(k)
            for rid, victims in list(self.pending.items()):
                victims.discard(k)
                if not victims:
                    del self.pending[rid]

    def _served(self, outcome: Any, now: float) -> list[int]:
        started = super()._served(outcome, now)
        for k in started:
            self.facts[k] = (now, None, False)
            self.preemptible += self.running[k][0].preemptible
        return started

    def service_order(self) -> list[QueueEntry]:
        """The waiting requests in the order the last pass served them."""
        return sorted(self.waiting.values(), key=lambda e: (-e.request.priority, e.seq))

    def preempt(self, now: float) -> list[int]:
        """Let the first waiting requests the pass left preempt, as the ledger's pass does; return the victims told.

        Sets :attr:`wake_at`: when the youngest grant too young to be a victim now comes of age
        (the ledger's passes run at every write, so it would offer that grant then).
        """
        self.wake_at = math.inf
        if self.rules is None or not self.waiting or not self.preemptible:
            return []
        preemptors = [
            e
            for e in self.service_order()
            if e.request_id in self.waiting and e.request.gang is None and e.request.preempts
        ]
        if not preemptors:
            return []
        quota = self._quota()
        grants = [self._live(k, now, quota) for k in self.running if self._may_be_victim(k)]
        self.wake_at = min(
            (age for g in grants if (age := g.candidate.granted_at + self.rules.min_runtime_seconds) > now),
            default=math.inf,
        )
        offers = offer_victims(
            preemptors,
            grants,
            {n.name: n for n in self.nodes},
            self.pending,
            now=now,
            rules=self.rules,
            place=self.place,
            classes_on=self._classes_on,
            quota=quota,
        )
        told = []
        for entry, chosen in offers:
            victims = {int(v.reservation_id) for v in chosen}
            self.pending[entry.request_id] = victims
            self.told |= victims
            told += sorted(victims)
        return told

    def _quota(self) -> Governance | None:
        return None

    def _may_be_victim(self, k: int) -> bool:
        request = self.running[k][0]
        return request.preemptible and request.gang is None and k not in self.told and k in self.facts

    def _live(self, k: int, now: float, quota: Governance | None) -> LiveGrant:
        request, assignment, i = self.running[k]
        granted_at, checkpoint_at, on_loan = self.facts[k]
        node = self.nodes[i]
        candidate = VictimCandidate(
            reservation_id=str(k),
            priority=request.priority,
            preemptible=True,
            granted_at=granted_at,
            milli=held_milli(request, assignment),
            # One that writes a checkpoint on SIGTERM loses nothing stopped now, as the ledger ranks it.
            checkpoint_at=now if request.checkpoint_on_sigterm else checkpoint_at,
            borrowed=quota.borrowing(request.team, node) if quota is not None else True,
            team=request.team,
            on_headroom_loan=on_loan,
        )
        return LiveGrant(str(k), node.name, request, assignment, candidate)

    def _classes_on(self, name: str) -> dict[str, WorkloadClass]:
        i = self.where[name]
        return {str(k): r.workload_class for k, (r, _, at) in self.running.items() if at == i}


class _CachedSim(QueueSim):
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


class _ReplaySim(_Preempting, _CachedSim):
    """The replay's queue: preemption as the ledger's, with the caches."""


class _GovernedReplaySim(_ReplaySim):
    """The replay under quotas: each pass as the ledger's (:meth:`WriteCycle.serve` under quotas).

    A request its team's quota refuses on every node waits outside the pass; the others go in
    the teams' fair order, each placed only on the nodes that admit it; every start and end
    moves what its team holds.
    """

    def __init__(self, *args: Any, governance: Governance, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.governance = governance.without(())  # this replay's own count
        self._static = {n.name: n for n in self.empty}  # pools and models: all the rules read
        self.order: list[QueueEntry] = []  # the last pass's entries, in the teams' fair order

    def depart(self, k: int) -> None:
        request, assignment, _ = self.running[k]
        super().depart(k)
        self.governance = self.governance.without([(request, assignment)])

    def _quota(self) -> Governance:
        """The quotas as preemption reads them: what the victims already told hold is as good as given back."""
        told = [(self.running[k][0], self.running[k][1]) for k in self.told]
        return self.governance.without(told) if told else self.governance

    def service_order(self) -> list[QueueEntry]:
        return self.order

    def serve(self, now: float) -> list[int]:
        if not self.waiting:
            self.order = []
            return []
        quota = self.governance
        entries = quota.order([e for e in self.waiting.values() if not quota.refused_everywhere(e.request)])
        self.order = entries

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
    preemption: PreemptionRules | None = None,
    exits: tuple[float, ...] = (),
) -> np.ndarray:
    """Run one replay; return each waiting request's start time (inf: it never started)."""
    sim = (
        _ReplaySim(list(nodes), place, (), max_overtakes, empty=empty, preemption=preemption)
        if governance is None
        else _GovernedReplaySim(
            list(nodes), place, (), max_overtakes, empty=empty, governance=governance, preemption=preemption
        )
    )
    end_at = _adopt(sim, now, running, waiting, rng)  # each running task's end; a victim's moves earlier
    ends = [(t, k) for k, t in end_at.items()]
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
            end_at[j] = t + waiting[j].run_time.draw(rng)
            heapq.heappush(ends, (end_at[j], j))
        _preempt(sim, t, end_at, ends, rng, exits)
        if not sim.waiting:
            return starts
        while ends and end_at.get(ends[0][1]) != ends[0][0]:
            heapq.heappop(ends)  # an end that moved earlier (a victim's), or a wake-up moved
        if not ends or (len(end_at) == 1 and _WAKE in end_at):
            return starts  # nothing runs: a wake-up alone would find nothing to take
        t, k = heapq.heappop(ends)
        del end_at[k]
        if k != _WAKE:
            sim.depart(k)


def _preempt(
    sim: _ReplaySim,
    t: float,
    end_at: dict[int, float],
    ends: list[tuple[float, int]],
    rng: np.random.Generator,
    exits: tuple[float, ...],
) -> None:
    """Let the pass's waiting requests preempt: move each victim's end within its grace; wake when a grant comes of age."""
    for v in sim.preempt(t):
        grace = sim.rules.grace_of(sim.running[v][0]) if sim.rules is not None else 0.0
        took = exits[int(rng.integers(len(exits)))] if exits else float(rng.uniform(0.0, grace))
        end_at[v] = min(end_at[v], t + min(took, grace))
        heapq.heappush(ends, (end_at[v], v))
    if sim.wake_at < end_at.get(_WAKE, math.inf):
        end_at[_WAKE] = sim.wake_at
        heapq.heappush(ends, (sim.wake_at, _WAKE))


def _adopt(
    sim: _ReplaySim,
    now: float,
    running: Sequence[Running],
    waiting: Sequence[Waiting],
    rng: np.random.Generator,
) -> dict[int, float]:
    """Put the running grants on the replay's nodes; return when each ends (drawn, or by its preemption deadline)."""
    replay_id = {w.reservation_id: str(j) for j, w in enumerate(waiting)}
    end_at: dict[int, float] = {}
    for k, grant in enumerate(running):
        key = -(k + 1)
        sim.adopt(key, grant.request, grant.assignment)
        end_at[key] = now + grant.remaining.draw(rng)
        if grant.granted_at is not None:
            sim.facts[key] = (grant.granted_at, grant.checkpoint_at, grant.on_headroom_loan)
        if grant.ends_by is not None:  # told already: it passes its slice on by its deadline
            end_at[key] = min(end_at[key], max(grant.ends_by, now))
            sim.told.add(key)
            if grant.preempted_for in replay_id:
                sim.pending.setdefault(replay_id[grant.preempted_for], set()).add(key)
    return end_at
