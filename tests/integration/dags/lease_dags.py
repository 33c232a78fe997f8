"""DAGs whose pod outlives its lease: the test releases the grant while the pod runs."""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_gpupool.operators import GpuPodOperator

KUBECONFIG = os.environ.get("GPUPOOL_TEST_KUBECONFIG", "/nonexistent/kubeconfig")


def long_pod_dag(dag_id: str, *, deferrable: bool) -> DAG:
    """A pod that would run a minute, on a 3 s lease (renewed every second): a loss shows at once."""
    with DAG(
        dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["gpupool-test"]
    ) as dag:
        GpuPodOperator(
            task_id="train",
            name=dag_id.replace("_", "-"),
            random_name_suffix=False,
            namespace="default",
            image="registry.example/train:1",
            cmds=["python", "train.py"],
            config_file=KUBECONFIG,
            in_cluster=False,
            get_logs=True,
            startup_check_interval_seconds=1,
            poll_interval=0.2,
            gpus=1,
            lease_ttl=3,
            deferrable=deferrable,
            annotations={"gpupool.emulator/duration-seconds": "60"},
        )
    return dag


lease_lost_sync = long_pod_dag("gpu_lease_lost", deferrable=False)
lease_lost_deferrable = long_pod_dag("gpu_lease_lost_deferrable", deferrable=True)
