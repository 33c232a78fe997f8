"""Example: a fine-tuning step on a quarter of a GPU, reserved from the GPU pool first.

The task reserves 250 milli-GPU with 10 GiB of GPU memory, waits deferred (holding no worker
slot) while nothing fits, then runs a pod pinned to the slice it was granted; the slice is
released however the task ends. Point it at a cluster with ``KUBECONFIG`` (or run it in-cluster)
and at a ledger with the ``gpupool_default`` connection or ``GPUPOOL_LEDGER_URL``.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_gpupool.operators import GpuPodOperator

with DAG(
    dag_id="example_gpu_pod",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["gpupool", "example"],
    doc_md=__doc__,
) as dag:
    GpuPodOperator(
        task_id="fine_tune",
        name="fine-tune",
        namespace="default",
        image="ghcr.io/example/fine-tune:1.0",
        cmds=["python", "-m", "train", "--epochs", "3"],
        config_file=os.environ.get("KUBECONFIG"),
        in_cluster=not os.environ.get("KUBECONFIG"),
        gpu_milli=250,
        gpu_memory_mib=10240,
        workload_class="training",
        team="recsys",
        priority=10,
        deferrable=True,
        get_logs=True,
        startup_check_interval_seconds=1,
        poll_interval=1,
    )
