"""DAGs for the tests of the ladder choosing the CPU fallback (tests/integration/test_gpu_pod_ladder_cpu_fallback.py).

Each task asks for all four A100s of the emulated cluster (no larger slice exists); the test tells
the emulator's kubelet how the pods on a GPU and the CPU-only pods end.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG

from airflow_gpupool.operators import GpuPodOperator

KUBECONFIG = os.environ.get("GPUPOOL_TEST_KUBECONFIG", "/nonexistent/kubeconfig")


def train_dag(dag_id: str, **kwargs: Any) -> DAG:
    """Return a DAG whose task ``train`` is a four-A100 GpuPodOperator retried at once."""
    with DAG(
        dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["gpupool-test"]
    ) as dag:
        GpuPodOperator(
            task_id="train",
            name=dag_id.replace("_", "-"),
            namespace="default",
            image="registry.example/train:1",
            config_file=KUBECONFIG,
            in_cluster=False,
            get_logs=True,
            startup_check_interval_seconds=1,
            startup_timeout_seconds=10,
            poll_interval=0.2,
            retry_delay=timedelta(0),
            gpus=4,
            gpu_models=["NVIDIA-A100-SXM4-80GB"],
            **{"retries": 1, **kwargs},
        )
    return dag


gpu_fault_sync = train_dag("ladder_gpu_fault_sync", cpu_fallback=True)
gpu_fault_deferred = train_dag("ladder_gpu_fault_def", cpu_fallback=True, deferrable=True)
gpu_fault_no_fallback = train_dag("ladder_gpu_fault_no_fallback")
gpu_oom = train_dag("ladder_gpu_oom", cpu_fallback=True)
sticky_cpu = train_dag("ladder_sticky_cpu", cpu_fallback=True, retries=2)
