"""CheckpointTrigger: watch a checkpoint location until progress, completion or a stall."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_gpupool.checkpoints.progress import Assessment, CheckpointEventStatus, assess
from airflow_gpupool.checkpoints.store import CheckpointListing, CheckpointStore
from airflow_gpupool.triggers.events import trigger_event


class CheckpointTrigger(BaseTrigger):
    """Poll a checkpoint location; yield one event on a new valid checkpoint, completion or a stall.

    File access runs in a thread (fsspec is blocking for most filesystems), so the triggerer's
    event loop never waits on storage. Two copies may run at once: the event carries the step
    it reports, so the sensor ignores a step it already saw.

    :param checkpoint_dir: the location (URL or local path)
    :param conn_id: an Airflow connection for the filesystem; None for fsspec's defaults
    :param last_step: the newest step already reported (-1: none)
    :param since: when the watch started or last saw progress (seconds since the epoch); None: now
    :param max_interval: seconds without a new valid checkpoint that make a stall; None: never
    :param poll_interval: seconds between scans
    """

    def __init__(
        self,
        checkpoint_dir: str,
        conn_id: str | None = None,
        last_step: int = -1,
        since: float | None = None,
        max_interval: float | None = None,
        poll_interval: float = 30.0,
    ) -> None:
        cast("Callable[[], None]", super().__init__)()  # BaseTrigger.__init__ is not annotated
        self.checkpoint_dir = checkpoint_dir
        self.conn_id = conn_id
        self.last_step = last_step
        self.since = time.time() if since is None else since
        self.max_interval = max_interval
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return the class path and every constructor argument."""
        return (
            "airflow_gpupool.triggers.checkpoint.CheckpointTrigger",
            {
                "checkpoint_dir": self.checkpoint_dir,
                "conn_id": self.conn_id,
                "last_step": self.last_step,
                "since": self.since,
                "max_interval": self.max_interval,
                "poll_interval": self.poll_interval,
            },
        )

    def _scan(self) -> CheckpointListing:
        return CheckpointStore(self.checkpoint_dir, conn_id=self.conn_id).scan()

    def _event(
        self, status: CheckpointEventStatus, message: str, verdict: Assessment | None = None
    ) -> TriggerEvent:
        newest = verdict.newest if verdict else None
        return trigger_event(
            {
                "status": status.value,
                "message": message,
                "checkpoint_dir": self.checkpoint_dir,
                "step": newest.step if newest else None,
                "manifest": newest.to_dict() if newest else None,
            }
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Yield one event: progress, completed, stalled, or error."""
        try:
            while True:
                listing = await asyncio.to_thread(self._scan)
                verdict = assess(
                    listing,
                    last_step=self.last_step,
                    since=self.since,
                    now=time.time(),
                    max_interval=self.max_interval,
                )
                if verdict.status is not None:
                    yield self._event(verdict.status, verdict.message, verdict)
                    return
                await asyncio.sleep(self.poll_interval)
        except Exception as e:  # the trigger contract: failures become an error event
            self.log.exception("Watching checkpoints at %s failed", self.checkpoint_dir)
            yield self._event(CheckpointEventStatus.ERROR, f"{type(e).__name__}: {e}")
