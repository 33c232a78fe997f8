"""Hourly inference refresh: recompute embeddings on one MIG slice, as an inference workload.

``refresh_embeddings`` reserves a ``1g.10gb`` MIG slice with ``workload_class="inference"``: the
ledger never places it on a node that runs training, and its pod gets the inference PriorityClass
(``[gpupool] workload_priority_classes``, default ``gpupool-inference``).

Configuration from the environment at parse time (no I/O): ``KUBECONFIG`` (unset: in-cluster) and
``GPUPOOL_EMULATOR=1`` to add the Kubernetes emulator's pod annotations.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG

from airflow_gpupool.operators import GpuPodOperator

EMULATOR = os.environ.get("GPUPOOL_EMULATOR") == "1"
KUBECONFIG = os.environ.get("KUBECONFIG")

# The start of the hour to refresh: the data interval's, or, for a run triggered without a
# logical date (UI or REST API, Airflow 3), the hour before the run.
SINCE = "{{ (dag_run.data_interval_start or dag_run.run_after - macros.timedelta(hours=1)).isoformat() }}"

with DAG(
    dag_id="inference_refresh",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["gpupool", "example"],
    doc_md=__doc__,
) as dag:
    GpuPodOperator(
        task_id="refresh_embeddings",
        name="refresh-embeddings",
        namespace="default",
        image="ghcr.io/example/embed:1.0",
        cmds=["python", "-m", "embed", "--since", SINCE],
        config_file=KUBECONFIG,
        in_cluster=not KUBECONFIG,
        get_logs=True,
        startup_check_interval_seconds=1,
        poll_interval=0.5 if EMULATOR else 10,
        mig_profile="1g.10gb",
        workload_class="inference",
        team="search",
        priority=20,
        reservation_timeout=1800,
        deferrable=True,
        annotations={"gpupool.emulator/log-lines": '["embedded 1000 items"]'} if EMULATOR else {},
    )
