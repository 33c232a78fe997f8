"""Read-only aggregates over the ledger's reservations table that snapshots do not carry.

The cumulative counts (:func:`ledger_totals`) are counted from the table rather than kept in
an exporter's memory, so every exporter of one ledger reports the same values and they survive
exporter restarts; they only grow: pruning old history first carries what the pruned rows
counted over (:func:`airflow_gpupool.ledger.views.counts.cumulative_counts`).

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

from airflow_gpupool.ledger.views.counts import ENDED_STATES, WAIT_BUCKETS

__all__ = [
    "ENDED_STATES",
    "WAIT_BUCKETS",
    "HeldSpan",
    "LedgerTotals",
    "WaitHistogram",
    "allocation_series",
    "held_spans",
    "ledger_totals",
]


@dataclass(frozen=True)
class HeldSpan:
    """One grant's hold on GPU compute: from ``start`` to ``end`` (None: still held)."""

    start: float
    end: float | None
    milli: int


@functools.lru_cache(maxsize=8)
def _engine(url: str) -> Engine:
    from airflow_gpupool.ledger.db.engine import make_engine

    return make_engine(url)


def held_spans(url: str, since: float, team: str | None = None) -> list[HeldSpan]:
    """Return every grant that held GPU compute at some time after ``since``.

    :param url: the ledger's SQLAlchemy URL
    :param since: seconds since the epoch
    :param team: only this team's grants (None: every team's)
    """
    from sqlalchemy import or_, select

    from airflow_gpupool.ledger.db import schema
    from airflow_gpupool.ledger.db.engine import read_transaction
    from airflow_gpupool.resources import GpuRequest

    r = schema.reservations.c
    query = select(r.granted_at, r.ended_at, r.request).where(
        r.granted_at.is_not(None), or_(r.ended_at.is_(None), r.ended_at >= since)
    )
    if team is not None:
        query = query.where(r.team == team)
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


@dataclass(frozen=True)
class WaitHistogram:
    """A cumulative histogram of waits: ``buckets[i]`` counts waits ``<= WAIT_BUCKETS[i]``.

    :param buckets: cumulative counts, one per bound of :data:`WAIT_BUCKETS`
    :param count: every wait observed (the ``+Inf`` bucket)
    :param total: the sum of the waits, seconds
    """

    buckets: tuple[int, ...]
    count: int
    total: float


@dataclass(frozen=True)
class LedgerTotals:
    """Counts over every reservation the ledger has kept (pruned ones included): they only grow.

    :param ended: ended reservations by final state (every state of :data:`ENDED_STATES`)
    :param grants: reservations ever granted
    :param preemptions: task tries whose pod was preempted or evicted (failure records)
    :param waited_granted: how long granted reservations waited, observed at their grant
    :param waited_timed_out: how long timed-out reservations waited, observed at their timeout
    """

    ended: dict[str, int]
    grants: int
    preemptions: int
    waited_granted: WaitHistogram
    waited_timed_out: WaitHistogram


def _histogram(counts: dict[str, int], name: str) -> WaitHistogram:
    buckets = tuple(counts[f"wait.{name}.le.{bound:g}"] for bound in WAIT_BUCKETS)
    return WaitHistogram(buckets, counts[f"wait.{name}.count"], counts[f"wait.{name}.sum_ms"] / 1000)


def ledger_totals(url: str) -> LedgerTotals:
    """Return the ledger's cumulative counts, read in one transaction.

    :param url: the ledger's SQLAlchemy URL
    """
    from airflow_gpupool.ledger.db.engine import read_transaction
    from airflow_gpupool.ledger.views.counts import cumulative_counts

    with read_transaction(_engine(url)) as conn:
        counts = cumulative_counts(conn)
    return LedgerTotals(
        {state: counts[f"ended.{state}"] for state in ENDED_STATES},
        counts["grants"],
        counts["preemptions"],
        _histogram(counts, "granted"),
        _histogram(counts, "timed_out"),
    )
