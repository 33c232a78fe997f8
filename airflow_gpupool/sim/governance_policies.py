"""The policies the governed simulator compares (:mod:`airflow_gpupool.sim.governed`): which rules each applies."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_gpupool.governance.preemption import VictimOrder
from airflow_gpupool.sim.queue import MAX_OVERTAKES

__all__ = ["POLICIES", "GovernancePolicy"]


@dataclass(frozen=True)
class GovernancePolicy:
    """Which rules a compared policy applies."""

    name: str
    quotas: bool
    fair_order: bool
    headroom: bool
    preemption: VictimOrder | None
    grace: bool
    min_runtime: bool
    whole_slots: bool = False
    placement: str = "gpupool"
    max_overtakes: int = MAX_OVERTAKES


POLICIES = {
    p.name: p
    for p in (
        GovernancePolicy("gpupool", True, True, True, VictimOrder.LEAST_WORK_LOST, True, True),
        GovernancePolicy("kueue-like", True, False, False, VictimOrder.KUEUE, False, False),
        GovernancePolicy("no-preemption", True, True, True, None, False, True),
        GovernancePolicy("airflow-pool", False, False, False, None, False, False, True, "spread", 10**9),
    )
}
