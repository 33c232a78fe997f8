"""Queue ahead: the next step of a DAG run enters the queue before its upstream ends (issue 40).

:meth:`QueueAheads.plan` stores, in one transaction, a plan for a downstream step that cannot be
handed its upstream's slice: its request enters the queue at ``enter_at`` (at once if that has
come, else when the write cycle's due processing finds it due, with a fresh ``seq`` then) and
is not granted before ``not_before``. It waits under an id of its own (``qa-...``), a holder that
marks it unclaimed, and ``ahead_of`` naming the upstream grant (kept once ``not_before`` clears:
what the page and the history read). Planning the same upstream try again finds the first plan.

The downstream's reserve (:meth:`QueueAheads.claim`) takes it over under its try's id in one
transaction: a waiting request keeps its ``seq`` (its place) and is due at once; a granted one
keeps its GPUs. The write cycle (:mod:`~airflow_gpupool.ledger.queue.ahead`) steps an unclaimed
grant back at its idle bound and withdraws what queued ahead of an upstream that ends any way
but success (a release with ``keep_queued_ahead``, or a hand-on).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, insert, select, update

from airflow_gpupool import settings
from airflow_gpupool.exceptions import InvalidRequestError
from airflow_gpupool.ledger.db import records, schema
from airflow_gpupool.ledger.db.models import Reservation
from airflow_gpupool.ledger.db.records import GRANTED, WAITING
from airflow_gpupool.ledger.grants.hand_on import check_hold
from airflow_gpupool.ledger.grants.reserve_args import ReserveArgs
from airflow_gpupool.ledger.queue import ahead
from airflow_gpupool.ledger.queue.cycle import WriteCycle
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, LedgerStore, Tx
from airflow_gpupool.resources import GpuRequest

__all__ = ["LedgerQueueAheadApi", "QueueAheadResult", "QueueAheads"]

log = logging.getLogger(LOGGER_NAME)
_r = schema.reservations.c
_p = schema.queue_ahead.c


def _ahead_id(task_key: str, upstream_id: str) -> str:
    # Keyed by the upstream try too: planning again for the same try finds what the first call did.
    return ahead.AHEAD_PREFIX + hashlib.sha256(f"{task_key}|{upstream_id}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class QueueAheadResult:
    """What a queue-ahead plan did.

    :param upstream_id: the running grant the request is queued ahead of
    :param task_key: the downstream step
    :param ahead_id: the request's id until the step claims it (None: nothing planned)
    :param entered: whether the request is in the queue already (else it enters at ``enter_at``)
    :param enter_at: ledger time at which it enters the queue
    :param not_before: ledger time before which it is not granted
    :param message: what was planned, or why nothing was
    """

    upstream_id: str
    task_key: str
    ahead_id: str | None
    entered: bool
    enter_at: float | None
    not_before: float | None
    message: str

    @property
    def planned(self) -> bool:
        """Whether a request was queued ahead."""
        return self.ahead_id is not None


def _ledger_time(name: str, value: object) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):  # type: ignore[arg-type]
        raise InvalidRequestError(name, value, "a finite ledger time (Ledger.now)")
    return float(value)  # type: ignore[arg-type]


class QueueAheads:
    """Plan a downstream step's request ahead of its upstream's end, and that step's claim of it."""

    def __init__(self, store: LedgerStore, cycle: WriteCycle) -> None:
        self._store = store
        self._cycle = cycle

    def plan(
        self,
        upstream_id: str,
        task_key: str,
        request: GpuRequest,
        times: tuple[float, float],
        idle_seconds: float,
        timeout: float,
    ) -> QueueAheadResult:
        """Store the plan (see :meth:`LedgerQueueAheadApi.queue_ahead`); ``times`` is (enter_at, not_before)."""
        if not isinstance(request, GpuRequest):
            raise InvalidRequestError("request", request, "a GpuRequest")
        if not isinstance(task_key, str) or not 0 < len(task_key) <= 512:
            raise InvalidRequestError("task_key", task_key, "a string of 1 to 512 characters")
        enter_at, not_before = _ledger_time("enter_at", times[0]), _ledger_time("not_before", times[1])
        if enter_at > not_before:
            raise InvalidRequestError(
                "enter_at", enter_at, f"a ledger time no later than not_before ({not_before})"
            )
        try:
            idle = check_hold(idle_seconds)
        except InvalidRequestError:
            raise InvalidRequestError(
                "idle_seconds", idle_seconds, "a number of seconds in (0, 86400]"
            ) from None
        qid = _ahead_id(task_key, upstream_id)

        def run(tx: Tx) -> QueueAheadResult:
            tx.queue_tracked = True
            upstream = records.row_by_id(tx.conn, upstream_id)
            found = tx.conn.execute(select(schema.queue_ahead).where(_p.id == qid)).first()
            if found is not None:
                entered = found.state == ahead.ENTERED
                message = f"queued ahead already as {qid} ({found.state})"
                return QueueAheadResult(
                    upstream_id, task_key, qid, entered, found.enter_at, found.not_before, message
                )
            why = self._refusal(upstream, request)
            if why is not None:
                return QueueAheadResult(
                    upstream_id, task_key, None, False, None, None, f"not queued ahead: {why}"
                )
            plan = dict(
                id=qid,
                upstream_id=upstream_id,
                task_key=task_key,
                request=json.dumps(request.to_dict(), sort_keys=True),
                enter_at=enter_at,
                not_before=not_before,
                idle_seconds=idle,
                timeout=timeout,
                state=ahead.PLANNED,
                created_at=tx.now,
            )
            tx.conn.execute(insert(schema.queue_ahead).values(**plan))
            tx.conn.execute(
                update(schema.reservations).where(_r.id == upstream_id).values(ahead_planned=True)
            )
            entered = enter_at <= tx.now
            if entered:
                ahead.enter(
                    tx, self._cycle, tx.conn.execute(select(schema.queue_ahead).where(_p.id == qid)).one()
                )
                self._cycle.serve(tx)
                when = "in the queue now"
            else:
                when = f"enters the queue in {enter_at - tx.now:.0f} s"
                log.info("Request %s for %s queued ahead of %s: %s", qid, task_key, upstream_id, when)
            message = (
                f"{request.describe()} queued ahead of {upstream_id} as {qid}: {when}, "
                f"not granted for another {max(0.0, not_before - tx.now):.0f} s"
            )
            return QueueAheadResult(upstream_id, task_key, qid, entered, enter_at, not_before, message)

        return self._cycle.write(run)

    @staticmethod
    def _refusal(upstream: object, request: GpuRequest) -> str | None:
        state = getattr(upstream, "state", None)
        if state != GRANTED or getattr(upstream, "preempt_deadline", None) is not None:
            return f"the upstream {getattr(upstream, 'id', '?')} is not a running grant ({state})"
        if request.gang is not None:
            return "a gang is not queued ahead"
        return None

    def pending(self, task_key: str) -> bool:
        """Whether a request (or a plan) queued ahead for ``task_key`` waits for its claim (one read, no write)."""
        holder = ahead.ahead_holder(task_key)

        def run(conn: Connection) -> bool:
            query = select(_r.id).where(_r.holder == holder, _r.state.in_((WAITING, GRANTED))).limit(1)
            plans = select(_p.id).where(_p.task_key == task_key, _p.state == ahead.PLANNED).limit(1)
            return conn.execute(query).first() is not None or conn.execute(plans).first() is not None

        return self._store.read(run)

    def claim(self, args: ReserveArgs, task_key: str) -> Reservation | str | None:
        """Take the request queued ahead for ``task_key`` over as ``args``'s reservation; None: none to take.

        One transaction: a waiting one keeps its ``seq`` and its not_before is cleared (the step
        runs: it is due); a granted one keeps its GPUs, its lease that of ``args``. One queued for
        another request than ``args.request``, or a plan not entered yet, is not taken: why is
        returned, for the caller to withdraw it (:meth:`withdraw`) once its own reserve is accepted
        (a refused reserve changes nothing).
        """
        rid = args.reservation_id
        # Read first: what is not taken (another request, a plan not entered, an id already
        # reserved) costs no write, so that a reserve refused after it has changed nothing, not
        # even the due processing every write does.
        found = self._store.read(lambda conn: self._find(conn, args, task_key))
        if not isinstance(found, Row):
            return found

        def run(tx: Tx) -> Reservation | str | None:
            tx.queue_tracked = True
            row = self._find(tx.conn, args, task_key)  # again: it may have moved since the read
            if not isinstance(row, Row):
                return row
            values: dict[str, object] = dict(
                id=rid, holder=args.holder, ttl=args.ttl, deadline=tx.now + args.timeout
            )
            if row.state == GRANTED:
                values["expires_at"] = tx.now + args.ttl
            else:
                values["not_before"] = args.not_before if (args.not_before or 0) > tx.now else None
            tx.conn.execute(update(schema.reservations).where(_r.id == row.id).values(**values))
            if row.state == GRANTED and row.mig_slice is not None:  # a MIG slice names its holder's id
                m = schema.mig_slices.c
                held = (m.node == row.node) & (m.slice_id == row.mig_slice) & (m.holder == row.id)
                tx.conn.execute(update(schema.mig_slices).where(held).values(holder=rid))
            tx.dirty = tx.spent_changed = True
            tx.queue_inserted.add(rid)
            self._store.requests.put(rid, args.request)
            log.info(
                "Request %s queued ahead for %s (%s) claimed as %s by %s",
                row.id,
                task_key,
                row.state,
                rid,
                args.holder,
            )
            if row.state == WAITING:
                self._cycle.serve(tx)
            return self._store.reservation(tx.conn, records.row_by_id(tx.conn, rid))

        return self._cycle.write(run)

    def _find(self, conn: Connection, args: ReserveArgs, task_key: str) -> Reservation | str | Row[Any]:
        """The row queued ahead for ``task_key`` that ``args`` takes over, else what ``claim`` returns instead."""
        rid = args.reservation_id
        existing = conn.execute(select(schema.reservations).where(_r.id == rid)).first()
        if existing is not None:
            return self._store.reservation(conn, existing)
        row = conn.execute(
            select(schema.reservations)
            .where(_r.holder == ahead.ahead_holder(task_key), _r.state.in_((WAITING, GRANTED)))
            .order_by(_r.seq)
            .limit(1)
        ).first()
        if row is None:  # planned, not entered: the step runs now, the plan is moot
            return f"{rid} reserved before it entered the queue"
        if self._store.request_of(row) != args.request:
            return f"{rid} reserved another request ({args.request.describe()})"
        return row

    def withdraw(self, task_key: str, why: str) -> None:
        """Withdraw what is queued ahead for the step ``task_key``: its own reserve went another way."""

        def run(tx: Tx) -> None:
            tx.queue_tracked = True
            ahead.withdraw_for_step(tx, self._cycle, task_key, why)
            self._cycle.serve(tx)

        self._cycle.write(run)


class LedgerQueueAheadApi:
    """The ledger's public queue ahead: :class:`~airflow_gpupool.ledger.Ledger` inherits it."""

    _queue_aheads: QueueAheads

    def _claim_ahead(self, args: ReserveArgs, task_key: str) -> Reservation | str | None:
        """Take over the request queued ahead for ``task_key`` (:meth:`QueueAheads.claim`); None: none."""
        return self._queue_aheads.claim(args, task_key) if self._queue_aheads.pending(task_key) else None

    def _withdraw_ahead(self, task_key: str, why: str) -> None:
        self._queue_aheads.withdraw(task_key, why)

    def queue_ahead(
        self,
        upstream_id: str,
        to_task_key: str,
        request: GpuRequest,
        *,
        enter_at: float,
        not_before: float,
        idle_seconds: float | None = None,
        timeout: float | None = None,
    ) -> QueueAheadResult:
        """Queue the step ``to_task_key``'s request ahead of the running grant ``upstream_id``.

        One transaction: the request enters the queue at ``enter_at`` (now, if that has come)
        and keeps its place from then on, but is not granted before ``not_before``; granted and
        not claimed by the step's reserve (``task_key=to_task_key``) within ``idle_seconds``, it
        steps back to wait in its place until claimed. The upstream ending any way but success
        (released without ``keep_queued_ahead``, expired, preempted, revoked) withdraws it.
        Idempotent per upstream grant and step.

        :param enter_at: ledger time (:meth:`now`) at which the request enters the queue
        :param not_before: ledger time before which it is not granted (at least ``enter_at``)
        :param idle_seconds: how long a grant waits for its claim (default ``[gpupool] queue_ahead_idle_seconds``)
        :param timeout: seconds it may wait past ``not_before`` (default ``[gpupool] reservation_timeout_seconds``)
        :raises UnknownReservationError: no grant ``upstream_id``
        :raises InvalidRequestError: a bad request, task key, time or bound; nothing is written
        """
        idle = settings.queue_ahead_idle_seconds() if idle_seconds is None else idle_seconds
        wait = settings.reservation_timeout_seconds() if timeout is None else timeout
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 < wait < math.inf:
            raise InvalidRequestError("timeout", timeout, "a finite number of seconds above 0")
        return self._queue_aheads.plan(upstream_id, to_task_key, request, (enter_at, not_before), idle, wait)
