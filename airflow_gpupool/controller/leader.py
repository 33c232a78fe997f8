"""Leader election through a Kubernetes ``Lease`` (coordination.k8s.io/v1), as kube-controller-manager does.

Every candidate reads the Lease each retry period. The holder renews it (``renewTime``); another
candidate takes it over only when the record has not changed for a whole ``leaseDurationSeconds``
*as this candidate observed it*: expiry is measured on the candidate's own monotonic clock since
it last saw the record change, never by comparing ``renewTime`` with its wall clock, so clock
drift between machines cannot cut a lease short (client-go's rule). Writes go through ``replace``
with the ``resourceVersion`` that was read: when two candidates race, the API server accepts one
and answers the other 409 Conflict, so two never both win.

A leader that has not renewed for ``renew_deadline`` (below the duration) stops acting before
anyone else may take over; releasing (on a clean exit) empties ``holderIdentity`` so the next
candidate takes over at once.
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.validate import positive_seconds

__all__ = ["DEFAULT_LEASE_DURATION", "DEFAULT_LEASE_NAME", "LeaderElector", "LeaseSettings"]

log = logging.getLogger(__name__)

DEFAULT_LEASE_NAME = "gpupool-controller"
DEFAULT_LEASE_DURATION = 15.0
_CONFLICT, _NOT_FOUND = 409, 404


def _utcnow() -> datetime.datetime:
    return datetime.datetime.now(tz=datetime.UTC)


@dataclass(frozen=True)
class LeaseSettings:
    """Where the Lease is and how long it lasts.

    :param namespace: the Lease's namespace
    :param identity: this candidate's ``holderIdentity`` (unique per process)
    :param name: the Lease's name
    :param lease_duration: seconds a holder may go without renewing before others take over
    """

    namespace: str
    identity: str
    name: str = DEFAULT_LEASE_NAME
    lease_duration: float = DEFAULT_LEASE_DURATION

    def __post_init__(self) -> None:
        try:
            positive_seconds(self.lease_duration)
        except ValueError as e:
            raise ConfigurationError(f"lease duration: {e}") from None
        for field, value in (("namespace", self.namespace), ("identity", self.identity), ("name", self.name)):
            if not value:
                raise ConfigurationError(f"the Lease's {field} must not be empty")

    @property
    def renew_deadline(self) -> float:
        """Seconds without a successful renewal after which the leader stops acting (2/3 of the duration)."""
        return self.lease_duration * 2 / 3

    @property
    def retry_period(self) -> float:
        """Seconds between two attempts to acquire or renew (1/5 of the duration)."""
        return self.lease_duration / 5


class LeaderElector:
    """One candidate for the Lease.

    :param api: a ``kubernetes.client.CoordinationV1Api``
    :param lease: the Lease and this candidate's identity
    :param clock: a monotonic clock, in seconds (tests pass a fake one)
    :param wall_clock: the UTC time written as ``acquireTime`` and ``renewTime``
    """

    def __init__(
        self,
        api: Any,
        lease: LeaseSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime.datetime] = _utcnow,
    ) -> None:
        self.api = api
        self.lease = lease
        self._clock = clock
        self._wall_clock = wall_clock
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # when this candidate last held a renewed lease
        self.holder: str | None = None  # the holder last seen, for logs

    @property
    def identity(self) -> str:
        """This candidate's ``holderIdentity``."""
        return self.lease.identity

    def is_leader(self) -> bool:
        """Return whether this candidate may act: it renewed the Lease within the renew deadline."""
        return self._renewed_at is not None and self._clock() - self._renewed_at < self.lease.renew_deadline

    def try_acquire_or_renew(self) -> bool:
        """Make one attempt to take or keep the Lease; return whether this candidate leads now.

        API errors (the server unreachable, a conflict) count as a failed attempt and are logged;
        a leader keeps leading through failed attempts until its renew deadline passes.
        """
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        started = self._clock()
        try:
            won = self._attempt(started)
        except ApiException as e:
            if e.status == _CONFLICT:
                log.debug("Lease %s: another candidate wrote first (409 Conflict)", self.lease.name)
            else:
                log.warning("Lease %s: %s %s", self.lease.name, e.status, e.reason)
            won = False
        except HTTPError as e:
            log.warning("Lease %s: the API server cannot be reached: %s", self.lease.name, e)
            won = False
        if won:
            if self._renewed_at is None or not self.is_leader():
                log.info("Lease %s/%s acquired by %s", self.lease.namespace, self.lease.name, self.identity)
            self._renewed_at = started
            return True
        # Seen held by another, this candidate leads no more, whatever its deadline says.
        leading = self.is_leader() and self.holder in (None, self.identity)
        if not leading and self._renewed_at is not None:
            log.warning("Lease %s lost by %s: stepping down", self.lease.name, self.identity)
            self._renewed_at = None
        return leading

    def release(self) -> bool:
        """Give the Lease up if this candidate holds it (a clean exit); return whether it did.

        ``holderIdentity`` is emptied and the duration set to 1 s, so the next candidate takes over
        at once instead of waiting out the lease.
        """
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        was_leader, self._renewed_at = self.is_leader(), None
        if not was_leader:
            return False
        try:
            current = self.api.read_namespaced_lease(self.lease.name, self.lease.namespace)
            if current.spec.holder_identity != self.identity:
                return False
            current.spec.holder_identity = None
            current.spec.lease_duration_seconds = 1
            current.spec.renew_time = self._wall_clock()
            self.api.replace_namespaced_lease(self.lease.name, self.lease.namespace, current)
        except (ApiException, HTTPError) as e:
            log.warning("Lease %s could not be released (it expires by itself): %s", self.lease.name, e)
            return False
        log.info("Lease %s/%s released by %s", self.lease.namespace, self.lease.name, self.identity)
        return True

    # -- one attempt ---------------------------------------------------------------------------

    def _attempt(self, now: float) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            current = self.api.read_namespaced_lease(self.lease.name, self.lease.namespace)
        except ApiException as e:
            if e.status != _NOT_FOUND:
                raise
            self.api.create_namespaced_lease(self.lease.namespace, self._new_lease())
            self.holder = self.identity
            return True
        spec = current.spec
        holder = spec.holder_identity or ""
        self.holder = holder or None
        record = (holder, str(spec.renew_time))
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = float(spec.lease_duration_seconds or self.lease.lease_duration)
        if holder and holder != self.identity and now - self._observed_at < duration:
            return False  # held by another, and not yet expired as this candidate sees it
        stamp = self._wall_clock()
        if holder != self.identity:
            spec.acquire_time = stamp
            spec.lease_transitions = (spec.lease_transitions or 0) + (1 if holder else 0)
            if holder:
                log.info(
                    "Lease %s: taking over from %s, silent for %.1f s", self.lease.name, holder, duration
                )
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = max(1, round(self.lease.lease_duration))
        spec.renew_time = stamp
        # current.metadata.resourceVersion is the version read: a concurrent writer makes this 409.
        self.api.replace_namespaced_lease(self.lease.name, self.lease.namespace, current)
        self.holder = self.identity
        return True

    def _new_lease(self) -> Any:
        from kubernetes import client

        stamp = self._wall_clock()
        return client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.lease.name, namespace=self.lease.namespace),
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=max(1, round(self.lease.lease_duration)),
                acquire_time=stamp,
                renew_time=stamp,
                lease_transitions=0,
            ),
        )
