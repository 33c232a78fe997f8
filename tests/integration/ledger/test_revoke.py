"""``Ledger.revoke``: an operator takes a grant back, and the slice passes on only once its pod is gone.

SQLite and PostgreSQL (the ``ledger`` fixture); the fake clock moves by hand.
"""

from __future__ import annotations

import pytest

from airflow_gpupool.exceptions import GrantPreemptedError, InvalidRequestError, UnknownReservationError
from airflow_gpupool.ledger import Ledger, ReleaseResult, ReservationState
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import FakeClock, node

GRANTED, WAITING = ReservationState.GRANTED, ReservationState.WAITING


@pytest.fixture
def pool(ledger: Ledger) -> Ledger:
    """One GPU, granted to ``g`` with its pod bound; ``w`` waits for it."""
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1, preemption_grace_seconds=40), "task-g", reservation_id="g", ttl=3600)
    ledger.bind("g", namespace="ml", name="train-pod")
    ledger.reserve(GpuRequest(gpus=1), "task-w", reservation_id="w", timeout=3600)
    return ledger


def test_a_revoked_grant_keeps_its_slice_for_the_grace_and_its_holder_is_told(
    pool: Ledger, clock: FakeClock
) -> None:
    revoked = pool.revoke("g", by="ada in the GPU pool console")

    assert not isinstance(revoked, ReleaseResult)
    assert revoked.state is ReservationState.PREEMPTING
    assert revoked.preempt_deadline == clock.now + 40  # the request's own grace
    assert revoked.message == "revoked by ada in the GPU pool console: 40 s for its pod to checkpoint and end"
    with pytest.raises(GrantPreemptedError) as told:
        pool.renew("g")
    assert told.value.seconds_left == pytest.approx(40)
    clock.advance(20)
    pool.reap()
    assert pool.get("w").state is WAITING  # the pod may still run: nothing passes on yet
    ended = pool.release("g")  # the holder deleted its pod
    assert ended.released
    assert pool.get("g").state is ReservationState.PREEMPTED
    assert "revoked by ada" in (pool.get("g").message or "")
    assert pool.get("w").state is GRANTED
    assert pool.check_invariants() == []


def test_past_the_grace_the_grant_is_orphaned_for_the_controller_not_passed_on(
    pool: Ledger, clock: FakeClock
) -> None:
    pool.revoke("g", by="ada", grace=10)
    clock.advance(11)
    pool.reap()
    assert pool.get("g").state is ReservationState.ORPHANED  # its pod is still bound
    assert pool.get("w").state is WAITING


def test_a_grant_without_a_pod_is_released_at_once(ledger: Ledger) -> None:
    ledger.upsert_nodes([node("n1", gpus=1)])
    ledger.reserve(GpuRequest(gpus=1), "task-g", reservation_id="g", ttl=3600)
    ledger.reserve(GpuRequest(gpus=1), "task-w", reservation_id="w", timeout=3600)

    done = ledger.revoke("g", by="ada")

    assert isinstance(done, ReleaseResult) and done.released
    assert ledger.get("g").message == "revoked by ada"
    assert ledger.get("w").state is GRANTED


@pytest.mark.parametrize(
    ("target", "grace", "error", "says"),
    [
        ("nope", None, UnknownReservationError, "nope"),
        ("w", None, InvalidRequestError, "only a grant is revoked"),
        ("g", 0, InvalidRequestError, "a finite number of seconds above 0"),
        ("g", float("nan"), InvalidRequestError, "a finite number of seconds above 0"),
    ],
)
def test_what_cannot_be_revoked_is_refused_and_nothing_changes(
    pool: Ledger, target: str, grace: float | None, error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        pool.revoke(target, by="ada", grace=grace)
    assert pool.get("g").preempt_deadline is None
    assert pool.get("w").state is WAITING


def test_a_grant_already_being_revoked_is_refused_a_second_time(pool: Ledger) -> None:
    first = pool.revoke("g", by="ada")
    with pytest.raises(InvalidRequestError, match="not already being preempted"):
        pool.revoke("g", by="bob")
    assert pool.get("g").preempt_deadline == first.preempt_deadline
