"""Schema v10: a v9 ledger's nodes are labelled spot or on-demand, so on-demand requests fit them."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from sqlalchemy import create_engine, select, update

from airflow_gpupool.labels import CAPACITY_TYPE_LABEL
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db.engine import normalize_url
from airflow_gpupool.ledger.store import migrations
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node


def test_a_v9_ledgers_nodes_are_labelled_once_migrated(
    make_ledger: Callable[..., Ledger], ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as m:
        m.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:9])
        m.setattr(migrations, "LATEST", 9)
        old = make_ledger(concurrent=False)
        old.upsert_nodes(
            [
                node("od", gpus=1, labels={"zone": "a"}),
                node("karpenter", gpus=1, labels={"karpenter.sh/capacity-type": "spot"}),
                node("cheap", gpus=1, pool="cheap"),
            ]
        )
        old.close()
    # A v9 ledger stored its nodes without the label: take it away as it was.
    engine = create_engine(normalize_url(ledger_url))
    with engine.begin() as conn:
        for name, raw in conn.execute(select(schema.nodes.c.name, schema.nodes.c.labels)).all():
            labels = {k: v for k, v in json.loads(raw).items() if k != CAPACITY_TYPE_LABEL}
            conn.execute(
                update(schema.nodes).where(schema.nodes.c.name == name).values(labels=json.dumps(labels))
            )
    engine.dispose()
    monkeypatch.setenv("AIRFLOW__GPUPOOL__SPOT_NODE_POOLS", "cheap")

    ledger = Ledger(ledger_url)
    assert ledger.migrate() == list(range(10, migrations.LATEST + 1))
    labels = {n.name: dict(n.labels) for n in ledger.snapshot().nodes}
    assert labels == {
        "od": {"zone": "a", CAPACITY_TYPE_LABEL: "on-demand"},
        "karpenter": {"karpenter.sh/capacity-type": "spot", CAPACITY_TYPE_LABEL: "spot"},
        "cheap": {CAPACITY_TYPE_LABEL: "spot"},
    }
    on_demand = GpuRequest(gpus=1, node_labels=((CAPACITY_TYPE_LABEL, "on-demand"),))
    granted = ledger.reserve(on_demand, "urgent", reservation_id="gp-urgent")
    assert (
        granted.state is ReservationState.GRANTED and granted.grant is not None and granted.grant.node == "od"
    )
    assert ledger.check_invariants() == []
    ledger.close()
