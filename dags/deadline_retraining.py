"""Example: a retraining task under an Airflow deadline, told early when the GPU queue makes it unreachable.

The DAG declares an Airflow 3 ``DeadlineAlert``: the run should be done two hours after it was
queued. ``GpuPodOperator`` reads the DAG's deadlines on the worker and hands them to its waiting
trigger; when the controller's forecast says that even the earliest likely start (p10) lies past
a deadline, or that the request never starts on the current nodes, the trigger logs a warning,
the task records the ``gpupool_deadline`` XCom (each unreachable deadline and the forecast in
words) and goes on waiting in its place. It says so once per deadline. Airflow itself still
calls the alert's callback if the deadline passes; here it is the provider's
``log_missed_deadline``.

Deadlines the worker can evaluate: ``FIXED_DATETIME``, ``DAGRUN_LOGICAL_DATE`` and
``DAGRUN_QUEUED_AT`` (read as the run's start date). ``AVERAGE_RUNTIME`` needs Airflow's
database and is not compared. The forecast needs the controller (``gpupool controller run``). Airflow 3.1 has no deadline
alerts: there the DAG runs without one.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG

from airflow_gpupool.notifiers.deadline import log_missed_deadline
from airflow_gpupool.operators import GpuPodOperator

DEADLINE: dict[str, Any] = {}
try:  # Airflow 3.2 and newer
    from airflow.sdk import AsyncCallback, DeadlineAlert, DeadlineReference

    DEADLINE["deadline"] = DeadlineAlert(
        reference=DeadlineReference.DAGRUN_QUEUED_AT,
        interval=timedelta(hours=2),
        callback=AsyncCallback(log_missed_deadline, kwargs={"team": "recsys"}),
        name="retrained within 2 h",
    )
except ImportError:  # Airflow 3.1: no deadline alerts, the DAG runs without one
    pass

with DAG(
    dag_id="deadline_retraining",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["gpupool", "example"],
    doc_md=__doc__,
    **DEADLINE,
) as dag:
    GpuPodOperator(
        task_id="retrain",
        name="retrain",
        namespace="default",
        image="ghcr.io/example/retrain:1.0",
        cmds=["python", "-m", "train"],
        config_file=os.environ.get("KUBECONFIG"),
        in_cluster=not os.environ.get("KUBECONFIG"),
        gpus=1,
        gpu_models=["NVIDIA-A100-SXM4-80GB"],
        workload_class="training",
        team="recsys",
        deferrable=True,
        get_logs=True,
        startup_check_interval_seconds=1,
        poll_interval=1,
    )
