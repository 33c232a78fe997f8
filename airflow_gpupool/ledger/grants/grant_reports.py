"""What a grant's holder reports about it: the pod bound to it, and its newest checkpoint.

The operator binds its pod once it is created (and again with the pod's uid), so the controller
can reconcile grants with pods; it reports the newest valid checkpoint at each renewal, which is
what preemption ranks victims by. Each is one short write in the serialized cycle.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import update

from airflow_gpupool.exceptions import (
    GpuPoolError,
    InvalidRequestError,
    LeaseExpiredError,
    UnknownReservationError,
)
from airflow_gpupool.ledger.db import records, schema
from airflow_gpupool.ledger.db import statements as sql
from airflow_gpupool.ledger.db.models import Reservation
from airflow_gpupool.ledger.db.records import HOLDING
from airflow_gpupool.ledger.queue.cycle import WriteCycle
from airflow_gpupool.ledger.store.transactions import LOGGER_NAME, LedgerStore, Tx

__all__ = ["PodBinding", "bind_pod", "bind_pods", "note_checkpoint"]

log = logging.getLogger(LOGGER_NAME)


def note_checkpoint(cycle: WriteCycle, reservation_id: str, at: float) -> bool:
    """Record when a grant's newest valid checkpoint was written; return whether it holds.

    Only a newer time is kept. Preemption ranks victims by the work since it.
    """
    if isinstance(at, bool) or not isinstance(at, int | float) or at != at:
        raise InvalidRequestError("checkpoint time", at, "a number of seconds since the epoch")

    def run(tx: Tx) -> bool:
        tx.queue_tracked = True
        row = records.row_by_id(tx.conn, reservation_id)
        if row.state not in HOLDING:
            return False
        if row.checkpoint_at is None or at > row.checkpoint_at:
            tx.conn.execute(
                update(schema.reservations)
                .where(schema.reservations.c.id == reservation_id)
                .values(checkpoint_at=float(at))
            )
        return True

    return cycle.write(run)


def bind_pod(cycle: WriteCycle, store: LedgerStore, binding: PodBinding) -> Reservation:
    """Record the pod of a grant (see :meth:`~airflow_gpupool.ledger.Ledger.bind`)."""

    def run(tx: Tx) -> Reservation:
        tx.queue_tracked = True
        return _bind_in(tx, store, binding)

    return cycle.write(run)


def bind_pods(
    cycle: WriteCycle, store: LedgerStore, bindings: list[PodBinding]
) -> dict[str, Reservation | GpuPoolError]:
    """Record the pods of many grants in one transaction (see :meth:`~airflow_gpupool.ledger.Ledger.bind_many`)."""

    def run(tx: Tx) -> dict[str, Reservation | GpuPoolError]:
        tx.queue_tracked = True
        bound: dict[str, Reservation | GpuPoolError] = {}
        for binding in bindings:
            try:
                bound[binding.reservation_id] = _bind_in(tx, store, binding)
            except (LeaseExpiredError, UnknownReservationError) as e:  # raised before it writes
                bound[binding.reservation_id] = e
        return bound

    return cycle.write(run)


def _bind_in(tx: Tx, store: LedgerStore, binding: PodBinding) -> Reservation:
    """Bind one grant to its pod inside a write transaction.

    :raises LeaseExpiredError: it holds nothing, before anything is written
    :raises UnknownReservationError: no such id, before anything is written
    """
    rid = binding.reservation_id
    row = records.row_by_id(tx.conn, rid)
    if row.state not in HOLDING:
        raise LeaseExpiredError(rid, row.state)
    same_pod = (row.pod_namespace, row.pod_name) == (binding.namespace, binding.name)
    if same_pod and (binding.uid is None or row.pod_uid == binding.uid):
        return store.reservation(tx.conn, row)  # bound already; a name alone never drops a uid
    if row.pod_name is not None and (not same_pod or row.pod_uid is not None):  # another pod, not its uid
        log.warning(
            "Grant %s was bound to pod %s/%s (uid %s); now bound to %s/%s (uid %s)",
            rid,
            row.pod_namespace,
            row.pod_name,
            row.pod_uid,
            binding.namespace,
            binding.name,
            binding.uid,
        )
    tx.conn.execute(
        sql.BIND_ROW,
        {
            "rid": rid,
            "namespace": binding.namespace,
            "name": binding.name,
            "uid": binding.uid,
            "now": tx.now,
        },
    )
    return store.reservation(tx.conn, records.row_by_id(tx.conn, rid))


@dataclass(frozen=True)
class PodBinding:
    """The pod a grant is bound to, checked; ``uid`` None while the pod is being created.

    :raises InvalidRequestError: a field is empty, not a string, or too long
    """

    reservation_id: str
    namespace: str
    name: str
    uid: str | None = None

    def __post_init__(self) -> None:
        for what, value, most in (
            ("namespace", self.namespace, 253),
            ("name", self.name, 253),
            ("uid", "-" if self.uid is None else self.uid, 64),
        ):
            if not isinstance(value, str) or not 0 < len(value) <= most:
                raise InvalidRequestError(f"pod {what}", value, f"a string of 1 to {most} characters")
