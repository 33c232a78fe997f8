"""Keep a grant's lease alive while a pod runs in the worker (the deferred pod has LeasedPodTrigger)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from airflow_gpupool.exceptions import GpuPoolError

if TYPE_CHECKING:
    from airflow.sdk.types import Logger

    from airflow_gpupool.hooks.gpupool import GpuPoolHook

__all__ = ["LeaseRenewer"]


class LeaseRenewer(threading.Thread):
    """Renew a grant's lease every ``ttl / 3`` while a sync pod runs.

    Each round first reconciles the grant with its pod: a pod that finished or vanished
    behind the operator's back gives its slice back instead of holding it until the TTL.

    :param hook: the ledger hook
    :param reservation_id: the grant
    :param ttl: the lease's seconds
    :param log: where to report a lease that can no longer be renewed
    :param reconcile: release the grant if its pod is gone; return why, or None when kept
    """

    def __init__(
        self,
        hook: GpuPoolHook,
        reservation_id: str,
        ttl: float,
        log: Logger,
        reconcile: Callable[[], str | None],
    ) -> None:
        super().__init__(name=f"gpupool-lease-{reservation_id}", daemon=True)
        self._hook, self._id, self._ttl, self._log, self._reconcile = (
            hook,
            reservation_id,
            ttl,
            log,
            reconcile,
        )
        self._stopped = threading.Event()

    def run(self) -> None:
        """Renew until stopped, or until the grant is released or can no longer be renewed."""
        while not self._stopped.wait(self._ttl / 3):
            try:
                released = self._reconcile()
                if released is not None:
                    self._log.error("GPU slice %s released by reconcile: %s", self._id, released)
                    return
                self._hook.renew(self._id, self._ttl)
            except GpuPoolError as e:
                self._log.error("Lease of %s can no longer be renewed: %s", self._id, e)
                return
            except Exception:
                self._log.exception("Renewing the lease of %s failed; will retry", self._id)

    def stop(self) -> None:
        """Stop renewing (the pod ended)."""
        self._stopped.set()
