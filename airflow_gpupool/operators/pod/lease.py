"""Keep a grant's lease alive while a pod runs in the worker (the deferred pod has LeasedPodTrigger).

A lease that is lost (the ledger says the grant ended, or it could not be renewed for a whole
TTL) means the slice may be handed to someone else: the renewer deletes the pod and the task
fails with :class:`~airflow_gpupool.exceptions.LeaseLostError`, never running on a slice it
does not hold. A grant that ends after its pod did (reconcile saw the pod end before the task
did) lost nothing: the renewer stops, and the pod's own outcome decides the try.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from airflow_gpupool.controller.pod_deletion import PodGone, delete_pod_until_gone
from airflow_gpupool.exceptions import LeaseLostError
from airflow_gpupool.ledger import ReservationState
from airflow_gpupool.triggers.lease import LeaseWatch

if TYPE_CHECKING:
    from airflow.sdk.types import Logger

__all__ = ["LeaseRenewer", "delete_pod"]

T = TypeVar("T")


class _Renews(Protocol):
    def renew(self, reservation_id: str, ttl: float | None = None) -> Any: ...

    def get(self, reservation_id: str) -> Any: ...


class LeaseRenewer(threading.Thread):
    """Renew a grant's lease every ``ttl / 3`` while a sync pod runs; act when it is lost.

    Each round first reconciles the grant with its pod: a pod that finished or vanished
    behind the operator's back gives its slice back instead of holding it until the TTL.

    :param hook: the ledger hook
    :param reservation_id: the grant
    :param ttl: the lease's seconds
    :param log: where to report the renewals that failed
    :param reconcile: release the grant if its pod is gone; return why, or None when kept
    :param on_lost: called once, in this thread, when the lease is lost (deletes the pod)
    :param pod_ended: whether the pod has ended; asked when the lease is lost: a grant released
        after its pod ended is no loss (the pod's outcome, not ``lease_lost``, is the try's)
    :param clock: monotonic seconds (injected in tests)
    """

    def __init__(
        self,
        hook: _Renews,
        reservation_id: str,
        ttl: float,
        log: Logger,
        reconcile: Callable[[], str | None],
        *,
        on_lost: Callable[[LeaseLostError], None] = lambda lost: None,
        pod_ended: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(name=f"gpupool-lease-{reservation_id}", daemon=True)
        self._hook, self._id, self._ttl, self._log = hook, reservation_id, ttl, log
        self._reconcile, self._on_lost, self._pod_ended = reconcile, on_lost, pod_ended
        self._watch = LeaseWatch(reservation_id, ttl, clock)
        self._stopped = threading.Event()
        self._lost_handled = threading.Event()
        #: the loss, once the lease is lost (read by the task's thread)
        self.lost: LeaseLostError | None = None

    def run(self) -> None:
        """Renew until stopped, until the grant is released by reconcile, or until the lease is lost."""
        while not self._stopped.wait(self._watch.look_interval) and self.look_once():
            pass

    def look_once(self) -> bool:
        """Renew when due, or at once when the grant is being preempted; return whether to keep on.

        Between renewals the grant is only read: a preemption notice comes within
        :data:`~airflow_gpupool.triggers.lease.NOTICE_INTERVAL_S` whatever the TTL.
        """
        if self._watch.renewal_due() or self._preempting():
            return self.renew_once()
        return True

    def _preempting(self) -> bool:
        try:
            return bool(self._hook.get(self._id).state is ReservationState.PREEMPTING)
        except Exception:
            return False  # the renewal, when due, decides what an error means

    def renew_once(self) -> bool:
        """Run one round; return whether to keep renewing."""
        try:
            released = self._reconcile()
            if released is not None:
                self._log.error("GPU slice %s released by reconcile: %s", self._id, released)
                return False
            self._hook.renew(self._id, self._ttl)
        except Exception as e:
            lost = self._watch.failed(e)
            if lost is None:
                self._log.warning("Renewing the lease of %s failed; will retry: %s", self._id, e)
                return True
            if self._ended_first(lost):
                return False
            self._lose(lost, e)
            return False
        self._watch.renewed()
        return True

    def _ended_first(self, lost: LeaseLostError) -> bool:
        """Whether the pod ended before its lease was lost: then nothing was lost, nothing is deleted."""
        try:
            ended = self._pod_ended()
        except Exception:
            self._log.exception("Could not tell whether the pod of %s has ended", self._id)
            return False
        if ended:
            self._log.info(
                "GPU slice %s ended after its pod did (%s); the pod's outcome decides this try",
                self._id,
                lost.why,
            )
        return ended

    def _lose(self, lost: LeaseLostError, error: Exception) -> None:
        lost.__cause__ = error
        self.lost = lost
        self._log.error("%s; deleting the pod", lost.classification.reason)
        try:
            self._on_lost(lost)
        except Exception:
            self._log.exception("Deleting the pod of %s after its lease was lost failed", self._id)
        finally:
            self._lost_handled.set()

    def guard(self, run: Callable[[], T]) -> T:
        """Run the pod part; raise the loss instead of whatever it ended with once the lease is lost.

        The loss is raised only once ``on_lost`` is done (the pod gone, a victim's checkpoint
        reported): the task releases the slice after it, never while the pod may still run.

        :param run: waits for the pod (it ends when the deleted pod goes)
        :raises LeaseLostError: the lease was lost while it ran
        """
        try:
            result = run()
        except Exception as e:
            if self.lost is not None:
                self._lost_handled.wait()
                raise self.lost from e
            raise
        if self.lost is not None:
            self._lost_handled.wait()
            raise self.lost
        return result

    def stop(self) -> None:
        """Stop renewing (the pod ended)."""
        self._stopped.set()


def delete_pod(
    client: Any, namespace: str, name: str, *, why: str, log: Logger, grace_seconds: float = 0.0
) -> None:
    """Delete a pod: at once, or with a termination grace, waiting until it is gone.

    Without a grace the pod may no longer run on its slice at all. With one (a preemption
    victim's) its containers get SIGTERM and up to ``grace_seconds`` to write a checkpoint and
    exit; this waits until the pod is gone (deleted at once if it outlives the grace by
    :data:`~airflow_gpupool.controller.pod_deletion.GONE_MARGIN_S`), so the slice is released only
    once nothing runs on it.

    :param client: a ``kubernetes.client.CoreV1Api``
    :param namespace: the pod's namespace
    :param name: the pod's name
    :param why: for the log
    :param log: the task's log
    :param grace_seconds: the termination grace (rounded up to whole seconds; 0: none)
    :raises ApiException: the API refused (a pod already gone is not an error)
    """
    grace = math.ceil(grace_seconds) if grace_seconds > 0 else 0
    if grace:
        log.warning("Ending pod %s/%s with %d s to checkpoint and exit: %s", namespace, name, grace, why)
    gone = delete_pod_until_gone(client, namespace, name, grace_seconds=grace, why=why)
    if gone is PodGone.ALREADY:
        log.error("Pod %s/%s was already gone: %s", namespace, name, why)
    elif gone is PodGone.FORCED:
        log.error("Pod %s/%s outlived its %d s grace: deleted it at once", namespace, name, grace)
    else:
        log.error("Deleted pod %s/%s: %s", namespace, name, why)
