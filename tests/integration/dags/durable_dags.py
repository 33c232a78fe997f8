"""DAGs whose worker dies mid-pod: the test SIGKILLs the process running the first try."""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_gpupool.operators import GpuPodOperator

KUBECONFIG = os.environ.get("GPUPOOL_TEST_KUBECONFIG", "/nonexistent/kubeconfig")


def worker_death_dag(dag_id: str, *, durable: bool) -> DAG:
    """A pod that runs until the test ends it (90 s at most), on a 3 s lease: once its worker is killed the lease expires and the grant is orphaned."""
    with DAG(
        dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["gpupool-test"]
    ) as dag:
        GpuPodOperator(
            task_id="train",
            name=dag_id.replace("_", "-"),
            namespace="default",
            image="registry.example/train:1",
            cmds=["python", "train.py"],
            config_file=KUBECONFIG,
            in_cluster=False,
            get_logs=True,
            startup_check_interval_seconds=1,
            poll_interval=0.2,
            gpus=2,
            lease_ttl=3,
            durable=durable,
            retries=1,
            retry_delay=timedelta(seconds=0),
            annotations={"gpupool.emulator/duration-seconds": "90"},
        )
    return dag


durable = worker_death_dag("gpu_worker_death_durable", durable=True)
not_durable = worker_death_dag("gpu_worker_death_not_durable", durable=False)
