"""The emulator's Job controller: batch/v1 Jobs run as pods, as kube-controller-manager runs them.

A created Job gets its pods before the create is answered (so a client listing the Job's pods
right after creating it, as ``KubernetesJobOperator`` does, finds them); afterwards every change
of a pod the Job owns re-syncs the Job: pods that ended are counted (once, even after deletion),
replacements are created while ``backoffLimit`` allows, and the Job ends ``Complete`` or
``Failed`` with its ``completionTime``. A Job deleted with ``propagationPolicy`` ``Foreground``
or ``Background`` takes its pods with it, as the garbage collector does: ``Foreground`` answers
with the Job still there, its ``deletionTimestamp`` set and the ``foregroundDeletion`` finalizer
on it, deletes its pods (gracefully) and removes the Job once they are gone, creating no
replacements meanwhile; ``Background`` removes the Job at once and its pods after.
``Orphan`` (the API's default for Jobs) leaves the pods without owner. The controller reads pod changes from the pods' watch bus in one task, and all
syncs take one lock, so two never create the same pod.

What each step writes is :mod:`~airflow_gpupool.testing.cluster.job_pods`' job. Not emulated:
``activeDeadlineSeconds``, ``ttlSecondsAfterFinished``, the pod failure policy, the backoff delay
before a replacement pod and ``podReplacementPolicy: Failed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow_gpupool.testing.api import gates
from airflow_gpupool.testing.api.kinds import JOBS, PODS
from airflow_gpupool.testing.api.storage import now_iso
from airflow_gpupool.testing.cluster.job_pods import (
    JobProgress,
    is_finished,
    job_status,
    pod_for,
    prepare_new_job,
    wanted_indexes,
)

if TYPE_CHECKING:
    from airflow_gpupool.testing.api.apiserver import KubernetesApiEmulator

__all__ = [
    "FOREGROUND_FINALIZER",
    "JobController",
    "owner_job_uid",
    "prepare_new_job",
    "propagation_policy",
]

log = logging.getLogger(__name__)

#: The finalizer a ``Foreground`` deletion puts on the Job until its pods are gone.
FOREGROUND_FINALIZER = "foregroundDeletion"


def owner_job_uid(pod: Mapping[str, Any]) -> str | None:
    """Return the uid of the Job that controls a pod, or ``None``.

    :param pod: the pod
    """
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Job" and ref.get("controller"):
            return str(ref.get("uid"))
    return None


def propagation_policy(request: Any) -> str | None:
    """Return a delete's ``propagationPolicy`` (query or ``DeleteOptions`` body), ``None`` if not given.

    :param request: kmock's parsed request
    """
    body = request.data if request.body and isinstance(request.data, dict) else {}
    policy = request.params.get("propagationPolicy") or body.get("propagationPolicy")
    orphan = str(request.params.get("orphanDependents", body.get("orphanDependents", ""))).lower()
    if policy is None and orphan == "false":
        return "Background"
    return str(policy) if policy is not None else None


class JobController:
    """Runs the emulator's Jobs.

    :param api: the API server whose objects it changes
    """

    def __init__(self, api: KubernetesApiEmulator) -> None:
        self.api = api
        self._progress: dict[str, JobProgress] = {}
        self._lock: asyncio.Lock | None = None
        self._watcher: asyncio.Task[None] | None = None

    # -- wiring --------------------------------------------------------------------------------

    async def created(self, namespace: str | None, name: str) -> None:
        """Start a created Job: its first pods exist when this returns.

        :param namespace: its namespace
        :param name: its name
        """
        self._ensure_watching()
        await self.sync(namespace, name)

    async def updated(self, namespace: str | None, name: str) -> None:
        """Re-sync a Job after a patch (``suspend``, ``parallelism``...).

        :param namespace: its namespace
        :param name: its name
        """
        await self.sync(namespace, name)

    async def deleted(self, job: Mapping[str, Any], policy: str | None) -> None:
        """Take a Job removed from the API (``Background``) with its pods, each terminating as a pod
        ``DELETE`` makes it, or orphan them (``Orphan``).

        :param job: the Job as it was
        :param policy: ``Background`` or ``Orphan`` (``None``: Orphan, the Job default)
        """
        uid = job["metadata"].get("uid")
        self._progress.pop(str(uid), None)
        for pod in self._pods_of(job):
            meta = pod["metadata"]
            if policy == "Background":
                await self._delete_pod(pod)
            else:
                await self.api.update_object(PODS, meta.get("namespace"), meta["name"], _orphan)

    async def delete_in_foreground(self, namespace: str | None, name: str) -> dict[str, Any] | None:
        """Delete a Job in the foreground: return it marked (``deletionTimestamp``, the
        ``foregroundDeletion`` finalizer), its pods terminating; it is removed once they are gone.

        :param namespace: its namespace
        :param name: its name
        :return: the Job as the ``DELETE`` answers it, or ``None`` if there is none
        """
        job = await self.api.update_object(JOBS, namespace, name, _mark_foreground)
        if job is None:
            return None
        self._ensure_watching()
        for pod in self._pods_of(job):
            await self._delete_pod(pod)
        await self.sync(namespace, name)  # no pods left: removed now
        return job

    async def _delete_pod(self, pod: Mapping[str, Any]) -> None:
        """Delete a Job's pod as the garbage collector does: gracefully, with the pod's own grace."""
        meta = pod["metadata"]
        grace = float((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        await self.api.terminations.delete(meta.get("namespace"), meta["name"], grace)

    async def shutdown(self) -> None:
        """Stop watching pods and forget every Job's progress."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watcher
        self._watcher = None
        self._progress.clear()

    def _ensure_watching(self) -> None:
        """Start the task that re-syncs Jobs on their pods' changes, once."""
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch_pods(), name="job-controller")

    async def _watch_pods(self) -> None:
        """Re-sync the owning Job of every pod that changes."""
        bus = self.api.pod_bus()
        marker = await bus.mark()
        try:
            async for event in bus.stream(since=marker):
                pod = event.get("object") or {}
                if owner_job_uid(pod) is None:
                    continue
                job = self._job_by_uid(pod["metadata"].get("namespace"), owner_job_uid(pod))
                if job is not None:
                    try:
                        await self.sync(job["metadata"].get("namespace"), job["metadata"]["name"])
                    except Exception:  # one Job's failure must not stop the others
                        log.exception("job controller: sync of %s failed", job["metadata"]["name"])
        finally:
            await bus.unmark(marker)

    # -- the sync ------------------------------------------------------------------------------

    async def sync(self, namespace: str | None, name: str) -> None:
        """Bring a Job's pods and status in line with its spec.

        :param namespace: its namespace
        :param name: its name
        """
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            job = self.api.get_object(JOBS, namespace, name)
            if job is None:
                return
            if job["metadata"].get("deletionTimestamp"):
                await self._finish_foreground(job)
                return
            progress = self._progress.setdefault(job["metadata"]["uid"], JobProgress())
            pods = self._pods_of(job)
            progress.record(pods)
            status, ended = job_status(job, pods, progress, now_iso())
            if ended == "Failed":  # the controller terminates what still runs
                for pod in pods:
                    if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
                        await self.api.remove_pod(namespace, pod["metadata"]["name"])
                status["active"] = status["ready"] = 0
            elif ended is None and not is_finished(job) and not job["spec"].get("suspend"):
                for index in wanted_indexes(job, pods, progress):
                    await self._create_pod(job, index)
                    status["active"] = int(status.get("active", 0)) + 1
            if status != job.get("status"):
                await self.api.update_object(JOBS, namespace, name, lambda j: j.__setitem__("status", status))

    async def _finish_foreground(self, job: Mapping[str, Any]) -> None:
        """Remove a Job being deleted in the foreground once its pods are gone (none replaced meanwhile)."""
        if self._pods_of(job):
            return
        self._progress.pop(str(job["metadata"].get("uid")), None)
        await self.api.delete_object(JOBS, job["metadata"].get("namespace"), job["metadata"]["name"])

    async def _create_pod(self, job: Mapping[str, Any], index: int | None) -> None:
        """Create one pod of a Job, through the same steps as a pod ``POST``.

        :param job: the Job
        :param index: its completion index, or ``None``
        """
        pod = pod_for(job, index)
        gates.check_pod_create(pod)
        await self.api.create_pod(pod)

    def _pods_of(self, job: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Return the live pods a Job controls.

        :param job: the Job
        """
        uid = job["metadata"].get("uid")
        namespace = job["metadata"].get("namespace")
        return [p for p in self.api.list_objects(PODS, namespace) if owner_job_uid(p) == uid]

    def _job_by_uid(self, namespace: str | None, uid: str | None) -> dict[str, Any] | None:
        """Return a live Job by uid, or ``None``.

        :param namespace: its namespace
        :param uid: its uid
        """
        return next(
            (j for j in self.api.list_objects(JOBS, namespace) if j["metadata"].get("uid") == uid), None
        )


def _mark_foreground(job: dict[str, Any]) -> None:
    """Mark a Job as being deleted in the foreground, as the API server does.

    :param job: the Job, changed in place
    """
    meta = job["metadata"]
    meta.setdefault("deletionTimestamp", now_iso())
    meta.setdefault("deletionGracePeriodSeconds", 0)
    if FOREGROUND_FINALIZER not in (meta.get("finalizers") or []):
        meta["finalizers"] = [*(meta.get("finalizers") or []), FOREGROUND_FINALIZER]


def _orphan(pod: dict[str, Any]) -> None:
    """Drop a pod's Job owner reference, as an ``Orphan`` deletion does.

    :param pod: the pod, changed in place
    """
    refs = [r for r in pod["metadata"].get("ownerReferences") or [] if r.get("kind") != "Job"]
    if refs:
        pod["metadata"]["ownerReferences"] = refs
    else:
        pod["metadata"].pop("ownerReferences", None)
