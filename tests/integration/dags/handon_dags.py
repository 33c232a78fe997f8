"""DAGs for the hand-on end-to-end tests (issue 40): ``train`` hands its slice on to ``evaluate``."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.providers.common.compat.sdk import AirflowSkipException
from airflow.sdk import DAG, task

from airflow_gpupool.operators import GpuPodOperator

START = datetime(2026, 1, 1)
A100 = ["NVIDIA-A100-SXM4-80GB"]
COMMON: dict[str, Any] = {
    "namespace": "default",
    "image": "registry.example/train:1",
    "cmds": ["python", "train.py"],
    "config_file": os.environ.get("GPUPOOL_TEST_KUBECONFIG", "/nonexistent/kubeconfig"),
    "in_cluster": False,
    "get_logs": True,
    "startup_check_interval_seconds": 1,
    "poll_interval": 0.2,
    "lease_ttl": 30,
}
TRAIN: dict[str, Any] = {**COMMON, "gpus": 2, "gpu_models": A100, "workload_class": "training"}
EVALUATE: dict[str, Any] = {**COMMON, "gpus": 1, "gpu_models": A100, "workload_class": "training"}


def chain(dag_id: str, **dag_args: Any) -> DAG:
    """``train`` (2 GPUs) then ``evaluate`` (1 GPU): the slice is handed on."""
    with DAG(dag_id, schedule=None, start_date=START, catchup=False, **dag_args) as dag:
        train = GpuPodOperator(task_id="train", name="train", **TRAIN)
        train >> GpuPodOperator(task_id="evaluate", name="evaluate", **EVALUATE)
    return dag


handon_chain = chain("handon_chain")
handon_opted_out = chain("handon_opted_out", default_args={"hand_on": False})
handon_param_off = chain("handon_param_off", params={"gpupool_hand_on": False})

with DAG("handon_skipped", schedule=None, start_date=START, catchup=False) as handon_skipped:

    @task
    def decide() -> None:
        raise AirflowSkipException("no evaluation this run")

    gate = decide()
    # train runs whatever the gate says; evaluate, behind the skipped gate, is skipped.
    train = GpuPodOperator(
        task_id="train", name="train", trigger_rule="none_failed", handoff_seconds=2, **TRAIN
    )
    evaluate = GpuPodOperator(task_id="evaluate", name="evaluate", **EVALUATE)
    gate >> train >> evaluate
    gate >> evaluate

with DAG("handon_waits", schedule=None, start_date=START, catchup=False) as handon_waits:

    @task
    def report() -> None:
        """Runs after train: when train ends, evaluate's other upstream is not done."""

    train = GpuPodOperator(task_id="train", name="train", **TRAIN)
    evaluate = GpuPodOperator(task_id="evaluate", name="evaluate", **EVALUATE)
    later = report()
    train >> later >> evaluate
    train >> evaluate


# Queue ahead: ``train`` takes 1 GPU and ``evaluate`` 2, so evaluate cannot be handed train's
# slice; granted, train queues evaluate's request ahead (its forecast end, expected_duration
# away, is within the lead): it waits in the queue, not granted before that end.
QA_TRAIN: dict[str, Any] = {**COMMON, "gpus": 1, "gpu_models": A100, "workload_class": "training"}
QA_EVALUATE: dict[str, Any] = {**COMMON, "gpus": 2, "gpu_models": A100, "workload_class": "training"}


def queue_ahead_chain(dag_id: str, *, train_exit_code: int = 0, **dag_args: Any) -> DAG:
    """``train`` (1 GPU, expected to take 2 s) then ``evaluate`` (2 GPUs): evaluate queues ahead."""
    with DAG(dag_id, schedule=None, start_date=START, catchup=False, **dag_args) as dag:
        annotations = {"gpupool.emulator/exit-code": str(train_exit_code)} if train_exit_code else {}
        train = GpuPodOperator(
            task_id="train", name="train", expected_duration=2, annotations=annotations, retries=0, **QA_TRAIN
        )
        train >> GpuPodOperator(task_id="evaluate", name="evaluate", **QA_EVALUATE)
    return dag


queue_ahead_ok = queue_ahead_chain("queue_ahead_chain")
queue_ahead_failed = queue_ahead_chain("queue_ahead_failed", train_exit_code=1)
queue_ahead_param_off = queue_ahead_chain("queue_ahead_param_off", params={"gpupool_queue_ahead": False})
