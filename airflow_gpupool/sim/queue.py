"""Queue mode: arrivals and departures over time, served by the ledger's queue rule.

Pod shapes and durations (``deletion_time − creation_time``, capped at 24 h) come from the
trace; arrivals are Poisson, at the rate that offers ``load`` × the cluster's GPU capacity.
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
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from airflow_gpupool.placement.policy import get_policy
from airflow_gpupool.placement.queue import QueueEntry, serve
from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuKind, GpuRequest
from airflow_gpupool.sim.replay import ClusterFrag, quick, take, trace_shapes
from airflow_gpupool.sim.trace import TracePod

QUEUE_BASELINE = "airflow-pool"
MAX_DURATION_S = 24 * 3600
#: Overtakes a blocked request tolerates in the project's queue (the ledger's default).
MAX_OVERTAKES = 8


def give(node: NodeState, request: GpuRequest, assignment: Assignment) -> NodeState:
    """Return ``node`` with the assignment's capacity given back."""
    taken = set(assignment.gpu_indices)
    gpus = tuple(
        replace(
            g,
            free_milli=g.free_milli + assignment.milli_per_gpu,
            free_memory_mib=min(g.free_memory_mib + assignment.gpu_memory_mib, g.memory_mib),
        )
        if g.index in taken
        else g
        for g in node.gpus
    )
    return replace(
        node, gpus=gpus, cpu_free=node.cpu_free + request.cpu_milli, memory_free=node.memory_free + request.memory_mib
    )


def whole_slots(request: GpuRequest) -> GpuRequest:
    """Return the request an Airflow pool sees: a fraction rounded up to one whole GPU."""
    if request.kind is GpuKind.FRACTION:
        return replace(request, gpu_milli=None, gpu_memory_mib=None, gpus=1)
    return request


def _workload(pods: Sequence[TracePod]) -> tuple[list[TracePod], np.ndarray]:
    usable = [
        p
        for p in pods
        if p.creation_time is not None and p.deletion_time is not None and p.deletion_time > p.creation_time
    ]
    durations = np.array(
        [min(int(p.deletion_time or 0) - int(p.creation_time or 0), MAX_DURATION_S) for p in usable], dtype=np.float64
    )
    return usable, durations


def simulate_queue(
    nodes: Sequence[NodeState],
    pods: Sequence[TracePod],
    policy: str,
    *,
    load: float = 1.0,
    seed: int = 42,
    sample_nodes: int = 100,
    arrivals: int = 6000,
    max_overtakes: int = MAX_OVERTAKES,
    progress: Callable[[float], None] | None = None,
) -> dict[str, Any]:
    """Simulate the queue and return mean and p99 wait, mean allocation and fragmentation.

    :param nodes: the cluster
    :param pods: the trace (needs ``creation_time`` and ``deletion_time``)
    :param policy: a placement policy, or ``airflow-pool`` for the baseline
    :param load: offered GPU load as a share of the capacity
    :param seed: node sample, arrival and tie-break seed
    :param sample_nodes: nodes sampled from the cluster (0: all)
    :param arrivals: number of arrivals
    :param max_overtakes: no-starvation bound of the project's queue
    :param progress: called with the fraction done, now and then
    """
    rng = np.random.default_rng(seed)
    if 0 < sample_nodes < len(nodes):
        nodes = [nodes[int(i)] for i in sorted(rng.choice(len(nodes), sample_nodes, replace=False))]
    usable, durations = _workload(pods)
    if not usable:
        raise ValueError("queue mode needs pods with creation_time < deletion_time")
    capacity = ClusterSnapshot(tuple(nodes)).gpu_capacity_milli
    work = np.array([p.gpu_milli for p in usable]) * durations
    rate = load * capacity / work.mean()
    times = np.cumsum(rng.exponential(1 / rate, arrivals))
    picks = rng.integers(len(usable), size=arrivals)
    baseline = policy == QUEUE_BASELINE
    shapes = trace_shapes(usable)
    engine = get_policy("spread" if baseline else policy, seed=seed, typical_shapes=shapes)
    sim = _QueueSim(list(nodes), quick(engine), shapes, 10**9 if baseline else max_overtakes)
    horizon = float(times[-1])
    warm = 0.2 * horizon
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
        else:
            sim.depart(k)
        for started in sim.serve(now):
            heapq.heappush(events, (now + float(durations[int(picks[started])]), 0, started))
        if progress is not None and kind == 1 and k % 500 == 0:
            progress(k / arrivals)
    waits = sim.waits(horizon, times, warm)
    span = max(horizon - warm, 1e-9)
    return {
        "policy": policy,
        "load": load,
        "seed": seed,
        "nodes": len(nodes),
        "arrivals": arrivals,
        "mean_wait_s": round(float(waits.mean()), 1),
        "p99_wait_s": round(float(np.percentile(waits, 99)), 1),
        "mean_alloc": round(sim.alloc_area / span * 100 / capacity, 2),
        "frag_mean": round(float(np.mean(sim.frag_samples)) if sim.frag_samples else 0.0, 2),
    }


class _QueueSim:
    """State of one queue simulation: nodes, waiting and running requests, accumulators."""

    def __init__(self, nodes: list[NodeState], place: Callable[..., Any], shapes: Any, max_overtakes: int) -> None:
        self.nodes = nodes
        self.where = {n.name: i for i, n in enumerate(nodes)}
        self.place = place
        self.max_overtakes = max_overtakes
        self.waiting: dict[str, QueueEntry] = {}
        self.arrived_at: dict[int, float] = {}
        self.started_at: dict[int, float] = {}
        self.running: dict[int, tuple[GpuRequest, Assignment, int]] = {}
        self.useful: dict[int, int] = {}
        self.allocated = 0
        self.alloc_area = 0.0
        self.last = 0.0
        self.meter = ClusterFrag(shapes)
        self.frag_samples: list[float] = []
        self._events = 0

    def advance(self, now: float, warm: float) -> None:
        if now > warm:
            self.alloc_area += self.allocated * (now - max(self.last, warm))
        self.last = now
        self._events += 1
        if now > warm and self._events % 25 == 0:
            self.frag_samples.append(self.meter.percent(ClusterSnapshot(tuple(self.nodes))))

    def arrive(self, k: int, request: GpuRequest, now: float, useful: int) -> None:
        self.waiting[str(k)] = QueueEntry(str(k), request, k)
        self.arrived_at[k] = now
        self.useful[k] = useful

    def depart(self, k: int) -> None:
        request, assignment, i = self.running.pop(k)
        self.nodes[i] = give(self.nodes[i], request, assignment)
        self.allocated -= self.useful[k]

    def serve(self, now: float) -> list[int]:
        if not self.waiting:
            return []
        failed: set[tuple[Any, ...]] = set()

        def try_place(entry: QueueEntry) -> Assignment | None:
            r = entry.request
            key = (r.cpu_milli, r.memory_mib, r.gpus, r.gpu_milli, r.gpu_models)
            if key in failed:
                return None  # capacity only shrinks during a pass
            verdict = self.place(ClusterSnapshot(tuple(self.nodes)), r)
            if not isinstance(verdict, Assignment):
                failed.add(key)
                return None
            i = self.where[verdict.node]
            self.nodes[i] = take(self.nodes[i], r, verdict)
            return verdict

        outcome = serve(self.waiting.values(), try_place, self.max_overtakes)
        started = []
        for entry, assignment in outcome.granted:
            k = entry.seq
            del self.waiting[entry.request_id]
            self.running[k] = (entry.request, assignment, self.where[assignment.node])
            self.started_at[k] = now
            self.allocated += self.useful[k]
            started.append(k)
        for rid, count in outcome.overtakes.items():
            self.waiting[rid] = replace(self.waiting[rid], overtakes=count)
        return started

    def waits(self, horizon: float, times: np.ndarray, warm: float) -> np.ndarray:
        out = [
            self.started_at.get(k, horizon) - t for k, t in self.arrived_at.items() if t >= warm
        ]
        return np.asarray(out or [0.0])
