"""DAGs for the checkpoint, retry and escalation end-to-end tests (emulator + SQLite ledger).

Checkpoints go under ``$AIRFLOW_HOME/checkpoints/<dag_id>/<run_id>`` (a local path the emulator's
kubelet writes); escalations are appended to ``$AIRFLOW_HOME/escalations.jsonl``.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, BaseNotifier

from airflow_gpupool.notifiers import ESCALATION_KEY
from airflow_gpupool.operators import GpuPodOperator
from airflow_gpupool.sensors import CheckpointSensor

KUBECONFIG = os.environ.get("GPUPOOL_TEST_KUBECONFIG", "/nonexistent/kubeconfig")
HOME = os.environ.get("AIRFLOW_HOME", "/tmp")
CHECKPOINTS = os.path.join(HOME, "checkpoints", "{{ dag.dag_id }}", "{{ run_id }}")
ESCALATIONS = os.path.join(HOME, "escalations.jsonl")
T4 = ["Tesla-T4"]

COMMON: dict[str, Any] = {
    "namespace": "default",
    "image": "registry.example/train:1",
    "cmds": ["python", "train.py"],
    "config_file": KUBECONFIG,
    "in_cluster": False,
    "get_logs": True,
    "startup_check_interval_seconds": 1,
    "startup_timeout_seconds": 10,
    "poll_interval": 0.2,
    "lease_ttl": 30,
    "retry_delay": timedelta(0),
    "checkpoint_dir": CHECKPOINTS,
}


class RecordingNotifier(BaseNotifier):
    """Append each escalation to a JSON-lines file the test reads."""

    def notify(self, context: Any) -> None:
        """Write the escalation."""
        with open(ESCALATIONS, "a") as f:
            f.write(json.dumps(context[ESCALATION_KEY]) + "\n")


def emulate(**behaviour: str) -> dict[str, str]:
    """Return pod annotations that tell the emulator's kubelet what to do."""
    return {"gpupool.emulator/" + key.replace("_", "-"): value for key, value in behaviour.items()}


def training_dag(dag_id: str, *, watch: bool = False, **kwargs: Any) -> DAG:
    """Return a DAG whose task ``train`` is a GpuPodOperator, optionally followed by a CheckpointSensor."""
    with DAG(
        dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["gpupool-test"]
    ) as dag:
        train = GpuPodOperator(
            task_id="train",
            name=dag_id.replace("_", "-"),
            escalation_notifier=RecordingNotifier(),
            **{**COMMON, **kwargs},
        )
        if watch:
            train >> CheckpointSensor(
                task_id="watch",
                checkpoint_dir=CHECKPOINTS,
                keep_checkpoints=2,
                deferrable=False,
                poke_interval=0.1,
                timeout=30,
            )
    return dag


resume = training_dag(
    "ckpt_resume",
    watch=True,
    gpus=1,
    retries=1,
    keep_checkpoints=2,
    annotations=emulate(checkpoint_steps="5", fail_after_step="3"),
)
oom = training_dag(
    "ckpt_oom",
    gpu_milli=250,
    gpu_memory_mib=4096,
    gpu_models=T4,
    retries=1,
    annotations=emulate(checkpoint_steps="2"),
)
image_pull = training_dag("ckpt_image_pull", gpus=1, retries=2, annotations=emulate(image_pull_error="true"))
preempted = training_dag(
    "ckpt_preempted", gpus=1, retries=1, annotations=emulate(checkpoint_steps="4", duration_seconds="1")
)
evicted_twice = training_dag(
    "ckpt_evicted_twice", gpus=1, retries=2, annotations=emulate(checkpoint_steps="4", duration_seconds="1")
)
exhausted = training_dag(
    "ckpt_exhausted",
    gpus=1,
    retries=1,
    deferrable=True,  # the pod is watched by the trigger: classification through trigger_reentry
    annotations=emulate(
        checkpoint_steps="2",
        exit_code="1",
        log_lines='["epoch 1", "Traceback (most recent call last):", "RuntimeError: boom"]',
    ),
)


# Preemptible training on the whole A100 node: preempted by urgent work, it checkpoints on SIGTERM
# within its 20 s grace and its retry resumes there (a 3 s lease: the notice comes within 1 s).
# checkpoint_on_sigterm tells the ledger; the emulator's annotation makes the pod do it.
def preemptible_dag(dag_id: str, *, deferrable: bool) -> DAG:
    return training_dag(
        dag_id,
        gpus=4,
        gpu_models=["NVIDIA-A100-SXM4-80GB"],
        retries=1,
        preemptible=True,
        preemption_grace_seconds=20,
        checkpoint_on_sigterm=True,
        lease_ttl=3,
        keep_checkpoints=None,
        deferrable=deferrable,
        annotations=emulate(checkpoint_steps="6", checkpoint_on_sigterm="true"),
    )


preemptible = preemptible_dag("ckpt_preemptible", deferrable=False)
preemptible_deferrable = preemptible_dag("ckpt_preemptible_deferrable", deferrable=True)
