"""A waiting request's priority changed in place: the queue's order follows at once.

A request is otherwise immutable once reserved; its priority is the one field an operator may
change while it waits (the console's "change priority"). The row's ``priority`` column and its
stored request change together, a gang's members with their leader (a gang waits at its
leader's priority), and the queue is served in the same transaction, so the gate and the held
nodes are published for the new order. Other processes parse the request again: their cache
compares the row's priority (:class:`~airflow_gpupool.ledger.store.transactions.RequestCache`).
"""

from __future__ import annotations

import dataclasses
import json

from sqlalchemy import or_, select, update

from airflow_gpupool.exceptions import InvalidRequestError, UnknownReservationError
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db.models import Reservation, ReservationState
from airflow_gpupool.ledger.queue.cycle import WriteCycle
from airflow_gpupool.ledger.store.transactions import LedgerStore, Tx
from airflow_gpupool.resources import MAX_ABS_PRIORITY

__all__ = ["set_priority"]


def set_priority(store: LedgerStore, cycle: WriteCycle, reservation_id: str, priority: int) -> Reservation:
    """Give a waiting request (a gang: every member) ``priority``, then serve the queue.

    :raises UnknownReservationError: no such id
    :raises InvalidRequestError: not an integer in the ledger's range, or the request no longer waits
    """
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) > MAX_ABS_PRIORITY:
        raise InvalidRequestError(
            "priority", priority, f"an integer from {-MAX_ABS_PRIORITY} to {MAX_ABS_PRIORITY}"
        )
    r = schema.reservations.c

    def run(tx: Tx) -> Reservation:
        row = tx.conn.execute(select(schema.reservations).where(r.id == reservation_id)).first()
        if row is None:
            raise UnknownReservationError(reservation_id)
        if row.state != ReservationState.WAITING.value:
            expected = f"a waiting request (it is {row.state}): only a waiting one's priority changes"
            raise InvalidRequestError("reservation", reservation_id, expected)
        gang = row.gang_id
        members = tx.conn.execute(
            select(schema.reservations).where(
                r.state == ReservationState.WAITING.value,
                or_(r.gang_id == gang, r.id == reservation_id) if gang else r.id == reservation_id,
            )
        ).all()
        for member in members:
            request = dataclasses.replace(store.request_of(member), priority=priority)
            tx.conn.execute(
                update(schema.reservations)
                .where(r.id == member.id)
                .values(request=json.dumps(request.to_dict(), sort_keys=True), priority=priority)
            )
            store.requests.put(member.id, request)
        cycle.serve(tx)
        fresh = tx.conn.execute(select(schema.reservations).where(r.id == reservation_id)).one()
        return store.reservation(tx.conn, fresh)

    return cycle.write(run)
