"""The engine every built-in policy runs on: candidates, vectorized costs, seeded ties.

A policy only says how much each candidate costs (:meth:`ScoredPolicy.costs`); this module
finds the candidates (every node and, for a fraction, every GPU the request fits, with
exactly the rules of :mod:`~airflow_gpupool.placement.fit`), picks the cheapest, breaks
ties between nodes by a fixed seeded random order of nodes, and explains a ``NoFit``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from airflow_gpupool.placement.explain import explain
from airflow_gpupool.placement.fast import FewScorer, NodeClasses, ShapeCache, pick
from airflow_gpupool.placement.fit import EXCLUSIVE_CLASSES, fraction_memory
from airflow_gpupool.placement.scalar import whole_gpu_takes
from airflow_gpupool.placement.snapshot import ClusterSnapshot
from airflow_gpupool.placement.table import NodeTable, seeded_rank
from airflow_gpupool.placement.verdict import Assignment, NoFit, Verdict
from airflow_gpupool.resources import MIG_PROFILES, MILLI_PER_GPU, GpuKind, GpuRequest, WorkloadClass


@dataclass(frozen=True)
class Candidates:
    """Feasible placements of one request, as parallel arrays.

    :param node: node row of each candidate
    :param gpu: GPU column a fraction or MIG slice takes (-1 for whole GPUs or none)
    :param kind: the request's GPU kind
    :param milli: milli taken on the one GPU of a fraction (0 otherwise)
    :param whole: number of whole GPUs taken
    :param cpu: CPU taken
    :param memory: memory taken
    :param mig: MIG slice id per candidate (MIG requests only)
    """

    node: np.ndarray
    gpu: np.ndarray
    kind: GpuKind
    milli: int
    whole: int
    cpu: int
    memory: int
    mig: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.node)

    @property
    def gpu_milli(self) -> int:
        """Unpartitioned GPU milli the request takes in total (0 for a MIG slice)."""
        if self.kind is GpuKind.MIG:
            return 0
        return self.milli + self.whole * MILLI_PER_GPU


def first_per_free_value(table: NodeTable, cand: Candidates) -> Candidates:
    """Keep, of the GPUs of a node with equal free milli, only the first (lowest position).

    Such GPUs are interchangeable for any score that reads GPU capacity, and every policy
    breaks a tie inside a node by the lowest position, so dropping the others loses nothing.
    """
    if cand.kind is not GpuKind.FRACTION or len(cand) < 2:
        return cand
    key = cand.node * (2 * MILLI_PER_GPU + 1) + table.gpu_free[cand.node, cand.gpu]
    _, first = np.unique(key, return_index=True)
    first.sort()
    return replace(cand, node=cand.node[first], gpu=cand.gpu[first])


def _class_ok(table: NodeTable, request: GpuRequest, rows: Any) -> np.ndarray | bool:
    conflicting = EXCLUSIVE_CLASSES.get(request.workload_class.value)
    ok: np.ndarray
    if conflicting == WorkloadClass.TRAINING.value:
        ok = ~table.training[rows]
        return ok
    if conflicting == WorkloadClass.INFERENCE.value:
        ok = ~table.inference[rows]
        return ok
    return True


def _node_ok(table: NodeTable, request: GpuRequest, rows: Any, base: np.ndarray) -> np.ndarray:
    ok: np.ndarray = (
        table.schedulable[rows]
        & (table.cpu_free[rows] >= request.cpu_milli)
        & (table.mem_free[rows] >= request.memory_mib)
    )
    ok &= _class_ok(table, request, rows)
    if request.node_labels:
        want = set(request.node_labels)
        nodes = table.nodes
        ok &= np.fromiter((want.issubset(nodes[i].labels) for i in base), dtype=bool, count=len(base))
    return ok


def _gpu_ok(table: NodeTable, request: GpuRequest, rows: Any = slice(None)) -> np.ndarray:
    ok: np.ndarray = table.gpu_model[rows] >= 0
    if request.gpu_models:
        ok &= table.allowed_models(request.gpu_models)[table.gpu_model[rows]]
    return ok


def find_candidates(table: NodeTable, request: GpuRequest, rows: np.ndarray | None = None) -> Candidates:
    """Return every feasible placement of ``request`` on the synced ``table``.

    :param rows: look at these node rows only (default: all); candidates name table rows
    """
    base = np.arange(table.size) if rows is None else rows
    at: Any = slice(None) if rows is None else rows
    ok = _node_ok(table, request, at, base)
    kind = request.kind
    cpu, mem = request.cpu_milli, request.memory_mib
    if kind is GpuKind.NONE:
        found = base[np.flatnonzero(ok)]
        return Candidates(found, np.full(len(found), -1), kind, 0, 0, cpu, mem)
    if kind is GpuKind.MIG:
        return _mig_candidates(table, request, base[np.flatnonzero(ok & table.has_mig[at])])
    usable = _gpu_ok(table, request, at) & ok[:, None]
    need = request.gpu_memory_mib
    gpu_free = table.gpu_free[at]
    if kind is GpuKind.WHOLE:
        usable &= gpu_free == MILLI_PER_GPU
        if need is not None:
            usable &= table.gpu_mem_cap[at] >= need
        found = base[np.flatnonzero(usable.sum(axis=1) >= request.gpus)]
        return Candidates(found, np.full(len(found), -1), kind, 0, request.gpus, cpu, mem)
    milli = int(request.gpu_milli or 0)
    usable &= gpu_free >= milli
    mem_free, mem_cap = table.gpu_mem_free[at], table.gpu_mem_cap[at]
    if need is None:
        usable &= mem_free >= milli * mem_cap // MILLI_PER_GPU
    else:
        usable &= (mem_free >= need) & (mem_cap >= need)
    local, cols = np.nonzero(usable)
    return Candidates(base[local], cols, kind, milli, 0, cpu, mem)


def _mig_candidates(table: NodeTable, request: GpuRequest, nodes: np.ndarray) -> Candidates:
    profile = str(request.mig_profile)
    rows: list[int] = []
    cols: list[int] = []
    slices: list[str] = []
    for i in nodes:
        for j, gpu in enumerate(table.nodes[i].gpus):
            if request.gpu_models and gpu.model not in request.gpu_models:
                continue
            slice_id = next((s for s, p in gpu.mig_free if p == profile), None)
            if slice_id is not None:
                rows.append(int(i))
                cols.append(j)
                slices.append(slice_id)
    milli = MIG_PROFILES[profile].milli
    return Candidates(
        np.asarray(rows, dtype=np.int64),
        np.asarray(cols, dtype=np.int64),
        GpuKind.MIG,
        milli,
        0,
        request.cpu_milli,
        request.memory_mib,
        tuple(slices),
    )


def preferred(table: NodeTable, request: GpuRequest, rows: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """Return those of ``keep`` whose node (``rows``, in step) carries the request's preferred labels.

    All of ``keep`` when none does: a preference only orders nodes the policy scores equally well,
    it never turns a request away.
    """
    want = set(request.prefer_node_labels)
    if not want:
        return keep
    nodes = table.nodes
    match = np.fromiter((want.issubset(nodes[int(i)].labels) for i in rows), dtype=bool, count=len(rows))
    return keep[match] if match.any() else keep


class ScoredPolicy:
    """Base of the built-in policies: the lowest cost wins, ties go to the seeded node order.

    :param seed: seed of the node order that breaks ties (and of any randomness)
    """

    name = "scored"
    #: Whether :meth:`place` takes the fast path (:mod:`~airflow_gpupool.placement.fast`) by default.
    fast_default = False

    def __init__(
        self, *, seed: int = 0, typical_shapes: Any = None, fast: bool | None = None, **options: Any
    ) -> None:
        # typical_shapes is accepted by every policy so callers can pass one option set.
        del typical_shapes
        if options:
            raise TypeError(f"{self.name}: unknown options {sorted(options)}")
        self.seed = int(seed)
        self.table = NodeTable()
        self._rank = np.zeros(0, dtype=np.int64)
        self.fast = self.fast_default if fast is None else bool(fast)
        self._shapes = ShapeCache()
        self._classes = NodeClasses()
        # The table and caches are updated in place by each call: one policy serves one ledger's
        # threads (a triggerer's explain next to its reserves), one call at a time.
        self._lock = threading.Lock()

    def sync(self, snapshot: ClusterSnapshot) -> np.ndarray | None:
        """Update the table (and the subclass's per-node state); return the rows changed."""
        changed = self.table.sync(snapshot)
        if len(self._rank) != self.table.size:
            self._rank = seeded_rank(self.table.size, self.seed)
        return changed

    def costs(self, request: GpuRequest, cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(primary, secondary)`` costs of each candidate; lower is better.

        The primary cost picks the node (ties: seeded node order), the secondary one the
        GPU inside it (ties: lowest GPU position).
        """
        raise NotImplementedError

    def place(
        self, snapshot: ClusterSnapshot, request: GpuRequest, *, explain_no_fit: bool = True
    ) -> Verdict:
        """Return the cheapest assignment, or a NoFit with sorted reasons.

        :param snapshot: the cluster now
        :param request: what to place
        :param explain_no_fit: build the NoFit reasons (a scan of every node); the
            simulator turns it off for speed
        """
        with self._lock:
            changed = self.sync(snapshot)
            if self.fast:
                return self._place_fast(snapshot, request, changed, explain_no_fit)
            cand = find_candidates(self.table, request)
            if len(cand) == 0:
                return explain(snapshot, request) if explain_no_fit else NoFit(())
            cand = self.reduce(cand)
            primary, secondary = self.costs(request, cand)
            pick = self._select(cand, primary, secondary, request)
            return self._assignment(request, cand, pick, float(primary[pick]))

    def few_rows(self, request: GpuRequest) -> FewScorer | None:
        """Return a scorer of a few rows without numpy for ``request``, or None (the default)."""
        del request
        return None

    def reduce(self, cand: Candidates) -> Candidates:
        """Return the candidates worth scoring (default: all of them)."""
        return cand

    def _score_rows(
        self, request: GpuRequest, rows: np.ndarray | None
    ) -> tuple[Candidates, np.ndarray, np.ndarray]:
        cand = find_candidates(self.table, request, rows)
        if len(cand) == 0:
            return cand, np.zeros(0), np.zeros(0)
        cand = self.reduce(cand)
        primary, secondary = self.costs(request, cand)
        return cand, primary, secondary

    def _place_fast(
        self, snapshot: ClusterSnapshot, request: GpuRequest, changed: np.ndarray | None, explain_no_fit: bool
    ) -> Verdict:
        """Place as :meth:`place` does, rescoring only the nodes changed since the shape's last decision."""
        self._shapes.note(changed, self.table.size)
        self._classes.note(self.table.nodes, changed)
        best = self._shapes.best(request, self._score_rows, self._classes, self.few_rows(request))
        prefer = (
            (lambda rows: preferred(self.table, request, rows, rows)) if request.prefer_node_labels else None
        )
        row = pick(best, self._rank, prefer)
        if row is None:
            return explain(snapshot, request) if explain_no_fit else NoFit(())
        mig = best.mig[row] if request.kind is GpuKind.MIG else ""
        return self._assign(request, row, int(best.gpu[row]), mig, float(best.primary[row]))

    def _select(
        self, cand: Candidates, primary: np.ndarray, secondary: np.ndarray, request: GpuRequest | None = None
    ) -> int:
        best = np.flatnonzero(primary == primary.min())
        if request is not None and request.prefer_node_labels and len(best) > 1:
            best = preferred(self.table, request, cand.node[best], best)
        if len(best) == 1:
            return int(best[0])
        rank = self._rank[cand.node[best]]
        best = best[rank == rank.min()]
        if len(best) == 1:
            return int(best[0])
        sec = secondary[best]
        best = best[sec == sec.min()]
        return int(best[np.argmin(cand.gpu[best])])

    def _assignment(self, request: GpuRequest, cand: Candidates, k: int, score: float) -> Assignment:
        mig = cand.mig[k] if cand.kind is GpuKind.MIG else ""
        return self._assign(request, int(cand.node[k]), int(cand.gpu[k]), mig, score)

    def _assign(self, request: GpuRequest, i: int, gpu_col: int, mig: str, score: float) -> Assignment:
        """Return the assignment of ``request`` on row ``i`` (GPU column or MIG slice where one is taken)."""
        node = self.table.nodes[i]
        kind = request.kind
        if kind is GpuKind.NONE:
            return Assignment(node.name, (), 0, 0, score=score)
        if kind is GpuKind.WHOLE:
            # The first free GPUs the request may use, as find_candidates counted them.
            taken = [g for g in node.gpus if whole_gpu_takes(g, request)][: request.gpus]
            memory = min(g.memory_mib for g in taken)
            return Assignment(node.name, tuple(g.index for g in taken), MILLI_PER_GPU, memory, score=score)
        gpu = node.gpus[gpu_col]
        if kind is GpuKind.MIG:
            profile = MIG_PROFILES[str(request.mig_profile)]
            return Assignment(
                node.name, (gpu.index,), profile.milli, profile.memory_gb * 1024, mig_slice=mig, score=score
            )
        milli = int(request.gpu_milli or 0)
        return Assignment(node.name, (gpu.index,), milli, fraction_memory(request, gpu), score=score)

    # Helpers the policies share.

    def best_fit_gpu(self, cand: Candidates) -> np.ndarray:
        """Secondary cost that takes the fullest GPU that fits (the simulator's ``best``)."""
        if cand.kind is GpuKind.FRACTION:
            free: np.ndarray = self.table.gpu_free[cand.node, cand.gpu].astype(np.float64)
            return free
        if cand.kind is GpuKind.MIG:
            return np.array(
                [len(self.table.nodes[i].gpus[j].mig_free) for i, j in zip(cand.node, cand.gpu, strict=True)],
                dtype=np.float64,
            )
        return np.zeros(len(cand))
