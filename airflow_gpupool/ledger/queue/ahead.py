"""Queue ahead in the write cycle: plans entered when due, idle grants stepped back, plans withdrawn.

A downstream step's request planned ahead of its upstream's end (:mod:`~airflow_gpupool.ledger.grants.queue_ahead`)
enters the queue at its ``enter_at`` with a fresh ``seq``, so it never takes a place earlier
than its time. Granted once its ``not_before`` came but not claimed within its idle bound (its
lease), it steps back: the grant ends and the request waits again with the same ``seq`` (its
place) and a ``not_before`` that only its claim clears. An upstream grant that ends any way but
success withdraws every plan and unclaimed request ahead of it, in the same transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Row, insert, select, update

from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db import statements as sql
from airflow_gpupool.ledger.db.models import ReservationState
from airflow_gpupool.ledger.db.records import GRANTED, WAITING
from airflow_gpupool.ledger.store.ends import ReservationEnds
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, Tx

__all__ = [
    "AHEAD_PREFIX",
    "PLANNED",
    "ahead_holder",
    "any_due",
    "enter",
    "enter_due",
    "step_back",
    "unclaimed",
    "withdraw",
    "withdraw_for_step",
]

log = logging.getLogger(LOGGER_NAME)

#: How the ids of requests queued ahead start (before their downstream claims them under its own id).
AHEAD_PREFIX = "qa-"
PLANNED, ENTERED, WITHDRAWN = "planned", "entered", "withdrawn"
#: A stepped-back request's not_before: in effect, until its claim clears it.
STEPPED_BACK_FOR = 10 * 365 * 86400.0
_HOLDER_SUFFIX = "/queued-ahead"
_r = schema.reservations.c
_p = schema.queue_ahead.c


def ahead_holder(task_key: str) -> str:
    """Return the holder of a request queued ahead for ``task_key``, not yet claimed: what its claim looks for."""
    return task_key[: 512 - len(_HOLDER_SUFFIX)] + _HOLDER_SUFFIX


def unclaimed(row: Row[Any]) -> bool:
    """Whether the reservation ``row`` is a request queued ahead that its step has not claimed."""
    return str(row.id).startswith(AHEAD_PREFIX)


def any_due(conn: Connection, now: float) -> bool:
    """Whether a lease or a wait is overdue at ``now``, or a plan waits to enter the queue (a read or two)."""
    if conn.execute(sql.ANY_DUE, {"now": now}).first() is not None:
        return True
    query = select(_p.id).where(_p.state == PLANNED, _p.enter_at <= now).limit(1)
    return conn.execute(query).first() is not None


def enter(tx: Tx, ends: ReservationEnds, plan: Row[Any]) -> None:
    """Enter the plan ``plan`` in the queue now: a waiting request with a fresh seq and its not_before."""
    request = ends.store.request_of(plan)  # the plan's id is the request's
    not_before = plan.not_before if plan.not_before > tx.now else None
    tx.conn.execute(
        insert(schema.reservations).values(
            id=plan.id,
            holder=ahead_holder(plan.task_key),
            request=plan.request,
            priority=request.priority,
            seq=tx.version,
            state=WAITING,
            team=request.team,
            workload_class=request.workload_class.value,
            created_at=tx.now,
            deadline=plan.not_before + plan.timeout,
            ttl=plan.idle_seconds,
            overtakes=0,
            not_before=not_before,
            ahead_of=plan.upstream_id,
            message=f"queued ahead of {plan.upstream_id}",
        )
    )
    tx.conn.execute(update(schema.queue_ahead).where(_p.id == plan.id).values(state=ENTERED))
    tx.queue_inserted.add(plan.id)
    tx.dirty = True
    log.info(
        "Request %s for %s queued ahead of %s: it waits in its place, not granted for another %.0f s",
        plan.id,
        plan.task_key,
        plan.upstream_id,
        max(0.0, plan.not_before - tx.now),
    )


def enter_due(tx: Tx, ends: ReservationEnds) -> bool:
    """Enter every plan whose ``enter_at`` has come; return whether any did."""
    due = tx.conn.execute(
        select(schema.queue_ahead)
        .where(_p.state == PLANNED, _p.enter_at <= tx.now)
        .order_by(_p.enter_at, _p.id)
    ).all()
    for plan in due:
        enter(tx, ends, plan)
    return bool(due)


def step_back(tx: Tx, ends: ReservationEnds, row: Row[Any]) -> None:
    """End the unclaimed grant ``row`` at its idle bound; its request waits again in its place."""
    idle = tx.now - (row.granted_at or tx.now)
    message = f"stepped back: granted {idle:.0f} s ago and not claimed; waits in its place until claimed"
    ends.end_grant(tx, row, ReservationState.RELEASED, message)
    tx.conn.execute(
        update(schema.reservations)
        .where(_r.id == row.id)
        .values(
            state=WAITING,
            granted_at=None,
            expires_at=None,
            ended_at=None,
            node=None,
            gpu_indices=None,
            milli_per_gpu=None,
            gpu_memory_mib=None,
            mig_slice=None,
            headroom_loan=None,
            not_before=tx.now + STEPPED_BACK_FOR,
            message=message,
        )
    )
    tx.spent_changed = True
    tx.queue_inserted.add(row.id)
    log.info("Request %s queued ahead of %s %s", row.id, row.ahead_of, message)


def _cancel(tx: Tx, ends: ReservationEnds, rows: Sequence[Row[Any]], message: str) -> None:
    """End the requests queued ahead ``rows`` as withdrawn: a grant frees its slice, a wait leaves the queue."""
    for row in rows:
        if row.state == GRANTED:
            ends.end_grant(tx, row, ReservationState.CANCELLED, message)
        else:
            ends.end_waiting(tx, row, ReservationState.CANCELLED, message)
        tx.withdrawn.add(row.id)  # a due list read before this must skip it


def withdraw_for_step(tx: Tx, ends: ReservationEnds, task_key: str, why: str) -> None:
    """Withdraw the unclaimed requests and plans queued ahead for the step ``task_key`` (it was handed a slice)."""
    conn = tx.conn
    conn.execute(
        update(schema.queue_ahead).where(_p.task_key == task_key, _p.state == PLANNED).values(state=WITHDRAWN)
    )
    rows = conn.execute(
        select(schema.reservations).where(
            _r.holder == ahead_holder(task_key), _r.state.in_((WAITING, GRANTED))
        )
    ).all()
    message = f"withdrawn: {why}"[:1000]
    _cancel(tx, ends, rows, message)
    for row in rows:
        log.info("Request %s queued ahead for %s %s", row.id, task_key, message)
    tx.spent_changed |= bool(rows)


def withdraw(tx: Tx, ends: ReservationEnds, upstream: Row[Any], how: str) -> list[str]:
    """Withdraw the plans and unclaimed requests queued ahead of the grant ``upstream``; return their ids."""
    message = f"withdrawn: upstream {upstream.holder} ({upstream.id}) ended {how}"[:1000]
    conn = tx.conn
    plans = conn.execute(select(_p.id).where(_p.upstream_id == upstream.id, _p.state == PLANNED)).all()
    conn.execute(
        update(schema.queue_ahead)
        .where(_p.upstream_id == upstream.id, _p.state == PLANNED)
        .values(state=WITHDRAWN)
    )
    rows = conn.execute(
        select(schema.reservations).where(
            _r.ahead_of == upstream.id, _r.state.in_((WAITING, GRANTED)), _r.id.startswith(AHEAD_PREFIX)
        )
    ).all()
    _cancel(tx, ends, rows, message)
    conn.execute(update(schema.reservations).where(_r.id == upstream.id).values(ahead_planned=None))
    gone = [p.id for p in plans] + [row.id for row in rows]
    if gone:
        tx.spent_changed = True
        log.warning("Queued ahead of %s, %s: %s", upstream.id, message, ", ".join(gone))
    return gone
