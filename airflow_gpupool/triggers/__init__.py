"""Triggers: wait for a reservation, keep a grant's lease alive, watch checkpoints."""

from __future__ import annotations

from airflow_gpupool.checkpoints.progress import CheckpointEventStatus
from airflow_gpupool.triggers.checkpoint import CheckpointTrigger
from airflow_gpupool.triggers.job import LeasedJobTrigger
from airflow_gpupool.triggers.pod import LeasedPodTrigger
from airflow_gpupool.triggers.reservation import ReservationEventStatus, ReservationTrigger

__all__ = [
    "CheckpointEventStatus",
    "CheckpointTrigger",
    "LeasedJobTrigger",
    "LeasedPodTrigger",
    "ReservationEventStatus",
    "ReservationTrigger",
]
