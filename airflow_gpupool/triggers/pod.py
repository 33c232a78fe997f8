"""LeasedPodTrigger: the cncf.kubernetes pod trigger, renewing the pod's GPU lease meanwhile."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger
from airflow.triggers.base import TriggerEvent

from airflow_gpupool.hooks.gpupool import AsyncGpuPoolHook
from airflow_gpupool.ledger import FINISHED_PHASES
from airflow_gpupool.triggers.events import trigger_event
from airflow_gpupool.triggers.lease import lease_lost_event
from airflow_gpupool.triggers.leased import LeasedTrigger, cancel_quietly
from airflow_gpupool.triggers.unschedulable import (
    UNSCHEDULABLE_STATUS,
    UnschedulableWatch,
    WatchedAsyncPodManager,
)

if TYPE_CHECKING:
    from airflow.providers.cncf.kubernetes.utils.pod_manager import AsyncPodManager

    from airflow_gpupool.checkpoints.store import CheckpointStore
    from airflow_gpupool.exceptions import LeaseLostError


class LeasedPodTrigger(LeasedTrigger, KubernetesPodTrigger):
    """Watch a pod like :class:`KubernetesPodTrigger` and renew its grant's lease every ``ttl / 3``.

    When the lease is lost (see :class:`~airflow_gpupool.triggers.lease.LeaseWatch`) it yields
    an event of status ``lease_lost`` instead of waiting for the pod; the operator then deletes
    the pod and fails the try with :class:`~airflow_gpupool.exceptions.LeaseLostError`.

    :param reservation_id: the grant the pod runs on
    :param ledger_conn_id: the ``gpupool`` connection (None: ``[gpupool]`` configuration)
    :param ledger_url: overrides the connection's ledger URL
    :param lease_ttl: the lease length to renew to, in seconds
    :param checkpoint_dir: after each renewal, report the newest valid checkpoint here to the
        ledger (a preemptible task's: preemption ranks victims by the work since it); None: none
    :param checkpoint_conn_id: an Airflow connection for the checkpoint filesystem; None: fsspec's defaults
    :param granted_node: the node the pod is pinned to: while it starts, a pod the scheduler
        cannot place there ends the watch with an event of status ``unschedulable`` (see
        :mod:`~airflow_gpupool.triggers.unschedulable`); None: not watched
    :param unschedulable_grace_seconds: how long a pod that may still fit is left unschedulable
    """

    classpath = "airflow_gpupool.triggers.pod.LeasedPodTrigger"

    def __init__(
        self,
        *args: Any,
        checkpoint_dir: str | None = None,
        checkpoint_conn_id: str | None = None,
        granted_node: str | None = None,
        unschedulable_grace_seconds: float = 30.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_conn_id = checkpoint_conn_id
        self.granted_node = granted_node
        self.unschedulable_grace_seconds = unschedulable_grace_seconds
        self._watch = UnschedulableWatch(grace_seconds=unschedulable_grace_seconds)
        #: Set once the lease is lost, before the pod is deleted: the pod watch may see that deletion first.
        self._lost_event: dict[str, Any] | None = None
        self._store: CheckpointStore | None = None  # built on first use, off the loop

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return the class path, the pod trigger's arguments, the lease's, the checkpoint location and the node."""
        classpath, kwargs = super().serialize()
        kwargs.update(
            checkpoint_dir=self.checkpoint_dir,
            checkpoint_conn_id=self.checkpoint_conn_id,
            granted_node=self.granted_node,
            unschedulable_grace_seconds=self.unschedulable_grace_seconds,
        )
        return classpath, kwargs

    @cached_property
    def pod_manager(self) -> AsyncPodManager:
        """The pod trigger's manager, its start-up reads shown to the watch of the granted node."""
        return WatchedAsyncPodManager(self.hook, self._watch, self._read_granted_node)

    async def _read_granted_node(self) -> Any:
        """Return the granted node (a ``V1Node``), or None when it is gone."""
        from kubernetes_asyncio.client import CoreV1Api
        from kubernetes_asyncio.client.exceptions import ApiException

        if self.granted_node is None:
            return None
        async with self.hook.get_conn() as connection:
            try:
                return await CoreV1Api(connection).read_node(self.granted_node)
            except ApiException as e:
                if e.status == 404:
                    return None
                raise

    def _unschedulable_event(self, event: TriggerEvent) -> TriggerEvent:
        """Return the ``unschedulable`` event when the watch ended the pod trigger, else ``event``."""
        verdict = self._watch.verdict
        payload = event.payload if isinstance(event.payload, dict) else {}
        if verdict is None or payload.get("status") != "error":
            return event
        return trigger_event(
            {
                "status": UNSCHEDULABLE_STATUS,
                "namespace": self.pod_namespace,
                "name": self.pod_name,
                "node": self.granted_node,
                "message": verdict.message,
                "detail": verdict.detail,
                "books_wrong": verdict.books_wrong,
                "reservation_id": self.reservation_id,
            }
        )

    async def _renew(self, hook: AsyncGpuPoolHook) -> None:
        """Renew the pod's grant, then report its newest valid checkpoint (as the sync renewer does)."""
        await hook.arenew(self.reservation_id, self.lease_ttl)
        if self.checkpoint_dir is not None:
            await self._note_checkpoint(hook, self.checkpoint_dir)

    async def _note_checkpoint(self, hook: AsyncGpuPoolHook, checkpoint_dir: str) -> None:
        """Report the newest valid checkpoint; a failure only logs (the renewal succeeded)."""
        if self._store is None:
            from airflow_gpupool.checkpoints.store import CheckpointStore

            try:  # a connection look-up and a filesystem: blocking, in a thread
                self._store = await asyncio.to_thread(
                    CheckpointStore, checkpoint_dir, self.checkpoint_conn_id
                )
            except Exception as e:
                self.log.warning("Could not open the checkpoints at %s: %s", checkpoint_dir, e)
                return
        await hook.anote_newest_checkpoint(self.reservation_id, self._store)

    async def _workload_ended(self) -> bool:
        """Whether the pod's phase is final (a pod gone is not known to have ended by itself)."""
        pod = await self.hook.get_pod(self.pod_name, self.pod_namespace)
        return getattr(pod.status, "phase", None) in FINISHED_PHASES

    async def _lease_lost(self, lost: LeaseLostError) -> dict[str, Any]:
        """Delete the pod; return the lease-lost event (kept for a pod watch that sees the deletion first)."""
        self._lost_event = lease_lost_event(lost, self.pod_namespace, self.pod_name)
        self.log.error("%s; deleting the pod %s", lost.classification.reason, self.pod_name)
        # The grace the refused renewal just gave (no wait in between); the operator, resuming
        # later, counts what is left from the deadline and waits until the pod is gone.
        await self._delete_pod(math.ceil(lost.grace_seconds))
        return self._lost_event

    async def _delete_pod(self, grace_seconds: int = 0) -> None:
        """Delete the pod here (at once, or with a preemption victim's grace): the task may wait a
        while for a worker slot to resume.

        The operator deletes it again when it resumes (idempotent) and waits until it is gone
        before the slice is released, so a failure here only logs.
        """
        try:
            await self.hook.delete_pod(self.pod_name, self.pod_namespace, grace_period_seconds=grace_seconds)
        except Exception:
            self.log.exception(
                "Deleting pod %s/%s failed; the task deletes it when it resumes",
                self.pod_namespace,
                self.pod_name,
            )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Watch the pod like the pod trigger, renewing its lease; a lost lease ends the watch first."""
        renewer = asyncio.create_task(self._renew_until_lost())
        events = super().run().__aiter__()
        try:
            while True:
                following = asyncio.ensure_future(events.__anext__())
                lost = await self._lost_first(following, renewer)
                if lost is not None:
                    yield trigger_event(lost)
                    return
                try:
                    event = following.result()
                except StopAsyncIteration:
                    event = None
                if self._lost_event is not None:
                    # The pod watch ended on the deletion the lost lease caused (pod not found): the
                    # lease is why, and the operator must be told so.
                    yield trigger_event(self._lost_event)
                    return
                if event is None:
                    return
                event = self._unschedulable_event(event)
                # The operator resumes on the grant named here: an adopted one keeps its first try's id.
                if isinstance(event.payload, dict):
                    event = trigger_event({**event.payload, "reservation_id": self.reservation_id})
                yield event
        finally:
            await cancel_quietly(renewer)
