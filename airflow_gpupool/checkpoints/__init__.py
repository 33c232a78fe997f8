"""The checkpoint contract for training containers: manifests, listings, retention."""

from __future__ import annotations

from airflow_gpupool.checkpoints.manifest import (
    CHECKPOINT_DIR_ENV,
    COMPLETE_MARKER,
    MANIFEST_NAME,
    RESUME_ENV,
    STEP_DIR_FORMAT,
    CheckpointManifest,
    CorruptCheckpointError,
    manifest_bytes,
    step_of,
)
from airflow_gpupool.checkpoints.progress import Assessment, CheckpointEventStatus, assess
from airflow_gpupool.checkpoints.store import CheckpointListing, CheckpointStore, SkippedCheckpoint

__all__ = [
    "CHECKPOINT_DIR_ENV",
    "COMPLETE_MARKER",
    "MANIFEST_NAME",
    "RESUME_ENV",
    "STEP_DIR_FORMAT",
    "Assessment",
    "CheckpointEventStatus",
    "CheckpointListing",
    "CheckpointManifest",
    "CheckpointStore",
    "CorruptCheckpointError",
    "SkippedCheckpoint",
    "assess",
    "manifest_bytes",
    "step_of",
]
