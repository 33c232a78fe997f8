"""The baselines of the FGD paper, as its simulator scores them, plus ``fitness``.

Each mirrors one score plugin of the FGD simulator (hkust-adsl/kubernetes-scheduler-simulator)
with its integer scores, so ties (broken by the seeded node order) fall where they fall there:

- ``random``: a uniformly random feasible node and GPU.
- ``dotprod`` (Tetris): the smallest dot product of the node's free (CPU, GPU) with the
  request, both normalized by the largest node spec.
- ``clustering``: nodes already running the same kind of GPU task first (sharing vs whole).
- ``packing``: GPUs already shared first, then partly used nodes, then idle nodes.
- ``fitness``: ``0.7 × memory match + 0.3 × GPU type compatibility``, highest first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from airflow_gpupool.placement.bestfit import MAX_SPEC_CPU, MAX_SPEC_GPU
from airflow_gpupool.placement.policy import register
from airflow_gpupool.placement.scored import Candidates, ScoredPolicy
from airflow_gpupool.resources import MILLI_PER_GPU, GpuKind, GpuRequest

_MAX_SCORE = 100


@register("random")
class RandomPolicy(ScoredPolicy):
    """A random feasible node, then a random GPU on it (seeded)."""

    name = "random"

    def __init__(self, *, seed: int = 0, **options: Any) -> None:
        super().__init__(seed=seed, **options)
        self._rng = np.random.default_rng(seed)

    def costs(self, request: GpuRequest, cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """Return a random draw per node and per GPU."""
        per_node = self._rng.random(self.table.size)
        return per_node[cand.node], self._rng.random(len(cand))


@register("dotprod")
class DotProductPolicy(ScoredPolicy):
    """Tetris' alignment score: the least aligned (smallest dot product) node first."""

    name = "dotprod"

    def costs(self, request: GpuRequest, cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """Return minus the integer score ``100 × (1 − dot/2)``, and the best-fit GPU order."""
        t = self.table
        dot = (t.cpu_free[cand.node] / MAX_SPEC_CPU) * (cand.cpu / MAX_SPEC_CPU)
        dot = dot + (t.gpu_total_free()[cand.node] / MAX_SPEC_GPU) * (cand.gpu_milli / MAX_SPEC_GPU)
        score = np.trunc(_MAX_SCORE * (1.0 - dot / 2))
        return -score, self.best_fit_gpu(cand)


@register("clustering")
class ClusteringPolicy(ScoredPolicy):
    """Keep GPU tasks of one kind together: nodes running only that kind, then mixed, idle, other.

    The simulator tags each task (shared GPU, or ``n`` whole GPUs); a snapshot has no tasks,
    so a node's tags are read off its GPUs: a partly used GPU means sharing tasks, a fully
    used one whole-GPU tasks.
    """

    name = "clustering"

    def costs(self, request: GpuRequest, cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """Return minus the four-tier clustering score, and the best-fit GPU order."""
        if cand.kind is GpuKind.NONE:
            return np.zeros(len(cand)), np.zeros(len(cand))
        g = self.table.gpu_free[cand.node]
        shared = ((g > 0) & (g < MILLI_PER_GPU)).any(axis=1)
        whole = (g == 0).any(axis=1)
        tags = shared.astype(np.int64) + whole
        same = shared if cand.kind in (GpuKind.FRACTION, GpuKind.MIG) else whole
        fill = _MAX_SCORE // 4 * (MAX_SPEC_GPU - self.table.gpu_total_free()[cand.node]) // MAX_SPEC_GPU
        tier = np.where(same, np.where(tags == 1, 3, 2), np.where(tags == 0, 1, 0))
        return -(fill + tier * (_MAX_SCORE // 4)).astype(np.float64), self.best_fit_gpu(cand)


@register("packing")
class PackingPolicy(ScoredPolicy):
    """GPU packing: share used GPUs first, then free GPUs of used nodes, then idle nodes."""

    name = "packing"

    def costs(self, request: GpuRequest, cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """Return minus the three-tier packing score, and the best-fit GPU order."""
        n = len(cand)
        if cand.kind in (GpuKind.NONE, GpuKind.MIG):
            return np.zeros(n), self.best_fit_gpu(cand)
        t = self.table
        free_whole = t.whole_free()[cand.node]
        idle = free_whole == t.gpu_count()[cand.node]
        idle_score = np.maximum(_MAX_SCORE // 3 - free_whole, free_whole)
        if cand.kind is GpuKind.WHOLE:
            used = np.full(n, max(_MAX_SCORE // 2 - cand.whole, _MAX_SCORE // 3))
        else:
            f = t.gpu_free[cand.node, cand.gpu]
            shared = np.maximum(_MAX_SCORE - (f * 100 // MILLI_PER_GPU) // 10, _MAX_SCORE // 2)
            used = np.where(f == MILLI_PER_GPU, max(_MAX_SCORE // 2 - 1, _MAX_SCORE // 3), shared)
        score = np.where(idle, idle_score, used)
        return -score.astype(np.float64), self.best_fit_gpu(cand)


@register("fitness")
class FitnessPolicy(ScoredPolicy):
    """Score ``0.7 × memory match + 0.3 × GPU type compatibility``; the highest wins.

    Memory match is ``min(requested GPU memory, free GPU memory) / requested``; compatibility
    is 1 when the GPU's model is one the request names or the request accepts any model.
    """

    name = "fitness"

    def costs(self, request: GpuRequest, cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """Return minus the fitness score, and the best-fit GPU order."""
        n = len(cand)
        match = np.ones(n)
        if cand.kind is GpuKind.FRACTION:
            t = self.table
            free = t.gpu_mem_free[cand.node, cand.gpu]
            if request.gpu_memory_mib is not None:
                want = np.full(n, request.gpu_memory_mib)
            else:
                want = cand.milli * t.gpu_mem_cap[cand.node, cand.gpu] // MILLI_PER_GPU
            match = np.minimum(want, free) / np.maximum(want, 1)
        compatible = np.ones(n)
        if request.gpu_models and cand.kind is not GpuKind.NONE:
            names = [self._model(int(i), int(j)) for i, j in zip(cand.node, cand.gpu, strict=True)]
            compatible = np.array([1.0 if m in request.gpu_models else 0.0 for m in names])
        return -(0.7 * match + 0.3 * compatible), self.best_fit_gpu(cand)

    def _model(self, i: int, j: int) -> str:
        gpus = self.table.nodes[i].gpus
        return gpus[max(j, 0)].model if gpus else ""


__all__ = ["ClusteringPolicy", "DotProductPolicy", "FitnessPolicy", "PackingPolicy", "RandomPolicy"]


@register("spread")
class SpreadPolicy(ScoredPolicy):
    """Kubernetes' default least-allocated scoring: the emptiest node (CPU and memory) first.

    Used by the simulator's ``airflow-pool`` baseline of the queue mode.
    """

    name = "spread"

    def costs(self, request: GpuRequest, cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """Return minus the mean free share of CPU and memory after placing, and the emptiest GPU."""
        t = self.table
        cpu = (t.cpu_free[cand.node] - cand.cpu) / np.maximum(t.cpu_cap[cand.node], 1)
        mem = (t.mem_free[cand.node] - cand.memory) / np.maximum(t.mem_cap[cand.node], 1)
        score = np.trunc((cpu + mem) * 50)
        return -score, -self.best_fit_gpu(cand)
