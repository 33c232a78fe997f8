"""Waiting for a slice, deferred or in place (the worker reads its own reservation, nothing else).

The twin of :class:`~airflow_gpupool.triggers.reservation.ReservationTrigger` for a task that
keeps its worker slot: it reads its reservation every ``poll_interval`` seconds and serves no
queue (the writers that change capacity do, and the controller's reap); it writes only when
something is overdue (:meth:`~airflow_gpupool.hooks.gpupool.GpuPoolHook.poll_waiting`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow_gpupool.exceptions import GpuPoolError, ReservationTimeoutError
from airflow_gpupool.forecast.deadlines import XCOM_DEADLINE_KEY, DagDeadline, deadlines_missed
from airflow_gpupool.hooks.gpupool import GpuPoolHook
from airflow_gpupool.ledger import Grant, ReservationState
from airflow_gpupool.triggers.queue_life import QueueLife
from airflow_gpupool.triggers.reservation import ReservationTrigger

__all__ = ["deferral_after_deadline", "record_unreachable_deadlines", "reservation_deferral", "wait_in_place"]

# Why it waits is asked this often (an explanation places the request on the whole inventory).
_EXPLAIN_EVERY_S = 30.0


def wait_in_place(
    hook: GpuPoolHook,
    rid: str,
    poll_interval: float,
    log: logging.Logger | Any,
    *,
    deadlines: Sequence[DagDeadline] = (),
    ti: Any = None,
) -> tuple[Grant, dict[str, Any]]:
    """Wait until ``rid`` is granted; return the grant and its queue life (:meth:`QueueLife.to_dict`).

    :param deadlines: the DAG run's deadlines (:func:`~airflow_gpupool.forecast.deadlines.dag_deadlines`):
        at each poll the stored forecast is read and, the first time it makes one unreachable, said
        as the deferred trigger says it (:func:`record_unreachable_deadlines` on ``ti``); the task waits on
    :param ti: the task instance the ``gpupool_deadline`` XCom is pushed on
    :raises ReservationTimeoutError: it waited past its deadline
    :raises GpuPoolError: it ended otherwise (withdrawn, expired)
    """
    life = QueueLife(time.time())
    explained_at = -_EXPLAIN_EVERY_S
    while True:
        reservation = hook.poll_waiting(rid)
        if reservation.state is ReservationState.GRANTED and reservation.grant is not None:
            return reservation.grant, life.to_dict(reservation.grant.granted_at - reservation.created_at)
        if reservation.state is ReservationState.TIMED_OUT:
            raise ReservationTimeoutError(rid, time.time() - reservation.created_at, [reservation.message])
        if reservation.state.ended:
            raise GpuPoolError(f"reservation {rid} ended as {reservation.state.value}: {reservation.message}")
        reason = None
        if time.monotonic() - explained_at >= _EXPLAIN_EVERY_S:
            reason, explained_at = hook.explain(rid), time.monotonic()
        life.saw(reservation.position, reason)
        log.info(
            "Waiting for a GPU slice at position %s of the queue: %s",
            reservation.position,
            reason or life.blocked,
        )
        if deadlines and (missed := deadlines_missed(deadlines, hook.forecast(rid), time.time())):
            record_unreachable_deadlines(ti, {"reservation_id": rid, **missed.fields()}, log)
            deadlines = missed.deadlines
        time.sleep(max(0.0, min(poll_interval, reservation.deadline - time.time() + 0.05)))


def reservation_deferral(
    rid: str,
    ledger_conn_id: str | None,
    timeout: float,
    poll_interval: float,
    *,
    fail_fast_on_forecast: bool = False,
    deadlines: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Return the arguments of ``self.defer`` that wait for ``rid`` in ReservationTrigger.

    The task resumes in ``execute_granted``; the deferral outlives the reservation's own timeout
    by a few polls and a minute, so the trigger reports the timeout rather than Airflow.

    :param rid: the waiting reservation (or gang leader)
    :param ledger_conn_id: the ``gpupool`` connection (None: ``[gpupool]`` configuration)
    :param timeout: the reservation's timeout, in seconds
    :param poll_interval: seconds between the trigger's reads
    :param fail_fast_on_forecast: the trigger gives up once the forecast puts p10 past the timeout
    :param deadlines: the DAG run's deadlines the trigger compares with the forecast
        (:meth:`~airflow_gpupool.forecast.deadlines.DagDeadline.to_dict`)
    """
    return {
        "trigger": ReservationTrigger(
            rid,
            ledger_conn_id,
            poll_interval=poll_interval,
            fail_fast_on_forecast=fail_fast_on_forecast,
            deadlines=deadlines,
        ),
        "method_name": "execute_granted",
        "timeout": timedelta(seconds=timeout + 5 * poll_interval + 60),
    }


def record_unreachable_deadlines(ti: Any, event: dict[str, Any], log: logging.Logger | Any) -> None:
    """Record a ``deadline`` event: a warning in the task's log and the ``gpupool_deadline`` XCom.

    Airflow 3 gives task code no way to write a task-instance note (the execution API has no
    such route); an XCom is what the task can write and a deadline's callback, a sensor or a
    person can read (the REST API's ``xcomEntries``). Its value: each unreachable deadline
    (``name``, ``at``, ``message``) and the forecast that said so.
    """
    for missed in event["unreachable"]:
        log.warning("Reservation %s %s", event["reservation_id"], missed["message"])
    ti.xcom_push(
        key=XCOM_DEADLINE_KEY,
        value={
            "reservation_id": event["reservation_id"],
            "unreachable": event["unreachable"],
            "forecast": event["forecast"],
        },
    )


def deferral_after_deadline(
    hook: GpuPoolHook,
    ledger_conn_id: str | None,
    ti: Any,
    event: dict[str, Any],
    log: logging.Logger | Any,
    *,
    fail_fast_on_forecast: bool = False,
) -> dict[str, Any]:
    """Record a ``deadline`` event, then return the deferral that waits on (the request keeps its place).

    :param hook: the task's ledger hook
    :param ledger_conn_id: the ``gpupool`` connection (None: ``[gpupool]`` configuration)
    :param ti: the task instance the ``gpupool_deadline`` XCom is pushed on
    :param event: the trigger's ``deadline`` event
    :param fail_fast_on_forecast: as the first deferral had it
    """
    record_unreachable_deadlines(ti, event, log)
    rid = event["reservation_id"]
    return reservation_deferral(
        rid,
        ledger_conn_id,
        max(0.0, hook.get(rid).deadline - time.time()),
        hook.options.poll_interval_seconds,
        fail_fast_on_forecast=fail_fast_on_forecast,
        deadlines=event["deadlines"],
    )
