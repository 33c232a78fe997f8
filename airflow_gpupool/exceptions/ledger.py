"""The ledger's errors: requests that cannot fit or wait too long, leases, the database itself."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from airflow_gpupool.exceptions.base import GpuPoolError

__all__ = [
    "GrantPreemptedError",
    "LeaseExpiredError",
    "LedgerBusyError",
    "LedgerSchemaError",
    "LedgerUnavailableError",
    "NoCapacityError",
    "ReservationTimeoutError",
    "RunTooLargeError",
    "StaleCacheError",
    "UnknownReservationError",
]


class _NodeRejection(Protocol):
    # What a reason of NoCapacityError offers; placement's NoFitReason is one. A protocol, so this
    # bottom module need not import placement.
    @property
    def node(self) -> str: ...

    @property
    def reason(self) -> str: ...


class NoCapacityError(GpuPoolError):
    """A request can never fit any node of the inventory, even an empty one.

    :param request: the request
    :param reasons: why each node rejected it, most promising node first
        (:class:`~airflow_gpupool.placement.verdict.NoFitReason`)
    """

    def __init__(self, request: Any, reasons: Sequence[_NodeRejection]) -> None:
        self.request = request
        self.reasons = tuple(reasons)
        summary = "; ".join(str(r) for r in self.reasons[:5]) or "the inventory is empty"
        super().__init__(f"request can never be placed on this inventory: {summary}")


class ReservationTimeoutError(GpuPoolError):
    """A queued request waited longer than its reservation timeout.

    :param request_id: the queued request
    :param waited_s: seconds it waited
    :param blockers: why the closest nodes did not fit, closest first
    """

    def __init__(self, request_id: str, waited_s: float, blockers: Sequence[str]) -> None:
        self.request_id = request_id
        self.waited_s = waited_s
        self.blockers = tuple(blockers)
        blocked = "; ".join(self.blockers) or "no node matched"
        super().__init__(f"reservation {request_id} timed out after {waited_s:.0f}s: {blocked}")


class UnknownReservationError(GpuPoolError, KeyError):
    """No request or grant with this id exists in the ledger."""

    def __init__(self, reservation_id: str) -> None:
        self.reservation_id = reservation_id
        super().__init__(f"no reservation {reservation_id!r} in the ledger")

    def __str__(self) -> str:
        return str(self.args[0])


class LeaseExpiredError(GpuPoolError):
    """A grant's lease expired (or it was released) before it was renewed."""

    def __init__(self, grant_id: str, state: str) -> None:
        self.grant_id = grant_id
        self.state = state
        super().__init__(f"grant {grant_id} can no longer be renewed: it is {state}")


class GrantPreemptedError(LeaseExpiredError):
    """The grant was chosen as a preemption victim: its pod must end within ``seconds_left``.

    Its holder ends the pod with a termination grace of ``seconds_left`` (SIGTERM first, so the
    training can write an emergency checkpoint) and then releases the grant.

    :param deadline: the ledger time by which the pod must have ended
    :param seconds_left: what is left of the grace when the renewal was refused
    :param preempted_by: the waiting request the slice passes to
    """

    def __init__(self, grant_id: str, deadline: float, seconds_left: float, preempted_by: str | None) -> None:
        self.deadline = deadline
        self.seconds_left = max(0.0, seconds_left)
        self.preempted_by = preempted_by
        self.grant_id, self.state = grant_id, "preempting"
        GpuPoolError.__init__(
            self,
            f"grant {grant_id} is preempted for {preempted_by or 'higher-priority work'}: its pod "
            f"must end within {self.seconds_left:.0f} s (it may write a checkpoint on SIGTERM)",
        )


class LedgerSchemaError(GpuPoolError):
    """The ledger database is missing, or its schema is newer or older than this code."""


class LedgerBusyError(GpuPoolError):
    """A ledger writer could not take the lock within ``[gpupool] lock_timeout_seconds``.

    Another client holds the ledger's write lock (or a row it needs) and does not let go: a
    stopped or hung process. Its session is ended by the server after
    ``idle_in_transaction_timeout_seconds``; trying again later can succeed.

    :param seconds: how long this writer waited
    :param holder: who holds the lock (server pid, application name), or None when unknown
    """

    def __init__(self, seconds: float, holder: str | None = None) -> None:
        self.seconds = seconds
        self.holder = holder
        super().__init__(
            f"the GPU ledger is busy: its write lock was not free within {seconds:g} s "
            f"([gpupool] lock_timeout_seconds); held by {holder or 'unknown'}"
        )


class LedgerUnavailableError(GpuPoolError):
    """The ledger's database could not be reached for ``[gpupool] ledger_retry_seconds``.

    :param seconds: how long connection errors were retried
    :param cause: the last driver error, in words
    """

    def __init__(self, seconds: float, cause: str) -> None:
        self.seconds = seconds
        self.cause = cause
        super().__init__(
            f"the GPU ledger's database is unavailable: still failing after {seconds:g} s of retries "
            f"([gpupool] ledger_retry_seconds): {cause}"
        )


class LedgerConnectionRefusedError(GpuPoolError):
    """The ledger's database server refused the connection for a reason no retry changes: the
    database or the role does not exist, or the server did not accept the credentials.

    :param cause: the server's answer, in words (never the password)
    """

    def __init__(self, cause: str) -> None:
        self.cause = cause
        super().__init__(
            f"the GPU ledger's database refused the connection: {cause}. Fix the ledger URL "
            "(--url, GPUPOOL_LEDGER_URL, the gpupool_default connection or [gpupool] ledger_url), "
            "or create what it names (for a database: createdb); retrying would not help"
        )


class StaleCacheError(GpuPoolError):
    """A conditional update found less capacity than this process's copy said.

    Raised and caught inside one ledger write: the store reloads its copy and redoes the write,
    so it never reaches a caller.
    """


class RunTooLargeError(GpuPoolError):
    """A DAG run admitted as a whole needs more GPUs at once than its team's quota (or the pool) can ever give.

    :param run: the run's admission key (DAG id, run id, task group)
    :param team: the team its first step is accounted to
    :param peak_milli: the run's peak concurrent need, in milli-GPU
    :param steps: the GPU steps that make up the peak
    :param limit_milli: the most its team's quota (or the pool) could ever give at once
    :param limit: what that limit is (``team vision's quota on pool:a100``, ``the pool's GPUs``)
    """

    def __init__(
        self, run: str, team: str, peak_milli: int, steps: Sequence[str], limit_milli: int, limit: str
    ) -> None:
        self.run = run
        self.team = team
        self.peak_milli = peak_milli
        self.steps = tuple(steps)
        self.limit_milli = limit_milli
        self.limit = limit
        super().__init__(
            f"run {run} needs {peak_milli / 1000:g} GPUs at once ({', '.join(self.steps)}), more than "
            f"{limit} can ever give ({limit_milli / 1000:g} GPUs): refused before its first GPU step. "
            "Split the run's parallel GPU steps, or raise the team's quota"
        )
