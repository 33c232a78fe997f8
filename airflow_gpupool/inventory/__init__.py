"""Where the ledger's inventory comes from: a static YAML file, or Kubernetes nodes."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from airflow_gpupool.inventory.nodes import node_from_kubernetes
from airflow_gpupool.inventory.sync import SyncResult, sync_inventory
from airflow_gpupool.inventory.yaml_file import load_inventory, parse_inventory

if TYPE_CHECKING:
    from airflow_gpupool.controller.reconcile import ReconcileResult, reconcile, reconcile_grant

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

#: Names that moved to :mod:`airflow_gpupool.controller.reconcile`, still importable from here. Resolved on
#: first use: the controller imports this package, so an eager import would be circular.
_CONTROLLER_NAMES = frozenset({"ReconcileResult", "reconcile", "reconcile_grant"})


def __getattr__(name: str) -> Any:
    if name in _CONTROLLER_NAMES:
        return getattr(importlib.import_module("airflow_gpupool.controller.reconcile"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
