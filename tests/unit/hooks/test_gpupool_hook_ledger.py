"""GpuPoolHook: what the operator asks of the ledger, and one option resolution for sync and async."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from airflow_gpupool.exceptions import ConfigurationError
from airflow_gpupool.hooks import AsyncGpuPoolHook, GpuPoolHook
from airflow_gpupool.ledger import Ledger, TaskAttempt
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node


def test_the_hook_offers_what_the_operator_needs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    Ledger.create(url).upsert_nodes([node("n1", gpus=1)])
    hook = GpuPoolHook(None, ledger_url=url)
    hook.reserve(GpuRequest(gpus=1), "blocker", reservation_id="gp-a")
    waiting = hook.reserve(GpuRequest(gpus=1), "waiter", reservation_id="gp-b")

    assert hook.explain(waiting.id) == hook.ledger.explain(waiting.id)
    assert [n.name for n in hook.empty_cluster().nodes] == ["n1"]
    attempt = TaskAttempt("d/t/r/map--1", 1, "gp-a", "preempted", "retry", GpuRequest(gpus=1), "Evicted")
    hook.record_attempt(attempt)
    assert [a.reservation_id for a in hook.attempt_history("d/t/r/map--1")] == ["gp-a"]
    assert hook.claim_escalation("d/t/r/map--1", 1) is True
    assert hook.claim_escalation("d/t/r/map--1", 1) is False
    hook.close()


def test_async_resolution_is_the_sync_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_POOL_EU",
        '{"conn_type": "gpupool", "extra": {"ledger_url": "sqlite:////tmp/eu.db", "binding": "hami"}}',
    )
    hook = AsyncGpuPoolHook("pool_eu", lease_ttl_seconds=90)
    assert asyncio.run(hook.aoptions()) == GpuPoolHook("pool_eu", lease_ttl_seconds=90).options
    with pytest.raises(ConfigurationError, match="connection 'does_not_exist' not found"):
        asyncio.run(AsyncGpuPoolHook("does_not_exist").aoptions())
