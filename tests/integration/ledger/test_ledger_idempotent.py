"""Idempotent everywhere: a lost commit reply, and many first-time `gpupool ledger init` at once.

A reply lost after the commit is simulated at the driver boundary: the commit (or the
concurrent path's one-statement transaction) succeeds, then the call raises a lost
connection, as a server that dies between its commit and its answer does.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine, func, select

from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db import schema as ledger_schema
from airflow_gpupool.ledger.db.engine import normalize_url
from airflow_gpupool.ledger.store.migrations import MIGRATIONS
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node

PROCESSES = 8


def _lost_after(commit: Any, lost: BaseException, calls: list[int]) -> Any:
    """``commit`` that, the first time, commits and then raises ``lost`` instead of returning."""

    def commit_then_lose(dbapi_conn: Any) -> None:
        commit(dbapi_conn)
        calls.append(1)
        if len(calls) == 1:
            raise lost

    return commit_then_lose


def _lost_connection(dialect: str) -> BaseException:
    if dialect == "postgresql":
        return psycopg.OperationalError("server closed the connection unexpectedly")
    return sqlite3.ProgrammingError("Cannot operate on a closed database.")


def test_an_id_less_reserve_whose_commit_reply_is_lost_finds_its_own_grant(
    ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Ledger.create(ledger_url, policy="bestfit", concurrent=False) as ledger:
        ledger.upsert_nodes([node("n1", gpus=2)])
        dialect = ledger._store.engine.dialect
        calls: list[int] = []
        monkeypatch.setattr(
            dialect, "do_commit", _lost_after(dialect.do_commit, _lost_connection(ledger.dialect), calls)
        )

        reservation = ledger.reserve(GpuRequest(gpus=1), "lost-reply", ttl=600)

        assert len(calls) >= 2, "the first commit's reply was lost and the reserve ran again"
        assert reservation.state is ReservationState.GRANTED
        history = ledger.history()
        assert [r.id for r in history] == [reservation.id]  # one grant, the one returned
        assert history[0].grant == reservation.grant
        assert ledger.check_invariants() == []


@pytest.mark.postgres
def test_a_concurrent_path_grant_whose_reply_is_lost_is_found_by_its_retry(
    pg_schema_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Ledger.create(pg_schema_url, policy="bestfit") as ledger:
        ledger.upsert_nodes([node("n1", gpus=2)])
        execute = psycopg.Cursor.execute
        lost: list[str] = []

        def execute_then_lose(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            result = execute(cursor, query, *args, **kwargs)
            if isinstance(query, str) and "gpupool_take(" in query and not lost:
                outcome = cursor.fetchone()
                cursor.scroll(0, mode="absolute")  # the caller reads the row as if untouched
                if outcome is not None and outcome[0] == "granted":
                    lost.append(query)  # the grant is committed (autocommit): only its answer is lost
                    raise psycopg.OperationalError("server closed the connection unexpectedly")
            return result

        # The first grant after an inventory change takes the serialized path: warm up.
        ledger.release(ledger.reserve(GpuRequest(gpus=1), "warm-up", ttl=600).id)
        monkeypatch.setattr(psycopg.Cursor, "execute", execute_then_lose)
        reservation = ledger.reserve(GpuRequest(gpus=1), "lost-reply", ttl=600)

        assert lost, "the concurrent path's grant was taken and its answer lost"
        assert reservation.state is ReservationState.GRANTED
        history = ledger.history(states=[ReservationState.GRANTED])
        assert [r.id for r in history] == [reservation.id]
        assert ledger.check_invariants() == []


def _gpupool(*argv: str) -> list[str]:
    return [sys.executable, "-m", "airflow_gpupool.cli", *argv]


def test_many_first_time_ledger_inits_at_once_all_succeed(ledger_url: str) -> None:
    children = [
        subprocess.Popen(
            _gpupool("ledger", "init", "--url", ledger_url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "GPUPOOL_LEDGER_URL": ""},
        )
        for _ in range(PROCESSES)
    ]
    results = [(child.wait(timeout=120), *child.communicate()) for child in children]
    assert [(code, err) for code, _, err in results if code != 0] == []
    outs = [out for _, out, _ in results]
    assert sum("applied schema" in out for out in outs) >= 1
    assert all("applied schema" in out or "already up to date" in out for out in outs), outs

    engine = create_engine(normalize_url(ledger_url))
    try:
        with engine.connect() as conn:
            versions = conn.execute(select(ledger_schema.schema_version.c.version)).scalars().all()
            meta = conn.execute(select(func.count()).select_from(ledger_schema.ledger_meta)).scalar()
    finally:
        engine.dispose()
    assert sorted(versions) == [m.version for m in MIGRATIONS]  # each migration ran exactly once
    assert meta == 2
    with Ledger(ledger_url, policy="bestfit") as ledger:
        ledger.upsert_nodes([node("n1", gpus=1)])
        assert ledger.reserve(GpuRequest(gpus=1), "after-init").state is ReservationState.GRANTED
