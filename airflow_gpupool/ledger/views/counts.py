"""The ledger's cumulative counts (ends by state, grants, preemptions, waits): the rows kept plus what pruned rows counted.

Pruning old history (:meth:`~airflow_gpupool.ledger.views.history.LedgerHistory.prune`) first
adds what the deleted rows counted to carried-over totals in ``gpupool_meta`` (:func:`carry`),
so the counters :func:`cumulative_counts` reads only grow.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import and_, case, func, insert, or_, select, update

from airflow_gpupool.exceptions import FailureClass
from airflow_gpupool.ledger.db import schema

if TYPE_CHECKING:
    from sqlalchemy import ColumnElement, Connection

__all__ = ["ENDED_STATES", "WAIT_BUCKETS", "carry", "cumulative_counts", "tally"]

ENDED_STATES = ("released", "expired", "timed_out", "cancelled", "preempted")

WAIT_BUCKETS = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 4 * 3600.0)
"""Upper bounds (seconds) of the wait histogram's buckets."""

_CARRIED = "pruned."


def _carried(conn: Connection) -> dict[str, int]:
    m = schema.ledger_meta.c
    rows = conn.execute(select(m.key, m.value).where(m.key.startswith(_CARRIED, autoescape=True)))
    return {key[len(_CARRIED) :]: int(value) for key, value in rows}


def carry(conn: Connection, counts: dict[str, int]) -> None:
    """Add ``counts`` to the carried-over totals kept in ``gpupool_meta``."""
    m = schema.ledger_meta.c
    before = _carried(conn)
    for name, value in counts.items():
        if name in before:
            conn.execute(
                update(schema.ledger_meta).where(m.key == _CARRIED + name).values(value=before[name] + value)
            )
        elif value:
            conn.execute(insert(schema.ledger_meta).values(key=_CARRIED + name, value=value))


def _histogram(conn: Connection, name: str, waited: Any, where: ColumnElement[bool]) -> dict[str, int]:
    """Count waits into the buckets in one aggregate query (sums in milliseconds)."""
    columns = [func.sum(case((waited <= bound, 1), else_=0)) for bound in WAIT_BUCKETS]
    row = conn.execute(
        select(func.count(), func.coalesce(func.sum(waited), 0.0), *columns)
        .select_from(schema.reservations)
        .where(where)
    ).one()
    out = {f"wait.{name}.count": int(row[0]), f"wait.{name}.sum_ms": round(float(row[1]) * 1000)}
    out.update(
        {f"wait.{name}.le.{bound:g}": int(n or 0) for bound, n in zip(WAIT_BUCKETS, row[2:], strict=True)}
    )
    return out


def tally(
    conn: Connection, reservations: ColumnElement[bool], attempts: ColumnElement[bool]
) -> dict[str, int]:
    """Count what the rows matching ``reservations`` and ``attempts`` add to the cumulative metrics."""
    r, a = schema.reservations.c, schema.task_attempts.c
    counts = {f"ended.{s}": 0 for s in ENDED_STATES}
    for state, n in conn.execute(
        select(r.state, func.count()).where(reservations, r.state.in_(ENDED_STATES)).group_by(r.state)
    ):
        counts[f"ended.{state}"] = int(n)
    counts["grants"] = int(
        conn.execute(select(func.count()).where(reservations, r.granted_at.is_not(None))).scalar_one()
    )
    taken = (FailureClass.PREEMPTED.value, FailureClass.EVICTED.value)
    preempted = and_(attempts, a.failure_class.in_(taken))
    counts["preemptions"] = int(conn.execute(select(func.count()).where(preempted)).scalar_one())
    counts.update(
        _histogram(
            conn, "granted", r.granted_at - r.created_at, and_(reservations, r.granted_at.is_not(None))
        )
    )
    counts.update(
        _histogram(conn, "timed_out", r.ended_at - r.created_at, and_(reservations, r.state == "timed_out"))
    )
    return counts


def cumulative_counts(conn: Connection) -> dict[str, int]:
    """Return the ledger's cumulative counts: the rows kept plus what pruned rows counted.

    Keys: ``ended.<state>``, ``grants``, ``preemptions`` and, for ``wait.granted`` and
    ``wait.timed_out``, ``.count``, ``.sum_ms`` and ``.le.<bound>`` per :data:`WAIT_BUCKETS` bound.

    :param conn: an open read transaction
    """
    everything = or_(schema.reservations.c.id.is_not(None))
    counts = tally(conn, everything, schema.task_attempts.c.task_key.is_not(None))
    for name, value in _carried(conn).items():
        counts[name] = counts.get(name, 0) + value
    return counts
