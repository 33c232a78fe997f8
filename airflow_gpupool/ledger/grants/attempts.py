"""Failed task tries, kept in the ledger so a retry on any worker knows what failed before it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import insert, select, update

from airflow_gpupool.ledger.db import schema
from airflow_gpupool.resources import GpuRequest

if TYPE_CHECKING:
    from sqlalchemy import Connection, Row

    from airflow_gpupool.ledger.store.access import LedgerAccess
    from airflow_gpupool.ledger.store.transactions import Tx


@dataclass(frozen=True)
class TaskAttempt:
    """One failed try of a task instance.

    :param task_key: ``dag/task/run/map-N``: the task instance, without the try
    :param failure_class: how it failed (:class:`~airflow_gpupool.operators.failures.FailureClass` value)
    :param remedy: what the escalation ladder decided
    :param request: the request this try ran with
    :param next_request: the request the next try must make (None: the same as the task's)
    :param gpu_model: the GPU model the failed try ran on
    :param checkpoint_step: the newest valid checkpoint when it failed
    :param escalated: whether a person was notified for this task instance at this try
    """

    task_key: str
    try_number: int
    reservation_id: str
    failure_class: str
    remedy: str
    request: GpuRequest
    message: str
    exit_code: int | None = None
    next_request: GpuRequest | None = None
    gpu_model: str | None = None
    checkpoint_step: int | None = None
    escalated: bool = False
    created_at: float = 0.0


def _row_to_attempt(row: Row[Any]) -> TaskAttempt:
    return TaskAttempt(
        task_key=row.task_key,
        try_number=row.try_number,
        reservation_id=row.reservation_id,
        failure_class=row.failure_class,
        remedy=row.remedy,
        request=GpuRequest.from_dict(json.loads(row.request)),
        message=row.message,
        exit_code=row.exit_code,
        next_request=GpuRequest.from_dict(json.loads(row.next_request)) if row.next_request else None,
        gpu_model=row.gpu_model,
        checkpoint_step=row.checkpoint_step,
        escalated=bool(row.escalated),
        created_at=row.created_at,
    )


class TaskAttempts:
    """Record and read failed tries of task instances in a ledger.

    :param ledger: the ledger (schema v2 or later)
    """

    def __init__(self, ledger: LedgerAccess) -> None:
        self.ledger = ledger

    def record(self, attempt: TaskAttempt) -> TaskAttempt:
        """Store a failed try (idempotent per task key and try: a second record of a try is ignored)."""
        a = schema.task_attempts.c

        def run(tx: Tx) -> TaskAttempt:
            existing = tx.conn.execute(
                select(schema.task_attempts).where(
                    a.task_key == attempt.task_key, a.try_number == attempt.try_number
                )
            ).first()
            if existing is not None:
                return _row_to_attempt(existing)
            created = tx.now
            tx.conn.execute(
                insert(schema.task_attempts).values(
                    task_key=attempt.task_key,
                    try_number=attempt.try_number,
                    reservation_id=attempt.reservation_id,
                    failure_class=attempt.failure_class,
                    remedy=attempt.remedy,
                    exit_code=attempt.exit_code,
                    request=json.dumps(attempt.request.to_dict()),
                    next_request=json.dumps(attempt.next_request.to_dict()) if attempt.next_request else None,
                    gpu_model=attempt.gpu_model,
                    checkpoint_step=attempt.checkpoint_step,
                    message=attempt.message,
                    escalated=False,
                    created_at=created,
                )
            )
            return _row_to_attempt(
                tx.conn.execute(
                    select(schema.task_attempts).where(
                        a.task_key == attempt.task_key, a.try_number == attempt.try_number
                    )
                ).one()
            )

        return self.ledger.write(run)

    def history(self, task_key: str) -> list[TaskAttempt]:
        """Return the failed tries of a task instance, oldest first."""
        a = schema.task_attempts.c

        def run(conn: Connection) -> list[TaskAttempt]:
            query = select(schema.task_attempts).where(a.task_key == task_key).order_by(a.try_number)
            return [_row_to_attempt(row) for row in conn.execute(query)]

        return self.ledger.read(run)

    def claim_escalation(self, task_key: str, try_number: int) -> bool:
        """Mark try ``try_number`` as escalated; return False if this task instance already was.

        Runs under the ledger's write lock, so of two callers (a task and its failure callback,
        two copies of a trigger) exactly one gets True and notifies.
        """
        a = schema.task_attempts.c

        def run(tx: Tx) -> bool:
            done = tx.conn.execute(
                select(a.try_number).where(a.task_key == task_key, a.escalated.is_(True))
            ).first()
            if done is not None:
                return False
            changed = tx.conn.execute(
                update(schema.task_attempts)
                .where(a.task_key == task_key, a.try_number == try_number)
                .values(escalated=True)
            )
            return bool(changed.rowcount)

        return self.ledger.write(run)
