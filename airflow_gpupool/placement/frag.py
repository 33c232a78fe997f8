"""Fragmentation as in the FGD paper (Weng et al., USENIX ATC'23), vectorized over nodes.

For a task shape ``m`` a node's free GPU milli is a *fragment* when ``m`` cannot use it:
all of it when ``m`` does not fit the node (CPU, GPU model, or too few GPUs with enough
free milli), else the free milli of the GPUs with less free than ``m`` asks per GPU. A
CPU-only shape uses no GPU, so to it every free GPU milli is a fragment. A node's
fragmentation is the expected fragment over the typical shapes,
``F(n) = Σ_m p_m · F(n, m)``.

Writing ``A(n, t)`` for the free milli of the GPUs with at least ``t`` free and ``cnt(n, t)``
for their number, ``F(n, m) = S(n) − fits(n, m) · A(n, t_m)``, so per node only the two
``(thresholds,)`` vectors ``A`` and ``cnt`` are kept, and the fragmentation after a
placement is derived from them by a rank-one update instead of a rescan of the GPUs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from airflow_gpupool.resources import MIG_PROFILES, MILLI_PER_GPU, GpuKind, GpuRequest

if TYPE_CHECKING:
    from airflow_gpupool.placement.table import NodeTable


@dataclass(frozen=True, order=True)
class TypicalShape:
    """One task shape and its share of the workload.

    :param cpu_milli: CPU asked for
    :param gpu_milli: milli-GPU asked for on each GPU (1000 for whole GPUs, 0 for none)
    :param gpus: number of GPUs (0: CPU only)
    :param models: GPU models allowed (empty: any)
    :param weight: relative frequency (normalized by the user of the shapes)
    """

    cpu_milli: int
    gpu_milli: int
    gpus: int
    models: frozenset[str] = field(default_factory=frozenset)
    weight: float = 1.0


def shape_key(request: GpuRequest) -> tuple[int, int, int, frozenset[str]]:
    """Return ``(cpu_milli, gpu_milli per GPU, gpus, models)`` of a request."""
    kind = request.kind
    if kind is GpuKind.NONE:
        return (request.cpu_milli, 0, 0, request.gpu_models)
    if kind is GpuKind.WHOLE:
        return (request.cpu_milli, MILLI_PER_GPU, request.gpus, request.gpu_models)
    if kind is GpuKind.MIG:
        return (request.cpu_milli, MIG_PROFILES[str(request.mig_profile)].milli, 1, request.gpu_models)
    return (request.cpu_milli, int(request.gpu_milli or 0), 1, request.gpu_models)


def typical_shapes(
    keys: Iterable[tuple[int, int, int, frozenset[str]]] | Counter[tuple[int, int, int, frozenset[str]]],
    coverage: float = 0.95,
) -> tuple[TypicalShape, ...]:
    """Return the most frequent shapes that together cover ``coverage`` of the tasks.

    Weights are normalized to sum to 1 (as the FGD simulator does after the cut).

    :param keys: one :func:`shape_key` per task, or a Counter of them
    :param coverage: share of the tasks the shapes must cover, in (0, 1]
    """
    counts = keys if isinstance(keys, Counter) else Counter(keys)
    total = sum(counts.values())
    if total == 0:
        return ()
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0][0], kv[0][1], kv[0][2], sorted(kv[0][3])))
    chosen: list[tuple[tuple[int, int, int, frozenset[str]], int]] = []
    covered = 0
    for key, count in ranked:
        if covered >= coverage * total:
            break
        chosen.append((key, count))
        covered += count
    return tuple(TypicalShape(k[0], k[1], k[2], k[3], n / covered) for k, n in chosen)


#: Shapes assumed when a policy is given none and has seen no requests yet: CPU-light
#: quarter, half and three-quarter GPUs and 1, 2, 4 and 8 whole GPUs, equally likely.
DEFAULT_SHAPES: tuple[TypicalShape, ...] = tuple(
    TypicalShape(1000, milli, gpus, frozenset(), 1 / 7)
    for milli, gpus in ((250, 1), (500, 1), (750, 1), (1000, 1), (1000, 2), (1000, 4), (1000, 8))
)


class Fragmentation:
    """Fragmentation of every node of a :class:`NodeTable` for a set of typical shapes.

    :param shapes: the typical shapes (weights need not be normalized)
    """

    def __init__(self, shapes: Sequence[TypicalShape]) -> None:
        self.shapes = tuple(shapes)
        self.weight_total = float(sum(s.weight for s in self.shapes))
        gpu = [s for s in self.shapes if s.gpus > 0]
        self.thresholds = np.array(sorted({s.gpu_milli for s in gpu}), dtype=np.int64)
        where = {t: i for i, t in enumerate(self.thresholds.tolist())}
        self._t_idx = np.array([where[s.gpu_milli] for s in gpu], dtype=np.int64)
        self._cpu = np.array([s.cpu_milli for s in gpu], dtype=np.int64)
        self._num = np.array([s.gpus for s in gpu], dtype=np.int64)
        self._p = np.array([s.weight for s in gpu], dtype=np.float64)
        self._models = [s.models for s in gpu]
        self._okm = np.zeros((1, len(gpu)), dtype=bool)
        self._okm_for = -1
        self.cnt = np.zeros((0, len(self.thresholds)), dtype=np.int64)
        self.amount = np.zeros((0, len(self.thresholds)), dtype=np.int64)
        self.free = np.zeros(0, dtype=np.int64)
        self.value = np.zeros(0, dtype=np.float64)

    def _model_ok(self, table: NodeTable) -> np.ndarray:
        if self._okm_for != len(table.models):
            names = sorted(table.models, key=table.models.__getitem__)
            okm = np.zeros((len(names) + 1, len(self._models)), dtype=bool)  # last row: no GPU
            for k, models in enumerate(self._models):
                for mid, name in enumerate(names):
                    okm[mid, k] = not models or name in models
            self._okm, self._okm_for = okm, len(table.models)
        return self._okm

    def counts(self, gpu_free: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return ``cnt`` and ``A`` (see the module doc) for rows of GPU free milli."""
        ge = gpu_free[:, :, None] >= self.thresholds[None, None, :]
        return ge.sum(axis=1), (ge * gpu_free[:, :, None]).sum(axis=1)

    def evaluate(
        self,
        table: NodeTable,
        free: np.ndarray,
        cpu: np.ndarray,
        model: np.ndarray,
        cnt: np.ndarray,
        amount: np.ndarray,
    ) -> np.ndarray:
        """Return the fragmentation of node states given by their summaries.

        :param table: the table the model ids refer to
        :param free: total free GPU milli of each state
        :param cpu: free CPU of each state
        :param model: node model id of each state (-1: no GPU)
        :param cnt: ``cnt`` rows of the states
        :param amount: ``A`` rows of the states
        """
        if len(self._p) == 0:
            return free * self.weight_total
        okm = self._model_ok(table)
        fits = (cpu[:, None] >= self._cpu[None, :]) & okm[model] & (cnt[:, self._t_idx] >= self._num[None, :])
        value: np.ndarray = free * self.weight_total - (fits * amount[:, self._t_idx]) @ self._p
        return value

    def refresh(self, table: NodeTable, rows: np.ndarray | None) -> None:
        """Recompute the per-node arrays for ``rows`` (all nodes when None)."""
        if rows is None or len(self.value) != table.size:
            rows = np.arange(table.size)
            self.cnt = np.zeros((table.size, len(self.thresholds)), dtype=np.int64)
            self.amount = np.zeros_like(self.cnt)
            self.free = np.zeros(table.size, dtype=np.int64)
            self.value = np.zeros(table.size, dtype=np.float64)
        if len(rows) == 0:
            return
        g = table.gpu_free[rows]
        cnt, amount = self.counts(g)
        free = np.where(g > 0, g, 0).sum(axis=1)
        self.cnt[rows], self.amount[rows], self.free[rows] = cnt, amount, free
        self.value[rows] = self.evaluate(
            table, free, table.cpu_free[rows], table.node_model[rows], cnt, amount
        )

    def after(
        self, table: NodeTable, node: np.ndarray, gpu: np.ndarray, milli: int, whole: int, cpu: int
    ) -> np.ndarray:
        """Return each candidate node's fragmentation once the request is placed.

        :param table: the synced table
        :param node: candidate node rows
        :param gpu: the GPU column a fraction takes (ignored unless ``milli``)
        :param milli: milli taken on one GPU by a fraction (0 otherwise)
        :param whole: number of whole GPUs taken
        :param cpu: CPU taken
        """
        cnt = self.cnt[node]
        amount = self.amount[node]
        free = self.free[node]
        if milli:
            t = self.thresholds[None, :]
            f = table.gpu_free[node, gpu][:, None]
            f2 = f - milli
            cnt = cnt - ((t > f2) & (t <= f))
            amount = amount - f * (t <= f) + f2 * (t <= f2)
            free = free - milli
        elif whole:
            cnt = cnt - whole
            amount = amount - whole * MILLI_PER_GPU
            free = free - whole * MILLI_PER_GPU
        return self.evaluate(table, free, table.cpu_free[node] - cpu, table.node_model[node], cnt, amount)
