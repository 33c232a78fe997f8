"""Keep what pruned reservations counted towards the cumulative metrics, as totals in ``gpupool_meta``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import insert, select, update

from airflow_gpupool.ledger.db import schema

if TYPE_CHECKING:
    from sqlalchemy import Connection

# Underscored: only the history (its prune and cumulative counts) uses them, nothing outside the views.
__all__ = ["_carried", "_carry"]

_CARRIED = "pruned."


def _carried(conn: Connection) -> dict[str, int]:
    m = schema.ledger_meta.c
    rows = conn.execute(select(m.key, m.value).where(m.key.startswith(_CARRIED, autoescape=True)))
    return {key[len(_CARRIED) :]: int(value) for key, value in rows}


def _carry(conn: Connection, counts: dict[str, int]) -> None:
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
