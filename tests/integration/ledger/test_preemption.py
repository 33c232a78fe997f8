"""Preemption with a checkpoint grace in the ledger, on SQLite and PostgreSQL.

One node of 8 A100 unless a test says otherwise; the fake clock moves by hand. A victim turns
``preempting`` with a deadline, its renewal is refused with what is left of its grace, and its
slice passes to the preemptor when its holder releases it or when the deadline comes.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import yaml

from airflow_gpupool.exceptions import GrantPreemptedError, InvalidRequestError
from airflow_gpupool.governance.quotas import parse_quota_file
from airflow_gpupool.ledger import Ledger, LedgerQuotas, ReservationState
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import FakeClock, node

GRANTED, WAITING = ReservationState.GRANTED, ReservationState.WAITING
PREEMPTING, PREEMPTED = ReservationState.PREEMPTING, ReservationState.PREEMPTED
MIN_RUNTIME = 300.0
GRACE = 120.0


@pytest.fixture
def pool(make_ledger: Callable[..., Ledger]) -> Ledger:
    ledger = make_ledger(min_runtime_seconds=MIN_RUNTIME, preemption_grace_seconds=GRACE)
    ledger.upsert_nodes([node("a1", gpus=8, pool="a100")])
    return ledger


def take(
    ledger: Ledger, rid: str, gpus: int, priority: int = 0, *, team: str = "default", **request: object
) -> ReservationState:
    ask = GpuRequest(gpus=gpus, priority=priority, team=team, **request)  # type: ignore[arg-type]
    return ledger.reserve(ask, rid, reservation_id=rid, ttl=3600).state


def test_urgent_work_preempts_a_preemptible_grant_which_keeps_its_slice_for_its_grace(
    pool: Ledger, clock: FakeClock
) -> None:
    assert take(pool, "train", 8, 0, preemptible=True) is GRANTED
    clock.advance(MIN_RUNTIME)
    assert take(pool, "urgent", 4, 100) is WAITING

    victim = pool.get("train")
    assert victim.state is PREEMPTING and victim.preempted_by == "urgent"
    assert victim.preempt_deadline == clock.now + GRACE
    assert "preempted for urgent (team default, priority 100)" in victim.message
    clock.advance(30)
    with pytest.raises(GrantPreemptedError) as refused:
        pool.renew("train")
    assert (refused.value.seconds_left, refused.value.preempted_by) == (GRACE - 30, "urgent")
    # Its holder ends the pod, then releases: the slice passes on at once.
    result = pool.release("train", reason="pod ended after its checkpoint")
    assert result.released
    assert pool.get("train").state is PREEMPTED
    assert pool.get("urgent").state is GRANTED
    assert pool.check_invariants() == []


def test_at_the_deadline_an_unbound_victim_ends_and_a_bound_one_is_orphaned(
    pool: Ledger, clock: FakeClock
) -> None:
    assert take(pool, "bound", 4, 0, preemptible=True) is GRANTED
    pool.bind("bound", namespace="ml", name="bound-pod", uid="u1")
    assert take(pool, "unbound", 4, 0, preemptible=True) is GRANTED
    clock.advance(MIN_RUNTIME)
    assert take(pool, "urgent", 8, 100) is WAITING
    assert {pool.get(r).state for r in ("bound", "unbound")} == {PREEMPTING}

    clock.advance(GRACE + 1)
    pool.reap()
    assert pool.get("unbound").state is PREEMPTED
    orphan = pool.get("bound")
    assert orphan.state is ReservationState.ORPHANED and "preemption grace ended" in orphan.message
    assert pool.get("urgent").state is WAITING  # the pod may still run: the slice stays held
    with pytest.raises(GrantPreemptedError):
        pool.renew("bound")  # its holder cannot take it back
    # The controller deleted the pod and released the orphan: now the preemptor runs.
    pool.release("bound", reason="reconcile: pod deleted")
    assert pool.get("bound").state is PREEMPTED
    assert pool.get("urgent").state is GRANTED
    assert pool.check_invariants() == []


def test_no_victim_is_taken_before_its_min_runtime_nor_a_non_preemptible_one(
    pool: Ledger, clock: FakeClock
) -> None:
    assert take(pool, "pinned", 4, 0) is GRANTED
    assert take(pool, "young", 4, 0, preemptible=True) is GRANTED
    clock.advance(MIN_RUNTIME - 1)
    assert take(pool, "urgent", 4, 100) is WAITING
    assert pool.get("young").state is GRANTED  # within its min runtime
    clock.advance(1)
    pool.reap()
    assert pool.get("young").state is PREEMPTING
    assert pool.get("pinned").state is GRANTED  # never: not preemptible


def test_the_victim_that_loses_the_least_work_is_chosen(pool: Ledger, clock: FakeClock) -> None:
    for rid in ("old-ckpt", "fresh-ckpt", "no-ckpt", "other"):
        assert take(pool, rid, 2, 0, preemptible=True) is GRANTED
    clock.advance(MIN_RUNTIME + 600)
    assert pool.note_checkpoint("old-ckpt", clock.now - 500)
    assert pool.note_checkpoint("fresh-ckpt", clock.now - 10)
    assert pool.note_checkpoint("fresh-ckpt", clock.now - 400)  # an older time is not kept
    assert take(pool, "urgent", 2, 100) is WAITING

    states = {rid: pool.get(rid).state for rid in ("old-ckpt", "fresh-ckpt", "no-ckpt", "other")}
    assert states == {"old-ckpt": GRANTED, "fresh-ckpt": PREEMPTING, "no-ckpt": GRANTED, "other": GRANTED}


@pytest.mark.parametrize("on_sigterm", [True, False], ids=["checkpoints-on-sigterm", "does-not"])
def test_a_victim_that_checkpoints_on_sigterm_counts_as_checkpointed_now(
    pool: Ledger, clock: FakeClock, on_sigterm: bool
) -> None:
    # Equal priority, so only the work lost tells them apart; without the flag "sigterm" loses
    # more (no checkpoint at all) and is the newer grant, so neither tie-break favours it.
    assert take(pool, "periodic", 4, 0, preemptible=True) is GRANTED
    clock.advance(1)
    assert take(pool, "sigterm", 4, 0, preemptible=True, checkpoint_on_sigterm=on_sigterm) is GRANTED
    clock.advance(MIN_RUNTIME + 600)
    assert pool.note_checkpoint("periodic", clock.now - 10)
    assert take(pool, "urgent", 4, 100) is WAITING

    states = {rid: pool.get(rid).state for rid in ("periodic", "sigterm")}
    victim, kept = ("sigterm", "periodic") if on_sigterm else ("periodic", "sigterm")
    assert (states[victim], states[kept]) == (PREEMPTING, GRANTED)
    assert pool.get(victim).preempted_by == "urgent"
    assert pool.get("sigterm").checkpoint_at is None  # ranked as checkpointed, never recorded so


def test_a_request_with_victims_pending_preempts_no_more_and_a_victims_retry_never_preempts(
    pool: Ledger, clock: FakeClock
) -> None:
    for rid in ("a", "b"):
        assert take(pool, rid, 4, 10, preemptible=True) is GRANTED
    clock.advance(MIN_RUNTIME)
    assert take(pool, "urgent", 4, 100) is WAITING
    pool.reap()
    pool.reap()
    assert sorted(pool.get(r).state.value for r in ("a", "b")) == ["granted", "preempting"]
    # A retry of a preempted try (preempts=False) waits, even above a victim's priority.
    assert take(pool, "retry", 4, 50, preempts=False) is WAITING
    assert sorted(pool.get(r).state.value for r in ("a", "b")) == ["granted", "preempting"]


def test_equal_or_lower_priority_never_preempts_and_a_per_request_grace_is_honoured(
    pool: Ledger, clock: FakeClock
) -> None:
    assert take(pool, "train", 8, 5, preemptible=True, preemption_grace_seconds=15) is GRANTED
    clock.advance(MIN_RUNTIME)
    assert take(pool, "same", 1, 5) is WAITING
    assert pool.get("train").state is GRANTED
    assert take(pool, "higher", 1, 6) is WAITING
    assert pool.get("train").preempt_deadline == clock.now + 15


def test_a_lender_reclaims_its_nominal_quota_from_a_borrower_at_any_priority(
    pool: Ledger, clock: FakeClock
) -> None:
    quota = """
headroom: {share: 0}  # quotas alone: the headroom's preemption is tested in test_headroom.py
teams:
  - name: vision
    cohort: lab
    quotas: [{flavor: {pool: a100}, nominal: 4}]
  - name: nlp
    cohort: lab
    quotas: [{flavor: {pool: a100}, nominal: 4}]
"""
    LedgerQuotas(pool).apply(parse_quota_file(yaml.safe_load(quota)))
    assert take(pool, "v-own", 4, 50, team="vision", preemptible=True) is GRANTED
    clock.advance(1)
    assert take(pool, "v-borrowed", 4, 50, team="vision", preemptible=True) is GRANTED
    clock.advance(MIN_RUNTIME)
    # nlp lends its 4 to vision; it asks for them back at a lower priority than vision's.
    assert take(pool, "n1", 4, 0, team="nlp") is WAITING
    states = {rid: pool.get(rid).state for rid in ("v-own", "v-borrowed")}
    # One victim, the younger (it loses less): vision then holds its own nominal only.
    assert sorted(s.value for s in states.values()) == ["granted", "preempting"]
    assert states["v-borrowed"] is PREEMPTING
    # Within its nominal quota vision keeps the rest, even against nlp's higher priority.
    assert take(pool, "n2", 4, 100, team="nlp") is WAITING
    assert pool.get("v-own").state is GRANTED


def test_bad_preemption_arguments_are_typed_errors() -> None:
    with pytest.raises(InvalidRequestError, match="preemption_grace_seconds"):
        GpuRequest(gpus=1, preemption_grace_seconds=0)
    with pytest.raises(InvalidRequestError, match="preemption_grace_seconds"):
        GpuRequest(gpus=1, preemption_grace_seconds=float("nan"))
    with pytest.raises(InvalidRequestError, match="preempts"):
        GpuRequest(gpus=1, preempts="no")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError) as sigterm:
        GpuRequest(gpus=1, checkpoint_on_sigterm="yes")  # type: ignore[arg-type]
    assert sigterm.value.field == "checkpoint_on_sigterm"
    # Defaults leave the stored request text as it was before these keys existed.
    assert "preempts" not in GpuRequest(gpus=1).to_dict()
    assert GpuRequest.from_dict(GpuRequest(gpus=1, preempts=False).to_dict()).preempts is False
    assert "checkpoint_on_sigterm" not in GpuRequest(gpus=1).to_dict()
    stored = GpuRequest(gpus=1, checkpoint_on_sigterm=True).to_dict()
    assert GpuRequest.from_dict(stored).checkpoint_on_sigterm is True
