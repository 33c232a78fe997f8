"""Where the ledger's inventory comes from: a static YAML file, or Kubernetes nodes.

Reconciling grants with pods is the controller's job: :mod:`airflow_gpupool.controller.reconcile`.
"""

from __future__ import annotations

from airflow_gpupool.inventory.nodes import node_from_kubernetes
from airflow_gpupool.inventory.sync import SyncResult, sync_inventory
from airflow_gpupool.inventory.yaml_file import load_inventory, parse_inventory

__all__ = [
    "SyncResult",
    "load_inventory",
    "node_from_kubernetes",
    "parse_inventory",
    "sync_inventory",
]
