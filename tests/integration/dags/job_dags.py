"""DAGs for the Job tests: the provider's own ``KubernetesJobOperator`` on the emulator (sync and deferrable)."""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator
from airflow.sdk import DAG

KUBECONFIG = os.environ.get("GPUPOOL_TEST_KUBECONFIG", "/nonexistent/kubeconfig")

JOB: dict[str, Any] = {
    "namespace": "default",
    "image": "registry.example/python:3.11",
    "cmds": ["python", "-c", "print('step')"],
    "config_file": KUBECONFIG,
    "in_cluster": False,
    "get_logs": True,
    "wait_until_job_complete": True,
    "job_poll_interval": 0.2,
    "completion_mode": "Indexed",
    "completions": 2,
    "parallelism": 2,
    "backoff_limit": 0,
    "annotations": {"gpupool.emulator/log-lines": '["epoch 1", "epoch 2"]'},
}


def _dag(dag_id: str) -> DAG:
    return DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["gpupool-test"])


with _dag("plain_job") as plain_job:
    KubernetesJobOperator(task_id="indexed", name="indexed", **JOB)


with _dag("plain_job_deferrable") as plain_job_deferrable:
    # The provider's Job trigger ignores config_file (its async hook reads only the connection or
    # the default kubeconfig): the emulator comes from a connection, set by the test.
    KubernetesJobOperator(
        task_id="indexed",
        name="indexed-deferred",
        deferrable=True,
        kubernetes_conn_id="kubernetes_emulator",
        **{**JOB, "config_file": None},
    )


with _dag("plain_job_failing") as plain_job_failing:
    KubernetesJobOperator(
        task_id="crash",
        name="crash",
        **{**JOB, "annotations": {"gpupool.emulator/exit-code": "3"}},
    )
