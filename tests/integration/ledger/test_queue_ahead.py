"""Queue ahead (issue 40): the next step of a run enters the queue before its upstream ends.

SQLite and PostgreSQL (the ``ledger`` fixture: on PostgreSQL the concurrent paths run too); the
fake clock moves by hand, as in ``test_not_before.py``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from sqlalchemy import select

from airflow_gpupool.exceptions import InvalidRequestError, NoCapacityError, UnknownReservationError
from airflow_gpupool.ledger import Ledger, ReservationState
from airflow_gpupool.ledger.db import schema
from airflow_gpupool.resources import GpuRequest
from tests.ledger_fixtures import FakeClock, node

GRANTED, WAITING = ReservationState.GRANTED, ReservationState.WAITING
RELEASED, CANCELLED = ReservationState.RELEASED, ReservationState.CANCELLED
EVALUATE = "pipeline/evaluate/run-1/map--1"
TWO = GpuRequest(gpus=2)


def row_of(ledger: Ledger, rid: str) -> Any:
    r = schema.reservations.c
    return ledger.read(lambda conn: conn.execute(select(schema.reservations).where(r.id == rid)).first())


def ahead_rows(ledger: Ledger) -> list[Any]:
    r = schema.reservations.c
    query = select(schema.reservations).where(r.id.startswith("qa-")).order_by(r.id)
    return ledger.read(lambda conn: conn.execute(query).all())


@pytest.fixture
def training(ledger: Ledger) -> Ledger:
    """Two 2-GPU nodes: ``train`` holds one GPU of n1, ``other`` both of n2; nothing waits."""
    ledger.upsert_nodes([node("n1", gpus=2), node("n2", gpus=2)])
    assert ledger.reserve(GpuRequest(gpus=1), "train", reservation_id="train", ttl=3600).state is GRANTED
    assert ledger.reserve(TWO, "other", reservation_id="other", ttl=3600).state is GRANTED
    return ledger


def test_entered_now_it_waits_in_its_place_and_is_never_granted_before_not_before(
    training: Ledger, clock: FakeClock
) -> None:
    result = training.queue_ahead(
        "train", EVALUATE, TWO, enter_at=clock.now - 1, not_before=clock.now + 600, idle_seconds=60
    )

    assert result.planned and result.entered and result.ahead_id is not None
    assert "queued ahead of train" in result.message
    (row,) = ahead_rows(training)
    assert (row.state, row.not_before, row.ahead_of) == ("waiting", clock.now + 600, "train")
    assert "queued ahead of train: not granted for another 600s (its not_before)" in training.explain(row.id)
    training.reserve(TWO, "late", reservation_id="late", timeout=7200)
    training.release("other")  # n2 frees up before evaluate is due: the request behind takes it
    assert training.get(result.ahead_id).state is WAITING
    assert training.get("late").state is GRANTED
    training.release("late")
    clock.advance(599)
    training.reap()
    assert training.get(result.ahead_id).state is WAITING  # n2 is free, but not before its time
    clock.advance(1)
    training.reap()
    assert training.get(result.ahead_id).state is GRANTED
    assert row_of(training, result.ahead_id).ahead_of == "train"  # the mark outlives not_before


def test_entered_later_it_enters_with_a_fresh_seq_when_due(training: Ledger, clock: FakeClock) -> None:
    result = training.queue_ahead(
        "train", EVALUATE, TWO, enter_at=clock.now + 300, not_before=clock.now + 600
    )
    assert result.planned and not result.entered
    assert ahead_rows(training) == []
    clock.advance(100)
    training.reserve(TWO, "early", reservation_id="early", timeout=7200)  # before the plan enters
    clock.advance(200)
    assert training.reap_if_due() is not None  # a waiting process's look finds the plan due
    (row,) = ahead_rows(training)
    assert row.state == "waiting" and row.created_at == clock.now
    assert row.seq > row_of(training, "early").seq  # its place is from when it entered, not planned
    assert training.queue_positions() == {"early": 1, result.ahead_id: 2}


def test_a_plan_entering_in_a_reserves_write_shares_its_seq_and_the_snapshot_lists_them_in_order(
    training: Ledger, clock: FakeClock
) -> None:
    # The reserve's write enters the due plan first, then the request: one seq for both, the id
    # deciding. The snapshot listed them by seq alone, in whatever order the database chose.
    result = training.queue_ahead("train", EVALUATE, TWO, enter_at=clock.now + 10, not_before=clock.now + 10)
    clock.advance(20)
    assert training.reserve(TWO, "late", reservation_id="a-late", timeout=7200).state is WAITING
    assert row_of(training, "a-late").seq == row_of(training, result.ahead_id).seq
    queue = training.snapshot().queue
    assert [r.position for r in queue] == [1, 2]
    assert {r.id: r.position for r in queue} == training.queue_positions()


def test_planning_again_finds_the_first_plan(training: Ledger, clock: FakeClock) -> None:
    first = training.queue_ahead("train", EVALUATE, TWO, enter_at=clock.now, not_before=clock.now + 600)
    again = training.queue_ahead("train", EVALUATE, TWO, enter_at=clock.now, not_before=clock.now + 900)
    assert again.ahead_id == first.ahead_id and again.entered
    assert "already" in again.message and again.not_before == clock.now + 600
    assert len(ahead_rows(training)) == 1


def test_a_claim_of_a_waiting_request_keeps_its_place_and_is_due_at_once(
    training: Ledger, clock: FakeClock
) -> None:
    planned = training.queue_ahead("train", EVALUATE, TWO, enter_at=clock.now, not_before=clock.now + 600)
    assert planned.ahead_id is not None
    seq = row_of(training, planned.ahead_id).seq
    training.release("train", keep_queued_ahead=True)  # train succeeded early
    assert training.reserve(TWO, "late", reservation_id="late", ttl=3600).state is GRANTED  # n1: not due

    got = training.reserve(TWO, "evaluate try", reservation_id="evaluate-1", task_key=EVALUATE)
    training.reserve(TWO, "later", reservation_id="later", timeout=7200)
    training.release("other")

    assert got.state is WAITING and training.get("evaluate-1").state is GRANTED  # due at once, in its place
    assert training.get("later").state is WAITING
    row = row_of(training, "evaluate-1")
    assert (row.seq, row.not_before, row.holder, row.ahead_of) == (seq, None, "evaluate try", "train")
    assert ahead_rows(training) == []  # renamed: one history chain
    assert training.check_invariants() == []


def test_a_claim_of_a_granted_request_takes_its_gpus_over(training: Ledger, clock: FakeClock) -> None:
    planned = training.queue_ahead(
        "train", EVALUATE, TWO, enter_at=clock.now, not_before=clock.now + 60, idle_seconds=120
    )
    assert planned.ahead_id is not None
    training.release("other")
    clock.advance(60)
    training.reap()
    held = training.get(planned.ahead_id)
    assert held.state is GRANTED and held.grant is not None

    got = training.reserve(TWO, "evaluate try", reservation_id="evaluate-1", task_key=EVALUATE, ttl=900)

    assert got.state is GRANTED and got.grant is not None
    assert (got.grant.node, got.grant.gpu_indices) == (held.grant.node, held.grant.gpu_indices)
    assert row_of(training, "evaluate-1").expires_at == clock.now + 900
    clock.advance(200)  # past the idle bound: claimed, it does not step back
    training.reap()
    assert training.get("evaluate-1").state is GRANTED
    assert training.check_invariants() == []


def test_granted_and_not_claimed_it_steps_back_keeping_its_place(training: Ledger, clock: FakeClock) -> None:
    planned = training.queue_ahead(
        "train", EVALUATE, TWO, enter_at=clock.now, not_before=clock.now + 60, idle_seconds=120
    )
    rid = planned.ahead_id
    assert rid is not None
    seq = row_of(training, rid).seq
    training.release("other")
    clock.advance(60)
    training.reap()
    assert training.get(rid).state is GRANTED
    training.reserve(TWO, "late", reservation_id="late", timeout=7200)
    clock.advance(121)

    training.reap()

    back = row_of(training, rid)
    assert (back.state, back.seq, back.node) == ("waiting", seq, None)
    assert back.not_before > clock.now + 86400 and "stepped back" in back.message
    assert (
        "queued ahead of train, stepped back (its upstream ran late): not granted until its step claims it"
        in (training.explain(rid))
    )
    assert training.get("late").state is GRANTED  # the freed GPUs served the queue
    assert training.check_invariants() == []
    training.release("late")
    training.reap()
    assert training.get(rid).state is WAITING  # stepped back: held by nobody until claimed
    got = training.reserve(TWO, "evaluate try", reservation_id="evaluate-1", task_key=EVALUATE)
    assert got.state is GRANTED and row_of(training, "evaluate-1").seq == seq


@pytest.mark.parametrize("how", ["released", "expired", "revoked"])
def test_an_upstream_that_fails_withdraws_what_queued_ahead_of_it(
    training: Ledger, clock: FakeClock, how: str
) -> None:
    now = training.queue_ahead("train", EVALUATE, TWO, enter_at=clock.now, not_before=clock.now + 600)
    later = training.queue_ahead(
        "train", "pipeline/export/run-1/map--1", TWO, enter_at=clock.now + 300, not_before=clock.now + 600
    )
    if how == "released":
        training.release("train", reason="pod failed")
    elif how == "expired":
        clock.advance(3601)
        training.reap()
    else:
        training.revoke("train", by="admin")

    assert now.ahead_id is not None and later.ahead_id is not None
    gone = training.get(now.ahead_id)
    assert gone.state is CANCELLED and gone.message is not None
    assert gone.message.startswith("withdrawn: upstream train (train) ended")
    clock.advance(400)
    training.reap()
    # The later plan never enters (or, entered in the reap that expired train, is withdrawn with it).
    assert {r.state for r in ahead_rows(training)} == {"cancelled"}
    assert later.ahead_id not in {r.id for r in ahead_rows(training)} or how == "expired"
    assert training.check_invariants() == []


def test_a_success_release_and_a_hand_on_keep_what_queued_ahead(training: Ledger, clock: FakeClock) -> None:
    kept = training.queue_ahead("train", EVALUATE, TWO, enter_at=clock.now, not_before=clock.now + 600)
    training.reserve(GpuRequest(gpus=1), "prep", reservation_id="prep", ttl=3600)
    handed = training.queue_ahead("prep", "p/x/r/map--1", TWO, enter_at=clock.now, not_before=clock.now + 600)
    training.release("train", reason="pod succeeded", keep_queued_ahead=True)
    training.hand_on("prep", "p/y/r/map--1", GpuRequest(gpu_milli=500), hold_seconds=60)
    assert kept.ahead_id is not None and handed.ahead_id is not None
    assert training.get(kept.ahead_id).state is WAITING  # not withdrawn: waiting for its not_before
    assert training.get(handed.ahead_id).state is WAITING
    assert training.check_invariants() == []


def test_a_claim_for_another_request_withdraws_it(training: Ledger, clock: FakeClock) -> None:
    planned = training.queue_ahead("train", EVALUATE, TWO, enter_at=clock.now, not_before=clock.now + 600)
    assert planned.ahead_id is not None
    got = training.reserve(GpuRequest(gpus=1), "evaluate try", reservation_id="evaluate-1", task_key=EVALUATE)
    assert got.state is GRANTED  # its own request, n1's free GPU
    assert training.get(planned.ahead_id).state is CANCELLED


BAD_TIMES: list[tuple[Any, Any, str]] = [
    (math.nan, 0.0, "enter_at"),
    (0.0, math.inf, "not_before"),
    ("soon", 0.0, "enter_at"),
    (True, 0.0, "enter_at"),
    (10.0, 5.0, "enter_at"),
]


@pytest.mark.parametrize(("enter", "not_before", "field"), BAD_TIMES)
def test_bad_times_are_refused_and_nothing_is_written(
    training: Ledger, clock: FakeClock, enter: Any, not_before: Any, field: str
) -> None:
    enter = enter + clock.now if type(enter) is float else enter
    not_before = not_before + clock.now if type(not_before) is float else not_before
    with pytest.raises(InvalidRequestError) as e:
        training.queue_ahead("train", EVALUATE, TWO, enter_at=enter, not_before=not_before)
    assert e.value.field == field
    assert ahead_rows(training) == []


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"idle_seconds": 0}, "idle_seconds"), ({"timeout": -1}, "timeout")]
)
def test_bad_bounds_are_refused(
    training: Ledger, clock: FakeClock, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(InvalidRequestError) as e:
        training.queue_ahead("train", EVALUATE, TWO, enter_at=clock.now, not_before=clock.now, **kwargs)
    assert e.value.field == field


def test_an_unknown_upstream_is_a_typed_error(training: Ledger, clock: FakeClock) -> None:
    with pytest.raises(UnknownReservationError):
        training.queue_ahead("nope", EVALUATE, TWO, enter_at=clock.now, not_before=clock.now + 1)
    assert ahead_rows(training) == []


def test_an_upstream_that_ended_plans_nothing(training: Ledger, clock: FakeClock) -> None:
    training.release("train")
    result = training.queue_ahead("train", EVALUATE, TWO, enter_at=clock.now, not_before=clock.now + 1)
    assert not result.planned and "not a running grant" in result.message


def test_an_upstream_and_its_unclaimed_grant_due_in_one_reap_end_once(
    training: Ledger, clock: FakeClock
) -> None:
    """Found by the state machine: the upstream's expiry withdrew the grant, then its own due row stepped it back."""
    training.release("other")  # room on n2 for the request queued ahead
    training.reserve(GpuRequest(gpus=1), "short", reservation_id="short", ttl=30)
    result = training.queue_ahead(
        "short",
        EVALUATE,
        GpuRequest(gpu_milli=500),
        enter_at=clock.now,
        not_before=clock.now,
        idle_seconds=30,
    )
    training.reap()  # its not_before has come: the pass grants it
    assert result.ahead_id is not None and training.get(result.ahead_id).state is GRANTED
    clock.advance(31)  # both leases are due: the upstream's (expired, not a success) and the idle bound's

    training.reap()

    assert training.get("short").state is ReservationState.EXPIRED
    withdrawn = training.get(result.ahead_id)
    assert withdrawn.state is ReservationState.CANCELLED and "withdrawn: upstream" in withdrawn.message
    assert training.check_invariants() == []  # its slice was freed once, not twice


def test_a_claim_not_taken_writes_nothing_before_a_refused_reserve(
    training: Ledger, clock: FakeClock
) -> None:
    training.queue_ahead(
        "train", EVALUATE, TWO, enter_at=clock.now - 1, not_before=clock.now + 600, idle_seconds=60
    )
    assert training.reserve(GpuRequest(gpus=1), "short", reservation_id="short", ttl=30).state is GRANTED
    clock.advance(31)  # its lease is overdue, not reaped yet: any write would end it first

    with pytest.raises(NoCapacityError):  # another request than the one queued ahead, and one no node fits
        training.reserve(GpuRequest(gpus=8), "evaluate try", reservation_id="evaluate-1", task_key=EVALUATE)

    assert training.get("short").state is GRANTED  # the refused call changed nothing, not even what was due
