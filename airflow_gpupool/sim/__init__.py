"""The trace simulator: replays a workload through the same placement and queue code as the ledger."""

from __future__ import annotations

from airflow_gpupool.sim.replay import ReplayResult, replay
from airflow_gpupool.sim.trace import TracePod, load_nodes, load_pods

__all__ = ["ReplayResult", "TracePod", "load_nodes", "load_pods", "replay"]
