"""Where the ledger's inventory comes from: a static YAML file, or Kubernetes nodes."""

from __future__ import annotations

from airflow_gpupool.inventory.kubernetes import (
    ReconcileResult,
    SyncResult,
    node_from_kubernetes,
    reconcile,
    reconcile_grant,
    sync_inventory,
)
from airflow_gpupool.inventory.yaml_file import load_inventory, parse_inventory

__all__ = [
    "ReconcileResult",
    "SyncResult",
    "load_inventory",
    "node_from_kubernetes",
    "parse_inventory",
    "reconcile",
    "reconcile_grant",
    "sync_inventory",
]
