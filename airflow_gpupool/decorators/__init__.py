"""TaskFlow decorators of the provider: ``@task.gpu_pod``."""

from __future__ import annotations

from airflow_gpupool.decorators.gpu_pod import gpu_pod_task

__all__ = ["gpu_pod_task"]
