"""``@task.gpu_pod`` under dag.test(): the function runs in a GpuPodOperator pod pinned to its grant."""

from __future__ import annotations

import base64
import threading
import time
from typing import Any

from airflow_gpupool.get_provider_info import get_provider_info
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.testing import KubernetesEmulatorServer

A100 = "NVIDIA-A100-SXM4-80GB"


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}


def test_registered_as_a_task_decorator() -> None:
    from airflow.sdk import task

    assert {"class-name": "airflow_gpupool.decorators.gpu_pod.gpu_pod_task", "name": "gpu_pod"} in (
        get_provider_info()["task-decorators"]
    )
    assert task.gpu_pod.__name__ == "gpu_pod_task"


def check_pod(pod: dict[str, Any], ledger: Ledger, source: str) -> None:
    env = env_of(pod)
    script = base64.b64decode(env["__PYTHON_SCRIPT"]).decode()
    assert source in script
    assert pod["spec"]["containers"][0]["command"][:2] == ["bash", "-cx"]
    assert env["GPUPOOL_NODE"] == "gpu-a100"
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    rid = pod["metadata"]["labels"]["gpupool.io/reservation-id"]
    assert ledger.get(rid).state is ReservationState.RELEASED


def test_function_runs_on_a_reserved_slice(
    run_dag, k8s: KubernetesEmulatorServer, gpu_ledger: Ledger
) -> None:
    dag_run = run_dag("taskflow_gpu_pod")
    assert str(dag_run.state) == "success"
    (pod,) = k8s.created_pods()
    check_pod(pod, gpu_ledger, 'print(f"training for {epochs} epochs")')
    assert pod["metadata"]["annotations"]["gpupool.io/team"] == "vision"
    assert gpu_ledger.snapshot().grants == ()


def test_deferred_reservation_still_carries_the_function(
    run_dag, k8s: KubernetesEmulatorServer, gpu_ledger: Ledger
) -> None:
    blocker = gpu_ledger.reserve(
        GpuRequest(gpus=4, gpu_models=frozenset({A100})), "blocker", reservation_id="gp-hold"
    )
    assert blocker.state is ReservationState.GRANTED
    threading.Timer(3.0, lambda: gpu_ledger.release("gp-hold")).start()
    started = time.monotonic()
    dag_run = run_dag("taskflow_gpu_pod_queued")
    assert str(dag_run.state) == "success"
    assert time.monotonic() - started >= 3.0
    (pod,) = k8s.created_pods()
    check_pod(pod, gpu_ledger, "def train_later")


def test_checkpoint_on_sigterm_passes_through_to_the_request() -> None:
    from airflow.sdk import DAG, task

    @task.gpu_pod(
        image="train:1", gpus=1, preemptible=True, checkpoint_on_sigterm=True, checkpoint_dir="s3://ckpt/run"
    )
    def train() -> None: ...

    with DAG("taskflow_sigterm", schedule=None):
        operator = train().operator
    assert operator.gpu_request().checkpoint_on_sigterm is True
