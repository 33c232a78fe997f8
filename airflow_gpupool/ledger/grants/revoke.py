"""A grant revoked by an operator: its pod gets a grace to checkpoint and end, as a preemption victim's does.

Releasing a grant whose pod runs would hand its GPUs on while the pod still uses them. A revoked
grant instead becomes a preemption victim that nobody waits for: the task's next renewal raises
:class:`~airflow_gpupool.exceptions.GrantPreemptedError`, so it deletes its pod with what is left
of the grace (SIGTERM first: the training may write a checkpoint) and then releases the grant. If
the grace runs out first, the grant is orphaned for the controller to delete the pod
(:meth:`~airflow_gpupool.ledger.store.ends.ReservationEnds.end_preemption`): either way the slice
passes on only once the pod is gone. A grant no pod is bound to is released at once: its task
binds its pod before creating it, so nothing runs there yet.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, select, update

from airflow_gpupool.exceptions import InvalidRequestError, UnknownReservationError
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db.models import Reservation
from airflow_gpupool.ledger.db.records import GRANTED
from airflow_gpupool.ledger.queue.cycle import WriteCycle
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, Tx

__all__ = ["revoke"]

_r = schema.reservations.c
log = logging.getLogger(LOGGER_NAME)


def revoke(
    cycle: WriteCycle, reservation_id: str, *, by: str, grace: float | None = None
) -> Reservation | None:
    """Give a bound grant (a gang's leader: every member) a deadline by which its pod ends.

    :param by: who revokes it, for the message the history shows ("revoked by ...")
    :param grace: seconds the pod has (default: its request's preemption grace, else the ledger's)
    :returns: the grant, now a victim; None where no pod is bound to it (the caller releases it)
    :raises UnknownReservationError: no such id
    :raises InvalidRequestError: it is not a grant, it is already being preempted, or a bad grace
    """
    if grace is not None and (isinstance(grace, bool) or not math.isfinite(grace) or grace <= 0):
        raise InvalidRequestError("grace", grace, "a finite number of seconds above 0")

    def run(tx: Tx) -> Reservation | None:
        row = tx.conn.execute(select(schema.reservations).where(_r.id == reservation_id)).first()
        if row is None:
            raise UnknownReservationError(reservation_id)
        if row.state != GRANTED:
            raise InvalidRequestError(
                "reservation", reservation_id, f"a grant (it is {row.state}): only a grant is revoked"
            )
        if row.preempt_deadline is not None:
            raise InvalidRequestError(
                "reservation", reservation_id, "a grant not already being preempted (it has a deadline)"
            )
        members: Sequence[Row[Any]] = [row]
        if row.gang_id is not None:
            members = tx.conn.execute(
                select(schema.reservations).where(_r.gang_id == row.gang_id, _r.state == GRANTED)
            ).all()
        if all(m.pod_name is None for m in members):
            return None
        request = cycle.store.request_of(row)
        seconds = grace or request.preemption_grace_seconds or cycle.preemption_grace_seconds
        deadline = tx.now + seconds
        message = f"revoked by {by}: {seconds:g} s for its pod to checkpoint and end"
        log.warning("Grant %s %s", reservation_id, message)
        for member in members:
            tx.conn.execute(
                update(schema.reservations)
                .where(_r.id == member.id)
                .values(
                    preempt_deadline=deadline,
                    expires_at=min(float(member.expires_at), deadline),
                    message=message,
                )
            )
        tx.dirty = True
        fresh = tx.conn.execute(select(schema.reservations).where(_r.id == reservation_id)).one()
        return cycle.store.reservation(tx.conn, fresh)

    return cycle.write(run)
