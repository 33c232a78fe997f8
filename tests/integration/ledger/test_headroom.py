"""Headroom in the ledger's queue, on SQLite and PostgreSQL: each pool keeps a share for urgent work.

Pool ``a100`` has 10 GPUs (nodes of 8 and 2); the quota file gives the teams room enough that
only the headroom decides (team ``ml`` in the tests where it holds more than its nominal quota
borrows from ``serving``, in one cohort). Urgent work is priority 100 and above (the file says
so) or the ``inference`` class. Nothing else holds the headroom outright, even within its team's
nominal quota: preemptible work may take it on loan when the file lends it, and urgent work takes
it back by preemption.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import yaml
from sqlalchemy import create_engine, delete

from airflow_gpupool.governance.quotas import Headroom, parse_quota_file
from airflow_gpupool.ledger import Ledger, LedgerQuotas, ReservationState
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.ledger.db.engine import normalize_url
from airflow_gpupool.ledger.store import migrations
from airflow_gpupool.resources import GangSpec, GpuRequest, WorkloadClass
from tests.ledger_fixtures import FakeClock, node

GRANTED, WAITING, PREEMPTING = ReservationState.GRANTED, ReservationState.WAITING, ReservationState.PREEMPTING
MIN_RUNTIME = 60.0
URGENT = 100


def quota_file(headroom: str, *, ml: float = 10, more: str = "") -> str:
    """Teams ``ml`` (nominal ``ml`` GPUs of a100) and ``serving`` (10) in one cohort; ``more``: other quotas."""
    return f"""
headroom: {headroom}
teams:
  - name: ml
    cohort: shared
    quotas: [{{flavor: {{pool: a100}}, nominal: {ml}}}{more}]
  - name: serving
    cohort: shared
    quotas: [{{flavor: {{pool: a100}}, nominal: 10}}{more}]
"""


@pytest.fixture
def pool(make_ledger: Callable[..., Ledger]) -> Ledger:
    ledger = make_ledger(min_runtime_seconds=MIN_RUNTIME, preemption_grace_seconds=30)
    ledger.upsert_nodes([node("a1", gpus=8, pool="a100"), node("a2", gpus=2, pool="a100")])
    return ledger


def apply(ledger: Ledger, headroom: str, *, ml: float = 10) -> None:
    LedgerQuotas(ledger).apply(parse_quota_file(yaml.safe_load(quota_file(headroom, ml=ml))))


def take(
    ledger: Ledger, rid: str, gpus: int, priority: int = 0, *, team: str = "ml", **request: object
) -> ReservationState:
    ask = GpuRequest(gpus=gpus, priority=priority, team=team, **request)  # type: ignore[arg-type]
    return ledger.reserve(ask, rid, reservation_id=rid, ttl=3600).state


def test_only_urgent_work_uses_the_share_a_pool_keeps(pool: Ledger) -> None:
    apply(pool, f"{{share: 0.2, urgent_priority: {URGENT}}}", ml=2)
    assert take(pool, "train-8", 8) is GRANTED  # 6 borrowed from serving
    # 8 of the pool's 10 GPUs held: the last 2 are its 20 % headroom, and ml is above its nominal.
    assert take(pool, "train-1", 1) is WAITING
    why = pool.explain("train-1")
    assert (
        "pool a100 keeps 20% of its GPUs for urgent work (priority >= 100 or inference): 8 of 10 GPUs held"
        in why
    )
    assert take(pool, "urgent-1", 1, URGENT) is GRANTED
    assert take(pool, "infer-1", 1, team="serving", workload_class=WorkloadClass.INFERENCE) is GRANTED
    assert pool.check_invariants() == []

    pool.release("urgent-1")
    pool.release("infer-1")
    assert pool.get("train-1").state is WAITING  # 8 + 1 would leave 1 GPU free, under the 2 kept
    pool.release("train-8")
    assert pool.get("train-1").state is GRANTED  # below the line again: served by the release


def test_a_fraction_counts_its_milli_and_a_pool_may_keep_its_own_share(
    make_ledger: Callable[..., Ledger],
) -> None:
    ledger = make_ledger()
    ledger.upsert_nodes([node("a1", gpus=8, pool="a100"), node("a2", gpus=2, pool="a100")])
    ledger.upsert_nodes([node("t1", gpus=4, model="T4", pool="t4")])
    document = quota_file("{share: 0.25, pools: {t4: 0}}", ml=2, more=", {flavor: {pool: t4}, nominal: 4}")
    LedgerQuotas(ledger).apply(parse_quota_file(yaml.safe_load(document)))
    t4 = frozenset({"T4"})
    assert take(ledger, "t4-all", 4, gpu_models=t4) is GRANTED  # t4 keeps nothing
    a100 = frozenset({"A100"})
    assert take(ledger, "a-7", 7, gpu_models=a100) is GRANTED
    # 25 % of 10 GPUs is 2.5: 0.5 of a GPU more fits, 0.75 does not.
    assert take(ledger, "a-half", 0, gpu_milli=500, gpu_models=a100) is GRANTED
    assert take(ledger, "a-quarter", 0, gpu_milli=250, gpu_models=a100) is WAITING


def test_lent_headroom_goes_to_preemptible_work_and_urgent_work_takes_it_back(
    pool: Ledger, clock: FakeClock
) -> None:
    apply(pool, f"{{share: 0.2, lend_to_preemptible: true, urgent_priority: {URGENT}}}")
    assert take(pool, "train-8", 8) is GRANTED
    # Not preemptible, of a team with no quota (so within no nominal): the headroom is not lent to it.
    assert take(pool, "steady-1", 1, team="adhoc") is WAITING
    assert take(pool, "loan-2", 2, preemptible=True) is GRANTED
    assert pool.get("loan-2").headroom_loan and not pool.get("train-8").headroom_loan

    clock.advance(MIN_RUNTIME)
    # Team ml is within its quota, and the urgent test is of another team that neither
    # borrows nor reclaims: only the loan makes the grant a victim.
    assert take(pool, "urgent-2", 2, URGENT, team="serving") is WAITING
    victim = pool.get("loan-2")
    assert victim.state is PREEMPTING and victim.preempted_by == "urgent-2"
    assert pool.get("train-8").state is GRANTED
    pool.release("loan-2", reason="pod ended after its checkpoint")
    assert pool.get("urgent-2").state is GRANTED
    assert pool.check_invariants() == []


def test_without_a_loan_a_grant_within_its_quota_is_not_preempted_for_urgent_work_of_another_team(
    pool: Ledger, clock: FakeClock
) -> None:
    apply(pool, f"{{share: 0.2, urgent_priority: {URGENT}}}")
    assert take(pool, "train-8", 8, preemptible=True) is GRANTED
    assert take(pool, "urgent-a", 2, URGENT, team="serving") is GRANTED  # the headroom, free
    clock.advance(MIN_RUNTIME)
    assert take(pool, "urgent-b", 1, URGENT, team="serving") is WAITING
    assert pool.get("train-8").state is GRANTED  # within ml's quota and not on loan: kept


def test_a_gang_never_takes_lent_headroom(pool: Ledger) -> None:
    apply(pool, f"{{share: 0.2, lend_to_preemptible: true, urgent_priority: {URGENT}}}")
    assert take(pool, "train-7", 7) is GRANTED
    gang = GpuRequest(gpus=1, team="ml", preemptible=True, gang=GangSpec(2, 2))
    assert pool.reserve(gang, "g", reservation_id="gang", ttl=3600).state is WAITING
    assert take(pool, "single", 1) is GRANTED  # 8 of 10: the line
    assert pool.get("gang").state is WAITING


def test_no_headroom_without_quotas_or_with_share_zero(pool: Ledger) -> None:
    assert take(pool, "all-8", 8) is GRANTED  # no quota file: served as before
    assert take(pool, "all-2", 2) is GRANTED
    pool.release("all-2")
    apply(pool, "{share: 0}")
    assert LedgerQuotas(pool).list().headroom == Headroom()
    assert take(pool, "again-2", 2) is GRANTED


def test_quotas_applied_before_schema_v12_keep_no_headroom_once_migrated(
    pool: Ledger, ledger_url: str
) -> None:
    apply(pool, "{share: 0.2}")
    pool.close()
    # A v11 ledger: quotas stored, no headroom table.
    engine = create_engine(normalize_url(ledger_url))
    with engine.begin() as conn:
        schema.headroom.drop(conn)
        conn.execute(delete(schema.schema_version).where(schema.schema_version.c.version >= 12))
    engine.dispose()
    ledger = Ledger(ledger_url)
    assert ledger.migrate() == list(range(12, migrations.LATEST + 1))
    assert LedgerQuotas(ledger).list().headroom == Headroom()  # as before: until the next `quota apply`
    assert take(ledger, "all-8", 8) is GRANTED
    assert take(ledger, "all-2", 2) is GRANTED
    ledger.close()


def test_urgent_work_is_served_from_the_headroom_while_work_within_its_nominal_fills_the_rest(
    make_ledger: Callable[..., Ledger],
) -> None:
    # Issue 38's case: team ml's nominal is the whole 8-GPU pool, 25 % of which is headroom.
    ledger = make_ledger()
    ledger.upsert_nodes([node("a1", gpus=8, pool="a100")])
    document = f"""
headroom: {{share: 0.25, urgent_priority: {URGENT}}}
teams: [{{name: ml, quotas: [{{flavor: {{pool: a100}}, nominal: 8}}]}}]
"""
    LedgerQuotas(ledger).apply(parse_quota_file(yaml.safe_load(document)))
    assert take(ledger, "ml-6", 6) is GRANTED
    # Within ml's nominal, not preemptible, not urgent: the last 2 GPUs are not its to hold.
    assert take(ledger, "ml-7th", 1) is WAITING
    assert "pool a100 keeps 25% of its GPUs for urgent work" in ledger.explain("ml-7th")
    assert take(ledger, "urgent-1", 1, URGENT) is GRANTED
    assert take(ledger, "infer-1", 1, workload_class=WorkloadClass.INFERENCE) is GRANTED
    assert ledger.check_invariants() == []
    ledger.release("urgent-1")
    assert ledger.get("ml-7th").state is WAITING  # a GPU is free, but it is the headroom's
    ledger.release("ml-6")
    assert ledger.get("ml-7th").state is GRANTED


def test_non_preemptible_work_within_its_teams_nominal_quota_stays_out_of_the_headroom(pool: Ledger) -> None:
    apply(pool, f"{{share: 0.2, lend_to_preemptible: true, urgent_priority: {URGENT}}}", ml=5)
    assert take(pool, "serving-4", 4, team="serving") is GRANTED
    assert take(pool, "ml-4", 4) is GRANTED
    # 8 of 10 held: ml's fifth GPU would be in the headroom; within its nominal of 5, but no loan.
    assert take(pool, "ml-5th", 1) is WAITING
    assert "pool a100 keeps 20% of its GPUs for urgent work" in pool.explain("ml-5th")
    # The same, preemptible: a loan urgent work may take back.
    assert take(pool, "ml-loan", 1, preemptible=True) is GRANTED
    assert pool.get("ml-loan").headroom_loan
    assert pool.check_invariants() == []


def test_a_preemptible_request_within_its_nominal_takes_the_headroom_on_loan(pool: Ledger) -> None:
    apply(pool, f"{{share: 0.2, lend_to_preemptible: true, urgent_priority: {URGENT}}}", ml=5)
    assert take(pool, "serving-8", 8, team="serving") is GRANTED
    assert take(pool, "ml-loan", 1, preemptible=True) is GRANTED
    assert pool.get("ml-loan").headroom_loan  # within ml's nominal, but preemptible: a loan
    assert take(pool, "ml-steady", 1) is WAITING  # within ml's nominal too, but no loan: kept out
