"""LeasedPodTrigger: the cncf.kubernetes pod trigger, renewing the pod's GPU lease meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from airflow.providers.cncf.kubernetes.triggers.pod import KubernetesPodTrigger
from airflow.triggers.base import TriggerEvent

from airflow_gpupool.hooks.gpupool import AsyncGpuPoolHook


class LeasedPodTrigger(KubernetesPodTrigger):
    """Watch a pod like :class:`KubernetesPodTrigger` and renew its grant's lease every ``ttl / 3``.

    :param reservation_id: the grant the pod runs on
    :param ledger_conn_id: the ``gpupool`` connection (None: ``[gpupool]`` configuration)
    :param ledger_url: overrides the connection's ledger URL
    :param lease_ttl: the lease length to renew to, in seconds
    """

    def __init__(
        self,
        *args: Any,
        reservation_id: str,
        ledger_conn_id: str | None = AsyncGpuPoolHook.default_conn_name,
        ledger_url: str | None = None,
        lease_ttl: float = 600.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.reservation_id = reservation_id
        self.ledger_conn_id = ledger_conn_id
        self.ledger_url = ledger_url
        self.lease_ttl = lease_ttl

    @classmethod
    def wrap(cls, trigger: KubernetesPodTrigger, **lease: Any) -> LeasedPodTrigger:
        """Return a LeasedPodTrigger with ``trigger``'s arguments plus the lease's."""
        _, kwargs = trigger.serialize()
        return cls(**kwargs, **lease)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """Return the class path, the pod trigger's arguments and the lease's."""
        _, kwargs = super().serialize()
        kwargs.update(
            reservation_id=self.reservation_id,
            ledger_conn_id=self.ledger_conn_id,
            ledger_url=self.ledger_url,
            lease_ttl=self.lease_ttl,
        )
        return "airflow_gpupool.triggers.pod.LeasedPodTrigger", kwargs

    async def _renew_forever(self) -> None:
        hook = AsyncGpuPoolHook(self.ledger_conn_id, ledger_url=self.ledger_url)
        try:
            while True:
                await hook.arenew(self.reservation_id, self.lease_ttl)
                await asyncio.sleep(self.lease_ttl / 3)
        except Exception:
            # A lost lease is the ledger's business (reap, reconcile); the pod is watched regardless.
            self.log.exception("Renewing the lease of %s failed; it will expire", self.reservation_id)
        finally:
            await asyncio.to_thread(hook.close)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Renew the lease in the background while the pod trigger runs."""
        renewer = asyncio.create_task(self._renew_forever())
        try:
            async for event in super().run():
                yield event
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
