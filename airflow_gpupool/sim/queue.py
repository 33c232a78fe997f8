"""Queue mode: arrivals and departures over time, served by the ledger's queue rule.

Pod shapes and durations (``deletion_time − creation_time``, capped at 24 h) come from the
trace; arrivals are Poisson, at the rate that offers ``load`` × the cluster's GPU capacity
(rate × mean(GPU milli × duration) = load × capacity). A third of the GPU time is in tasks
capped at 24 h, so the run warms up for 24 h and measures the window after it only.
Priorities come from the QoS class (LS > Burstable/Guaranteed > BE). After every arrival
and departure the waiting requests are served by
:func:`airflow_gpupool.placement.queue.serve`, exactly as the ledger serves them.

``airflow-pool`` is the baseline of an Airflow pool with one slot per GPU: a fraction takes
a whole GPU, requests are served by priority then FIFO, anything that fits may start (no
starvation bound), and placement spreads (least-allocated). Allocation counts the GPU milli
the running tasks asked for, so a rounded-up slot counts only its useful part.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from airflow_gpupool.exceptions import SimulationError
from airflow_gpupool.placement.accounting import allocate, deallocate
from airflow_gpupool.placement.fit import EXCLUSIVE_CLASSES, choices
from airflow_gpupool.placement.policy import get_policy
from airflow_gpupool.placement.queue import QueueEntry, ServeOutcome, hold_node, serve
from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState
from airflow_gpupool.placement.verdict import Assignment, NoFitReason
from airflow_gpupool.resources import GpuKind, GpuRequest
from airflow_gpupool.sim.replay import ClusterFrag, quick, trace_shapes
from airflow_gpupool.sim.trace import TracePod

QUEUE_BASELINE = "airflow-pool"
MAX_DURATION_S = 24 * 3600
#: Overtakes a blocked request tolerates in the project's queue (the ledger's default).
MAX_OVERTAKES = 8


class QueueWatch(Protocol):
    """What watches a queue simulation (the forecast backtest): told of tasks, waits and ends."""

    def start(self, *, mean_run_s: float, gpus: float, warm_s: float) -> None: ...

    def label(self, k: int, task: str, team: str, workload_class: str) -> None: ...

    def ended(self, k: int, seconds: float) -> None: ...

    def waiting(
        self,
        now: float,
        sim: QueueSim,
        k: int,
        order: Callable[[], Sequence[QueueEntry]],
        run_s: Callable[[int], float],
    ) -> None:
        """After the pass of an event about request ``k``: forecast ``k``'s start if it waits."""


class NoWatch:
    """The watch of a run nobody watches: does nothing (the queue's order is never computed)."""

    def start(self, *, mean_run_s: float, gpus: float, warm_s: float) -> None:
        pass

    def label(self, k: int, task: str, team: str, workload_class: str) -> None:
        pass

    def ended(self, k: int, seconds: float) -> None:
        pass

    def waiting(
        self,
        now: float,
        sim: QueueSim,
        k: int,
        order: Callable[[], Sequence[QueueEntry]],
        run_s: Callable[[int], float],
    ) -> None:
        pass


#: The watch of a run nobody watches.
NO_WATCH = NoWatch()


def by_priority(sim: QueueSim) -> Callable[[], list[QueueEntry]]:
    """Return what lists ``sim``'s waiting requests in service order (priority, then arrival)."""
    return lambda: sorted(sim.waiting.values(), key=lambda e: (-e.request.priority, e.seq))


def check_queue_args(
    *, load: float, sample_nodes: int, arrivals: int, warmup_s: float, window_s: float, max_overtakes: int
) -> None:
    """Check the arguments of :func:`simulate_queue` before any work.

    :raises SimulationError: one is out of range, named as the ``gpupool simulate`` option
    """
    checks = (
        (
            "--load",
            load,
            load > 0 and math.isfinite(load),
            "a positive number (the offered GPU load, 1.0 = capacity)",
        ),
        ("--queue-nodes", sample_nodes, sample_nodes >= 0, "0 (all nodes) or a positive number of nodes"),
        ("--arrivals", arrivals, arrivals >= 0, "0 (as many as the hours need) or a positive count"),
        ("--warmup-hours", warmup_s / 3600, warmup_s >= 0 and math.isfinite(warmup_s), "0 or more hours"),
        ("--hours", window_s / 3600, window_s > 0 and math.isfinite(window_s), "a positive number of hours"),
        ("--max-overtakes", max_overtakes, max_overtakes >= 0, "0 or more"),
    )
    for option, value, ok, expected in checks:
        if not ok:
            raise SimulationError(option, value, expected)


def whole_slots(request: GpuRequest) -> GpuRequest:
    """Return the request an Airflow pool sees: a fraction rounded up to one whole GPU."""
    if request.kind is GpuKind.FRACTION:
        return replace(request, gpu_milli=None, gpu_memory_mib=None, gpus=1)
    return request


def usable_workload(pods: Sequence[TracePod]) -> tuple[list[TracePod], np.ndarray]:
    """Return the pods with both times, and their durations (capped at 24 h)."""
    usable = [
        p
        for p in pods
        if p.creation_time is not None and p.deletion_time is not None and p.deletion_time > p.creation_time
    ]
    durations = np.array(
        [min(int(p.deletion_time or 0) - int(p.creation_time or 0), MAX_DURATION_S) for p in usable],
        dtype=np.float64,
    )
    return usable, durations


def offered_rate(capacity_milli: int, gpu_milli: np.ndarray, durations: np.ndarray, load: float) -> float:
    """Return the arrival rate (per second) that offers ``load`` × the GPU capacity.

    Offered load = rate × E[GPU milli × duration] / capacity, so the rate is
    ``load × capacity / mean(GPU milli × duration)`` over the pods arrivals are drawn from.
    """
    work = float(np.mean(gpu_milli * durations))
    if work <= 0:
        raise SimulationError("--pods", "(trace)", "queue mode needs pods that ask for GPU time")
    return load * capacity_milli / work


def simulate_queue(
    nodes: Sequence[NodeState],
    pods: Sequence[TracePod],
    policy: str,
    *,
    load: float = 1.0,
    seed: int = 42,
    sample_nodes: int = 100,
    arrivals: int = 0,
    warmup_s: float = MAX_DURATION_S,
    window_s: float = 2 * MAX_DURATION_S,
    max_overtakes: int = MAX_OVERTAKES,
    progress: Callable[[float], None] | None = None,
    series: dict[str, Any] | None = None,
    watch: QueueWatch = NO_WATCH,
) -> dict[str, Any]:
    """Simulate the queue and return mean and p99 wait, mean allocation and fragmentation.

    Arrivals are Poisson over ``warmup_s + window_s``; everything is measured over the
    steady-state window only: allocation and fragmentation are time averages from the end
    of the warm-up to the last arrival, and waits are those of the requests that arrive in
    the window (a request still waiting at the end counts the wait so far, and is counted
    in ``still_waiting``). The warm-up defaults to the longest duration (24 h): from then on
    every task running started after the beginning, so the running set no longer depends
    on the empty start.

    :param nodes: the cluster
    :param pods: the trace (needs ``creation_time`` and ``deletion_time``)
    :param policy: a placement policy, or ``airflow-pool`` for the baseline
    :param load: offered GPU load as a share of the capacity
    :param seed: node sample, arrival and tie-break seed
    :param sample_nodes: nodes sampled from the cluster (0: all)
    :param arrivals: number of arrivals instead of the time span (0: as many as the span
        needs); the warm-up is then the first 20 % of the arrivals' span
    :param warmup_s: simulated seconds before the measured window
    :param window_s: simulated seconds measured
    :param max_overtakes: no-starvation bound of the project's queue
    :param progress: called with the fraction done, now and then
    :param series: filled, when given, with what ``--plot`` draws: ``waits`` (seconds, one per
        request of the window) and ``alloc`` (``(hours, allocation %)`` samples of the window)
    :param watch: told of every arrival (its task: the QoS class and GPU shape), every end,
        and after each event's pass which request the event was about (the forecast backtest)
    :raises SimulationError: an argument is out of range (a load of 0 offers nothing)
    """
    check_queue_args(
        load=load,
        sample_nodes=sample_nodes,
        arrivals=arrivals,
        warmup_s=warmup_s,
        window_s=window_s,
        max_overtakes=max_overtakes,
    )
    rng = np.random.default_rng(seed)
    if 0 < sample_nodes < len(nodes):
        nodes = [nodes[int(i)] for i in sorted(rng.choice(len(nodes), sample_nodes, replace=False))]
    usable, durations = usable_workload(pods)
    if not usable:
        raise SimulationError("--pods", "(trace)", "queue mode needs pods with creation_time < deletion_time")
    capacity = ClusterSnapshot(tuple(nodes)).gpu_capacity_milli
    rate = offered_rate(capacity, np.array([p.gpu_milli for p in usable], dtype=np.float64), durations, load)
    if arrivals <= 0:
        arrivals = max(int(rate * (warmup_s + window_s)), 1)
        times = np.cumsum(rng.exponential(1 / rate, arrivals))
        warm = float(warmup_s)
    else:
        times = np.cumsum(rng.exponential(1 / rate, arrivals))
        warm = 0.2 * float(times[-1])
    picks = rng.integers(len(usable), size=arrivals)
    baseline = policy == QUEUE_BASELINE
    shapes = trace_shapes(usable)
    engine = get_policy("spread" if baseline else policy, seed=seed, typical_shapes=shapes)
    sim = QueueSim(list(nodes), quick(engine), shapes, 10**9 if baseline else max_overtakes)
    horizon = float(times[-1])
    watch.start(mean_run_s=float(np.mean(durations[picks])), gpus=capacity / 1000, warm_s=min(warm, horizon))
    events: list[tuple[float, int, int]] = [(float(t), 1, k) for k, t in enumerate(times)]
    heapq.heapify(events)
    while events:
        now, kind, k = heapq.heappop(events)
        if now > horizon:
            break
        sim.advance(now, warm)
        pod = usable[int(picks[k])]
        if kind == 1:
            request = whole_slots(pod.request) if baseline else pod.request
            sim.arrive(k, request, now, pod.gpu_milli)
            watch.label(k, f"{pod.qos}:{pod.gpu_milli}", pod.qos, pod.request.workload_class.value)
        else:
            sim.depart(k)
            watch.ended(k, float(durations[int(picks[k])]))
        for started in sim.serve(now):
            heapq.heappush(events, (now + float(durations[int(picks[started])]), 0, started))
        watch.waiting(now, sim, k, by_priority(sim), lambda j: float(durations[int(picks[j])]))
        if progress is not None and kind == 1 and k % 500 == 0:
            progress(k / arrivals)
    waits = sim.waits(horizon, warm)
    span = max(horizon - warm, 1e-9)
    if series is not None:
        series["waits"] = [float(w) for w in waits]
        series["alloc"] = [(t / 3600, a * 100 / capacity) for t, a in sim.alloc_samples]
    offered = float(np.sum([usable[int(i)].gpu_milli * durations[int(i)] for i in picks])) / (
        capacity * horizon
    )
    return {
        "policy": policy,
        "load": load,
        "seed": seed,
        "nodes": len(nodes),
        "arrivals": arrivals,
        "hours": round(horizon / 3600, 1),
        "warmup_hours": round(warm / 3600, 1),
        "offered_load": round(offered, 3),
        "mean_wait_s": round(float(waits.mean()), 1),
        "p99_wait_s": round(float(np.percentile(waits, 99)), 1),
        "mean_alloc": round(sim.alloc_area / span * 100 / capacity, 2),
        "frag_mean": round(float(np.mean(sim.frag_samples)) if sim.frag_samples else 0.0, 2),
        "still_waiting": len(sim.waiting),
        "max_overtakes": None if baseline else max_overtakes,
    }


def _key(r: GpuRequest) -> tuple[Any, ...]:
    return (r.cpu_milli, r.memory_mib, r.gpus, r.gpu_milli, r.gpu_models, r.gpu_memory_mib, r.mig_profile)


class QueueSim:
    """State of one queue simulation: nodes, waiting and running requests, accumulators."""

    def __init__(
        self,
        nodes: list[NodeState],
        place: Callable[..., Any],
        shapes: Any,
        max_overtakes: int,
        empty: Sequence[NodeState] | None = None,
    ) -> None:
        self.nodes = nodes
        # What each node could ever hold: the nodes given unless they start with tasks running.
        self.empty = tuple(nodes) if empty is None else tuple(empty)
        self.eligible: dict[tuple[Any, ...], list[int]] = {}
        self.where = {n.name: i for i, n in enumerate(nodes)}
        self.place = place
        self.max_overtakes = max_overtakes
        self.waiting: dict[str, QueueEntry] = {}
        self.arrived_at: dict[int, float] = {}
        self.started_at: dict[int, float] = {}
        self.running: dict[int, tuple[GpuRequest, Assignment, int]] = {}
        # Running tasks of each exclusive workload class per node, as the ledger counts them:
        # a class leaves a node with its last task.
        self.held: list[Counter[str]] = [Counter() for _ in nodes]
        self.useful: dict[int, int] = {}
        self.allocated = 0
        self.alloc_area = 0.0
        self.last = 0.0
        self.meter = ClusterFrag(shapes)
        self.frag_samples: list[float] = []
        self.alloc_samples: list[tuple[float, int]] = []
        self._events = 0
        # Shapes that did not fit in the last pass; capacity has only shrunk since unless a
        # task departed, so a pass whose new arrivals all have such shapes grants nothing.
        self.failed: set[tuple[Any, ...]] = set()
        self.fresh: set[tuple[Any, ...]] = set()
        self.freed = True

    def advance(self, now: float, warm: float) -> None:
        if now > warm:
            self.alloc_area += self.allocated * (now - max(self.last, warm))
        self.last = now
        self._events += 1
        if now > warm and self._events % 25 == 0:
            self.frag_samples.append(self.meter.percent(ClusterSnapshot(tuple(self.nodes))))
            self.alloc_samples.append((now, self.allocated))

    def arrive(
        self, k: int, request: GpuRequest, now: float, useful: int, not_before: float | None = None
    ) -> None:
        self.waiting[str(k)] = QueueEntry(str(k), request, k, not_before=not_before)
        self.fresh.add(_key(request))
        self.arrived_at[k] = now
        self.useful[k] = useful

    def adopt(self, k: int, request: GpuRequest, assignment: Assignment) -> None:
        """Record a task already running on the nodes as given (its capacity is already taken there)."""
        i = self.where[assignment.node]
        self.running[k] = (request, assignment, i)
        self.useful[k] = 0
        if request.workload_class.value in EXCLUSIVE_CLASSES:
            self.held[i][request.workload_class.value] += 1

    def depart(self, k: int) -> None:
        request, assignment, i = self.running.pop(k)
        workload = request.workload_class.value
        classes = self.nodes[i].classes
        if workload in EXCLUSIVE_CLASSES:
            self.held[i][workload] -= 1
            if self.held[i][workload] <= 0:
                classes = classes - {workload}
        self.nodes[i] = deallocate(self.nodes[i], request, assignment, classes)
        self.allocated -= self.useful[k]
        self.freed = True

    def _take(self, i: int, request: GpuRequest, assignment: Assignment) -> None:
        self.nodes[i] = allocate(self.nodes[i], request, assignment)
        if request.workload_class.value in EXCLUSIVE_CLASSES:
            self.held[i][request.workload_class.value] += 1

    def _eligible(self, request: GpuRequest) -> list[int]:
        """Return the positions of the nodes that could ever hold ``request``."""
        # Which nodes could ever hold a shape does not change: look it up once per shape.
        key = _key(request)
        eligible = self.eligible.get(key)
        if eligible is None:
            eligible = self.eligible[key] = [
                i
                for i, blank in enumerate(self.empty)
                if not isinstance(choices(blank, request), NoFitReason)
            ]
        return eligible

    def _hold(self, entry: QueueEntry, held: frozenset[str]) -> str | None:
        eligible = self._eligible(entry.request)
        return hold_node(
            [self.nodes[i] for i in eligible], [self.empty[i] for i in eligible], entry.request, held
        )

    def _snapshot(self, held: frozenset[str]) -> ClusterSnapshot:
        """Return the nodes a request may be placed on now: all but ``held``."""
        return ClusterSnapshot(
            tuple(n for n in self.nodes if n.name not in held) if held else tuple(self.nodes)
        )

    def serve(self, now: float) -> list[int]:
        if not self.waiting:
            return []
        if not self.freed and self.fresh <= self.failed:
            self.fresh.clear()
            return []  # the same pass as last time: nothing fits, no overtake changes
        failed: set[tuple[Any, ...]] = set()
        self.failed, self.fresh, self.freed = failed, set(), False

        def try_place(entry: QueueEntry, held: frozenset[str]) -> Assignment | None:
            r = entry.request
            key = _key(r)
            if key in failed:
                return None  # capacity (and the nodes left unheld) only shrink during a pass
            verdict = self.place(self._snapshot(held), r)
            if not isinstance(verdict, Assignment):
                failed.add(key)
                return None
            self._take(self.where[verdict.node], r, verdict)
            return verdict

        outcome = serve(self.waiting.values(), try_place, self.max_overtakes, self._hold, now=now)
        return self._served(outcome, now)

    def _served(self, outcome: ServeOutcome, now: float) -> list[int]:
        """Start what a pass granted, keep the overtakes it counted; return the started requests."""
        started = []
        for entry, assignment in outcome.granted:
            k = int(entry.request_id)  # its number, whatever rank a fair order gave its ``seq``
            del self.waiting[entry.request_id]
            self.running[k] = (entry.request, assignment, self.where[assignment.node])
            self.started_at[k] = now
            self.allocated += self.useful[k]
            started.append(k)
        for rid, count in outcome.overtakes.items():
            self.waiting[rid] = replace(self.waiting[rid], overtakes=count)
        return started

    def waits(self, horizon: float, warm: float) -> np.ndarray:
        out = [self.started_at.get(k, horizon) - t for k, t in self.arrived_at.items() if t >= warm]
        return np.asarray(out or [0.0])
