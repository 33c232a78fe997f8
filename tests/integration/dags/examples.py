"""Expose the repository's example airflow DAGs (``dags/``) to the integration tests' DAG folder."""

from __future__ import annotations

from dags.example_gpu_pod import dag as example_gpu_pod

__all__ = ["example_gpu_pod"]
