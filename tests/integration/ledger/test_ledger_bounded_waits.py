"""A frozen client never holds the others up for long: bounded lock waits on both backends.

A real process takes the ledger's write lock through the ledger's own API and is then
stopped (SIGSTOP) inside its transaction. Another client's reserve must fail with
:class:`LedgerBusyError` within the configured lock timeout, and, on PostgreSQL, proceed
once the server has ended the frozen session (``idle_in_transaction_session_timeout``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine

from airflow_gpupool.exceptions import GpuPoolError, LedgerBusyError
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db.engine import normalize_url
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node

LOCK_TIMEOUT_S = 1.0
IDLE_TIMEOUT_S = 3.0

# The child takes the write lock, writes, says so, and waits inside its transaction.
FROZEN_WRITER = textwrap.dedent(
    """
    import sys, time
    from airflow_gpupool.ledger import Ledger

    ledger = Ledger(sys.argv[1], policy="bestfit", max_overtakes=4)

    def hold(tx):
        tx.conn.exec_driver_sql("SELECT 1")
        print("locked", flush=True)
        time.sleep(120)

    ledger.write(hold)
    """
)


@pytest.fixture
def small_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__GPUPOOL__LOCK_TIMEOUT_SECONDS", str(LOCK_TIMEOUT_S))
    monkeypatch.setenv("AIRFLOW__GPUPOOL__IDLE_IN_TRANSACTION_TIMEOUT_SECONDS", str(IDLE_TIMEOUT_S))
    monkeypatch.setenv("AIRFLOW__GPUPOOL__LEDGER_RETRY_SECONDS", "5")


def assert_locked(stdout: Any) -> None:
    """Wait for the child's "locked"; lines before it are logs (Airflow, imported, logs to stdout)."""
    lines = [stdout.readline().strip()]
    while lines[-1] != "locked" and lines[-1] and len(lines) < 50:
        lines.append(stdout.readline().strip())
    assert lines[-1] == "locked", lines


@pytest.fixture
def frozen_writer(
    ledger_url: str, small_bounds: None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[subprocess.Popen[str]]:
    """A process stopped while it holds the ledger's write lock; killed afterwards.

    Its session outlives the test's waits: the server does not end it meanwhile.
    """
    monkeypatch.setenv("AIRFLOW__GPUPOOL__IDLE_IN_TRANSACTION_TIMEOUT_SECONDS", "60")
    Ledger.create(ledger_url, policy="bestfit").close()
    child = subprocess.Popen(
        [sys.executable, "-c", FROZEN_WRITER, ledger_url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert_locked(child.stdout)
        os.kill(child.pid, signal.SIGSTOP)
        yield child
    finally:
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait(timeout=30)


def test_a_writer_behind_a_frozen_one_gets_ledger_busy_within_the_lock_timeout(
    ledger_url: str, frozen_writer: subprocess.Popen[str]
) -> None:
    with Ledger(ledger_url, policy="bestfit") as ledger:
        started = time.monotonic()
        with pytest.raises(LedgerBusyError) as caught:
            ledger.upsert_nodes([node("n1", gpus=2)])
        waited = time.monotonic() - started
        with pytest.raises(LedgerBusyError):
            ledger.reap()
    assert isinstance(caught.value, GpuPoolError)
    assert LOCK_TIMEOUT_S * 0.9 <= waited < LOCK_TIMEOUT_S + 2.0
    assert caught.value.seconds == LOCK_TIMEOUT_S
    assert "lock_timeout_seconds" in str(caught.value)
    if ledger.dialect == "postgresql":
        # The holder is named: the frozen process's application name carries its pid.
        assert caught.value.holder is not None
        assert f"pid {frozen_writer.pid}" in caught.value.holder
    else:
        assert caught.value.holder is None
        assert "held by unknown" in str(caught.value)


def test_on_postgresql_the_server_ends_the_frozen_session_and_others_proceed(
    pg_schema_url: str, small_bounds: None
) -> None:
    Ledger.create(pg_schema_url, policy="bestfit").close()
    with Ledger(pg_schema_url, policy="bestfit") as ledger:
        ledger.upsert_nodes([node("n1", gpus=2)])
    child = subprocess.Popen(
        [sys.executable, "-c", FROZEN_WRITER, pg_schema_url], stdout=subprocess.PIPE, text=True
    )
    admin = create_engine(normalize_url(pg_schema_url))
    try:
        assert child.stdout is not None
        assert_locked(child.stdout)
        os.kill(child.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        with Ledger(pg_schema_url, policy="bestfit") as ledger:
            granted = None
            while granted is None:
                assert time.monotonic() - frozen_at < IDLE_TIMEOUT_S + 4 * LOCK_TIMEOUT_S + 5
                try:
                    granted = ledger.reserve(GpuRequest(gpus=1), "patient", ttl=60)
                except LedgerBusyError:
                    continue  # each try waited the lock timeout: no sleep needed
            assert granted.state is ReservationState.GRANTED
            # Held up by about the idle timeout, not for as long as the frozen client sleeps.
            assert time.monotonic() - frozen_at < IDLE_TIMEOUT_S + 2 * LOCK_TIMEOUT_S + 3
            assert ledger.check_invariants() == []
        with admin.connect() as conn:
            alive = conn.exec_driver_sql(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %(name)s",
                {"name": f"%pid {child.pid}"},
            ).scalar()
        assert alive == 0, "the server ended the frozen client's session"
    finally:
        admin.dispose()
        os.kill(child.pid, signal.SIGCONT)
        child.kill()
        child.wait(timeout=30)


# The child takes the migration lock, says so, holds it for argv[2] seconds, and lets go.
MIGRATING_CHILD = textwrap.dedent(
    """
    import sys, time
    from airflow_gpupool.ledger.db.engine import make_engine
    from airflow_gpupool.ledger.store.upgrade import _migration_transaction

    with _migration_transaction(make_engine(sys.argv[1])) as conn:
        conn.exec_driver_sql("SELECT 1")
        print("locked", flush=True)
        time.sleep(float(sys.argv[2]))
    """
)


def test_an_init_waits_out_another_processs_migration_past_the_writers_lock_timeout(
    ledger_url: str, small_bounds: None
) -> None:
    hold_s = 2.5 * LOCK_TIMEOUT_S  # past the writers' bound, inside the server's idle one
    child = subprocess.Popen(
        [sys.executable, "-c", MIGRATING_CHILD, ledger_url, str(hold_s)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        assert_locked(child.stdout)
        started = time.monotonic()
        with Ledger.create(ledger_url, policy="bestfit") as ledger:  # migrates behind the child
            waited = time.monotonic() - started
            assert ledger.check_invariants() == []
            if ledger.dialect == "sqlite":
                # The pooled connection is back to the writers' bound for the next transaction.
                with ledger._store.engine.connect() as conn:
                    assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == LOCK_TIMEOUT_S * 1000
        assert waited > LOCK_TIMEOUT_S * 1.5, "the child held the lock: the init waited for it"
        assert child.wait(timeout=30) == 0
    finally:
        child.kill()
        child.wait(timeout=30)
