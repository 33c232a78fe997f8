"""GpuPoolHook: resolves a ``gpupool`` connection to a ledger, and an async twin for triggers.

The connection (conn type ``gpupool``) carries the ledger URL and options as extras,
read by name::

    AIRFLOW_CONN_GPUPOOL_DEFAULT='{"conn_type": "gpupool",
        "extra": {"ledger_url": "postgresql://gpupool@db:5432/gpupool",
                  "binding": "hami", "node_pool_bindings": "a100-mig=mig",
                  "lease_ttl_seconds": 900}}'

Without ``ledger_url`` extra, a connection with a host is read as a PostgreSQL server
(host, port, login, password, schema = database). Constructor arguments beat extras,
extras beat the ``[gpupool]`` configuration. The ledger URL is found one way everywhere
(:func:`airflow_gpupool.settings.ledger_url`): the ``ledger_url`` argument, else
``GPUPOOL_LEDGER_URL``, else the connection, else ``[gpupool] ledger_url``, else a SQLite file
under ``AIRFLOW_HOME``, which is refused under an executor that is not local (each worker
would have a ledger of its own). Only a missing ``gpupool_default`` connection falls back to the
configuration; any other error while resolving a connection propagates.
"""

from __future__ import annotations

import asyncio
import os
import time
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import AirflowNotFoundException
from airflow.sdk import BaseHook

from airflow_gpupool import settings
from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.hooks.options import (
    LedgerOptions,
    NoConnection,
    check_shared_ledger,
    extras_of,
    options_from,
)

if TYPE_CHECKING:
    from airflow_gpupool.checkpoints.store import CheckpointStore
    from airflow_gpupool.governance.runs import RunNeed
    from airflow_gpupool.ledger import (
        Gang,
        HandOnResult,
        Ledger,
        QueueAheadResult,
        ReapResult,
        ReleaseResult,
        Reservation,
        StartForecast,
        TaskAttempt,
        TaskAttempts,
    )
    from airflow_gpupool.placement.snapshot import ClusterSnapshot
    from airflow_gpupool.resources import GpuRequest

__all__ = ["AsyncGpuPoolHook", "GpuPoolHook", "LedgerOptions", "resolve_ledger_url"]


class GpuPoolHook(BaseHook):
    """Access the GPU ledger named by a ``gpupool`` connection.

    :param ledger_conn_id: the connection; None to use the ``[gpupool]`` configuration only
    :param ledger_url: overrides the connection's URL
    :param options: other overrides by extra name (``binding``, ``lease_ttl_seconds``...)
    """

    conn_name_attr = "ledger_conn_id"
    default_conn_name = "gpupool_default"
    conn_type = "gpupool"
    hook_name = "GPU pool"

    def __init__(
        self, ledger_conn_id: str | None = default_conn_name, ledger_url: str | None = None, **options: Any
    ) -> None:
        super().__init__()
        self.ledger_conn_id = ledger_conn_id
        self._overrides = {"ledger_url": ledger_url, **options}

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """Tell the connection form which fields mean what."""
        return {
            "hidden_fields": [],
            "relabeling": {"schema": "Database", "host": "PostgreSQL host (or set ledger_url in Extra)"},
            "placeholders": {
                "extra": '{"ledger_url": "postgresql://gpupool@db:5432/gpupool", "binding": "whole"}'
            },
        }

    @cached_property
    def options(self) -> LedgerOptions:
        """The resolved ledger URL and options."""
        return self._resolve(self._connection() if self.ledger_conn_id else None)

    def _resolve(self, conn: Any | None) -> LedgerOptions:
        """Resolve the options from a fetched connection (None: no connection id, configuration only)."""
        if conn is None:
            options = options_from({}, self._overrides, "[gpupool] configuration")
        else:
            options = options_from(extras_of(conn), self._overrides, f"connection {self.ledger_conn_id!r}")
        check_shared_ledger(options.ledger_url, f"GPU pool hook ({self.ledger_conn_id or 'no connection'})")
        return options

    def _connection(self) -> Any:
        try:
            return self.get_connection(str(self.ledger_conn_id))
        except AirflowNotFoundException as e:
            return self._missing_connection(e)

    def _missing_connection(self, error: Exception) -> NoConnection:
        """Fall back to ``[gpupool]`` for a missing default connection; fail for a missing named one.

        Only "not found" reaches here: any other error while resolving the connection (a secrets
        backend down, a malformed URI) propagates, so no worker silently falls back to a ledger
        of its own.
        """
        if self.ledger_conn_id == self.default_conn_name:
            # The default connection is optional: the [gpupool] configuration applies.
            return NoConnection()
        raise ConfigurationError(
            f"GPU pool connection {self.ledger_conn_id!r} not found: create it "
            f"(AIRFLOW_CONN_{str(self.ledger_conn_id).upper()}) or set ledger_conn_id=None to use [gpupool] ledger_url"
        ) from error

    @cached_property
    def ledger(self) -> Ledger:
        """This process's ledger client for the resolved URL, shared with the other hooks (see
        :mod:`airflow_gpupool.ledger.shared`): one bounded pool however many tasks wait."""
        from airflow_gpupool.ledger import shared_ledger

        # One ledger per process and URL (queue at scale); placement honours the connection's
        # bindings: a request goes only to a node pool whose binding can express it.
        return shared_ledger(
            self.options.ledger_url,
            self.options.placement_policy,
            binding=self.options.binding,
            node_pool_bindings=self.options.node_pool_bindings,
        )

    def reserve(
        self,
        request: GpuRequest,
        holder: str,
        *,
        reservation_id: str,
        ttl: float | None = None,
        timeout: float | None = None,
        run_need: RunNeed | None = None,
        task_key: str | None = None,
    ) -> Reservation:
        """Reserve ``request`` (idempotent by ``reservation_id``).

        :param run_need: the first GPU step of a run admitted as a whole: its run's peak
        :param task_key: the step's task key: a slice handed on to it is taken over
        """
        return self.ledger.reserve(
            request,
            holder,
            ttl=ttl or self.options.lease_ttl_seconds,
            timeout=timeout or self.options.reservation_timeout_seconds,
            reservation_id=reservation_id,
            run_need=run_need,
            task_key=task_key,
        )

    def hand_on(
        self, reservation_id: str, to_task_key: str, request: GpuRequest, *, hold_seconds: float, reason: str
    ) -> HandOnResult:
        """End a grant, handing the part ``request`` takes on to the step ``to_task_key`` (see :meth:`Ledger.hand_on`)."""
        return self.ledger.hand_on(
            reservation_id, to_task_key, request, hold_seconds=hold_seconds, reason=reason
        )

    def queue_ahead(
        self, upstream_id: str, to_task_key: str, request: GpuRequest, *, enter_at: float, not_before: float
    ) -> QueueAheadResult:
        """Queue the step ``to_task_key``'s request ahead of the grant ``upstream_id`` (see :meth:`Ledger.queue_ahead`)."""
        return self.ledger.queue_ahead(
            upstream_id, to_task_key, request, enter_at=enter_at, not_before=not_before
        )

    def now(self) -> float:
        """Return the ledger's clock (what preemption deadlines and leases are measured on)."""
        return self.ledger.now()

    def get(self, reservation_id: str) -> Reservation:
        """Return the reservation's current state."""
        return self.ledger.get(reservation_id)

    def renew(self, reservation_id: str, ttl: float | None = None) -> Reservation:
        """Extend the grant's lease."""
        return self.ledger.renew(reservation_id, ttl)

    def get_or_none(self, reservation_id: str) -> Reservation | None:
        """Return the reservation's current state, or None when it was never recorded."""
        return self.ledger.get_or_none(reservation_id)

    def adopt(self, reservation_id: str, holder: str, ttl: float | None = None) -> Reservation:
        """Take over an earlier try's grant (the retry re-attached to its pod) and renew its lease."""
        return self.ledger.adopt(reservation_id, holder, ttl or self.options.lease_ttl_seconds)

    def gang(self, reservation_id: str) -> Gang:
        """Return the gang of a leader or member reservation: its spec and every member, by index."""
        return self.ledger.gang(reservation_id)

    def renew_gang(self, reservation_id: str, ttl: float | None = None) -> Gang:
        """Renew a gang's lease and return the gang; a member of its minimum that ended loses the lease.

        Renewing the leader renews every member that holds, silently skipping one that ended
        (released by someone else, expired): that member's slice may be someone else's now.

        :raises LeaseExpiredError: the leader, or a member of the gang's minimum, holds nothing
        :raises UnknownReservationError: no such id
        """
        from airflow_gpupool.exceptions import LeaseExpiredError

        self.ledger.renew(reservation_id, ttl)
        gang = self.ledger.gang(reservation_id)
        for member in gang.members[: gang.spec.min_members]:
            if not member.state.holds:
                raise LeaseExpiredError(member.id, f"{member.state.value} ({member.message or 'no reason'})")
        return gang

    def bind_pod(
        self, reservation_id: str, *, namespace: str, name: str, uid: str | None = None
    ) -> Reservation:
        """Record the pod of a grant, so an expired lease orphans it instead of freeing its slice."""
        return self.ledger.bind(reservation_id, namespace=namespace, name=name, uid=uid)

    def note_checkpoint(self, reservation_id: str, at: float) -> bool:
        """Record when the grant's newest valid checkpoint was written (preemption ranks victims by it)."""
        return self.ledger.note_checkpoint(reservation_id, at)

    def note_newest_checkpoint(self, reservation_id: str, store: CheckpointStore) -> float | None:
        """Read the newest valid checkpoint in ``store`` and record its time for the grant.

        What every holder does at its renewals (the sync renewer, LeasedPodTrigger) and once a
        preemption victim's pod is gone (its emergency checkpoint): the ledger then knows how much
        work a preemption takes. Never raises: the lease matters, this only ranks victims and
        counts lost work, so a failure is logged.

        :param store: the task's checkpoint location
        :return: the time recorded (seconds since the epoch), or None when none was
        """
        try:
            newest = store.newest()
            if newest is None:
                return None
            at = newest.time.timestamp()
            return at if self.note_checkpoint(reservation_id, at) else None
        except Exception as e:
            self.log.warning("Could not report the newest checkpoint of %s: %s", reservation_id, e)
            return None

    def release(
        self, reservation_id: str, reason: str, *, keep_queued_ahead: bool = False
    ) -> ReleaseResult | None:
        """Release (idempotent); None when the reservation was never recorded.

        :param keep_queued_ahead: the step succeeded: requests queued ahead of it stay (else withdrawn)
        """
        from airflow_gpupool.exceptions import UnknownReservationError

        try:
            return self.ledger.release(reservation_id, reason=reason, keep_queued_ahead=keep_queued_ahead)
        except UnknownReservationError:
            return None

    def reap(self) -> ReapResult:
        """Expire what is due and serve the queue."""
        return self.ledger.reap()

    def mark_node_suspect(self, node: str, reason: str) -> float:
        """Mark a node suspect: a granted pod found the GPUs the ledger called free taken there.

        It takes no grant until the controller resyncs it (see
        :mod:`~airflow_gpupool.ledger.nodes.suspects`). Returns the mark's time (the ledger's clock).
        """
        return self.ledger.mark_node_suspect(node, reason)

    def poll_waiting(self, reservation_id: str) -> Reservation:
        """Read a waiting request's state: what a waiter does, and it only reads.

        The queue is served by the writers that change capacity and by the controller's
        reap. What heals a pool when no controller runs is that each process with waiters
        checks, at most once per ``[gpupool] waiter_reap_interval_seconds`` for all of them
        (one read), whether a lease or a wait is overdue, and only then reaps; a waiter past
        its own deadline checks at once, so it times out on time.
        """
        from airflow_gpupool.ledger import ReservationState

        ledger = self.ledger
        reservation = ledger.get(reservation_id)
        if reservation.state is ReservationState.WAITING:
            overdue = time.time() >= reservation.deadline
            interval = 0.0 if overdue else settings.waiter_reap_interval_seconds()
            if ledger.reap_if_due(interval) is not None:
                reservation = ledger.get(reservation_id)
        return reservation

    def explain(self, reservation_id: str) -> str:
        """Say why a waiting reservation waits (its queue position and the closest nodes)."""
        return self.ledger.explain(reservation_id)

    def forecast(self, reservation_id: str) -> StartForecast | None:
        """Read the controller's stored start forecast of a waiting request (None: none yet)."""
        from airflow_gpupool.ledger import LedgerForecasts

        return LedgerForecasts(self.ledger).get(reservation_id)

    def empty_cluster(self) -> ClusterSnapshot:
        """Return the inventory as if nothing were granted: what a request could ever get."""
        return self.ledger.empty_cluster()

    def reconcile_grant(self, core_v1_api: Any, reservation_id: str, *, grace_seconds: float) -> str | None:
        """Release a grant whose pod finished or never came; return why, or None when it is kept.

        :param core_v1_api: a ``kubernetes.client.CoreV1Api``
        :param reservation_id: the grant
        :param grace_seconds: how long the grant may wait for its pod to appear
        """
        from airflow_gpupool.controller.reconcile import reconcile_grant

        return reconcile_grant(self.ledger, core_v1_api, reservation_id, grace_seconds=grace_seconds)

    # -- the failed tries of task instances (the escalation ladder's memory) -------------------

    @cached_property
    def _attempts(self) -> TaskAttempts:
        from airflow_gpupool.ledger import TaskAttempts

        return TaskAttempts(self.ledger)

    def record_attempt(self, attempt: TaskAttempt) -> TaskAttempt:
        """Store a failed try (idempotent per task key and try)."""
        return self._attempts.record(attempt)

    def typical_run_seconds(self, dag_id: str, task_id: str) -> tuple[float, int] | None:
        """Return the median seconds of a task's recent successful runs and their count (None: none yet)."""
        from airflow_gpupool.ledger import LedgerHistory

        return LedgerHistory(self.ledger).typical_run_seconds(dag_id, task_id)

    def attempt_history(self, task_key: str) -> list[TaskAttempt]:
        """Return the failed tries of a task instance (:attr:`TaskTry.task_key`), oldest first."""
        return self._attempts.history(task_key)

    def claim_escalation(self, task_key: str, try_number: int) -> bool:
        """Mark a try as escalated; return False if its task instance already was (exactly one caller wins)."""
        return self._attempts.claim_escalation(task_key, try_number)

    def close(self) -> None:
        """Close the ledger's connections, if any were opened."""
        from airflow_gpupool.ledger import release_shared

        self.__dict__.pop("_attempts", None)
        if "ledger" in self.__dict__:
            release_shared(self.__dict__.pop("ledger"))


class AsyncGpuPoolHook(GpuPoolHook):
    """The hook for triggers: async connection look-up, ledger calls off the event loop."""

    async def aoptions(self) -> LedgerOptions:
        """Resolve the options with an async connection look-up."""
        if "options" not in self.__dict__:
            conn = await self._aconnection() if self.ledger_conn_id else None
            self.__dict__["options"] = self._resolve(conn)
        return self.options

    async def _aconnection(self) -> Any:
        try:
            return await self.aget_connection(str(self.ledger_conn_id))
        except AirflowNotFoundException as e:
            return self._missing_connection(e)

    async def aget(self, reservation_id: str) -> Reservation:
        """Return the reservation's state without blocking the triggerer's loop."""
        await self.aoptions()
        return await asyncio.to_thread(self.ledger.get, reservation_id)

    async def apoll_waiting(self, reservation_id: str) -> Reservation:
        """:meth:`poll_waiting` without blocking the triggerer's loop."""
        await self.aoptions()
        return await asyncio.to_thread(self.poll_waiting, reservation_id)

    async def aexplain(self, reservation_id: str) -> str:
        """:meth:`explain` without blocking the triggerer's loop."""
        await self.aoptions()
        return await asyncio.to_thread(self.explain, reservation_id)

    async def areap(self) -> ReapResult:
        """Reap without blocking the triggerer's loop."""
        await self.aoptions()
        return await asyncio.to_thread(self.ledger.reap)

    async def arenew(self, reservation_id: str, ttl: float | None = None) -> Reservation:
        """Renew a lease without blocking the triggerer's loop."""
        await self.aoptions()
        return await asyncio.to_thread(self.ledger.renew, reservation_id, ttl)

    async def anote_newest_checkpoint(self, reservation_id: str, store: CheckpointStore) -> float | None:
        """:meth:`note_newest_checkpoint` without blocking the triggerer's loop (the read and the write)."""
        await self.aoptions()
        return await asyncio.to_thread(self.note_newest_checkpoint, reservation_id, store)

    async def arenew_gang(self, reservation_id: str, ttl: float | None = None) -> Gang:
        """:meth:`renew_gang` without blocking the triggerer's loop."""
        await self.aoptions()
        return await asyncio.to_thread(self.renew_gang, reservation_id, ttl)


def resolve_ledger_url(explicit: str | None = None) -> str:
    """Return the ledger URL as the operator finds it (for the CLI, the UI, the metrics server).

    ``explicit`` (``--url``), else ``GPUPOOL_LEDGER_URL``, else the ``gpupool_default`` connection,
    else ``[gpupool] ledger_url``, else the SQLite default (refused under an executor that is not
    local). The connection is only looked up (which imports Airflow's secrets backends) when
    neither of the first two is given.

    :param explicit: the URL given on the command line
    :raises ConfigurationError: the connection is malformed, or the SQLite default is refused
    """
    from airflow_gpupool import settings

    if explicit or os.environ.get(settings.LEDGER_URL_ENV):
        return settings.ledger_url(explicit)
    return GpuPoolHook(GpuPoolHook.default_conn_name).options.ledger_url
