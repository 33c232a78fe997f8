"""Schema v8 (gangs): a v7 ledger migrates, keeps its rows, and its reservations read as singles."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import create_engine, inspect, text

from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db.engine import normalize_url
from airflow_gpupool.ledger.store import migrations
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node


def test_a_v7_ledger_migrates_to_v8_and_keeps_its_rows(
    make_ledger: Callable[..., Ledger], ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:
        m.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:7])
        m.setattr(migrations, "LATEST", 7)
        old = make_ledger(concurrent=False)
        old.upsert_nodes([node("n1", gpus=2)])
        held = old.reserve(GpuRequest(gpus=1), "from-v7", reservation_id="gp-old")
        old.close()
    # v1 creates the table as the code has it now: take the v8 columns away for a true v7 table.
    engine = create_engine(normalize_url(ledger_url))
    with engine.begin() as conn:
        conn.execute(text(f"DROP INDEX IF EXISTS {migrations._V8_INDEX}"))
        for column in migrations._V8_COLUMNS:
            conn.execute(text(f"ALTER TABLE gpupool_reservations DROP COLUMN {column}"))

    ledger = Ledger(ledger_url)
    assert ledger.migrate() == list(range(8, migrations.LATEST + 1))
    assert ledger.migrate() == []
    with engine.connect() as conn:
        columns = {c["name"] for c in inspect(conn).get_columns("gpupool_reservations")}
        indexes = {i["name"] for i in inspect(conn).get_indexes("gpupool_reservations")}
    engine.dispose()
    assert {"gang_id", "gang_index"} <= columns and migrations._V8_INDEX in indexes
    kept = ledger.get("gp-old")
    assert kept.holder == "from-v7" and kept.state is ReservationState.GRANTED
    assert kept.grant is not None and held.grant is not None and kept.grant.node == held.grant.node
    assert (kept.gang_id, kept.gang_index) == (None, None)
    assert kept.to_dict()["gang_id"] is None
    assert ledger.release("gp-old").released
    assert ledger.check_invariants() == []
    ledger.close()
