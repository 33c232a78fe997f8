"""LeasedJobTrigger: the cncf.kubernetes Job trigger, renewing the gang's GPU lease meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from functools import cached_property
from typing import TYPE_CHECKING, Any

import yaml
from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook
from airflow.providers.cncf.kubernetes.triggers.job import KubernetesJobTrigger
from airflow.triggers.base import TriggerEvent

from airflow_gpupool.hooks.gpupool import AsyncGpuPoolHook
from airflow_gpupool.triggers.events import trigger_event
from airflow_gpupool.triggers.lease import lease_lost_event
from airflow_gpupool.triggers.leased import LeasedTrigger, cancel_quietly

if TYPE_CHECKING:
    from airflow_gpupool.exceptions import LeaseLostError
    from airflow_gpupool.ledger import Gang

__all__ = ["LeasedJobTrigger"]


class LeasedJobTrigger(LeasedTrigger, KubernetesJobTrigger):
    """Wait for a Job like :class:`KubernetesJobTrigger` and renew its gang's lease every ``ttl / 3``.

    Renewing the leader renews every member; a member of the gang that ended (released by
    someone else, expired) loses the lease too (:meth:`~airflow_gpupool.hooks.gpupool.GpuPoolHook.renew_gang`). When the lease is lost (see
    :class:`~airflow_gpupool.triggers.lease.LeaseWatch`) the Job is deleted with its pods, here,
    and the event has status ``lease_lost``; the operator releases the gang and fails the try.

    :param reservation_id: the gang's leader reservation
    :param ledger_conn_id: the ``gpupool`` connection (None: ``[gpupool]`` configuration)
    :param ledger_url: overrides the connection's ledger URL
    :param lease_ttl: the lease length to renew to, in seconds
    :param pin_replacements: pin the pods the Job creates to replace failed ones
        (``backoffLimit > 0``), each to its member, every ``poll_interval``
    """

    classpath = "airflow_gpupool.triggers.job.LeasedJobTrigger"

    def __init__(self, *args: Any, pin_replacements: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pin_replacements = pin_replacements

    @cached_property
    def hook(self) -> AsyncKubernetesHook:
        """The parent's async Kubernetes hook, given the ``config_file`` it ignores.

        The provider's async hook reads a kubeconfig only from the connection or the default
        location (``KUBECONFIG`` as it was when ``kubernetes_asyncio`` was imported); the pod
        trigger passes the file's content as ``config_dict``, the Job trigger passes nothing.
        """
        config_dict = None
        if self.config_file and not self.in_cluster:
            with open(os.path.expanduser(self.config_file)) as stream:  # a small file, read once
                config_dict = yaml.safe_load(stream)
        return AsyncKubernetesHook(
            conn_id=self.kubernetes_conn_id,
            in_cluster=self.in_cluster,
            config_dict=config_dict,
            cluster_context=self.cluster_context,
        )

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return the class path, the Job trigger's arguments, the lease's and ``pin_replacements``."""
        classpath, kwargs = super().serialize()
        kwargs["pin_replacements"] = self.pin_replacements
        return classpath, kwargs

    async def _renew(self, hook: AsyncGpuPoolHook) -> None:
        """Renew the whole gang through its leader."""
        await hook.arenew_gang(self.reservation_id, self.lease_ttl)

    async def _lease_lost(self, lost: LeaseLostError) -> dict[str, Any]:
        """Delete the Job with its pods; return the lease-lost event."""
        self.log.error("%s; deleting job %s", lost.classification.reason, self.job_name)
        await self._delete_job()
        return lease_lost_event(lost, self.job_namespace, self.job_name)

    async def _pin_replacements(self) -> None:
        """Pin the Job's replacement pods to their members, every ``poll_interval``, until cancelled."""
        from kubernetes_asyncio import client as async_client

        from airflow_gpupool.controller.admission import admission_patch
        from airflow_gpupool.controller.gang_pods import JOB_NAME_LABEL, pods_to_pin

        hook = AsyncGpuPoolHook(self.ledger_conn_id, ledger_url=self.ledger_url)
        gang: Gang | None = None
        try:
            while True:
                await asyncio.sleep(self.poll_interval)
                try:
                    if gang is None:  # read once, retried like the rest while it fails
                        await hook.aoptions()
                        gang = await asyncio.to_thread(hook.gang, self.reservation_id)
                    members = {int(m.gang_index or 0): m for m in gang.granted}
                    async with self.hook.get_conn() as connection:
                        core = async_client.CoreV1Api(connection)
                        listed = await core.list_namespaced_pod(
                            self.job_namespace, label_selector=f"{JOB_NAME_LABEL}={self.job_name}"
                        )
                        pods = [connection.sanitize_for_serialization(p) for p in listed.items]
                        for pod, member in pods_to_pin(pods, gang, members, self.log):
                            meta, grant = pod["metadata"], member.grant
                            assert grant is not None
                            await asyncio.to_thread(
                                hook.bind_pod,
                                member.id,
                                namespace=meta["namespace"],
                                name=meta["name"],
                                uid=meta["uid"],
                            )
                            patch = admission_patch(pod, member.id, grant)
                            await core.patch_namespaced_pod(meta["name"], meta["namespace"], patch)
                            self.log.info(
                                "Replacement pod %s pinned to gang member %s", meta["name"], member.id
                            )
                except Exception:
                    self.log.exception(
                        "Pinning the replacement pods of job %s failed; will retry", self.job_name
                    )
        finally:
            await asyncio.to_thread(hook.close)

    async def _delete_job(self) -> None:
        """Delete the Job and its pods at once: they may no longer run on the gang's slices."""
        from kubernetes_asyncio import client as async_client

        try:
            async with self.hook.get_conn() as connection:
                await async_client.BatchV1Api(connection).delete_namespaced_job(
                    self.job_name, self.job_namespace, propagation_policy="Foreground"
                )
        except Exception:
            self.log.exception("Deleting job %s/%s failed", self.job_namespace, self.job_name)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Wait for the Job like the Job trigger, renewing the lease; a lost lease ends the wait first."""
        renewer = asyncio.create_task(self._renew_until_lost())
        pins = asyncio.create_task(self._pin_replacements()) if self.pin_replacements else None
        events = super().run().__aiter__()
        following = asyncio.ensure_future(events.__anext__())
        try:
            lost = await self._lost_first(following, renewer)
            if lost is not None:
                yield trigger_event(lost)
                return
            with contextlib.suppress(StopAsyncIteration):
                event = following.result()
                payload = event.payload if isinstance(event.payload, dict) else {}
                yield trigger_event({**payload, "reservation_id": self.reservation_id})
        finally:
            await cancel_quietly(renewer)
            await cancel_quietly(pins)
