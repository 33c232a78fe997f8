"""The node agent: one per GPU node (a DaemonSet), reporting its GPUs to the ledger through NVML.

``gpupool agent run`` samples every GPU through ``nvidia-ml-py`` (:mod:`~airflow_gpupool.agent.collect`)
and writes a heartbeat with the report to the ledger each interval (:mod:`~airflow_gpupool.agent.run`).
The ledger verifies the GPUs' UUIDs from it, quarantines a failing GPU, finds memory leaks and
idle grants (:mod:`airflow_gpupool.ledger.nodes.health`); the controller quarantines a node whose
heartbeats stop.
"""

from __future__ import annotations

from airflow_gpupool.agent.collect import NvmlCollector, pod_uid_from_cgroup
from airflow_gpupool.agent.run import AgentPass, NodeAgent

__all__ = ["AgentPass", "NodeAgent", "NvmlCollector", "pod_uid_from_cgroup"]
