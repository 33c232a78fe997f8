"""Checkpoint errors: a manifest that breaks the contract, checkpoints that stopped coming."""

from __future__ import annotations

from airflow_gpupool.exceptions.base import GpuPoolError

__all__ = ["CheckpointStalledError", "CorruptCheckpointError"]


class CorruptCheckpointError(GpuPoolError, ValueError):
    """A manifest exists but does not follow the contract.

    :param location: the step directory
    :param detail: what is wrong
    """

    def __init__(self, location: str, detail: str) -> None:
        self.location = location
        self.detail = detail
        super().__init__(f"corrupt checkpoint {location}: {detail}")


class CheckpointStalledError(GpuPoolError):
    """No new valid checkpoint appeared within ``max_interval``.

    :param checkpoint_dir: the watched location
    :param last_step: the newest valid step (None: none yet)
    :param message: what the watch saw
    """

    def __init__(self, checkpoint_dir: str, last_step: int | None, message: str) -> None:
        self.checkpoint_dir = checkpoint_dir
        self.last_step = last_step
        super().__init__(f"checkpoints at {checkpoint_dir} stalled: {message}")
