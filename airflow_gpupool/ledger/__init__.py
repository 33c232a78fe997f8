"""The shared GPU ledger (SQLite embedded, PostgreSQL shared).

This package is the ledger's only door: code outside it imports the names below, never a
room (``airflow_gpupool.ledger.<room>``), so the rooms can move without their callers
noticing. ``pyproject.toml`` ([tool.importlinter]) enforces it; ARCHITECTURE.md maps the rooms.
"""

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
from airflow_gpupool.ledger.grants.attempts import TaskAttempt, TaskAttempts
from airflow_gpupool.ledger.grants.hand_on import HANDED_PREFIX, HandOnResult
from airflow_gpupool.ledger.grants.queue_ahead import QueueAheadResult
from airflow_gpupool.ledger.ledger import InventoryChange, Ledger
from airflow_gpupool.ledger.nodes.agent_report import GpuSample, MigSample, NodeReport, ProcessSample
from airflow_gpupool.ledger.nodes.health import HeartbeatCheck, HeartbeatResult
from airflow_gpupool.ledger.postgres.notify import GrantListener
from airflow_gpupool.ledger.queue.gangs import member_id
from airflow_gpupool.ledger.shared import close_shared, release_shared, shared_ledger
from airflow_gpupool.ledger.store.scalable import LedgerScalablePools, ScalableShape
from airflow_gpupool.ledger.teams.quotas import LedgerQuotas, grant_milli
from airflow_gpupool.ledger.teams.usage import (
    RANGES,
    PreemptionLoss,
    QuotaUse,
    UsageReport,
    preemption_losses,
    quota_uses,
    usage_report,
)
from airflow_gpupool.ledger.views.actions import ACTIONS, ConsoleAction, LedgerActions
from airflow_gpupool.ledger.views.drift import NodeDrift, ledger_drift
from airflow_gpupool.ledger.views.drift_records import DriftRecord, LedgerDriftRecords
from airflow_gpupool.ledger.views.forecasts import (
    FORECAST_STATUSES,
    FinishedRun,
    LedgerForecasts,
    StartForecast,
)
from airflow_gpupool.ledger.views.history import HistoryEntry, HistoryFilter, LedgerHistory
from airflow_gpupool.ledger.views.invariants import FINISHED_PHASES, cluster_violations
from airflow_gpupool.ledger.views.totals import (
    ENDED_STATES,
    WAIT_BUCKETS,
    HeldSpan,
    LedgerTotals,
    WaitHistogram,
    allocation_series,
    held_spans,
    ledger_totals,
)

__all__ = [
    "HANDED_PREFIX",
    "HandOnResult",
    "QueueAheadResult",
    "ACTIONS",
    "ENDED_STATES",
    "FORECAST_STATUSES",
    "FINISHED_PHASES",
    "RANGES",
    "WAIT_BUCKETS",
    "DriftRecord",
    "FinishedRun",
    "Gang",
    "GpuSample",
    "Grant",
    "GrantListener",
    "HeartbeatCheck",
    "HeartbeatResult",
    "HeldSpan",
    "HistoryEntry",
    "HistoryFilter",
    "InventoryChange",
    "Ledger",
    "LedgerDriftRecords",
    "LedgerForecasts",
    "LedgerHistory",
    "LedgerQuotas",
    "LedgerScalablePools",
    "LedgerSnapshot",
    "LedgerTotals",
    "MigSample",
    "NodeDrift",
    "NodeRecord",
    "NodeReport",
    "PreemptionLoss",
    "ProcessSample",
    "QuotaUse",
    "ReapResult",
    "ReleaseResult",
    "Reservation",
    "ReservationState",
    "ScalableShape",
    "StartForecast",
    "TaskAttempt",
    "TaskAttempts",
    "UsageReport",
    "WaitHistogram",
    "ConsoleAction",
    "LedgerActions",
    "allocation_series",
    "close_shared",
    "cluster_violations",
    "grant_milli",
    "held_spans",
    "ledger_drift",
    "ledger_totals",
    "member_id",
    "preemption_losses",
    "quota_uses",
    "release_shared",
    "shared_ledger",
    "usage_report",
]
