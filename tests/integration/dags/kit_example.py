"""The DAG of the testing page's DAG-author example (docs/testing.md; tests/integration/test_kit_example.py)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from airflow_gpupool.operators import GpuPodOperator

with DAG("embed_on_t4", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    # A quarter of a T4 with 4 GiB of its memory; the kit's connections say where the ledger
    # and the cluster are, and that the t4-shared pool binds slices through HAMi.
    GpuPodOperator(
        task_id="embed",
        name="embed",
        image="registry.example/embed:1",
        gpu_milli=250,
        gpu_memory_mib=4096,
        gpu_models=["Tesla-T4"],
        startup_check_interval_seconds=1,
    )
