"""Expose the repository's example airflow DAGs (``dags/``) to the integration tests' DAG folder.

The test DAG folder runs against the Kubernetes emulator: ``GPUPOOL_EMULATOR=1`` makes the
examples add the emulator's pod annotations (set here, before they are imported).
"""

from __future__ import annotations

import os

os.environ.setdefault("GPUPOOL_EMULATOR", "1")

from dags.deadline_retraining import dag as deadline_retraining
from dags.distributed_training import dag as distributed_training
from dags.example_gpu_pod import dag as example_gpu_pod
from dags.gpu_retraining import dag as gpu_retraining
from dags.gpu_sweep import dag as gpu_sweep
from dags.inference_refresh import dag as inference_refresh
from dags.pipeline_run_admission import dag as pipeline_run_admission

__all__ = [
    "deadline_retraining",
    "distributed_training",
    "example_gpu_pod",
    "gpu_retraining",
    "gpu_sweep",
    "inference_refresh",
    "pipeline_run_admission",
]
