"""Read-only aggregates over the ledger's reservations table that snapshots do not carry.

:class:`~airflow_gpupool.ledger.Ledger` returns live reservations and a bounded history;
metrics and the UI chart need counts over every ended reservation and the times slices
were held, so these few queries read the table directly, in one read transaction each.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Engine

ENDED_STATES = ("released", "expired", "timed_out", "cancelled")


@dataclass(frozen=True)
class HeldSpan:
    """One grant's hold on GPU compute: from ``start`` to ``end`` (None: still held)."""

    start: float
    end: float | None
    milli: int


@functools.lru_cache(maxsize=8)
def _engine(url: str) -> Engine:
    from airflow_gpupool.ledger.engine import make_engine

    return make_engine(url)


def reservation_counts(url: str) -> dict[str, int]:
    """Return the number of reservations in each ended state (every state present, 0 when none).

    :param url: the ledger's SQLAlchemy URL
    """
    from sqlalchemy import func, select

    from airflow_gpupool.ledger import schema
    from airflow_gpupool.ledger.engine import read_transaction

    r = schema.reservations.c
    query = select(r.state, func.count()).where(r.state.in_(ENDED_STATES)).group_by(r.state)
    counts = dict.fromkeys(ENDED_STATES, 0)
    with read_transaction(_engine(url)) as conn:
        for state, count in conn.execute(query):
            counts[state] = int(count)
    return counts


def held_spans(url: str, since: float) -> list[HeldSpan]:
    """Return every grant that held GPU compute at some time after ``since``.

    :param url: the ledger's SQLAlchemy URL
    :param since: seconds since the epoch
    """
    from sqlalchemy import or_, select

    from airflow_gpupool.ledger import schema
    from airflow_gpupool.ledger.engine import read_transaction
    from airflow_gpupool.resources import GpuRequest

    r = schema.reservations.c
    query = select(r.granted_at, r.ended_at, r.request).where(
        r.granted_at.is_not(None), or_(r.ended_at.is_(None), r.ended_at >= since)
    )
    with read_transaction(_engine(url)) as conn:
        rows = conn.execute(query).all()
    return [
        HeldSpan(row.granted_at, row.ended_at, GpuRequest.from_dict(json.loads(row.request)).total_gpu_milli)
        for row in rows
    ]


def allocation_series(
    spans: Sequence[HeldSpan], capacity_milli: int, since: float, until: float
) -> list[tuple[float, float]]:
    """Return the allocation (0–1) as a step series of ``(time, value)`` points over ``[since, until]``.

    :param spans: what :func:`held_spans` returned
    :param capacity_milli: the cluster's GPU capacity (today's; history of inventory is not kept)
    :param since: first time of the series
    :param until: last time of the series
    """
    if capacity_milli <= 0:
        return [(since, 0.0), (until, 0.0)]
    level = sum(s.milli for s in spans if s.start <= since and (s.end is None or s.end > since))
    events: list[tuple[float, int]] = []
    for s in spans:
        if since < s.start <= until:
            events.append((s.start, s.milli))
        if s.end is not None and since < s.end <= until and s.start <= s.end:
            events.append((s.end, -s.milli))
    points = [(since, level / capacity_milli)]
    for at, delta in sorted(events):
        points.append((at, level / capacity_milli))
        level += delta
        points.append((at, level / capacity_milli))
    points.append((until, level / capacity_milli))
    return points
