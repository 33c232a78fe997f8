"""Sensors: follow a training's checkpoints."""

from __future__ import annotations

from airflow_gpupool.sensors.checkpoint import CheckpointSensor, CheckpointStalledError

__all__ = ["CheckpointSensor", "CheckpointStalledError"]
