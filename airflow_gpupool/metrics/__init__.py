"""Prometheus metrics of the GPU ledger, computed from a snapshot on each scrape."""

from __future__ import annotations

from airflow_gpupool.metrics.collector import (
    METRIC_NAMES,
    PREEMPTION_METRIC_NAMES,
    QUOTA_METRIC_NAMES,
    GpuPoolCollector,
    ledger_metrics,
    preemption_metrics,
    quota_metrics,
)
from airflow_gpupool.metrics.drift import DRIFT_METRIC_NAMES, LedgerDriftCollector, drift_metrics
from airflow_gpupool.metrics.forecast import FORECAST_METRIC_NAMES, forecast_metrics

__all__ = [
    "DRIFT_METRIC_NAMES",
    "FORECAST_METRIC_NAMES",
    "METRIC_NAMES",
    "PREEMPTION_METRIC_NAMES",
    "QUOTA_METRIC_NAMES",
    "GpuPoolCollector",
    "LedgerDriftCollector",
    "drift_metrics",
    "forecast_metrics",
    "ledger_metrics",
    "preemption_metrics",
    "quota_metrics",
]
