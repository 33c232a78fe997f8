"""Calls into the PostgreSQL functions of the concurrent path (:mod:`.pg_functions`).

Each call is its own transaction on an autocommit connection: one round trip, and the
shared lock it takes is held only until that call commits.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from sqlalchemy import Connection, text

from airflow_gpupool.ledger.engine import make_engine
from airflow_gpupool.placement.verdict import Assignment
from airflow_gpupool.resources import GpuRequest

_TAKE = text(
    "SELECT outcome, taken_indices, taken_slice FROM gpupool_take(:id, :holder, :request, :priority, :team,"
    " :class, :now, :deadline, :ttl, :generation, :node, :cpu, :mem, :indices, :model, :milli, :gmem,"
    " :slice, :profile)"
)
_GIVE_BACK = text("SELECT gpupool_give_back(:id, :now, :message)")


class ConcurrentPath:
    """Grants and releases that commit without waiting for each other (PostgreSQL only)."""

    def __init__(self, url: str) -> None:
        # An engine of its own: its connections stay in autocommit instead of switching per call.
        self._engine = make_engine(url, isolation_level="AUTOCOMMIT")

    def close(self) -> None:
        """Close the connections."""
        self._engine.dispose()

    @contextmanager
    def connect(self) -> Iterator[Connection]:
        """A pooled connection in autocommit mode."""
        with self._engine.connect() as conn:
            yield conn

    @staticmethod
    def take(
        conn: Connection,
        reservation_id: str,
        holder: str,
        request: GpuRequest,
        assignment: Assignment,
        gpu_model: str | None,
        generation: int,
        now: float,
        ttl: float,
        deadline: float,
    ) -> tuple[str, Assignment | None]:
        """Record ``assignment`` as a grant if its node still has room for it.

        :param gpu_model: the model of the GPUs chosen; if a concurrent grant took them, the
            grant takes as many other GPUs of that model on the node (or another MIG slice
            of the profile)
        :returns: ``("granted", what was taken)``; ``("stale", None)``: the node no longer
            fits, place again; ``("serialize", None)``: nothing changed, take the exclusive
            path (the queue is not empty, a lease is overdue, the inventory is no longer at
            ``generation``, or the id exists)
        """
        row = conn.execute(
            _TAKE,
            {
                "id": reservation_id,
                "holder": holder,
                "request": json.dumps(request.to_dict(), sort_keys=True),
                "priority": request.priority,
                "team": request.team,
                "class": request.workload_class.value,
                "now": now,
                "deadline": deadline,
                "ttl": ttl,
                "generation": generation,
                "node": assignment.node,
                "cpu": request.cpu_milli,
                "mem": request.memory_mib,
                "indices": list(assignment.gpu_indices),
                "model": gpu_model,
                "milli": assignment.milli_per_gpu,
                "gmem": assignment.gpu_memory_mib,
                "slice": assignment.mig_slice,
                "profile": request.mig_profile,
            },
        ).one()
        if row.outcome != "granted":
            return str(row.outcome), None
        taken = replace(assignment, gpu_indices=tuple(row.taken_indices), mig_slice=row.taken_slice)
        return "granted", taken

    @staticmethod
    def give_back(conn: Connection, reservation_id: str, now: float, message: str) -> str:
        """End a grant and return its capacity: ``released``, or ``serialize`` (nothing changed)."""
        return str(
            conn.execute(_GIVE_BACK, {"id": reservation_id, "now": now, "message": message}).scalar_one()
        )
