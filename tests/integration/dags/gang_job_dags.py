"""DAGs for the GpuJobOperator tests: a gang of 3 pods as one Indexed Job on the emulator."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.sdk import DAG

from airflow_gpupool.operators import GpuJobOperator

KUBECONFIG = os.environ.get("GPUPOOL_TEST_KUBECONFIG", "/nonexistent/kubeconfig")

GANG: dict[str, Any] = {
    "members": 3,
    "gpus": 1,
    "gpu_models": ["NVIDIA-A100-SXM4-80GB"],
    "namespace": "default",
    "image": "registry.example/trainer:1",
    "cmds": ["torchrun", "train.py"],
    "config_file": KUBECONFIG,
    "in_cluster": False,
    "get_logs": True,
    "job_poll_interval": 0.2,
    "lease_ttl": 30,
    "annotations": {"gpupool.emulator/duration-seconds": "0.5"},
}


def _dag(dag_id: str) -> DAG:
    return DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["gpupool-test"])


with _dag("gang_job") as gang_job:
    GpuJobOperator(task_id="train", name="train", **GANG)


with _dag("gang_job_deferrable") as gang_job_deferrable:
    GpuJobOperator(task_id="train", name="train", deferrable=True, **GANG)


with _dag("gang_job_queued") as gang_job_queued:
    # Waits (deferred) while the pool cannot hold the whole gang.
    GpuJobOperator(task_id="train", name="train", deferrable=True, reservation_timeout=20, **GANG)


with _dag("gang_job_too_busy") as gang_job_too_busy:
    GpuJobOperator(task_id="train", name="train", deferrable=True, reservation_timeout=2, **GANG)


with _dag("gang_job_failing") as gang_job_failing:
    GpuJobOperator(
        task_id="train",
        name="train",
        **{**GANG, "annotations": {"gpupool.emulator/exit-code": "1"}},
    )


#: A Job that would run a minute, on a 3 s lease (renewed every second): a lost lease shows at once.
LONG = {**GANG, "lease_ttl": 3, "annotations": {"gpupool.emulator/duration-seconds": "60"}}

with _dag("gang_job_lease_lost") as gang_job_lease_lost:
    GpuJobOperator(task_id="train", name="train", **LONG)


with _dag("gang_job_lease_lost_deferrable") as gang_job_lease_lost_deferrable:
    GpuJobOperator(task_id="train", name="train", deferrable=True, **LONG)


with _dag("gang_job_replaced") as gang_job_replaced:
    # The Job may replace one failed pod: the replacement runs on the same member's slice.
    GpuJobOperator(task_id="train", name="train", backoff_limit=1, **GANG)


with _dag("gang_job_replaced_deferrable") as gang_job_replaced_deferrable:
    GpuJobOperator(
        task_id="train",
        name="train",
        backoff_limit=1,
        deferrable=True,
        **GANG,
    )
