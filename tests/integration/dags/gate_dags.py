"""DAGs for the executor-hook, gatekeeper and ``@task.gpu_pod`` end-to-end tests (emulator + ledger)."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk import DAG, task
from kubernetes.client import models as k8s

from airflow_gpupool.operators import GpuPodOperator

KUBECONFIG = os.environ.get("GPUPOOL_TEST_KUBECONFIG", "/nonexistent/kubeconfig")

POD: dict[str, Any] = {
    "namespace": "default",
    "image": "registry.example/python:3.11",
    "config_file": KUBECONFIG,
    "in_cluster": False,
    "get_logs": True,
    "startup_check_interval_seconds": 1,
    "poll_interval": 0.2,
    "do_xcom_push": False,
}


def _dag(dag_id: str) -> DAG:
    return DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["gpupool-test"])


with _dag("taskflow_gpu_pod") as taskflow_gpu_pod:

    @task.gpu_pod(gpus=1, gpu_models=["NVIDIA-A100-SXM4-80GB"], team="vision", lease_ttl=30, **POD)
    def train(epochs: int) -> None:
        print(f"training for {epochs} epochs")

    train(3)


with _dag("taskflow_gpu_pod_queued") as taskflow_gpu_pod_queued:

    @task.gpu_pod(
        gpus=1,
        gpu_models=["NVIDIA-A100-SXM4-80GB"],
        reservation_deferrable=True,
        reservation_timeout=60,
        **POD,
    )
    def train_later(epochs: int) -> None:
        print(f"training for {epochs} epochs")

    train_later(5)


with _dag("plain_kpo_gpu") as plain_kpo_gpu:
    # A DAG that knows nothing of gpupool: only the executor hook (airflow_local_settings) gates it.
    KubernetesPodOperator(
        task_id="legacy_train",
        name="legacy-train",
        cmds=["python", "train.py"],
        container_resources=k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"}),
        startup_timeout_seconds=60,
        **POD,
    )


with _dag("plain_kpo_gpu_pool") as plain_kpo_gpu_pool:
    # Its nodeSelector names a node pool: the ledger may grant only a node of that pool.
    KubernetesPodOperator(
        task_id="pool_train",
        name="pool-train",
        cmds=["python", "train.py"],
        container_resources=k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"}),
        node_selector={"gpupool.io/pool": "t4-shared", "nvidia.com/gpu.product": "Tesla-T4"},
        startup_timeout_seconds=60,
        **POD,
    )


with _dag("gpu_bind_dra") as gpu_bind_dra:
    # Dynamic Resource Allocation: a ResourceClaim selects the two granted A100s by UUID.
    GpuPodOperator(
        task_id="train", name="dra-train", gpus=2, gpu_models=["NVIDIA-A100-SXM4-80GB"], binding="dra", **POD
    )

with _dag("gpu_bind_dra_mig_kept") as gpu_bind_dra_mig_kept:
    # The pod is kept when it ends, so the test sees its claim stored, then deletes the pod.
    GpuPodOperator(
        task_id="infer",
        name="dra-infer",
        mig_profile="1g.10gb",
        binding="dra",
        on_finish_action="keep_pod",
        **POD,
    )
