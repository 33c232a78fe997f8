"""The stored quota plan: quotas and headroom read from their rows, cached per process by version.

Whether quotas govern at all is the stamp's ``quota_version`` (:func:`governed`): with none
stored nothing here is read.
"""

from __future__ import annotations

from sqlalchemy import Connection, select

from airflow_gpupool.governance.quotas import Flavor, Headroom, QuotaPlan, TeamQuota
from airflow_gpupool.ledger.db import schema

__all__ = [
    "HEADROOM_EVERY_POOL",
    "QUOTA_VERSION_KEY",
    "PlanCache",
    "governed",
    "read_headroom",
    "read_plan",
    "read_quotas",
]

#: The meta row stamped with the version of the last quota change (0 or absent: no quota stored).
QUOTA_VERSION_KEY = schema.QUOTA_VERSION_KEY
#: The headroom row of every pool without one of its own.
HEADROOM_EVERY_POOL = "*"


def governed(quota_version: int | None) -> bool:
    """Whether quotas are stored, from the stamp's ``quota_version``."""
    return bool(quota_version)


class PlanCache:
    """The stored quotas, read once per process for each ``quota_version``."""

    def __init__(self) -> None:
        self._version: int | None = None
        self._plan = QuotaPlan()

    def plan(self, conn: Connection, version: int) -> QuotaPlan:
        """Return the quotas stored at ``version`` (read only when the version changed)."""
        if version != self._version:
            self._plan, self._version = read_plan(conn), version
        return self._plan


def read_plan(conn: Connection) -> QuotaPlan:
    """Return the stored quotas and headroom."""
    return QuotaPlan(tuple(read_quotas(conn)), read_headroom(conn))


def read_headroom(conn: Connection) -> Headroom:
    """Return the stored headroom (no row: none)."""
    rows = conn.execute(select(schema.headroom).order_by(schema.headroom.c.pool)).all()
    if not rows:
        return Headroom()
    every = next((row for row in rows if row.pool == HEADROOM_EVERY_POOL), rows[0])
    return Headroom(
        every.share_milli if every.pool == HEADROOM_EVERY_POOL else 0,
        tuple((row.pool, row.share_milli) for row in rows if row.pool != HEADROOM_EVERY_POOL),
        bool(every.lend_to_preemptible),
        every.urgent_priority,
    )


def read_quotas(conn: Connection) -> list[TeamQuota]:
    """Return the stored quotas, sorted by team and flavor."""
    q = schema.quotas.c
    rows = conn.execute(select(schema.quotas).order_by(q.team, q.flavor))
    return [
        TeamQuota(
            row.team,
            Flavor.parse(row.flavor),
            row.nominal_milli,
            row.cohort,
            row.borrowing_limit_milli,
            row.lending_limit_milli,
        )
        for row in rows
    ]
