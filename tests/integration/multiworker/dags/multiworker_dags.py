"""The multi-worker end-to-end DAGs: GPU tasks of three DAGs racing for a three-GPU pool.

``mw_long`` runs two long pods (one ``durable=True``, one ``durable=False``) that the test kills
the worker of; ``mw_race_a`` and ``mw_race_b`` run short pods that wait for GPUs in the ledger's
queue (deferred: no worker slot while they wait). Every DAG runs once as soon as it is parsed
(``@once``, unpaused at creation). The cluster comes from ``KUBECONFIG``, the ledger from the
``gpupool_default`` connection (``AIRFLOW_CONN_GPUPOOL_DEFAULT``), both set by the harness.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG

from airflow_gpupool.operators import GpuPodOperator

# The first try of each long task runs its pod long enough to outlive the kill and the retry's
# start on a loaded machine (the retry of the durable task re-attaches to it); a later try's new
# pod (the ephemeral task's) is short, as the test needs it only to finish.
FIRST_TRY_POD_SECONDS = os.environ.get("GPUPOOL_MW_FIRST_TRY_POD_SECONDS", "90")
RETRY_POD_SECONDS = os.environ.get("GPUPOOL_MW_RETRY_POD_SECONDS", "5")
LONG_POD_SECONDS = f"{{{{ '{FIRST_TRY_POD_SECONDS}' if ti.try_number == 1 else '{RETRY_POD_SECONDS}' }}}}"
SHORT_POD_SECONDS = os.environ.get("GPUPOOL_MW_SHORT_POD_SECONDS", "3")

COMMON: dict[str, Any] = {
    "namespace": "default",
    "image": "registry.example/train:1",
    "cmds": ["python", "train.py"],
    "in_cluster": False,  # KUBECONFIG points at the emulator
    "get_logs": True,
    "startup_check_interval_seconds": 1,
    "poll_interval": 0.5,
    # Long enough to outlast the wait between a grant made while deferred and the resumed try
    # binding its pod on a loaded machine (nothing renews the lease in between).
    "lease_ttl": 30,
    # The pod part runs on the worker (sync), so killing the worker kills the try mid-pod;
    # the wait for a GPU is deferred to the triggerer.
    "deferrable": False,
    "reservation_deferrable": True,
    "reservation_timeout": 240,
    "retries": 3,
    "retry_delay": timedelta(seconds=1),
    "gpus": 1,
}


def runs(seconds: str) -> dict[str, str]:
    """Return the emulator annotation that makes the pod run ``seconds``."""
    return {"gpupool.emulator/duration-seconds": seconds}


def once(dag_id: str) -> DAG:
    """Return a DAG that runs once, as soon as the scheduler sees it."""
    return DAG(
        dag_id,
        schedule="@once",
        start_date=datetime(2026, 1, 1),
        catchup=False,
        max_active_tasks=8,
        tags=["gpupool-multiworker"],
    )


with once("mw_long") as mw_long:
    # Queued first and picked up by the first worker, which the test then kills mid-pod.
    for task_id, durable in (("durable_pod", True), ("ephemeral_pod", False)):
        GpuPodOperator(
            task_id=task_id,
            name=task_id.replace("_", "-"),
            durable=durable,
            annotations=runs(LONG_POD_SECONDS),  # templated: rendered per try
            priority=10,  # the ledger serves them first
            priority_weight=100,
            weight_rule="absolute",
            **COMMON,
        )

for dag_id, tasks in (("mw_race_a", 3), ("mw_race_b", 3)):
    with once(dag_id) as dag:
        for i in range(tasks):
            GpuPodOperator(
                task_id=f"train_{i}",
                name=f"{dag_id.replace('_', '-')}-{i}",
                annotations=runs(SHORT_POD_SECONDS),
                **COMMON,
            )
    globals()[dag_id] = dag
