"""Example: a training relay admitted as a whole: preprocess, two trainings at once, evaluate.

``default_args={"gpu_admission": "run"}`` makes every GPU step of the DAG share one admission.
The run's peak concurrent need is read from the DAG when its first GPU step runs: ``train_large``
(2 GPUs) and ``train_small`` (1 GPU) run at the same time, so the peak is 3 GPUs. ``preprocess``
is granted only once the team's quota (or, without quotas, the pool's free A100s) can serve those
3 GPUs, so the run never starts and then stalls half-way for its trainings; a run whose peak is
more than the team's quota could ever give fails at ``preprocess`` with ``RunTooLargeError``,
before any pod exists. The later steps reserve as usual.

Configuration from the environment at parse time (no I/O): ``KUBECONFIG`` (unset: in-cluster).
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.sdk import DAG

from airflow_gpupool.operators import GpuPodOperator

KUBECONFIG = os.environ.get("KUBECONFIG")
EMULATOR = os.environ.get("GPUPOOL_EMULATOR") == "1"
COMMON: dict[str, Any] = {
    "namespace": "default",
    "image": "ghcr.io/example/relay:1.0",
    "config_file": KUBECONFIG,
    "in_cluster": not KUBECONFIG,
    "get_logs": True,
    "startup_check_interval_seconds": 1,
    "poll_interval": 0.5 if EMULATOR else 10,
}

with DAG(
    dag_id="pipeline_run_admission",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["gpupool", "example"],
    doc_md=__doc__,
    # Every GPU step below takes these: admitted as one run, for team vision, on A100s.
    default_args={"gpu_admission": "run", "team": "vision", "gpu_models": ["NVIDIA-A100-SXM4-80GB"]},
) as dag:
    preprocess = GpuPodOperator(
        task_id="preprocess", name="preprocess", cmds=["python", "-m", "prep"], gpus=1, **COMMON
    )
    train_large = GpuPodOperator(
        task_id="train_large",
        name="train-large",
        cmds=["python", "-m", "train", "--size", "large"],
        gpus=2,
        workload_class="training",
        **COMMON,
    )
    train_small = GpuPodOperator(
        task_id="train_small",
        name="train-small",
        cmds=["python", "-m", "train", "--size", "small"],
        gpus=1,
        workload_class="training",
        **COMMON,
    )
    evaluate = GpuPodOperator(
        task_id="evaluate", name="evaluate", cmds=["python", "-m", "evaluate"], gpus=1, **COMMON
    )
    preprocess >> [train_large, train_small] >> evaluate
