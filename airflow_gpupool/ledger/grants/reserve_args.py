"""The checked arguments of one reserve call (:meth:`~airflow_gpupool.ledger.Ledger.reserve`), defaults filled in."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from airflow_gpupool import settings
from airflow_gpupool.exceptions import InvalidGangError, InvalidRequestError
from airflow_gpupool.governance.runs import RunNeed
from airflow_gpupool.ledger.queue import gangs
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.validate import positive_seconds

__all__ = ["MAX_HOLDER", "ReserveArgs", "checked_seconds"]

MAX_HOLDER = 512
_MAX_SECONDS = 366 * 86400
_SECONDS = "a number of seconds in (0, 31622400]"


@dataclass(frozen=True)
class ReserveArgs:
    """The checked arguments of one reserve call, defaults filled in.

    :param idempotent: the caller chose the id. Either way the id is made once, before the
        first attempt, and reserving it again returns what it has
    """

    request: GpuRequest
    holder: str
    reservation_id: str
    ttl: float
    timeout: float
    idempotent: bool
    #: Ledger time before which it is not granted (queued ahead), or None.
    not_before: float | None = None
    #: The first GPU step of a run admitted as a whole (:mod:`~airflow_gpupool.ledger.teams.run_gate`), or None.
    run_need: RunNeed | None = None

    @property
    def concurrent(self) -> bool:
        """Whether the concurrent path may grant it: a single, not queued ahead, not a run's first step."""
        return self.request.gang is None and self.not_before is None and self.run_need is None

    @classmethod
    def check(
        cls,
        request: GpuRequest,
        holder: str,
        *,
        ttl: float | None = None,
        timeout: float | None = None,
        reservation_id: str | None = None,
        not_before: float | None = None,
        run_need: RunNeed | None = None,
    ) -> ReserveArgs:
        """Check the arguments of :meth:`~airflow_gpupool.ledger.Ledger.reserve`.

        :raises InvalidRequestError: one is wrong
        """
        if not isinstance(request, GpuRequest):
            raise InvalidRequestError("request", request, "a GpuRequest")
        if not isinstance(holder, str) or not holder or len(holder) > MAX_HOLDER:
            raise InvalidRequestError("holder", holder, f"a string of 1 to {MAX_HOLDER} characters")
        seconds = checked_seconds("ttl", ttl, settings.lease_ttl_seconds)
        wait = checked_seconds("timeout", timeout, settings.reservation_timeout_seconds)
        # Only None means "make one": a fresh id for "" would drop the caller's idempotency key.
        rid = uuid.uuid4().hex if reservation_id is None else reservation_id
        if not isinstance(rid, str) or not 0 < len(rid) <= 64:
            raise InvalidRequestError("reservation_id", rid, "a string of 1 to 64 characters")
        longest = gangs.leader_id_limit(request)
        if len(rid) > longest:  # its members' ids are the leader's and ".<index>"
            raise InvalidGangError("reservation_id", rid, f"a gang's id of 1 to {longest} characters")
        if not_before is not None and not (type(not_before) in (int, float) and math.isfinite(not_before)):
            raise InvalidRequestError("not_before", not_before, "a finite ledger time (Ledger.now)")
        if run_need is not None and not isinstance(run_need, RunNeed):
            raise InvalidRequestError("run_need", run_need, "a RunNeed (governance.runs.peak_need)")
        return cls(request, holder, rid, seconds, wait, reservation_id is not None, not_before, run_need)


def checked_seconds(name: str, value: float | None, default: Callable[[], float]) -> float:
    """Return ``value`` (``default()`` when None) as seconds in (0, 366 days].

    :raises InvalidRequestError: not a number (strings and timedeltas included), or out of range
    """
    if value is None:
        return default()
    # Unlike configuration, a call passes seconds as a number: refuse anything else.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(name, value, _SECONDS)
    try:
        return positive_seconds(value, maximum=_MAX_SECONDS)
    except ValueError:
        raise InvalidRequestError(name, value, _SECONDS) from None
