"""When a lease counts as lost: the one rule of the sync renewer and of LeasedPodTrigger."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from airflow_gpupool.exceptions import LeaseExpiredError, LeaseLostError, UnknownReservationError

__all__ = ["LEASE_LOST_STATUS", "LeaseWatch", "lease_lost_event", "lost_from_event"]

#: The ``status`` of the event LeasedPodTrigger yields when the pod's lease is lost.
LEASE_LOST_STATUS = "lease_lost"

#: What the ledger raises when a grant no longer holds its slice: gone, released, expired, preempted.
DEFINITIVE = (UnknownReservationError, LeaseExpiredError)


class LeaseWatch:
    """Decide, after each renewal attempt, whether a grant's lease is lost.

    The ledger saying the grant is gone, released, expired or preempted loses it at once; any
    other error is transient and retried until the lease's own expiry (the last good renewal plus
    the TTL, on ``clock``), after which nothing vouches for the slice any more.

    :param reservation_id: the grant
    :param ttl: the lease's seconds
    :param clock: monotonic seconds (injected in tests)
    """

    def __init__(self, reservation_id: str, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.reservation_id = reservation_id
        self.ttl = ttl
        self._clock = clock
        self.expires_at = clock() + ttl

    @property
    def interval(self) -> float:
        """Seconds between renewals: a third of the TTL."""
        return self.ttl / 3

    def renewed(self) -> None:
        """Record a successful renewal: the lease runs another TTL from now."""
        self.expires_at = self._clock() + self.ttl

    def failed(self, error: BaseException) -> LeaseLostError | None:
        """Return the loss a failed renewal means, or None while it is worth trying again.

        :param error: what the renewal raised
        """
        if isinstance(error, DEFINITIVE):
            return LeaseLostError.of(self.reservation_id, str(error))
        left = self.expires_at - self._clock()
        if left <= 0:
            return LeaseLostError.of(
                self.reservation_id,
                f"not renewed for its whole TTL of {self.ttl:g} s; last error: {type(error).__name__}: {error}",
            )
        return None


def lease_lost_event(lost: LeaseLostError, namespace: str, name: str) -> dict[str, Any]:
    """Return the payload of the lease-lost event of LeasedPodTrigger (or LeasedJobTrigger).

    :param lost: the loss
    :param namespace: the pod's (or Job's) namespace
    :param name: the pod's (or Job's) name
    """
    return {
        "status": LEASE_LOST_STATUS,
        "namespace": namespace,
        "name": name,
        "reservation_id": lost.reservation_id,
        "message": lost.classification.reason,
        "why": lost.why,
    }


def lost_from_event(event: dict[str, Any], pod_name: str | None) -> LeaseLostError:
    """Return the error a lease-lost event (:func:`lease_lost_event`) fails the try with.

    :param event: the trigger's payload
    :param pod_name: the pod that was deleted (None: a Job's pods)
    """
    return LeaseLostError.of(event["reservation_id"], event["why"], pod_name)
