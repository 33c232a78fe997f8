"""DAGs for the GpuPodOperator integration tests; they read the emulator's kubeconfig from the env."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.sdk import DAG

from airflow_gpupool.operators import GpuPodOperator

KUBECONFIG = os.environ.get("GPUPOOL_TEST_KUBECONFIG", "/nonexistent/kubeconfig")
ANNOTATION = "gpupool.emulator/"

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


def gpu_dag(dag_id: str, **kwargs: Any) -> DAG:
    """Return a DAG of one GpuPodOperator task ``train``."""
    with DAG(
        dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["gpupool-test"]
    ) as dag:
        GpuPodOperator(task_id="train", name=dag_id.replace("_", "-"), **{**COMMON, **kwargs})
    return dag


def emulate(**behaviour: str) -> dict[str, str]:
    """Return pod annotations that tell the emulator's kubelet what to do."""
    return {ANNOTATION + key.replace("_", "-"): value for key, value in behaviour.items()}


A100 = ["NVIDIA-A100-SXM4-80GB"]
T4 = ["Tesla-T4"]

bind_whole = gpu_dag(
    "gpu_bind_whole", gpus=2, gpu_models=A100, binding="whole", workload_class="training", team="vision"
)
bind_mig = gpu_dag("gpu_bind_mig", mig_profile="1g.10gb", workload_class="inference")
bind_hami = gpu_dag("gpu_bind_hami", gpu_milli=250, gpu_memory_mib=10240, gpu_models=T4)
bind_kai = gpu_dag("gpu_bind_kai", gpu_milli=500, gpu_models=A100, binding="kai")
bind_device = gpu_dag("gpu_bind_device", gpus=1, gpu_models=A100, binding="device")
deferrable_pod = gpu_dag("gpu_deferrable_pod", gpus=1, deferrable=True)
failing = gpu_dag("gpu_failing_pod", gpus=1, annotations=emulate(exit_code="1"))
never_scheduled = gpu_dag(
    "gpu_never_scheduled", gpus=1, annotations=emulate(never_schedule="true"), startup_timeout_seconds=2
)
queued = gpu_dag("gpu_queued", gpus=1, gpu_models=A100, reservation_deferrable=True, reservation_timeout=60)
queued_in_place = gpu_dag(
    "gpu_queued_in_place", gpus=1, gpu_models=A100, reservation_deferrable=False, reservation_timeout=60
)
times_out = gpu_dag(
    "gpu_times_out", gpus=1, gpu_models=A100, reservation_deferrable=True, reservation_timeout=1
)


def books_wrong_dag(dag_id: str, **kwargs: Any) -> DAG:
    """Return a DAG whose one A100 try is granted on a node a pod the ledger does not know fills."""
    with DAG(
        dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["gpupool-test"]
    ) as dag:
        task = GpuPodOperator(
            task_id="train", name=dag_id.replace("_", "-"), gpus=1, gpu_models=A100, **{**COMMON, **kwargs}
        )
        task.unschedulable_grace_seconds = 2  # the documented 30 s, shortened for the test
    return dag


books_wrong_sync = books_wrong_dag("gpu_books_wrong_sync")
books_wrong_deferred = books_wrong_dag("gpu_books_wrong_deferred", deferrable=True)
