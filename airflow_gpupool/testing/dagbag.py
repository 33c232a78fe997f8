"""Airflow's ``DagBag`` on every supported Airflow: it moved to ``airflow.dag_processing`` in 3.2."""

from __future__ import annotations

from typing import Any

__all__ = ["dag_bag_class"]


def dag_bag_class() -> Any:
    """Return Airflow's ``DagBag`` class (``airflow.models.dagbag`` on Airflow 3.1)."""
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 3.1
        from airflow.models.dagbag import DagBag  # type: ignore[no-redef,attr-defined,unused-ignore]
    return DagBag
