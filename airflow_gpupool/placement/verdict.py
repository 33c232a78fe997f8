"""What placement answers: an assignment, or why nothing fits."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Assignment:
    """Where a request goes.

    :param node: the node's name
    :param gpu_indices: the GPUs taken (one for a fraction or a MIG slice, none for CPU only)
    :param milli_per_gpu: compute taken on each GPU (1000 for whole GPUs)
    :param gpu_memory_mib: GPU memory taken on each GPU
    :param mig_slice: the MIG slice id, for a MIG request
    :param score: the policy's score (lower is better); informative only
    """

    node: str
    gpu_indices: tuple[int, ...]
    milli_per_gpu: int
    gpu_memory_mib: int
    mig_slice: str | None = None
    score: float = 0.0


@dataclass(frozen=True, slots=True, order=True)
class NoFitReason:
    """Why one node rejected a request.

    Sorted by ``shortfall`` (how far the node is from fitting, in the units of its worst
    resource as a share of what was asked: 0 means the node could fit once freed), so the
    first reasons name the closest nodes.
    """

    shortfall: float
    node: str
    reason: str

    def __str__(self) -> str:
        return f"{self.node}: {self.reason}"


@dataclass(frozen=True, slots=True)
class NoFit:
    """Nothing fits now; ``reasons`` lists the nodes closest to fitting first."""

    reasons: tuple[NoFitReason, ...]

    def summary(self, limit: int = 3) -> list[str]:
        """Return the first ``limit`` reasons as text."""
        return [str(r) for r in self.reasons[:limit]]


Verdict = Assignment | NoFit
