"""Quota admission and fair order in the ledger's queue, on SQLite and PostgreSQL.

Teams share pool ``a100`` (one node of 8 GPUs) unless a test says otherwise. Without quotas the
ledger reads nothing about them (checked by counting statements).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest
import yaml
from sqlalchemy import create_engine, delete, select

from airflow_gpupool.governance.quotas import parse_quota_file
from airflow_gpupool.ledger import Ledger, LedgerQuotas, ReservationState
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db.engine import normalize_url
from airflow_gpupool.ledger.store import migrations
from airflow_gpupool.resources import GangSpec, GpuRequest
from tests.ledger_fixtures import ledger_statements, node

GRANTED, WAITING = ReservationState.GRANTED, ReservationState.WAITING
# These tests are about quotas alone; the headroom has its own (test_headroom.py).
NO_HEADROOM = "headroom: {share: 0}"


def apply(ledger: Ledger, text: str) -> None:
    LedgerQuotas(ledger).apply(parse_quota_file(yaml.safe_load(text)))


def team_file(*teams: tuple[str, str | None, float, float | None, float | None]) -> str:
    """YAML for teams ``(name, cohort, nominal, borrowing_limit, lending_limit)`` on pool a100."""
    out = [NO_HEADROOM, "teams:"]
    for name, cohort, nominal, borrowing, lending in teams:
        out.append(f"  - name: {name}")
        if cohort:
            out.append(f"    cohort: {cohort}")
        out += ["    quotas:", "      - flavor: {pool: a100}", f"        nominal: {nominal}"]
        if borrowing is not None:
            out.append(f"        borrowing_limit: {borrowing}")
        if lending is not None:
            out.append(f"        lending_limit: {lending}")
    return "\n".join(out) + "\n"


@pytest.fixture
def pool(make_ledger: Callable[..., Ledger]) -> Ledger:
    ledger = make_ledger()
    ledger.upsert_nodes([node("a1", gpus=8, pool="a100")])
    return ledger


def take(ledger: Ledger, team: str, gpus: int, rid: str, priority: int = 0) -> ReservationState:
    return ledger.reserve(GpuRequest(gpus=gpus, team=team, priority=priority), rid, reservation_id=rid).state


def test_a_team_is_admitted_within_its_quota_and_waits_above_it(pool: Ledger) -> None:
    apply(pool, team_file(("vision", None, 3, None, None)))
    assert take(pool, "vision", 2, "v1") is GRANTED
    assert take(pool, "vision", 1, "v2") is GRANTED
    # Five GPUs are free, but vision holds its quota and has no cohort to borrow from.
    assert take(pool, "vision", 1, "v3") is WAITING
    assert pool.explain("v3").endswith(
        "team vision is at its quota on pool:a100 (3/3 GPUs), it is in no cohort to borrow from"
    )
    # A team with no quota is not governed: it uses the free GPUs as before.
    assert take(pool, "misc", 5, "m1") is GRANTED


def test_borrowing_stays_within_the_limit_and_what_the_cohort_lends(pool: Ledger) -> None:
    apply(pool, team_file(("vision", "lab", 2, 3, None), ("nlp", "lab", 4, None, None)))
    assert take(pool, "vision", 5, "v1") is GRANTED  # 2 own + 3 borrowed: its borrowing limit
    assert take(pool, "vision", 1, "v2") is WAITING
    assert "borrows its limit of 3 GPUs" in pool.explain("v2")
    # nlp wants its nominal back: 1 GPU of its 4 is still unlent, so it gets 1.
    assert take(pool, "nlp", 1, "n1") is GRANTED
    pool.release("v1")
    assert pool.get("v2").state is GRANTED  # within vision's own 2 now
    assert take(pool, "nlp", 6, "n2") is WAITING  # 1 + 6 > 4 + the 1 vision leaves unused
    assert take(pool, "nlp", 4, "n3") is GRANTED  # 1 + 4: borrows vision's unused 1
    assert take(pool, "vision", 3, "v4") is WAITING  # 1 + 3 > 2, and nlp leaves nothing unused
    assert "its cohort lab lends nothing now" in pool.explain("v4")
    assert take(pool, "vision", 1, "v5") is GRANTED  # within its nominal 2


def test_a_lending_limit_keeps_the_lenders_floor(pool: Ledger) -> None:
    apply(pool, team_file(("vision", "lab", 1, None, None), ("nlp", "lab", 6, None, 2)))
    assert take(pool, "vision", 3, "v1") is GRANTED  # 1 own + 2 lent by nlp
    assert take(pool, "vision", 1, "v2") is WAITING  # nlp lends 2 at most: 4 GPUs stay its own
    assert "lends nothing now" in pool.explain("v2")
    assert take(pool, "nlp", 4, "n1") is GRANTED  # its floor is there when it comes


def test_a_refused_request_is_granted_when_its_team_usage_drops(pool: Ledger) -> None:
    apply(pool, team_file(("vision", None, 2, None, None)))
    assert take(pool, "vision", 2, "v1") is GRANTED
    assert take(pool, "vision", 2, "v2") is WAITING
    # Others fill the pool meanwhile; the refused request neither holds a node nor counts overtakes.
    for i in range(4):
        assert take(pool, "misc", 1, f"m{i}") is GRANTED
    assert pool.get("v2").state is WAITING
    pool.release("v1")
    assert pool.get("v2").state is GRANTED


def test_within_a_priority_the_team_furthest_below_its_share_goes_first(pool: Ledger) -> None:
    apply(pool, team_file(("vision", "lab", 4, None, None), ("nlp", "lab", 4, None, None)))
    assert take(pool, "vision", 6, "v1") is GRANTED  # vision borrows 2 of nlp's
    assert take(pool, "vision", 1, "v2") is GRANTED  # ... 3
    assert take(pool, "misc", 1, "m1") is GRANTED  # the pool is full
    # Queued in this order; nlp (holding nothing) is served before vision's earlier request.
    assert take(pool, "vision", 1, "v3") is WAITING
    assert take(pool, "nlp", 1, "n1") is WAITING
    assert take(pool, "nlp", 1, "urgent", priority=5) is WAITING
    pool.release("m1")  # one GPU frees: priority first
    assert pool.get("urgent").state is GRANTED
    pool.release("urgent")  # then the team furthest below its share, before FIFO
    assert (pool.get("n1").state, pool.get("v3").state) == (GRANTED, WAITING)


def test_a_gang_counts_its_members_total(pool: Ledger) -> None:
    apply(pool, team_file(("vision", None, 3, None, None)))
    gang = GpuRequest(gpus=1, team="vision", gang=GangSpec(4, 4))
    assert pool.reserve(gang, "g", reservation_id="g").state is WAITING  # 4 members > 3
    assert "team vision is at its quota on pool:a100 (0/3 GPUs)" in pool.explain("g")
    three = GpuRequest(gpus=1, team="vision", gang=GangSpec(3, 3))
    assert pool.reserve(three, "g3", reservation_id="g3").state is GRANTED
    assert take(pool, "vision", 1, "v1") is WAITING


def test_quotas_on_a_gpu_model_govern_every_pool_of_it(make_ledger: Callable[..., Ledger]) -> None:
    ledger = make_ledger()
    ledger.upsert_nodes(
        [node("a1", gpus=2, model="A100", pool="p1"), node("a2", gpus=2, model="A100", pool="p2")]
    )
    apply(
        ledger,
        NO_HEADROOM
        + "\nteams:\n  - name: vision\n    quotas:\n      - flavor: {model: A100}\n        nominal: 3\n",
    )
    assert take(ledger, "vision", 2, "v1") is GRANTED
    assert take(ledger, "vision", 2, "v2") is WAITING  # 2 + 2 > 3 on model:A100, whichever pool
    assert take(ledger, "vision", 1, "v3") is GRANTED


def quota_reads(ledger: Ledger) -> AbstractContextManager[list[str]]:
    return ledger_statements(ledger, lambda sql: "quota" in sql.lower() and "gpupool_meta" not in sql.lower())


def test_without_quotas_nothing_about_them_is_read(pool: Ledger) -> None:
    with quota_reads(pool) as seen:
        assert take(pool, "vision", 8, "v1") is GRANTED
        assert take(pool, "vision", 1, "v2") is WAITING
        pool.release("v1")
        assert pool.get("v2").state is GRANTED
        pool.explain("v2")
    assert seen == []
    apply(pool, team_file(("vision", None, 8, None, None)))
    with quota_reads(pool) as seen:
        assert take(pool, "vision", 1, "v3") is GRANTED
    assert seen  # the check above can fail: with quotas they are read


def test_quotas_applied_before_schema_v9_are_governed_once_migrated(pool: Ledger, ledger_url: str) -> None:
    apply(pool, team_file(("vision", None, 3, None, None)))
    pool.close()
    # A v8 ledger's quotas: the rows without the quota_version stamp the queue reads.
    engine = create_engine(normalize_url(ledger_url))
    with engine.begin() as conn:
        conn.execute(delete(schema.ledger_meta).where(schema.ledger_meta.c.key == schema.QUOTA_VERSION_KEY))
        conn.execute(delete(schema.schema_version).where(schema.schema_version.c.version >= 9))
    ledger = Ledger(ledger_url)
    assert ledger.migrate() == list(range(9, migrations.LATEST + 1))
    with engine.connect() as conn:
        stamp = conn.execute(
            select(schema.ledger_meta.c.value).where(schema.ledger_meta.c.key == schema.QUOTA_VERSION_KEY)
        ).scalar_one()
    engine.dispose()
    assert stamp > 0
    assert take(ledger, "vision", 3, "v1") is GRANTED
    assert take(ledger, "vision", 1, "v2") is WAITING  # governed at once, no new `quota apply`
    ledger.close()


def test_schema_v9_stamps_nothing_without_quotas(pool: Ledger, ledger_url: str) -> None:
    pool.close()
    engine = create_engine(normalize_url(ledger_url))
    with engine.begin() as conn:
        conn.execute(delete(schema.schema_version).where(schema.schema_version.c.version >= 9))
    ledger = Ledger(ledger_url)
    assert ledger.migrate() == list(range(9, migrations.LATEST + 1))
    with engine.connect() as conn:
        keys = set(conn.execute(select(schema.ledger_meta.c.key)).scalars())
    engine.dispose()
    assert schema.QUOTA_VERSION_KEY not in keys
    assert take(ledger, "vision", 5, "v1") is GRANTED
    ledger.close()
