"""Placement: pure functions from a cluster snapshot and a request to a verdict."""

from __future__ import annotations

from airflow_gpupool.placement.fit import choices, check_node
from airflow_gpupool.placement.policy import PlacementPolicy, get_policy, policy_names
from airflow_gpupool.placement.snapshot import ClusterSnapshot, GpuState, NodeState
from airflow_gpupool.placement.verdict import Assignment, NoFit, NoFitReason, Verdict

__all__ = [
    "Assignment",
    "ClusterSnapshot",
    "GpuState",
    "NoFit",
    "NoFitReason",
    "NodeState",
    "PlacementPolicy",
    "Verdict",
    "check_node",
    "choices",
    "get_policy",
    "policy_names",
]
