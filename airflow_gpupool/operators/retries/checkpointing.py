"""A GPU task's checkpoints: where a retry resumes, and what is kept once a pod ends."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow.sdk.types import Logger

    from airflow_gpupool.checkpoints.manifest import CheckpointManifest
    from airflow_gpupool.checkpoints.store import CheckpointStore

__all__ = ["TaskCheckpoints"]


class TaskCheckpoints:
    """The checkpoints of one GPU task, under the owner name of each try's reservation.

    :param store: the task's checkpoint store
    :param keep: after a pod ends, prune to this many valid checkpoints (None: never)
    :param log: the task's log
    """

    def __init__(self, store: CheckpointStore, *, keep: int | None, log: Logger) -> None:
        self.store = store
        self._keep = keep
        self._log = log

    @classmethod
    def of(
        cls, checkpoint_dir: str | None, *, conn_id: str | None, keep: int | None, log: Logger
    ) -> TaskCheckpoints | None:
        """Return the checkpoints at ``checkpoint_dir``, or None for a task without any.

        :param checkpoint_dir: the (rendered) checkpoint location
        :param conn_id: an Airflow connection for the checkpoint filesystem; None: fsspec's defaults
        """
        if not checkpoint_dir:
            return None
        from airflow_gpupool.checkpoints.store import CheckpointStore

        return cls(CheckpointStore(checkpoint_dir, conn_id=conn_id), keep=keep, log=log)

    def resume_point(self, try_number: int, owner: str) -> CheckpointManifest | None:
        """On a retry, return the newest valid checkpoint, pinned by ``owner`` against pruning.

        :param try_number: the try about to run (the first starts from the beginning)
        :param owner: the try's reservation id, which unpins it in :meth:`retain`
        """
        if try_number <= 1:
            return None
        newest = self.store.newest()
        if newest is None:
            self._log.info("No valid checkpoint at %s; this retry starts from the beginning", self.store.url)
            return None
        self.store.pin(newest.step, owner)
        self._log.info("Resuming from checkpoint step %d at %s", newest.step, newest.location)
        return newest

    def retain(self, owner: str) -> None:
        """Unpin ``owner``'s checkpoint and prune to the newest ``keep``; a failure keeps them all.

        :param owner: the ended try's reservation id
        """
        try:
            self.store.unpin(owner)
            if self._keep is not None:
                pruned = self.store.prune(self._keep)
                if pruned:
                    self._log.info("Pruned checkpoint steps %s (keeping %d)", pruned, self._keep)
        except Exception:
            self._log.exception("Checkpoint retention at %s failed; the checkpoints stay", self.store.url)
