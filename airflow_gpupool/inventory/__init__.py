"""Where the ledger's inventory comes from: a static YAML file, or Kubernetes nodes."""

from __future__ import annotations

from airflow_gpupool.inventory.yaml_file import load_inventory, parse_inventory

__all__ = ["load_inventory", "parse_inventory"]
