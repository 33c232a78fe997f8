"""Placement: pure functions from a cluster snapshot and a request to a verdict."""

from __future__ import annotations

from airflow_gpupool.placement.fit import check_node, choices
from airflow_gpupool.placement.frag import TypicalShape, typical_shapes
from airflow_gpupool.placement.policy import DEFAULT_POLICY, PlacementPolicy, get_policy, policy_names
from airflow_gpupool.placement.snapshot import ClusterSnapshot, GpuState, NodeState
from airflow_gpupool.placement.verdict import Assignment, NoFit, NoFitReason, Verdict

__all__ = [
    "DEFAULT_POLICY",
    "Assignment",
    "ClusterSnapshot",
    "GpuState",
    "NoFit",
    "NoFitReason",
    "NodeState",
    "PlacementPolicy",
    "TypicalShape",
    "Verdict",
    "check_node",
    "choices",
    "get_policy",
    "policy_names",
    "typical_shapes",
]
