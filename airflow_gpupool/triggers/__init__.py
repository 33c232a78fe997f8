"""Triggers: wait for a reservation, and keep a grant's lease alive while its pod runs."""

from __future__ import annotations

from airflow_gpupool.triggers.pod import LeasedPodTrigger
from airflow_gpupool.triggers.reservation import ReservationEventStatus, ReservationTrigger

__all__ = ["LeasedPodTrigger", "ReservationEventStatus", "ReservationTrigger"]
