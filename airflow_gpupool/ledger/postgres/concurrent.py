"""Calls into the PostgreSQL functions of the concurrent path (:mod:`~airflow_gpupool.ledger.postgres.functions`).

Each call is its own transaction on an autocommit connection: one round trip, and the
shared lock it takes is held only until that call commits. The calls run on the
driver's cursor with a server-side prepared statement: at hundreds of calls a second,
SQLAlchemy's statement handling would cost as much as the call itself. Errors are
wrapped as SQLAlchemy's, and a lost connection is invalidated, so callers and
:func:`~airflow_gpupool.ledger.db.engine.transient_retry` see what they see elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from sqlalchemy import Connection, event
from sqlalchemy.exc import DBAPIError

from airflow_gpupool import settings
from airflow_gpupool.ledger.db.engine import make_engine
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import MILLI_PER_GPU, GpuRequest

_TAKE = (
    "SELECT outcome, taken_indices, taken_slice, taken_at FROM gpupool_take("
    "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_WAIT = (
    "SELECT outcome, queued_at, queued_seq, ahead FROM gpupool_wait("
    "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_GIVE_BACK = (
    "SELECT outcome, released_request, released_node, released_indices, released_milli, released_gmem,"
    " released_slice, node_training, node_inference, handed_to, handed_request, handed_indices, handed_gmem"
    " FROM gpupool_give_back(%s, %s, %s)"
)


@dataclass(frozen=True)
class GivenBack:
    """A grant the concurrent path ended: what it held, and the classes left on its node."""

    request: GpuRequest
    assignment: Assignment
    node_training: int
    node_inference: int
    #: The queue's first request, granted the node the release emptied (:mod:`~airflow_gpupool.ledger.queue.hand_over`), and what it took.
    handed_to: tuple[str, GpuRequest, Assignment] | None = None


class ConcurrentPath:
    """Grants and releases that commit without waiting for each other (PostgreSQL only).

    :param synchronous_commit: False commits without waiting for the WAL flush, as
        ``[gpupool] synchronous_commit`` does for the serialized path
    """

    def __init__(self, url: str, synchronous_commit: bool = True, pool_size: int | None = None) -> None:
        # An engine of its own: its connections stay in autocommit instead of switching per call.
        self._engine = make_engine(url, pool_size=pool_size, isolation_level="AUTOCOMMIT")
        # A transaction pooler keeps neither prepared statements nor session settings: each call
        # is then parsed again, and runs with the server's synchronous_commit.
        self._prepare = not settings.transaction_pooling()
        if not synchronous_commit and self._prepare:

            @event.listens_for(self._engine, "connect")
            def _asynchronous_commit(dbapi_conn: Any, _record: Any) -> None:
                dbapi_conn.execute("SET synchronous_commit = off")

    def close(self) -> None:
        """Close the connections."""
        self._engine.dispose()

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A pooled connection in autocommit mode."""
        with self._engine.connect() as conn:
            yield conn

    def take(
        self,
        conn: Connection,
        reservation_id: str,
        holder: str,
        request: GpuRequest,
        assignment: Assignment,
        gpu_model: str | None,
        generation: int,
        now: float | None,
        ttl: float,
        timeout: float,
    ) -> tuple[str, Assignment | None, float]:
        """Record ``assignment`` as a grant if its node still has room for it.

        :param gpu_model: the model of the GPUs chosen; if a concurrent grant took them, the
            grant takes as many other GPUs of that model on the node (or another MIG slice
            of the profile)
        :returns: ``("granted", what was taken)``; ``("stale", None)``: the node no longer
            fits, place again; ``("serialize", None)``: nothing changed, take the exclusive
            path (the queue is not empty, a lease is overdue, the inventory is no longer at
            ``generation``, or the id exists)
        """
        outcome, indices, mig_slice, taken_at = _call(
            self._prepare,
            conn,
            _TAKE,
            (
                *_request_row(reservation_id, holder, request, now, timeout, ttl, generation),
                assignment.node,
                request.cpu_milli,
                request.memory_mib,
                list(assignment.gpu_indices),
                gpu_model,
                assignment.milli_per_gpu,
                assignment.gpu_memory_mib,
                assignment.mig_slice,
                request.mig_profile,
            ),
        )
        if outcome != "granted":
            return str(outcome), None, float(taken_at)
        return (
            "granted",
            replace(assignment, gpu_indices=tuple(indices), mig_slice=mig_slice),
            float(taken_at),
        )

    def wait(
        self,
        conn: Connection,
        reservation_id: str,
        holder: str,
        request: GpuRequest,
        generation: int,
        now: float | None,
        ttl: float,
        timeout: float,
    ) -> tuple[float, int] | None:
        """Queue ``request``, which fits no node, where the queue gate stays as it is (whole GPUs or a fraction).

        :returns: when it was queued and how many waiting requests the queue serves before it;
            None: nothing changed, take the exclusive path (the gate would change, a node may fit
            it, a victim may exist, a lease is overdue, the inventory is no longer at
            ``generation``, or the id exists)
        """
        whole = request.gpu_milli is None
        outcome, queued_at, _seq, ahead = _call(
            self._prepare,
            conn,
            _WAIT,
            (
                *_request_row(reservation_id, holder, request, now, timeout, ttl, generation),
                request.gpus if whole else 0,
                None if whole else request.gpu_milli,
                request.preempts,
            ),
        )
        if outcome != "waiting":
            return None
        return float(queued_at), int(ahead)

    def give_back(
        self, conn: Connection, reservation_id: str, now: float | None, message: str
    ) -> GivenBack | None:
        """End a grant and return its capacity, or hand an emptied node to the queue's first request;
        None: nothing changed, take the exclusive path.

        :param now: the injected clock's time; None: the database's clock, read in the call
        """
        row = _call(self._prepare, conn, _GIVE_BACK, (reservation_id, now, message))
        if row[0] != "released":
            return None
        _, request, node, indices, milli, gmem, mig_slice, training, inference, *handed = row
        assignment = Assignment(node, tuple(json.loads(indices or "[]")), milli or 0, gmem or 0, mig_slice)
        given = GivenBack(GpuRequest.from_dict(json.loads(request)), assignment, training, inference)
        handed_to, handed_request, handed_indices, handed_gmem = handed
        if handed_to is None:
            return given
        taken = Assignment(node, tuple(json.loads(handed_indices)), MILLI_PER_GPU, handed_gmem)
        return replace(given, handed_to=(handed_to, GpuRequest.from_dict(json.loads(handed_request)), taken))


def _request_row(
    reservation_id: str,
    holder: str,
    request: GpuRequest,
    now: float | None,
    timeout: float,
    ttl: float,
    generation: int,
) -> tuple[Any, ...]:
    """The arguments ``gpupool_take`` and ``gpupool_wait`` begin with: the request's row, the clock, the inventory."""
    text = json.dumps(request.to_dict(), sort_keys=True)
    row = (reservation_id, holder, text, request.priority, request.team, request.workload_class.value)
    return (*row, now, timeout, ttl, generation)


def _call(prepare: bool, conn: Connection, statement: str, params: tuple[Any, ...]) -> tuple[Any, ...]:
    """Run ``statement`` on the driver's cursor (prepared on the server if ``prepare``); return its one row."""
    dbapi: psycopg.Connection[Any] = conn.connection.driver_connection  # type: ignore[assignment]
    try:
        with dbapi.cursor() as cursor:
            cursor.execute(statement, params, prepare=prepare)
            row = cursor.fetchone()
    except psycopg.Error as error:
        lost = conn.dialect.is_disconnect(error, dbapi, None)  # type: ignore[arg-type]
        if lost:
            conn.invalidate(error)
        raise DBAPIError.instance(
            statement, params, error, psycopg.Error, connection_invalidated=lost, dialect=conn.dialect
        ) from error
    assert row is not None
    return tuple(row)
