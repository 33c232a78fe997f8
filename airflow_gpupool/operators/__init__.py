"""Operators: GpuPodOperator, GpuJobOperator (a gang of pods as an Indexed Job) and the slice bindings they use."""

from __future__ import annotations

from airflow_gpupool.binding import BINDINGS, PodBinding, SliceBinding
from airflow_gpupool.operators.gpu_job import GpuJobOperator
from airflow_gpupool.operators.gpu_pod import GpuPodOperator

__all__ = ["BINDINGS", "GpuJobOperator", "GpuPodOperator", "PodBinding", "SliceBinding"]
