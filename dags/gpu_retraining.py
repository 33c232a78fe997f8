"""Weekly retraining: prepare data, train with checkpoints, evaluate on a GPU fraction, promote if better.

``prepare_data`` is a CPU pod. ``train`` reserves one whole A100 from the GPU ledger and writes
checkpoints under ``$GPUPOOL_CHECKPOINT_ROOT/<dag_id>/<run_id>`` (default
``$AIRFLOW_HOME/checkpoints``); a failed try is retried and resumes from the newest valid
checkpoint. ``watch_checkpoints`` (a :class:`CheckpointSensor`) confirms the completion marker,
prunes old checkpoints and hands the final manifest to XCom. ``evaluate`` runs on a quarter of a
shared GPU, and ``decide`` promotes the model only when the final checkpoint's loss beats the
current model's (the ``current_loss`` param).

Configuration, all read from the environment when the file is parsed (no I/O):

* ``KUBECONFIG``: the cluster (unset: in-cluster configuration);
* ``GPUPOOL_CHECKPOINT_ROOT``: where checkpoints go (a path or URL every pod and worker can reach),
  read through the Airflow connection ``GPUPOOL_CHECKPOINT_CONN_ID`` names, if any;
* ``GPUPOOL_EMULATOR=1``: add the pod annotations that steer the Kubernetes emulator
  (``airflow_gpupool.testing``): training writes 5 checkpoints and crashes once after step 3, and
  retries come at once. Without it these are plain real-cluster DAGs.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from typing import Any

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.sdk import DAG, Param, task

from airflow_gpupool.operators import GpuPodOperator
from airflow_gpupool.sensors import CheckpointSensor

EMULATOR = os.environ.get("GPUPOOL_EMULATOR") == "1"
KUBECONFIG = os.environ.get("KUBECONFIG")
CHECKPOINT_ROOT = os.environ.get("GPUPOOL_CHECKPOINT_ROOT") or os.path.join(
    os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow"), "checkpoints"
)
# The day's dataset: the logical date's, or the run's own day when it was triggered without one
# (UI or REST API, Airflow 3: no `ds`, no data interval).
DATASET = "s3://datasets/recsys/{{ (dag_run.logical_date or dag_run.run_after) | ds }}"
CHECKPOINTS = CHECKPOINT_ROOT.rstrip("/") + "/{{ dag.dag_id }}/{{ run_id }}"
# An Airflow connection for the checkpoint store (ObjectStoragePath: an aws connection for s3://).
CHECKPOINT_CONN_ID = os.environ.get("GPUPOOL_CHECKPOINT_CONN_ID") or None
SHARED_GPUS = ["Tesla-T4", "NVIDIA-L4"]

POD: dict[str, Any] = {
    "namespace": "default",
    "config_file": KUBECONFIG,
    "in_cluster": not KUBECONFIG,
    "get_logs": True,
    "startup_check_interval_seconds": 1,
    "poll_interval": 0.5 if EMULATOR else 10,
}


def emulate(**behaviour: str) -> dict[str, str]:
    """Return the emulator's pod annotations, or none on a real cluster.

    :param behaviour: annotation names (``_`` for ``-``) and values
    """
    if not EMULATOR:
        return {}
    return {"gpupool.emulator/" + key.replace("_", "-"): value for key, value in behaviour.items()}


with DAG(
    dag_id="gpu_retraining",
    schedule="@weekly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    params={"current_loss": Param(0.5, type="number", description="loss of the model in production")},
    tags=["gpupool", "example"],
    doc_md=__doc__,
) as dag:
    prepare_data = KubernetesPodOperator(
        task_id="prepare_data",
        name="prepare-data",
        image="ghcr.io/example/prepare:1.0",
        cmds=["python", "-m", "prepare", "--out", DATASET],
        **POD,
    )
    train = GpuPodOperator(
        task_id="train",
        name="train",
        image="ghcr.io/example/train:1.0",
        cmds=["python", "-m", "train", "--data", DATASET],
        gpus=1,
        gpu_models=["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"],
        workload_class="training",
        team="recsys",
        priority=10,
        checkpoint_dir=CHECKPOINTS,
        checkpoint_conn_id=CHECKPOINT_CONN_ID,
        keep_checkpoints=3,
        retries=2,
        retry_delay=timedelta(0) if EMULATOR else timedelta(minutes=5),
        deferrable=True,
        annotations=emulate(checkpoint_steps="5", fail_after_step="3"),
        **POD,
    )
    watch_checkpoints = CheckpointSensor(
        task_id="watch_checkpoints",
        checkpoint_dir=CHECKPOINTS,
        conn_id=CHECKPOINT_CONN_ID,
        keep_checkpoints=3,
        max_interval=timedelta(hours=2),
        on_stall="escalate",
        deferrable=False,
        poke_interval=0.2 if EMULATOR else 60,
        timeout=60 if EMULATOR else 12 * 3600,
    )
    evaluate = GpuPodOperator(
        task_id="evaluate",
        name="evaluate",
        image="ghcr.io/example/evaluate:1.0",
        cmds=[
            "python",
            "-m",
            "evaluate",
            "--checkpoint",
            "{{ ti.xcom_pull(task_ids='watch_checkpoints')['location'] }}",
        ],
        gpu_milli=250,
        gpu_memory_mib=4096,
        gpu_models=SHARED_GPUS,
        workload_class="batch",
        team="recsys",
        deferrable=True,
        annotations=emulate(log_lines='["eval loss computed"]'),
        **POD,
    )

    @task.branch
    def decide(params: dict[str, Any], ti: Any = None) -> str:
        """Return ``promote`` when the newest checkpoint's loss beats the current model's, else ``keep_current``."""
        manifest = ti.xcom_pull(task_ids="watch_checkpoints")
        loss = float(manifest["metrics"]["loss"])
        better = loss < float(params["current_loss"])
        print(
            f"checkpoint step {manifest['step']}: loss {loss} vs current {params['current_loss']}: {better=}"
        )
        return "promote" if better else "keep_current"

    promote = KubernetesPodOperator(
        task_id="promote",
        name="promote",
        image="ghcr.io/example/registry-cli:1.0",
        cmds=["python", "-m", "promote", "{{ ti.xcom_pull(task_ids='watch_checkpoints')['location'] }}"],
        **POD,
    )

    @task
    def keep_current(params: dict[str, Any]) -> float:
        """Keep the model in production; return its loss."""
        return float(params["current_loss"])

    prepare_data >> train >> watch_checkpoints >> evaluate >> decide() >> [promote, keep_current()]
