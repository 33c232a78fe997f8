"""Best-fit: the node (and GPU) left with the least free capacity after placing."""

from __future__ import annotations

from typing import Any

from airflow_gpupool.placement.policy import place_by_score, register
from airflow_gpupool.placement.snapshot import ClusterSnapshot, NodeState
from airflow_gpupool.placement.verdict import Assignment, Verdict
from airflow_gpupool.resources import MILLI_PER_GPU, GpuRequest


def leftover(node: NodeState, option: Assignment, request: GpuRequest) -> float:
    """Remaining free share of the node after ``option``: GPU first, then CPU and memory."""
    gpus = len(node.gpus) or 1
    gpu_after = (node.gpu_free_milli - option.milli_per_gpu * len(option.gpu_indices)) / (gpus * MILLI_PER_GPU)
    if option.mig_slice is not None:
        gpu_after = sum(len(g.mig_free) for g in node.gpus) - 1
    cpu_after = (node.cpu_free - request.cpu_milli) / max(node.cpu_milli, 1)
    mem_after = (node.memory_free - request.memory_mib) / max(node.memory_mib, 1)
    # Inside a node, prefer the fullest GPU that still fits, so whole GPUs stay whole.
    gpu_inside = 0.0
    if option.gpu_indices and option.mig_slice is None and option.milli_per_gpu < MILLI_PER_GPU:
        chosen = next(g for g in node.gpus if g.index == option.gpu_indices[0])
        gpu_inside = (chosen.free_milli - option.milli_per_gpu) / MILLI_PER_GPU
    return gpu_after * 4 + cpu_after + mem_after + gpu_inside * 1e-3


@register("bestfit")
class BestFitPolicy:
    """Place where the least capacity is left over (the classic heuristic)."""

    name = "bestfit"

    def __init__(self, **_: Any) -> None:
        pass

    def place(self, snapshot: ClusterSnapshot, request: GpuRequest) -> Verdict:
        """Return the best-fit assignment, or why nothing fits."""
        return place_by_score(snapshot, request, lambda node, option: leftover(node, option, request))
