"""The FGD protocol: pods arrive one by one, each placed once or failed, nothing departs.

Pods are shuffled with the seed, then random resamples are appended until the requested GPU
milli reaches ``ratio`` (1.3) times the cluster's capacity. After each arrival, allocation
% is the allocated GPU milli over the capacity and arrived % the requested GPU milli so far
(failed pods included) over the capacity; allocation at ``x`` % arrived is the mean over
the arrivals whose rounded arrived % is ``x``.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

from airflow_gpupool.exceptions import SimulationError
from airflow_gpupool.placement.accounting import allocate
from airflow_gpupool.placement.frag import Fragmentation, TypicalShape, shape_key, typical_shapes
from airflow_gpupool.placement.policy import PlacementPolicy, get_policy
from airflow_gpupool.placement.scored import ScoredPolicy
from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState
from airflow_gpupool.placement.table import NodeTable
from airflow_gpupool.placement.verdict import Assignment, Verdict
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.sim.trace import TracePod

#: Arrived percentages reported.
REPORT_POINTS = (50, 80, 90, 95, 100, 110, 120, 130)


@dataclass
class ReplayResult:
    """Outcome of one replay.

    :param policy: the policy name
    :param seed: the seed
    :param pods: pods that arrived
    :param failed: pods that did not fit
    :param arrived: arrived % after each arrival
    :param alloc: allocation % after each arrival
    :param frag: cluster fragmentation % when arrived % first reached each report point
    :param seconds: wall time of the replay
    :param decision_ms: duration of each placement decision (wall clock)
    :param decision_cpu_ms: CPU time of each decision (the thread's own: on shared cores the
        wall clock also counts the time the OS gave other processes, a few ms at a time)
    :param nodes: the cluster at the end of the run
    :param prefer_placed: pods marked by a :class:`Preference` that were placed
    :param prefer_met: of those, the ones placed on a node with the preferred label
    """

    policy: str
    seed: int
    pods: int
    failed: int
    arrived: np.ndarray
    alloc: np.ndarray
    frag: dict[int, float] = field(default_factory=dict)
    seconds: float = 0.0
    decision_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    decision_cpu_ms: np.ndarray = field(default_factory=lambda: np.zeros(0))
    nodes: tuple[NodeState, ...] = ()
    prefer_placed: int = 0
    prefer_met: int = 0

    def alloc_at(self, percent: int) -> float | None:
        """Mean allocation % over the arrivals whose rounded arrived % is ``percent``.

        :return: None when the trace never reaches that point (a small trace, a big cluster)
        """
        mask = np.floor(self.arrived + 0.5) == percent
        return float(self.alloc[mask].mean()) if mask.any() else None

    def frag_at(self, percent: int) -> float | None:
        """Cluster fragmentation % when arrived % first reached ``percent`` (None: never reached)."""
        return self.frag.get(percent)

    def last_point(self) -> int | None:
        """The highest report point the run reached, or None."""
        reached = [p for p in REPORT_POINTS if self.alloc_at(p) is not None]
        return reached[-1] if reached else None

    def summary(self) -> dict[str, object]:
        """Return the figures of the run as JSON-ready values."""
        ms = self.decision_ms if len(self.decision_ms) else np.zeros(1)
        out: dict[str, object] = {
            "policy": self.policy,
            "seed": self.seed,
            "pods": self.pods,
            "failed": self.failed,
        }
        # A point the run never reached is None (JSON null), never NaN, which is not JSON.
        for p in REPORT_POINTS:
            out[f"alloc_{p}"] = _rounded(self.alloc_at(p))
        for p in REPORT_POINTS:
            out[f"frag_{p}"] = _rounded(self.frag_at(p))
        out["seconds"] = round(self.seconds, 3)
        out["decision_ms_p50"] = round(float(np.percentile(ms, 50)), 4)
        out["decision_ms_p99"] = round(float(np.percentile(ms, 99)), 4)
        cpu = self.decision_cpu_ms if len(self.decision_cpu_ms) else np.zeros(1)
        out["decision_cpu_ms_p50"] = round(float(np.percentile(cpu, 50)), 4)
        out["decision_cpu_ms_p99"] = round(float(np.percentile(cpu, 99)), 4)
        out["prefer_placed"] = self.prefer_placed
        out["prefer_met_pct"] = (
            round(self.prefer_met * 100 / self.prefer_placed, 2) if self.prefer_placed else None
        )
        return out


@dataclass(frozen=True)
class Preference:
    """Soft node preferences in a replay: how often ``prefer_node_labels`` is met, at what cost.

    A seeded ``node_share`` of the nodes carries ``label`` (say a local NVMe cache) and a
    seeded ``pod_share`` of the arrivals is *marked*; with ``apply`` the marked pods ask for
    the label as ``prefer_node_labels``, without it they ask nothing and the run measures how
    often they land on such a node anyway (the baseline). Nodes and marks depend on the seed
    only, so the two runs mark the same pods.

    :raises SimulationError: a share outside [0, 1]
    """

    pod_share: float
    node_share: float = 0.25
    label: tuple[str, str] = ("gpupool.io/local-nvme", "true")
    apply: bool = True

    def __post_init__(self) -> None:
        for name in ("pod_share", "node_share"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise SimulationError(name, value, "a share between 0 and 1")

    def label_nodes(self, nodes: Sequence[NodeState], seed: int) -> tuple[list[NodeState], set[int]]:
        """Return the nodes with the label added to a seeded share of them, and those positions."""
        rng = np.random.default_rng([seed, 1])
        chosen = set(rng.permutation(len(nodes))[: round(self.node_share * len(nodes))].tolist())
        out = [replace(n, labels=(*n.labels, self.label)) if i in chosen else n for i, n in enumerate(nodes)]
        return out, chosen

    def marks(self, count: int, seed: int) -> np.ndarray:
        """Return which of ``count`` arrivals are marked."""
        marked: np.ndarray = np.random.default_rng([seed, 2]).random(count) < self.pod_share
        return marked


def scale_cluster(
    nodes: Sequence[NodeState], pods: Sequence[TracePod], k: int
) -> tuple[tuple[NodeState, ...], list[TracePod]]:
    """Return the cluster replicated ``k`` times (nodes ``<name>-r<i>``) and the pods to match.

    The pod list is repeated ``k`` times, so the shapes keep their frequencies and the FGD
    protocol asks for 1.3 × the larger capacity from the same mix.

    :raises SimulationError: ``k`` is not a positive integer
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise SimulationError("--scale", k, "a positive whole number of copies of the cluster")
    if k == 1:
        return tuple(nodes), list(pods)
    copies = tuple(replace(n, name=f"{n.name}-r{i}") for i in range(k) for n in nodes)
    return copies, [p for _ in range(k) for p in pods]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def trace_shapes(pods: Sequence[TracePod], coverage: float = 0.95) -> tuple[TypicalShape, ...]:
    """Return the typical shapes of a trace: the most frequent covering ``coverage`` of it."""
    return typical_shapes(Counter(shape_key(p.request) for p in pods), coverage)


def workload(pods: Sequence[TracePod], capacity_milli: int, seed: int, ratio: float = 1.3) -> list[TracePod]:
    """Shuffle ``pods`` and resample them until they ask for ``ratio`` × the capacity.

    :param pods: the trace's pods
    :param capacity_milli: the cluster's GPU capacity
    :param seed: shuffle and resample seed
    :param ratio: requested GPU milli to reach, as a multiple of the capacity
    """
    rng = np.random.default_rng(seed)
    target = ratio * capacity_milli
    out: list[TracePod] = []
    total = 0
    for k in rng.permutation(len(pods)):
        if total >= target:
            return out
        out.append(pods[int(k)])
        total += pods[int(k)].gpu_milli
    if not any(p.gpu_milli for p in pods):
        return out
    while total < target:
        pod = pods[int(rng.integers(len(pods)))]
        out.append(pod)
        total += pod.gpu_milli
    return out


class ClusterFrag:
    """Cluster fragmentation % for a fixed set of typical shapes, kept incrementally."""

    def __init__(self, shapes: Sequence[TypicalShape]) -> None:
        self.table = NodeTable()
        self.frag = Fragmentation(shapes)

    def percent(self, snapshot: ClusterSnapshot) -> float:
        """Return Σ node fragmentation / GPU capacity, in %."""
        self.frag.refresh(self.table, self.table.sync(snapshot))
        capacity = snapshot.gpu_capacity_milli or 1
        return (
            float(self.frag.value.sum()) / self.frag.weight_total * 100 / capacity
            if self.frag.shapes
            else 0.0
        )


def replay(
    nodes: Sequence[NodeState],
    pods: Sequence[TracePod],
    policy: str,
    seed: int = 42,
    *,
    ratio: float = 1.3,
    shapes: Sequence[TypicalShape] | None = None,
    progress: Callable[[float], None] | None = None,
    prefer: Preference | None = None,
) -> ReplayResult:
    """Replay ``pods`` on ``nodes`` with ``policy`` under the FGD protocol.

    :param nodes: the cluster, every GPU free
    :param pods: the trace (typical shapes are derived from it unless given)
    :param policy: a registered policy name
    :param seed: workload shuffle seed and tie-break seed of the policy
    :param ratio: arrived GPU milli to reach, as a multiple of the capacity
    :param shapes: typical shapes (default: those of ``pods``)
    :param progress: called with the fraction done, now and then
    :param prefer: soft node preferences to measure (default: none)
    :raises SimulationError: ``ratio`` is not positive
    """
    if not ratio > 0:
        raise SimulationError("ratio", ratio, "a positive multiple of the cluster's GPU capacity")
    shapes = tuple(shapes) if shapes is not None else trace_shapes(pods)
    engine = get_policy(policy, typical_shapes=shapes, seed=seed)
    place = quick(engine)
    current = list(nodes)
    labeled: set[int] = set()
    if prefer is not None:
        current, labeled = prefer.label_nodes(current, seed)
    where = {n.name: i for i, n in enumerate(current)}
    capacity = ClusterSnapshot(tuple(current)).gpu_capacity_milli
    arrivals = workload(pods, capacity, seed, ratio)
    marked = prefer.marks(len(arrivals), seed) if prefer is not None else np.zeros(len(arrivals), dtype=bool)
    prefer_placed = prefer_met = 0
    arrived = np.zeros(len(arrivals))
    alloc = np.zeros(len(arrivals))
    ms = np.zeros(len(arrivals))
    cpu_ms = np.zeros(len(arrivals))
    meter = ClusterFrag(shapes)
    frag: dict[int, float] = {}
    points = list(REPORT_POINTS)
    asked = allocated = failed = 0
    start = time.perf_counter()
    snapshot = ClusterSnapshot(tuple(current))
    for k, pod in enumerate(arrivals):
        request = pod.request
        if marked[k] and prefer is not None and prefer.apply:
            request = replace(request, prefer_node_labels=(prefer.label,))
        t0, c0 = time.perf_counter(), time.thread_time()
        verdict = place(snapshot, request)
        ms[k] = (time.perf_counter() - t0) * 1000
        cpu_ms[k] = (time.thread_time() - c0) * 1000
        asked += pod.gpu_milli
        if isinstance(verdict, Assignment):
            i = where[verdict.node]
            current[i] = allocate(current[i], request, verdict)
            # One node changed: the next snapshot says so (see ClusterSnapshot.derive).
            snapshot = snapshot.derive(tuple(current), (i,))
            allocated += pod.gpu_milli
            if marked[k]:
                prefer_placed += 1
                prefer_met += i in labeled
        else:
            failed += 1
        arrived[k] = asked * 100 / capacity
        alloc[k] = allocated * 100 / capacity
        while points and arrived[k] >= points[0]:
            frag[points.pop(0)] = meter.percent(snapshot)
        if progress is not None and k % 500 == 0:
            progress(k / len(arrivals))
    seconds = time.perf_counter() - start
    return ReplayResult(
        policy,
        seed,
        len(arrivals),
        failed,
        arrived,
        alloc,
        frag,
        seconds,
        ms,
        cpu_ms,
        tuple(current),
        prefer_placed,
        prefer_met,
    )


def where_lost(nodes: Sequence[NodeState], cpu_short_milli: int = 4000, top: int = 8) -> dict[str, object]:
    """Break the unallocated GPU capacity of a cluster down, in % of its GPU capacity.

    :param nodes: the cluster (e.g. :attr:`ReplayResult.nodes` at the end of a run)
    :param cpu_short_milli: a node with less free CPU than this counts as CPU-exhausted
    :param top: how many free-milli values of partly used GPUs to list
    :return: ``unallocated``, ``whole_free`` (entirely free GPUs), ``slivers`` (free milli of
        partly used GPUs), ``on_cpu_exhausted`` (free milli on CPU-exhausted nodes, either
        kind) and ``sliver_values``: ``[free milli, GPUs, %]`` of the largest sliver sizes
    """
    capacity = sum(len(n.gpus) for n in nodes) * 1000 or 1
    whole = sliver = cpu_short = 0
    sizes: Counter[int] = Counter()
    for n in nodes:
        for g in n.gpus:
            if g.partitioned or g.free_milli <= 0:
                continue
            if g.free_milli >= 1000:
                whole += g.free_milli
            else:
                sliver += g.free_milli
                sizes[g.free_milli] += 1
            if n.cpu_free < cpu_short_milli:
                cpu_short += g.free_milli
    pct = 100 / capacity
    ranked = sorted(sizes.items(), key=lambda kv: -kv[0] * kv[1])[:top]
    return {
        "unallocated": round((whole + sliver) * pct, 3),
        "whole_free": round(whole * pct, 3),
        "slivers": round(sliver * pct, 3),
        "on_cpu_exhausted": round(cpu_short * pct, 3),
        "sliver_values": [[m, k, round(m * k * pct, 3)] for m, k in ranked],
    }


def quick(policy: PlacementPolicy) -> Callable[[ClusterSnapshot, GpuRequest], Verdict]:
    """Return the policy's ``place``, without NoFit explanations when it can skip them."""
    if isinstance(policy, ScoredPolicy):
        return partial(policy.place, explain_no_fit=False)
    return policy.place


def stderr_progress(label: str) -> Callable[[float], None]:
    """Return a progress callback that redraws ``label NN%`` on stderr."""

    def show(done: float) -> None:
        sys.stderr.write(f"\r{label} {done * 100:3.0f}%")
        sys.stderr.flush()

    return show
