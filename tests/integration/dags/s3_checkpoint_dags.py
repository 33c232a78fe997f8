"""The checkpoint end-to-end DAG with its checkpoints on S3 (moto's server, ``tests/s3_fixtures.py``).

The operator, the sensor and its trigger reach the bucket through ObjectStoragePath and the
``gpupool_s3`` connection; the emulated training writes there through fsspec and the ``AWS_*``
variables, as a container on a shared object store would.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_gpupool.operators import GpuPodOperator
from airflow_gpupool.sensors import CheckpointSensor

# Not imported from checkpoint_dags.py: the DagBag would take that file's DAGs from here too.
S3_CONN_ID = "gpupool_s3"
S3_CHECKPOINTS = "s3://gpupool-checkpoints/e2e/{{ dag.dag_id }}/{{ run_id }}"

with DAG(
    "ckpt_s3_resume", schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["gpupool-test"]
) as s3_resume:
    GpuPodOperator(
        task_id="train",
        name="ckpt-s3-resume",
        gpus=1,
        retries=1,
        keep_checkpoints=2,
        annotations={"gpupool.emulator/checkpoint-steps": "5", "gpupool.emulator/fail-after-step": "3"},
        checkpoint_dir=S3_CHECKPOINTS,
        checkpoint_conn_id=S3_CONN_ID,
        namespace="default",
        image="registry.example/train:1",
        cmds=["python", "train.py"],
        config_file=os.environ.get("GPUPOOL_TEST_KUBECONFIG", "/nonexistent/kubeconfig"),
        in_cluster=False,
        get_logs=True,
        startup_check_interval_seconds=1,
        startup_timeout_seconds=10,
        poll_interval=0.2,
        lease_ttl=30,
        retry_delay=timedelta(0),
    ) >> CheckpointSensor(
        task_id="watch",
        checkpoint_dir=S3_CHECKPOINTS,
        conn_id=S3_CONN_ID,
        keep_checkpoints=2,
        deferrable=True,  # the trigger reads S3 through the connection too
        poke_interval=0.2,
        timeout=30,
    )
