"""Distributed training: three pods, one GPU each, admitted as a gang and run as one Indexed Job.

``train`` is a :class:`GpuJobOperator`: it reserves a gang of 3 A100 slices from the GPU ledger
(all or nothing, preferring fewer nodes) before the Job exists, waits deferred while the pool
cannot hold the whole gang, then creates an Indexed Job of 3 pods. Each pod starts gated and is
pinned to its member's node and GPUs before it may be scheduled, so no member ever runs without
the rest of its gang. The gang's lease is renewed while the Job runs and the gang is released
when it ends, whichever way. ``report`` reads the finished Job from XCom.

Each member's container gets the rendezvous environment:

* ``MASTER_ADDR=<job>-0.<subdomain>``, ``MASTER_PORT=29500``, ``WORLD_SIZE=3`` and ``RANK`` (the
  pod's completion index, through the downward API) for ``torch.distributed``;
* ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``, ``PET_NNODES=3``, ``PET_NODE_RANK`` and
  ``PET_NPROC_PER_NODE`` (the member's GPUs), which ``torchrun`` reads in place of its options, so
  the command is just ``torchrun train.py``;
* ``GPUPOOL_GANG_HOSTS`` (every member's host, by rank) for Horovod elastic: run ``horovodrun
  --host-discovery-script discover.sh`` on rank 0, with ``discover.sh`` printing
  ``<host>:<slots>`` for each host of ``GPUPOOL_GANG_HOSTS``; the other ranks wait for it
  (``sshd`` or Gloo's rendezvous server, as your image provides). The gang is fixed: it never
  shrinks, so Horovod's elastic reset only happens on a failure, and a failure fails the Job
  (``backoff_limit=0``) and the try, which reserves a new gang;
* ``GPUPOOL_RESERVATION_ID``, ``GPUPOOL_NODE``, ``GPUPOOL_GPU_INDICES``: the member's own slice.

On a real cluster ``<job>-0.<subdomain>`` resolves only through a headless Service of that name
selecting ``batch.kubernetes.io/job-name=<job>``; name it with ``rendezvous_subdomain``.

Configuration from the environment at parse time (no I/O): ``KUBECONFIG`` (unset: in-cluster)
and ``GPUPOOL_EMULATOR=1`` to add the Kubernetes emulator's pod annotations (a short run with a
training log).
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any

from airflow.sdk import DAG, task

from airflow_gpupool.operators import GpuJobOperator

EMULATOR = os.environ.get("GPUPOOL_EMULATOR") == "1"
KUBECONFIG = os.environ.get("KUBECONFIG")
MEMBERS = 3
EMULATED_RUN = {
    "gpupool.emulator/duration-seconds": "0.5",
    "gpupool.emulator/log-lines": json.dumps(["rendezvous ok", "epoch 1 loss 0.9", "epoch 2 loss 0.5"]),
}

with DAG(
    dag_id="distributed_training",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["gpupool", "example"],
    doc_md=__doc__,
) as dag:
    train = GpuJobOperator(
        task_id="train",
        name="ddp-train",
        namespace="default",
        image="ghcr.io/example/train:1.0",
        cmds=["torchrun"],
        arguments=["-m", "train", "--epochs", "2"],
        config_file=KUBECONFIG,
        in_cluster=not KUBECONFIG,
        members=MEMBERS,
        gpus=1,
        gpu_models=["NVIDIA-A100-SXM4-80GB"],
        workload_class="training",
        team="research",
        get_logs=True,
        job_poll_interval=0.5 if EMULATOR else 10,
        annotations=EMULATED_RUN if EMULATOR else {},
        deferrable=True,
    )

    @task
    def report(job: dict[str, Any]) -> dict[str, Any]:
        """Return what the Job did: its name and how many members succeeded."""
        status = job.get("status") or {}
        return {"job": job["metadata"]["name"], "succeeded": status.get("succeeded"), "world_size": MEMBERS}

    report(train.output["job"])
