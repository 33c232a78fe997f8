"""Hyper-parameter sweep: one trial per setting, each on a quarter of a shared GPU; pick the best.

``trial`` is one :class:`GpuPodOperator` mapped over the settings (``.partial().expand_kwargs()``);
each trial reserves 250 milli-GPU with 4 GiB of GPU memory and checkpoints under
``$GPUPOOL_CHECKPOINT_ROOT/<dag_id>/<run_id>/trial-<map index>`` (default root
``$AIRFLOW_HOME/checkpoints``). ``pick_best`` reads each trial's newest checkpoint manifest and
returns the setting with the lowest loss.

Configuration from the environment at parse time (no I/O): ``KUBECONFIG`` (unset: in-cluster),
``GPUPOOL_CHECKPOINT_ROOT`` (read through the Airflow connection ``GPUPOOL_CHECKPOINT_CONN_ID``
names, if any), and ``GPUPOOL_EMULATOR=1`` to add the Kubernetes emulator's pod annotations
(each trial writes as many checkpoints as it has epochs).
"""

from __future__ import annotations

import os
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, task

from airflow_gpupool.operators import GpuPodOperator

EMULATOR = os.environ.get("GPUPOOL_EMULATOR") == "1"
KUBECONFIG = os.environ.get("KUBECONFIG")
CHECKPOINT_ROOT = os.environ.get("GPUPOOL_CHECKPOINT_ROOT") or os.path.join(
    os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow"), "checkpoints"
)
RUN_CHECKPOINTS = CHECKPOINT_ROOT.rstrip("/") + "/{{ dag.dag_id }}/{{ run_id }}"
# An Airflow connection for the checkpoint store (ObjectStoragePath: an aws connection for s3://).
CHECKPOINT_CONN_ID = os.environ.get("GPUPOOL_CHECKPOINT_CONN_ID") or None
SETTINGS = [
    {"lr": "0.1", "epochs": "2"},
    {"lr": "0.01", "epochs": "4"},
    {"lr": "0.001", "epochs": "3"},
]


def trial_kwargs(setting: dict[str, str]) -> dict[str, Any]:
    """Return one trial's mapped arguments: its hyper-parameters as env, plus emulator annotations.

    :param setting: the hyper-parameters
    """
    kwargs: dict[str, Any] = {"env_vars": {"LR": setting["lr"], "EPOCHS": setting["epochs"]}}
    if EMULATOR:
        kwargs["annotations"] = {"gpupool.emulator/checkpoint-steps": setting["epochs"]}
    return kwargs


with DAG(
    dag_id="gpu_sweep",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["gpupool", "example"],
    doc_md=__doc__,
) as dag:
    trials = GpuPodOperator.partial(
        task_id="trial",
        name="sweep-trial",
        namespace="default",
        image="ghcr.io/example/train:1.0",
        cmds=["python", "-m", "train"],
        config_file=KUBECONFIG,
        in_cluster=not KUBECONFIG,
        get_logs=True,
        startup_check_interval_seconds=1,
        poll_interval=0.5 if EMULATOR else 10,
        gpu_milli=250,
        gpu_memory_mib=4096,
        gpu_models=["Tesla-T4", "NVIDIA-L4"],
        workload_class="training",
        team="research",
        checkpoint_dir=RUN_CHECKPOINTS + "/trial-{{ ti.map_index }}",
        checkpoint_conn_id=CHECKPOINT_CONN_ID,
        keep_checkpoints=2,
        deferrable=True,
    ).expand_kwargs([trial_kwargs(s) for s in SETTINGS])

    @task
    def pick_best(dag_id: str, run_id: str) -> dict[str, Any]:
        """Return the setting whose trial's newest checkpoint has the lowest loss."""
        from airflow_gpupool.checkpoints import CheckpointStore

        root = CHECKPOINT_ROOT.rstrip("/") + f"/{dag_id}/{run_id}"
        results = []
        for index, setting in enumerate(SETTINGS):
            newest = CheckpointStore(f"{root}/trial-{index}", conn_id=CHECKPOINT_CONN_ID).newest()
            if newest is not None and "loss" in newest.metrics:
                results.append((float(newest.metrics["loss"]), index, setting))
        if not results:
            raise ValueError(f"no trial under {root} left a checkpoint with a loss")
        loss, index, setting = min(results, key=lambda r: (r[0], r[1]))
        print(f"best trial {index}: {setting} with loss {loss}")
        return {"trial": index, "loss": loss, **setting}

    trials >> pick_best(dag_id="{{ dag.dag_id }}", run_id="{{ run_id }}")
