"""Metrics of the node agents' reports: GPU use, health, leaks, and used versus reserved per grant.

Read from the same snapshot as :mod:`~airflow_gpupool.metrics.collector` (the GPUs' last observed
state that each heartbeat stores, see :mod:`airflow_gpupool.ledger.nodes.health`). Names and labels are
a contract with ``docker/prometheus/rules.yaml``:

=================================================================  ===============================
``gpupool_gpu_utilization_ratio{node,gpu,node_pool,model}``        SM utilization at the last report (0–1)
``gpupool_gpu_memory_used_mib{node,gpu,node_pool,model}``          GPU memory in use
``gpupool_gpu_health{node,gpu,health,source}``                     1 for each GPU's health
``gpupool_gpu_memory_leak_mib{node,gpu}``                          memory held past the leak grace with no grant
``gpupool_grant_gpu_memory_used_mib{reservation,team,node_pool}``  what a grant's pod uses ...
``gpupool_grant_gpu_memory_reserved_mib{reservation,team,node_pool}`` ... of what it reserved
``gpupool_grant_gpu_utilization_ratio{reservation,team,node_pool}`` its GPUs' utilization (0–1)
``gpupool_grant_idle_seconds{reservation,team,node_pool}``         how long a grant's GPUs showed no use
``gpupool_nodes_reporting``                                        nodes whose agent reported within 3 intervals
=================================================================  ===============================
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from airflow_gpupool.ledger import LedgerSnapshot

__all__ = ["AGENT_METRIC_NAMES", "agent_metrics"]

AGENT_METRIC_NAMES = (
    "gpupool_gpu_utilization_ratio",
    "gpupool_gpu_memory_used_mib",
    "gpupool_gpu_health",
    "gpupool_gpu_memory_leak_mib",
    "gpupool_grant_gpu_memory_used_mib",
    "gpupool_grant_gpu_memory_reserved_mib",
    "gpupool_grant_gpu_utilization_ratio",
    "gpupool_grant_idle_seconds",
    "gpupool_nodes_reporting",
)
#: Heartbeat intervals after which a node no longer counts as reporting (the quarantine point).
_REPORTING_INTERVALS = 3


def _grant_usage(gpus: list[dict[str, Any]], now: float) -> dict[str, dict[str, Any]]:
    """Sum each grant's use over its GPUs."""
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {"used": 0, "reserved": 0, "util": [], "idle": None})
    for gpu in gpus:
        for rid, use in (gpu.get("usage") or {}).items():
            entry = out[rid]
            entry.update(team=use["team"], node_pool=use["node_pool"])
            entry["used"] += use["memory_used_mib"]
            entry["reserved"] += use["memory_reserved_mib"]
            entry["util"].append(use.get("utilization") or 0)
        for rid, since in (gpu.get("idle") or {}).items():
            out[rid]["idle"] = max(0.0, now - since)
    return out


def agent_metrics(snapshot: LedgerSnapshot) -> list[Metric]:
    """Return the agent's metric families from one snapshot (nodes without a report yield none)."""
    from prometheus_client.core import GaugeMetricFamily

    now = snapshot.taken_at
    gpu_labels = ["node", "gpu", "node_pool", "model"]
    util = GaugeMetricFamily(
        "gpupool_gpu_utilization_ratio", "GPU SM utilization at the last report", labels=gpu_labels
    )
    memory = GaugeMetricFamily(
        "gpupool_gpu_memory_used_mib", "GPU memory in use at the last report", labels=gpu_labels
    )
    health = GaugeMetricFamily(
        "gpupool_gpu_health", "1 for each GPU's health", labels=["node", "gpu", "health", "source"]
    )
    leak = GaugeMetricFamily(
        "gpupool_gpu_memory_leak_mib",
        "GPU memory held past the leak grace by processes no grant holds",
        labels=["node", "gpu"],
    )
    grant_labels = ["reservation", "team", "node_pool"]
    used = GaugeMetricFamily(
        "gpupool_grant_gpu_memory_used_mib", "GPU memory a grant's pod uses", labels=grant_labels
    )
    reserved = GaugeMetricFamily(
        "gpupool_grant_gpu_memory_reserved_mib", "GPU memory a grant reserved", labels=grant_labels
    )
    grant_util = GaugeMetricFamily(
        "gpupool_grant_gpu_utilization_ratio", "Utilization of a grant's GPUs", labels=grant_labels
    )
    idle = GaugeMetricFamily(
        "gpupool_grant_idle_seconds",
        "Seconds a grant's GPUs have shown no process and no utilization",
        labels=grant_labels,
    )
    reporting = GaugeMetricFamily(
        "gpupool_nodes_reporting", "Nodes whose agent reported within 3 heartbeat intervals"
    )
    reporting_nodes = 0
    all_gpus: list[dict[str, Any]] = []
    for node in snapshot.nodes:
        if node.heartbeat_at is not None and node.heartbeat_interval:
            reporting_nodes += now - node.heartbeat_at <= _REPORTING_INTERVALS * node.heartbeat_interval
        for gpu in node.gpus:
            uuid = str(gpu["uuid"])
            health.add_metric(
                [
                    node.name,
                    uuid,
                    str(gpu.get("health", "healthy")),
                    str(gpu.get("health_source", "inventory")),
                ],
                1,
            )
            if gpu.get("utilization") is not None:
                util.add_metric(
                    [node.name, uuid, node.node_pool, str(gpu["model"])], gpu["utilization"] / 100.0
                )
            if gpu.get("memory_used_mib") is not None:
                memory.add_metric(
                    [node.name, uuid, node.node_pool, str(gpu["model"])], gpu["memory_used_mib"]
                )
            if gpu.get("leak"):
                leak.add_metric([node.name, uuid], gpu["leak"]["memory_mib"])
            all_gpus.append(gpu)
    for rid, use in sorted(_grant_usage(all_gpus, now).items()):
        if "team" not in use:
            continue
        labels = [rid, use["team"], use["node_pool"]]
        used.add_metric(labels, use["used"])
        reserved.add_metric(labels, use["reserved"])
        grant_util.add_metric(labels, sum(use["util"]) / len(use["util"]) / 100.0 if use["util"] else 0.0)
        if use["idle"] is not None:
            idle.add_metric(labels, use["idle"])
    reporting.add_metric([], reporting_nodes)
    return [util, memory, health, leak, used, reserved, grant_util, idle, reporting]
