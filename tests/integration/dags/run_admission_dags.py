"""DAGs admitted as a whole (issue 40 item 3): prep -> [train_a, train_b] -> evaluate on the A100 node."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.sdk import DAG

from airflow_gpupool.operators import GpuPodOperator

KUBECONFIG = os.environ.get("GPUPOOL_TEST_KUBECONFIG", "/nonexistent/kubeconfig")
A100 = ["NVIDIA-A100-SXM4-80GB"]
COMMON: dict[str, Any] = {
    "namespace": "default",
    "image": "registry.example/train:1",
    "cmds": ["python", "train.py"],
    "config_file": KUBECONFIG,
    "in_cluster": False,
    "get_logs": True,
    "startup_check_interval_seconds": 1,
    "poll_interval": 0.2,
    "lease_ttl": 30,
}


def run_dag(dag_id: str, train_b_gpus: int) -> DAG:
    """Return the DAG: its peak is train_a (2 GPUs) and train_b (``train_b_gpus``) at once."""
    args: dict[str, Any] = {"gpu_admission": "run", "team": "vision", "gpu_models": A100}
    with DAG(
        dag_id,
        schedule=None,
        start_date=datetime(2026, 1, 1),
        catchup=False,
        default_args=args,
        tags=["gpupool-test"],
    ) as dag:
        prep = GpuPodOperator(task_id="prep", name="prep", gpus=1, **COMMON)
        train_a = GpuPodOperator(task_id="train_a", name="train-a", gpus=2, **COMMON)
        train_b = GpuPodOperator(task_id="train_b", name="train-b", gpus=train_b_gpus, **COMMON)
        evaluate = GpuPodOperator(task_id="evaluate", name="evaluate", gpus=1, **COMMON)
        prep >> [train_a, train_b] >> evaluate
    return dag


run_fits = run_dag("run_admission_fits", train_b_gpus=1)  # peak 3
run_too_big = run_dag("run_admission_too_big", train_b_gpus=2)  # peak 4
