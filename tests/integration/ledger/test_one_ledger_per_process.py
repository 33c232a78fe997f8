"""One ledger per process: hooks and triggers share it, and its connections stay within the budget."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import psycopg
import pytest

from airflow_gpupool.hooks.gpupool import GpuPoolHook
from airflow_gpupool.ledger import Ledger
from airflow_gpupool.ledger.db.engine import ConnectionBudget
from airflow_gpupool.ledger.postgres.notify import libpq_url
from airflow_gpupool.resources import GpuRequest
from airflow_gpupool.triggers import ReservationTrigger
from tests.ledger_fixtures import node


@pytest.mark.parametrize(
    ("total", "postgresql", "concurrent", "pooled", "expected"),
    [
        (1, True, True, False, ConnectionBudget(1, 0, 0)),
        (2, True, True, False, ConnectionBudget(1, 1, 0)),
        (4, True, True, False, ConnectionBudget(2, 1, 1)),
        (4, True, False, False, ConnectionBudget(3, 0, 1)),
        (4, True, True, True, ConnectionBudget(2, 2, 0)),  # nothing can LISTEN through a pooler
        (4, False, True, False, ConnectionBudget(4, 0, 0)),
    ],
)
def test_the_budget_splits_the_connections(
    total: int, postgresql: bool, concurrent: bool, pooled: bool, expected: ConnectionBudget
) -> None:
    budget = ConnectionBudget.split(total, postgresql=postgresql, concurrent=concurrent, pooled=pooled)
    assert budget == expected and budget.total == total


def test_hooks_of_a_process_share_one_ledger(ledger_url: str) -> None:
    Ledger.create(ledger_url).upsert_nodes([node("n1", gpus=1)])
    first, second = GpuPoolHook(None, ledger_url=ledger_url), GpuPoolHook(None, ledger_url=ledger_url)
    assert first.ledger is second.ledger
    first.close()
    assert second.ledger.snapshot().nodes[0].name == "n1", "one user leaving does not close it for the others"
    second.close()
    third = GpuPoolHook(None, ledger_url=ledger_url)
    assert third.ledger.snapshot().nodes[0].name == "n1", "reopened after the last user left"
    third.close()


def _ours(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s",
        (f"gpupool % pid {os.getpid()}",),
    ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("triggers", [1_000, pytest.param(10_000, marks=pytest.mark.slow)])
def test_thousands_of_triggers_use_at_most_the_budget(
    pg_schema_url: str, monkeypatch: pytest.MonkeyPatch, triggers: int
) -> None:
    budget = 3
    monkeypatch.setenv("AIRFLOW__GPUPOOL__MAX_CONNECTIONS_PER_PROCESS", str(budget))
    # The releasing client is another application (as another worker would be).
    releaser_url = f"{pg_schema_url}&application_name=releaser"
    releaser = Ledger.create(releaser_url, policy="bestfit")
    releaser.upsert_nodes([node("n1", gpus=4)])
    held = [releaser.reserve(GpuRequest(gpus=1), f"holder-{i}").id for i in range(4)]
    waiting = [releaser.reserve(GpuRequest(gpus=1), f"waiter-{i}", timeout=600).id for i in range(4)]
    admin = psycopg.connect(libpq_url(pg_schema_url), autocommit=True, application_name="sampler")
    # Sessions of this process opened before (other tests' ledgers) are not the triggers'.
    before = _ours(admin)
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _ours(admin) - before)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)

    async def scenario() -> list[str]:
        # Several triggers per request: a triggerer may run two copies of one trigger, and it
        # keeps the number of reservations needed to reach 10,000 triggers small.
        runs = [
            asyncio.create_task(_status(ReservationTrigger(waiting[i % 4], None, ledger_url=pg_schema_url)))
            for i in range(triggers)
        ]
        await asyncio.sleep(2)
        for rid in held:
            await asyncio.to_thread(releaser.release, rid)
        return list(await asyncio.wait_for(asyncio.gather(*runs), 240))

    sampler.start()
    try:
        statuses = asyncio.run(scenario())
    finally:
        stop.set()
        sampler.join()
        admin.close()
        releaser.close()
    assert statuses == ["granted"] * triggers
    assert 1 <= peak[0] <= budget, f"{peak[0]} connections for {triggers} triggers, budget {budget}"


async def _status(trigger: ReservationTrigger) -> str:
    async for fired in trigger.run():
        return str(fired.payload["status"])
    raise AssertionError("the trigger yielded nothing")
