"""Judge one scan of a checkpoint location: progress, completion, stall or nothing new."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from airflow_gpupool.checkpoints.manifest import CheckpointManifest
from airflow_gpupool.checkpoints.store import CheckpointListing


class CheckpointEventStatus(str, Enum):
    """The ``status`` of a checkpoint watch's event."""

    PROGRESS = "progress"
    COMPLETED = "completed"
    STALLED = "stalled"
    ERROR = "error"


@dataclass(frozen=True)
class Assessment:
    """What a scan means; ``status`` None: nothing new, keep watching."""

    status: CheckpointEventStatus | None
    newest: CheckpointManifest | None
    message: str


def assess(
    listing: CheckpointListing, *, last_step: int, since: float, now: float, max_interval: float | None
) -> Assessment:
    """Compare a scan with what the watcher saw before.

    :param listing: the scan
    :param last_step: the newest step already reported (-1: none)
    :param since: when the watch started or last saw progress (seconds since the epoch)
    :param now: the current time
    :param max_interval: seconds without a new valid checkpoint that make a stall (None: never)
    """
    newest = listing.newest
    if listing.complete:
        step = f" at step {newest.step}" if newest else ""
        return Assessment(CheckpointEventStatus.COMPLETED, newest, f"training complete{step}")
    if newest is not None and newest.step > last_step:
        return Assessment(CheckpointEventStatus.PROGRESS, newest, f"new checkpoint at step {newest.step}")
    if max_interval is not None:
        last_progress = max(since, newest.time.timestamp() if newest else since)
        quiet = now - last_progress
        if quiet > max_interval:
            where = f"step {newest.step}" if newest else "no valid checkpoint yet"
            return Assessment(
                CheckpointEventStatus.STALLED,
                newest,
                f"no new valid checkpoint for {quiet:.0f}s (max_interval {max_interval:g}s); newest: {where}",
            )
    return Assessment(None, newest, "no new checkpoint")
