"""Fragmentation-aware policies: ``fgd`` (the paper's) and ``gpupool`` (the project default).

Both need the workload's typical shapes (:func:`~airflow_gpupool.placement.frag.typical_shapes`).
Given none, they start from :data:`~airflow_gpupool.placement.frag.DEFAULT_SHAPES` and then
learn the shapes from the requests they place, so the ledger can use them with no trace.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from airflow_gpupool.placement.frag import (
    DEFAULT_SHAPES,
    Fragmentation,
    TypicalShape,
    shape_key,
    typical_shapes,
)
from airflow_gpupool.placement.policy import register
from airflow_gpupool.placement.scored import Candidates, ScoredPolicy
from airflow_gpupool.placement.snapshot import ClusterSnapshot
from airflow_gpupool.resources import GpuKind, GpuRequest

#: Requests between two refreshes of learned shapes.
LEARN_EVERY = 64


class FragmentationPolicy(ScoredPolicy):
    """Base of the policies that score the growth of fragmentation.

    :param typical_shapes: the workload's typical shapes; None: learn them from requests
    :param coverage: share of requests the learned shapes cover
    :param seed: seed of the node order that breaks ties
    """

    name = "fragmentation"

    def __init__(
        self,
        *,
        typical_shapes: Sequence[TypicalShape] | None = None,
        coverage: float = 0.95,
        seed: int = 0,
        **options: Any,
    ) -> None:
        super().__init__(seed=seed, **options)
        self._learn = typical_shapes is None
        self._coverage = coverage
        self._seen: Counter[tuple[int, int, int, frozenset[str]]] = Counter()
        self.frag = Fragmentation(DEFAULT_SHAPES if typical_shapes is None else tuple(typical_shapes))

    def sync(self, snapshot: ClusterSnapshot) -> np.ndarray | None:
        """Sync the table and the per-node fragmentation of the changed nodes."""
        changed = super().sync(snapshot)
        self.frag.refresh(self.table, changed)
        return changed

    def observe(self, request: GpuRequest) -> None:
        """Count the request's shape; every so often, re-derive the typical shapes."""
        if not self._learn:
            return
        self._seen[shape_key(request)] += 1
        if sum(self._seen.values()) % LEARN_EVERY == 0:
            self.frag = Fragmentation(typical_shapes(self._seen, self._coverage))
            self.frag.refresh(self.table, None)

    def growth(self, cand: Candidates) -> np.ndarray:
        """Return how much each candidate's node fragmentation grows, in milli-GPU."""
        milli = cand.milli if cand.kind is GpuKind.FRACTION else 0
        after = self.frag.after(self.table, cand.node, cand.gpu, milli, cand.whole, cand.cpu)
        return after - self.frag.value[cand.node]


@register("fgd")
class FgdPolicy(FragmentationPolicy):
    """Fragmentation gradient descent: where the expected fragmentation grows least.

    Scores as the paper's simulator does, ``int(100 · sigmoid(−growth / 1000))`` (so close
    growths tie and the seeded node order decides); a fraction goes to the GPU with the best
    score, the lowest index among equals.
    """

    name = "fgd"

    def costs(self, request: GpuRequest, cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """Return minus the integer FGD score, and no GPU preference beyond it."""
        score = np.trunc(100.0 / (1.0 + np.exp(self.growth(cand) / 1000.0)))
        return -score, np.zeros(len(cand))


@register("gpupool")
class GpuPoolPolicy(FragmentationPolicy):
    """The project default: exact fragmentation growth, then best fit, then the seeded order.

    The cost is the growth of the node's expected fragmentation, unquantized, plus a small
    best-fit term (GPU milli and CPU left on the node as a share of the node) that settles
    near-ties in favour of fuller nodes; a fraction goes to the GPU whose use grows
    fragmentation least, the fullest such GPU first.

    :param fit_weight: weight of the best-fit term, in milli-GPU of fragmentation per unit
    """

    name = "gpupool"

    def __init__(self, *, fit_weight: float = 50.0, **options: Any) -> None:
        super().__init__(**options)
        self.fit_weight = float(fit_weight)

    def costs(self, request: GpuRequest, cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """Return fragmentation growth plus the best-fit term, and the GPU's free milli."""
        t = self.table
        growth = self.growth(cand)
        gpus = np.maximum(t.gpu_count()[cand.node], 1) * 1000
        gpu_left = (t.gpu_total_free()[cand.node] - cand.gpu_milli) / gpus
        cpu_left = (t.cpu_free[cand.node] - cand.cpu) / np.maximum(t.cpu_cap[cand.node], 1)
        primary = growth + self.fit_weight * (gpu_left + cpu_left)
        return primary, self.best_fit_gpu(cand)
