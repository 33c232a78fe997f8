"""When a lease counts as lost: the one rule of the sync renewer and of LeasedPodTrigger."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from airflow_gpupool.exceptions import (
    GrantPreemptedError,
    LeaseExpiredError,
    LeaseLostError,
    UnknownReservationError,
)

__all__ = ["LEASE_LOST_STATUS", "LeaseWatch", "lease_lost_event", "lost_from_event"]

#: The ``status`` of the event LeasedPodTrigger yields when the pod's lease is lost.
LEASE_LOST_STATUS = "lease_lost"

#: What the ledger raises when a grant no longer holds its slice: gone, released, expired, preempted.
DEFINITIVE = (UnknownReservationError, LeaseExpiredError)

#: The most seconds between a holder's looks at its grant (one read) for a preemption notice:
#: a victim's grace (120 s by default) is mostly left when it learns of it.
NOTICE_INTERVAL_S = 10.0


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
        self._renewed_at = clock()

    @property
    def interval(self) -> float:
        """Seconds between renewals: a third of the TTL."""
        return self.ttl / 3

    @property
    def look_interval(self) -> float:
        """Seconds between looks for a preemption notice (a renewal is a look too)."""
        return min(self.interval, NOTICE_INTERVAL_S)

    def renewal_due(self) -> bool:
        """Whether a renewal is due (``interval`` since the last good one)."""
        return self._clock() - self._renewed_at >= self.interval - 1e-9

    def renewed(self) -> None:
        """Record a successful renewal: the lease runs another TTL from now."""
        self._renewed_at = self._clock()
        self.expires_at = self._renewed_at + self.ttl

    def failed(self, error: BaseException) -> LeaseLostError | None:
        """Return the loss a failed renewal means, or None while it is worth trying again.

        :param error: what the renewal raised
        """
        if isinstance(error, GrantPreemptedError):
            return LeaseLostError.of(
                self.reservation_id,
                str(error),
                grace_seconds=error.seconds_left,
                preempted=True,
                deadline=error.deadline,
            )
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
        "grace_seconds": lost.grace_seconds,
        "deadline": lost.deadline,
        "preempted": lost.preempted,
    }


def lost_from_event(event: dict[str, Any], pod_name: str | None) -> LeaseLostError:
    """Return the error a lease-lost event (:func:`lease_lost_event`) fails the try with.

    :param event: the trigger's payload
    :param pod_name: the pod that was deleted (None: a Job's pods)
    """
    return LeaseLostError.of(
        event["reservation_id"],
        event["why"],
        pod_name,
        grace_seconds=float(event.get("grace_seconds") or 0.0),
        preempted=bool(event.get("preempted")),
        deadline=float(event["deadline"]) if event.get("deadline") is not None else None,
    )
