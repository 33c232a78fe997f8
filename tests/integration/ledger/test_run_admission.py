"""Admission of a DAG run as a whole (issue 40 item 3): its first GPU step waits for the run's peak.

SQLite and PostgreSQL (the ``ledger`` fixture; on PostgreSQL the concurrent paths run too, and
must leave a run's first step to the serialized one).
"""

from __future__ import annotations

import pytest
import yaml

from airflow_gpupool.exceptions import InvalidRequestError, RunTooLargeError
from airflow_gpupool.governance.quotas import parse_quota_file
from airflow_gpupool.governance.runs import RunNeed
from airflow_gpupool.ledger import Ledger, LedgerQuotas, ReservationState
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import node

GRANTED, WAITING = ReservationState.GRANTED, ReservationState.WAITING
RUN = RunNeed("etl/run1", 4000, ("train_a", "train_b"))


def quotas(ledger: Ledger, text: str) -> None:
    LedgerQuotas(ledger).apply(parse_quota_file(yaml.safe_load("headroom: {share: 0}\n" + text)))


def test_without_quotas_the_first_step_waits_until_the_pool_serves_the_peak(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=4), node("n2", gpus=2)])
    ledger.reserve(GpuRequest(gpus=3), "other", reservation_id="other", ttl=3600)

    # One GPU fits at once, but the run needs four at its peak and three are free.
    first = ledger.reserve(GpuRequest(gpus=1), "prep", reservation_id="prep", run_need=RUN)
    assert first.state is WAITING
    assert ledger.explain("prep").endswith(
        "its run etl/run1 is admitted as a whole: the nodes it fits have 3 GPUs free, "
        "less than the run's peak of 4"
    )
    # Requests without a run need pass it by: it waits outside the queue's order.
    assert ledger.reserve(GpuRequest(gpus=1), "small", reservation_id="small").state is GRANTED
    ledger.release("small")
    assert ledger.get("prep").state is WAITING  # still three free
    ledger.release("other")
    assert ledger.get("prep").state is GRANTED


def test_a_run_larger_than_the_pool_is_refused_up_front(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=1)])
    with pytest.raises(RunTooLargeError) as e:
        ledger.reserve(GpuRequest(gpus=1), "prep", reservation_id="prep", run_need=RUN)
    err = e.value
    assert (err.run, err.team, err.peak_milli, err.steps, err.limit_milli) == (
        "etl/run1",
        "default",
        4000,
        ("train_a", "train_b"),
        3000,
    )
    assert err.limit == "the pool's 3 GPUs the run's first step fits"
    assert "needs 4 GPUs at once (train_a, train_b)" in str(err)
    assert ledger.get_or_none("prep") is None  # never queued


def test_a_run_larger_than_its_team_quota_is_refused_up_front(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("a1", gpus=8, pool="a100")])
    quotas(ledger, "teams:\n  - {name: vision, quotas: [{flavor: {pool: a100}, nominal: 3}]}\n")
    request = GpuRequest(gpus=1, team="vision")
    with pytest.raises(RunTooLargeError) as e:
        ledger.reserve(request, "prep", reservation_id="prep", run_need=RUN)
    assert (e.value.limit_milli, e.value.limit) == (
        3000,
        "team vision's quota (nominal plus what it may borrow)",
    )
    # Three fit its quota: admitted at once on an idle pool.
    fits = RunNeed("etl/run2", 3000, ("a", "b", "c"))
    assert ledger.reserve(request, "prep2", reservation_id="prep2", run_need=fits).state is GRANTED


def test_under_quotas_the_first_step_waits_for_its_team_to_have_the_peak(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("a1", gpus=8, pool="a100")])
    quotas(
        ledger,
        "teams:\n"
        "  - {name: vision, cohort: lab, quotas: [{flavor: {pool: a100}, nominal: 2}]}\n"
        "  - {name: nlp, cohort: lab, quotas: [{flavor: {pool: a100}, nominal: 4}]}\n",
    )
    # vision may hold its 2 plus the 4 nlp lends: a peak of 4 can be served, one of 7 never.
    with pytest.raises(RunTooLargeError):
        ledger.reserve(GpuRequest(gpus=1, team="vision"), "x", run_need=RunNeed("k", 7000))
    ledger.reserve(GpuRequest(gpus=3, team="nlp"), "nlp", reservation_id="nlp", ttl=3600)
    first = ledger.reserve(GpuRequest(gpus=1, team="vision"), "prep", reservation_id="prep", run_need=RUN)
    assert first.state is WAITING  # vision would borrow 2, nlp lends only 1 now (5 GPUs free)
    assert "team vision's quota does not admit the run's peak of 4 GPUs now" in ledger.explain("prep")
    ledger.release("nlp")
    assert ledger.get("prep").state is GRANTED


def test_a_run_that_holds_a_grant_is_admitted_for_its_other_first_steps(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=4)])
    need = RunNeed("etl/run1", 2000, ("a", "b"))
    assert ledger.reserve(GpuRequest(gpus=1), "a", reservation_id="a", run_need=need).state is GRANTED
    ledger.reserve(GpuRequest(gpus=2), "other", reservation_id="other", ttl=3600)
    # One GPU is free, less than the peak, but the run was admitted when its step a was granted.
    assert ledger.reserve(GpuRequest(gpus=1), "b", reservation_id="b", run_need=need).state is GRANTED
    # Another run of the same peak is not.
    later = RunNeed("etl/run2", 2000, ("a", "b"))
    ledger.release("b")
    assert ledger.reserve(GpuRequest(gpus=1), "a2", reservation_id="a2", run_need=later).state is WAITING


def test_a_bad_run_need_is_refused_and_nothing_is_written(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    with pytest.raises(InvalidRequestError, match="run_need"):
        ledger.reserve(GpuRequest(gpus=1), "x", reservation_id="x", run_need=4000)  # type: ignore[arg-type]
    assert ledger.get_or_none("x") is None
