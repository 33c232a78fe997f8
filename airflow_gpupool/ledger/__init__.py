"""The shared GPU ledger (SQLite embedded, PostgreSQL shared)."""

from __future__ import annotations

from airflow_gpupool.ledger.ledger import InventoryChange, Ledger
from airflow_gpupool.ledger.models import (
    Gang,
    Grant,
    LedgerSnapshot,
    NodeRecord,
    ReapResult,
    ReleaseResult,
    Reservation,
    ReservationState,
)

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
