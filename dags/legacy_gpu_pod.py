"""A team's older DAG that knows nothing of gpupool: a plain KubernetesPodOperator asking for one GPU.

``embed_catalog`` is an ordinary ``KubernetesPodOperator`` with ``nvidia.com/gpu: 1`` and no
gpupool argument. With the executor hook installed (``airflow_local_settings.py``: ``from
airflow_gpupool.executor_hook import pod_mutation_hook``) its pod is created behind the
``gpupool.io/reservation`` scheduling gate; the gatekeeper of ``gpupool controller run`` reserves
the GPU in the ledger, pins the pod to the granted node and removes the gate. Without the hook it
is a plain real-cluster DAG.

Configuration from the environment at parse time (no I/O): ``KUBECONFIG`` (unset: in-cluster) and
``GPUPOOL_EMULATOR=1`` to add the Kubernetes emulator's pod annotations.
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk import DAG
from kubernetes.client import models as k8s

EMULATOR = os.environ.get("GPUPOOL_EMULATOR") == "1"
KUBECONFIG = os.environ.get("KUBECONFIG")

with DAG(
    dag_id="legacy_gpu_pod",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["gpupool", "example"],
    doc_md=__doc__,
) as dag:
    KubernetesPodOperator(
        task_id="embed_catalog",
        name="embed-catalog",
        namespace="default",
        image="ghcr.io/example/embed:0.9",
        cmds=["python", "-m", "embed", "--catalog", "s3://catalog/latest"],
        container_resources=k8s.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"}),
        # The A100 nodes: the executor hook turns this into the request's GPU model.
        node_selector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        config_file=KUBECONFIG,
        in_cluster=not KUBECONFIG,
        get_logs=True,
        startup_check_interval_seconds=1,
        startup_timeout_seconds=120,
        poll_interval=0.5 if EMULATOR else 10,
        annotations={"gpupool.emulator/log-lines": '["embedded 5000 items"]'} if EMULATOR else {},
    )
