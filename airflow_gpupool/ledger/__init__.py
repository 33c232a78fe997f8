"""The shared GPU ledger (SQLite embedded, PostgreSQL shared)."""

from __future__ import annotations

from airflow_gpupool.ledger.db.models import (
    Gang,
    Grant,
    LedgerSnapshot,
    NodeRecord,
    ReapResult,
    ReleaseResult,
    Reservation,
    ReservationState,
)
from airflow_gpupool.ledger.ledger import InventoryChange, Ledger

__all__ = [
    "Gang",
    "Grant",
    "InventoryChange",
    "Ledger",
    "LedgerSnapshot",
    "NodeRecord",
    "ReapResult",
    "ReleaseResult",
    "Reservation",
    "ReservationState",
]
