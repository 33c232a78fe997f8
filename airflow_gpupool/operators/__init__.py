"""Operators: GpuPodOperator and the slice bindings it uses."""

from __future__ import annotations

from airflow_gpupool.binding import BINDINGS, PodBinding, SliceBinding
from airflow_gpupool.operators.gpu_pod import GpuPodOperator

__all__ = ["BINDINGS", "GpuPodOperator", "PodBinding", "SliceBinding"]
