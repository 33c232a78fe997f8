"""Hooks: connection resolution and ledger access for operators and triggers."""

from __future__ import annotations

from airflow_gpupool.hooks.gpupool import AsyncGpuPoolHook, GpuPoolHook
from airflow_gpupool.hooks.options import LedgerOptions

__all__ = ["AsyncGpuPoolHook", "GpuPoolHook", "LedgerOptions"]
