"""GpuPodOperator DAGs whose Airflow deadline the GPU queue makes unreachable, deferred and in place (the example's is reachable)."""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG

try:  # Airflow 3.2 and newer; on 3.1 (make test-oldest) this file defines no DAG
    from airflow.sdk import AsyncCallback, DeadlineAlert, DeadlineReference
except ImportError:
    DeadlineAlert = None

from airflow_gpupool.notifiers.deadline import log_missed_deadline
from airflow_gpupool.operators import GpuPodOperator

KUBECONFIG = os.environ.get("GPUPOOL_TEST_KUBECONFIG", "/nonexistent/kubeconfig")

if DeadlineAlert is not None:
    # The same task waiting deferred (the trigger) and in place (the worker's own polls).
    for dag_id, deferrable in (
        ("gpu_deadline_unreachable", True),
        ("gpu_deadline_unreachable_in_place", False),
    ):
        with DAG(
            dag_id,
            schedule=None,
            start_date=datetime(2026, 1, 1),
            catchup=False,
            tags=["gpupool-test"],
            deadline=DeadlineAlert(
                reference=DeadlineReference.DAGRUN_QUEUED_AT,
                interval=timedelta(minutes=1),
                callback=AsyncCallback(log_missed_deadline),
                name="within a minute",
            ),
        ):
            GpuPodOperator(
                task_id="train",
                name="deadline-train",
                namespace="default",
                image="registry.example/train:1",
                cmds=["python", "train.py"],
                config_file=KUBECONFIG,
                in_cluster=False,
                get_logs=True,
                startup_check_interval_seconds=1,
                poll_interval=0.2,
                gpus=1,
                gpu_models=["NVIDIA-A100-SXM4-80GB"],
                deferrable=deferrable,
                reservation_timeout=120,
            )
