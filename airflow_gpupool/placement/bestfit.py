"""Best-fit: the node left with the least free CPU and GPU after placing (FGD paper baseline).

As in the FGD simulator's ``BestFitScore``: ``score = 1 − ½·cpu_left/128 cores − ½·gpu_left/8 GPUs``
after placing, scaled to an integer 0–100 and min-max normalized over the feasible nodes;
the fullest GPU that fits takes a fraction.
"""

from __future__ import annotations

import numpy as np

from airflow_gpupool.placement.policy import register
from airflow_gpupool.placement.scored import Candidates, ScoredPolicy
from airflow_gpupool.resources import GpuRequest

#: Normalizers of the FGD simulator: the largest node it models (CPU milli, GPU milli).
MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000


def normalize_scores(scores: np.ndarray) -> np.ndarray:
    """Min-max scale integer scores to 0–100 with integer division (the simulator's NormalizeScore)."""
    low, high = int(scores.min()), int(scores.max())
    if high == low:
        return np.zeros_like(scores)
    return (scores - low) * 100 // (high - low)


@register("bestfit")
class BestFitPolicy(ScoredPolicy):
    """Place where the least CPU and GPU is left over (the classic heuristic)."""

    name = "bestfit"

    def costs(self, request: GpuRequest, cand: Candidates) -> tuple[np.ndarray, np.ndarray]:
        """Return minus the normalized best-fit score, and the best-fit GPU order."""
        t = self.table
        cpu_left = t.cpu_free[cand.node] - cand.cpu
        gpu_left = t.gpu_total_free()[cand.node] - cand.gpu_milli
        raw = (1.0 - (0.5 * cpu_left / MAX_SPEC_CPU + 0.5 * gpu_left / MAX_SPEC_GPU)) * 100
        scores = np.trunc(raw).astype(np.int64)
        return -normalize_scores(scores).astype(np.float64), self.best_fit_gpu(cand)
